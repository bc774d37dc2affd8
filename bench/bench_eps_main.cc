// l2l-bench-eps: EPS micro-benchmarks, each printed as a ratio against a peer or a
// physical limit measured in the same run (docs/performance.md "EPS"):
//   1. AdamW update rate (kernels/cpu/adamw_simd.h, the pipeline's kernel, --grads worker
//      gradients summed in the same pass, bf16 publish; exact and fast arithmetic, each
//      SIMD path) vs the bound
//      measured by a STREAM-style kernel with the update's own traffic
//      (bench/adamw_bench.h); and vs torch.optim.AdamW (foreach=True) at the same thread
//      count (/usr/bin/python3; bench_peers.sh compares with an optimised PyTorch).
//   2. A layer fetch through shared memory (the worker's protocol from common/shm.h:
//      seqlock + pin, then copy out of the mapped slot) vs a memcpy of the same bytes.
//   3. The same layer through gRPC on loopback (FetchLayer stream, ~4 MiB chunks) vs a
//      raw TCP socket transfer of the same bytes over loopback (one connection,
//      TCP_NODELAY as gRPC's sockets, reused buffers, read straight into the destination).
//      Two gRPC clients: the worker's read path (raw messages, the data field copied
//      once into the destination, as worker/eps_client_grpc.cc) and a generic protobuf
//      client (the generated stub: parse, then copy out). The three transfers are
//      interleaved, so load changes on a shared machine hit them alike; wall time and
//      the process's CPU time (both ends are threads of this process) per transfer.
//
//   l2l-bench-eps [--threads N] [--params N] [--iters N] [--no-torch] [--transport-only]
//                 [--adamw-only] [--no-publish] [--grads N]
//
// Not a test: never fails on speed. Ownership/threads: everything is local to main.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <random>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "bench/adamw_bench.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "proto/data.grpc.pb.h"

namespace {

using namespace l2l;
using Clock = std::chrono::steady_clock;


// CPU seconds (user + system) used so far by all threads of this process.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Best of `iters` runs of f (seconds).
template <typename F>
double Best(int iters, F&& f) {
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, l2l::SecondsSince(t0));
  }
  return best;
}

// Runs torch.optim.AdamW(foreach=True) on n params with `threads` threads; params/s or -1.
double TorchAdamW(size_t n, int threads, int iters) {
  const std::string script = "/tmp/l2l_bench_eps_torch_" + std::to_string(getpid()) + ".py";
  std::ofstream(script) << "import time, torch\n"
                        << "torch.set_num_threads(" << threads << ")\n"
                        << "p = torch.nn.Parameter(torch.randn(" << n << "))\n"
                        << "p.grad = torch.randn(" << n << ") * 0.01\n"
                        << "opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1, foreach=True)\n"
                        << "opt.step()\n"
                        << "best = 1e30\n"
                        << "for _ in range(" << iters << "):\n"
                        << "    t = time.perf_counter(); opt.step(); best = min(best, time.perf_counter() - t)\n"
                        << "print(" << n << " / best)\n";
  FILE* f = popen(("/usr/bin/python3 " + script + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  std::string out;
  while (fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  pclose(f);
  std::remove(script.c_str());
  try {
    return std::stod(out.substr(out.find_last_of('\n', out.size() - 2) == std::string::npos
                                    ? 0
                                    : out.find_last_of('\n', out.size() - 2) + 1));
  } catch (...) {
    std::fprintf(stderr, "torch run failed: %s\n", out.c_str());
    return -1;
  }
}

void BenchAdamW(size_t n, int threads, int iters, bool torch, bool publish, int grads) {
  bench::AdamWBenchOptions o;
  o.params = n;
  o.threads = threads;
  o.iters = iters;
  o.publish_bf16 = publish;
  o.grads = grads;
  bench::RunAdamWBench(o);
  if (torch) {
    const double tr = TorchAdamW(n, threads, iters);
    if (tr > 0) std::printf("adamw: torch.optim.AdamW(foreach=True, /usr/bin/python3) %.3g params/s (best)\n", tr);
  }
}

// Layer fetch through the shm weight segment vs memcpy, and through gRPC vs raw TCP.
void BenchTransport(int iters) {
  JobConfig job;
  job.model.vocab_size = 4096;
  job.model.seq_len = 256;
  job.model.d_model = 1024;
  job.model.n_layer = 1;
  job.model.n_head = 16;
  job.model.d_ff = 4096;
  job.publish_dtype = DType::kBF16;
  eps::CoreOptions co;
  co.job_id = "bench" + std::to_string(getpid());
  co.expected_workers = 1;
  eps::EpsCore core(co);
  if (Status s = core.CreateJob(job); !s.ok()) {
    std::fprintf(stderr, "CreateJob: %s\n", s.ToString().c_str());
    return;
  }
  const int64_t layer = 1;  // the block
  const size_t bytes = core.store()->layout(layer).numel * DTypeSize(job.publish_dtype);
  std::vector<char> buf(bytes), other(bytes, 1);

  // shm: a second, read-only mapping (as a worker process has) + the reader protocol.
  auto seg = ShmSegment::Open(core.store()->shm_name(), false);
  if (!seg.ok()) {
    std::fprintf(stderr, "shm: %s\n", seg.status().ToString().c_str());
    return;
  }
  auto* hdr = static_cast<WeightSegmentHeader*>(seg->data());
  WeightLayerEntry& e = WeightLayers(seg->data())[layer];
  std::atomic<int64_t> pin{-1};
  auto shm_fetch = [&] {
    for (;;) {
      const uint32_t s = e.current.load(std::memory_order_acquire);
      const uint32_t q = e.seq[s].load(std::memory_order_acquire);
      const int64_t ver = e.version[s].load(std::memory_order_acquire);
      if (q & 1) continue;
      pin.store((ver << 1) | s, std::memory_order_seq_cst);
      if (e.seq[s].load(std::memory_order_seq_cst) != q) continue;
      std::memcpy(buf.data(), static_cast<char*>(seg->data()) + e.slot_offset[s], bytes);
      pin.store(-1, std::memory_order_release);
      return;
    }
  };
  (void)hdr;
  shm_fetch();
  const double t_shm = Best(iters, shm_fetch);
  const double t_mem = Best(iters, [&] { std::memcpy(buf.data(), other.data(), bytes); });
  std::printf("fetch: layer of %zu bytes (bf16): shm %.2f GB/s, memcpy %.2f GB/s (1 thread)\n", bytes,
              bytes / t_shm / 1e9, bytes / t_mem / 1e9);
  std::printf("RATIO shm fetch / memcpy = %.2f\n", t_mem / t_shm);

  // gRPC FetchLayer on loopback.
  auto server = eps::EpsGrpcServer::Start(&core, eps::ServerOptions{});
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    return;
  }
  const std::string addr = "127.0.0.1:" + std::to_string((*server)->port());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  auto channel = grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args);
  auto stub = data::v1::Data::NewStub(channel);
  data::v1::RegisterRequest rreq;
  rreq.set_transport("grpc");
  data::v1::RegisterReply rrep;
  {
    grpc::ClientContext c;
    grpc::Status st = stub->Register(&c, rreq, &rrep);
    if (!st.ok()) {
      std::fprintf(stderr, "Register: %s\n", st.error_message().c_str());
      return;
    }
  }
  data::v1::FetchLayerRequest freq;
  freq.set_worker_id(rrep.worker_id());
  freq.set_layer(layer);
  size_t got = 0;
  // A generic protobuf client (generated stub): parse each LayerChunk, copy its data.
  auto grpc_fetch_proto = [&] {
    grpc::ClientContext c;
    auto r = stub->FetchLayer(&c, freq);
    data::v1::LayerChunk chunk;
    got = 0;
    while (r->Read(&chunk)) {
      std::memcpy(buf.data() + chunk.offset(), chunk.data().data(), chunk.data().size());
      got += chunk.data().size();
    }
    (void)r->Finish();
  };
  // The worker's read path (worker/eps_client_grpc.cc ReadLayerChunk's fast path): raw
  // messages, header fields parsed in place, the data field (last, as the EPS writes it)
  // copied once, straight into the destination.
  const grpc::internal::RpcMethod fetch_method("/l2l.data.v1.Data/FetchLayer",
                                               grpc::internal::RpcMethod::SERVER_STREAMING, channel);
  auto grpc_fetch_raw = [&] {
    grpc::ClientContext c;
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> r(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), fetch_method, &c, freq));
    grpc::ByteBuffer bb;
    got = 0;
    while (r->Read(&bb)) {
      grpc::ProtoBufferReader pr(&bb);
      google::protobuf::io::CodedInputStream in(&pr);
      uint64_t offset = 0;
      for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
        uint64_t v = 0;
        if (tag == ((6 << 3) | 2)) {
          uint32_t n = 0;
          if (!in.ReadVarint32(&n) || offset + n > buf.size()) break;
          if (!in.ReadRaw(buf.data() + offset, static_cast<int>(n))) break;
          got += n;
        } else {
          in.ReadVarint64(&v);
          if (tag == (5 << 3)) offset = v;
        }
      }
    }
    (void)r->Finish();
  };

  // Raw TCP on loopback: a sender thread writes `bytes` per request, the reader reads.
  const int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  getsockname(ls, reinterpret_cast<sockaddr*>(&sa), &len);
  listen(ls, 1);
  std::thread sender([&] {
    const int fd = accept(ls, nullptr, nullptr);
    const int one = 1;  // as gRPC sets on its sockets: no Nagle delay on a stream's tail
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char req;
    while (read(fd, &req, 1) == 1) {
      size_t off = 0;
      while (off < bytes) {
        const ssize_t w = write(fd, other.data() + off, std::min<size_t>(bytes - off, 4 << 20));
        if (w <= 0) break;
        off += static_cast<size_t>(w);
      }
    }
    close(fd);
  });
  const int cs = socket(AF_INET, SOCK_STREAM, 0);
  {
    const int one = 1;
    setsockopt(cs, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  connect(cs, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  auto tcp_fetch = [&] {
    char req = 'x';
    if (write(cs, &req, 1) != 1) return;
    size_t off = 0;
    while (off < bytes) {
      const ssize_t r = read(cs, buf.data() + off, bytes - off);
      if (r <= 0) break;
      off += static_cast<size_t>(r);
    }
  };
  // Interleaved: each repetition times all three back to back, so load changes on this
  // shared machine hit them alike; best of each, and the median of per-repetition ratios.
  tcp_fetch();
  grpc_fetch_raw();
  grpc_fetch_proto();
  // Wall seconds and process CPU seconds (both ends are threads of this process).
  struct Timing {
    double wall = 1e30, cpu = 1e30;
    std::vector<double> walls;
  };
  auto timed = [&](Timing* t, auto&& f, const char* what) {
    // Let the previous transfer's background work (gRPC's threads) finish first.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const double c0 = ProcessCpuSeconds();
    const auto t0 = Clock::now();
    f();
    const double w = l2l::SecondsSince(t0), c = ProcessCpuSeconds() - c0;
    t->wall = std::min(t->wall, w);
    t->cpu = std::min(t->cpu, c);
    t->walls.push_back(w);
    if (what != nullptr && got != bytes) std::fprintf(stderr, "%s fetch got %zu of %zu bytes\n", what, got, bytes);
  };
  Timing tcp, raw, proto;
  for (int i = 0; i < iters; ++i) {  // the order rotates, so none always follows another
    for (int k = 0; k < 3; ++k) {
      switch ((i + k) % 3) {
        case 0: timed(&tcp, tcp_fetch, nullptr); break;
        case 1: timed(&raw, grpc_fetch_raw, "gRPC (worker read path)"); break;
        default: timed(&proto, grpc_fetch_proto, "gRPC (protobuf client)"); break;
      }
    }
  }
  auto median_ratio = [&](const Timing& t) {
    std::vector<double> r;
    for (size_t i = 0; i < t.walls.size(); ++i) r.push_back(tcp.walls[i] / t.walls[i]);
    std::sort(r.begin(), r.end());
    return r[r.size() / 2];
  };
  shutdown(cs, SHUT_WR);
  close(cs);
  sender.join();
  close(ls);
  std::printf("fetch: raw TCP loopback %.2f GB/s (%.2f CPU-s/GB); gRPC loopback: worker read path "
              "%.2f GB/s (%.2f CPU-s/GB), generic protobuf client %.2f GB/s (%.2f CPU-s/GB); best of %d "
              "interleaved\n",
              bytes / tcp.wall / 1e9, tcp.cpu / bytes * 1e9, bytes / raw.wall / 1e9, raw.cpu / bytes * 1e9,
              bytes / proto.wall / 1e9, proto.cpu / bytes * 1e9, iters);
  std::printf("RATIO gRPC fetch (worker read path) / raw TCP = %.2f (median of per-repetition ratios %.2f; "
              "CPU cost ratio %.2f)\n",
              tcp.wall / raw.wall, median_ratio(raw), tcp.cpu / raw.cpu);
  std::printf("RATIO gRPC fetch (generic protobuf client) / raw TCP = %.2f (median %.2f; CPU cost ratio %.2f)\n",
              tcp.wall / proto.wall, median_ratio(proto), tcp.cpu / proto.cpu);
  (*server)->Shutdown();
  core.Stop();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2l-bench-eps: EPS update and transport benchmarks"};
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  size_t params = size_t{16} << 20;
  int iters = 5;
  bool no_torch = false;
  bool transport_only = false;
  bool adamw_only = false;
  bool no_publish = false;
  int grads = 1;
  app.add_option("--threads", threads, "threads for AdamW, memcpy and torch");
  app.add_option("--params", params, "parameters in the AdamW benchmark");
  app.add_option("--iters", iters, "timed repetitions (AdamW: median and best; transports: best)");
  app.add_flag("--no-torch", no_torch, "skip the torch.optim.AdamW comparison");
  app.add_flag("--transport-only", transport_only, "only the layer-fetch benchmarks (shm, gRPC, TCP)");
  app.add_flag("--adamw-only", adamw_only, "only the AdamW benchmark");
  app.add_flag("--no-publish", no_publish, "AdamW without the bf16 published copy");
  app.add_option("--grads", grads, "AdamW: workers' gradients summed in the same pass (as the pipeline reduces them)")
      ->check(CLI::Range(1, 8));
  CLI11_PARSE(app, argc, argv);
  l2l::InitLogging("warn", "", "bench").IgnoreError();
  tbb::global_control gc(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(threads));
  if (!transport_only) BenchAdamW(params, threads, iters, !no_torch, !no_publish, grads);
  if (!adamw_only) BenchTransport(iters);
  return 0;
}
