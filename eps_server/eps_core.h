// EpsCore: the eager param-server's state machine, independent of gRPC. It owns the
// job (ParamStore + UpdatePipeline), the registered workers and, for same-host workers,
// their gradient segments and the threads that consume them; checkpoints, export,
// worker liveness and rollback. The gRPC services (eps_server/grpc_server.h) translate
// protobuf messages to these calls; protobuf types stop there.
//
// Life cycle: Create (no job) -> CreateJob (allocates, initialises from a JobStart: the
// seed, a pretrained or safetensors file, buffers or a checkpoint, eps_server/job_start.h;
// publishes version start_step of every layer, creates the shm weight segment, starts
// the liveness and checkpoint threads) -> workers Register (ids 0..expected_workers-1)
// -> gradients flow -> Stop (wakes every waiter with ABORTED, joins threads, removes the
// segments).
//
// Checkpoints (eps_server/checkpoint.h): taken at a step boundary. The update
// pipeline's gate is closed right when step N completes (HoldAt) or, for an rpc, at
// the next boundary; the state is streamed to disk with the gate closed (workers keep
// fetching version N and pushing step-N gradients meanwhile; the step-N updates wait),
// then the gate opens. Each worker's data position at the start of step N is what it
// reported with StepDone(N-1).
//
// Worker loss (a worker silent for heartbeat_timeout_ms, or Deregister): the pipeline
// is frozen (running updates finish, none starts). Then, with t = the step in progress:
//   * the worker finished step t (its StepDone(t) arrived; all its gradients of t are
//     in): its gradients stay; it is a member up to step t only (continue) or stays a
//     member and the job waits for it at step t+1 (pause). Nothing is abandoned.
//   * otherwise, if no layer has applied step t yet: its gradients of step t are
//     dropped; step t completes from the other workers' gradients alone (continue), or
//     waits until it rejoins and redoes step t (pause). The others do not redo anything.
//     (Exception, global clip: layers whose gradients were already summed into one
//     buffer cannot drop one worker's share, so the whole step is abandoned as below,
//     but without restoring any state: every worker re-registers and redoes step t.)
//   * otherwise (some layers already applied step t with its gradients, others lack
//     them): step t is abandoned and the state ROLLED BACK to the restore point -- the
//     newest checkpoint this daemon wrote or resumed from, else the job's initial state
//     (seed / safetensors) -- and republished at that step R. The weight segment's epoch
//     is bumped; every worker must re-register (previous_worker_id) and restarts at
//     step R from its data position of the checkpoint. All gradients of steps >= R are
//     discarded. (Set checkpoint.every to bound the work redone.)
// A layer is therefore never updated from a partial set of a step's gradients.
// A worker re-registers with previous_worker_id, or a new process registers fresh and
// takes over the lowest lost/left id: it gets the id, data shard and data position back
// and starts at its next step (pause: the step the job waits at; continue: the next
// step boundary).
//
// Interleaved optimizer: the core owns the WorkerUpdater (worker_updater.h) through which
// the pipeline hands the layers optim.gpu_fraction picks to the workers that offered their
// device at Register (shm transport only); the split is re-chosen whenever a worker
// offers or withdraws its device, and a lost worker's update falls back to the daemon
// before the pipeline is frozen.
//
// Ownership: owns everything above; GradientRefs point into gradient segments or
// heap buffers the core keeps alive until the pipeline releases them.
// Thread-safety: every public method is thread-safe (the gRPC server calls them from
// its thread pool). recovery_mu_ serialises checkpoints, loss handling and rejoins;
// mu_ guards the worker table and is held only briefly.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
#include "common/config.h"
#include "common/modes.h"
#include "common/path_policy.h"
#include "common/thread_annotations.h"
#include "common/shm.h"
#include "common/status.h"
#include "eps_server/job_start.h"
#include "eps_server/param_store.h"
#include "eps_server/shards.h"
#include "eps_server/update_pipeline.h"
#include "eps_server/worker_updater.h"

namespace l2l::eps {

// Seconds one worker spent in each phase of a step (where its time goes), from StepDone.
struct StepTimes {
  double forward_s = 0, backward_s = 0, recompute_s = 0, wait_layer_s = 0, wait_push_s = 0;
  // The worker's step timeline (proto/data.proto StepDoneRequest); std::nullopt when the
  // worker did not report it (an older worker).
  std::optional<double> compute_s, wait_first_layer_s, worker_step_s, between_s;
};

// One worker's in-job validation result for a step (job `eval:`): the mean loss over the
// targets it scored and how many (0: it scored none this step).
struct StepEval {
  double loss = 0;
  int64_t tokens = 0;
};

// One completed step, as every worker contributing to it reported it (loss and phase
// times averaged over the workers; tokens_per_s over all of them and the step's wall time).
struct StepSummary {
  int64_t step = 0;          // steps completed (the step reported + 1)
  int32_t workers = 0;
  double loss = 0, tokens_per_s = 0, wall_s = 0;
  double lr = 0;             // learning rate of this step's update (the job's schedule)
  StepTimes times;           // averages over workers (the timeline: over those reporting it)
  // The update this step's forward waited for (the previous step's gradients -> the
  // version this step used; UpdatePipeline::UpdateTimesFor); std::nullopt on the first
  // step of a run.
  std::optional<StepUpdateTimes> update;
  // In-job validation, on the steps it ran: the loss over every worker's eval targets
  // (weighted by their counts) and the count; val_tokens 0 = no validation this step.
  double val_loss = 0;
  int64_t val_tokens = 0;
};

struct CoreOptions {
  std::string job_id = "job";        // names the shm segments: /l2l-<job_id>-...
  int32_t expected_workers = 1;      // workers every update waits for
  size_t host_bytes = 0;             // memory budget (0 = unlimited)
  // memory.guard_bytes: the non-finite guard's undo copies / held gradients
  // (update_pipeline.h), taken out of host_bytes; 0 = unbounded undo copies (12 B/param)
  // beside host_bytes. Checked at CreateJob with the rest (eps_server/host_budget.h).
  size_t guard_bytes = 0;
  size_t page_bytes = kDefaultPageBytes;
  Transport transport = Transport::kAuto;  // auto | grpc: grpc never offers shm
  int grad_slots = 4;                // gradient ring slots per shm worker (<= kMaxGradSlots)
  std::string state_dir;             // Export/Checkpoint rpc paths are confined here; "" = cwd
  std::string checkpoint_dir;        // default checkpoint root; "" = <state_dir>/checkpoints
  int64_t checkpoint_every = 0;      // steps; 0 = the job's train.checkpoint_every
  bool allow_absolute_paths = false; // Export/Checkpoint rpc paths outside state_dir allowed
  // The daemon config's paths.models / paths.data / paths.presets: where a job may name
  // files (common/path_policy.h); the state dir is always allowed too (job_path_roots).
  PathRoots paths;
  int64_t heartbeat_timeout_ms = 0;  // 0 = no liveness checking
  OnWorkerLoss on_worker_loss = OnWorkerLoss::kPause;
  // SSD tier (eps_server/spill_tier.h); spill.dir "" = none. job_id is filled in.
  SpillOptions spill;
  // Called once, from an update thread, when the job hits a fatal error (an SSD-tier I/O
  // fault): the state can no longer be trusted to advance, so the daemon should stop
  // without a final checkpoint (the last good one stays). Must not block.
  std::function<void(const Status&)> on_fatal;
  // Called once per completed step (every worker contributing to it reported StepDone),
  // with the core's lock held: it must be quick and must not call back into the EpsCore. Used by
  // l2l-eps for the run log and metrics. Null: nothing is called.
  std::function<void(const StepSummary&)> on_step;
  // Called once per skipped step (a non-finite gradient or loss; the state is left as
  // it was), from an update or rpc thread with no core lock held; must be quick.
  std::function<void(const SkipEvent&)> on_skip;
  // The state was rolled back to `step` (a lost worker, a sharded job's recovery): the
  // steps from it on are redone (l2l-eps: the run log drops their lines).
  std::function<void(int64_t step)> on_rollback;
  // Interleaved optimizer: a layer update handed to a worker's device and not answered
  // this long after it was queued is run by the daemon instead (worker_updater.h).
  std::chrono::milliseconds update_deadline{30000};
  // Sharded jobs (common/shard_plan.h, eps_server/shards.h): this daemon is shard K of
  // N and holds that shard's layers only; shard_layers: an explicit plan ("" = balanced
  // by bytes); shards: the link to the other shards (a ShardHub on shard 0, a ShardLink
  // elsewhere), required when sharded, borrowed (outlives the core). The core's layer
  // indices (store, pipeline, Registration::layer_numel, the data calls) are LOCAL: 0 is
  // model layer Registration::first_layer.
  ShardId shard;
  std::string shard_layers;
  ShardPeers* shards = nullptr;
};

struct RegisterInfo {
  std::string name, hostname, boot_id;
  Transport transport = Transport::kAuto;  // what the worker asks for
  int32_t pid = 0;
  int32_t previous_worker_id = -1;  // re-registration (rejoin); -1 = new worker
  int32_t shard_worker_id = -1;     // sharded jobs, shards K > 0: the id shard 0 gave it
  DeviceOffer optimizer;            // its offer to run layer updates (interleaved optimizer)
};

struct Registration {
  int32_t worker_id = -1;
  int32_t num_workers = 0;
  JobConfig job;
  int64_t start_step = 0;
  int32_t data_world = 1;
  std::string data_position;
  Transport transport = Transport::kGrpc;  // kShm | kGrpc
  std::string weight_segment, gradient_segment;
  std::vector<int64_t> layer_numel;
  // The directories the worker may read the job's data files from (canonical): the
  // job's JobStart::data_roots, or the state dir and its data files' own directories.
  std::vector<std::string> data_roots;
  // Random, never 0, new at every (re)registration and daemon start: Deregister must name
  // it, so a stale client (a process exiting after its daemon was replaced on the same
  // address, or one whose id a replacement took) cannot remove the worker now holding it.
  uint64_t registration_id = 0;
  // Sharded jobs: every shard (shard 0's registration only) and this daemon's first
  // model layer (layer_numel are its layers).
  std::vector<ShardEndpoint> shards;
  int64_t first_layer = 0;
  int64_t recovery_epoch = 0;  // the epoch this shard's state is in (ShardPeers::epoch)
};

struct WorkerInfo {
  int32_t id = -1;
  std::string name;
  Transport transport = Transport::kGrpc;  // kShm | kGrpc
  WorkerState state = WorkerState::kActive;  // see common/modes.h
  int64_t step = 0;
  double last_loss = 0;
  std::chrono::steady_clock::time_point last_seen;
};

struct CoreStatus {
  std::string state;  // idle | waiting_workers | running | paused | stopping | finished | failed
  std::string error;  // state failed: what failed (an SSD-tier fault names file and op)
  std::string pause_reason;  // state paused: why (operator, lost worker, skipped steps)
  std::string job_id;
  int64_t step = 0, total_steps = 0, num_params = 0;
  std::vector<int64_t> layer_version;
  double last_loss = 0, tokens_per_s = 0;
  double val_loss = 0;   // the last in-job validation loss
  int64_t val_step = 0;  // the (1-based) step it was logged at; 0 = none yet
  PipelineStats pipeline;
  size_t state_bytes = 0, shm_bytes = 0, host_budget = 0;
  // SSD tier (zeros without one): spilled bytes, staging pool, I/O and exposed waits.
  bool spill = false;
  TierStats tier;
  // Lock-free mode: the staleness bound s, and the largest lag seen now between the
  // newest step any worker is on and a layer's published version (<= s + 1 by design).
  int64_t staleness_bound = 0, max_version_lag = 0;
  std::vector<WorkerInfo> workers;
  int32_t members = 0;                  // workers the current step waits for
  std::string last_checkpoint;
  // Sharded jobs: this daemon's place, its first model layer, and (shard 0, once every
  // shard joined) every shard.
  ShardId shard;
  int64_t first_layer = 0;
  std::vector<ShardEndpoint> shard_map;
};

struct CheckpointResult {
  std::string dir;
  int64_t step = 0;
  int64_t bytes = 0;
};

class EpsCore {
 public:
  explicit EpsCore(CoreOptions opts);
  ~EpsCore();  // Stop()

  // Creates the job: state initialised from job.train.seed (or `initial` when given: one
  // fp32 buffer per layer, FromBuffers), published at start_step. FAILED_PRECONDITION if
  // one exists.
  Status CreateJob(const JobConfig& job, const std::vector<std::vector<float>>* initial = nullptr,
                   int64_t start_step = 0);
  // The same from any start (eps_server/job_start.h; ChooseJobStart picks it for l2l-eps
  // and the CreateJob rpc); a loaded state that is not finite is refused.
  Status CreateJob(const JobConfig& job, const JobStart& start);
  bool has_job() const;

  Result<Registration> Register(const RegisterInfo& info);
  // *rejoin: the worker must re-register (its step was abandoned).
  Status Heartbeat(int32_t worker_id, int64_t step, bool* stop, bool* paused = nullptr,
                   bool* rejoin = nullptr);
  // Pins layer `layer`'s published copy at version >= min_version (bytes of the published
  // dtype, *dtype) for a sender that reads it in place: the pin holds back only the
  // publish of version+2 of that layer, so hold it while the bytes are in flight and no
  // longer (grpc_server.cc cancels the sends of workers that stop being active). Fails
  // like the worker's other data calls (unknown / inactive worker) and as
  // ParamStore::Acquire (timeout, stop, rollback).
  Result<ParamStore::ReadPin> PinLayer(int32_t worker_id, int64_t layer, int64_t min_version,
                                       std::chrono::milliseconds timeout, DType* dtype);
  // OK while `worker_id` is an active member; otherwise the reason, as its calls get it.
  Status CheckActive(int32_t worker_id) const;
  // Checks a gradient's header before anything is allocated for its bytes: a job exists,
  // the worker is an active member, the layer exists, numel is that layer's size and
  // micro_batches >= 1. Each error names the field, the value and what was expected.
  Status ValidateGradient(int32_t worker_id, int64_t layer, int64_t micro_batches, int64_t numel) const;
  // Takes ownership of a received gradient buffer.
  Status SubmitGradient(int32_t worker_id, int64_t layer, int64_t step, int64_t micro_batches,
                        std::vector<float> grad);
  // Mixture-of-experts jobs: the experts worker_id's forward of `step` routed tokens to
  // (UpdatePipeline::ReportExperts).
  Status ReportExperts(int32_t worker_id, int64_t step, const std::vector<uint8_t>& touched);
  Status StepDone(int32_t worker_id, int64_t step, double loss, int64_t tokens,
                  const std::string& data_position, bool* stop, const StepTimes& times = {},
                  const StepEval& eval = {});
  // Leaves the job. With wait_final > 0 (a worker that saw the last step commit): first
  // waits up to wait_final until that step is durable, i.e. its checkpoint is written
  // (at once when the job has no periodic checkpoints, or when that write failed: the
  // state then stays in this daemon's memory and the log says so). A daemon that dies
  // first leaves the worker with an error, so a supervisor restarts it and the step is
  // redone after --resume. DEADLINE_EXCEEDED (still registered) when the wait runs out
  // or the last step has not committed within 200 ms.
  Status Deregister(int32_t worker_id, uint64_t registration_id,
                    std::chrono::milliseconds wait_final = std::chrono::milliseconds(0));

  // Interleaved optimizer (worker_updater.h): a worker's TakeUpdate long poll and its
  // UpdateDone. Both fail like the worker's other data calls when it is not active.
  Result<UpdateTask> TakeUpdate(int32_t worker_id, std::chrono::milliseconds wait);
  Status UpdateDone(int32_t worker_id, uint64_t task_id, int64_t layer, int64_t numel, const std::string& error);
  // Updates workers ran / the daemon ran instead (zeros without a job).
  WorkerUpdater::Stats offload_stats() const;

  // Operator pause: no layer update starts until Resume. Resume also ends a pause
  // caused by a lost worker (on_worker_loss=pause): the job then continues without it.
  Status Pause();
  Status Resume();

  // Checkpoint at the next step boundary (now when no step is in flight). dir "" =
  // <checkpoint root>/step-<N> (and `latest` is updated); otherwise a path confined like
  // ResolveUserPath. Returns once durable.
  Result<CheckpointResult> Checkpoint(const std::string& dir);
  // Writes the fp32 master (dtype kF32, or kBF16) as HF GPT-2 safetensors at `path`
  // (confined like ResolveUserPath), at a step boundary. Returns bytes written.
  Result<int64_t> Export(const std::string& path, DType dtype);
  // The same gate for other export formats: `write(resolved_path, step, read_layer)`
  // runs at a step boundary with updates held, read_layer(l, out) giving layer l's fp32
  // master; returns what `write` returns (bytes). The job's config (imported_from) is job().
  Result<int64_t> ExportWith(
      const std::string& path,
      const std::function<Result<int64_t>(const std::string& path, int64_t step,
                                          const std::function<Status(int64_t, float*)>& read_layer)>& write);
  // The job's config (valid once CreateJob succeeded).
  JobConfig job_config() const;
  // Resolves an rpc-given output path (Export, Checkpoint --dir) through
  // common/path_policy.h ConfinePath: relative paths live under state_dir; the resolved
  // path (symlinks of its existing prefix followed, so a link pointing out is seen) must
  // lie inside state_dir, else PERMISSION_DENIED naming `key` and the state dir; an
  // absolute path may lie anywhere when allow_absolute_paths.
  Result<std::string> ResolveUserPath(const std::string& path, std::string_view key = "path") const;

  // Shutdown: finishes the step in flight (waits up to `finish_timeout`; abort_step:
  // does not wait) and writes a final checkpoint into the checkpoint root unless
  // skip_checkpoint. A checkpoint is skipped (with an error log, the previous one
  // stands) when the step could not be finished and was partially applied.
  Status PrepareShutdown(bool abort_step, bool skip_checkpoint, std::chrono::milliseconds finish_timeout);

  // Wakes all waiters (ABORTED), stops shm consumers, removes segments. Idempotent.
  void Stop();
  bool stopped() const { return stopped_.load(); }

  CoreStatus GetStatus() const;
  // Fails the job from outside (another shard of a sharded job failed): as a pipeline
  // failure, the daemon stops without a final checkpoint and exits 1.
  void FailJob(const Status& s) { OnPipelineFailure(s); }
  ParamStore* store() { return store_.get(); }
  UpdatePipeline* pipeline() { return pipeline_.get(); }
  // A copy of the job (CreateJob sets it under mu_).
  JobConfig job() const EXCLUDES(mu_) {
    std::lock_guard<std::mutex> lock(mu_);
    return job_;
  }
  std::string checkpoint_root() const;
  // The roots every path of a job must lie in: CoreOptions::paths with the state dir
  // added to each list (ChooseJobStart adds a job file's own directory).
  PathRoots job_path_roots() const;
  // Where a CreateJob request's relative paths resolve: the state dir ("." when unset).
  std::string user_base_dir() const { return opts_.state_dir.empty() ? "." : opts_.state_dir; }

 private:
  struct ShmWorker;
  struct Worker;  // WorkerInfo + positions and bookkeeping
  Status CheckWorker(int32_t worker_id) const REQUIRES(mu_);
  void ConsumeLoop(ShmWorker* w);
  Status CreateShmWorker(int32_t id, Registration* r) REQUIRES(recovery_mu_);
  void TearDownShmWorker(int32_t id) REQUIRES(recovery_mu_);  // and the pipeline frozen
  // Rejoin of worker `id` in two halves around the registration: Prepare freezes the
  // pipeline (the hold goes into *gate: Register drops it when the worker is in),
  // retires its old shm segment and returns its start step.
  Result<int64_t> PrepareRejoin(int32_t id, UpdatePipeline::FreezeGuard* gate) REQUIRES(recovery_mu_);
  void UpdatePausedLocked() REQUIRES(recovery_mu_);
  // A registration that finds the job full first declares lost every worker on this
  // host whose process is gone (killed), so its replacement need not wait for the
  // heartbeat timeout.
  void TakeOverDeadLocalWorkers() REQUIRES(recovery_mu_);
  // Closes the gate at a step boundary: now when the step in progress has applied no
  // layer, else when it completes (up to timeout). Returns the hold (its frozen().step
  // is the step); dropping it reopens the gate. DEADLINE_EXCEEDED leaves the gate open.
  Result<UpdatePipeline::FreezeGuard> HoldAtBoundary(std::chrono::milliseconds timeout) REQUIRES(recovery_mu_);
  void LivenessLoop();
  // Chooses optim.gpu_fraction's split (eps_server/optimizer_split.h) with the rates the
  // daemon measured and the workers that take updates reported, logs it with `why` (job
  // start, a worker offered or withdrew its device) and hands it to the pipeline.
  void ApplyOptimizerSplit(const std::string& why) REQUIRES(recovery_mu_);
  void CheckpointLoop();
  void HandleLoss(int32_t id, WorkerState new_state) REQUIRES(recovery_mu_);
  // Abandons the step in progress: every worker must re-register; restore: the state is
  // reloaded from the restore point, else it stays (the step applied nothing).
  Status Rollback(int32_t lost_id, bool restore) REQUIRES(recovery_mu_);  // and frozen
  // Resets the pipeline to `step` and (restore) the state to the checkpoint in `dir`
  // ("": the job's start); every active worker must rejoin (`why` tells it why).
  Status RollBackTo(int64_t step, const std::string& dir, bool restore, const std::string& why)
      REQUIRES(recovery_mu_);  // and frozen
  // Sharded jobs: this shard lost a worker mid-step; asks shard 0 to roll every shard
  // back and keeps `gate` (this shard frozen) until the rollback comes.
  void RequestShardRollback(const std::string& why, UpdatePipeline::FreezeGuard gate) REQUIRES(recovery_mu_);
  // Sharded jobs: shard 0 began recovery epoch e: roll this shard back to e.step (its
  // checkpoint, or the job's start). From the shard peers' thread.
  void RollbackToEpoch(const ShardPeers::Epoch& e);
  Result<CheckpointResult> WriteCheckpointLocked(int64_t step, const std::string& dir, bool latest)
      REQUIRES(recovery_mu_);
  std::string PositionAt(int32_t id, int64_t step) const REQUIRES(mu_);
  // Workers whose gradients step `step` waits for (the pipeline's membership; one not yet
  // registered counts).
  int MembersOfLocked(int64_t step) const REQUIRES(mu_);
  // Summarizes (logs, on_step) the newest step every member has reported, and any older
  // step still open before it with the reports it has; forgets them.
  void SummarizeStepsLocked() REQUIRES(mu_);
  int64_t checkpoint_every() const;
  // The first checkpoint boundary after `done` steps (every checkpoint_every(), and the
  // job's last step).
  int64_t CheckpointBoundaryAfter(int64_t done) const;
  // Sharded jobs: this shard's part of the checkpoint of `step`, posted to shard 0;
  // shard 0 then assembles every shard's part into `dir` (its checkpoint root's
  // step-<N>). Returns what this daemon wrote.
  Result<int64_t> WriteShardedCheckpoint(const CheckpointMeta& meta, const std::string& dir, bool latest)
      REQUIRES(recovery_mu_);
  std::vector<LayerRange> shard_plan_;  // sharded jobs: every shard's layers (CreateJob)
  int64_t job_steps_ = 0;  // the job's train.steps (set by CreateJob before any thread reads it)

  const CoreOptions opts_;
  std::atomic<bool> stopped_{false};
  Status fatal_ GUARDED_BY(mu_);  // pipeline failure
  void OnPipelineFailure(const Status& s);
  std::mutex recovery_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;                      // StepDone / state changes
  JobConfig job_ GUARDED_BY(mu_);  // once set
  std::vector<std::string> data_roots_ GUARDED_BY(mu_);  // Registration::data_roots
  bool has_job_ = false;
  JobStart start_;                                  // the restore point's origin
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<WorkerUpdater> updater_;  // before pipeline_: outlives it
  std::unique_ptr<UpdatePipeline> pipeline_;
  double cpu_update_rate_ = 0;  // measured at CreateJob
  double copy_bytes_per_s_ = 0;  // one thread's memcpy, measured at CreateJob
  std::map<int32_t, DeviceOffer> offers_ GUARDED_BY(recovery_mu_);  // workers taking updates
  std::vector<std::unique_ptr<Worker>> workers_ GUARDED_BY(mu_);  // index = id
  std::vector<std::unique_ptr<ShmWorker>> shm_workers_ GUARDED_BY(mu_);
  // Segments of lost workers: unlinked, but mapped until Stop (the pipeline may still
  // hold gradients in them).
  std::vector<std::unique_ptr<ShmWorker>> retired_ GUARDED_BY(mu_);
  int shm_generation_ = 0;
  bool paused_by_operator_ GUARDED_BY(recovery_mu_) = false;
  bool paused_by_loss_ GUARDED_BY(recovery_mu_) = false;
  UpdatePipeline::FreezeGuard operator_hold_ GUARDED_BY(recovery_mu_);  // Pause until Resume
  UpdatePipeline::FreezeGuard rollback_hold_ GUARDED_BY(recovery_mu_);  // sharded: until the rollback
  std::atomic<int> rollback_pending_{0};   // RollbackToEpoch calls waiting for recovery_mu_
  std::atomic<int64_t> rollbacks_{0};      // sharded rollbacks done (CheckpointLoop re-arms)
  std::atomic<int64_t> rearm_{-1};         // a hold RollbackToEpoch set for CheckpointLoop to adopt
  std::atomic<bool> paused_{false};
  // Restore point for rollbacks: the newest checkpoint written/resumed ("" = job start).
  std::string restore_dir_ GUARDED_BY(mu_);
  int64_t restore_step_ GUARDED_BY(mu_) = 0;
  bool final_checkpoint_failed_ GUARDED_BY(mu_) = false;  // the job-end checkpoint's write failed
  std::mt19937_64 registration_rng_ GUARDED_BY(mu_){std::random_device{}()};  // Registration::registration_id
  std::string last_checkpoint_ GUARDED_BY(mu_);
  // StepDone reports of a step not yet summarized. A step's summary (the log line,
  // on_step) is made once every worker contributing to it has reported (its members:
  // MembersOfLocked), so a step redone after a rollback while a worker is still
  // rejoining waits for that worker instead of averaging fewer reports.
  struct StepReports {
    int reports = 0;
    double loss_sum = 0;
    int64_t tokens = 0;
    StepTimes times;           // phase seconds summed over the reports
    int timeline_reports = 0;  // reports that carried the timeline
    double val_loss_sum = 0;   // eval loss * eval tokens
    int64_t val_tokens = 0;
  };
  std::map<int64_t, StepReports> step_reports_ GUARDED_BY(mu_);
  double val_loss_ = 0;       // last validation loss and its 1-based step (0 = none)
  int64_t val_step_ = 0;
  double last_loss_ = 0, tokens_per_s_ = 0;
  std::chrono::steady_clock::time_point step_start_ = std::chrono::steady_clock::now();
  std::thread liveness_, checkpointer_;
  std::mutex bg_mu_;
  std::condition_variable bg_cv_;
};

}  // namespace l2l::eps
