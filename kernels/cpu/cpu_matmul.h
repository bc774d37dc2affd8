// DnnlMatmul: (batched, strided) fp32 matrix products through oneDNN's matmul primitive,
// with a cache of primitives keyed by everything that shapes them (dims, strides, alpha,
// beta), because creating a primitive costs far more than running a small one.
//
//   C[i,j] (M,N) = alpha * A[i,j] (M,K) @ B[i,j] (K,N) + beta * C[i,j]   for i < B0, j < B1
//
// Each operand is described by four element strides (batch0, batch1, row, col), so a
// transpose is just swapped row/col strides and a head of a (B,T,3C) qkv tensor is a
// view with strides (T*3C, hs, 3C, 1). alpha is a oneDNN output scale; beta != 0 is a
// "sum" post-op, so beta == 1 accumulates exactly (acc + C, in fp32).
//
// Threading: oneDNN here is built on OpenMP, the rest of the CPU backend on TBB. Two
// thread pools on the same cores fight (an OpenMP barrier stalls whenever one of its
// threads is descheduled, and each pool spins while the other works), so oneDNN runs
// single-threaded (OpenMP thread count 1, set through dlsym since the OpenMP runtime is
// only linked through libdnnl) and we parallelise in TBB tasks inside the backend's
// arena: over the batch of a batched product, else over row (or column) blocks of C.
// TBB's work stealing also copes with busy cores, where a static split would wait for
// the slowest thread. Each task uses its own stream and scratchpad, so concurrent
// execution is safe with a oneDNN built without DNNL_ENABLE_CONCURRENT_EXEC.
//
// bf16 mode (constructed with bf16 = true; PyTorch autocast's matmul numerics, as the
// CUDA backend's kBf16): Run casts both fp32 operands to bf16 (round to nearest even,
// FloatToBf16Span) into dense row-major copies, (B0*B1, M, K) and (B0*B1, K, N), held
// in two buffers this object owns (grown on demand, reused: no allocation per call once
// warm), and runs a bf16 x bf16 -> fp32 primitive on them. Dense copies, not the
// callers' strides: oneDNN 2.x's AMX kernels do not take a transposed A (the weight
// gradient's X^T), and every call of a shape shares one primitive whatever its strides.
// Accumulation, C, alpha, beta (the sum post-op) and epilogues are fp32 exactly as in
// fp32 mode. Each operand is cast once per call, before the product is split over
// tasks (casting each row block inside its task instead measured no faster: the cast
// is bound by reading fp32 from memory). On AVX512_BF16 / AMX CPUs oneDNN picks its AMX or
// avx512_core_bf16 kernels (ImplName says which). Prepared plans in this mode take bf16
// operands (the caller casts them, e.g. with ToBf16 into Bf16Slot).
//
// Ownership: owns its engine, cached primitives and bf16 operand buffers; the arena and
// operands belong to the caller. Thread-safety: Run/ImplName/Prepare/ToBf16/Bf16Slot
// from one thread at a time; Execute from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <tbb/task_arena.h>

namespace l2l::kernels {

struct MatStrides {
  int64_t b0 = 0, b1 = 0, row = 0, col = 1;  // in elements
};

class DnnlMatmul {
 public:
  // Runs its tasks in `arena` (which must outlive this object) on up to num_threads.
  DnnlMatmul(int num_threads, tbb::task_arena* arena, bool bf16 = false);
  ~DnnlMatmul();
  DnnlMatmul(const DnnlMatmul&) = delete;
  DnnlMatmul& operator=(const DnnlMatmul&) = delete;

  // REQUIRES: operands do not overlap C. Dims >= 0. Aborts (L2L_CHECK) when oneDNN
  // rejects the problem, which is a bug in the caller's strides.
  //
  // epilogue (optional, 2-D products only): called as epilogue(m0, m1, n0, n1) once per
  // block of C right after that block is computed, in the same task (the block is still
  // in cache); the blocks tile C exactly. It may rewrite its block of C.
  using Epilogue = std::function<void(int64_t m0, int64_t m1, int64_t n0, int64_t n1)>;
  // b_bf16 (bf16 mode, 2-D only; may be null): B's values as bf16, dense row-major
  // (K, N), read instead of casting B (the caller guarantees they are bf16(B)).
  void Run(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           const MatStrides& sa, const float* B, const MatStrides& sb, float beta, float* C,
           const MatStrides& sc, const Epilogue* epilogue = nullptr, const uint16_t* b_bf16 = nullptr);

  // oneDNN's name for the implementation it picks for this problem (e.g. "brg:avx2").
  std::string ImplName(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
                       const MatStrides& sa, const MatStrides& sb, float beta,
                       const MatStrides& sc);

  size_t cached_primitives() const;
  bool bf16() const;

  // A cached 2-D product (no batch) that tasks may run concurrently: Prepare on the
  // owner thread (creates or finds the primitive), then Execute from any thread, each
  // call on its own C. The plan stays valid for the lifetime of this object.
  struct Plan;
  const Plan* Prepare(int64_t M, int64_t N, int64_t K, float alpha, const MatStrides& sa,
                      const MatStrides& sb, float beta, const MatStrides& sc);
  // REQUIRES: plan from Prepare on this object; M, N, K > 0 when prepared. The fp32
  // overload in fp32 mode, the bf16 one (A, B as bf16 bits) in bf16 mode.
  void Execute(const Plan* plan, const float* A, const float* B, float* C);
  void Execute(const Plan* plan, const uint16_t* A, const uint16_t* B, float* C);

  // dst (n) = bf16(src (n)), round to nearest even, in parallel tasks of the arena.
  void ToBf16(uint16_t* dst, const float* src, int64_t n);
  // A buffer of at least `elems` bf16 values owned by this object, slot 2 or 3 (Run
  // uses 0 and 1 for its operands); valid until the next call with the same slot.
  uint16_t* Bf16Slot(int slot, int64_t elems);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Plain row-major Gemm with the semantics of Backend::Gemm, expressed as MatStrides.
void GemmStrides(bool trans_a, bool trans_b, int64_t lda, int64_t ldb, int64_t ldc, MatStrides* sa,
                 MatStrides* sb, MatStrides* sc);

// Whether oneDNN can make a bf16 x bf16 -> fp32 matmul on this CPU: its AVX512_BF16 / AMX
// kernels, or its emulation of bf16 on plain AVX-512 (oneDNN 2.x has no bf16 matmul below
// AVX-512). Respects oneDNN's ONEDNN_MAX_CPU_ISA cap.
bool DnnlHasBf16Matmul();

// Sets the calling thread's OpenMP thread count (no-op when no OpenMP runtime is loaded).
void SetOmpThreads(int n);

}  // namespace l2l::kernels
