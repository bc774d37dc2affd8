// Integration harness: child processes, temp dirs, the l2l-eps daemon. See harness.h.
#include "tests/integration/harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/formats/tokens_file.h"
#include "proto/control.grpc.pb.h"

namespace l2l::itest {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string BinaryPath(const std::string& name) { return std::string(L2L_BINARY_DIR) + "/bin/" + name; }

// ---- EpsDaemon -------------------------------------------------------------------------

struct EpsDaemon::Stub {
  std::unique_ptr<l2l::control::v1::Control::Stub> control;
};

EpsDaemon::EpsDaemon() : stub_(std::make_unique<Stub>()) {}

Result<std::unique_ptr<EpsDaemon>> EpsDaemon::Start(const JobConfig& job, const DaemonOptions& o,
                                                    const TempDir& dir) {
  static std::atomic<int> counter{0};
  std::unique_ptr<EpsDaemon> d(new EpsDaemon());
  d->job_id_ = o.job_id.empty() ? "itest" + std::to_string(getpid()) + "x" + std::to_string(counter++) : o.job_id;
  const std::string state_dir = dir.File("eps-state-" + d->job_id_);
  d->state_dir_ = state_dir;
  {
    std::ofstream f(dir.File(d->job_id_ + "-job.yaml"));
    f << JobConfigToYaml(job);
    std::ofstream e(dir.File(d->job_id_ + "-eps.yaml"));
    e << "listen: 127.0.0.1:0\n"
      << "state_dir: " << state_dir << "\n"
      << "job_id: " << d->job_id_ << "\n"
      << "expected_workers: " << o.workers << "\n"
      << "heartbeat_timeout_ms: " << o.heartbeat_timeout_ms << "\n"
      << "on_worker_loss: " << ToString(o.on_worker_loss) << "\n"
      << "transport: " << ToString(o.transport) << "\n"
      << o.extra_yaml << "\n";
    if (!f || !e) return ErrnoError("write", dir.path(), errno);
  }
  std::vector<std::string> argv = {BinaryPath("l2l-eps"), "--config", dir.File(d->job_id_ + "-eps.yaml")};
  if (o.resume.empty()) {
    argv.insert(argv.end(), {"--job", dir.File(d->job_id_ + "-job.yaml")});
  } else {
    argv.insert(argv.end(), {"--resume", o.resume});
    // A restart: the previous run's port file must not be mistaken for this one's.
    std::error_code rm_ec;
    fs::remove(state_dir + "/eps.port", rm_ec);
  }
  argv.insert(argv.end(), o.extra_args.begin(), o.extra_args.end());
  L2L_ASSIGN_OR_RETURN(d->proc_, Process::Spawn(argv, dir.File(d->job_id_ + "-eps.log")));
  if (!o.wait_ready) return d;
  // The daemon writes the port it bound to <state_dir>/eps.port (atomically, by rename).
  const std::string port_file = state_dir + "/eps.port";
  const auto deadline = Clock::now() + 30s;
  int port = 0;
  while (port == 0) {
    std::ifstream pf(port_file);
    if (pf >> port && port > 0) break;
    port = 0;
    if (!d->proc_->Running()) {
      return Internal("l2l-eps exited during start-up; log:\n" + d->proc_->LogTail());
    }
    if (Clock::now() > deadline) {
      return Status(StatusCode::kDeadlineExceeded,
                    "l2l-eps wrote no " + port_file + " within 30 s; log:\n" + d->proc_->LogTail());
    }
    std::this_thread::sleep_for(20ms);
  }
  d->address_ = "127.0.0.1:" + std::to_string(port);
  d->stub_->control = l2l::control::v1::Control::NewStub(
      grpc::CreateChannel(d->address_, grpc::InsecureChannelCredentials()));
  return d;
}

EpsDaemon::~EpsDaemon() {
  if (proc_ && proc_->Running()) Shutdown().IgnoreError();
  if (proc_) proc_->Stop();
  for (const std::string& name : ShmSegments()) {
    std::error_code ec;
    fs::remove("/dev/shm/" + name, ec);
  }
}

std::vector<std::string> EpsDaemon::ShmSegments() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec)) {
    const std::string n = e.path().filename().string();
    if (n.find(job_id_) != std::string::npos) out.push_back(n);
  }
  return out;
}

namespace {
Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  return Internal(what + " rpc failed: " + std::to_string(s.error_code()) + " " + s.error_message());
}
}  // namespace

Result<DaemonStatus> EpsDaemon::GetStatus() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  l2l::control::v1::GetStatusRequest req;
  l2l::control::v1::GetStatusReply rep;
  L2L_RETURN_IF_ERROR(FromGrpc(stub_->control->GetStatus(&ctx, req, &rep), "GetStatus"));
  DaemonStatus s;
  s.state = rep.state();
  s.step = rep.step();
  s.total_steps = rep.total_steps();
  s.layer_version.assign(rep.layer_version().begin(), rep.layer_version().end());
  s.last_loss = rep.last_loss();
  for (const auto& w : rep.workers()) s.workers.push_back({w.worker_id(), w.name(), w.state(), w.step()});
  s.error = rep.error();
  if (rep.has_spill()) {
    s.ssd_bytes = rep.spill().ssd_bytes();
    s.pool_bytes = rep.spill().pool_bytes();
    s.bytes_read = rep.spill().bytes_read();
    s.bytes_written = rep.spill().bytes_written();
    s.lease_hits = rep.spill().lease_hits();
    s.lease_misses = rep.spill().lease_misses();
  }
  s.staleness_bound = rep.staleness_bound();
  s.max_version_lag = rep.max_version_lag();
  return s;
}

Status EpsDaemon::Export(const std::string& path) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  l2l::control::v1::ExportRequest req;
  req.set_path(path);
  l2l::control::v1::ExportReply rep;
  return FromGrpc(stub_->control->Export(&ctx, req, &rep), "Export");
}

Result<std::string> EpsDaemon::Checkpoint(const std::string& dir) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 60s);
  l2l::control::v1::CheckpointRequest req;
  req.set_dir(dir);
  l2l::control::v1::CheckpointReply rep;
  L2L_RETURN_IF_ERROR(FromGrpc(stub_->control->Checkpoint(&ctx, req, &rep), "Checkpoint"));
  return rep.dir();
}

Status EpsDaemon::Shutdown() {
  if (!stub_->control) {  // started with wait_ready=false: no channel yet
    proc_->Stop();
    return Status::Ok();
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    l2l::control::v1::ShutdownRequest req;
    req.set_abort_step(true);
    req.set_skip_checkpoint(true);
    l2l::control::v1::ShutdownReply rep;
    stub_->control->Shutdown(&ctx, req, &rep);  // the daemon may drop the channel while exiting
  }
  L2L_ASSIGN_OR_RETURN(int code, proc_->Wait(30s));
  if (code != 0) return Internal("l2l-eps exited with " + std::to_string(code) + "; log:\n" + proc_->LogTail());
  return Status::Ok();
}

// ---- workers and logs ------------------------------------------------------------------

Result<std::unique_ptr<Process>> StartWorker(const std::string& address, const std::string& name,
                                             const std::string& log_path,
                                             const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {BinaryPath("l2l-worker"), "--eps", address, "--threads", "1",
                                   "--name", name};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Process::Spawn(argv, log_path);
}

std::vector<WorkerProgress> ParseProgress(const std::string& log) {
  static const std::regex re(R"(^step (\d+)/\d+ loss ([-+0-9.eEnaif]+) .* lag (-?\d+) )");
  std::vector<WorkerProgress> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, re)) {
      out.push_back({std::stoll(m[1]), std::stod(m[2]), std::stoll(m[3])});
    }
  }
  return out;
}

std::map<std::string, int64_t> ParseSummary(const std::string& log) {
  std::map<std::string, int64_t> out;
  const std::string tag = "l2l-worker: done ";
  const size_t at = log.rfind(tag);
  if (at == std::string::npos) return out;
  std::istringstream in(log.substr(at + tag.size(), log.find('\n', at) - at - tag.size()));
  std::string kv;
  while (in >> kv) {
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) out[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
  }
  return out;
}

Status WriteTokens(const std::string& path, const std::vector<int32_t>& tokens) {
  std::vector<uint16_t> t(tokens.begin(), tokens.end());
  return WriteTokensFile(path, t);
}

Result<JobConfig> SmallOpsJob(const TempDir& dir) {
  JobConfig job;
  job.model.vocab_size = 64;
  job.model.seq_len = 8;
  job.model.d_model = 16;
  job.model.n_layer = 2;
  job.model.n_head = 2;
  job.model.d_ff = 32;
  job.train.micro_batch_size = 2;
  job.train.micro_batches = 2;
  job.train.steps = 5;
  job.data.train_path = dir.File("train.bin");
  std::vector<int32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 5 + i / 11) % 64);
  L2L_RETURN_IF_ERROR(WriteTokens(job.data.train_path, tokens));
  return job;
}

Result<std::string> HttpGet(int port, const std::string& path) {
  const std::string where = "GET http://127.0.0.1:" + std::to_string(port) + path;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return Internal(where + ": socket: " + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    const int e = errno;
    close(fd);
    return Internal(where + ": connect: " + std::strerror(e));
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    const int e = errno;
    close(fd);
    return Internal(where + ": write: " + std::strerror(e));
  }
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

}  // namespace l2l::itest
