// JobRunner (cli/job_runner.h).
#include "cli/job_runner.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "common/child_process.h"
#include "common/config.h"
#include "common/path_policy.h"
#include "ctl/ctl_client.h"

namespace l2l::cli {
namespace {

namespace fs = std::filesystem;
using eps::CtlClient;
using eps::CtlStatus;
using eps::CtlWritten;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::atomic<int> g_interrupts{0};

void OnInterrupt(int) { g_interrupts.fetch_add(1); }

// Installs the handlers for its lifetime (restores the previous ones).
class InterruptScope {
 public:
  InterruptScope() {
    struct sigaction sa {};
    sa.sa_handler = OnInterrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    g_interrupts = 0;
  }
  ~InterruptScope() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

std::string Tail(const ChildProcess& p, const std::string& log) {
  return "; the end of " + log + ":\n" + p.LogTail(1500);
}

// Waits for the daemon's eps.port (it writes it once it listens) or its exit.
Result<std::string> WaitForPort(ChildProcess& eps, const std::string& state, const std::string& log) {
  const std::string port_file = state + "/eps.port";
  const auto deadline = Clock::now() + 600s;  // a large import may take minutes
  while (Clock::now() < deadline) {
    std::ifstream f(port_file);
    std::string port;
    if (f >> port && !port.empty()) return "127.0.0.1:" + port;
    if (!eps.Running()) return Internal("l2l-eps exited before it listened" + Tail(eps, log));
    if (g_interrupts > 0) return Aborted("interrupted while l2l-eps was starting");
    std::this_thread::sleep_for(100ms);
  }
  return Status(StatusCode::kDeadlineExceeded, "l2l-eps did not listen within 600 s" + Tail(eps, log));
}

}  // namespace

int ExitStatus(const RunResult& r) {
  switch (r.end) {
    case RunResult::End::kFinished:
      return 0;
    case RunResult::End::kInterrupted:
      return 130;
    case RunResult::End::kFailed:
      return 1;
  }
  return 1;
}

Result<RunResult> RunJob(const RunOptions& o, Progress* progress) {
  const auto t0 = Clock::now();
  RunResult result;
  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (ec) return InvalidArgument("cannot create the output directory " + o.out + ": " + ec.message());
  const std::string out = fs::absolute(o.out).lexically_normal().string();
  const std::string state = out + "/state";
  const std::string eps_log = out + "/eps.log";
  if (!o.resume) {
    if (fs::exists(state + "/checkpoints/latest")) {
      return FailedPrecondition(out + " holds a checkpoint of an earlier run: continue it with --resume, or choose "
                                "another --out");
    }
    fs::remove_all(state, ec);
  } else if (!fs::exists(state + "/checkpoints")) {
    return FailedPrecondition("--resume: " + out + " has no checkpoint (" + state + "/checkpoints)");
  }
  fs::create_directories(state, ec);
  fs::remove(state + "/eps.port", ec);

  InterruptScope interrupts;
  std::vector<std::string> eps_argv = {o.bin_dir + "/l2l-eps", "--state-dir", state, "--job-id",
                                       "l2l-" + std::to_string(getpid()),
                                       "--workers", std::to_string(o.devices.size())};
  if (o.resume) {
    eps_argv.insert(eps_argv.end(), {"--resume", state + "/checkpoints"});
  } else {
    eps_argv.insert(eps_argv.end(), {"--job", o.job_path});
  }
  bool imports = false;  // the job starts from a model file (model.from): the daemon imports it first
  // A LoRA job (a `lora:` section) exports the merged model (--merge) and its adapter.
  bool lora = false;
  if (!o.job_path.empty()) {
    Result<JobConfig> job = LoadJobConfig(o.job_path);
    lora = job.ok() && job->lora.enabled;
  }
  if (!o.resume) {
    // The daemon reads only inside the directories it is given (docs/operations.md "Files
    // a job may name"); the user who runs `l2l` named these files, so their directories are
    // allowed: the model's and each data file's.
    L2L_ASSIGN_OR_RETURN(JobConfig job, LoadJobConfig(o.job_path));
    auto dir_of = [](const std::string& p) { return fs::path(p).parent_path().string(); };
    if (!job.model_from.empty()) {
      imports = true;
      const std::string from = job.model_from;
      eps_argv.insert(eps_argv.end(), {"--allow-models", fs::is_directory(from) ? from : dir_of(from)});
    }
    for (const auto& [key, path] : JobDataPaths(job)) eps_argv.insert(eps_argv.end(), {"--allow-data", dir_of(path)});
  }
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> eps, ChildProcess::Spawn(eps_argv, eps_log, true));
  progress->Note(std::string(o.resume ? "resuming" : "starting") + " l2l-eps (log " + eps_log + ")" +
                 (imports ? "; it imports the model first" : ""));
  Result<std::string> addr = WaitForPort(*eps, state, eps_log);
  if (!addr.ok()) {
    if (g_interrupts == 0) return addr.status();
    eps->Stop();  // interrupted while it started: nothing to checkpoint yet
    result.end = RunResult::End::kInterrupted;
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return result;
  }
  std::vector<std::unique_ptr<ChildProcess>> workers;
  std::vector<std::string> worker_logs;
  for (size_t i = 0; i < o.devices.size(); ++i) {
    worker_logs.push_back(out + "/worker-" + std::to_string(i) + ".log");
    std::vector<std::string> argv = {o.bin_dir + "/l2l-worker", "--eps", *addr, "--name",
                                     "l2l-worker-" + std::to_string(i), "--device", o.devices[i]};
    if (o.threads > 0) argv.insert(argv.end(), {"--threads", std::to_string(o.threads)});
    L2L_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> w, ChildProcess::Spawn(argv, worker_logs.back(), true));
    workers.push_back(std::move(w));
  }
  progress->Note(std::to_string(workers.size()) + " l2l-worker(s) on " + o.devices[0] +
                 (o.devices.size() > 1 ? ", ..." : "") + " (logs " + worker_logs[0] +
                 (workers.size() > 1 ? ", ..." : "") + ")");
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<CtlClient> ctl, CtlClient::Connect(*addr));
  // The status, every 0.5 s on a terminal (the live line), else every second.
  const auto poll_every = progress->mode() == ProgressMode::kLine ? 500ms : 1000ms;
  auto next_poll = Clock::now();
  auto poll = [&] {
    if (progress->mode() == ProgressMode::kQuiet) return;
    if (Result<CtlStatus> st = ctl->GetStatus(); st.ok()) progress->Update(*st);
  };

  // Until every worker has left (the job's end), the daemon dies, or an interrupt.
  bool interrupted = false;
  std::string failure;
  for (;;) {
    if (g_interrupts > 0 && !interrupted) {
      interrupted = true;
      progress->Note("interrupted: checkpointing, then stopping (Ctrl-C again: stop now)", /*even_quiet=*/true);
      Status s = ctl->Shutdown(/*abort_step=*/true, /*skip_checkpoint=*/false);
      if (!s.ok()) progress->Error("the daemon did not take the stop request: " + s.ToString());
    }
    if (g_interrupts > 1) {
      progress->Warn("stopping now, without a checkpoint");
      for (auto& w : workers) w->Signal(SIGKILL);
      eps->Signal(SIGKILL);
      result.end = RunResult::End::kInterrupted;
      result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return result;
    }
    if (interrupted) {
      if (!eps->Running()) break;
    } else {
      bool all_done = true;
      for (size_t i = 0; i < workers.size(); ++i) {
        if (workers[i]->Running()) {
          all_done = false;
        } else if (Result<int> rc = workers[i]->Wait(0ms); !rc.ok() || *rc != 0) {
          failure = "l2l-worker " + std::to_string(i) + " failed (exit " + (rc.ok() ? std::to_string(*rc) : "?") +
                    ")" + Tail(*workers[i], worker_logs[i]);
          break;
        }
      }
      if (!failure.empty()) break;
      if (!eps->Running()) {
        failure = "l2l-eps exited during the job" + Tail(*eps, eps_log);
        break;
      }
      if (all_done) break;
      if (Clock::now() >= next_poll) {
        poll();
        next_poll = Clock::now() + poll_every;
      }
    }
    std::this_thread::sleep_for(100ms);
  }
  if (!interrupted && failure.empty()) poll();  // the last step
  progress->EndLine();
  if (Result<CtlStatus> st = ctl->GetStatus(); st.ok()) {
    result.steps = st->step;
    result.checkpoint = st->last_checkpoint;
  }
  if (interrupted) {
    eps->Wait(300s).status().IgnoreError();
    for (auto& w : workers) w->Stop();
    result.end = RunResult::End::kInterrupted;
    // The checkpoint the stop wrote (the daemon is gone: read its `latest`).
    std::ifstream latest(state + "/checkpoints/latest");
    std::string name;
    if (latest >> name && name.rfind("step-", 0) == 0) {
      result.checkpoint = state + "/checkpoints/" + name;
      result.steps = std::strtoll(name.c_str() + 5, nullptr, 10);
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return result;
  }
  if (!failure.empty()) {
    for (auto& w : workers) w->Stop();
    eps->Stop();
    return Internal(failure);
  }
  // The job finished: export, then stop the daemon (no final checkpoint: the export is
  // the result; checkpoints taken during the job stay in state/checkpoints).
  if (o.export_format != "none") {
    progress->Note("exporting the model (--export " + o.export_format + ")");
    const std::string name = o.export_format == "hf"            ? "model-hf"
                             : o.export_format == "safetensors" ? "model.safetensors"
                                                                : "model.gguf";
    fs::remove_all(state + "/" + name, ec);
    Result<CtlWritten> w = ctl->Export(name, o.export_format, o.export_type, 0, /*merge=*/lora);
    if (!w.ok()) {
      eps->Stop();
      return w.status().WithContext("export --format " + o.export_format + (lora ? " --merge" : ""));
    }
    fs::remove_all(out + "/" + name, ec);
    fs::rename(state + "/" + name, out + "/" + name, ec);
    if (ec) return Internal("moving the export into " + out + ": " + ec.message());
    result.export_path = out + "/" + name;
    if (lora) {  // the adapter beside the merged model: DIR/adapter (PEFT)
      progress->Note("exporting the LoRA adapter (--format peft adapter)");
      fs::remove_all(state + "/adapter", ec);
      Result<CtlWritten> a = ctl->Export("adapter", "peft", "");
      if (!a.ok()) {
        eps->Stop();
        return a.status().WithContext("export --format peft");
      }
      fs::remove_all(out + "/adapter", ec);
      fs::rename(state + "/adapter", out + "/adapter", ec);
      if (ec) return Internal("moving the adapter into " + out + ": " + ec.message());
    }
  }
  ctl->Shutdown(/*abort_step=*/false, /*skip_checkpoint=*/true).IgnoreError();
  eps->Wait(120s).status().IgnoreError();
  eps->Stop();
  result.end = RunResult::End::kFinished;
  result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return result;
}

}  // namespace l2l::cli
