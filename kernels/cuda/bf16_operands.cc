// Bf16Operands: fresh bf16 copies of GEMM operands and their reuse. See bf16_operands.h.
#include "kernels/cuda/bf16_operands.h"

#include <algorithm>

#include "kernels/bf16_copies.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {

void WrittenRanges::Add(const void* dst, size_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (ranges_.size() >= kMaxRanges) {
    overflow_ = true;
    ranges_.clear();
  }
  if (!overflow_) {
    ranges_.emplace_back(static_cast<const float*>(dst), static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float)));
  }
  pending_.store(true, std::memory_order_release);
}

void Bf16Operands::Drain() {
  copy_writes_->Drain([this](const float* dst, int64_t n) {
    if (n < 0) {
      for (Slot& sl : slots_) sl.src = nullptr;
      for (Held& h : held_) h.valid = false;
    } else {
      Written(dst, n);
    }
  });
}

const uint16_t* Bf16Operands::Operand(const float* src, int64_t n, int avoid, int* slot, cudaStream_t s,
                                      Backend::Bf16OperandStats* stats) {
  *slot = -1;
  if (n <= 0) return nullptr;
  Drain();
  if (reuse_) {
    // A cast copy starts a slot (256-byte aligned); cuBLASLt's plan (and with it the
    // summation order) depends on the operand's alignment, so a copy (held or in a slot)
    // is read only at an offset that keeps it: the same plan, the same bits as a cast.
    auto readable = [](int64_t offset) { return offset >= 0 && offset % 128 == 0; };
    for (Held& h : held_) {
      const int64_t offset = h.valid ? ElementOffset(h.src, h.n, src, n) : -1;
      if (!readable(offset)) continue;
      stats->reused_elements += n;
      return static_cast<const uint16_t*>(h.buf.data()) + offset;
    }
    for (int k = 0; k < kSlots; ++k) {
      Slot& sl = slots_[k];
      const int64_t offset = Fresh(sl) ? ElementOffset(sl.src, sl.n, src, n) : -1;
      if (!readable(offset)) continue;
      sl.used = ++clock_;
      *slot = k;
      stats->reused_elements += n;
      return static_cast<const uint16_t*>(sl.buf.data()) + offset;
    }
  }
  const int k = Victim(avoid);
  Slot& sl = slots_[k];
  uint16_t* dst = Grow(sl.buf, n, s);
  LaunchCastF32ToBf16(dst, src, n, s);
  sl.src = src;
  sl.n = n;
  sl.serial = now();
  sl.used = ++clock_;
  *slot = k;
  stats->cast_elements += n;
  return dst;
}

uint16_t* Bf16Operands::Produce(const float* dst, int64_t n, cudaStream_t s) {
  Drain();
  Written(dst, n);  // copies of what it writes are stale, held ones included (nested holds)
  for (Held& h : held_) {
    if (h.src == dst && h.n == n) {
      h.valid = true;
      return Grow(h.buf, n, s);
    }
  }
  Slot& sl = slots_[Victim(-1)];
  uint16_t* bits = Grow(sl.buf, n, s);
  sl.src = dst;
  sl.n = n;
  sl.serial = now();
  sl.used = ++clock_;
  return bits;
}

void Bf16Operands::Written(const float* dst, int64_t n) {
  const auto lo = reinterpret_cast<uintptr_t>(dst);
  const auto hi = lo + sizeof(float) * static_cast<uintptr_t>(std::max<int64_t>(n, 0));
  auto overlaps = [&](const float* src, int64_t src_n) {
    const auto a = reinterpret_cast<uintptr_t>(src);
    return src != nullptr && a < hi && lo < a + sizeof(float) * static_cast<uintptr_t>(src_n);
  };
  for (Slot& sl : slots_) {
    if (overlaps(sl.src, sl.n)) sl.src = nullptr;
  }
  for (Held& h : held_) {
    if (overlaps(h.src, h.n)) h.valid = false;
  }
}

void Bf16Operands::Hold(const float* src, int64_t n) {
  if (!reuse_ || src == nullptr || n <= 0) return;
  Held* free_entry = nullptr;
  for (Held& h : held_) {
    if (h.src == src) {
      h.n = n;
      h.valid = false;
      return;
    }
    if (h.src == nullptr && free_entry == nullptr) free_entry = &h;
  }
  if (free_entry == nullptr) {
    L2L_CHECK(held_.size() < kMaxHeld) << "bf16 operand copies: more than " << kMaxHeld
                                      << " held at once (a HoldBf16Copy without its release?)";
    free_entry = &held_.emplace_back();
  }
  free_entry->src = src;
  free_entry->n = n;
  free_entry->valid = false;
}

uint16_t* Bf16Operands::HeldBits(const float* dst, int64_t n) {
  if (n <= 0) return nullptr;
  Drain();
  Held* into = nullptr;
  int64_t offset = -1;
  for (Held& h : held_) {
    offset = h.valid ? ElementOffset(h.src, h.n, dst, n) : -1;
    if (offset >= 0) {
      into = &h;
      break;
    }
  }
  Written(dst, n);  // every copy of what it writes is stale, but the one it writes the bits of
  if (into == nullptr) return nullptr;
  into->valid = true;
  return static_cast<uint16_t*>(into->buf.data()) + offset;
}

void Bf16Operands::Release(const float* src) {
  for (Held& h : held_) {
    if (h.src == src) {
      h.src = nullptr;
      h.valid = false;
    }
  }
}

uint16_t* Bf16Operands::Scratch(int slot, int64_t elems, cudaStream_t s) {
  L2L_CHECK(slot >= 0 && slot < kSlots) << "bf16 operand scratch slot " << slot;
  Slot& sl = slots_[slot];
  sl.src = nullptr;
  return Grow(sl.buf, elems, s);
}

size_t Bf16Operands::bytes() const {
  size_t b = 0;
  for (const Slot& sl : slots_) b += sl.buf.bytes();
  for (const Held& h : held_) b += h.buf.bytes();
  return b;
}

int Bf16Operands::Victim(int avoid) const {
  // A slot holding nothing fresh first, else the least recently used; never `avoid`.
  int best = -1;
  for (int k = 0; k < kSlots; ++k) {
    if (k == avoid) continue;
    if (!Fresh(slots_[k])) return k;
    if (best < 0 || slots_[k].used < slots_[best].used) best = k;
  }
  return best;
}

uint16_t* Bf16Operands::Grow(CudaBuffer& buf, int64_t elems, cudaStream_t s) {
  const size_t bytes = sizeof(uint16_t) * static_cast<size_t>(std::max<int64_t>(elems, 1));
  if (bytes > buf.bytes()) {
    // Queued work may still read the old buffer.
    L2L_CUDA_CHECK(cudaStreamSynchronize(s));
    const size_t grown = std::max(bytes, 2 * buf.bytes());
    buf = CudaBuffer();
    auto created = CudaBuffer::Create(grown);
    L2L_CHECK(created.ok()) << "bf16 operand copies: " << created.status().ToString();
    buf = std::move(created).value();
  }
  return static_cast<uint16_t*>(buf.data());
}

}  // namespace l2l::kernels::cuda
