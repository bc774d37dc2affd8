// Stash of layer outputs, on the device or offloaded to host memory. See stash.h.
//
// Host placement allocates with std::aligned_alloc. On a GPU worker this must become
// pinned memory (cudaHostAlloc) so the offload/reload copies run at PCIe speed; the
// Backend interface grows an AllocPinned() with the CUDA backend, and only Create()
// changes.
#include "worker/stash.h"

#include <cstdlib>
#include <cstring>

namespace l2l::worker {

Result<StashPlacement> ParseStashPlacement(const std::string& s) {
  if (s == "device") return StashPlacement::kDevice;
  if (s == "host") return StashPlacement::kHost;
  return InvalidArgument("train.stash='" + s + "' is not one of: device, host");
}

const char* StashPlacementName(StashPlacement p) {
  return p == StashPlacement::kDevice ? "device" : "host";
}

void Stash::HostFree::operator()(float* p) const { std::free(p); }

Result<std::unique_ptr<Stash>> Stash::Create(kernels::Backend* backend, StashPlacement placement,
                                             int64_t slots, int64_t micro_batches, size_t floats) {
  if (slots <= 0 || micro_batches <= 0 || floats == 0) {
    return InvalidArgument("stash needs slots, micro_batches and floats > 0 (got " +
                           std::to_string(slots) + ", " + std::to_string(micro_batches) + ", " +
                           std::to_string(floats) + ")");
  }
  std::unique_ptr<Stash> s(new Stash(backend, placement, slots, micro_batches, floats));
  const size_t total_bytes =
      static_cast<size_t>(slots) * static_cast<size_t>(micro_batches) * floats * sizeof(float);
  if (placement == StashPlacement::kDevice) {
    L2L_ASSIGN_OR_RETURN(s->device_, kernels::DeviceBuffer::Create(backend, total_bytes));
    return s;
  }
  L2L_ASSIGN_OR_RETURN(s->staging_in_, kernels::DeviceBuffer::Create(backend, floats * sizeof(float)));
  L2L_ASSIGN_OR_RETURN(s->staging_out_, kernels::DeviceBuffer::Create(backend, floats * sizeof(float)));
  const size_t rounded = (total_bytes + 63) / 64 * 64;  // aligned_alloc needs a multiple
  float* host = static_cast<float*>(std::aligned_alloc(64, rounded));
  if (host == nullptr) {
    return ResourceExhausted("stash: cannot allocate " + std::to_string(total_bytes) +
                             " bytes of host memory for " + std::to_string(slots) + " layers x " +
                             std::to_string(micro_batches) + " micro-batches");
  }
  s->host_.reset(host);
  return s;
}

Stash::~Stash() = default;

size_t Stash::Index(int64_t slot, int64_t u) const {
  L2L_CHECK(slot >= 0 && slot < slots_ && u >= 0 && u < micro_batches_)
      << "stash slot " << slot << " micro-batch " << u << " outside " << slots_ << " x " << micro_batches_;
  return (static_cast<size_t>(slot) * static_cast<size_t>(micro_batches_) + static_cast<size_t>(u)) *
         floats_;
}

float* Stash::OutputBuffer(int64_t slot, int64_t u) {
  const size_t i = Index(slot, u);
  return placement_ == StashPlacement::kDevice ? device_.f32() + i : staging_out_.f32();
}

void Stash::Commit(int64_t slot, int64_t u) {
  const size_t i = Index(slot, u);
  if (placement_ == StashPlacement::kDevice) return;
  backend_->CopyToHost(host_.get() + i, staging_out_.data(), floats_ * sizeof(float));
  bytes_offloaded_ += floats_ * sizeof(float);
}

const float* Stash::Load(int64_t slot, int64_t u) {
  const size_t i = Index(slot, u);
  if (placement_ == StashPlacement::kDevice) return device_.f32() + i;
  backend_->CopyToDevice(staging_in_.data(), host_.get() + i, floats_ * sizeof(float));
  bytes_reloaded_ += floats_ * sizeof(float);
  return staging_in_.f32();
}

size_t Stash::device_bytes() const {
  return device_.bytes() + staging_in_.bytes() + staging_out_.bytes();
}

size_t Stash::host_bytes() const {
  if (placement_ != StashPlacement::kHost) return 0;
  return static_cast<size_t>(slots_) * static_cast<size_t>(micro_batches_) * floats_ * sizeof(float);
}

}  // namespace l2l::worker
