// Stash: the layer outputs the relay keeps between its forward and backward passes
// (only each layer's output survives, to bound memory; the backward recomputes
// everything else from it). Slot s holds the output of layer s (embedding = 0, block i =
// i+1) for every micro-batch u, each (B,T,C).
//
// Element type (`train.stash_dtype`): f32 keeps the outputs as computed. bf16 rounds each
// one to bf16 (round to nearest even) at Commit(): the output tensor itself is rounded in
// place (so whatever reads it sees what Load() will return) and the stash keeps the bf16
// bits, half the bytes: half the device memory (kDevice), half the host memory and the
// PCIe traffic (kHost; the copies move bf16, widened back to fp32 on the device, on the
// copy queue when there is one). With bf16 every placement hands out staging tensors, as
// kHost does: Load() widens into one, OutputBuffer() is another, and the pointer rules
// below are kHost's.
//
// Placement (`train.stash`):
//  * kDevice: the outputs live in backend memory; the layer writes straight into the
//    stash and the backward reads straight from it (no copies). Device memory grows with
//    depth: slots x micro_batches x B*T*C floats.
//  * kHost: the outputs live in host memory (Backend::AllocHost: page-locked on a GPU
//    worker, or pageable with a warning when page-locked memory runs out; plain aligned
//    host memory on the CPU backend, where "device" memory is host memory too). The layer writes into a device staging tensor, Commit() offloads it,
//    Load() brings it back. Device memory is a few (B,T,C) tensors whatever the depth.
//    On a backend with copy queues (CUDA) the copies are asynchronous, on a copy queue of
//    the stash's own, with two staging tensors each way: Commit() records an event on the
//    compute stream and queues the device-to-host copy after it; the next OutputBuffer()
//    on that tensor makes the compute stream wait until that copy is done. Load() queues
//    the host-to-device copy (after the compute work that read that staging tensor two
//    Loads ago) and makes the compute stream wait for it. Nothing blocks the host; the
//    copy of one micro-batch overlaps the compute of its neighbour. Without copy queues
//    (the CPU) the copies are the Backend's synchronous ones, as before.
//
// Usage per (layer, micro-batch) in the forward:
//   const float* in = stash.Load(l-1, u);  float* out = stash.OutputBuffer(l, u);
//   ...compute out from in...;  stash.Commit(l, u);
// Load() and OutputBuffer() use different staging tensors, so one of each may be live at
// once; a second Load() invalidates the pointer from the first (host placement), and a
// second OutputBuffer() the one from the first once it was committed.
//
// Ownership: the Stash owns all its buffers; returned pointers stay valid until the next
// Load()/OutputBuffer() call (host) or the Stash's destruction (device). The destructor
// waits for queued copies.
// Thread-safety: one thread (the relay's compute thread), like the Backend it uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "common/modes.h"  // StashPlacement, RecomputeMode
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"

namespace l2l::worker {

class Stash {
 public:
  // slots: layer outputs kept (n_layer + 1); floats: B*T*C per micro-batch; dtype: the
  // stored element type, f32 or bf16 (INVALID_ARGUMENT otherwise).
  static Result<std::unique_ptr<Stash>> Create(kernels::Backend* backend, StashPlacement placement,
                                               int64_t slots, int64_t micro_batches, size_t floats,
                                               DType dtype = DType::kF32);
  ~Stash();
  Stash(const Stash&) = delete;
  Stash& operator=(const Stash&) = delete;

  // Device tensor (B,T,C) the forward of layer `slot`, micro-batch `u` writes into.
  float* OutputBuffer(int64_t slot, int64_t u);
  // Makes the tensor written into OutputBuffer(slot, u) the stashed value.
  void Commit(int64_t slot, int64_t u);
  // Device tensor (B,T,C) holding the stashed output of layer `slot`, micro-batch `u`.
  const float* Load(int64_t slot, int64_t u);

  StashPlacement placement() const { return placement_; }
  DType dtype() const { return dtype_; }
  bool async() const { return copy_ != nullptr; }  // host placement on copy queues
  size_t device_bytes() const;  // backend memory held
  size_t host_bytes() const;    // host memory held (kHost only)
  // Bytes moved between host and device since creation (kHost only).
  size_t bytes_offloaded() const { return bytes_offloaded_; }
  size_t bytes_reloaded() const { return bytes_reloaded_; }

 private:
  Stash(kernels::Backend* backend, StashPlacement placement, int64_t slots, int64_t micro_batches,
        size_t floats, DType dtype)
      : backend_(backend), placement_(placement), dtype_(dtype), slots_(slots),
        micro_batches_(micro_batches), floats_(floats) {}
  size_t Index(int64_t slot, int64_t u) const;  // element index of (slot, u)
  bool bf16() const { return dtype_ == DType::kBF16; }
  size_t elem_bytes() const { return bf16() ? sizeof(uint16_t) : sizeof(float); }
  size_t tensor_bytes() const { return floats_ * elem_bytes(); }  // one stored (B,T,C)
  void* Host(size_t i) const { return static_cast<char*>(host_.data()) + i * elem_bytes(); }
  uint16_t* DeviceBits(size_t i) const { return static_cast<uint16_t*>(device_.data()) + i; }

  kernels::Backend* backend_;
  StashPlacement placement_;
  DType dtype_;
  int64_t slots_, micro_batches_;
  size_t floats_;
  kernels::DeviceBuffer device_;         // kDevice: slots*micro_batches*floats of dtype
  kernels::DeviceBuffer staging_in_[2];  // kHost or bf16: fp32 (B,T,C) for Load() ([1]: async only)
  kernels::DeviceBuffer staging_out_[2]; // kHost or bf16: fp32 (B,T,C) for OutputBuffer() ([1]: async only)
  kernels::DeviceBuffer bits_in_[2];     // kHost bf16: the bf16 copy each way ([1]: async only)
  kernels::DeviceBuffer bits_out_[2];
  kernels::HostBuffer host_;             // kHost: slots*micro_batches*floats of dtype
  size_t bytes_offloaded_ = 0, bytes_reloaded_ = 0;
  // Async (host placement on a backend with copy queues):
  int in_next_ = 0;                 // staging_in_ the next Load() fills
  int out_cur_ = 0;                 // staging_out_ OutputBuffer() hands out
  bool out_open_ = false;           // OutputBuffer() handed out out_cur_, not yet committed
  std::unique_ptr<kernels::Event> in_ready_[2], in_free_[2], out_ready_[2], out_free_[2];
  // Declared last: destroyed first, waiting for its copies before the buffers go.
  std::unique_ptr<kernels::CopyQueue> copy_;
};

// Which blocks keep their forward intermediates (layers::SavedActivations) beside the
// stashed inputs, per train.recompute and train.activation_budget_mb:
//  * always: none (the backward recomputes every block from its input);
//  * never: every block and micro-batch; FAILED_PRECONDITION naming the needed and the
//    available bytes when that exceeds the budget;
//  * auto: the LAST blocks, as many as fit the budget with all their micro-batches. Every
//    block costs the same to recompute, so the time saved depends only on how many are
//    kept; the last ones are chosen because the backward reaches them first (their
//    values wait least between the forward and their use).
// A family without SavedActivations support keeps none, whatever the mode (logged).
// Kept intermediates live in backend memory whatever train.stash says (they are read by
// the backward in place; train.stash=host offloads only the block inputs).
struct ActivationPlan {
  RecomputeMode mode = RecomputeMode::kAlways;
  size_t budget_bytes = 0;     // the budget the plan was made against
  size_t input_bytes = 0;      // stashed block input, per block per micro-batch
  size_t kept_bytes = 0;       // intermediates, per block per micro-batch (0: unsupported)
  int64_t first_kept = 0;      // blocks first_kept..n_layer (1-based layer index) keep them
  int64_t kept_blocks = 0;     // n_layer - first_kept + 1, or 0
  bool Keeps(int64_t layer) const { return kept_blocks > 0 && layer >= first_kept; }
  // "recompute auto: block intermediates 59801600 B (57.03 MiB) per block per micro-batch
  // (stashed input 3145728 B), kept for 2 of 6 blocks (blocks 5..6) x 4 micro-batches =
  // 456.25 MiB of a 500.00 MiB budget".
  std::string Describe(int64_t n_layer, int64_t micro_batches) const;
};

// budget_bytes 0: the default (half the host RAM on the CPU backend, 4096 MiB on a GPU).
size_t ActivationBudgetBytes(const kernels::Backend& backend, size_t budget_bytes);

Result<ActivationPlan> PlanActivations(const kernels::Backend& backend, const ModelSpec& spec,
                                       const layers::LayerWorkspace& ws, RecomputeMode mode,
                                       size_t budget_bytes, int64_t micro_batches);

}  // namespace l2l::worker
