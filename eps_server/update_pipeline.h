// UpdatePipeline: the EPS's eager reduce-and-update, layer by layer, overlapping the
// workers' backward instead of waiting for the whole step. Gradients
// arrive per (layer, step, worker) from either transport; as soon as every registered
// worker's step-t gradient of a layer is in, a TBB flow graph runs, for that layer:
//   reduce (sum over workers in worker-id order, so the result does not depend on
//   arrival order) -> [norm for clipping] -> AdamW (vectorised, kernels/cpu/adamw_simd.h)
//   -> cast into the published dtype in the same pass -> publish version t+1.
// Different layers update concurrently, and concurrently with the workers' backward of
// earlier layers.
//
// Clipping (training.clip): "none"; "per_layer" (each layer's reduced gradient clipped
// to optim.grad_clip on its own); "global" (torch clip_grad_norm_ over the whole model:
// needs every layer's norm of the step before ANY layer can be updated, so the
// reductions still overlap with backward, but all AdamW updates of the step wait for
// the last gradient (layer 0) and run after it: the update is fully exposed. Cost:
// about one AdamW pass over the whole model per step on the critical path.)
//
// Non-finite values never reach the state (speculative update with rollback): every
// layer's AdamW pass checks the reduced gradient for finiteness in the same loop and
// first copies the layer's master/m/v into an undo buffer (12 B per parameter, kept per
// layer and reused). The new published copy is written but NOT made current: a step
// commits only when every layer has applied it and (set_gate_on_losses) every member
// reported a loss for it (ReportLoss). Commit: all layers publish version t+1 at once.
// Skip (any non-finite gradient, global-clip norm or loss): every layer's master/m/v
// is restored from its undo copy and version t+1 is published with the old weights, so
// workers go on while the state is bit-identical to before the step.
// Bounded undo (undo_budget_bytes, the daemon's memory.guard_bytes): undo copies are
// given, once, to the layers whose gradients come first in a step (the head down), as
// many as fit the budget at 12 B per parameter beside 4 B per parameter for every other
// layer. The other layers are "deferred": their gradient is reduced into one fp32 sum
// (4 B/param; the workers' slots go back at once) and checked, and their AdamW runs
// only once the step's verdict is in (every gradient checked, every loss reported):
// commit -> the deferred updates run (past the gate: a started commit always ends), then
// all layers publish t+1; skip -> the speculative layers are restored from their undo
// copies and the deferred ones were never touched. Bit-identical either way; the cost
// is that the deferred layers' updates are exposed after the last gradient. After
// training.skip_pause_after skips in a row the gate closes at that boundary (a pause
// with a reason in stats(); ClearSkipPause() resumes). A layer's gradient buffers are
// released as soon as it is applied (a worker's shm slots are few). Applied layers
// make Freeze report at_boundary=false until the commit; ResetToStep undoes them.
// Workers never see a speculative version; in synchronous mode the layer whose
// gradient comes last (the embedding) is the one the next forward needs first, so
// holding the publishes back costs nothing (docs/architecture.md has the figures).
//
// Sharded jobs (common/shard_plan.h; set_coordinator): the pipeline holds this shard's
// layers only, and the two decisions that need every layer are the job's, not this
// daemon's: the global clip's norm (PostNorms -> SetGlobalNorm2) and each step's
// verdict, commit or skip (PostVerdict -> SetGlobalVerdict). The undo copies make the
// wait safe: applied layers wait for the verdict exactly as they wait for the losses.
//
// Mixture of experts (job.model.num_experts > 0): every worker reports which experts its
// forward of a step routed tokens to (ReportExperts, before it pushes any block gradient
// of the step); the reports are ORed per step. A block's update applies AdamW only to the
// experts some worker reported, each with its own step count (bias correction); the
// others keep master, m and v untouched and are published unchanged: torch.optim.AdamW
// skipping a parameter whose .grad is None (zero_grad(set_to_none=True), and Hugging
// Face's Mixtral runs only the experts that got tokens). The counts advance when the step
// commits (a skipped step advances none) and are part of the checkpoint (expert_steps).
// A zero gradient is NOT taken as "untouched": an expert with tokens may have one.
// Such blocks always run the fused pass (never the interleaved optimizer: it takes one
// step count per layer).
//
// Gate: Hold() stops new updates from starting at the next step boundary (for
// checkpoints and Pause); gradients keep being accepted and wait. Release() resumes.
//
// Ownership: the pipeline borrows the ParamStore (which must outlive it) and owns the
// GradientRefs handed to Submit until it calls their release callback (after the
// layer's publish, or when the gradient is rejected or the pipeline is destroyed).
// Thread-safety: all public methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/adamw.h"
#include "common/config.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "eps_server/param_store.h"
#include "eps_server/state_span.h"

namespace l2l::eps {

// Where a shard's pipeline sends the facts of a step that every shard must agree on
// (eps_server/shard_link.h). Both calls must return at once (they are made under the
// pipeline's lock); the answer comes later, from another thread, through
// SetGlobalNorm2 / SetGlobalVerdict.
class StepCoordinator {
 public:
  virtual ~StepCoordinator() = default;
  // Global clip: the squared norms of this shard's layers' reduced gradients for `step`
  // (local layer order).
  virtual void PostNorms(int64_t step, std::vector<double> norm2) = 0;
  // Every layer of this shard applied (or checked) `step` and the losses are in:
  // skip_reason "" = this shard would commit.
  virtual void PostVerdict(int64_t step, const std::string& skip_reason) = 0;
};

// A tensor range of a layer's flat buffer and whether weight decay applies to it.
struct DecayRange {
  size_t begin = 0, end = 0;  // element offsets in the layer, [begin, end)
  bool decay = false;
};

// Runs one layer's AdamW away from the daemon's fused pass (the interleaved optimizer: a
// worker's device), on contiguous copies of the layer's state. The pipeline hands over
// p, m, v (numel fp32 each, updated in place) and the gradient already summed over the
// workers in worker order (numel fp32, not yet scaled); the updater applies exactly
// common/adamw.h AdamWStep with `args` (WithDecay(args, range.decay): args.weight_decay
// for ranges with decay, 0 otherwise; args.grad_scale scales the summed gradient), so
// the result is bitwise the daemon's. A non-OK status fails the update like a state I/O fault.
// Thread-safety: Update may be called from several pipeline tasks at once (different
// layers).
class OffloadedUpdater {
 public:
  virtual ~OffloadedUpdater() = default;
  virtual Status Update(int64_t layer, const AdamWStepArgs& args, const std::vector<DecayRange>& ranges, float* p,
                        float* m, float* v, const float* grad_sum, size_t numel) = 0;
};

// The reference updater: AdamWStep on this host's CPU (what a CPU-backend worker runs).
class CpuOffloadedUpdater : public OffloadedUpdater {
 public:
  Status Update(int64_t layer, const AdamWStepArgs& args, const std::vector<DecayRange>& ranges, float* p,
                float* m, float* v, const float* grad_sum, size_t numel) override;
};

// One worker's gradient of one layer: numel fp32 values that stay valid until release()
// is called (shm slot or a received gRPC buffer).
struct GradientRef {
  int32_t worker_id = -1;
  const float* data = nullptr;  // (numel)
  size_t numel = 0;
  int64_t micro_batches = 1;
  std::function<void()> release;  // may be empty
};

struct PipelineStats {
  int64_t completed_step = 0;     // steps whose every layer is published
  double last_step_busy_s = 0;    // update work of the last completed step, summed over layers
  double last_step_exposed_s = 0; // last gradient arrival -> step complete
  double last_step_wall_s = 0;    // previous step complete -> this step complete
  int64_t skipped_steps = 0;      // steps skipped for a non-finite gradient or loss
  int64_t consecutive_skips = 0;  // skips in a row up to the last completed step
  std::string last_skip_reason;   // why the last skipped step was skipped ("" = none)
  bool skip_paused = false;       // the gate is closed after skip_pause_after skips
};

// Where one step's update spent its time (the per-step timeline in run.jsonl).
struct StepUpdateTimes {
  double busy_s = 0;         // update work (reduce, AdamW, cast), summed over layers
  double lag_s = 0;          // the step's last gradient arrived -> its version published
  double commit_wait_s = 0;  // the last layer applied -> published (waiting for the losses)
};

// A skipped step, for the daemon's logs, run.jsonl and metrics.
struct SkipEvent {
  int64_t step = 0;               // the step that was skipped (0-based)
  std::string reason;
  int64_t consecutive = 0, total = 0;
  bool paused = false;            // this skip closed the gate (skip_pause_after reached)
};

class UpdatePipeline {
 public:
  // start_step: versions every layer is published at (0, or the resume step).
  // undo_budget_bytes: host bytes for undo copies (12 B/param) and deferred layers'
  // reduced gradients (4 B/param); SIZE_MAX = every layer gets an undo copy (no deferral).
  UpdatePipeline(ParamStore* store, const JobConfig& job, int num_workers, int64_t start_step,
                 size_t undo_budget_bytes = SIZE_MAX);
  // Bytes the guard needs with budget b: 12 B/param for the undo layers (16 with global
  // clip: their reduced gradient is held too), 4 for the rest (the plan the constructor
  // makes); and the least budget that works (every layer deferred: 4 B/param). For the
  // daemon's start-up arithmetic (eps_server/host_budget.h).
  static size_t GuardBytes(const std::vector<size_t>& layer_numel, size_t budget, bool global_clip,
                           int64_t* undo_layers);
  static size_t MinGuardBytes(const std::vector<size_t>& layer_numel);
  ~UpdatePipeline();  // waits for running updates, releases waiting gradients

  // Accepts a gradient. Errors (the ref is released before returning):
  //   NOT_FOUND layer out of range; INVALID_ARGUMENT numel mismatch or micro_batches < 1;
  //   FAILED_PRECONDITION step is not the layer's current step (in lock-free mode:
  //   not within current .. current + staleness; later steps wait their turn);
  //   ALREADY_EXISTS this worker already pushed (layer, step).
  Status Submit(int64_t layer, int64_t step, GradientRef ref);

  // Membership over steps: worker `id` contributes to steps first..last (inclusive) of
  // every layer. A worker joining later (first > current step) or leaving after its
  // last complete step (last = that step) never makes a step wait for it or take a
  // partial set. Re-checks waiting layers.
  void SetMember(int32_t id, int64_t first, int64_t last);
  void RemoveMember(int32_t id);

  // Blocks until completed_step >= step or timeout. Returns whether it got there.
  bool WaitForStep(int64_t step, std::chrono::milliseconds timeout);

  // Closes the gate at the next step boundary and waits until no update runs; returns
  // the step the state then holds. Nested holds are counted.
  int64_t Hold();
  void Release();

  // Like Hold(), but at the step boundary `step`: the gate closes (as one hold) right
  // when completed_step reaches `step`, before any update of step `step` starts, so a
  // checkpoint of exactly that step can be taken. Returns false when completed_step is
  // already past `step`. Pair a successful HoldAt with WaitHeld and then Release().
  bool HoldAt(int64_t step);
  // Waits (up to timeout) until the gate closed by HoldAt(step) is closed and idle.
  bool WaitHeld(int64_t step, std::chrono::milliseconds timeout);
  // Gives back a HoldAt(step): drops it while pending, else releases the closed gate.
  void CancelHoldAt(int64_t step);

  // Closes the gate NOW (one hold; release with Release()): updates already running
  // finish, no other starts. Returns the completed step and whether the state is at
  // that step's boundary (no layer of the step in progress updated yet).
  struct Frozen {
    int64_t step = 0;
    bool at_boundary = true;
    bool applied = false;  // some layer's state already holds the step in progress
  };
  Frozen Freeze();

  // One hold of the gate, given back (Release) when the guard goes out of scope or on
  // Reset(). Every caller that stops updates for a while (checkpoint, export, a lost or
  // rejoining worker, an operator's Pause) holds one, so no return path can leave the
  // pipeline frozen. Move-only; an empty guard holds nothing.
  class [[nodiscard]] FreezeGuard {
   public:
    FreezeGuard() = default;
    FreezeGuard(FreezeGuard&& o) noexcept : p_(std::exchange(o.p_, nullptr)), frozen_(o.frozen_) {}
    FreezeGuard& operator=(FreezeGuard&& o) noexcept {
      if (this != &o) {
        Reset();
        p_ = std::exchange(o.p_, nullptr);
        frozen_ = o.frozen_;
      }
      return *this;
    }
    FreezeGuard(const FreezeGuard&) = delete;
    FreezeGuard& operator=(const FreezeGuard&) = delete;
    ~FreezeGuard() { Reset(); }
    // Gives the hold back now (no-op when empty).
    void Reset() {
      if (p_ != nullptr) std::exchange(p_, nullptr)->Release();
    }
    bool held() const { return p_ != nullptr; }
    // Leaves the gate closed for the rest of the pipeline's life (shutdown: the state
    // must not move after the final checkpoint or a mid-step stop).
    void KeepForever() { p_ = nullptr; }
    // What Freeze() saw (FreezeNow only).
    const Frozen& frozen() const { return frozen_; }

   private:
    friend class UpdatePipeline;
    FreezeGuard(UpdatePipeline* p, Frozen f) : p_(p), frozen_(f) {}
    UpdatePipeline* p_ = nullptr;
    Frozen frozen_;
  };
  // Freeze() as a guard.
  FreezeGuard FreezeNow() { return FreezeGuard(this, Freeze()); }
  // Takes ownership of the hold a successful HoldAt(step) + WaitHeld(step) closed.
  FreezeGuard AdoptHeld(int64_t step) { return FreezeGuard(this, Frozen{step, true}); }

  PipelineStats stats() const;
  // The update that published `version` (the update of step version-1), while it is
  // among the last kUpdateHistory completed; std::nullopt otherwise.
  static constexpr int64_t kUpdateHistory = 16;
  std::optional<StepUpdateTimes> UpdateTimesFor(int64_t version) const;

  // Step facts beyond the gradients: with the gate on, a step commits only once every
  // member of it reported its loss (a non-finite loss skips the step). The EPS core
  // turns it on; without it (unit tests) gradients alone decide.
  void set_gate_on_losses(bool on);
  void ReportLoss(int32_t worker_id, int64_t step, double loss);
  // Called for every skipped step, from the thread that decided it, with no pipeline
  // lock held (must not block for long).
  void set_on_skip(std::function<void(const SkipEvent&)> f);
  // Interleaved optimizer: the layers with on_device[l] are updated through `updater`
  // (copied out of the state, updated, copied back under the same state lease, then cast
  // and published as the fused pass would), the rest by the fused pass. The undo copy,
  // the finiteness check and the SSD tier's write-behind are the same for both, so
  // checkpoints, rollbacks and resume see one state. May be called again at any time (the
  // daemon re-chooses the split when a worker reports its device's rates): updates that
  // start afterwards use the new mask. REQUIRES: on_device.size() == the number of
  // layers; updater (nullptr: none) outlives the pipeline.
  void set_offload(std::vector<bool> on_device, OffloadedUpdater* updater);
  // Ends a pause caused by skip_pause_after skips in a row (no-op otherwise).
  void ClearSkipPause();

  // Sharded jobs (see the top): set before gradients flow; null = decide alone.
  void set_coordinator(StepCoordinator* c);
  // The job's answers: the global clip's total squared norm of `step`, and its verdict
  // ("" = commit, else the reason it is skipped). Answers for steps already done are
  // ignored.
  void SetGlobalNorm2(int64_t step, double total);
  void SetGlobalVerdict(int64_t step, const std::string& reason);

  // Fatal errors: an update that cannot reach its layer's state (an SSD-tier I/O fault,
  // eps_server/spill_tier.h) publishes nothing and makes the pipeline failed: no update
  // starts after it, Submit returns the error, WaitForStep returns false, and
  // on_failure (set before gradients flow) is called once from the failing thread.
  Status failure() const;
  void set_on_failure(std::function<void(const Status&)> f);
  // Drops (releases) the gradients of `worker_id` (every worker's when -1) that wait
  // for the step in progress, and un-schedules updates that were held by the gate.
  // REQUIRES: the pipeline is frozen (Freeze/Hold) so no update of them runs.
  // Only layers collecting a step >= min_step are touched. Returns false (and drops
  // nothing) when a layer's gradients were already reduced into one sum that includes
  // this worker's (global clip): the caller must then drop the whole step (-1).
  bool DropWorker(int32_t worker_id, int64_t min_step = INT64_MIN);
  // Abandons the step in progress: layers applied ahead of its commit are restored from
  // their undo copies (bit for bit), then every layer collects `step` again (after a
  // rollback restored the store at `step`, or the current step), waiting gradients are
  // released. REQUIRES: frozen.
  void ResetToStep(int64_t step);
  std::vector<int32_t> workers() const;

  // Mixture of experts (see the top): worker `worker_id`'s experts of `step`, n_layer *
  // num_experts bytes block-major (non-zero: got a token). INVALID_ARGUMENT for a job
  // without experts or a wrong size; FAILED_PRECONDITION for a step already committed.
  Status ReportExperts(int32_t worker_id, int64_t step, const std::vector<uint8_t>& touched);
  // AdamW steps each expert has had (n_layer * num_experts; empty without experts), for
  // checkpoints; set_expert_steps restores them on resume (REQUIRES: frozen or before
  // gradients flow; a wrong size is INVALID_ARGUMENT).
  std::vector<int64_t> expert_steps() const;
  Status set_expert_steps(std::vector<int64_t> steps);

 private:
  struct LayerState {
    int64_t step = 0;                         // step whose gradients it now collects
    std::map<int32_t, GradientRef> arrived;   // worker id -> gradient (sorted: reduce order)
    // Lock-free mode: gradients for later steps (<= step + staleness), step -> worker -> ref.
    std::map<int64_t, std::map<int32_t, GradientRef>> ahead;
    bool scheduled = false;                   // update of `step` queued or running
    double norm2 = -1;                        // reduced gradient's squared norm (clip)
    std::vector<float> reduced;               // global clip: sum over workers (numel)
    int64_t reduced_mb = 0;                   // micro-batches in `reduced`
    // Speculative update: `step` applied to master/m/v, waiting for the step's commit.
    bool applied = false;
    bool nonfinite = false;                   // a non-finite reduced gradient was seen
    float coef = 1.0f;                        // clip coefficient of the update (re-run)
    void* pending_out = nullptr;              // begun publish slot (BeginPublish)
    double busy_s = 0;                        // seconds of the applied update
    std::unique_ptr<float[]> undo;            // (3*numel) master, m, v before the update
    // Bounded undo: no undo copy; the update waits for the step's verdict (see top).
    bool deferred = false;
    bool deferred_launched = false;           // verdict was commit: its update is running
  };
  struct Impl;

  void MaybeScheduleLocked(int64_t layer) REQUIRES(mu_);
  void RunUpdate(int64_t layer, float clip_coef);
  Status RunOffloaded(OffloadedUpdater* updater, int64_t layer, const AdamWStepArgs& a,
                      const std::vector<StateSpan>& spans, const std::vector<const float*>& grads, float* undo,
                      char* out, std::atomic<bool>* nonfinite);
  void FinishUpdateLocked(int64_t layer, double seconds) REQUIRES(mu_);
  void LaunchLocked(int64_t layer, float clip_coef) REQUIRES(mu_);
  void LaunchAllGlobalLocked() REQUIRES(mu_);  // every layer's norm is in: launch all updates
  // Commits (or skips) the step when every layer applied it and its losses are in.
  void MaybeCommitLocked() REQUIRES(mu_);
  void CommitOrSkipLocked(int64_t step, const std::string& reason) REQUIRES(mu_);
  // Restores layer `l`'s master/m/v from its undo copy and publishes `version` with the
  // restored weights into the begun slot. REQUIRES: nothing runs on `l`.
  Status RestoreLayerLocked(int64_t l, int64_t version) REQUIRES(mu_);
  // Undoes every applied, uncommitted layer (ResetToStep: the step is abandoned).
  void UndoAppliedLocked() REQUIRES(mu_);  // REQUIRES: running_ == 0
  void NotifySkips() EXCLUDES(mu_);
  // Deferred layers: reduce the workers' gradients into ls.reduced, check them (the
  // kNorm task; also the global clip's norm). Ready: reduced and waiting for the verdict.
  bool DeferredReadyLocked(const LayerState& l) const REQUIRES(mu_) {
    // norm2 is -1 until checked, and NaN for a NaN gradient (which is checked: skip).
    return l.deferred && !l.applied && !l.reduced.empty() && !(l.norm2 < 0) && !l.deferred_launched;
  }
  bool global_clip() const { return job_.train.clip == ClipMode::kGlobal && job_.optim.grad_clip > 0; }

  // Set (release) at the end of the constructor, read (acquire) first thing in every
  // task: TBB orders construction before the tasks inside uninstrumented libtbb; this
  // makes the same order visible to ThreadSanitizer (scripts/tsan.sh).
  std::atomic<bool> constructed_{false};
  ParamStore* const store_;
  const JobConfig job_;
  std::vector<bool> offload_ GUARDED_BY(mu_);
  OffloadedUpdater* offloader_ GUARDED_BY(mu_) = nullptr;
  std::unique_ptr<Impl> impl_;  // the TBB graph

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Range {
    int64_t first, last;
  };
  std::map<int32_t, Range> members_ GUARDED_BY(mu_);  // id -> steps it contributes to
  bool IsMemberLocked(int32_t id, int64_t step) const REQUIRES(mu_);
  bool AnyMemberLocked(int64_t step) const REQUIRES(mu_);
  std::vector<LayerState> layers_ GUARDED_BY(mu_);
  int64_t completed_step_ GUARDED_BY(mu_) = 0;
  int64_t layers_done_in_step_ GUARDED_BY(mu_) = 0;
  int running_ GUARDED_BY(mu_) = 0;  // updates queued or running
  int holds_ GUARDED_BY(mu_) = 0;
  std::vector<int64_t> hold_at_ GUARDED_BY(mu_);  // HoldAt steps pending
  bool gate_closed_ GUARDED_BY(mu_) = false;
  std::vector<std::pair<int64_t, float>> deferred_ GUARDED_BY(mu_);  // (layer, coef) held by the gate
  int64_t norms_in_step_ GUARDED_BY(mu_) = 0;  // global clip: layers with norm ready
  std::chrono::steady_clock::time_point last_arrival_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_complete_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_applied_ GUARDED_BY(mu_);  // a layer's update applied
  std::map<int64_t, StepUpdateTimes> update_times_ GUARDED_BY(mu_);  // version published -> times
  double busy_s_ GUARDED_BY(mu_) = 0;
  PipelineStats stats_ GUARDED_BY(mu_);
  bool gate_on_losses_ GUARDED_BY(mu_) = false;
  std::map<int64_t, std::map<int32_t, double>> losses_ GUARDED_BY(mu_);  // step -> worker -> loss
  std::vector<SkipEvent> skip_events_ GUARDED_BY(mu_);  // to hand to on_skip_
  std::function<void(const SkipEvent&)> on_skip_ GUARDED_BY(mu_);
  Status failure_ GUARDED_BY(mu_);  // first fatal error
  std::function<void(const Status&)> on_failure_ GUARDED_BY(mu_);
  std::map<int64_t, std::vector<uint8_t>> experts_touched_ GUARDED_BY(mu_);  // step -> OR of reports
  std::vector<int64_t> expert_steps_ GUARDED_BY(mu_);                        // committed per-expert steps
  void FailUpdate(Status s) EXCLUDES(mu_);
  StepCoordinator* coordinator_ GUARDED_BY(mu_) = nullptr;
  int64_t verdict_posted_ GUARDED_BY(mu_) = -1;         // last step PostVerdict was sent for
  int64_t norms_posted_ GUARDED_BY(mu_) = -1;           // last step PostNorms was sent for
  std::map<int64_t, std::string> global_verdict_ GUARDED_BY(mu_);  // step -> the job's verdict
  std::map<int64_t, double> global_norm2_ GUARDED_BY(mu_);         // step -> the job's norm^2
};

}  // namespace l2l::eps
