// CpuBackend: the reference implementation of kernels/backend.h on the host, fp32 (or
// with bf16 matrix products: CpuGemmPrecision::kBf16, see backend.h and cpu_matmul.h).
// Matrix products go through oneDNN's matmul primitive (DnnlMatmul, cpu_matmul.h), which
// this backend owns, run single-threaded per block inside TBB tasks; every other op is a
// loop parallelised with oneTBB, all inside one task_arena limited to num_threads (one
// thread pool, no OpenMP pool beside it). GELU and the softmax exps use vectorised
// polynomials (cpu_math.h). Causal attention is blocked by query strips
// (cpu_attention.cc): oneDNN matmuls on strided views into qkv for the causal half only,
// with the softmax in cache; `att` keeps only each row's log-sum-exp for the backward.
//
// Determinism: every reduction that crosses rows (BiasBackward, LayerNorm dweight/dbias,
// EmbeddingBackward, SumSquares) is ordered independently of the thread count, so the
// same inputs give the same bits for those ops whatever num_threads is. The bias and
// LayerNorm parameter gradients sum fixed chunks of kRowChunk rows (in row order) into one
// partial per chunk, in parallel over chunks with contiguous row reads, then add the
// partials in chunk order (ReduceRowChunks in cpu_parallel.h).
//
// Ownership: "device" memory is host memory from Alloc (64-byte aligned); the backend
// owns its oneDNN engine/stream and primitive cache.
// Thread-safety: one thread at a time (as every Backend).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "kernels/backend.h"
#include "kernels/bf16_copies.h"

namespace l2l::kernels {

class DnnlMatmul;
class ThreadPinner;

class CpuBackend final : public Backend {
 public:
  // num_threads <= 0: all cores the process may use.
  explicit CpuBackend(int num_threads, CpuGemmPrecision gemm = CpuGemmPrecision::kFp32);
  ~CpuBackend() override;

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override;
  int num_threads() const { return num_threads_; }
  CpuGemmPrecision gemm_precision() const { return gemm_; }

  Result<void*> Alloc(size_t bytes) override;
  void Free(void* p) override;
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  void CopyDeviceToDevice(void* dst, const void* src, size_t bytes) override;
  void Zero(void* dst, size_t bytes) override;
  void Synchronize() override {}

  bool TakesBf16Copies() const override { return gemm_ == CpuGemmPrecision::kBf16; }
  void NoteBf16Copy(const float* f32, const uint16_t* bits, int64_t n) override;
  void ForgetBf16Copy(const float* f32) override;
  Bf16OperandStats bf16_operand_stats() const override { return bf16_stats_; }
  void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
            int64_t ldc) override;
  void AddBias(float* out, const float* bias, int64_t N, int64_t OC) override;
  void BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC) override;
  // Fused: bias, GELU and residual run on each block of y inside the GEMM's task, right
  // after oneDNN wrote it (one pass over y while it is in cache instead of up to three).
  void LinearForward(float* y, const float* x, const float* w, bool trans_w, const float* bias,
                     int64_t N, int64_t IC, int64_t OC, float* act, const float* residual) override;

  // Blocked causal attention (cpu_attention.cc): att keeps one log-sum-exp per row; the
  // backward recomputes the probabilities strip by strip and needs no scratch.
  size_t CausalAttentionFloats(int64_t B, int64_t T, int64_t NH, int64_t) const override {
    return static_cast<size_t>(B * NH * T);
  }
  size_t CausalAttentionScratchFloats(int64_t, int64_t, int64_t, int64_t) const override { return 0; }

  void RoundToBf16(float* x, uint16_t* bits, int64_t n) override;
  void WidenBf16(float* dst, const uint16_t* src, int64_t n) override;
  void Add(float* out, const float* a, const float* b, int64_t n) override;
  void Axpy(float* dst, const float* src, float alpha, int64_t n) override;
  void Scale(float* x, float alpha, int64_t n) override;
  void CounterDropout(float* out, int64_t ldo, const float* x, int64_t ldx, int64_t N, int64_t C,
                      uint64_t stream, uint32_t threshold, float scale, bool accumulate) override;
  // common/quant_blocks.h Dequantize over chunks of blocks in parallel.
  Status DequantizeBlocks(float* out, const void* blocks, QuantFormat format, int64_t n) override;
  // common/adamw.h AdamWStep over chunks in parallel (elementwise: the same bits).
  void AdamW(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStepArgs& args) override;
  void GeluForward(float* out, const float* inp, int64_t n) override;
  void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  // One pass: each row's gradient is written and added to its row chunk's bias partial.
  void GeluBackwardBias(float* dinp, float* dbias, const float* inp, const float* dout, int64_t N,
                        int64_t F) override;
  double SumSquares(const float* x, int64_t n) override;

  void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                        int64_t B, int64_t T, int64_t C) override;
  void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                         int64_t B, int64_t T, int64_t C) override;
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                        const float* weight, const float* bias, int64_t N, int64_t C) override;
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C) override;
  // The copy of dresid rides in the same row loop (each row copied, then its backward,
  // while it is in cache): the same bits as the default's copy + LayerNormBackward.
  void LayerNormBackwardResidual(float* dinp, float* dweight, float* dbias, const float* dresid,
                                 const float* dout, const float* inp, const float* weight,
                                 const float* mean, const float* rstd, int64_t N, int64_t C) override;
  void AttentionForward(float* out, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                        int64_t NH) override;
  void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) override;
  void CrossEntropyForward(float* losses, float* probs, const float* logits,
                           const int32_t* targets, int64_t N, int64_t V) override;
  void CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                            float scale, int64_t N, int64_t V) override;
  // One pass per row while it is in cache (the separate backward re-read all N*V).
  void CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits,
                                   const int32_t* targets, float scale, int64_t N, int64_t V) override;

  // Llama-family ops (cpu_llama_ops.cc).
  void TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                             int64_t C) override;
  void TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                              int64_t C) override;
  void RMSNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps) override;
  void RMSNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C) override;
  void RMSNormBackwardResidual(float* dinp, float* dweight, const float* dresid, const float* dout,
                               const float* inp, const float* weight, const float* rstd, int64_t N,
                               int64_t C) override;
  void RopeForward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t row_stride, int64_t n_heads, int64_t hs) override;
  void RopeBackward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                    int64_t row_stride, int64_t n_heads, int64_t hs) override;
  void SwiGLUForward(float* out, const float* gate_up, int64_t N, int64_t F) override;
  void SwiGLUBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                      int64_t F) override;
  void SwiGLUBackwardInto(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                          int64_t F) override;
  void AttentionForwardGqa(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                           int64_t NH, int64_t NKV, int64_t hs) override;
  void AttentionBackwardGqa(float* dqkv, float* scratch, const float* dout, const float* qkv,
                            const float* att, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                            int64_t hs) override;
  void AttentionForwardGqaWindow(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                                 int64_t NH, int64_t NKV, int64_t hs, int64_t window) override;
  void AttentionBackwardGqaWindow(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* att, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                  int64_t hs, int64_t window) override;
  void GegluForward(float* out, const float* gate_up, int64_t N, int64_t F) override;
  void GegluBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                     int64_t F) override;

  // Mixture-of-experts ops (cpu_llama_ops.cc).
  void GatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int64_t n,
                  int64_t C) override;
  void ScatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale,
                      int64_t n, int64_t C) override;
  void RowDot(float* out, const float* a, const float* b, int64_t n, int64_t C) override;

  // BERT-family ops (cpu_bert_ops.cc).
  void LayerNormForwardEps(float* out, float* mean, float* rstd, const float* inp,
                           const float* weight, const float* bias, int64_t N, int64_t C,
                           float eps) override;
  void GeluErfForward(float* out, const float* inp, int64_t n) override;
  void GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n) override;
  void TanhForward(float* out, const float* inp, int64_t n) override;
  void TanhBackward(float* dinp, const float* out, const float* dout, int64_t n) override;
  void AttentionForwardMasked(float* out, float* att, const float* qkv, const int32_t* key_mask,
                              int64_t B, int64_t T, int64_t C, int64_t NH) override;
  void AttentionBackwardMasked(float* dqkv, float* scratch, const float* dout, const float* qkv,
                               const float* att, int64_t B, int64_t T, int64_t C,
                               int64_t NH) override;

  // The oneDNN implementation chosen for a plain Gemm of this shape ("brg:avx2", "ref",
  // ...); for benchmarks and diagnostics.
  std::string GemmImplName(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K);

 private:
  // Blocked causal attention for multi-head (NKV == NH) and grouped-query attention:
  // qkv rows of (NH + 2 NKV) * hs, out rows of NH * hs, lse (B, NH, T) log-sum-exps;
  // window > 0: sliding-window attention (keys (t - window, t]), 0: none.
  void CausalAttentionForward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                              int64_t NH, int64_t NKV, int64_t hs, int64_t window);
  void CausalAttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* lse,
                               int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                               int64_t window);

  // Runs f inside this backend's arena (at most num_threads_ TBB workers).
  template <typename F>
  void InArena(F&& f) {
    arena_.execute(std::forward<F>(f));
  }

  // bf16 mode: B's noted bf16 copy when B (K, N) lies in one, stored dense row-major
  // (row stride N, column stride 1); else null. Counts the operand elements either way.
  // (row_stride, col_stride: B's element strides.)
  const uint16_t* DenseBf16B(const float* B, int64_t row_stride, int64_t col_stride, int64_t M, int64_t N, int64_t K);

  int num_threads_;
  CpuGemmPrecision gemm_;
  Bf16Copies bf16_copies_;  // NoteBf16Copy's, until forgotten (bf16 mode only)
  Bf16OperandStats bf16_stats_;
  tbb::task_arena arena_;
  std::unique_ptr<ThreadPinner> pinner_;  // L2L_CPU_PIN=1 only (cpu_pinning.h)
  std::unique_ptr<DnnlMatmul> matmul_;
  std::vector<float> row_partials_;  // ReduceRowChunks' per-chunk partial sums (reused)
};

}  // namespace l2l::kernels
