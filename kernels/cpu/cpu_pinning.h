// ThreadPinner: optional pinning of a CPU backend's TBB arena threads to cores.
//
// The CPU backend runs every op in one TBB arena and oneDNN single-threaded inside its
// tasks (cpu_matmul.h), so there is one thread pool and nothing for an OpenMP pool to
// fight with; pinning is then only about the kernel scheduler moving arena threads
// between cores (cache refills). With L2L_CPU_PIN=1 each TBB worker thread that joins
// the arena is bound to one core of the process's allowed set, slot k to the k-th core,
// and gets the process's mask back when it leaves; the thread that calls into the arena
// (the worker's compute thread, slot 0) is not pinned, because it also runs the relay's
// bookkeeping between ops. Off by default: docs/performance.md "Thread pinning" has the
// measurement (no gain on the 2-core VM this was measured on).
//
// Ownership: observes an arena it does not own; destroy it before the arena.
// Thread-safety: TBB calls the hooks from the joining threads; they touch only the
// calling thread's affinity and read immutable state.
#pragma once

#include <sched.h>

#include <memory>
#include <vector>

#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

namespace l2l::kernels {

class ThreadPinner final : public tbb::task_scheduler_observer {
 public:
  // Returns nullptr unless L2L_CPU_PIN=1 (then it observes `arena`).
  static std::unique_ptr<ThreadPinner> FromEnv(tbb::task_arena& arena);
  ~ThreadPinner() override;

  void on_scheduler_entry(bool is_worker) override;
  void on_scheduler_exit(bool is_worker) override;

 private:
  ThreadPinner(tbb::task_arena& arena, std::vector<int> cores, cpu_set_t process_mask);
  const std::vector<int> cores_;  // the allowed cores, in order
  const cpu_set_t process_mask_;
};

}  // namespace l2l::kernels
