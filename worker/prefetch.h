// The relay's two background copy engines:
//  * LayerPrefetcher brings layers IN: it walks a step's fetch schedule (the order in which
//    the relay will use layers) ahead of the compute thread, acquiring each layer from the
//    EPS, converting it to fp32 (bf16/f16 publish dtypes) into a free device slot and
//    releasing the EPS's view at once. A layer is therefore resident before the relay asks
//    for it (layer l+1 arrives while layer l computes: double buffering).
//  * GradientPusher sends layer gradients OUT: the relay hands over layer l's accumulated
//    gradient and goes on with layer l-1 while a background thread pushes it to the EPS.
//
// Three ways to move the bytes, chosen from the backend at Create:
//  * direct (the CPU backend: device memory is host memory): the prefetch thread converts
//    straight into the slot, the pusher reads the gradient buffer in place (no copies).
//  * async (a backend with copy queues, kernels/backend.h: CUDA): each engine owns a copy
//    queue (a CUDA stream beside the compute stream). The prefetch thread copies the layer
//    AS PUBLISHED (bf16 or fp32) host-to-device into the slot, widens bf16 to fp32 on the
//    device, records the slot's "ready" event and waits for it, then releases the EPS's
//    view; Next() makes the compute stream wait on "ready" and Release() records the
//    slot's "free" event on the compute stream, which the next copy into that slot waits
//    for (no compute kernel can still be reading a slot that is overwritten). The source
//    is the EPS's shared memory itself when a HostRegionPinner page-locked it (DMA
//    straight out of the published segment); otherwise (gRPC buffers, a failed pin) the
//    thread first copies it into a pinned bounce buffer. The pusher records a "gradient
//    ready" event on the compute stream at Submit; its thread makes the copy queue wait on
//    it, copies the fp32 gradient device-to-host straight into a claimed gradient slot of
//    the shm segment (EpsClient::ClaimGradientSlot, when the segment is page-locked) or
//    into a pinned staging buffer, waits for that copy's event, and only then publishes
//    the slot / pushes (the completion wait is on the pusher's own thread: no CUDA call
//    runs inside a stream callback).
//  * staged (a backend without copy queues that is not the CPU): host staging buffers and
//    synchronous Backend copies issued by the compute thread.
// A layer published as bf16 and widened on the device keeps its bf16 copy in the slot
// while it is resident: Next() notes it to the backend (Backend::NoteBf16Copy) and
// Release() forgets it, so a bf16-mode GEMM reads the weights as they arrived instead of
// casting the fp32 slot back to bf16 at every use (forward, recompute, backward, and
// every chunk of the LM head).
//
// In a device group (worker/device_group.h; several GPUs of one process, data parallel),
// each engine also holds a GroupRank: its rank r of n and its own communicator. The
// prefetcher copies only elements [r*s, min((r+1)*s, numel)) of each layer (s =
// ceil(numel / n), the shard) into its slot, as published, and an in-place all-gather on
// its copy queue fills the rest from the other devices (bf16 is gathered before widening:
// half the bytes); the pusher reduce-scatters the gradient in place on its copy queue
// (the buffer holds n*s floats) and copies only its summed shard out, to the group's
// GradientShardSink, which hands the whole layer to the EPS once. Every rank walks the
// same schedule and pushes the same layers in the same order, so the collectives match.
//
// Slots: slot 0 holds layer 0 (the embedding, usually the largest layer, which the head
// also reads when embeddings are tied); `ring_slots` slots sized for the largest other
// layer are shared by every other layer.
//
// Thread-safety: Begin/Next/Release/Cancel (and Submit/Wait/WaitAll) are called by one
// thread, the relay's compute thread (the only one using the Backend); each class owns
// one internal background thread, which uses only its copy queue and events.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "common/lora_frozen.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "worker/eps_client.h"
#include "worker/host_pinner.h"

namespace l2l::worker {

// Where a device group's pushers put their reduced gradient shards (the group of
// worker/device_group.h). Called from each rank's pusher thread, for every (step, layer)
// once per rank: ShardBuffer, then (after the rank's shard is written) ShardDone.
class GradientShardSink {
 public:
  virtual ~GradientShardSink() = default;
  // The host buffer of layer `layer`'s whole summed gradient for `step` (numel floats,
  // the same for every rank: an EPS gradient slot when the transport has them, so a
  // page-locked one takes each device's shard straight by DMA). May block until the EPS
  // frees a slot.
  virtual Result<float*> ShardBuffer(int64_t layer, int64_t step, size_t numel) = 0;
  // This rank's shard is in the buffer; micro_batches: this rank's. After the last
  // rank's, the whole layer goes to the EPS once. ok=false: the shard was not written
  // (the rank failed); the buffer is abandoned.
  virtual Status ShardDone(int64_t layer, int64_t step, int64_t micro_batches, bool ok) = 0;
};

// One engine's place in a device group (see the header comment). Inactive (the single
// device path) unless collective is set and size > 1.
struct GroupRank {
  int rank = 0;
  int size = 1;
  kernels::DeviceCollective* collective = nullptr;  // this engine's own communicator
  GradientShardSink* sink = nullptr;                // the pusher's (required when active)
  bool active() const { return collective != nullptr && size > 1; }
};
// ceil(numel / size): the elements each rank moves; size * that: the padded buffer.
inline size_t GroupShardNumel(size_t numel, int size) {
  return (numel + static_cast<size_t>(size) - 1) / static_cast<size_t>(size);
}
inline size_t GroupPaddedNumel(size_t numel, int size) {
  return GroupShardNumel(numel, size) * static_cast<size_t>(size);
}

// A layer resident on the device, handed out by LayerPrefetcher::Next().
struct ResidentLayer {
  int64_t layer = -1;
  const float* params = nullptr;  // (numel) fp32, backend memory; valid until Release()
  size_t numel = 0;
  int64_t version = -1;           // the EPS version it was acquired at
  int slot = -1;
};

// How an engine moves bytes (see the header comment).
enum class CopyMode { kDirect, kAsync, kStaged };
const char* CopyModeName(CopyMode m);

class LayerPrefetcher {
 public:
  // layer_numel[l]: floats in layer l's flat buffer. ring_slots >= 2 for overlap.
  // fetch_dtype: the dtype the EPS publishes (job.publish_dtype); the async mode keeps a
  // device buffer per slot for it when it is narrower than fp32 (another dtype still
  // works, widened on the host). pinner (may be null): which host memory is page-locked.
  // frozen (a LoRA job; empty otherwise): each layer's PlanFrozenBase. A layer with a
  // frozen record arrives as the record + its trainable span (LayerWeights::frozen); the
  // record is copied as is and decoded into the slot's fp32 buffer where it lands (bf16
  // widened, NF4 / Q8_0 blocks dequantized: kernels/backend.h CopyQueue::DequantizeBlocks
  // in async mode, common/lora_frozen.h DecodeFrozen on the host otherwise), so the slot
  // holds the whole layer in fp32 as for any other job. Device memory: each slot keeps
  // one more buffer, the largest record it receives (0.56 B per quantized parameter).
  static Result<std::unique_ptr<LayerPrefetcher>> Create(EpsClient* client,
                                                         kernels::Backend* backend,
                                                         std::vector<size_t> layer_numel,
                                                         int ring_slots = 2,
                                                         DType fetch_dtype = DType::kF32,
                                                         const HostRegionPinner* pinner = nullptr,
                                                         GroupRank group = {},
                                                         std::vector<FrozenPlan> frozen = {});
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
  CopyMode mode() const { return mode_; }
  // Async mode: layers copied straight from page-locked EPS memory / through the bounce
  // buffer since creation.
  int64_t pinned_fetches() const { return pinned_fetches_.load(); }
  int64_t bounced_fetches() const { return bounced_fetches_.load(); }

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
    std::vector<float> staging;    // staged mode: host copy
    kernels::DeviceBuffer narrow;  // async mode, fetch_dtype narrower than fp32: (capacity) of it
    kernels::DeviceBuffer frozen;  // async mode, a LoRA job: the largest frozen record (bytes)
    std::vector<uint16_t> bits;    // direct mode, bf16 published, a backend that takes bf16 copies
    std::unique_ptr<kernels::Event> ready;  // async: recorded on the copy queue after the fill
    std::unique_ptr<kernels::Event> freed;  // async: recorded on the compute stream at Release
    size_t capacity = 0;
    bool free = true;
    // `narrow` (async mode) or `bits` (direct mode) holds the whole resident layer as
    // published bf16 (written by the prefetch thread with the fill, read by Next() after
    // the item is ready): Next() notes it to the backend (Backend::NoteBf16Copy),
    // Release() forgets it.
    bool narrow_is_bf16_layer = false;
  };

  LayerPrefetcher(EpsClient* client, kernels::Backend* backend, std::vector<size_t> layer_numel,
                  DType fetch_dtype, const HostRegionPinner* pinner, GroupRank group)
      : client_(client), backend_(backend), layer_numel_(std::move(layer_numel)),
        fetch_dtype_(fetch_dtype), pinner_(pinner), group_(group) {}
  void Loop();
  int FreeSlotFor(int64_t layer) const;  // REQUIRES: mu_ held; -1 when none
  // Acquires `layer`, converts it into slot `slot`, releases it. Returns the version.
  Result<int64_t> Fetch(int64_t layer, int64_t min_version, std::chrono::milliseconds timeout,
                        int slot);
  // Async mode's part of Fetch: queues the copy (and widening) of `w` into `s`, waits for
  // it. Releases the EPS's view itself (as soon as the bytes are no longer read).
  Status FetchAsync(int64_t layer, const LayerWeights& w, Slot& s);
  // The same for a layer with a frozen record (plan.bytes > 0).
  Status FetchAsyncFrozen(int64_t layer, const LayerWeights& w, const FrozenPlan& plan, Slot& s);
  // Both fetches' end: records "ready" after the queued copies, waits for it, releases the
  // EPS's view when still held; `queued` is the queueing's status ("what layer N" names it).
  Status CompleteFetch(int64_t layer, Slot& s, bool held, const Status& queued, const char* what);

  EpsClient* client_;
  kernels::Backend* backend_;
  const std::vector<size_t> layer_numel_;
  std::vector<FrozenPlan> frozen_;  // by layer; empty: no LoRA job (fixed after Create)
  const DType fetch_dtype_;
  const HostRegionPinner* pinner_;
  const GroupRank group_;
  CopyMode mode_ = CopyMode::kStaged;
  bool direct_ = false;  // backend memory is host memory: write slots from the thread
  // Async mode (used only by the prefetch thread, fixed after Create):
  kernels::HostBuffer bounce_;  // pinned, largest layer x 4 bytes
  std::atomic<int64_t> pinned_fetches_{0}, bounced_fetches_{0};

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
  // Declared after the slots: destroyed first, waiting for copies into them.
  std::unique_ptr<kernels::CopyQueue> copy_;
  std::thread thread_;
};

class GradientPusher {
 public:
  // max_numel: the largest gradient that will be submitted. pinner (may be null): which
  // host memory is page-locked (the shm gradient segment). An active group needs the
  // async mode and a sink; Submit's grad buffer must then hold GroupPaddedNumel(numel)
  // floats, and the reduce-scatter overwrites it (it is the relay's until Wait anyway).
  static Result<std::unique_ptr<GradientPusher>> Create(EpsClient* client, kernels::Backend* backend,
                                                        size_t max_numel,
                                                        const HostRegionPinner* pinner = nullptr,
                                                        GroupRank group = {});
  ~GradientPusher();
  GradientPusher(const GradientPusher&) = delete;
  GradientPusher& operator=(const GradientPusher&) = delete;

  // Queues the push of `grad` (backend memory, numel floats) as layer `layer`'s gradient
  // for `step`, summed over `micro_batches`, once the compute work queued so far (which
  // writes it) is done. Returns a ticket for Wait().
  // Direct and async modes read `grad` later, from the pusher's thread or copy queue: do
  // not modify it before Wait(ticket). Staged mode copies it to a host staging buffer
  // first (may block until an earlier push frees one, the time counted in *waited_s).
  Result<int64_t> Submit(int64_t layer, int64_t step, int64_t micro_batches, const float* grad,
                         size_t numel, double* waited_s);
  // Blocks until push `ticket` has been handed to the EPS. Returns the first push error.
  Status Wait(int64_t ticket, double* waited_s);
  Status WaitAll(double* waited_s);
  // After a failed step, once WaitAll returned: forgets the first push error, so the step
  // redone after a rejoin pushes again (the error would otherwise skip every later push).
  void ClearError();

  CopyMode mode() const { return mode_; }
  // Async mode: gradients DMA'd straight into a page-locked shm slot / through staging.
  int64_t slot_pushes() const { return slot_pushes_.load(); }
  int64_t staged_pushes() const { return staged_pushes_.load(); }

 private:
  struct Job {
    int64_t ticket, layer, step, micro_batches;
    const float* grad;     // host memory (direct, staged) or device memory (async)
    size_t numel;
    kernels::Event* ready;  // async: recorded on the compute stream at Submit
  };
  GradientPusher(EpsClient* client, kernels::Backend* backend, const HostRegionPinner* pinner,
                 GroupRank group)
      : client_(client), backend_(backend), pinner_(pinner), group_(group) {}
  void Loop();
  Status PushAsync(const Job& job);  // async mode, on the pusher's thread
  Status PushGroupShard(const Job& job);  // async mode in an active group

  EpsClient* client_;
  kernels::Backend* backend_;
  const HostRegionPinner* pinner_;
  const GroupRank group_;
  CopyMode mode_ = CopyMode::kStaged;
  bool direct_ = false;
  std::vector<std::vector<float>> staging_;  // staged mode: 2 host buffers
  // Async mode: the pusher thread's pinned staging buffer and copy-done event; the
  // compute thread's pool of "gradient ready" events (reused once their job finished).
  kernels::HostBuffer pinned_staging_;
  std::unique_ptr<kernels::Event> copied_;
  std::vector<std::unique_ptr<kernels::Event>> events_;  // compute thread only
  std::vector<kernels::Event*> free_events_;              // GUARDED_BY(mu_)
  std::atomic<int64_t> slot_pushes_{0}, staged_pushes_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;       // GUARDED_BY(mu_)
  int64_t next_ticket_ = 0;     // GUARDED_BY(mu_)
  int64_t done_ = 0;            // GUARDED_BY(mu_) tickets < done_ are finished
  Status first_error_;          // GUARDED_BY(mu_)
  bool stop_ = false;           // GUARDED_BY(mu_)
  std::unique_ptr<kernels::CopyQueue> copy_;  // async mode
  std::thread thread_;
};

}  // namespace l2l::worker
