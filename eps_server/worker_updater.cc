// The interleaved optimizer's daemon-side transport (see worker_updater.h).
#include "eps_server/worker_updater.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"

namespace l2l::eps {

WorkerUpdater::WorkerUpdater(WorkerUpdaterOptions opts) : opts_(std::move(opts)) {}

WorkerUpdater::~WorkerUpdater() { Stop(); }

Result<std::string> WorkerUpdater::AddWorker(int32_t id, const DeviceOffer& offer) {
  const size_t array_bytes = RoundUpTo(std::max<size_t>(opts_.max_layer_numel, 1) * sizeof(float), kShmAlign);
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return Aborted("the daemon is stopping");
    name = "/l2l-" + opts_.job_id + "-u" + std::to_string(id) +
           (generation_ > 0 ? "r" + std::to_string(generation_) : "");
    ++generation_;
  }
  L2L_ASSIGN_OR_RETURN(ShmSegment seg, ShmSegment::Create(name, 4 * array_bytes));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(id);
  if (it != workers_.end()) {
    if (it->second.task != nullptr) FailTaskLocked(it->second.task, "worker " + std::to_string(id) + " registered again", false);
    if (it->second.seg) {
      (void)it->second.seg->Unlink();
      retired_.push_back(std::move(it->second.seg));
    }
    workers_.erase(it);
  }
  Worker& w = workers_[id];
  w.id = id;
  w.offer = offer;
  w.seg = std::make_unique<ShmSegment>(std::move(seg));
  cv_.notify_all();
  return name;
}

void WorkerUpdater::RemoveWorker(int32_t id, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  if (it->second.task != nullptr) FailTaskLocked(it->second.task, why, false);
  if (it->second.seg) {
    (void)it->second.seg->Unlink();
    retired_.push_back(std::move(it->second.seg));
  }
  workers_.erase(it);
  cv_.notify_all();
}

int WorkerUpdater::eligible() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& [id, w] : workers_) n += w.eligible ? 1 : 0;
  return n;
}

void WorkerUpdater::FailTaskLocked(Task* t, const std::string& why, bool exclude) {
  if (t->state == TaskState::kDone || t->state == TaskState::kFailed) return;
  if (t->state == TaskState::kQueued) {
    queue_.erase(std::remove(queue_.begin(), queue_.end(), t), queue_.end());
  }
  if (t->worker >= 0) {
    auto it = workers_.find(t->worker);
    if (it != workers_.end() && it->second.task == t) {
      it->second.task = nullptr;
      if (exclude) {
        it->second.eligible = false;
        it->second.excluded_why = why;
      }
    }
  }
  t->state = TaskState::kFailed;
  t->why = why;
  cv_.notify_all();
}

Status WorkerUpdater::Fallback(Task* t, const std::string& why, const std::vector<DecayRange>& ranges) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.fallbacks;
    stats_.last_fallback_reason = why;
  }
  L2L_LOG_WARN("interleaved optimizer: the daemon updates layer {} (step {}) itself: {}", t->t.layer, t->t.step, why);
  CpuOffloadedUpdater cpu;
  return cpu.Update(t->t.layer, t->t.args, ranges, t->p, t->m, t->v, t->g, t->t.numel);
}

Status WorkerUpdater::Update(int64_t layer, const AdamWStepArgs& args, const std::vector<DecayRange>& ranges,
                             float* p, float* m, float* v, const float* grad_sum, size_t numel) {
  Task task;
  task.t.layer = layer;
  task.t.step = args.t - 1;
  task.t.numel = numel;
  task.t.args = args;
  task.t.ranges = ranges;
  task.p = p;
  task.m = m;
  task.v = v;
  task.g = grad_sum;
  for (const DecayRange& r : ranges) {
    if (r.begin > r.end || r.end > numel) return Internal("offloaded update: range outside the layer");
  }
  if (numel > opts_.max_layer_numel) {
    return Fallback(&task, "layer of " + std::to_string(numel) + " floats exceeds the exchange segments", ranges);
  }
  const auto deadline = std::chrono::steady_clock::now() + opts_.deadline;
  UniqueLock lock(mu_);
  int n = 0;
  for (const auto& [id, w] : workers_) n += w.eligible ? 1 : 0;
  if (stopped_ || n == 0) {
    const bool warn = !warned_none_ && !stopped_;
    warned_none_ = true;
    ++stats_.fallbacks;
    lock.unlock();
    if (warn) {
      L2L_LOG_WARN("interleaved optimizer: no worker takes updates (none offered its device over shm, or all were "
                   "excluded); the daemon updates the layers chosen for the devices itself");
    }
    CpuOffloadedUpdater cpu;
    return cpu.Update(layer, args, ranges, p, m, v, grad_sum, numel);
  }
  task.t.id = next_id_++;
  queue_.push_back(&task);
  cv_.notify_all();
  for (;;) {
    if (task.state == TaskState::kDone || task.state == TaskState::kFailed) break;
    if (stopped_) {
      FailTaskLocked(&task, "the daemon is stopping", false);
      continue;
    }
    // Copy-in reads p/m/v/g: never give up on a task while its inputs are being copied.
    if (task.state != TaskState::kCopyingIn && std::chrono::steady_clock::now() >= deadline) {
      const std::string who = task.worker >= 0 ? "worker " + std::to_string(task.worker) : "no worker";
      FailTaskLocked(&task,
                     who + " did not finish it within " + std::to_string(opts_.deadline.count()) +
                         " ms" + (task.worker >= 0 ? " (it gets no more updates)" : " took it"),
                     true);
      continue;
    }
    if (task.state == TaskState::kQueued) {
      // No eligible worker left (all excluded or removed while it waited): don't wait out the deadline.
      bool any = false;
      for (const auto& [id, w] : workers_) any = any || w.eligible;
      if (!any) {
        FailTaskLocked(&task, "no worker takes updates any more", false);
        continue;
      }
    }
    cv_.wait_until(lock.native(), std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200)));
  }
  // A task failed while Take still copies its inputs: let that read finish first.
  cv_.wait(lock.native(), [&] { return !task.copying; });
  if (task.state == TaskState::kFailed) {
    const std::string why = task.why;
    lock.unlock();
    return Fallback(&task, why, ranges);
  }
  // kDone: the worker finished and will not touch its segment until its next Take, which
  // waits for worker.task == nullptr (cleared below, after the copy-out). The segment
  // stays mapped even if the worker is removed meanwhile (retired_).
  const char* base = task.base;
  lock.unlock();
  std::memcpy(p, base + task.t.p_offset, numel * sizeof(float));
  std::memcpy(m, base + task.t.m_offset, numel * sizeof(float));
  std::memcpy(v, base + task.t.v_offset, numel * sizeof(float));
  lock.lock();
  auto it = workers_.find(task.worker);
  if (it != workers_.end() && it->second.task == &task) it->second.task = nullptr;
  ++stats_.on_worker;
  cv_.notify_all();
  return Status::Ok();
}

Result<UpdateTask> WorkerUpdater::Take(int32_t id, std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  UniqueLock lock(mu_);
  for (;;) {
    if (stopped_) return Aborted("the daemon is stopping");
    auto it = workers_.find(id);
    if (it == workers_.end()) {
      return FailedPrecondition("worker " + std::to_string(id) +
                                " takes no updates (it did not offer its device at Register, uses the grpc "
                                "transport, or was removed)");
    }
    Worker& w = it->second;
    if (!w.eligible) {
      return FailedPrecondition("worker " + std::to_string(id) + " is given no more updates: " + w.excluded_why);
    }
    if (w.task == nullptr && !queue_.empty()) {
      Task* t = queue_.front();
      queue_.pop_front();
      const size_t array_bytes = w.seg->size() / 4;
      t->t.segment = w.seg->name();
      t->t.p_offset = 0;
      t->t.m_offset = array_bytes;
      t->t.v_offset = 2 * array_bytes;
      t->t.g_offset = 3 * array_bytes;
      t->worker = id;
      t->state = TaskState::kCopyingIn;
      t->copying = true;
      w.task = t;
      char* base = static_cast<char*>(w.seg->data());
      t->base = base;
      const size_t bytes = t->t.numel * sizeof(float);
      lock.unlock();
      std::memcpy(base + t->t.p_offset, t->p, bytes);
      std::memcpy(base + t->t.m_offset, t->m, bytes);
      std::memcpy(base + t->t.v_offset, t->v, bytes);
      std::memcpy(base + t->t.g_offset, t->g, bytes);
      lock.lock();
      // A removal meanwhile marked it failed (Update waits for `copying` to clear before
      // it falls back); the worker's Done is then refused.
      if (t->state == TaskState::kCopyingIn) t->state = TaskState::kTaken;
      const bool taken = t->state == TaskState::kTaken;
      UpdateTask out = t->t;
      t->copying = false;  // after this, `t` may be gone (its Update returns)
      cv_.notify_all();
      if (!taken) return Aborted("the update task was taken back while it was copied in");
      return out;
    }
    if (std::chrono::steady_clock::now() >= until) return UpdateTask{};
    cv_.wait_until(lock.native(), until);
  }
}

Status WorkerUpdater::Done(int32_t id, uint64_t task_id, int64_t layer, int64_t numel, const std::string& error) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string who = "UpdateDone from worker " + std::to_string(id) + " for task " + std::to_string(task_id);
  auto it = workers_.find(id);
  if (it == workers_.end()) return NotFound(who + ": the worker takes no updates");
  Worker& w = it->second;
  Task* t = w.task;
  if (t == nullptr || t->state != TaskState::kTaken) {
    return NotFound(who + ": the worker holds no update task (its deadline passed and the daemon updated the layer "
                          "itself, or it never took one)");
  }
  if (t->t.id != task_id || t->t.layer != layer || static_cast<int64_t>(t->t.numel) != numel) {
    const std::string why = who + " (layer " + std::to_string(layer) + ", numel " + std::to_string(numel) +
                            ") does not match the task it holds (task " + std::to_string(t->t.id) + ", layer " +
                            std::to_string(t->t.layer) + ", numel " + std::to_string(t->t.numel) + ")";
    FailTaskLocked(t, why + "; the worker gets no more updates", true);
    return InvalidArgument(why);
  }
  if (!error.empty()) {
    FailTaskLocked(t, "worker " + std::to_string(id) + " failed the update: " + error, false);
    return Status::Ok();
  }
  t->state = TaskState::kDone;
  cv_.notify_all();
  return Status::Ok();
}

void WorkerUpdater::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

WorkerUpdater::Stats WorkerUpdater::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace l2l::eps
