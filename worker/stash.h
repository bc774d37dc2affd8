// Stash: the layer outputs the relay keeps between its forward and backward passes
// (seed 002 Algorithm 3: only each layer's output survives; the backward recomputes
// everything else from it). Slot s holds the output of layer s (embedding = 0, block i =
// i+1) for every micro-batch u, each (B,T,C) fp32.
//
// Placement (`train.stash`):
//  * kDevice: the outputs live in backend memory; the layer writes straight into the
//    stash and the backward reads straight from it (no copies). Device memory grows with
//    depth: slots x micro_batches x B*T*C floats.
//  * kHost: the outputs live in host memory (pinned on a GPU worker; plain aligned host
//    memory on the CPU backend, where "device" memory is host memory too). The layer
//    writes into one of two device staging tensors, Commit() offloads it, Load() brings it
//    back. Device memory is two (B,T,C) tensors whatever the depth.
//
// Usage per (layer, micro-batch) in the forward:
//   const float* in = stash.Load(l-1, u);  float* out = stash.OutputBuffer(l, u);
//   ...compute out from in...;  stash.Commit(l, u);
// Load() and OutputBuffer() use different staging tensors, so one of each may be live at
// once; a second Load() invalidates the pointer from the first (host placement).
//
// Ownership: the Stash owns all its buffers; returned pointers stay valid until the next
// Load()/OutputBuffer() call (host) or the Stash's destruction (device).
// Thread-safety: one thread (the relay's compute thread), like the Backend it uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/backend.h"

namespace l2l::worker {

enum class StashPlacement { kDevice, kHost };

// "device" | "host"; anything else is INVALID_ARGUMENT naming train.stash.
Result<StashPlacement> ParseStashPlacement(const std::string& s);
const char* StashPlacementName(StashPlacement p);

class Stash {
 public:
  // slots: layer outputs kept (n_layer + 1); floats: B*T*C per micro-batch.
  static Result<std::unique_ptr<Stash>> Create(kernels::Backend* backend, StashPlacement placement,
                                               int64_t slots, int64_t micro_batches, size_t floats);
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
  size_t device_bytes() const;  // backend memory held
  size_t host_bytes() const;    // host memory held (kHost only)
  // Bytes moved between host and device since creation (kHost only).
  size_t bytes_offloaded() const { return bytes_offloaded_; }
  size_t bytes_reloaded() const { return bytes_reloaded_; }

 private:
  struct HostFree {
    void operator()(float* p) const;
  };
  Stash(kernels::Backend* backend, StashPlacement placement, int64_t slots, int64_t micro_batches,
        size_t floats)
      : backend_(backend), placement_(placement), slots_(slots), micro_batches_(micro_batches),
        floats_(floats) {}
  size_t Index(int64_t slot, int64_t u) const;

  kernels::Backend* backend_;
  StashPlacement placement_;
  int64_t slots_, micro_batches_;
  size_t floats_;
  kernels::DeviceBuffer device_;      // kDevice: slots*micro_batches*floats
  kernels::DeviceBuffer staging_in_;  // kHost: (B,T,C) for Load()
  kernels::DeviceBuffer staging_out_; // kHost: (B,T,C) for OutputBuffer()
  std::unique_ptr<float, HostFree> host_;  // kHost: slots*micro_batches*floats
  size_t bytes_offloaded_ = 0, bytes_reloaded_ = 0;
};

}  // namespace l2l::worker
