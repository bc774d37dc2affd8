// l2l-worker: one training worker. Registers with the EPS, receives the job (model,
// optimizer, data) and its data shard, and runs the layer-to-layer relay
// (worker/relay.h) step after step until the job's step count, until the EPS stops the
// job, or until SIGINT/SIGTERM (it finishes the step in progress, then leaves).
//
//   l2l-worker --eps 127.0.0.1:PORT [--device cpu|cuda:N | --devices cuda:0,cuda:1,...]
//              [--config FILE] [--threads N] [--compute fp32|bf16]
//              [--transport auto|shm|grpc] [--name NAME] [--connect-timeout-ms MS]
//              [--steps N] [--log-level info] [--token-file FILE] [--tls-ca CA.pem]
//              [--tls-server-name NAME] [--push-deadline-floor-ms MS] [--push-min-mib-per-s R]
//              [--device-updates auto|on|off]
//
// --device-updates (default auto: on for a CUDA device, off on the CPU backend, whose
// "device" is the daemon's own cores): measure this device's AdamW rate and H2D/D2H
// bandwidth at start, report them at Register and run the layer updates the EPS hands out
// on the device (worker/device_updater.h; the interleaved optimizer, optim.gpu_fraction,
// whose `auto` gives the device layers only when that is predicted faster). Needs the shm
// transport (same host as the EPS); over grpc the worker takes no updates.
// --devices: several GPUs of this host as ONE worker of the EPS (worker/device_group.h:
// each fetches 1/n of every layer, NCCL all-gathers the rest, the micro-batches are split
// over the devices, gradients are reduce-scattered and the layer's gradient reaches the
// EPS once). Needs a build with NCCL and train.micro_batches >= n.
// --compute bf16 (CPU device only): the CPU backend's matrix products take bf16 operands
// with fp32 accumulation (kernels::CpuGemmPrecision::kBf16; refused without AVX512_BF16);
// masters, pushed gradients and AdamW stay fp32. L2L_CPU_GEMM=fp32|bf16 wins over it.
// On a GPU the same mode is L2L_CUDA_GEMM=bf16.
// --config FILE: a job YAML on this host; its data.train_path replaces the EPS's (the
// tokens file may live elsewhere on another host) and its model must equal the EPS's.
// Progress lines go to stdout:
//   step 12/100 loss 4.1234 tok/s 5321 step_s 0.77 wait_layer 0.01 wait_push 0.00 lag 0 eta 68s
// and, at exit, one summary line the integration tests parse:
//   l2l-worker: done steps=N peak_rss_kb=K device_bytes=D stash_host_bytes=H max_lag=A min_lag=B device_updates=U
// --token-file (default $L2L_TOKEN_FILE): the EPS's shared token, sent on every call;
// --tls-ca: connect with TLS and verify the EPS against CA.pem (docs/operations.md
// "Security"); --tls-server-name NAME: the name the EPS's certificate must hold when it is
// not the host of --eps (needs --tls-ca). --push-deadline-floor-ms and --push-min-mib-per-s:
// a gRPC gradient push fails (DEADLINE_EXCEEDED) after floor + its bytes at that rate
// (default 60 s + 1 s per 8 MiB; worker/eps_client.h).
// Exit status: 0 when the job's steps are done, the EPS stopped the job or a signal asked
// to stop (and the step in progress finished within 15 s; else 143); 2 when the EPS is
// unreachable after the bounded retry; 3 when the job stayed full (all its workers
// active) for the whole connect timeout; 1 on any other error (a missing or wrong token,
// or the daemon dying under the worker, included).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/auth_token.h"
#include "common/config.h"
#include "common/env.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/data_loader.h"
#include "worker/device_group.h"
#include "worker/device_updater.h"
#include "worker/eps_client.h"
#include "worker/eval_set.h"
#include "worker/relay.h"

namespace {

using l2l::Result;
using l2l::Status;
namespace w = l2l::worker;

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

// After SIGINT/SIGTERM the worker finishes its step; if the step cannot finish (the EPS
// is gone or stuck), it leaves anyway after this grace period.
constexpr std::chrono::seconds kStopGrace{15};

// Waits for g_stop, then for kStopGrace, then exits the process (status 128+SIGTERM).
void StopWatchdog(const std::atomic<bool>* done) {
  while (!g_stop.load() && !done->load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (done->load()) return;
  const auto deadline = std::chrono::steady_clock::now() + kStopGrace;
  while (!done->load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (done->load()) return;
  std::fprintf(stderr, "l2l-worker: the step in progress did not finish within %lld s of the stop "
               "signal; exiting without it\n", static_cast<long long>(kStopGrace.count()));
  l2l::FlushLogs();
  std::_Exit(128 + SIGTERM);
}

struct Flags {
  std::string eps;
  std::string device = "cpu";
  std::string devices;  // --devices: a comma-separated list (a device group)
  std::string config;
  int threads = 0;
  std::string compute = "fp32";  // --compute: the CPU backend's GEMM precision
  std::string transport = "auto";
  std::string device_updates = "auto";  // offer the device for layer updates (interleaved optimizer)
  std::string name;
  int64_t connect_timeout_ms = 10000;
  int64_t push_deadline_floor_ms = 60000;
  double push_min_mib_per_s = 8.0;
  int64_t steps = -1;
  std::string recompute;             // overrides train.recompute when set
  int64_t activation_budget_mb = -1; // overrides train.activation_budget_mb when >= 0
  std::string log_level = "info";
  std::string token_file, tls_ca, tls_server_name;
};

// Peak resident set size of this process in KiB (VmHWM; ru_maxrss as a fallback).
int64_t PeakRssKb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

Result<std::unique_ptr<l2l::kernels::Backend>> MakeBackend(const Flags& f) {
  if (f.compute != "fp32" && f.compute != "bf16") {
    return l2l::InvalidArgument("--compute " + f.compute + ": expected fp32 or bf16");
  }
  if (f.device == "cpu") {
    l2l::kernels::CpuBackendOptions o;
    o.num_threads = f.threads;
    o.gemm = f.compute == "bf16" ? l2l::kernels::CpuGemmPrecision::kBf16 : l2l::kernels::CpuGemmPrecision::kFp32;
    return l2l::kernels::CreateCpuBackend(o);
  }
  if (f.compute != "fp32") {
    return l2l::InvalidArgument("--compute " + f.compute + " is for --device cpu; on a GPU set L2L_CUDA_GEMM=bf16");
  }
  return l2l::kernels::CreateBackend(f.device);
}

// Applies --config: the local data path, after checking it describes the same model.
Status ApplyLocalConfig(const std::string& path, l2l::JobConfig* job) {
  L2L_ASSIGN_OR_RETURN(l2l::JobConfig local, l2l::LoadJobConfig(path));
  if (!(local.model == job->model)) {
    return l2l::InvalidArgument("--config " + path + ": its model differs from the job the EPS runs; "
                                "a worker cannot train a different model (drop --config or fix it)");
  }
  if (!local.data.train_path.empty()) job->data.train_path = local.data.train_path;
  if (!local.eval.data_path.empty()) job->eval.data_path = local.eval.data_path;
  return Status::Ok();
}

// Opens this worker's shard of the tokens file at the position the EPS handed out.
Status OpenData(const l2l::JobConfig& job, const w::WorkerRegistration& reg,
                std::optional<w::DataLoader>* out) {
  w::DataLoaderOptions dopts;
  dopts.B = job.train.micro_batch_size;
  dopts.T = job.seq_len();
  dopts.seed = job.train.seed;
  dopts.rank = reg.data_rank;
  dopts.world = reg.data_world;
  dopts.vocab_size = job.model.vocab_size;
  dopts.task = job.effective_task();
  dopts.num_labels = job.model.num_labels;
  dopts.mlm = job.mlm;
  L2L_ASSIGN_OR_RETURN(w::DataLoader loader, w::DataLoader::OpenForTask(job.data.train_path, dopts));
  if (loader.has_loss_mask()) {
    L2L_LOG_INFO("loss mask {}.mask: {:.1f}% of the tokens are trained on", job.data.train_path,
                 100.0 * loader.trained_fraction());
  }
  out->emplace(std::move(loader));
  if (!reg.data_position.empty()) {
    L2L_ASSIGN_OR_RETURN(w::DataPosition pos, w::DataPosition::Parse(reg.data_position));
    L2L_RETURN_IF_ERROR((*out)->Seek(pos).WithContext("resuming data at " + reg.data_position));
  }
  return Status::Ok();
}

Status Run(const Flags& f, int* exit_code) {
  w::ClientOptions copts;
  const l2l::Result<l2l::Transport> transport = l2l::ParseTransport(f.transport);
  if (!transport.ok()) return transport.status().WithContext("--transport");
  copts.transport = *transport;
  copts.connect_timeout = std::chrono::milliseconds(f.connect_timeout_ms);
  if (f.push_deadline_floor_ms <= 0 || !(f.push_min_mib_per_s > 0)) {
    return l2l::InvalidArgument("--push-deadline-floor-ms " + std::to_string(f.push_deadline_floor_ms) +
                                " and --push-min-mib-per-s " + std::to_string(f.push_min_mib_per_s) +
                                " must both be positive");
  }
  copts.push_deadline_floor = std::chrono::milliseconds(f.push_deadline_floor_ms);
  copts.push_min_bytes_per_s = f.push_min_mib_per_s * 1024 * 1024;
  copts.worker_name = f.name;
  if (const std::string tf = l2l::TokenFileFromFlagOrEnv(f.token_file); !tf.empty()) {
    L2L_ASSIGN_OR_RETURN(copts.token, l2l::ReadTokenFile(tf));
  }
  if (!f.tls_ca.empty()) {
    L2L_ASSIGN_OR_RETURN(copts.tls_ca_pem, l2l::ReadPemFile(f.tls_ca, "--tls-ca", false));
  }
  if (!f.tls_server_name.empty() && f.tls_ca.empty()) {
    return l2l::InvalidArgument("--tls-server-name " + f.tls_server_name +
                                " needs --tls-ca CA.pem: it names the host the EPS's TLS certificate must hold, "
                                "and without --tls-ca the connection is plaintext");
  }
  copts.tls_server_name = f.tls_server_name;
  // Interleaved optimizer: a second backend on the (first) device runs the layer updates
  // the EPS hands out; its measured rates go to the EPS at Register.
  std::unique_ptr<w::DeviceUpdater> pre_updater;
  if (f.device_updates != "auto" && f.device_updates != "on" && f.device_updates != "off") {
    return l2l::InvalidArgument("--device-updates " + f.device_updates + ": must be auto, on or off");
  }
  Flags one = f;
  if (!f.devices.empty()) one.device = f.devices.substr(0, f.devices.find(','));
  const bool offer_device = f.device_updates == "on" || (f.device_updates == "auto" && one.device.rfind("cuda", 0) == 0);
  if (offer_device) {
    L2L_ASSIGN_OR_RETURN(std::unique_ptr<l2l::kernels::Backend> ube, MakeBackend(one));
    L2L_ASSIGN_OR_RETURN(copts.optimizer, w::MeasureDeviceRates(ube.get()));
    L2L_LOG_INFO("device updates on {}: AdamW {:.3g} params/s, h2d {:.3g} B/s, d2h {:.3g} B/s (0 = no link)",
                 copts.optimizer.device, copts.optimizer.update_params_per_s, copts.optimizer.h2d_bytes_per_s,
                 copts.optimizer.d2h_bytes_per_s);
    pre_updater = std::make_unique<w::DeviceUpdater>(std::move(ube));
  }
  Result<std::unique_ptr<w::EpsClient>> connected = w::ConnectEps(f.eps, copts);
  if (!connected.ok()) {
    switch (connected.status().code()) {
      case l2l::StatusCode::kPermissionDenied: *exit_code = 1; break;
      case l2l::StatusCode::kResourceExhausted: *exit_code = 3; break;  // the job stayed full
      default: *exit_code = 2;
    }
    return connected.status().WithContext("cannot register with the EPS at " + f.eps + " (retried for " +
                                          std::to_string(f.connect_timeout_ms) + " ms)");
  }
  std::unique_ptr<w::EpsClient> client = std::move(connected).value();
  // Declared after `client`: its thread stops before the client goes away.
  std::unique_ptr<w::DeviceUpdater> updater = std::move(pre_updater);
  const w::WorkerRegistration& reg = client->registration();
  if (updater && reg.transport == l2l::Transport::kShm) {
    updater->Start(client.get());
  } else if (updater) {
    L2L_LOG_INFO("device updates off: the update exchange needs the shm transport (this worker uses grpc)");
    updater.reset();
  }
  l2l::JobConfig job = reg.job;
  if (!f.config.empty()) L2L_RETURN_IF_ERROR(ApplyLocalConfig(f.config, &job));
  const int64_t total_steps = f.steps >= 0 ? f.steps : job.train.steps;
  L2L_LOG_INFO("registered as worker {} of {} (transport {}, data shard {}/{}, start step {})",
               reg.worker_id, reg.num_workers, ToString(reg.transport), reg.data_rank, reg.data_world,
               reg.start_step);

  // One backend per device: --device's, or each of --devices'.
  std::vector<std::string> device_names;
  if (!f.devices.empty()) {
    size_t pos = 0;
    while (pos <= f.devices.size()) {
      const size_t comma = std::min(f.devices.find(',', pos), f.devices.size());
      device_names.push_back(f.devices.substr(pos, comma - pos));
      pos = comma + 1;
    }
  }
  std::vector<std::unique_ptr<l2l::kernels::Backend>> owned;
  std::vector<l2l::kernels::Backend*> backends;
  if (device_names.size() <= 1) {
    Flags one = f;
    if (device_names.size() == 1) one.device = device_names[0];
    L2L_ASSIGN_OR_RETURN(std::unique_ptr<l2l::kernels::Backend> be, MakeBackend(one));
    owned.push_back(std::move(be));
  } else {
    for (const std::string& name : device_names) {
      Result<std::unique_ptr<l2l::kernels::Backend>> be = l2l::kernels::CreateBackend(name);
      if (!be.ok()) return be.status().WithContext("--devices " + f.devices);
      owned.push_back(std::move(be).value());
    }
  }
  for (auto& be : owned) backends.push_back(be.get());
  l2l::kernels::Backend* backend = backends[0];
  L2L_ASSIGN_OR_RETURN(w::RelayOptions ropts, w::RelayOptions::FromJob(job));
  if (!f.recompute.empty()) {
    auto mode = l2l::ParseRecomputeMode(f.recompute);
    if (!mode.ok()) return mode.status().WithContext("--recompute");
    ropts.recompute = *mode;
  }
  if (f.activation_budget_mb >= 0) ropts.activation_budget_bytes = static_cast<size_t>(f.activation_budget_mb) << 20;
  std::unique_ptr<w::Relay> relay;
  std::unique_ptr<w::DeviceGroup> group;
  if (backends.size() > 1) {
    L2L_ASSIGN_OR_RETURN(group, w::DeviceGroup::Create(client.get(), backends, job, ropts));
  } else {
    L2L_ASSIGN_OR_RETURN(relay, w::Relay::Create(client.get(), backend, job, ropts));
  }
  // The step loop below speaks to either.
  auto run_step = [&](int64_t s, const std::vector<w::MicroBatch>& mbs, const std::vector<w::MicroBatch>& ev) {
    return group ? group->RunStep(s, mbs, ev) : relay->RunStep(s, mbs, ev);
  };
  auto last_times = [&]() -> const w::RelayTimes& { return group ? group->last_times() : relay->last_times(); };
  auto versions = [&]() -> const w::VersionStats& { return group ? group->versions() : relay->versions(); };
  auto device_bytes = [&] { return group ? group->device_bytes() : relay->device_bytes(); };
  auto stash_host_bytes = [&] { return group ? group->stash_host_bytes() : relay->stash_host_bytes(); };

  if (job.data.train_path.empty()) {
    return l2l::InvalidArgument("the job has no data.train_path; set it in the job config");
  }
  std::optional<w::DataLoader> loader;
  L2L_RETURN_IF_ERROR(OpenData(job, reg, &loader));
  // In-job validation: this worker's share of the eval windows (by data rank).
  w::EvalSet eval;
  auto load_eval = [&](const w::WorkerRegistration& r) -> Status {
    if (!job.eval.enabled()) return Status::Ok();
    L2L_ASSIGN_OR_RETURN(eval, w::EvalSet::Load(job, r.data_rank, r.data_world));
    L2L_LOG_INFO("eval: {} micro-batch(es) of the {} windows ({} scored targets) every {} steps from {}",
                 eval.micro_batches.size(), eval.windows, eval.scored, job.eval.every, job.eval.data_path);
    return Status::Ok();
  };
  L2L_RETURN_IF_ERROR(load_eval(reg));
  L2L_LOG_INFO("backend {}{}, stash {}, mode {} (staleness {}), device bytes {}", backend->name(),
               group ? " (+" + std::to_string(backends.size() - 1) + " more in the group: " + f.devices + ")" : "",
               ToString(ropts.stash), ToString(job.train.mode), ropts.staleness, device_bytes());

  const auto t_start = std::chrono::steady_clock::now();
  int64_t done = 0;
  int rejoins = 0;
  // After a worker loss the EPS may abandon this worker's step (or declare it lost): the
  // worker re-registers and restarts at the step and data position the EPS hands back.
  auto rejoin = [&](const Status& why, int64_t* step) -> Status {
    if (!(w::NeedsRejoin(why) || client->rejoin_requested()) || ++rejoins > 100) return why;
    L2L_LOG_WARN("rejoining the EPS: {}", why.message());
    L2L_RETURN_IF_ERROR(client->Rejoin().WithContext("rejoining after: " + why.message()));
    L2L_RETURN_IF_ERROR(OpenData(job, client->registration(), &loader));
    L2L_RETURN_IF_ERROR(load_eval(client->registration()));
    *step = client->registration().start_step;
    L2L_LOG_INFO("rejoined as worker {} of {}, restarting at step {} (data {})",
                 client->registration().worker_id, client->registration().num_workers, *step,
                 client->registration().data_position);
    return Status::Ok();
  };
  int64_t step = reg.start_step;
  bool stopped_by_eps = false;
  // End of the last relay step that succeeded (the timeline's between_s: the StepDone
  // round trip and the data loading that separate two relay steps).
  std::optional<std::chrono::steady_clock::time_point> last_step_end;
  for (;;) {  // until the last step committed (or the EPS stopped the job)
    for (; step < total_steps && !g_stop.load(); ++step) {
      std::vector<w::MicroBatch> batches = loader->NextMany(job.train.micro_batches);
      static const std::vector<w::MicroBatch> kNoEval;
      const auto run_start = std::chrono::steady_clock::now();
      Result<w::StepReport> report = run_step(step, batches, job.EvalAt(step) ? eval.micro_batches : kNoEval);
      const auto run_end = std::chrono::steady_clock::now();
      if (report.ok()) {
        report->between_s = last_step_end ? std::chrono::duration<double>(run_start - *last_step_end).count() : 0.0;
        last_step_end = run_end;
      } else {
        last_step_end.reset();
      }
      if (!report.ok() && report.status().code() == l2l::StatusCode::kAborted) {
        L2L_LOG_INFO("the EPS stopped the job at step {}: {}", step, report.status().message());
        stopped_by_eps = true;
        break;
      }
      if (!report.ok()) {
        L2L_RETURN_IF_ERROR(rejoin(report.status(), &step));
        --step;  // the loop's ++step lands on the restart step
        continue;
      }
      if (!std::isfinite(report->loss)) {
        L2L_LOG_WARN("step {}: the loss is {} (the EPS skips the step; check the data and the learning rate)", step,
                     report->loss);
      }
      report->data_position = loader->position().ToString();
      Status st = client->StepDone(*report);
      if (st.code() == l2l::StatusCode::kAborted) {
        L2L_LOG_INFO("the EPS stopped the job after step {}: {}", step, st.message());
        ++done;
        stopped_by_eps = true;
        break;
      }
      if (!st.ok()) {
        L2L_RETURN_IF_ERROR(rejoin(st.WithContext("reporting step " + std::to_string(step)), &step));
        --step;
        continue;
      }
      ++done;
      if (report->eval_tokens > 0) {
        std::printf("step %lld val_loss %.4f val_ppl %.3f (this worker's %lld eval tokens)\n",
                    static_cast<long long>(step + 1), report->eval_loss, std::exp(report->eval_loss),
                    static_cast<long long>(report->eval_tokens));
      }
      if (job.train.log_every > 0 && (step % job.train.log_every == 0 || step + 1 == total_steps)) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        const double per_step = elapsed / static_cast<double>(done);
        const w::RelayTimes& t = last_times();
        std::printf("step %lld/%lld loss %.4f tok/s %.0f step_s %.3f wait_layer %.3f wait_push %.3f lag %lld eta %.0fs\n",
                    static_cast<long long>(step + 1), static_cast<long long>(total_steps), report->loss,
                    static_cast<double>(report->tokens) / t.total, t.total, t.wait_layer, t.wait_push,
                    static_cast<long long>(versions().max_lag),
                    per_step * static_cast<double>(total_steps - step - 1));
        std::fflush(stdout);
      }
    }
    if (stopped_by_eps || g_stop.load() || step < total_steps) break;
    // Reported is not done: until the last step commits, another worker's loss can still
    // abandon it, and every worker must redo it (this one too: its gradients of the step
    // are dropped). Exit only once layer 0 holds the last step's version.
    Result<w::LayerWeights> last = client->AcquireLayer(0, total_steps, std::chrono::seconds(30));
    if (last.ok()) {
      client->ReleaseLayer(0);
      // Committed is not durable: a daemon that dies before the last step's checkpoint
      // resumes from an earlier one and needs this worker again. Leave (and exit 0) only
      // once it is written; an error exits non-zero so a supervisor restarts the worker.
      if (total_steps < job.train.steps) break;  // --steps stopped short of the job's end
      // Every update of the last step is done (layer 0 is published last): stop asking
      // for more before leaving, else the daemon refuses the next ask with a warning.
      if (updater) updater->Stop();
      Status left = client->LeaveAfterLastStep(std::chrono::seconds(30));
      if (left.code() == l2l::StatusCode::kDeadlineExceeded) {
        L2L_LOG_INFO("waiting for the EPS to make the last step durable: {}", left.message());
        continue;
      }
      if (left.code() == l2l::StatusCode::kAborted) break;  // the EPS is stopping
      if (!left.ok() && (w::NeedsRejoin(left) || client->rejoin_requested())) {
        L2L_RETURN_IF_ERROR(rejoin(left, &step));
        continue;
      }
      L2L_RETURN_IF_ERROR(left.WithContext("leaving after the last step (" + std::to_string(total_steps) + ")"));
      break;
    }
    if (last.status().code() == l2l::StatusCode::kAborted) break;  // the EPS stopped the job
    if (last.status().code() == l2l::StatusCode::kDeadlineExceeded) continue;  // others still at it
    L2L_RETURN_IF_ERROR(rejoin(last.status().WithContext("waiting for step " + std::to_string(total_steps - 1) +
                                                         " to commit"),
                               &step));
  }
  const w::VersionStats& v = versions();
  if (updater) updater->Stop();  // its last UpdateDone is counted before the summary
  std::printf("l2l-worker: done steps=%lld peak_rss_kb=%lld device_bytes=%zu stash_host_bytes=%zu "
              "max_lag=%lld min_lag=%lld device_updates=%lld\n",
              static_cast<long long>(done), static_cast<long long>(PeakRssKb()), device_bytes(),
              stash_host_bytes(), static_cast<long long>(v.max_lag),
              static_cast<long long>(v.min_lag), static_cast<long long>(updater ? updater->updates_done() : 0));
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"l2l-worker: runs the layer-to-layer relay for an l2l-eps job"};
  app.add_option("--eps", f.eps, "EPS control address host:port")->required();
  auto* device_opt = app.add_option("--device", f.device, "cpu or cuda:N");
  app.add_option("--devices", f.devices,
                 "cuda:0,cuda:1,...: several GPUs as one worker (1/n fetch each, NCCL all-gather, "
                 "reduce-scattered gradients)")
      ->excludes(device_opt);
  app.add_option("--config", f.config, "job YAML on this host (data path; model must match)");
  app.add_option("--threads", f.threads, "CPU backend threads (0 = all cores)");
  app.add_option("--compute", f.compute,
                 "fp32 | bf16: CPU backend matrix products (bf16 operands, fp32 accumulation; "
                 "needs AVX512_BF16). L2L_CPU_GEMM wins");
  app.add_option("--transport", f.transport, "auto | shm | grpc");
  app.add_option("--device-updates", f.device_updates,
                 "auto (default: on for cuda devices) | on | off: offer this worker's device for layer updates "
                 "(interleaved optimizer; shm only)");
  app.add_option("--name", f.name, "worker name shown in status (default hostname:pid)");
  app.add_option("--connect-timeout-ms", f.connect_timeout_ms, "how long to retry registering");
  app.add_option("--push-deadline-floor-ms", f.push_deadline_floor_ms,
                 "a gRPC gradient push may take this long plus its bytes at --push-min-mib-per-s");
  app.add_option("--push-min-mib-per-s", f.push_min_mib_per_s,
                 "the slowest rate a gRPC gradient push is allowed, MiB/s (default 8)");
  app.add_option("--steps", f.steps, "stop after this step count (default: the job's)");
  app.add_option("--recompute", f.recompute,
                 "always | never | auto: keep block intermediates for the backward (default: train.recompute)");
  app.add_option("--activation-budget-mb", f.activation_budget_mb,
                 "memory for kept intermediates, MiB; 0 = the default (train.activation_budget_mb)");
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error");
  app.add_option("--token-file", f.token_file,
                 "file (mode 0600) with the EPS's shared token (default: $L2L_TOKEN_FILE)");
  app.add_option("--tls-ca", f.tls_ca, "PEM CA certificate: connect with TLS and verify the EPS against it");
  app.add_option("--tls-server-name", f.tls_server_name,
                 "with --tls-ca: the name the EPS's certificate must hold (default: the host of --eps)");
  app.add_flag_callback("--help-env", l2l::PrintEnvHelpAndExit, l2l::kHelpEnvDoc);
  CLI11_PARSE(app, argc, argv);

  // oneDNN's OpenMP threads spin between the many small GEMMs and starve the TBB threads
  // of the other ops (docs/performance.md); wait passively unless the user chose.
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
  if (Status st = l2l::InitLogging(f.log_level, "", "worker"); !st.ok()) {
    std::fprintf(stderr, "l2l-worker: %s\n", st.ToString().c_str());
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  // A bad --compute, or a CPU worker that cannot run its compute precision, says so
  // before it registers.
  if (f.compute != "fp32" && f.compute != "bf16") {
    std::fprintf(stderr, "l2l-worker: error: --compute %s: expected fp32 or bf16\n", f.compute.c_str());
    return 1;
  }
  if (f.devices.empty() && f.device == "cpu") {
    auto gemm = l2l::kernels::ResolveCpuGemm(f.compute == "bf16" ? l2l::kernels::CpuGemmPrecision::kBf16
                                                                  : l2l::kernels::CpuGemmPrecision::kFp32);
    if (!gemm.ok()) {
      std::fprintf(stderr, "l2l-worker: error: %s\n", gemm.status().ToString().c_str());
      return 1;
    }
  }
  std::atomic<bool> done{false};
  std::thread watchdog(StopWatchdog, &done);
  int exit_code = 1;
  Status st = Run(f, &exit_code);
  done.store(true);
  watchdog.join();
  if (!st.ok()) {
    std::fprintf(stderr, "l2l-worker: error: %s\n", st.ToString().c_str());
    l2l::FlushLogs();
    return exit_code;
  }
  return 0;
}
