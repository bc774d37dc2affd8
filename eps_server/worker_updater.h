// WorkerUpdater: the interleaved optimizer's transport on the daemon side. An
// OffloadedUpdater (update_pipeline.h) that hands a layer's AdamW update to a worker's
// device and waits for the result, falling back to the daemon's own CPU update whenever
// the worker cannot deliver.
//
// Pull model (the daemon never dials a worker): a worker that offered its device at
// Register (and uses the shm transport) long-polls Take(); Update() queues a task and
// the first polling worker takes it. Take copies p, m, v and the summed gradient into
// that worker's exchange segment (POSIX shm, created here per worker, mode 0600:
// header-less, four arrays of max_layer_numel fp32 at fixed offsets) and returns the
// task; the worker updates p, m, v in place and calls Done(); Update() then copies
// p, m, v back out of the segment into the pipeline's buffers. A worker holds one task
// at a time and only touches its segment between Take and Done, so a task is copied
// in only when the worker asks for it (its previous one is over).
//
// Safety: the pipeline's buffers (p, m, v) are written only by Update() itself, either
// from the segment after a valid Done or by the CPU fallback (CpuOffloadedUpdater) from
// the untouched inputs. The fallback runs, and is logged with its reason, when no
// worker takes updates, the deadline passes (queued or held), the holding worker is
// removed (lost, left, re-registered) or reports an error, or a Done does not match the
// task it holds (wrong id, layer or numel). A worker that missed a deadline or sent a
// wrong Done is given no more tasks (Take fails FAILED_PRECONDITION) until it registers
// again; its late writes land in its own segment, which nothing reads any more.
//
// Ownership: owns the exchange segments (unlinked when a worker is removed, unmapped at
// destruction). Thread-safety: every method is thread-safe; Update blocks its caller (a
// pipeline task) until the result or the fallback is in.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/adamw.h"
#include "common/shm.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "eps_server/update_pipeline.h"

namespace l2l::eps {

// What a worker reported about its device at Register (proto OptimizerDevice).
struct DeviceOffer {
  bool takes_updates = false;
  std::string device;
  double update_params_per_s = 0;
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;  // 0 = no link (CPU backend)
};

// One task as Take hands it out (the TakeUpdate reply).
struct UpdateTask {
  uint64_t id = 0;
  int64_t layer = 0, step = 0;  // step = args.t - 1
  size_t numel = 0;
  std::string segment;
  size_t p_offset = 0, m_offset = 0, v_offset = 0, g_offset = 0;  // bytes
  AdamWStepArgs args;  // weight_decay for the ranges with decay (WithDecay)
  std::vector<DecayRange> ranges;
};

struct WorkerUpdaterOptions {
  std::string job_id = "job";      // names the segments /l2l-<job_id>-u<worker>[r<n>]
  size_t max_layer_numel = 0;      // segment arrays hold this many floats
  // A task not answered this long after it was queued goes back to the daemon's CPU.
  std::chrono::milliseconds deadline{30000};
};

class WorkerUpdater : public OffloadedUpdater {
 public:
  explicit WorkerUpdater(WorkerUpdaterOptions opts);
  ~WorkerUpdater() override;  // Stop()

  // Worker `id` takes updates from now on: a fresh exchange segment (replacing any
  // earlier one of that id, whose task then falls back). Returns its name.
  Result<std::string> AddWorker(int32_t id, const DeviceOffer& offer);
  // Worker `id` takes no more updates: a task it holds falls back now with `why`.
  void RemoveWorker(int32_t id, const std::string& why);
  // Workers that take updates now.
  int eligible() const;

  // The pipeline's call (OffloadedUpdater): see the header comment.
  Status Update(int64_t layer, const AdamWStepArgs& args, const std::vector<DecayRange>& ranges, float* p,
                float* m, float* v, const float* grad_sum, size_t numel) override;

  // TakeUpdate: waits up to `wait` for a task for worker `id`. std::nullopt-like empty
  // task (id 0) when the wait ran out. FAILED_PRECONDITION when the worker does not take
  // updates; ABORTED after Stop.
  Result<UpdateTask> Take(int32_t id, std::chrono::milliseconds wait);
  // UpdateDone. error non-empty: the worker failed the update (fallback).
  Status Done(int32_t id, uint64_t task_id, int64_t layer, int64_t numel, const std::string& error);

  // Every waiting Update falls back now; Take fails ABORTED. Idempotent.
  void Stop();

  // Counters for tests and logs.
  struct Stats {
    int64_t on_worker = 0;   // updates a worker ran
    int64_t fallbacks = 0;   // updates the daemon ran instead (no worker, or taken back)
    std::string last_fallback_reason;  // why the last task handed out was taken back
  };
  Stats stats() const;

 private:
  enum class TaskState { kQueued, kCopyingIn, kTaken, kDone, kFailed };
  struct Task {
    UpdateTask t;
    float *p = nullptr, *m = nullptr, *v = nullptr;
    const float* g = nullptr;
    TaskState state = TaskState::kQueued;
    int32_t worker = -1;
    bool copying = false;  // Take is reading p/m/v/g into the segment
    // The holding worker's segment mapping (stays mapped until destruction, retired or not).
    char* base = nullptr;
    std::string why;  // kFailed: the reason
  };
  struct Worker {
    int32_t id = -1;
    DeviceOffer offer;
    std::unique_ptr<ShmSegment> seg;
    bool eligible = true;
    std::string excluded_why;
    Task* task = nullptr;  // the task it holds (kCopyingIn .. kDone)
  };
  // Fails `t` (held or queued) with `why`; excludes the worker holding it when exclude.
  void FailTaskLocked(Task* t, const std::string& why, bool exclude) REQUIRES(mu_);
  Status Fallback(Task* t, const std::string& why, const std::vector<DecayRange>& ranges);

  const WorkerUpdaterOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // task queued / state changed / worker changed
  std::map<int32_t, Worker> workers_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<ShmSegment>> retired_ GUARDED_BY(mu_);  // unlinked, mapped until destruction
  std::deque<Task*> queue_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  int generation_ GUARDED_BY(mu_) = 0;
  bool stopped_ GUARDED_BY(mu_) = false;
  bool warned_none_ GUARDED_BY(mu_) = false;
  Stats stats_ GUARDED_BY(mu_);
};

}  // namespace l2l::eps
