// l2l-eps: the eager param-server daemon. Parses the daemon config (--config) and CLI
// overrides, creates the job from --job, from a checkpoint (--resume DIR: a checkpoint
// directory, or a checkpoint root whose `latest` names one), or later from the
// CreateJob rpc; serves gRPC until a Shutdown rpc or SIGTERM/SIGINT, then finishes the
// step in flight, writes a final checkpoint, stops the job, removes its shared-memory
// segments and exits 0. Prints "l2l-eps listening on HOST:PORT" and writes the port to
// <state_dir>/eps.port. Tells systemd READY/STATUS/STOPPING (no-op without systemd).
// A bad config or an unreadable/corrupt checkpoint exits 1 with a message naming the
// file, before anything is written; so does a non-loopback --listen/--metrics-listen
// without TLS or a token (unless --insecure), before anything is bound
// (eps_server/server_security.h).
#include <signal.h>
#include <systemd/sd-daemon.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/adamw.h"
#include "common/config.h"
#include "common/logging.h"
#include "eps_server/checkpoint.h"
#include "eps_server/eps_config.h"
#include "eps_server/eps_core.h"
#include "eps_server/grpc_server.h"
#include "eps_server/import.h"
#include "eps_server/metrics.h"
#include "eps_server/run_log.h"
#include "eps_server/server_security.h"
#include "eps_server/watchdog.h"

namespace {

int Fail(const l2l::Status& s) {
  std::fprintf(stderr, "l2l-eps: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace l2l;
  CLI::App app{"l2l-eps: eager param-server daemon"};
  std::string config_path, job_path, resume, listen, state_dir, transport, job_id, log_level = "info";
  int workers = 0;
  int64_t host_bytes = -1;
  bool allow_remote = false;
  app.add_option("--config", config_path, "daemon config YAML (configs/eps.yaml)");
  app.add_option("--job", job_path, "job config YAML; without it, wait for the CreateJob rpc");
  app.add_option("--resume", resume, "checkpoint directory, or checkpoint root (uses its `latest`)");
  app.add_option("--listen", listen, "host:port to listen on (default 127.0.0.1:0)");
  app.add_flag("--allow-remote", allow_remote,
               "deprecated, no effect: a non-loopback --listen needs TLS, --token-file or --insecure");
  std::string tls_cert, tls_key, token_file;
  bool insecure = false;
  app.add_option("--tls-cert", tls_cert, "PEM certificate chain: serve gRPC over TLS (tls.cert; with --tls-key)");
  app.add_option("--tls-key", tls_key, "PEM private key of --tls-cert, not readable by others (tls.key)");
  app.add_option("--token-file", token_file,
                 "file (mode 0600) with a shared token every client must send as 'authorization: Bearer "
                 "<token>' on gRPC and metrics (auth.token_file)");
  app.add_flag("--insecure", insecure, "allow a non-loopback --listen / --metrics-listen without TLS or token");
  app.add_option("--state-dir", state_dir, "state directory (eps.port is written there)");
  app.add_option("--workers", workers, "expected workers");
  app.add_option("--host-bytes", host_bytes, "memory budget for model + optimizer state");
  app.add_option("--transport", transport, "auto | grpc");
  app.add_option("--job-id", job_id, "names the shared-memory segments");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  std::string spill_dir;
  app.add_option("--spill-dir", spill_dir,
                 "SSD tier: directory for state pages beyond --host-bytes (spill.dir)");
  std::string metrics_listen;
  app.add_option("--metrics-listen", metrics_listen,
                 "host:port to serve Prometheus GET /metrics on (default off; port 0 = any free port)");
  CLI11_PARSE(app, argc, argv);
  InitLogging(log_level, "", "eps").IgnoreError();

  eps::EpsConfig cfg;
  if (!config_path.empty()) {
    auto c = eps::LoadEpsConfig(config_path);
    if (!c.ok()) return Fail(c.status());
    cfg = *c;
  }
  if (!listen.empty()) cfg.listen = listen;
  if (allow_remote) cfg.allow_remote = true;
  if (!tls_cert.empty()) cfg.tls_cert = tls_cert;
  if (!tls_key.empty()) cfg.tls_key = tls_key;
  if (!token_file.empty()) cfg.auth_token_file = token_file;
  if (insecure) cfg.insecure = true;
  if (!state_dir.empty()) cfg.state_dir = state_dir;
  if (workers > 0) cfg.expected_workers = workers;
  if (host_bytes >= 0) cfg.host_bytes = host_bytes;
  if (!transport.empty()) {
    Result<Transport> t = ParseTransport(transport);
    if (!t.ok()) return Fail(t.status().WithContext("--transport"));
    cfg.transport = *t;
  }
  if (!job_id.empty()) cfg.job_id = job_id;
  if (!spill_dir.empty()) cfg.spill_dir = spill_dir;
  if (Status s = cfg.Validate(); !s.ok()) return Fail(s);
  // Security first, before anything is bound or written (eps_server/server_security.h).
  auto security = eps::LoadServerSecurity(cfg);
  if (!security.ok()) return Fail(security.status());
  if (Status s = eps::CheckStartupExposure(cfg.listen, metrics_listen, *security); !s.ok()) return Fail(s);
  if (cfg.allow_remote) {
    L2L_LOG_WARN("--allow-remote / allow_remote is deprecated and has no effect: a non-loopback address "
                 "needs TLS or a token (or --insecure)");
  }
  if (!resume.empty() && !job_path.empty()) {
    return Fail(InvalidArgument("--resume and --job are exclusive: a checkpoint carries its job config"));
  }
  // Resume: read and validate the manifest before anything else happens.
  eps::JobStart start;
  JobConfig job;
  if (!resume.empty()) {
    auto dir = eps::ResolveCheckpointDir(resume);
    if (!dir.ok()) return Fail(dir.status());
    auto m = eps::ReadCheckpointManifest(*dir);
    if (!m.ok()) return Fail(m.status());
    job = m->meta.job;
    if (workers <= 0 && m->meta.expected_workers != cfg.expected_workers) {
      L2L_LOG_INFO("resume: {} expected worker(s) as in the checkpoint", m->meta.expected_workers);
      cfg.expected_workers = m->meta.expected_workers;
    }
    start.step = m->meta.step;
    start.checkpoint_dir = *dir;
    start.description = "checkpoint " + *dir;
    for (const auto& w : m->meta.workers) {
      if (w.id < 0) continue;
      if (start.data_positions.size() <= static_cast<size_t>(w.id)) start.data_positions.resize(w.id + 1);
      start.data_positions[w.id] = w.data_position;
    }
    auto manifest = std::make_shared<eps::CheckpointManifest>(*m);
    start.load = [manifest](eps::ParamStore* store) { return eps::LoadCheckpointState(*manifest, store); };
  } else if (!job_path.empty()) {
    auto j = LoadJobConfig(job_path);
    if (!j.ok()) return Fail(j.status());
    job = *j;
    if (!job.model_from.empty()) {
      // model.from: checked completely here, before anything is written to the state dir.
      auto model = ResolveModelFrom(&job, job.model_from);
      if (!model.ok()) return Fail(model.status().WithContext(job_path));
      start = eps::ImportStart(*model);
    }
  }

  // SIGTERM/SIGINT are handled by a thread (sigwait), never asynchronously.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  eps::CoreOptions co;
  co.job_id = cfg.job_id;
  co.expected_workers = cfg.expected_workers;
  co.host_bytes = static_cast<size_t>(cfg.host_bytes);
  co.page_bytes = static_cast<size_t>(cfg.page_bytes);
  co.transport = cfg.transport;
  co.state_dir = cfg.state_dir;
  co.checkpoint_dir = cfg.checkpoint_dir;
  co.checkpoint_every = cfg.checkpoint_every;
  co.allow_absolute_paths = cfg.allow_absolute_paths;
  co.heartbeat_timeout_ms = cfg.heartbeat_timeout_ms;
  co.on_worker_loss = cfg.on_worker_loss;
  co.spill.dir = cfg.spill_dir;
  co.spill.queue_depth = static_cast<int>(cfg.spill_queue_depth);
  co.spill.block_bytes = static_cast<size_t>(cfg.spill_block_bytes);
  co.spill.prefetch_layers = static_cast<int>(cfg.spill_prefetch_layers);
  co.spill.pool_bytes = static_cast<size_t>(cfg.spill_pool_bytes);
  co.spill.direct = cfg.spill_direct;
  // Injected SSD faults, for tests and failure drills (eps_server/spill_io.h FaultPlan).
  if (const char* f = std::getenv("L2L_SPILL_FAULTS"); f != nullptr && *f != '\0') {
    L2L_LOG_WARN("L2L_SPILL_FAULTS='{}': injecting SSD-tier faults", f);
    co.spill.faults = f;
  }
  // A fatal job error (SSD-tier fault) stops the daemon without a final checkpoint; it
  // then exits 1 (systemd's Restart=on-failure resumes from the last good checkpoint).
  std::atomic<eps::EpsGrpcServer*> fatal_srv{nullptr};
  co.on_fatal = [&fatal_srv](const Status&) {
    if (eps::EpsGrpcServer* s = fatal_srv.load(); s != nullptr) s->RequestShutdown(true, true);
  };
  // Run log (<state_dir>/run.jsonl, one line per step; a resume drops lines past its step)
  // and metrics, both fed by the core once per completed step.
  std::error_code mk_ec;
  std::filesystem::create_directories(cfg.state_dir, mk_ec);
  auto run_log = eps::RunLog::Open(cfg.state_dir, resume.empty() ? -1 : start.step);
  if (!run_log.ok()) return Fail(run_log.status());
  eps::MetricsRegistry metrics;
  co.on_step = [&run_log, &metrics](const eps::StepSummary& s) {
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
    if (s.val_tokens > 0) r.val_loss = s.val_loss, r.val_ppl = std::exp(s.val_loss);
    if (Status st = (*run_log)->Append(r); !st.ok()) L2L_LOG_WARN("run log: {}", st.ToString());
    eps::ObserveStepSeconds(&metrics, s.wall_s);
  };
  co.on_skip = [&run_log](const eps::SkipEvent& e) {
    eps::StepRecord r;
    r.step = e.step + 1;
    r.skipped_steps = static_cast<double>(e.total);
    if (Status st = (*run_log)->Append(r); !st.ok()) L2L_LOG_WARN("run log: {}", st.ToString());
  };
  eps::EpsCore core(co);
  metrics.AddCollectHook([&core, &metrics] {
    const eps::CoreStatus st = core.GetStatus();
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
    eps::UpdateEpsMetrics(&metrics, snap);
  });
  if (!job_path.empty() || !resume.empty()) {
    if (cfg.publish_dtype) job.publish_dtype = *cfg.publish_dtype;
    if (Status s = core.CreateJob(job, start); !s.ok()) return Fail(s);
  }
  eps::ServerOptions so;
  so.listen = cfg.listen;
  so.security = *security;
  auto server = eps::EpsGrpcServer::Start(&core, so);
  if (!server.ok()) return Fail(server.status());
  const std::string host = cfg.listen.substr(0, cfg.listen.rfind(':'));
  std::error_code ec;
  std::filesystem::create_directories(cfg.state_dir, ec);
  {
    std::ofstream pf(cfg.state_dir + "/eps.port.tmp");
    pf << (*server)->port() << "\n";
  }
  std::filesystem::rename(cfg.state_dir + "/eps.port.tmp", cfg.state_dir + "/eps.port", ec);
  if (ec) L2L_LOG_WARN("cannot write {}/eps.port: {}", cfg.state_dir, ec.message());
  std::printf("l2l-eps listening on %s:%d\n", host.c_str(), (*server)->port());
  std::fflush(stdout);
  sd_notifyf(0, "READY=1\nSTATUS=listening on %s:%d", host.c_str(), (*server)->port());
  // systemd's WatchdogSec= (eps_server/watchdog.h): no thread without systemd.
  auto watchdog = eps::Watchdog::StartIfEnabled([&core] { return !core.stopped(); });
  std::unique_ptr<eps::MetricsHttpServer> metrics_http;
  if (!metrics_listen.empty()) {
    eps::MetricsServerOptions mo;
    mo.listen = metrics_listen;
    mo.insecure = security->insecure;
    mo.token = security->token;
    auto m = eps::MetricsHttpServer::Start(&metrics, mo);
    if (!m.ok()) return Fail(m.status());
    metrics_http = std::move(*m);
    std::printf("l2l-eps metrics on http://%s:%d/metrics\n",
                metrics_listen.substr(0, metrics_listen.rfind(':')).c_str(), metrics_http->port());
    std::fflush(stdout);
  }

  eps::EpsGrpcServer* srv = server->get();
  fatal_srv.store(srv);  // no update (so no job failure) can run before workers reach us
  // Every SIGTERM/SIGINT asks for a shutdown (a second one retries a final checkpoint
  // that failed); `exiting` ends the thread when main wakes it at the end.
  std::atomic<bool> exiting{false};
  std::thread signals([srv, sigs, &exiting] {
    for (;;) {
      int sig = 0;
      sigwait(&sigs, &sig);
      if (sig == 0 || exiting.load()) return;
      L2L_LOG_INFO("signal {}: shutting down", sig);
      srv->RequestShutdown(false, false);
    }
  });
  // Finish (or abort) the step in flight and write the final checkpoint while the
  // workers can still reach us. A failed final checkpoint does not stop the daemon: it
  // pauses the job and keeps serving with the state in memory, so the operator can
  // free space and stop again, or checkpoint elsewhere (l2lctl checkpoint --dir).
  const auto finish = std::chrono::milliseconds(cfg.heartbeat_timeout_ms > 0 ? cfg.heartbeat_timeout_ms : 30000);
  srv->set_prepare_shutdown([&core, finish](bool abort_step, bool skip_checkpoint) {
    Status s = core.PrepareShutdown(abort_step, skip_checkpoint, finish);
    if (!s.ok()) {
      L2L_LOG_ERROR("{}; NOT stopping: the job is paused and its state kept in memory. Free space (or fix the "
                    "checkpoint dir) and stop again, or `l2lctl checkpoint --dir OTHER` then `l2lctl stop "
                    "--skip-checkpoint`",
                    s.ToString());
      if (core.has_job()) core.Pause().IgnoreError();
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
  srv->Shutdown();
  metrics_http.reset();
  core.Stop();
  const std::string fatal = core.GetStatus().error;
  L2L_LOG_INFO("stopped; shared-memory segments removed");
  // The signal thread waits in sigwait: wake it.
  exiting.store(true);
  pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
  if (!fatal.empty()) {
    std::fprintf(stderr, "l2l-eps: the job failed: %s\n", fatal.c_str());
    return 1;
  }
  return 0;
}
