// l2l-eps: the eager param-server daemon. Parses the daemon config (--config) and CLI
// overrides, creates the job from --job, from a checkpoint (--resume DIR: a checkpoint
// directory, or a checkpoint root whose `latest` names one), or later from the
// CreateJob rpc; serves gRPC until a Shutdown rpc or SIGTERM/SIGINT, then finishes the
// step in flight, writes a final checkpoint, stops the job, removes its shared-memory
// segments and exits 0. Prints "l2l-eps listening on HOST:PORT" and writes the port to
// <state_dir>/eps.port. Tells systemd READY/STATUS/STOPPING (no-op without systemd).
// A bad config or an unreadable/corrupt checkpoint exits 1 with a message naming the
// file, before anything is written; so does a non-loopback --listen/--metrics-listen
// without client authentication (--token-file, or mutual TLS: --tls-cert/--tls-key with
// --tls-client-ca; TLS alone does not count) unless --insecure, before anything is bound
// (eps_server/server_security.h).
// Paths: every file a job names (model.from, init_safetensors, a model.preset path, the
// data and eval files) must lie in paths.models / paths.data / paths.presets (or
// --allow-models / --allow-data / --allow-presets), the state dir, or for --job the job
// file's directory; common/path_policy.h.
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <vector>

#include "common/adamw.h"
#include "common/config.h"
#include "common/env.h"
#include "common/file_util.h"
#include "common/shard_plan.h"
#include "common/logging.h"
#include "eps_server/eps_config.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "eps_server/job_start.h"
#include "eps_server/metrics.h"
#include "eps_server/run_log.h"
#include "eps_server/server_security.h"
#include "eps_server/shards.h"
#include "eps_server/watchdog.h"

namespace {

using namespace l2l;

int Fail(const Status& s) {
  std::fprintf(stderr, "l2l-eps: %s\n", s.ToString().c_str());
  return 1;
}

// The command line: overrides of the daemon config, and where the job comes from.
struct Flags {
  std::string config_path, job_path, resume, listen, state_dir, transport, job_id, log_level = "info";
  int workers = 0;
  int64_t host_bytes = -1;
  bool allow_remote = false;
  std::string tls_cert, tls_key, tls_client_ca, token_file;
  bool insecure = false;
  std::string spill_dir;
  std::string metrics_listen;
  std::vector<std::string> allow_models, allow_data, allow_presets;  // added to paths.*
  // Sharded jobs (common/shard_plan.h, docs/operations.md "Running on a cluster").
  std::string shard, shard_layers, coordinator, advertise, coordinator_ca;
  int64_t coordinator_timeout_ms = 120000;
};

void AddFlags(CLI::App* app, Flags* f) {
  app->add_option("--config", f->config_path, "daemon config YAML (configs/eps.yaml)");
  app->add_option("--job", f->job_path, "job config YAML; without it, wait for the CreateJob rpc");
  app->add_option("--resume", f->resume, "checkpoint directory, or checkpoint root (uses its `latest`)");
  app->add_option("--listen", f->listen, "host:port to listen on (default 127.0.0.1:0)");
  app->add_flag("--allow-remote", f->allow_remote,
                "deprecated, no effect: a non-loopback --listen needs --token-file, --tls-client-ca or --insecure");
  app->add_option("--tls-cert", f->tls_cert, "PEM certificate chain: serve gRPC over TLS (tls.cert; with --tls-key)");
  app->add_option("--tls-key", f->tls_key, "PEM private key of --tls-cert, not readable by others (tls.key)");
  app->add_option("--tls-client-ca", f->tls_client_ca,
                  "PEM CA certificate(s): require every gRPC client to present a certificate signed by it "
                  "(mutual TLS; tls.client_ca; needs --tls-cert/--tls-key)");
  app->add_option("--token-file", f->token_file,
                  "file (mode 0600) with a shared token every client must send as 'authorization: Bearer "
                  "<token>' on gRPC and metrics (auth.token_file)");
  app->add_flag("--insecure", f->insecure,
                "allow a non-loopback --listen / --metrics-listen without client authentication (token or mTLS)");
  app->add_option("--state-dir", f->state_dir, "state directory (eps.port is written there)");
  app->add_option("--workers", f->workers, "expected workers");
  app->add_option("--host-bytes", f->host_bytes, "memory budget for model + optimizer state");
  app->add_option("--transport", f->transport, "auto | grpc");
  app->add_option("--job-id", f->job_id, "names the shared-memory segments");
  app->add_option("--log-level", f->log_level, "trace|debug|info|warn|error");
  app->add_option("--spill-dir", f->spill_dir,
                  "SSD tier: directory for state pages beyond --host-bytes (spill.dir)");
  app->add_option("--metrics-listen", f->metrics_listen,
                  "host:port to serve Prometheus GET /metrics on (default off; port 0 = any free port)");
  app->add_option("--allow-models", f->allow_models,
                  "directory jobs may name model.from / init_safetensors files in (paths.models; repeatable)");
  app->add_option("--allow-data", f->allow_data,
                  "directory jobs may name data.train_path / data.val_path / eval.data files in (paths.data; "
                  "repeatable)");
  app->add_option("--allow-presets", f->allow_presets,
                  "directory jobs may name model.preset .yaml files in (paths.presets; repeatable)");
  app->add_option("--shard", f->shard,
                  "K/N: this daemon is shard K (0-based) of a job sharded over N daemons, owning a range of "
                  "layers; shard 0 coordinates and is the address workers are given");
  app->add_option("--shard-layers", f->shard_layers,
                  "explicit plan: N-1 comma-separated first layers of shards 1..N-1 (default: balanced by bytes); "
                  "the same on every shard");
  app->add_option("--coordinator", f->coordinator, "shards K > 0: shard 0's host:port");
  app->add_option("--advertise", f->advertise,
                  "shards: the host:port workers and shard 0 dial for this shard (default: --listen's host "
                  "and the bound port)");
  app->add_option("--coordinator-ca", f->coordinator_ca,
                  "shards K > 0: PEM CA that shard 0's TLS certificate must chain to (default: this shard's "
                  "--tls-client-ca, else its own --tls-cert (one self-signed certificate for every shard), else "
                  "plaintext)");
  app->add_option("--coordinator-timeout-ms", f->coordinator_timeout_ms,
                  "shards K > 0: how long shard 0 may stay unreachable (killed and not restarted) before this "
                  "shard stops with exit 1 (default 120000)");
  app->add_flag_callback("--help-env", l2l::PrintEnvHelpAndExit, l2l::kHelpEnvDoc);
}

// The daemon config: --config, then the flags over it, validated.
Result<eps::EpsConfig> LoadConfig(const Flags& f) {
  eps::EpsConfig cfg;
  if (!f.config_path.empty()) {
    L2L_ASSIGN_OR_RETURN(cfg, eps::LoadEpsConfig(f.config_path));
  }
  if (!f.listen.empty()) cfg.listen = f.listen;
  if (f.allow_remote) cfg.allow_remote = true;
  if (!f.tls_cert.empty()) cfg.tls_cert = f.tls_cert;
  if (!f.tls_key.empty()) cfg.tls_key = f.tls_key;
  if (!f.tls_client_ca.empty()) cfg.tls_client_ca = f.tls_client_ca;
  if (!f.token_file.empty()) cfg.auth_token_file = f.token_file;
  if (f.insecure) cfg.insecure = true;
  if (!f.state_dir.empty()) cfg.state_dir = f.state_dir;
  if (f.workers > 0) cfg.expected_workers = f.workers;
  if (f.host_bytes >= 0) cfg.host_bytes = f.host_bytes;
  if (!f.transport.empty()) {
    Result<Transport> t = ParseTransport(f.transport);
    if (!t.ok()) return t.status().WithContext("--transport");
    cfg.transport = *t;
  }
  if (!f.job_id.empty()) cfg.job_id = f.job_id;
  if (!f.spill_dir.empty()) cfg.spill_dir = f.spill_dir;
  cfg.paths.models.insert(cfg.paths.models.end(), f.allow_models.begin(), f.allow_models.end());
  cfg.paths.data.insert(cfg.paths.data.end(), f.allow_data.begin(), f.allow_data.end());
  cfg.paths.presets.insert(cfg.paths.presets.end(), f.allow_presets.begin(), f.allow_presets.end());
  L2L_RETURN_IF_ERROR(cfg.Validate());
  return cfg;
}

// The job to create at start-up (none: it comes later by the CreateJob rpc), read and
// checked completely before anything is written to the state dir: --resume's checkpoint
// (its job, step, worker count and data positions) or --job's file and its model.from.
Result<std::optional<eps::PlannedJob>> LoadInitialJob(const Flags& f, eps::EpsConfig* cfg) {
  if (!f.resume.empty() && !f.job_path.empty()) {
    return InvalidArgument("--resume and --job are exclusive: a checkpoint carries its job config");
  }
  if (f.resume.empty() && f.job_path.empty()) return std::optional<eps::PlannedJob>();
  eps::JobSource source;
  source.checkpoint = f.resume;
  source.job_file = f.job_path;
  // Every path of --job's file confined to paths.*, the state dir and the file's own
  // directory (common/path_policy.h); a checkpoint's job was confined when created.
  PathRoots roots = cfg->paths;
  roots.AddToAll(cfg->state_dir);
  source.roots = &roots;
  source.base_dir = cfg->state_dir;
  L2L_ASSIGN_OR_RETURN(eps::PlannedJob plan, eps::ChooseJobStart(source));
  if (!f.resume.empty() && f.workers <= 0 && plan.checkpoint_workers != cfg->expected_workers) {
    L2L_LOG_INFO("resume: {} expected worker(s) as in the checkpoint", plan.checkpoint_workers);
    cfg->expected_workers = plan.checkpoint_workers;
  }
  if (cfg->publish_dtype) plan.job.publish_dtype = *cfg->publish_dtype;
  return std::optional<eps::PlannedJob>(std::move(plan));
}

// The core's options from the daemon config (and L2L_SPILL_FAULTS); the hooks are set
// by the caller.
eps::CoreOptions CoreOptionsFrom(const eps::EpsConfig& cfg) {
  eps::CoreOptions co;
  co.job_id = cfg.job_id;
  co.expected_workers = cfg.expected_workers;
  co.host_bytes = static_cast<size_t>(cfg.host_bytes);
  co.guard_bytes = static_cast<size_t>(cfg.guard_bytes);
  co.page_bytes = static_cast<size_t>(cfg.page_bytes);
  co.transport = cfg.transport;
  co.state_dir = cfg.state_dir;
  co.checkpoint_dir = cfg.checkpoint_dir;
  co.checkpoint_every = cfg.checkpoint_every;
  co.allow_absolute_paths = cfg.allow_absolute_paths;
  co.paths = cfg.paths;
  co.heartbeat_timeout_ms = cfg.heartbeat_timeout_ms;
  co.update_deadline = std::chrono::milliseconds(cfg.update_deadline_ms);
  co.on_worker_loss = cfg.on_worker_loss;
  co.spill.dir = cfg.spill_dir;
  co.spill.queue_depth = static_cast<int>(cfg.spill_queue_depth);
  co.spill.block_bytes = static_cast<size_t>(cfg.spill_block_bytes);
  co.spill.prefetch_layers = static_cast<int>(cfg.spill_prefetch_layers);
  co.spill.pool_bytes = static_cast<size_t>(cfg.spill_pool_bytes);
  co.spill.direct = cfg.spill_direct;
  // Injected SSD faults, for tests and failure drills (eps_server/spill_io.h FaultPlan).
  if (std::string f = EnvString(EnvVar::kSpillFaults); !f.empty()) {
    L2L_LOG_WARN("L2L_SPILL_FAULTS='{}': injecting SSD-tier faults", f);
    co.spill.faults = std::move(f);
  }
  return co;
}

// The core's per-step hooks feed the run log (<state_dir>/run.jsonl, one line per step)
// and the step-time histogram. Both must outlive the core.
void FeedRunLogAndMetrics(eps::CoreOptions* co, eps::RunLog* run_log, eps::MetricsRegistry* metrics) {
  co->on_step = [run_log, metrics](const eps::StepSummary& s) {
    eps::StepRecord r;
    r.step = s.step;
    r.loss = s.loss;
    r.tokens_per_s = s.tokens_per_s;
    r.lr = s.lr;  // the running job's schedule (a CreateJob rpc brings its own)
    r.forward_s = s.times.forward_s;
    r.recompute_s = s.times.recompute_s;
    r.backward_s = s.times.backward_s;
    r.wait_layer_s = s.times.wait_layer_s;
    r.wait_push_s = s.times.wait_push_s;
    r.step_s = s.wall_s;
    r.compute_s = s.times.compute_s;
    r.wait_first_layer_s = s.times.wait_first_layer_s;
    r.worker_step_s = s.times.worker_step_s;
    r.between_s = s.times.between_s;
    if (s.update) {
      r.update_s = s.update->busy_s;
      r.update_lag_s = s.update->lag_s;
      r.commit_wait_s = s.update->commit_wait_s;
    }
    if (s.val_tokens > 0) r.val_loss = s.val_loss, r.val_ppl = std::exp(s.val_loss);
    if (Status st = run_log->Append(r); !st.ok()) L2L_LOG_WARN("run log: {}", st.ToString());
    eps::ObserveStepSeconds(metrics, s.wall_s);
  };
  co->on_rollback = [run_log](int64_t step) {
    if (Status st = run_log->Rewind(step); !st.ok()) L2L_LOG_WARN("run log: {}", st.ToString());
  };
  co->on_skip = [run_log](const eps::SkipEvent& e) {
    eps::StepRecord r;
    r.step = e.step + 1;
    r.skipped_steps = static_cast<double>(e.total);
    if (Status st = run_log->Append(r); !st.ok()) L2L_LOG_WARN("run log: {}", st.ToString());
  };
}

// Before each scrape: the core's status copied into the standard gauges.
void CollectCoreStatus(eps::EpsCore* core, eps::MetricsRegistry* metrics) {
  metrics->AddCollectHook([core, metrics] {
    const eps::CoreStatus st = core->GetStatus();
    eps::EpsSnapshot snap;
    snap.step = st.step;
    snap.total_steps = st.total_steps;
    snap.loss = st.last_loss;
    snap.val_loss = st.val_loss;
    snap.val_step = st.val_step;
    snap.tokens_per_s = st.tokens_per_s;
    snap.update_busy_s = st.pipeline.last_step_busy_s;
    snap.update_exposed_s = st.pipeline.last_step_exposed_s;
    snap.layer_version = st.layer_version;
    snap.skipped_steps = st.pipeline.skipped_steps;
    snap.consecutive_skips = st.pipeline.consecutive_skips;
    snap.memory = {{"ram", static_cast<int64_t>(st.state_bytes), static_cast<int64_t>(st.host_budget)},
                   {"shm", static_cast<int64_t>(st.shm_bytes), 0}};
    if (st.spill) {
      snap.memory.push_back({"pool", st.tier.pool_bytes, 0});
      snap.memory.push_back({"ssd", st.tier.ssd_bytes, 0});
    }
    for (const auto& w : st.workers) ++snap.workers_by_state[ToString(w.state)];
    eps::UpdateEpsMetrics(metrics, snap);
  });
}

// What serves the core: gRPC (its port in <state_dir>/eps.port, announced on stdout
// and to systemd), the systemd watchdog, and the optional metrics endpoint.
struct Servers {
  std::unique_ptr<eps::EpsGrpcServer> grpc;
  std::unique_ptr<eps::Watchdog> watchdog;
  std::unique_ptr<eps::MetricsHttpServer> metrics_http;
};

Result<Servers> StartServers(eps::EpsCore* core, const eps::EpsConfig& cfg, const eps::ServerSecurity& security,
                             const std::string& metrics_listen, eps::MetricsRegistry* metrics, eps::ShardHub* hub) {
  Servers s;
  eps::ServerOptions so;
  so.listen = cfg.listen;
  so.security = security;
  so.shard_hub = hub;
  L2L_ASSIGN_OR_RETURN(s.grpc, eps::EpsGrpcServer::Start(core, so));
  const std::string host = cfg.listen.substr(0, cfg.listen.rfind(':'));
  std::error_code ec;
  std::filesystem::create_directories(cfg.state_dir, ec);
  {
    std::ofstream pf(cfg.state_dir + "/eps.port.tmp");
    pf << s.grpc->port() << "\n";
  }
  std::filesystem::rename(cfg.state_dir + "/eps.port.tmp", cfg.state_dir + "/eps.port", ec);
  if (ec) L2L_LOG_WARN("cannot write {}/eps.port: {}", cfg.state_dir, ec.message());
  std::printf("l2l-eps listening on %s:%d\n", host.c_str(), s.grpc->port());
  std::fflush(stdout);
  sd_notifyf(0, "READY=1\nSTATUS=listening on %s:%d", host.c_str(), s.grpc->port());
  // systemd's WatchdogSec= (eps_server/watchdog.h): no thread without systemd.
  s.watchdog = eps::Watchdog::StartIfEnabled([core] { return !core->stopped(); });
  if (!metrics_listen.empty()) {
    eps::MetricsServerOptions mo;
    mo.listen = metrics_listen;
    mo.insecure = security.insecure;
    mo.token = security.token;
    L2L_ASSIGN_OR_RETURN(s.metrics_http, eps::MetricsHttpServer::Start(metrics, mo));
    std::printf("l2l-eps metrics on http://%s:%d/metrics\n",
                metrics_listen.substr(0, metrics_listen.rfind(':')).c_str(), s.metrics_http->port());
    std::fflush(stdout);
  }
  return s;
}

// Serves until a shutdown request (Shutdown rpc, SIGTERM/SIGINT) whose final checkpoint
// was written. The step in flight is finished (or aborted) and the checkpoint written
// while the workers can still reach us. A failed final checkpoint does not stop the
// daemon: it pauses the job and keeps serving with the state in memory, so the operator
// can free space and stop again, or checkpoint elsewhere (l2lctl checkpoint --dir).
void ServeUntilShutdown(eps::EpsCore* core, eps::EpsGrpcServer* srv, const eps::EpsConfig& cfg) {
  const auto finish = std::chrono::milliseconds(cfg.heartbeat_timeout_ms > 0 ? cfg.heartbeat_timeout_ms : 30000);
  srv->set_prepare_shutdown([core, finish](bool abort_step, bool skip_checkpoint) {
    Status s = core->PrepareShutdown(abort_step, skip_checkpoint, finish);
    if (!s.ok()) {
      L2L_LOG_ERROR("{}; NOT stopping: the job is paused and its state kept in memory. Free space (or fix the "
                    "checkpoint dir) and stop again, or `l2lctl checkpoint --dir OTHER` then `l2lctl stop "
                    "--skip-checkpoint`",
                    s.ToString());
      if (core->has_job()) core->Pause().IgnoreError();
      sd_notify(0, "STATUS=final checkpoint failed: paused, state kept in memory (see the log)");
    }
    return s;
  });
  for (;;) {
    srv->WaitForShutdownRequest();
    sd_notify(0, "STOPPING=1\nSTATUS=stopping");
    if (srv->prepared()) break;  // the Shutdown rpc wrote the final checkpoint
    if (srv->prepare_shutdown()(srv->abort_step(), srv->skip_checkpoint()).ok()) break;
    srv->ClearShutdownRequest();  // a signal asked, the checkpoint failed: keep serving
    sd_notify(0, "READY=1");
  }
}

// SIGTERM/SIGINT are handled by a thread (sigwait), never asynchronously: Block() before
// any other thread starts (they inherit the mask); Start() then turns every signal into a
// shutdown request (a second one retries a final checkpoint that failed); Stop() ends
// the thread.
class ShutdownSignals {
 public:
  ShutdownSignals() {
    sigemptyset(&sigs_);
    sigaddset(&sigs_, SIGTERM);
    sigaddset(&sigs_, SIGINT);
  }
  void Block() { pthread_sigmask(SIG_BLOCK, &sigs_, nullptr); }
  void Start(eps::EpsGrpcServer* srv) {
    thread_ = std::thread([srv, sigs = sigs_, this] {
      for (;;) {
        int sig = 0;
        sigwait(&sigs, &sig);
        if (sig == 0 || exiting_.load()) return;
        L2L_LOG_INFO("signal {}: shutting down", sig);
        srv->RequestShutdown(false, false);
      }
    });
  }
  void Stop() {
    if (!thread_.joinable()) return;
    // The thread waits in sigwait: wake it.
    exiting_.store(true);
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }

 private:
  sigset_t sigs_;
  std::atomic<bool> exiting_{false};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2l-eps: eager param-server daemon"};
  Flags flags;
  AddFlags(&app, &flags);
  CLI11_PARSE(app, argc, argv);
  InitLogging(flags.log_level, "", "eps").IgnoreError();

  // 1. Configuration and security, before anything is bound or written
  // (eps_server/server_security.h).
  Result<eps::EpsConfig> loaded = LoadConfig(flags);
  if (!loaded.ok()) return Fail(loaded.status());
  eps::EpsConfig cfg = std::move(loaded).value();
  auto security = eps::LoadServerSecurity(cfg);
  if (!security.ok()) return Fail(security.status());
  if (Status s = eps::CheckStartupExposure(cfg.listen, flags.metrics_listen, *security); !s.ok()) return Fail(s);
  if (cfg.allow_remote) {
    L2L_LOG_WARN("--allow-remote / allow_remote is deprecated and has no effect: a non-loopback address "
                 "needs a token or mutual TLS (or --insecure)");
  }

  // 2. The job (--resume or --job), read and validated before anything else happens.
  Result<std::optional<eps::PlannedJob>> loaded_job = LoadInitialJob(flags, &cfg);
  if (!loaded_job.ok()) return Fail(loaded_job.status());
  const std::optional<eps::PlannedJob> initial = std::move(loaded_job).value();

  // Every thread from here on inherits the blocked SIGTERM/SIGINT (the hub's among them).
  ShutdownSignals signals;
  signals.Block();

  // 2b. A shard of a sharded job: its place and its link to the other shards.
  std::atomic<bool> coordinator_lost{false};
  std::atomic<eps::EpsGrpcServer*> fatal_srv{nullptr};
  ShardId shard_id;
  std::unique_ptr<eps::ShardHub> hub;
  std::unique_ptr<eps::ShardLink> link;
  if (!flags.shard.empty()) {
    Result<ShardId> id = ParseShardId(flags.shard);
    if (!id.ok()) return Fail(id.status());
    shard_id = *id;
  }
  if (shard_id.sharded()) {
    if (!initial) {
      return Fail(InvalidArgument("--shard " + flags.shard + ": a shard starts with --job FILE or --resume "
                                  "CHECKPOINT (the same on every shard)"));
    }
    if (shard_id.index == 0) {
      if (!flags.coordinator.empty()) return Fail(InvalidArgument("--coordinator is for shards K > 0, not shard 0"));
      hub = std::make_unique<eps::ShardHub>(shard_id);
    } else {
      eps::ShardLinkOptions lo;
      lo.id = shard_id;
      lo.coordinator = flags.coordinator;
      lo.token = security->token;
      // shard 0's CA: --coordinator-ca, else the CA this shard checks clients against,
      // else (one self-signed certificate for every shard, as scripts/slurm and
      // deploy/k8s make) this shard's own certificate; plaintext without TLS.
      const std::string ca_file = !flags.coordinator_ca.empty()  ? flags.coordinator_ca
                                  : !cfg.tls_client_ca.empty() ? cfg.tls_client_ca
                                                               : cfg.tls_cert;
      if (!ca_file.empty()) {
        Result<std::string> ca = ReadFileToString(ca_file);
        if (!ca.ok()) return Fail(ca.status().WithContext("--coordinator-ca"));
        lo.tls_ca_pem = *ca;
        if (security->mutual_tls()) {  // shard 0 asks for a client certificate: this shard's own
          lo.tls_cert_pem = security->tls_cert_pem;
          lo.tls_key_pem = security->tls_key_pem;
        }
      }
      if (flags.coordinator_timeout_ms < 1000) {
        return Fail(InvalidArgument("--coordinator-timeout-ms " + std::to_string(flags.coordinator_timeout_ms) +
                                    ": at least 1000"));
      }
      lo.lost_after = std::chrono::milliseconds(flags.coordinator_timeout_ms);
      lo.join_timeout = std::max(lo.join_timeout, lo.lost_after);
      lo.on_coordinator_lost = [&coordinator_lost, &fatal_srv](const Status& s) {
        std::fprintf(stderr, "l2l-eps: %s\n", s.ToString().c_str());
        coordinator_lost.store(true);
        if (eps::EpsGrpcServer* srv = fatal_srv.load(); srv != nullptr) srv->RequestShutdown(true, true);
      };
      Result<std::unique_ptr<eps::ShardLink>> l = eps::ShardLink::Create(lo);
      if (!l.ok()) return Fail(l.status());
      link = std::move(l).value();
    }
  } else if (!flags.coordinator.empty() || !flags.shard_layers.empty()) {
    return Fail(InvalidArgument("--coordinator and --shard-layers need --shard K/N with N > 1"));
  }

  // 3. The core, with its run log and metrics; a fatal job error (SSD-tier fault) stops
  // the daemon without a final checkpoint; it then exits 1 (systemd's
  // Restart=on-failure resumes from the last good checkpoint).
  eps::CoreOptions co = CoreOptionsFrom(cfg);
  eps::ShardPeers* peers = hub ? static_cast<eps::ShardPeers*>(hub.get()) : link.get();
  if (shard_id.sharded()) {
    co.shard = shard_id;
    co.shard_layers = flags.shard_layers;
    co.shards = peers;
    // Shards on one host must not share shared-memory or spill-file names.
    co.job_id += "-s" + std::to_string(shard_id.index);
  }
  co.on_fatal = [&fatal_srv](const Status&) {
    if (eps::EpsGrpcServer* s = fatal_srv.load(); s != nullptr) s->RequestShutdown(true, true);
  };
  std::error_code mk_ec;
  std::filesystem::create_directories(cfg.state_dir, mk_ec);
  // A resume drops the run log's lines past its step.
  auto run_log = eps::RunLog::Open(cfg.state_dir, flags.resume.empty() ? -1 : initial->start.step);
  if (!run_log.ok()) return Fail(run_log.status());
  eps::MetricsRegistry metrics;
  FeedRunLogAndMetrics(&co, run_log->get(), &metrics);
  eps::EpsCore core(co);
  // The peers' threads answer the core's pipeline: stopped before the core goes.
  struct StopPeers {
    eps::ShardPeers* p;
    ~StopPeers() {
      if (p != nullptr) p->Stop();
    }
  } stop_peers{peers};
  CollectCoreStatus(&core, &metrics);
  if (hub) hub->set_on_shard_failed([&core](const Status& s) { core.FailJob(s); });
  if (initial) {
    if (Status s = core.CreateJob(initial->job, initial->start); !s.ok()) return Fail(s);
  }

  // 4. Serve until a shutdown whose final checkpoint was written.
  Result<Servers> servers = StartServers(&core, cfg, *security, flags.metrics_listen, &metrics, hub.get());
  if (!servers.ok()) return Fail(servers.status());
  eps::EpsGrpcServer* srv = servers->grpc.get();
  if (shard_id.sharded()) {
    std::string advertise = flags.advertise;
    if (advertise.empty()) {
      const std::string host = cfg.listen.substr(0, cfg.listen.rfind(':'));
      if (host == "0.0.0.0" || host == "[::]" || host.empty()) {
        return Fail(InvalidArgument("--listen " + cfg.listen + " names no address workers can dial: give --advertise "
                                    "HOST:PORT"));
      }
      advertise = host + ":" + std::to_string(srv->port());
    }
    if (hub) {
      hub->set_self_address(advertise);
    } else if (Status s = link->Join(advertise); !s.ok()) {
      return Fail(s);
    }
  }
  fatal_srv.store(srv);  // no update (so no job failure) can run before workers reach us
  signals.Start(srv);
  ServeUntilShutdown(&core, srv, cfg);

  // 5. Shut down: the servers, then the job (its shared-memory segments go with it).
  srv->Shutdown();
  if (peers != nullptr) peers->Stop();
  servers->metrics_http.reset();
  core.Stop();
  const std::string fatal = core.GetStatus().error;
  L2L_LOG_INFO("stopped; shared-memory segments removed");
  signals.Stop();
  if (!fatal.empty()) {
    std::fprintf(stderr, "l2l-eps: the job failed: %s\n", fatal.c_str());
    return 1;
  }
  if (coordinator_lost.load()) return 1;
  return 0;
}
