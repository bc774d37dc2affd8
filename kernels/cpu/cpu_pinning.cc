// Optional arena thread pinning; see cpu_pinning.h.
#include "kernels/cpu/cpu_pinning.h"

#include <cerrno>
#include <cstring>

#include "common/env.h"
#include "common/logging.h"

namespace l2l::kernels {

std::unique_ptr<ThreadPinner> ThreadPinner::FromEnv(tbb::task_arena& arena) {
  const Result<bool> pin = EnvBool(EnvVar::kCpuPin);
  if (!pin.ok()) L2L_LOG_WARN("{}; threads stay unpinned", pin.status().message());
  if (!pin.ok() || !*pin) return nullptr;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    L2L_LOG_WARN("L2L_CPU_PIN=1: sched_getaffinity failed ({}); threads stay unpinned", std::strerror(errno));
    return nullptr;
  }
  std::vector<int> cores;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &mask)) cores.push_back(c);
  }
  if (cores.empty()) return nullptr;
  L2L_LOG_INFO("L2L_CPU_PIN=1: the CPU backend's TBB workers are pinned one per core over {} cores",
               cores.size());
  return std::unique_ptr<ThreadPinner>(new ThreadPinner(arena, std::move(cores), mask));
}

ThreadPinner::ThreadPinner(tbb::task_arena& arena, std::vector<int> cores, cpu_set_t process_mask)
    : tbb::task_scheduler_observer(arena), cores_(std::move(cores)), process_mask_(process_mask) {
  observe(true);
}

ThreadPinner::~ThreadPinner() { observe(false); }

void ThreadPinner::on_scheduler_entry(bool is_worker) {
  if (!is_worker) return;
  const int slot = tbb::this_task_arena::current_thread_index();
  if (slot < 0) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cores_[static_cast<size_t>(slot) % cores_.size()], &one);
  sched_setaffinity(0, sizeof(one), &one);  // best effort: a failure leaves it unpinned
}

void ThreadPinner::on_scheduler_exit(bool is_worker) {
  if (!is_worker) return;
  sched_setaffinity(0, sizeof(process_mask_), &process_mask_);
}

}  // namespace l2l::kernels
