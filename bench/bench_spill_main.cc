// l2l-bench-spill: the SSD tier's I/O path (eps_server/spill_io.h) against fio on the
// same directory, block size and queue depth, in the same run (docs/performance.md
// "SSD tier: spill I/O vs fio").
//
//   l2l-bench-spill --dir DIR [--bytes N] [--block-bytes N] [--queue-depth N] [--page-bytes N]
//                   [--repeat N]   (N x (ours, fio); medians, for noisy shared disks)
//
// Ours: one preallocated SpillFile (O_DIRECT where the filesystem allows it), written
// then read with page-sized transfers from an AlignedBufferPool, as the tier moves
// pages: each transfer is split into block-bytes requests by the IoEngine, and enough
// transfers are in flight to keep queue-depth requests in the ring. Between the phases
// the page cache is dropped for the file (fdatasync + POSIX_FADV_DONTNEED) when the
// file is buffered; with O_DIRECT there is nothing cached to drop.
// fio: --ioengine=io_uring --direct=1, same bs and iodepth, sequential write then read
// of a file of the same size, --output-format=json. fio missing or failing is an error
// (exit 2): the benchmark never reports a ratio it did not measure.
//
// Not a test: never fails on speed. Ownership/threads: everything is local to main; the
// engine's callbacks run on its reaper thread and only touch the atomics/cv below.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/logging.h"
#include "eps_server/spill_io.h"

namespace {

using namespace l2l;
using namespace l2l::eps;
using Clock = std::chrono::steady_clock;

std::string FindInPath(const std::string& exe) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    const std::string p = (dir.empty() ? "." : dir) + "/" + exe;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

struct PhaseResult {
  Status status;
  double seconds = 0;
};

// Moves `bytes` between the file and pool buffers, page by page, as the tier does.
PhaseResult RunPhase(IoEngine& eng, const SpillFile& f, AlignedBufferPool& pool, IoOp op, uint64_t bytes) {
  const size_t page = pool.buffer_bytes();
  const uint64_t pages = bytes / page;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t finished = 0;
  Status first_error;
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < pages; ++i) {
    auto bufs = pool.Acquire(1, std::chrono::minutes(5));
    if (!bufs.ok()) return {bufs.status(), 0};
    void* buf = (*bufs)[0];
    if (op == IoOp::kWrite) std::memcpy(buf, &i, sizeof(i));  // page stamp, checked on read
    eng.Submit(f, op, buf, page, i * page, [&, i, buf, op](Status st) {
      uint64_t stamp = 0;
      std::memcpy(&stamp, buf, sizeof(stamp));
      if (st.ok() && op == IoOp::kRead && stamp != i) {
        st = DataLoss("page " + std::to_string(i) + " read back with stamp " + std::to_string(stamp));
      }
      pool.Release({buf});
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok() && first_error.ok()) first_error = st;
      ++finished;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished == pages; });
  return {first_error, std::chrono::duration<double>(Clock::now() - t0).count()};
}

struct FioResult {
  Status status;
  double bytes_per_s = 0;
};

FioResult RunFio(const std::string& fio, const std::string& file, uint64_t bytes, size_t block, int qd,
                 const char* rw) {
  const std::string cmd = fio + " --name=l2l-spill-" + rw + " --filename=" + file + " --size=" +
                          std::to_string(bytes) + " --bs=" + std::to_string(block) +
                          " --iodepth=" + std::to_string(qd) + " --rw=" + rw +
                          " --direct=1 --ioengine=io_uring --numjobs=1 --output-format=json";
  std::fprintf(stderr, "running: %s\n", cmd.c_str());
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return {Internal("popen(" + cmd + "): " + std::strerror(errno))};
  std::string out;
  char chunk[4096];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), p)) > 0) out.append(chunk, n);
  const int rc = ::pclose(p);
  if (rc != 0) return {Internal("fio exited with status " + std::to_string(rc) + ": " + out.substr(0, 2000))};
  const size_t brace = out.find('{');
  if (brace == std::string::npos) return {Internal("fio printed no JSON: " + out.substr(0, 2000))};
  try {
    const auto j = nlohmann::json::parse(out.substr(brace));
    const auto& job = j.at("jobs").at(0);
    if (job.value("error", 0) != 0) return {Internal("fio job error " + std::to_string(job.value("error", 0)))};
    const auto& side = job.at(std::string(rw) == "write" ? "write" : "read");
    const double bw = side.at("bw_bytes").get<double>();
    if (bw <= 0) return {Internal("fio reported no bandwidth for " + std::string(rw))};
    return {Status::Ok(), bw};
  } catch (const std::exception& e) {
    return {Internal(std::string("parsing fio's JSON: ") + e.what())};
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One write + read of our spill file; appends GB/s to *w and *r; removes the file.
Status RunOurs(const std::string& path, uint64_t bytes, size_t block, int qd, size_t page, size_t transfers,
               bool* direct, std::vector<double>* w, std::vector<double>* r) {
  auto f = SpillFile::Open(path, bytes, SpillFileOptions{});
  if (!f.ok()) return f.status();
  *direct = f->direct();
  struct Unlink {
    std::string p;
    ~Unlink() { ::unlink(p.c_str()); }
  } unlink_at_exit{path};
  L2L_ASSIGN_OR_RETURN(auto eng, IoEngine::Create(IoEngineOptions{qd, block}));
  L2L_ASSIGN_OR_RETURN(auto pool, AlignedBufferPool::Create(page, transfers));
  {  // random contents, so nothing below can compress or dedupe
    auto all = pool->TryAcquire(transfers);
    std::mt19937_64 rng(1);
    for (void* b : all) {
      auto* words = static_cast<uint64_t*>(b);
      for (size_t k = 0; k < page / 8; ++k) words[k] = rng();
    }
    pool->Release(all);
  }
  PhaseResult pw = RunPhase(*eng, *f, *pool, IoOp::kWrite, bytes);
  L2L_RETURN_IF_ERROR(pw.status);
  L2L_RETURN_IF_ERROR(eng->Fsync(*f));
  if (!*direct) {
    // Buffered file: push it out and drop it from the page cache, so reads hit the disk.
    ::fdatasync(f->fd());
    ::posix_fadvise(f->fd(), 0, 0, POSIX_FADV_DONTNEED);
  }
  PhaseResult pr = RunPhase(*eng, *f, *pool, IoOp::kRead, bytes);
  L2L_RETURN_IF_ERROR(pr.status);
  w->push_back(bytes / pw.seconds / 1e9);
  r->push_back(bytes / pr.seconds / 1e9);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2l-bench-spill: spill I/O (io_uring, O_DIRECT) vs fio on the same directory"};
  std::string dir;
  uint64_t bytes = uint64_t{1} << 30;
  size_t block = 1 << 20, page = 4 << 20;
  int qd = 32, repeat = 1;
  app.add_option("--dir", dir, "directory for the test files (the spill.dir to measure)")->required();
  app.add_option("--bytes", bytes, "file size (capped by the free space)");
  app.add_option("--block-bytes", block, "bytes per request (spill.block_bytes; fio --bs)");
  app.add_option("--queue-depth", qd, "requests in flight (spill.queue_depth; fio --iodepth)");
  app.add_option("--page-bytes", page, "bytes per transfer (the tier's page size)");
  app.add_option("--repeat", repeat, "repetitions of (ours, fio); medians are reported")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  l2l::InitLogging("warn", "", "bench").IgnoreError();

  const std::string fio = FindInPath("fio");
  if (fio.empty()) {
    std::fprintf(stderr, "l2l-bench-spill: fio not found in PATH; install it (apt-get install fio): "
                         "no comparison, no result\n");
    return 2;
  }
  if (page == 0 || page % 4096 != 0 || block == 0 || block % 4096 != 0 || qd < 1) {
    std::fprintf(stderr, "l2l-bench-spill: --page-bytes and --block-bytes must be multiples of 4096, --queue-depth >= 1\n");
    return 1;
  }
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) {
    std::fprintf(stderr, "l2l-bench-spill: statvfs(%s): %s\n", dir.c_str(), std::strerror(errno));
    return 1;
  }
  // Our file is removed before fio writes its own: one file at a time must fit.
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  const uint64_t cap = free_bytes > (256u << 20) ? (free_bytes - (256u << 20)) / 10 * 9 : 0;
  if (bytes > cap) {
    std::fprintf(stderr, "l2l-bench-spill: --bytes %llu capped to %llu (free space %llu)\n",
                 (unsigned long long)bytes, (unsigned long long)cap, (unsigned long long)free_bytes);
    bytes = cap;
  }
  bytes = bytes / page * page;
  if (bytes == 0) {
    std::fprintf(stderr, "l2l-bench-spill: not enough space in %s for one page\n", dir.c_str());
    return 1;
  }

  const std::string ours_path = dir + "/l2l-bench-spill." + std::to_string(::getpid()) + ".spill";
  const std::string fio_path = dir + "/l2l-bench-spill." + std::to_string(::getpid()) + ".fio";
  const size_t blocks_per_page = (page + block - 1) / block;
  const size_t transfers = std::max<size_t>(1, (static_cast<size_t>(qd) + blocks_per_page - 1) / blocks_per_page);

  std::vector<double> ow, orr, fw, fr;
  bool direct = false;
  for (int rep = 0; rep < repeat; ++rep) {
    Status st = RunOurs(ours_path, bytes, block, qd, page, transfers, &direct, &ow, &orr);
    if (!st.ok()) {
      std::fprintf(stderr, "l2l-bench-spill: %s\n", st.ToString().c_str());
      return 1;
    }
    FioResult w = RunFio(fio, fio_path, bytes, block, qd, "write");
    FioResult r = w.status.ok() ? RunFio(fio, fio_path, bytes, block, qd, "read") : w;
    ::unlink(fio_path.c_str());
    if (!r.status.ok()) {
      std::fprintf(stderr, "l2l-bench-spill: fio failed, no comparison: %s\n", r.status.ToString().c_str());
      return 2;
    }
    fw.push_back(w.bytes_per_s / 1e9);
    fr.push_back(r.bytes_per_s / 1e9);
  }

  std::printf("l2l-bench-spill: dir %s, %.0f MiB, block %zu KiB, queue depth %d, page %zu KiB (%zu transfers in flight), %d repetition(s)\n",
              dir.c_str(), bytes / 1048576.0, block >> 10, qd, page >> 10, transfers, repeat);
  std::printf("ours: %s; %s\n", direct ? "O_DIRECT" : "buffered (the filesystem refused O_DIRECT)",
              direct ? "page cache not involved, nothing to drop between phases"
                     : "page cache dropped between phases (fdatasync + POSIX_FADV_DONTNEED)");
  std::printf("fio %s: --ioengine=io_uring --direct=1 --bs=%zu --iodepth=%d, sequential; each repetition runs ours then fio\n",
              fio.c_str(), block, qd);
  std::printf("%-12s %10s %10s %8s\n", "", "ours GB/s", "fio GB/s", "ratio");
  std::vector<double> rw, rr;
  for (int rep = 0; rep < repeat; ++rep) {
    rw.push_back(ow[rep] / fw[rep]);
    rr.push_back(orr[rep] / fr[rep]);
    if (repeat > 1) {
      std::printf("%-12s %10.3f %10.3f %8.2f\n", ("write #" + std::to_string(rep + 1)).c_str(), ow[rep], fw[rep], rw.back());
      std::printf("%-12s %10.3f %10.3f %8.2f\n", ("read #" + std::to_string(rep + 1)).c_str(), orr[rep], fr[rep], rr.back());
    }
  }
  const char* tag = repeat > 1 ? " median" : "";
  std::printf("%-12s %10.3f %10.3f %8.2f\n", (std::string("write") + tag).c_str(), Median(ow), Median(fw), Median(rw));
  std::printf("%-12s %10.3f %10.3f %8.2f\n", (std::string("read") + tag).c_str(), Median(orr), Median(fr), Median(rr));
  std::printf("target ratio >= 0.80: write %s, read %s\n", Median(rw) >= 0.8 ? "met" : "NOT met",
              Median(rr) >= 0.8 ? "met" : "NOT met");
  return 0;
}
