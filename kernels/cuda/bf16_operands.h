// Bf16Operands: the bf16 copies that the CUDA backend's bf16 GEMM mode feeds to its
// tensor-core GEMMs, and their reuse. cuda_backend.cc's Gemm asks for each fp32 operand's
// covered extent and gets, in this order:
//   1. the bits of a noted layer copy (Bf16Copies: a layer published as bf16);
//   2. a *fresh* copy held in a slot here: one an earlier GEMM cast, or one a producer op
//      wrote beside its fp32 output (LayerNorm / RMSNorm forward, GELU, SwiGLU, GEGLU,
//      LinearForward's GELU epilogue, the flash attention's output, and the backward's
//      GELU / SwiGLU / one-pass norm gradients and the flash attention's dqkv where no
//      RoPE follows: Produce), if no other op ran since (Touch: every
//      backend op but a GEMM) and no GEMM or copy-queue transfer has written over its
//      source (Written: a GEMM's C; WrittenRanges: a copy-queue transfer's destination);
//   3. else a cast into a slot (which becomes fresh).
// A *held* copy (Hold: a layer's activation that its backward's weight-gradient GEMMs read
// again, Backend::HoldBf16Copy) is written by its producer into a buffer of its own and
// stays fresh across other ops until a GEMM, a copy-queue transfer or another producer
// writes over its source, or it is released: the caller promises that nothing else writes
// that source meanwhile but a Copy2D, which writes the bits too (HeldBits). It is looked
// up before the slots.
// A fresh copy holds the same bits a cast would (round to nearest even of the same fp32
// values), so every result is bit-identical with or without reuse; what goes away is the
// cast pass (reading 4 bytes, writing 2 per element) for the activations a producer wrote
// and for the operand two GEMMs in a row read (a layer backward's dy: dW = x^T dy, then
// dx = dy W^T).
//
// Three slots, grown to the largest extent asked (after waiting for the stream: queued
// work may still read the old buffer); a slot being read by the GEMM in progress is never
// the one overwritten. A copy is read at an offset of a multiple of 128 elements only, so
// the operand keeps a cast copy's 256-byte alignment (cuBLASLt picks its algorithm by
// alignment too: the same plan, the same bits). The gemm-attention path borrows slots 0 and 1 as plain scratch
// (Scratch), which makes their copies stale.
// Thread-safety: none (the backend's compute thread), but WrittenRanges (any thread).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_resources.h"

namespace l2l::kernels::cuda {

// Device ranges that copy queues wrote (any thread adds; the backend's compute thread
// drains them into Bf16Operands::Written before it reads or notes a copy). A transfer
// ordered before a producer on the device was enqueued, and so added, before the
// producer's launch: draining first never drops the producer's own copy.
class WrittenRanges {
 public:
  void Add(const void* dst, size_t bytes);
  // Calls f(lo, n_floats) per range added since the last call (all: f(nullptr, -1)).
  template <class F>
  void Drain(F&& f) {
    if (!pending_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (overflow_) f(nullptr, -1);
    for (const auto& r : ranges_) f(r.first, r.second);
    ranges_.clear();
    overflow_ = false;
    pending_.store(false, std::memory_order_release);
  }

 private:
  static constexpr size_t kMaxRanges = 1024;  // beyond: every copy is stale (bounded memory)
  std::mutex mu_;
  std::atomic<bool> pending_{false};
  bool overflow_ = false;
  std::vector<std::pair<const float*, int64_t>> ranges_;
};

class Bf16Operands {
 public:
  static constexpr int kSlots = 3;

  // reuse false: every operand is cast (the mode before reuse; tests compare the two).
  void set_reuse(bool reuse) { reuse_ = reuse; }

  // Something other than a GEMM ran (or will run) on the compute stream: every fresh copy
  // is stale.
  void Touch() { ++serial_; }
  // Where the backend's copy queues (which may outlive it) note what they write: a fresh
  // copy of any of it is stale.
  std::shared_ptr<WrittenRanges> copy_writes() const { return copy_writes_; }

  // The bf16 copy of fp32 elements [src, src + n) for a GEMM operand: a fresh copy's bits
  // at the same offset, or a cast into a slot other than `avoid` (the GEMM's other
  // operand; -1: none). *slot: the slot read (-1: none). Counted in *stats.
  const uint16_t* Operand(const float* src, int64_t n, int avoid, int* slot, cudaStream_t s,
                          Backend::Bf16OperandStats* stats);

  // A producer op (after its Touch) writes dst's n values as bf16 too: the slot to write
  // them into; fresh until the next Touch.
  uint16_t* Produce(const float* dst, int64_t n, cudaStream_t s);

  // A GEMM wrote elements [dst, dst + n): a fresh copy of any of them is stale.
  void Written(const float* dst, int64_t n);

  // Until Release(src): the copy a producer writes of exactly src's n values goes into a
  // buffer of its own and is not made stale by Touch (the caller promises that only such a
  // producer, a GEMM or a copy-queue transfer writes src meanwhile; the latter two, and a
  // producer writing part of it, make it stale). Holding src again restarts it (no copy).
  // Nothing is held with reuse off. At most kMaxHeld at a time.
  void Hold(const float* src, int64_t n);
  void Release(const float* src);
  // An op that is not a producer writes elements [dst, dst + n) and can write their bf16
  // bits too: where, if they lie inside a fresh held copy (which then stays fresh, the
  // op writing the bits at the same offsets); else null, and any held copy of them is stale.
  uint16_t* HeldBits(const float* dst, int64_t n);

  // Slot `slot` (0..kSlots-1) as scratch of at least `elems` bf16 values (its copy is gone).
  uint16_t* Scratch(int slot, int64_t elems, cudaStream_t s);

  size_t bytes() const;

 private:
  struct Slot {
    CudaBuffer buf;
    const float* src = nullptr;  // whose copy it holds (null: none)
    int64_t n = 0;
    uint64_t serial = 0;  // valid while equal to serial_
    uint64_t used = 0;    // last use (least recently used is overwritten first)
  };
  struct Held {
    CudaBuffer buf;
    const float* src = nullptr;  // null: a free entry (its buffer kept for the next hold)
    int64_t n = 0;
    bool valid = false;  // its producer wrote the copy, nothing wrote over the source since
  };
  static constexpr size_t kMaxHeld = 16;
  uint64_t now() const { return serial_; }
  void Drain();
  bool Fresh(const Slot& sl) const { return sl.src != nullptr && sl.serial == now(); }
  int Victim(int avoid) const;
  static uint16_t* Grow(CudaBuffer& buf, int64_t elems, cudaStream_t s);

  bool reuse_ = true;
  uint64_t serial_ = 1;
  std::shared_ptr<WrittenRanges> copy_writes_ = std::make_shared<WrittenRanges>();
  uint64_t clock_ = 0;
  Slot slots_[kSlots];
  std::vector<Held> held_;
};

}  // namespace l2l::kernels::cuda
