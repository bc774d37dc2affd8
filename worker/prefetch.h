// The relay's two background copy engines:
//  * LayerPrefetcher brings layers IN: it walks a step's fetch schedule (the order in which
//    the relay will use layers) ahead of the compute thread, acquiring each layer from the
//    EPS, converting it to fp32 (bf16/f16 publish dtypes) into a free device slot and
//    releasing the EPS's view at once. A layer is therefore resident before the relay asks
//    for it (layer l+1 arrives while layer l computes: double buffering).
//  * GradientPusher sends layer gradients OUT: the relay hands over layer l's accumulated
//    gradient and goes on with layer l-1 while a background thread pushes it to the EPS.
//
// Both are structured as the CUDA backend will drive them: the background thread plays the
// copy stream, "slot ready" / "push done" play CUDA events the compute stream waits on.
// On the CPU backend device memory is host memory, so the prefetch thread writes the slot
// directly and the pusher reads the gradient buffer directly (zero staging copies). On any
// other backend the thread stages in host memory and the compute thread issues the
// host<->device copy (the Backend is single-threaded; a copy-stream API replaces this when
// the CUDA backend lands).
//
// Slots: slot 0 holds layer 0 (the embedding, usually the largest layer, which the head
// also reads when embeddings are tied); `ring_slots` slots sized for the largest other
// layer are shared by every other layer.
//
// Thread-safety: Begin/Next/Release/Cancel (and Submit/Wait/WaitAll) are called by one
// thread, the relay's compute thread; each class owns one internal background thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"
#include "worker/eps_client.h"

namespace l2l::worker {

// A layer resident on the device, handed out by LayerPrefetcher::Next().
struct ResidentLayer {
  int64_t layer = -1;
  const float* params = nullptr;  // (numel) fp32, backend memory; valid until Release()
  size_t numel = 0;
  int64_t version = -1;           // the EPS version it was acquired at
  int slot = -1;
};

class LayerPrefetcher {
 public:
  // layer_numel[l]: floats in layer l's flat buffer. ring_slots >= 2 for overlap.
  static Result<std::unique_ptr<LayerPrefetcher>> Create(EpsClient* client,
                                                         kernels::Backend* backend,
                                                         std::vector<size_t> layer_numel,
                                                         int ring_slots = 2);
  ~LayerPrefetcher();
  LayerPrefetcher(const LayerPrefetcher&) = delete;
  LayerPrefetcher& operator=(const LayerPrefetcher&) = delete;

  // Starts fetching `schedule` (layer ids in the order Next() will return them), each at
  // a version >= min_version, failing an acquire after `timeout`.
  // REQUIRES: every item of the previous schedule was returned by Next() and Released,
  // or Cancel() was called; layer 0 appears again only after its earlier entry is released.
  void Begin(std::vector<int64_t> schedule, int64_t min_version, std::chrono::milliseconds timeout);
  // Blocks until the next scheduled layer is resident and returns it; *waited_s receives
  // the seconds spent blocked (the "waiting for layers" time). Returns the acquire's error
  // when the fetch failed; the rest of the schedule is then dropped.
  Result<ResidentLayer> Next(double* waited_s);
  void Release(const ResidentLayer& r);
  // Drops the rest of the schedule, waits for an in-flight fetch, frees every slot
  // (pointers from Next() are invalid afterwards).
  void Cancel();

  size_t device_bytes() const;

 private:
  enum class ItemState { kPending, kReady, kFailed };
  struct Item {
    int64_t layer = -1;
    ItemState state = ItemState::kPending;
    int slot = -1;
    int64_t version = -1;
    Status status;
  };
  struct Slot {
    kernels::DeviceBuffer device;  // (capacity) fp32
    std::vector<float> staging;    // host copy for non-CPU backends
    size_t capacity = 0;
    bool free = true;
  };

  LayerPrefetcher(EpsClient* client, kernels::Backend* backend, std::vector<size_t> layer_numel)
      : client_(client), backend_(backend), layer_numel_(std::move(layer_numel)) {}
  void Loop();
  int FreeSlotFor(int64_t layer) const;  // REQUIRES: mu_ held; -1 when none
  // Acquires `layer`, converts it into slot `slot`, releases it. Returns the version.
  Result<int64_t> Fetch(int64_t layer, int64_t min_version, std::chrono::milliseconds timeout,
                        int slot);

  EpsClient* client_;
  kernels::Backend* backend_;
  const std::vector<size_t> layer_numel_;
  bool direct_ = false;  // backend memory is host memory: write slots from the thread

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;      // GUARDED_BY(mu_) (free flags; buffers fixed after Create)
  std::vector<Item> items_;      // GUARDED_BY(mu_)
  size_t fetch_idx_ = 0;         // GUARDED_BY(mu_) next item the thread fetches
  size_t take_idx_ = 0;          // GUARDED_BY(mu_) next item Next() returns
  int64_t min_version_ = 0;      // GUARDED_BY(mu_)
  std::chrono::milliseconds timeout_{0};  // GUARDED_BY(mu_)
  bool in_flight_ = false;       // GUARDED_BY(mu_)
  bool stop_ = false;            // GUARDED_BY(mu_)
  std::thread thread_;
};

class GradientPusher {
 public:
  // max_numel: the largest gradient that will be submitted.
  static Result<std::unique_ptr<GradientPusher>> Create(EpsClient* client, kernels::Backend* backend,
                                                        size_t max_numel);
  ~GradientPusher();
  GradientPusher(const GradientPusher&) = delete;
  GradientPusher& operator=(const GradientPusher&) = delete;

  // Queues the push of `grad` (backend memory, numel floats) as layer `layer`'s gradient
  // for `step`, summed over `micro_batches`. Returns a ticket for Wait().
  // On the CPU backend the thread reads `grad` itself: do not modify it before
  // Wait(ticket). Elsewhere it is copied to a host staging buffer first (may block until
  // an earlier push frees one, the time counted in *waited_s) and may be reused at once.
  Result<int64_t> Submit(int64_t layer, int64_t step, int64_t micro_batches, const float* grad,
                         size_t numel, double* waited_s);
  // Blocks until push `ticket` has been handed to the EPS. Returns the first push error.
  Status Wait(int64_t ticket, double* waited_s);
  Status WaitAll(double* waited_s);

 private:
  struct Job {
    int64_t ticket, layer, step, micro_batches;
    const float* host_grad;
    size_t numel;
  };
  GradientPusher(EpsClient* client, kernels::Backend* backend) : client_(client), backend_(backend) {}
  void Loop();

  EpsClient* client_;
  kernels::Backend* backend_;
  bool direct_ = false;
  std::vector<std::vector<float>> staging_;  // non-CPU backends: 2 host buffers

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;       // GUARDED_BY(mu_)
  int64_t next_ticket_ = 0;     // GUARDED_BY(mu_)
  int64_t done_ = 0;            // GUARDED_BY(mu_) tickets < done_ are finished
  Status first_error_;          // GUARDED_BY(mu_)
  bool stop_ = false;           // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace l2l::worker
