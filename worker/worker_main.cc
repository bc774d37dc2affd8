// l2l-worker: one training worker. Registers with the EPS, receives the job (model,
// optimizer, data) and its data shard, and runs the layer-to-layer relay
// (worker/relay.h) step after step until the job's step count, until the EPS stops the
// job, or until SIGINT/SIGTERM (it finishes the step in progress, then leaves). The step
// loop holds one StepRunner (worker/step_runner.h): a Relay for one device, a
// DeviceGroup for --devices. Run's named steps: ResolveOptions (the flags parsed once),
// MeasureDeviceUpdates, then the Worker's Register (Connect), BuildRunner
// (MakeBackends, CreateStepRunner), OpenDataAndEval, Train (RunSteps, AwaitLastStep,
// LeaveAfterLastStep) and PrintSummary.
//
//   l2l-worker --eps 127.0.0.1:PORT [--device cpu|cuda:N | --devices cuda:0,cuda:1,...]
//              [--config FILE] [--threads N] [--compute fp32|bf16]
//              [--transport auto|shm|grpc] [--name NAME] [--connect-timeout-ms MS] [--shard-wait-ms MS]
//              [--heartbeat-ms MS]
//              [--steps N] [--log-level info] [--token-file FILE] [--tls-ca CA.pem]
//              [--tls-server-name NAME] [--tls-cert CERT.pem --tls-key KEY.pem]
//              [--push-deadline-floor-ms MS] [--push-min-mib-per-s R]
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
// The job's data files as the EPS sent them (data.train_path, data.val_path, eval.data)
// must lie inside the data directories it sent with them (RegisterReply.data_roots,
// common/path_policy.h), checked before any is opened; else exit 1 naming the key.
// Progress lines go to stdout:
//   step 12/100 loss 4.1234 tok/s 5321 step_s 0.77 wait_layer 0.01 wait_push 0.00 lag 0 eta 68s
// and, at exit, one summary line the integration tests parse:
//   l2l-worker: done steps=N peak_rss_kb=K device_bytes=D stash_host_bytes=H max_lag=A min_lag=B device_updates=U
// --token-file (default $L2L_TOKEN_FILE): the EPS's shared token, sent on every call;
// --tls-ca: connect with TLS and verify the EPS against CA.pem (docs/operations.md
// "Security"); --tls-server-name NAME: the name the EPS's certificate must hold when it is
// not the host of --eps (needs --tls-ca); --tls-cert/--tls-key (with --tls-ca; the key not
// readable by others): this worker's certificate, for an EPS that requires client
// certificates (l2l-eps --tls-client-ca, mutual TLS). --push-deadline-floor-ms and --push-min-mib-per-s:
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
#include "common/name_table.h"
#include "common/path_policy.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/data_loader.h"
#include "worker/device_group.h"
#include "worker/device_updater.h"
#include "worker/eps_client.h"
#include "worker/eval_set.h"
#include "worker/micro_batch_auto.h"
#include "worker/relay.h"
#include "worker/step_runner.h"

namespace {

using l2l::Result;
using l2l::Status;
using l2l::kernels::CpuGemmPrecision;
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

// The command line as CLI11 fills it (text); ResolveOptions parses it once into Options.
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
  int64_t shard_wait_ms = 600000;
  int64_t heartbeat_ms = 500;
  int64_t push_deadline_floor_ms = 60000;
  double push_min_mib_per_s = 8.0;
  int64_t steps = -1;
  std::string recompute;             // overrides train.recompute when set
  int64_t activation_budget_mb = -1; // overrides train.activation_budget_mb when >= 0
  std::string log_level = "info";
  std::string token_file, tls_ca, tls_server_name, tls_cert, tls_key;
};

// --compute fp32|bf16: the CPU backend's matrix-product precision (its names are
// kernels/backend.h's ToString / ParseCpuGemmPrecision, as L2L_CPU_GEMM's).
Result<CpuGemmPrecision> ParseCompute(const std::string& s) {
  Result<CpuGemmPrecision> p = l2l::kernels::ParseCpuGemmPrecision(s);
  if (!p.ok()) return l2l::InvalidArgument("--compute " + s + ": expected fp32 or bf16");
  return p;
}

// --device-updates auto|on|off: whether this worker offers its (first) device for the
// EPS's layer updates; auto: on for a CUDA device.
enum class DeviceUpdates { kAuto, kOn, kOff };
constexpr std::pair<DeviceUpdates, const char*> kDeviceUpdates[] = {
    {DeviceUpdates::kAuto, "auto"}, {DeviceUpdates::kOn, "on"}, {DeviceUpdates::kOff, "off"}};
Result<DeviceUpdates> ParseDeviceUpdates(const std::string& s) {
  Result<DeviceUpdates> d = l2l::ParseName(kDeviceUpdates, s);
  if (!d.ok()) return l2l::InvalidArgument("--device-updates " + s + ": must be auto, on or off");
  return d;
}

// The command line, checked and parsed once: the modes as enums, the devices as a list,
// the EPS client's options (token and CA files read).
struct Options {
  CpuGemmPrecision compute = CpuGemmPrecision::kFp32;
  DeviceUpdates device_updates = DeviceUpdates::kAuto;
  // --devices split at its commas; without --devices, --device alone. [0]: the device
  // the updater runs on.
  std::vector<std::string> devices;
  w::ClientOptions client;
};

// --devices "a,b,c" -> {a, b, c} (an empty name stays, and fails as a device); none: {--device}.
std::vector<std::string> DeviceNames(const Flags& f) {
  if (f.devices.empty()) return {f.device};
  std::vector<std::string> names;
  size_t pos = 0;
  while (pos <= f.devices.size()) {
    const size_t comma = std::min(f.devices.find(',', pos), f.devices.size());
    names.push_back(f.devices.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return names;
}

// Parses and checks the flags (--compute is parsed by main, before anything starts).
Result<Options> ResolveOptions(const Flags& f, CpuGemmPrecision compute) {
  Options o;
  o.compute = compute;
  w::ClientOptions& copts = o.client;
  const l2l::Result<l2l::Transport> transport = l2l::ParseTransport(f.transport);
  if (!transport.ok()) return transport.status().WithContext("--transport");
  copts.transport = *transport;
  copts.connect_timeout = std::chrono::milliseconds(f.connect_timeout_ms);
  if (f.shard_wait_ms <= 0) {
    return l2l::InvalidArgument("--shard-wait-ms " + std::to_string(f.shard_wait_ms) + ": must be positive");
  }
  copts.shard_wait = std::chrono::milliseconds(f.shard_wait_ms);
  if (f.heartbeat_ms < 10 || f.heartbeat_ms > 3600000) {
    return l2l::InvalidArgument("--heartbeat-ms " + std::to_string(f.heartbeat_ms) +
                                ": must be 10 .. 3600000 (and well under the daemon's heartbeat_timeout_ms)");
  }
  copts.heartbeat_interval = std::chrono::milliseconds(f.heartbeat_ms);
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
  L2L_ASSIGN_OR_RETURN(l2l::ClientTlsFiles tls, l2l::ReadClientTlsFiles(f.tls_ca, f.tls_cert, f.tls_key));
  copts.tls_ca_pem = std::move(tls.ca_pem);
  copts.tls_cert_pem = std::move(tls.cert_pem);
  copts.tls_key_pem = std::move(tls.key_pem);
  if (!f.tls_server_name.empty() && f.tls_ca.empty()) {
    return l2l::InvalidArgument("--tls-server-name " + f.tls_server_name +
                                " needs --tls-ca CA.pem: it names the host the EPS's TLS certificate must hold, "
                                "and without --tls-ca the connection is plaintext");
  }
  copts.tls_server_name = f.tls_server_name;
  L2L_ASSIGN_OR_RETURN(o.device_updates, ParseDeviceUpdates(f.device_updates));
  o.devices = DeviceNames(f);
  return o;
}

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

// A backend on `device` (cpu: with --threads and --compute; a GPU takes fp32 only).
Result<std::unique_ptr<l2l::kernels::Backend>> MakeBackend(const std::string& device, const Flags& f,
                                                           const Options& o) {
  if (device == "cpu") {
    l2l::kernels::CpuBackendOptions co;
    co.num_threads = f.threads;
    co.gemm = o.compute;
    return l2l::kernels::CreateCpuBackend(co);
  }
  if (o.compute != CpuGemmPrecision::kFp32) {
    return l2l::InvalidArgument(std::string("--compute ") + l2l::kernels::ToString(o.compute) +
                                " is for --device cpu; on a GPU set L2L_CUDA_GEMM=bf16");
  }
  return l2l::kernels::CreateBackend(device);
}

// Before registering (the rates go to the EPS at Register): the interleaved
// optimizer's second backend on the first device, its measured rates put in
// o->client.optimizer. Null when --device-updates (auto: a CUDA device) leaves it off.
Result<std::unique_ptr<w::DeviceUpdater>> MeasureDeviceUpdates(const Flags& f, Options* o) {
  const std::string& device = o->devices[0];
  const bool offer = o->device_updates == DeviceUpdates::kOn ||
                     (o->device_updates == DeviceUpdates::kAuto && device.rfind("cuda", 0) == 0);
  if (!offer) return std::unique_ptr<w::DeviceUpdater>();
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<l2l::kernels::Backend> ube, MakeBackend(device, f, *o));
  w::OptimizerOffer& offer_rates = o->client.optimizer;
  L2L_ASSIGN_OR_RETURN(offer_rates, w::MeasureDeviceRates(ube.get()));
  L2L_LOG_INFO("device updates on {}: AdamW {:.3g} params/s, h2d {:.3g} B/s, d2h {:.3g} B/s (0 = no link)",
               offer_rates.device, offer_rates.update_params_per_s, offer_rates.h2d_bytes_per_s,
               offer_rates.d2h_bytes_per_s);
  return std::make_unique<w::DeviceUpdater>(std::move(ube));
}

// Registers with the EPS. On failure *exit_code says why: 1 refused (token), 3 the
// job stayed full, 2 unreachable.
Result<std::unique_ptr<w::EpsClient>> Connect(const Flags& f, const Options& o, int* exit_code) {
  Result<std::unique_ptr<w::EpsClient>> connected = w::ConnectEps(f.eps, o.client);
  if (connected.ok()) return connected;
  switch (connected.status().code()) {
    case l2l::StatusCode::kPermissionDenied: *exit_code = 1; break;
    case l2l::StatusCode::kResourceExhausted: *exit_code = 3; break;  // the job stayed full
    default: *exit_code = 2;
  }
  return connected.status().WithContext("cannot register with the EPS at " + f.eps + " (retried for " +
                                        std::to_string(f.connect_timeout_ms) + " ms)");
}

// Confines the data files of the job the daemon sent (train, val, eval) to the roots it
// sent with it, replacing each by its resolved path, before any is opened: a daemon
// whose job names a file outside its own paths.data is refused here too.
Status ConfineDataPaths(const std::vector<std::string>& roots, l2l::JobConfig* job) {
  std::string* paths[] = {&job->data.train_path, &job->data.val_path, &job->eval.data_path};
  const char* keys[] = {"data.train_path", "data.val_path", "eval.data"};
  for (int i = 0; i < 3; ++i) {
    if (paths[i]->empty()) continue;
    auto allowed = l2l::ConfinePath(keys[i], *paths[i], "", roots,
                                    "the daemon's paths.data, sent at Register; the worker reads nothing else");
    if (!allowed.ok()) return allowed.status().WithContext("the job from the EPS");
    *paths[i] = *allowed;
  }
  return Status::Ok();
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

// One backend per device: --device's, or each of --devices'.
Result<std::vector<std::unique_ptr<l2l::kernels::Backend>>> MakeBackends(const Flags& f, const Options& o) {
  std::vector<std::unique_ptr<l2l::kernels::Backend>> owned;
  if (o.devices.size() == 1) {
    L2L_ASSIGN_OR_RETURN(std::unique_ptr<l2l::kernels::Backend> be, MakeBackend(o.devices[0], f, o));
    owned.push_back(std::move(be));
    return owned;
  }
  for (const std::string& name : o.devices) {
    Result<std::unique_ptr<l2l::kernels::Backend>> be = l2l::kernels::CreateBackend(name);
    if (!be.ok()) return be.status().WithContext("--devices " + f.devices);
    owned.push_back(std::move(be).value());
  }
  return owned;
}

// The job's relay options with --recompute and --activation-budget-mb applied.
Result<w::RelayOptions> RelayOptionsFor(const l2l::JobConfig& job, const Flags& f) {
  L2L_ASSIGN_OR_RETURN(w::RelayOptions ropts, w::RelayOptions::FromJob(job));
  if (!f.recompute.empty()) {
    auto mode = l2l::ParseRecomputeMode(f.recompute);
    if (!mode.ok()) return mode.status().WithContext("--recompute");
    ropts.recompute = *mode;
  }
  if (f.activation_budget_mb >= 0) ropts.activation_budget_bytes = static_cast<size_t>(f.activation_budget_mb) << 20;
  return ropts;
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

// One registered worker: what Run builds, step by step (the public methods, in the
// order Run calls them), and the step loop over it.
class Worker {
 public:
  explicit Worker(const Flags& f) : f_(f) {}

  // Registers with the EPS (Connect: *exit_code set on failure), starts `updater` on the
  // client (shm only: over grpc it is dropped) and takes the job the EPS hands out, with
  // --config and --steps applied.
  Status Register(const Options& o, std::unique_ptr<w::DeviceUpdater> updater, int* exit_code) {
    L2L_ASSIGN_OR_RETURN(client_, Connect(f_, o, exit_code));
    updater_ = std::move(updater);
    const w::WorkerRegistration& reg = client_->registration();
    if (updater_ && reg.transport == l2l::Transport::kShm) {
      updater_->Start(client_.get());
    } else if (updater_) {
      L2L_LOG_INFO("device updates off: the update exchange needs the shm transport (this worker uses grpc)");
      updater_.reset();
    }
    job_ = reg.job;
    L2L_RETURN_IF_ERROR(ConfineDataPaths(reg.data_roots, &job_));
    if (!f_.config.empty()) L2L_RETURN_IF_ERROR(ApplyLocalConfig(f_.config, &job_));
    total_steps_ = f_.steps >= 0 ? f_.steps : job_.train.steps;
    L2L_LOG_INFO("registered as worker {} of {} (transport {}, data shard {}/{}, start step {})",
                 reg.worker_id, reg.num_workers, ToString(reg.transport), reg.data_rank, reg.data_world,
                 reg.start_step);
    return Status::Ok();
  }

  // One backend per device (MakeBackends), and the relay or the device group over them.
  Status BuildRunner(const Options& o) {
    L2L_ASSIGN_OR_RETURN(backends_, MakeBackends(f_, o));
    L2L_ASSIGN_OR_RETURN(ropts_, RelayOptionsFor(job_, f_));
    if (job_.train.micro_batches_auto) {
      // train.micro_batches: auto -> measured and planned here (worker/micro_batch_auto.h).
      std::string why;
      L2L_RETURN_IF_ERROR(w::ResolveAutoMicroBatches(backends_[0].get(), ropts_.activation_budget_bytes,
                                                     static_cast<int>(backends_.size()), &job_, &why)
                              .status());
      L2L_LOG_INFO("{}", why);
    }
    std::vector<l2l::kernels::Backend*> raw;
    for (auto& be : backends_) raw.push_back(be.get());
    L2L_ASSIGN_OR_RETURN(runner_, w::CreateStepRunner(client_.get(), raw, job_, ropts_));
    return Status::Ok();
  }

  // The training data and eval windows of this registration.
  Status OpenDataAndEval() {
    if (job_.data.train_path.empty()) {
      return l2l::InvalidArgument("the job has no data.train_path; set it in the job config");
    }
    L2L_RETURN_IF_ERROR(OpenData(job_, client_->registration(), &loader_));
    L2L_RETURN_IF_ERROR(LoadEval(client_->registration()));
    L2L_LOG_INFO("backend {}{}, stash {}, mode {} (staleness {}), device bytes {}", backends_[0]->name(),
                 backends_.size() > 1
                     ? " (+" + std::to_string(backends_.size() - 1) + " more in the group: " + f_.devices + ")"
                     : "",
                 ToString(ropts_.stash), ToString(job_.train.mode), ropts_.staleness, runner_->device_bytes());
    return Status::Ok();
  }

  // Runs steps until the last one is committed and durable, the EPS stops the
  // job, or a signal asks to stop.
  Status Train() {
    t_start_ = std::chrono::steady_clock::now();
    int64_t step = client_->registration().start_step;
    for (;;) {  // until the last step committed (or the EPS stopped the job)
      L2L_ASSIGN_OR_RETURN(const bool stopped_by_eps, RunSteps(&step));
      if (stopped_by_eps || g_stop.load() || step < total_steps_) return Status::Ok();
      L2L_ASSIGN_OR_RETURN(const bool leave, AwaitLastStep(&step));
      if (leave) return Status::Ok();
    }
  }

  // The summary line the integration tests parse.
  void PrintSummary() {
    for (const auto& be : backends_) {
      const l2l::kernels::Backend::Bf16OperandStats b = be->bf16_operand_stats();
      if (b.cast_elements + b.reused_elements == 0) continue;  // no bf16 GEMMs here
      L2L_LOG_INFO("{}: bf16 GEMM operands: {:.4g} M elements cast, {:.4g} M read in place from a bf16 copy "
                   "(a layer published bf16, or one the op before wrote) ({:.1f}%)", be->name(),
                   static_cast<double>(b.cast_elements) / 1e6,
                   static_cast<double>(b.reused_elements) / 1e6,
                   100.0 * static_cast<double>(b.reused_elements) /
                       static_cast<double>(b.cast_elements + b.reused_elements));
    }
    const w::VersionStats& v = runner_->versions();
    if (updater_) updater_->Stop();  // its last UpdateDone is counted before the summary
    std::printf("l2l-worker: done steps=%lld peak_rss_kb=%lld device_bytes=%zu stash_host_bytes=%zu "
                "max_lag=%lld min_lag=%lld device_updates=%lld\n",
                static_cast<long long>(done_), static_cast<long long>(PeakRssKb()), runner_->device_bytes(),
                runner_->stash_host_bytes(), static_cast<long long>(v.max_lag),
                static_cast<long long>(v.min_lag), static_cast<long long>(updater_ ? updater_->updates_done() : 0));
    std::fflush(stdout);
  }

 private:
  enum class StepOutcome { kDone, kRejoined, kStopped };

  Status LoadEval(const w::WorkerRegistration& r) {
    if (!job_.eval.enabled()) return Status::Ok();
    L2L_ASSIGN_OR_RETURN(eval_, w::EvalSet::Load(job_, r.data_rank, r.data_world));
    L2L_LOG_INFO("eval: {} micro-batch(es) of the {} windows ({} scored targets) every {} steps from {}",
                 eval_.micro_batches.size(), eval_.windows, eval_.scored, job_.eval.every, job_.eval.data_path);
    return Status::Ok();
  }

  // After a worker loss the EPS may abandon this worker's step (or declare it lost): the
  // worker re-registers and restarts at the step and data position the EPS hands back.
  // Errors that call for no rejoin (and the 101st rejoin) are returned as they are.
  Status Rejoin(const Status& why, int64_t* step) {
    if (!(w::NeedsRejoin(why) || client_->rejoin_requested()) || ++rejoins_ > 100) return why;
    L2L_LOG_WARN("rejoining the EPS: {}", why.message());
    L2L_RETURN_IF_ERROR(client_->Rejoin().WithContext("rejoining after: " + why.message()));
    L2L_RETURN_IF_ERROR(OpenData(job_, client_->registration(), &loader_));
    L2L_RETURN_IF_ERROR(LoadEval(client_->registration()));
    *step = client_->registration().start_step;
    L2L_LOG_INFO("rejoined as worker {} of {}, restarting at step {} (data {})",
                 client_->registration().worker_id, client_->registration().num_workers, *step,
                 client_->registration().data_position);
    return Status::Ok();
  }

  // Steps *step..total_steps-1 (until a signal); true when the EPS stopped the job.
  Result<bool> RunSteps(int64_t* step) {
    for (; *step < total_steps_ && !g_stop.load(); ++*step) {
      L2L_ASSIGN_OR_RETURN(const StepOutcome outcome, RunOneStep(step));
      if (outcome == StepOutcome::kStopped) return true;
      if (outcome == StepOutcome::kRejoined) --*step;  // the loop's ++ lands on the restart step
    }
    return false;
  }

  // Runs step *step and reports it to the EPS; on a rejoin *step is the restart step.
  Result<StepOutcome> RunOneStep(int64_t* step) {
    const int64_t s = *step;
    std::vector<w::MicroBatch> batches = loader_->NextMany(job_.train.micro_batches);
    static const std::vector<w::MicroBatch> kNoEval;
    const auto run_start = std::chrono::steady_clock::now();
    Result<w::StepReport> report = runner_->RunStep(s, batches, job_.EvalAt(s) ? eval_.micro_batches : kNoEval);
    const auto run_end = std::chrono::steady_clock::now();
    if (report.ok()) {
      // between_s: the StepDone round trip and the data loading since the last relay step
      // that succeeded.
      report->between_s = last_step_end_ ? std::chrono::duration<double>(run_start - *last_step_end_).count() : 0.0;
      last_step_end_ = run_end;
    } else {
      last_step_end_.reset();
    }
    if (!report.ok() && report.status().code() == l2l::StatusCode::kAborted) {
      L2L_LOG_INFO("the EPS stopped the job at step {}: {}", s, report.status().message());
      return StepOutcome::kStopped;
    }
    if (!report.ok()) {
      L2L_RETURN_IF_ERROR(Rejoin(report.status(), step));
      return StepOutcome::kRejoined;
    }
    if (!std::isfinite(report->loss)) {
      L2L_LOG_WARN("step {}: the loss is {} (the EPS skips the step; check the data and the learning rate)", s,
                   report->loss);
    }
    report->data_position = loader_->position().ToString();
    Status st = client_->StepDone(*report);
    if (st.code() == l2l::StatusCode::kAborted) {
      L2L_LOG_INFO("the EPS stopped the job after step {}: {}", s, st.message());
      ++done_;
      return StepOutcome::kStopped;
    }
    if (!st.ok()) {
      L2L_RETURN_IF_ERROR(Rejoin(st.WithContext("reporting step " + std::to_string(s)), step));
      return StepOutcome::kRejoined;
    }
    ++done_;
    PrintProgress(s, *report);
    return StepOutcome::kDone;
  }

  void PrintProgress(int64_t step, const w::StepReport& report) {
    if (report.eval_tokens > 0) {
      std::printf("step %lld val_loss %.4f val_ppl %.3f (this worker's %lld eval tokens)\n",
                  static_cast<long long>(step + 1), report.eval_loss, std::exp(report.eval_loss),
                  static_cast<long long>(report.eval_tokens));
    }
    if (job_.train.log_every > 0 && (step % job_.train.log_every == 0 || step + 1 == total_steps_)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
      const double per_step = elapsed / static_cast<double>(done_);
      const w::RelayTimes& t = runner_->last_times();
      std::printf("step %lld/%lld loss %.4f tok/s %.0f step_s %.3f wait_layer %.3f wait_push %.3f lag %lld eta %.0fs\n",
                  static_cast<long long>(step + 1), static_cast<long long>(total_steps_), report.loss,
                  static_cast<double>(report.tokens) / t.total, t.total, t.wait_layer, t.wait_push,
                  static_cast<long long>(runner_->versions().max_lag),
                  per_step * static_cast<double>(total_steps_ - step - 1));
      std::fflush(stdout);
    }
  }

  // Every step is reported, but reported is not done: until the last step commits,
  // another worker's loss can still abandon it, and every worker must redo it (this one
  // too: its gradients of the step are dropped). Waits until layer 0 holds the last
  // step's version, then leaves. True: leave the loop; false: go round again (others
  // still at it, or rejoined at *step).
  Result<bool> AwaitLastStep(int64_t* step) {
    Result<w::LayerWeights> last = client_->AcquireLayer(0, total_steps_, std::chrono::seconds(30));
    if (last.ok()) {
      client_->ReleaseLayer(0);
      if (total_steps_ < job_.train.steps) return true;  // --steps stopped short of the job's end
      return LeaveAfterLastStep(step);
    }
    if (last.status().code() == l2l::StatusCode::kAborted) return true;  // the EPS stopped the job
    if (last.status().code() == l2l::StatusCode::kDeadlineExceeded) return false;  // others still at it
    L2L_RETURN_IF_ERROR(Rejoin(last.status().WithContext("waiting for step " + std::to_string(total_steps_ - 1) +
                                                         " to commit"),
                               step));
    return false;
  }

  // Committed is not durable: a daemon that dies before the last step's checkpoint
  // resumes from an earlier one and needs this worker again. Leave (and exit 0) only once
  // it is written; an error exits non-zero so a supervisor restarts the worker. As
  // AwaitLastStep: true to leave, false to go round again.
  Result<bool> LeaveAfterLastStep(int64_t* step) {
    // Every update of the last step is done (layer 0 is published last): stop asking for
    // more before leaving, else the daemon refuses the next ask with a warning.
    if (updater_) updater_->Stop();
    Status left = client_->LeaveAfterLastStep(std::chrono::seconds(30));
    if (left.code() == l2l::StatusCode::kDeadlineExceeded) {
      L2L_LOG_INFO("waiting for the EPS to make the last step durable: {}", left.message());
      return false;
    }
    if (left.code() == l2l::StatusCode::kAborted) return true;  // the EPS is stopping
    if (!left.ok() && (w::NeedsRejoin(left) || client_->rejoin_requested())) {
      L2L_RETURN_IF_ERROR(Rejoin(left, step));
      return false;
    }
    L2L_RETURN_IF_ERROR(left.WithContext("leaving after the last step (" + std::to_string(total_steps_) + ")"));
    return true;
  }

  const Flags& f_;
  // Destroyed in reverse: the data, then the runner before its backends, the updater's
  // thread before the client it calls.
  std::unique_ptr<w::EpsClient> client_;
  std::unique_ptr<w::DeviceUpdater> updater_;  // null: no device updates
  l2l::JobConfig job_;
  int64_t total_steps_ = 0;  // --steps, else the job's
  std::vector<std::unique_ptr<l2l::kernels::Backend>> backends_;
  w::RelayOptions ropts_;  // the runner's (the start-up line names its stash and staleness)
  std::unique_ptr<w::StepRunner> runner_;  // a Relay on backends_[0], or a DeviceGroup over all
  std::optional<w::DataLoader> loader_;
  w::EvalSet eval_;  // in-job validation: this worker's share of the eval windows
  std::chrono::steady_clock::time_point t_start_;
  int64_t done_ = 0;     // steps reported (the summary's steps=)
  int rejoins_ = 0;
  // End of the last relay step that succeeded (the timeline's between_s).
  std::optional<std::chrono::steady_clock::time_point> last_step_end_;
};

// The worker's life, one named step after another (see Worker).
Status Run(const Flags& f, CpuGemmPrecision compute, int* exit_code) {
  L2L_ASSIGN_OR_RETURN(Options o, ResolveOptions(f, compute));
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<w::DeviceUpdater> updater, MeasureDeviceUpdates(f, &o));
  Worker wk(f);
  L2L_RETURN_IF_ERROR(wk.Register(o, std::move(updater), exit_code));
  L2L_RETURN_IF_ERROR(wk.BuildRunner(o));
  L2L_RETURN_IF_ERROR(wk.OpenDataAndEval());
  L2L_RETURN_IF_ERROR(wk.Train());
  wk.PrintSummary();
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
  app.add_option("--shard-wait-ms", f.shard_wait_ms,
                 "sharded jobs: how long a rejoin waits for a shard that is down or still rolling back before the "
                 "worker gives up (default 600000)");
  app.add_option("--heartbeat-ms", f.heartbeat_ms,
                 "how often the worker tells each daemon it is alive (default 500; keep it well under the daemon's "
                 "heartbeat_timeout_ms)");
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
  app.add_option("--tls-cert", f.tls_cert,
                 "with --tls-ca and --tls-key: this worker's PEM certificate, for an EPS that requires client "
                 "certificates (l2l-eps --tls-client-ca)");
  app.add_option("--tls-key", f.tls_key, "the PEM private key of --tls-cert (mode 0600: not readable by others)");
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
  const Result<CpuGemmPrecision> compute = ParseCompute(f.compute);
  if (!compute.ok()) {
    std::fprintf(stderr, "l2l-worker: error: %s\n", compute.status().message().c_str());
    return 1;
  }
  if (f.devices.empty() && f.device == "cpu") {
    auto gemm = l2l::kernels::ResolveCpuGemm(*compute);
    if (!gemm.ok()) {
      std::fprintf(stderr, "l2l-worker: error: %s\n", gemm.status().ToString().c_str());
      return 1;
    }
  }
  std::atomic<bool> done{false};
  std::thread watchdog(StopWatchdog, &done);
  int exit_code = 1;
  Status st = Run(f, *compute, &exit_code);
  done.store(true);
  watchdog.join();
  if (!st.ok()) {
    std::fprintf(stderr, "l2l-worker: error: %s\n", st.ToString().c_str());
    l2l::FlushLogs();
    return exit_code;
  }
  return 0;
}
