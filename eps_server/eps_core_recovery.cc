// EpsCore: worker liveness, loss handling and rollback, rejoin, pause, checkpoints,
// export and shutdown. See eps_core.h for the rules.
#include <algorithm>
#include <climits>
#include <filesystem>
#include <thread>

#include "common/fault_point.h"
#include "common/formats/model_io.h"
#include "common/logging.h"
#include "common/path_policy.h"
#include "eps_server/checkpoint.h"
#include "eps_server/eps_core.h"
#include "eps_server/eps_core_internal.h"

namespace l2l::eps {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

}  // namespace

int64_t EpsCore::checkpoint_every() const {
  const int64_t every = opts_.checkpoint_every > 0 ? opts_.checkpoint_every : job_.train.checkpoint_every;
  // A sharded job always checkpoints its last step as it completes: a final checkpoint
  // written only at stop would need every shard stopped at once (shard 0 waits for the
  // others' parts), and launchers stop shard 0 first.
  if (every <= 0 && opts_.shard.sharded()) return job_steps_ > 1 ? job_steps_ : 1;
  return every;
}

int64_t EpsCore::CheckpointBoundaryAfter(int64_t done) const {
  const int64_t every = checkpoint_every();
  return std::min((done / every + 1) * every, job_steps_);
}

std::string EpsCore::checkpoint_root() const {
  if (!opts_.checkpoint_dir.empty()) return opts_.checkpoint_dir;
  return (opts_.state_dir.empty() ? std::string(".") : opts_.state_dir) + "/checkpoints";
}

PathRoots EpsCore::job_path_roots() const {
  PathRoots roots = opts_.paths;
  roots.AddToAll(user_base_dir());
  return roots;
}

Result<std::string> EpsCore::ResolveUserPath(const std::string& path, std::string_view key) const {
  if (path.empty()) return InvalidArgument(std::string(key) + ": empty path");
  const std::string state = opts_.state_dir.empty() ? "." : opts_.state_dir;
  if (opts_.allow_absolute_paths && fs::path(path).is_absolute()) {
    std::string real = ResolveAllowedPath(path, "");
    if (real.empty()) return InvalidArgument(std::string(key) + " '" + path + "' cannot be resolved");
    return real;
  }
  return ConfinePath(key, path, state, {state},
                     "the daemon's state dir; allow_absolute_paths: true in the daemon config lets absolute "
                     "paths out");
}

Result<UpdatePipeline::FreezeGuard> EpsCore::HoldAtBoundary(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (stopped_) return Aborted("the daemon is stopping");
    if (Status f = pipeline_->failure(); !f.ok()) {
      return FailedPrecondition("the job failed (" + f.ToString() + "); its state is not checkpointed");
    }
    UpdatePipeline::FreezeGuard gate = pipeline_->FreezeNow();
    const UpdatePipeline::Frozen f = gate.frozen();
    if (f.at_boundary) return gate;
    gate.Reset();
    if (paused_.load()) {
      return FailedPrecondition("the job is paused in the middle of step " + std::to_string(f.step) +
                                "; Resume it (or let the lost worker rejoin) so the step can complete");
    }
    // Close the gate when the step in progress completes.
    if (!pipeline_->HoldAt(f.step + 1)) continue;
    while (!pipeline_->WaitHeld(f.step + 1, 100ms)) {
      if (stopped_ || !pipeline_->failure().ok() || std::chrono::steady_clock::now() >= deadline) {
        // Give the hold back: it is either pending or (racing) just closed.
        pipeline_->CancelHoldAt(f.step + 1);
        return Status(StatusCode::kDeadlineExceeded,
                      "step " + std::to_string(f.step) + " did not complete within " +
                          std::to_string(timeout.count()) + " ms (are all workers running?)");
      }
    }
    return pipeline_->AdoptHeld(f.step + 1);
  }
}

Result<CheckpointResult> EpsCore::WriteCheckpointLocked(int64_t step, const std::string& dir, bool latest) {
  CheckpointMeta meta;
  meta.step = step;
  meta.job = job();
  meta.expected_workers = opts_.expected_workers;
  meta.expert_steps = pipeline_->expert_steps();  // frozen at the boundary: the counts of `step`
  meta.lora_base_hash = store_->BaseHash();
  {
    // Each member's position at the start of `step` comes with its StepDone(step-1),
    // which may trail the step's last gradient by a moment.
    std::unique_lock<std::mutex> lock(mu_);
    const bool ok = cv_.wait_for(lock, 60s, [&] {
      ASSERT_HELD(mu_);
      if (rollback_pending_.load() > 0) return true;  // a sharded rollback wants recovery_mu_
      for (const auto& w : workers_) {
        if (w->info.state == WorkerState::kActive && w->member_last >= step && w->next_step < step) return false;
      }
      return true;
    });
    if (!ok) return Status(StatusCode::kDeadlineExceeded, "a worker did not report StepDone(" +
                                                              std::to_string(step - 1) + ") within 60 s");
    if (rollback_pending_.load() > 0) {
      return Aborted("checkpoint of step " + std::to_string(step) + " abandoned: every shard rolls back");
    }
    [&] {  // still under `lock`
      ASSERT_HELD(mu_);
      for (const auto& w : workers_) {
        meta.workers.push_back({w->info.id, w->info.name, PositionAt(w->info.id, step)});
      }
    }();
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t bytes = 0;
  if (opts_.shard.sharded()) {
    L2L_ASSIGN_OR_RETURN(bytes, WriteShardedCheckpoint(meta, dir, latest));
  } else {
    L2L_ASSIGN_OR_RETURN(bytes, WriteCheckpoint(*store_, meta, dir, latest));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (opts_.shard.sharded() && opts_.shard.index > 0) {
    L2L_LOG_INFO("checkpoint of step {}: this shard's part is durable ({} bytes, {:.2f} s); {} exists once shard 0 "
                 "has assembled every part",
                 step, bytes, secs, dir);
  } else {
    L2L_LOG_INFO("checkpoint of step {} written to {} ({} bytes, {:.2f} s)", step, dir, bytes, secs);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    restore_dir_ = dir;
    restore_step_ = step;
    last_checkpoint_ = dir;
    // Shard 0: the checkpoint is complete (every part assembled): shards roll back here.
    if (opts_.shard.sharded() && opts_.shard.index == 0) opts_.shards->SetRestorePoint(step);
    cv_.notify_all();  // a worker leaving after the last step waits for it (Deregister)
    // Positions before the restore point are no longer needed.
    for (auto& w : workers_) {
      auto& pos = w->position;
      auto keep = pos.upper_bound(step);
      if (keep != pos.begin()) pos.erase(pos.begin(), std::prev(keep));
    }
  }
  return CheckpointResult{dir, step, bytes};
}

Result<int64_t> EpsCore::WriteShardedCheckpoint(const CheckpointMeta& meta, const std::string& dir, bool latest) {
  const std::string root = checkpoint_root();
  if (dir != root + "/" + CheckpointDirName(meta.step)) {
    return FailedPrecondition("a sharded job writes its checkpoints into its checkpoint root " + root +
                              " (every shard writes its part there), not " + dir);
  }
  // The recovery epoch this state is in (rollbacks wait for recovery_mu_, held here): a
  // part of a state the shards abandoned meanwhile is refused, never assembled.
  const int64_t epoch = opts_.shards->epoch();
  L2L_ASSIGN_OR_RETURN(CheckpointPart part, WriteCheckpointPart(*store_, opts_.shard.index, meta.step, root));
  L2L_RETURN_IF_ERROR(opts_.shards->SubmitPart(part, epoch, std::chrono::minutes(2)));
  if (opts_.shard.index > 0) {
    L2L_LOG_INFO("shard {}: checkpoint part of step {} written to {}/{} ({} bytes); shard 0 assembles it",
                 opts_.shard.index, meta.step, root, part.dir, part.bytes);
    return part.bytes;
  }
  // Shard 0: the checkpoint exists once every shard's part is on disk.
  L2L_ASSIGN_OR_RETURN(std::vector<CheckpointPart> parts,
                       opts_.shards->WaitParts(meta.step, epoch, std::chrono::minutes(5)));
  return AssembleCheckpoint(meta, parts, root, latest);
}

Result<CheckpointResult> EpsCore::Checkpoint(const std::string& dir_arg) {
  if (!has_job()) return FailedPrecondition("no job to checkpoint (CreateJob first)");
  if (opts_.shard.sharded()) {
    return FailedPrecondition(
        "a sharded job checkpoints every train.checkpoint_every steps and at its end (each shard writes its part and "
        "shard 0 assembles them); a checkpoint on request is not supported yet");
  }
  std::string dir;
  if (!dir_arg.empty()) {
    L2L_ASSIGN_OR_RETURN(dir, ResolveUserPath(dir_arg, "Checkpoint dir"));
  }
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  L2L_ASSIGN_OR_RETURN(UpdatePipeline::FreezeGuard gate, HoldAtBoundary(std::chrono::minutes(10)));
  const int64_t step = gate.frozen().step;
  const bool default_dir = dir.empty();
  if (default_dir) dir = checkpoint_root() + "/" + CheckpointDirName(step);
  return WriteCheckpointLocked(step, dir, default_dir);
}

Result<int64_t> EpsCore::Export(const std::string& path_arg, DType dtype) {
  if (opts_.shard.sharded()) {
    return FailedPrecondition("a sharded job's daemons each hold some layers: export from its checkpoint "
                              "(l2l-eps --resume <checkpoint> with one daemon, or `l2l export`)");
  }
  if (!has_job()) return FailedPrecondition("no job to export (CreateJob first)");
  if (job().lora.enabled) {
    return FailedPrecondition("a LoRA job's state is its adapters: export them (--format peft | gguf-lora) or the "
                              "merged model (--merge)");
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return InvalidArgument(std::string("export dtype ") + DTypeName(dtype) + " is not supported (f32 or bf16)");
  }
  L2L_ASSIGN_OR_RETURN(std::string path, ResolveUserPath(path_arg, "Export path"));
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  L2L_ASSIGN_OR_RETURN(UpdatePipeline::FreezeGuard gate, HoldAtBoundary(std::chrono::minutes(10)));
  const int64_t step = gate.frozen().step;
  // Streamed one layer at a time with the gate closed (like a checkpoint), so a model
  // larger than RAM (SSD tier) exports too; updates wait meanwhile.
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  Status saved = SaveModelStreamed(
      path, job().model, [this](int64_t l, float* out) { return store_->ReadState(l, 0, out); }, dtype,
      {{"l2l.step", std::to_string(step)}});
  gate.Reset();
  L2L_RETURN_IF_ERROR(saved.WithContext("export"));
  const auto bytes = fs::file_size(path, ec);
  L2L_LOG_INFO("exported step {} as {} safetensors to {}", step, DTypeName(dtype), path);
  return ec ? int64_t{0} : static_cast<int64_t>(bytes);
}

Result<int64_t> EpsCore::ExportWith(
    const std::string& path_arg,
    const std::function<Result<int64_t>(const std::string&, int64_t, const std::function<Status(int64_t, float*)>&)>& write) {
  if (!has_job()) return FailedPrecondition("no job to export (CreateJob first)");
  if (opts_.shard.sharded()) {
    return FailedPrecondition("a sharded job's daemons each hold some layers: export from its checkpoint "
                              "(l2l-eps --resume <checkpoint> with one daemon)");
  }
  L2L_ASSIGN_OR_RETURN(std::string path, ResolveUserPath(path_arg, "Export path"));
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  L2L_ASSIGN_OR_RETURN(UpdatePipeline::FreezeGuard gate, HoldAtBoundary(std::chrono::minutes(10)));
  const int64_t step = gate.frozen().step;
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  // A LoRA job's layers whole (frozen base decoded, adapters as trained): ReadFullLayer.
  Result<int64_t> r = write(path, step, [this](int64_t l, float* out) { return store_->ReadFullLayer(l, out); });
  gate.Reset();
  if (!r.ok()) return r.status().WithContext("export");
  L2L_LOG_INFO("exported step {} to {}", step, path);
  return r;
}

JobConfig EpsCore::job_config() const {
  std::lock_guard<std::mutex> lock(mu_);
  return job_;
}

Status EpsCore::Pause() {
  if (!has_job()) return FailedPrecondition("no job to pause");
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  if (!paused_by_operator_) operator_hold_ = pipeline_->FreezeNow();
  paused_by_operator_ = true;
  UpdatePausedLocked();
  return Status::Ok();
}

Status EpsCore::Resume() {
  if (!has_job()) return FailedPrecondition("no job to resume");
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  operator_hold_.Reset();
  paused_by_operator_ = false;
  pipeline_->ClearSkipPause();
  if (paused_by_loss_) {
    // Continue without the lost workers: each contributed up to its last finished step.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) {
      if ((w->info.state == WorkerState::kLost || w->info.state == WorkerState::kLeft) && w->member_last == INT64_MAX) {
        w->member_last = w->next_step - 1;
        pipeline_->SetMember(w->info.id, w->member_first, w->member_last);
        L2L_LOG_WARN("resume: continuing without worker {} (it contributed up to step {})", w->info.id,
                     w->member_last);
      }
    }
    SummarizeStepsLocked();
    paused_by_loss_ = false;
  }
  UpdatePausedLocked();
  return Status::Ok();
}

void EpsCore::UpdatePausedLocked() {
  if (paused_by_loss_) {
    std::lock_guard<std::mutex> lock(mu_);
    bool waiting = false;
    for (const auto& w : workers_) {
      waiting |= (w->info.state == WorkerState::kLost || w->info.state == WorkerState::kLeft) && w->member_last == INT64_MAX;
    }
    paused_by_loss_ = waiting;
  }
  paused_ = paused_by_operator_ || paused_by_loss_;
}

void EpsCore::TearDownShmWorker(int32_t id) {
  std::unique_ptr<ShmWorker> w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = shm_workers_.begin(); it != shm_workers_.end(); ++it) {
      if ((*it)->id == id) {
        w = std::move(*it);
        shm_workers_.erase(it);
        break;
      }
    }
  }
  if (!w) return;
  w->CloseAndJoin();
  // A dead worker's pins must not block publishing.
  store_->RemovePinSource(id);
  if (Status s = w->seg.Unlink(); !s.ok()) L2L_LOG_WARN("{}", s.ToString());
  std::lock_guard<std::mutex> lock(mu_);
  retired_.push_back(std::move(w));
}

void EpsCore::HandleLoss(int32_t id, WorkerState new_state) {
  WorkerState was = WorkerState::kActive;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Worker& w = *workers_[id];
    if (w.info.state != WorkerState::kActive && w.info.state != WorkerState::kRejoin) return;
    was = w.info.state;
    w.info.state = new_state;
  }
  // An update this worker holds falls back to the daemon now (the freeze below waits for
  // running updates, which must not wait out the update deadline).
  updater_->RemoveWorker(id, "worker " + std::to_string(id) + " is " + ToString(new_state));
  if (offers_.erase(id) > 0) ApplyOptimizerSplit("worker " + std::to_string(id) + " is " + ToString(new_state));
  UpdatePipeline::FreezeGuard gate = pipeline_->FreezeNow();
  const UpdatePipeline::Frozen f = gate.frozen();
  TearDownShmWorker(id);
  const bool cont = new_state == WorkerState::kLeft || opts_.on_worker_loss == OnWorkerLoss::kContinue;
  int64_t next = 0, first = 0, steps = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    next = workers_[id]->next_step;
    first = workers_[id]->member_first;
    steps = job_.train.steps;
  }
  std::string what;
  // The job is complete: a worker leaving now is the normal end, not a loss.
  const bool job_done = new_state == WorkerState::kLeft && f.at_boundary && f.step >= steps;
  // Sharded: every shard must make the same decision about the lost worker's step, and
  // each sees the worker at its own point of the step. So a worker lost while active
  // rolls every shard back to the job's last complete checkpoint (shard 0 decides; this
  // shard stays frozen until then). One that had not rejoined since the last rollback
  // contributed nothing since: no rollback.
  const bool shard_rollback = opts_.shard.sharded() && !job_done && was == WorkerState::kActive;
  auto request_shard_rollback = [&]() REQUIRES(recovery_mu_) {
    RequestShardRollback("worker " + std::to_string(id) + " " + ToString(new_state) + " at step " +
                             std::to_string(f.step),
                         std::move(gate));
    what = "every shard rolls back to the job's last complete checkpoint (shard 0 decides)";
  };
  if (job_done) {
    pipeline_->DropWorker(id, f.step);
    what = "the job's last step was done";
  } else if (shard_rollback) {
    request_shard_rollback();
  } else if (next > f.step) {
    // It finished step t (lock-free mode: maybe later ones too): its gradients of the
    // steps it finished are all in; drop only those of the steps after.
    pipeline_->DropWorker(id, next);
    what = "it had finished step " + std::to_string(f.step) + ", nothing abandoned";
  } else if (f.at_boundary && pipeline_->DropWorker(id, f.step)) {
    what = "its gradients of step " + std::to_string(f.step) + " were dropped (no layer had applied the step)";
  } else if (opts_.shard.sharded()) {
    request_shard_rollback();
  } else {
    // Partially applied, or (global clip) its gradients are already summed into the
    // step's reductions: abandon the step. At the boundary the state needs no restore.
    Status s = Rollback(id, /*restore=*/f.applied);
    if (!s.ok()) {
      L2L_LOG_ERROR("rollback after losing worker {} failed: {}; stopping the job", id, s.ToString());
      gate.Reset();
      store_->Stop();
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    next = workers_[id]->next_step;
    what = "step " + std::to_string(f.step) + (!f.applied ? " was abandoned" : " was partially applied: rolled back") +
           " to step " + std::to_string(next) + ", every worker must re-register and redo from there";
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    Worker& w = *workers_[id];
    if (cont) {
      w.member_last = next - 1;
      if (w.member_last < first) {
        pipeline_->RemoveMember(id);
      } else {
        pipeline_->SetMember(id, first, w.member_last);
      }
      SummarizeStepsLocked();  // a step the others reported may wait for no one now
    } else {
      paused_by_loss_ = true;
    }
  }
  if (job_done) {
    L2L_LOG_INFO("worker {} left at step {}: {}", id, f.step, what);
  } else {
    L2L_LOG_WARN("worker {} {} at step {}: {}; {}", id, ToString(new_state), f.step, what,
                 cont ? "continuing with the other workers" : "job paused until it rejoins (or Resume)");
  }
  gate.Reset();
  UpdatePausedLocked();
}

Status EpsCore::Rollback(int32_t lost_id, bool restore) {
  std::string dir;
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = restore_dir_;
    step = restore ? restore_step_ : pipeline_->stats().completed_step;
  }
  return RollBackTo(step, dir, restore, "step abandoned after worker " + std::to_string(lost_id) + " was lost");
}

void EpsCore::RequestShardRollback(const std::string& why, UpdatePipeline::FreezeGuard gate) {
  // Frozen until the rollback: this shard must neither finish the step nor post a
  // verdict or a checkpoint part of it (the others may have other gradients of it).
  rollback_hold_ = std::move(gate);
  opts_.shards->RequestRollback(why);
}

void EpsCore::RollbackToEpoch(const ShardPeers::Epoch& e) {
  // A checkpoint write waiting for StepDone under recovery_mu_ gives way (its state is
  // being abandoned); the hub aborts a wait for parts itself.
  rollback_pending_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  rollback_pending_.fetch_sub(1);
  if (stopped_ || !pipeline_->failure().ok()) return;
  UpdatePipeline::FreezeGuard gate = pipeline_->FreezeNow();
  rollback_hold_.Reset();
  const std::string root = checkpoint_root();
  // The step's checkpoint, or (no checkpoint yet in this run) the job's start.
  const std::string dir = e.step == start_.step ? std::string() : root + "/" + CheckpointDirName(e.step);
  opts_.shards->BeginRollback();
  Status s = RollBackTo(e.step, dir, /*restore=*/true,
                        "recovery epoch " + std::to_string(e.epoch) + " (" + e.reason + ")");
  opts_.shards->EndRollback(e.epoch);
  rollbacks_.fetch_add(1);
  if (s.ok() && checkpoint_every() > 0 && e.step < job_steps_) {
    // Every shard writes its part of each boundary again as it redoes the steps: the
    // checkpoint loop may hold at a later one (it wrote this one in an earlier epoch).
    // The hold goes in while frozen at e.step, so the redo cannot pass it; the loop
    // adopts it (rearm_).
    const int64_t b = CheckpointBoundaryAfter(e.step);
    if (pipeline_->HoldAt(b)) {
      if (const int64_t old = rearm_.exchange(b); old >= 0) pipeline_->CancelHoldAt(old);
    }
  }
  if (!s.ok()) {
    gate.Reset();
    OnPipelineFailure(s.WithContext("rolling shard " + std::to_string(opts_.shard.index) + " back to step " +
                                    std::to_string(e.step)));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    restore_dir_ = dir;
    restore_step_ = e.step;
    cv_.notify_all();
  }
  if (opts_.shard.index == 0) opts_.shards->SetRestorePoint(e.step);
  gate.Reset();
  UpdatePausedLocked();
  L2L_LOG_WARN("shard {}: rolled back to step {} (recovery epoch {}: {}); every worker rejoins", opts_.shard.index,
               e.step, e.epoch, e.reason);
}

Status EpsCore::RollBackTo(int64_t step, const std::string& dir, bool restore, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) {
      if (w->info.state == WorkerState::kActive) {
        w->info.state = WorkerState::kRejoin;
        w->rejoin_message = why + "; every worker restarts at step " + std::to_string(step);
      }
    }
    cv_.notify_all();  // a worker waiting to leave (Deregister) must rejoin instead
  }
  store_->BumpEpoch();  // wakes shm readers and in-process waiters with an error
  pipeline_->ResetToStep(step);
  if (!restore) {
    // Nothing was applied: only the step's gradients go.
  } else if (!dir.empty()) {
    L2L_ASSIGN_OR_RETURN(CheckpointManifest m, ReadCheckpointManifest(dir));
    L2L_RETURN_IF_ERROR(LoadCheckpointState(m, store_.get()));
    L2L_RETURN_IF_ERROR(pipeline_->set_expert_steps(m.meta.expert_steps));
  } else if (start_.load) {
    L2L_RETURN_IF_ERROR(start_.load(store_.get()));
    if (!start_.expert_steps.empty()) L2L_RETURN_IF_ERROR(pipeline_->set_expert_steps(start_.expert_steps));
  } else {
    L2L_RETURN_IF_ERROR(store_->InitFromSeed(job().train.seed));
  }
  if (restore && start_.expert_steps.empty() && dir.empty()) {
    // Back to the job's start: every expert at step 0.
    L2L_RETURN_IF_ERROR(pipeline_->set_expert_steps(std::vector<int64_t>(pipeline_->expert_steps().size(), 0)));
  }
  if (restore) {
    for (int64_t l = 0; l < store_->num_layers(); ++l) L2L_RETURN_IF_ERROR(store_->PublishMaster(l, step));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& w : workers_) {
    w->next_step = std::min(w->next_step, step);
    w->position.erase(w->position.upper_bound(step), w->position.end());
    w->info.step = w->next_step;
    // A worker that already left (or was lost under on_worker_loss: continue) after
    // contributing to steps from `step` on: those gradients are gone with the reset.
    // Pause: its share must be redone, so the job waits for a replacement to take its id
    // (PrepareRejoin starts it at `step`). Continue: the steps go on without it.
    const bool gone = w->info.state == WorkerState::kLeft || w->info.state == WorkerState::kLost;
    if (gone && w->member_last != INT64_MAX && w->member_last >= step) {
      if (opts_.on_worker_loss == OnWorkerLoss::kPause) {
        w->member_last = INT64_MAX;
        pipeline_->SetMember(w->info.id, w->member_first, INT64_MAX);
        paused_by_loss_ = true;
      } else {
        w->member_last = step - 1;
        if (w->member_last < w->member_first) {
          pipeline_->RemoveMember(w->info.id);
        } else {
          pipeline_->SetMember(w->info.id, w->member_first, w->member_last);
        }
      }
    }
  }
  // The step summaries' sums hold reports of steps being redone: they start again.
  step_reports_.clear();
  if (restore) L2L_LOG_WARN("rolled back to step {} ({})", step, dir.empty() ? start_.description : dir);
  if (restore && opts_.on_rollback) opts_.on_rollback(step);
  return Status::Ok();
}

Result<int64_t> EpsCore::PrepareRejoin(int32_t id, UpdatePipeline::FreezeGuard* gate) {
  *gate = pipeline_->FreezeNow();
  const UpdatePipeline::Frozen f = gate->frozen();
  TearDownShmWorker(id);
  std::lock_guard<std::mutex> lock(mu_);
  Worker& w = *workers_[id];
  int64_t start = 0;
  if (w.member_last == INT64_MAX) {
    start = w.next_step;  // still a member: the job waits for it there (or it redoes)
  } else {
    // Join at the step in progress if no layer applied it yet, else at the next one;
    // but never at a step this id already contributed to: a worker that left (or was
    // lost under on_worker_loss: continue) after finishing step member_last has its
    // gradients of that step in, and a new process redoing it would push them twice.
    start = f.at_boundary ? f.step : f.step + 1;
    if (w.member_last >= w.member_first && w.member_last + 1 >= start) {
      start = w.member_last + 1;  // the membership goes on without a gap
    } else {
      w.member_first = start;
    }
    w.member_last = INT64_MAX;
    pipeline_->SetMember(id, w.member_first, INT64_MAX);
  }
  w.epoch = store_->epoch();
  return start;
}

void EpsCore::LivenessLoop() {
  const auto timeout = std::chrono::milliseconds(opts_.heartbeat_timeout_ms);
  const auto tick = std::clamp<std::chrono::milliseconds>(timeout / 4, 10ms, 200ms);
  while (!stopped_) {
    {
      std::unique_lock<std::mutex> lock(bg_mu_);
      bg_cv_.wait_for(lock, tick, [&] { return stopped_.load(); });
    }
    if (stopped_) break;
    std::vector<int32_t> lost;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto now = std::chrono::steady_clock::now();
      for (const auto& w : workers_) {
        if ((w->info.state == WorkerState::kActive || w->info.state == WorkerState::kRejoin) && now - w->info.last_seen > timeout) {
          lost.push_back(w->info.id);
        }
      }
    }
    for (int32_t id : lost) {
      std::lock_guard<std::mutex> rlock(recovery_mu_);
      {
        // It may have come back while we waited for the lock.
        std::lock_guard<std::mutex> lock(mu_);
        if (std::chrono::steady_clock::now() - workers_[id]->info.last_seen <= timeout) continue;
      }
      L2L_LOG_WARN("worker {} missed heartbeats for {} ms: declared lost", id, opts_.heartbeat_timeout_ms);
      HandleLoss(id, WorkerState::kLost);
    }
  }
}

// Periodic checkpoints every `checkpoint_every` steps, and one of the last step whatever
// the period: a worker leaves the job only once that one is on disk (Deregister), so a
// daemon that dies after the job's end resumes finished, with nobody left to wait for.
void EpsCore::CheckpointLoop() {
  const int64_t steps = job().train.steps;
  // Writes the checkpoint of `step` (the gate is held there); the last step's failure
  // lets the workers waiting in Deregister go (the state stays in memory).
  // false: a sharded rollback abandoned the write (the shards redo the step, and the
  // checkpoint with it).
  auto write = [&](int64_t step) REQUIRES(recovery_mu_) {
    const int64_t rollbacks = rollbacks_.load();
    auto r = WriteCheckpointLocked(step, checkpoint_root() + "/" + CheckpointDirName(step), true);
    if (r.ok()) return true;
    if (opts_.shard.sharded() && (rollback_pending_.load() > 0 || rollbacks_.load() != rollbacks ||
                                  r.status().code() == StatusCode::kAborted)) {
      L2L_LOG_WARN("checkpoint of step {} abandoned: {} (written when the shards get there again)", step,
                   r.status().message());
      return false;
    }
    L2L_LOG_ERROR("{} checkpoint of step {} failed: {}", step >= steps ? "the last step's" : "periodic", step,
                  r.status().ToString());
    if (step >= steps) {
      L2L_LOG_ERROR("the job's final state stays in this daemon's memory only: write it with `l2lctl "
                    "checkpoint` or `l2lctl stop` once the cause is fixed");
      std::lock_guard<std::mutex> lock(mu_);
      final_checkpoint_failed_ = true;
      cv_.notify_all();
    }
    return true;
  };
  // At the job's end: one daemon is done. A shard stays on watch: a shard that died
  // before the final checkpoint was assembled rolls every shard back, and this loop must
  // write its part again (RollbackToEpoch's hold). The hold to adopt, or -1: stopping.
  auto after_end = [&]() -> int64_t {
    if (!opts_.shard.sharded()) return -1;
    while (!stopped_) {
      if (const int64_t r = rearm_.exchange(-1); r >= 0) return r;
      std::this_thread::sleep_for(50ms);
    }
    return -1;
  };
  int64_t next = -1;  // the boundary a HoldAt is registered at (-1: none yet)
  while (!stopped_) {
    if (next < 0) {
      const int64_t done = pipeline_->stats().completed_step;
      if (done >= steps) {
        // At the end: resumed from the last step's checkpoint, or this thread started
        // late and the job ran past every hold it could have set. Then write it now.
        bool have = false;
        {
          std::lock_guard<std::mutex> lock(mu_);
          have = restore_step_ >= steps;
        }
        if (!have) {
          std::lock_guard<std::mutex> rlock(recovery_mu_);
          Result<UpdatePipeline::FreezeGuard> held = HoldAtBoundary(60s);
          if (held.ok()) write(held->frozen().step);
        }
        next = after_end();
        if (next < 0) break;
        continue;
      }
      next = CheckpointBoundaryAfter(done);
      if (!pipeline_->HoldAt(next)) {
        next = -1;
        continue;
      }
    }
    int64_t rollbacks = rollbacks_.load();
    while (!stopped_ && !pipeline_->WaitHeld(next, 200ms)) {
      // A sharded rollback went back before `next` and holds at the first boundary
      // after its step (RollbackToEpoch): that is the one to wait for now.
      if (const int64_t r = rearm_.exchange(-1); r >= 0) {
        pipeline_->CancelHoldAt(next);
        next = r;
      }
      rollbacks = rollbacks_.load();
    }
    if (stopped_) break;
    int64_t following = -1;
    bool abandoned = false;
    {
      UpdatePipeline::FreezeGuard gate = pipeline_->AdoptHeld(next);
      std::lock_guard<std::mutex> rlock(recovery_mu_);
      // A rollback between the hold and the lock: the state is no longer step `next`'s.
      abandoned = rollbacks_.load() != rollbacks || !write(next);
      // The next boundary's hold goes in while the gate is still shut: a thread
      // descheduled after the gate opens could otherwise find the pipeline already past
      // it and skip that checkpoint (the last step's included).
      if (!abandoned && next < steps && pipeline_->HoldAt(CheckpointBoundaryAfter(next))) {
        following = CheckpointBoundaryAfter(next);
      }
    }
    if (abandoned) {
      // Once the rollback is done, holds again from the step it went back to.
      while (!stopped_ && pipeline_->failure().ok() && rollbacks_.load() == rollbacks) {
        std::this_thread::sleep_for(20ms);
      }
      next = rearm_.exchange(-1);  // -1: none; holds again from the step it went back to
      continue;
    }
    if (next >= steps) {
      next = after_end();
      if (next < 0) break;
      continue;
    }
    FaultPoint("eps.checkpoint_loop");  // tests: L2L_DELAY_AT deschedules this thread here
    next = following;
  }
}

Status EpsCore::PrepareShutdown(bool abort_step, bool skip_checkpoint, std::chrono::milliseconds finish_timeout) {
  if (!has_job()) return Status::Ok();
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  Result<UpdatePipeline::FreezeGuard> held = HoldAtBoundary(abort_step ? 0ms : finish_timeout);
  if (!held.ok()) {
    // Not at a boundary and not finishing: the state mixes two steps. Keep the gate
    // shut and leave the newest checkpoint as it is.
    pipeline_->FreezeNow().KeepForever();
    std::lock_guard<std::mutex> lock(mu_);
    L2L_LOG_ERROR("shutdown: {}; the step in flight was partially applied, so no final checkpoint is written "
                  "(the newest one stands: {})",
                  held.status().message(), last_checkpoint_.empty() ? "none" : last_checkpoint_);
    return Status::Ok();
  }
  // The daemon is going away: the state stays at this boundary (the gate stays shut)
  // unless the final checkpoint fails, when the hold is dropped and the job goes on paused.
  const int64_t step = held->frozen().step;
  if (skip_checkpoint) {
    held->KeepForever();
    return Status::Ok();
  }
  const std::string dir = checkpoint_root() + "/" + CheckpointDirName(step);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (restore_dir_ == dir && restore_step_ == step) {  // already written
      held->KeepForever();
      return Status::Ok();
    }
  }
  auto r = WriteCheckpointLocked(step, dir, true);
  if (!r.ok()) {
    // Not stopping after all: the caller pauses the job; the state stays in memory.
    return r.status().WithContext("final checkpoint of step " + std::to_string(step) + " into " + dir);
  }
  held->KeepForever();
  return Status::Ok();
}

}  // namespace l2l::eps
