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
// Ownership: owns its engine and cached primitives; the arena and operands belong to
// the caller. Thread-safety: Run/ImplName from one thread at a time.
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
  DnnlMatmul(int num_threads, tbb::task_arena* arena);
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
  void Run(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           const MatStrides& sa, const float* B, const MatStrides& sb, float beta, float* C,
           const MatStrides& sc, const Epilogue* epilogue = nullptr);

  // oneDNN's name for the implementation it picks for this problem (e.g. "brg:avx2").
  std::string ImplName(int64_t B0, int64_t B1, int64_t M, int64_t N, int64_t K, float alpha,
                       const MatStrides& sa, const MatStrides& sb, float beta,
                       const MatStrides& sc);

  size_t cached_primitives() const;

  // A cached 2-D product (no batch) that tasks may run concurrently: Prepare on the
  // owner thread (creates or finds the primitive), then Execute from any thread, each
  // call on its own C. The plan stays valid for the lifetime of this object.
  struct Plan;
  const Plan* Prepare(int64_t M, int64_t N, int64_t K, float alpha, const MatStrides& sa,
                      const MatStrides& sb, float beta, const MatStrides& sc);
  // REQUIRES: plan from Prepare on this object; M, N, K > 0 when prepared.
  void Execute(const Plan* plan, const float* A, const float* B, float* C);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Plain row-major Gemm with the semantics of Backend::Gemm, expressed as MatStrides.
void GemmStrides(bool trans_a, bool trans_b, int64_t lda, int64_t ldb, int64_t ldc, MatStrides* sa,
                 MatStrides* sb, MatStrides* sc);

// Sets the calling thread's OpenMP thread count (no-op when no OpenMP runtime is loaded).
void SetOmpThreads(int n);

}  // namespace l2l::kernels
