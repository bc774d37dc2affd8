// Stash of layer outputs, on the device or offloaded to host memory (page-locked on a
// GPU, with asynchronous copies on a copy queue of its own). See stash.h.
#include "worker/stash.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/logging.h"
#include "common/model_spec.h"

namespace l2l::worker {

Result<std::unique_ptr<Stash>> Stash::Create(kernels::Backend* backend, StashPlacement placement,
                                             int64_t slots, int64_t micro_batches, size_t floats,
                                             DType dtype) {
  if (slots <= 0 || micro_batches <= 0 || floats == 0) {
    return InvalidArgument("stash needs slots, micro_batches and floats > 0 (got " +
                           std::to_string(slots) + ", " + std::to_string(micro_batches) + ", " +
                           std::to_string(floats) + ")");
  }
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return InvalidArgument(std::string("stash dtype ") + DTypeName(dtype) + ": expected f32 or bf16");
  }
  std::unique_ptr<Stash> s(new Stash(backend, placement, slots, micro_batches, floats, dtype));
  const size_t total_bytes =
      static_cast<size_t>(slots) * static_cast<size_t>(micro_batches) * s->tensor_bytes();
  const bool host = placement == StashPlacement::kHost;
  const bool async = host && backend->HasAsyncTransfers();
  if (!host) {
    L2L_ASSIGN_OR_RETURN(s->device_, kernels::DeviceBuffer::Create(backend, total_bytes));
  }
  if (!host && !s->bf16()) return s;  // the layers write and read the stash in place
  const int n = async ? 2 : 1;
  for (int k = 0; k < n; ++k) {
    L2L_ASSIGN_OR_RETURN(s->staging_in_[k], kernels::DeviceBuffer::Create(backend, floats * sizeof(float)));
    L2L_ASSIGN_OR_RETURN(s->staging_out_[k], kernels::DeviceBuffer::Create(backend, floats * sizeof(float)));
    if (host && s->bf16()) {
      L2L_ASSIGN_OR_RETURN(s->bits_in_[k], kernels::DeviceBuffer::Create(backend, floats * sizeof(uint16_t)));
      L2L_ASSIGN_OR_RETURN(s->bits_out_[k], kernels::DeviceBuffer::Create(backend, floats * sizeof(uint16_t)));
    }
  }
  if (!host) return s;
  Result<kernels::HostBuffer> host_buf = backend->AllocHost(total_bytes);
  if (!host_buf.ok() && async) {
    // Page-locked memory can run out (or be capped) long before host RAM does: fall back
    // to plain host memory (the base class's AllocHost). The copies stay correct; the
    // driver stages them, which is slower and may block the compute thread.
    L2L_LOG_WARN("stash: no page-locked host memory for {} MiB ({}); using pageable memory, "
                 "offload and reload copies will be slower",
                 total_bytes >> 20, host_buf.status().ToString());
    host_buf = backend->kernels::Backend::AllocHost(total_bytes);
  }
  if (!host_buf.ok()) {
    return host_buf.status().WithContext("stash: host memory for " + std::to_string(slots) + " layers x " +
                                         std::to_string(micro_batches) + " micro-batches");
  }
  s->host_ = std::move(host_buf).value();
  if (async) {
    for (int k = 0; k < 2; ++k) {
      for (auto* e : {&s->in_ready_[k], &s->in_free_[k], &s->out_ready_[k], &s->out_free_[k]}) {
        L2L_ASSIGN_OR_RETURN(*e, backend->CreateEvent());
      }
    }
    L2L_ASSIGN_OR_RETURN(s->copy_, backend->CreateCopyQueue());
  }
  return s;
}

Stash::~Stash() {
  // copy_ is destroyed first (declared last) and waits for its queued copies; make that
  // explicit here too, before any buffer goes.
  copy_.reset();
}

size_t Stash::Index(int64_t slot, int64_t u) const {
  L2L_CHECK(slot >= 0 && slot < slots_ && u >= 0 && u < micro_batches_)
      << "stash slot " << slot << " micro-batch " << u << " outside " << slots_ << " x " << micro_batches_;
  return (static_cast<size_t>(slot) * static_cast<size_t>(micro_batches_) + static_cast<size_t>(u)) *
         floats_;
}

float* Stash::OutputBuffer(int64_t slot, int64_t u) {
  const size_t i = Index(slot, u);
  if (placement_ == StashPlacement::kDevice && !bf16()) return device_.f32() + i;
  if (!async()) return staging_out_[0].f32();
  if (!out_open_) {
    // A fresh tensor: the other one may still be offloading the previous commit. The
    // compute work writing this one starts after this tensor's last offload finished.
    out_cur_ ^= 1;
    backend_->WaitEvent(out_free_[out_cur_].get());
    out_open_ = true;
  }
  return staging_out_[out_cur_].f32();
}

void Stash::Commit(int64_t slot, int64_t u) {
  const size_t i = Index(slot, u);
  if (placement_ == StashPlacement::kDevice) {
    // bf16: round the output in place and keep its bits (the compute stream orders it).
    if (bf16()) backend_->RoundToBf16(staging_out_[0].f32(), DeviceBits(i), static_cast<int64_t>(floats_));
    return;
  }
  const size_t bytes = tensor_bytes();
  const int64_t n = static_cast<int64_t>(floats_);
  if (!async()) {
    if (bf16()) {
      backend_->RoundToBf16(staging_out_[0].f32(), static_cast<uint16_t*>(bits_out_[0].data()), n);
      backend_->CopyToHost(Host(i), bits_out_[0].data(), bytes);
    } else {
      backend_->CopyToHost(Host(i), staging_out_[0].data(), bytes);
    }
  } else {
    L2L_CHECK(out_open_) << "stash Commit(" << slot << ", " << u << ") without OutputBuffer()";
    const int k = out_cur_;
    // bits_out_[k] is free with staging_out_[k]: OutputBuffer() waited for its offload.
    if (bf16()) backend_->RoundToBf16(staging_out_[k].f32(), static_cast<uint16_t*>(bits_out_[k].data()), n);
    backend_->RecordEvent(out_ready_[k].get());  // the layer's writes into staging_out_[k]
    copy_->WaitFor(out_ready_[k].get());
    copy_->CopyToHost(Host(i), bf16() ? bits_out_[k].data() : staging_out_[k].data(), bytes);
    copy_->Record(out_free_[k].get());
    out_open_ = false;
  }
  bytes_offloaded_ += bytes;
}

const float* Stash::Load(int64_t slot, int64_t u) {
  const size_t i = Index(slot, u);
  const int64_t n = static_cast<int64_t>(floats_);
  if (placement_ == StashPlacement::kDevice) {
    if (!bf16()) return device_.f32() + i;
    backend_->WidenBf16(staging_in_[0].f32(), DeviceBits(i), n);
    return staging_in_[0].f32();
  }
  const size_t bytes = tensor_bytes();
  bytes_reloaded_ += bytes;
  if (!async()) {
    if (bf16()) {
      backend_->CopyToDevice(bits_in_[0].data(), Host(i), bytes);
      backend_->WidenBf16(staging_in_[0].f32(), static_cast<const uint16_t*>(bits_in_[0].data()), n);
    } else {
      backend_->CopyToDevice(staging_in_[0].data(), Host(i), bytes);
    }
    return staging_in_[0].f32();
  }
  const int k = in_next_;
  in_next_ ^= 1;
  // This call invalidates the previous Load's pointer (tensor k^1): every compute op
  // reading it is queued, so its "free" point is now. Tensor k was last handed out two
  // Loads ago; its "free" point was recorded at the previous Load.
  backend_->RecordEvent(in_free_[k ^ 1].get());
  copy_->WaitFor(in_free_[k].get());
  // Same queue as the offloads: a Load of what a Commit offloaded runs after that copy.
  if (bf16()) {
    copy_->CopyToDevice(bits_in_[k].data(), Host(i), bytes);
    const Status widened = copy_->WidenToF32(staging_in_[k].f32(), bits_in_[k].data(), DType::kBF16, n);
    L2L_CHECK(widened.ok()) << "stash: bf16 widening on the copy queue: " << widened.ToString();
  } else {
    copy_->CopyToDevice(staging_in_[k].data(), Host(i), bytes);
  }
  copy_->Record(in_ready_[k].get());
  backend_->WaitEvent(in_ready_[k].get());
  return staging_in_[k].f32();
}

size_t Stash::device_bytes() const {
  size_t b = device_.bytes();
  for (int k = 0; k < 2; ++k) {
    b += staging_in_[k].bytes() + staging_out_[k].bytes() + bits_in_[k].bytes() + bits_out_[k].bytes();
  }
  return b;
}

size_t Stash::host_bytes() const {
  if (placement_ != StashPlacement::kHost) return 0;
  return static_cast<size_t>(slots_) * static_cast<size_t>(micro_batches_) * tensor_bytes();
}

namespace {
std::string MiB(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}
}  // namespace

size_t ActivationBudgetBytes(const kernels::Backend& backend, size_t budget_bytes) {
  if (budget_bytes > 0) return budget_bytes;
  if (backend.kind() == kernels::DeviceKind::kCpu) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return static_cast<size_t>(pages) * static_cast<size_t>(page) / 2;
  }
  return size_t{4096} << 20;
}

std::string ActivationPlan::Describe(int64_t n_layer, int64_t micro_batches) const {
  std::string s = std::string("recompute ") + ToString(mode) + ": block intermediates " + std::to_string(kept_bytes) + " B (" +
                  MiB(kept_bytes) + ") per block per micro-batch (stashed input " + std::to_string(input_bytes) +
                  " B), kept for " +
                  std::to_string(kept_blocks) + " of " + std::to_string(n_layer) + " blocks";
  if (kept_blocks > 0) {
    s += " (blocks " + std::to_string(first_kept) + ".." + std::to_string(n_layer) + ") x " +
         std::to_string(micro_batches) + " micro-batches = " +
         MiB(kept_bytes * static_cast<size_t>(kept_blocks) * static_cast<size_t>(micro_batches));
  }
  return s + " of a " + MiB(budget_bytes) + " budget";
}

Result<ActivationPlan> PlanActivations(const kernels::Backend& backend, const ModelSpec& spec,
                                       const layers::LayerWorkspace& ws, RecomputeMode mode,
                                       size_t budget_bytes, int64_t micro_batches) {
  ActivationPlan p;
  p.mode = mode;
  p.budget_bytes = ActivationBudgetBytes(backend, budget_bytes);
  p.input_bytes = static_cast<size_t>(ws.B() * ws.T() * spec.d_model) * sizeof(float);
  p.kept_bytes = layers::SavedActivations::Bytes(spec, ws);
  const int64_t L = spec.n_layer;
  if (mode == RecomputeMode::kAlways || L == 0) return p;
  if (!layers::SavedActivations::Supported(spec)) {
    L2L_LOG_WARN("train.recompute={}: model.family={} cannot keep block intermediates; every block "
                 "is recomputed",
                 ToString(mode), ToString(spec.family));
    return p;
  }
  const size_t per_block = p.kept_bytes * static_cast<size_t>(micro_batches);
  int64_t keep = L;
  if (mode == RecomputeMode::kNever) {
    const size_t need = per_block * static_cast<size_t>(L);
    if (need > p.budget_bytes) {
      return FailedPrecondition(
          "train.recompute=never: keeping every block's intermediates needs " + std::to_string(need) + " bytes (" +
          MiB(need) + ": " + std::to_string(L) + " blocks x " + std::to_string(micro_batches) +
          " micro-batches x " + MiB(p.kept_bytes) + "), the budget train.activation_budget_mb allows " +
          std::to_string(p.budget_bytes) + " bytes (" + MiB(p.budget_bytes) +
          "); raise the budget or use recompute auto or always");
    }
  } else {
    keep = std::min<int64_t>(L, static_cast<int64_t>(p.budget_bytes / std::max<size_t>(per_block, 1)));
  }
  p.kept_blocks = keep;
  p.first_kept = L - keep + 1;
  return p;
}

}  // namespace l2l::worker
