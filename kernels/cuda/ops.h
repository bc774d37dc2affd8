// Host launchers of our CUDA kernels (the __global__ kernels themselves are file-local in
// elementwise.cu, reduce.cu, softmax.cu, embedding_backward.cu, llama_ops.cu). Shapes follow
// kernels/backend.h: N rows, C channels, V vocab, T time, B batch, NH heads.
// Every launcher takes its stream, queues work on it and returns; a launch failure
// aborts through L2L_CUDA_CHECK_LAUNCH (after each launch).
//
// Internal to kernels/cuda: exposes CUDA types.
// Thread-safety: stateless; callers serialise use of a stream.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace l2l::kernels::cuda {

// ---- elementwise.cu -----------------------------------------------------------------
void LaunchAdd(float* out, const float* a, const float* b, int64_t n, cudaStream_t s);
void LaunchAxpy(float* dst, const float* src, float alpha, int64_t n, cudaStream_t s);
void LaunchScale(float* x, float alpha, int64_t n, cudaStream_t s);
// ---- adamw.cu: common/adamw.h AdamWStep in place, bitwise (the interleaved optimizer).
// The scalars are those of common/adamw.h AdamWScalars (MakeAdamWScalars) the exact
// update reads, copied field for field (adamw.cu is nvcc C++17 and does not include
// common/adamw.h).
struct AdamWKernelScalars {
  float decay_mul, one_minus_b1, beta2, one_minus_b2, bc2_sqrt, neg_step_size, eps, grad_scale;
};
void LaunchAdamW(float* p, const float* g, float* m, float* v, int64_t n, const AdamWKernelScalars& c,
                 cudaStream_t s);
// C (rows, cols) with leading dimension ld: C *= alpha (the K == 0 case of a GEMM).
void LaunchScaleMatrix(float* c, float alpha, int64_t rows, int64_t cols, int64_t ld,
                       cudaStream_t s);
// kernels/backend.h Backend::CounterDropout: out (N, ldo) (+)= keep(i) ? x * scale : 0.
void LaunchCounterDropout(float* out, int64_t ldo, const float* x, int64_t ldx, int64_t N, int64_t C,
                          uint64_t stream, uint32_t threshold, float scale, bool accumulate, cudaStream_t s);
// bits (every *Forward launch that takes it; null: none): the output's bf16 copy too,
// rounded to nearest even in the same pass (the bf16 GEMM mode's fresh operand copies).
void LaunchGeluForward(float* out, const float* inp, int64_t n, cudaStream_t s, uint16_t* bits = nullptr);
void LaunchGeluBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                        cudaStream_t s);
// out (N,OC) += bias (OC).
void LaunchAddBias(float* out, const float* bias, int64_t N, int64_t OC, cudaStream_t s);
// Backend::LinearForward's epilogue after its GEMM, in one pass over y (N,OC): y += bias
// (when not null), then y += residual (when not null) or act = gelu_tanh(y) (when act is
// not null). The same bits as LaunchAddBias, LaunchAdd and LaunchGeluForward in turn.
// act_bits: act's bf16 copy (null: none).
void LaunchLinearEpilogue(float* y, const float* bias, float* act, const float* residual, int64_t N,
                          int64_t OC, cudaStream_t s, uint16_t* act_bits = nullptr);
// out (B,T,C) = wte[tokens] + wpe[t].
void LaunchEmbeddingForward(float* out, const int32_t* tokens, const float* wte,
                            const float* wpe, int64_t B, int64_t T, int64_t C, cudaStream_t s);
// dlogits (N,V) = scale * (probs - onehot(targets)); may alias probs.
void LaunchCrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                float scale, int64_t N, int64_t V, cudaStream_t s);
// bf16 stored as uint16_t; round to nearest even.
void LaunchCastF32ToBf16(uint16_t* dst, const float* src, int64_t n, cudaStream_t s);
void LaunchCastBf16ToF32(float* dst, const uint16_t* src, int64_t n, cudaStream_t s);
// x (n) rounded in place to bf16 values (round to nearest even); their bits to bits
// (n) unless null (Backend::RoundToBf16).
void LaunchRoundToBf16(float* x, uint16_t* bits, int64_t n, cudaStream_t s);

// ---- quant.cu: common/quant_blocks.h's block formats (the same layouts; this header does
// not include it: .cu files are nvcc C++17). Dequantized bit-equal to its CPU code (one
// fp32 multiply per element).
enum class BlockFormat { kNf4, kQ4_0, kQ8_0 };
// out (n) = blocks dequantized; REQUIRES: n a multiple of the format's block size (64
// NF4, 32 Q4_0 / Q8_0).
void LaunchDequantizeBlocks(float* out, const uint8_t* blocks, BlockFormat format, int64_t n, cudaStream_t s);

// ---- reduce.cu -------------------------------------------------------------------
// Deterministic column sums: `groups` blocks of rows each write a partial row of sums to
// `scratch` (groups, cols), then one pass adds the partials in a fixed order. This says
// how many row groups to use for N rows (1..64).
int64_t ColumnSumGroups(int64_t N);
// dbias (OC) += column sums of dout (N,OC). scratch: >= groups*OC floats.
void LaunchBiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC, float* scratch,
                        int64_t groups, cudaStream_t s);
// out (N,C), mean (N), rstd (N); rstd = 1/sqrt(biased variance + eps) (1e-5 for
// Backend::LayerNormForward, the model's layer_norm_eps for LayerNormForwardEps).
void LaunchLayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int64_t N, int64_t C,
                            float eps, cudaStream_t s, uint16_t* bits = nullptr);
// The norm backwards run in one pass (input gradient and parameter-gradient partials
// together) for rows up to these widths (the block's shared accumulators), in two above.
inline constexpr int64_t kFusedLayerNormMaxC = 4096;
inline constexpr int64_t kFusedRmsNormMaxC = 8192;
inline constexpr int64_t kFusedNormMaxGroups = 264;
// Row groups (partials) the norm backward launchers use for N rows of C, with
// max_fused_c = kFusedLayerNormMaxC or kFusedRmsNormMaxC: size their scratch with it.
int64_t NormBackwardGroups(int64_t N, int64_t C, int64_t max_fused_c);
// dinp (N,F) = gelu'(inp) * dout (overwritten); dbias (F) += its column sums (skipped
// when null). One pass; the same summation order as LaunchBiasBackward.
// scratch: >= groups*F floats, groups = ColumnSumGroups(N).
// bits: dinp's bf16 copy (null: none).
void LaunchGeluBackwardBias(float* dinp, float* dbias, const float* inp, const float* dout,
                            int64_t N, int64_t F, float* scratch, int64_t groups, cudaStream_t s,
                            uint16_t* bits = nullptr);
// dinp (N,C) = (dresid, or dinp itself when dresid is null) + the gradient through the
// norm; dweight (C) +=, dbias (C) +=. dinp may alias dresid. scratch: >= 2*groups*C
// floats, groups = NormBackwardGroups(N, C, kFusedLayerNormMaxC). bits: dinp's bf16 copy
// (null: none; only on the one-pass path, C <= kFusedLayerNormMaxC; RMSNorm: kFusedRmsNormMaxC).
void LaunchLayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dresid,
                             const float* dout, const float* inp, const float* weight,
                             const float* mean, const float* rstd, int64_t N, int64_t C,
                             float* scratch, int64_t groups, cudaStream_t s, uint16_t* bits = nullptr);
// *result (device double) = sum of x[i]^2 in double, fixed reduction order.
// scratch: >= kSumSquaresBlocks doubles.
inline constexpr int kSumSquaresBlocks = 264;
void LaunchSumSquares(double* result, const float* x, int64_t n, double* scratch, cudaStream_t s);

// ---- softmax.cu -------------------------------------------------------------------
// att (rows, T, T) in place, rows = B*NH: row t keeps softmax over j <= t of att[t, j]
// (already scaled), zeros for j > t. window > 0: only keys t - window < j <= t (a sliding
// window), zeros elsewhere; 0: none.
void LaunchCausalSoftmaxForward(float* att, int64_t rows, int64_t T, cudaStream_t s,
                                int64_t window = 0);
// datt (rows,T,T) in place: datt = scale * att * (datt - sum_j att*datt), zero for j > t
// (and, with a window, for j <= t - window).
void LaunchCausalSoftmaxBackward(float* datt, const float* att, int64_t rows, int64_t T,
                                 float scale, cudaStream_t s, int64_t window = 0);
// losses (N), probs (N,V) from logits (N,V), targets (N). A target outside [0,V) gives a
// NaN loss (the kernel cannot return an error).
void LaunchCrossEntropyForward(float* losses, float* probs, const float* logits,
                               const int32_t* targets, int64_t N, int64_t V, cudaStream_t s);

// Bidirectional softmax with a key padding mask (the BERT family's attention), in place
// on att (B*NH*T, T) scores (already scaled): row (b, h, t) keeps softmax over the keys j
// with key_mask[b*T + j] != 0 (key_mask (B,T); nullptr: every key), zeros elsewhere. A
// row with no real key becomes all zeros (callers reject such sequences on the host).
void LaunchMaskedSoftmaxForward(float* att, const int32_t* key_mask, int64_t B, int64_t NH,
                                int64_t T, cudaStream_t s);
// datt (rows,T,T) in place: datt = scale * att * (datt - sum_j att*datt) over whole rows
// (masked keys have att 0, so their gradient is 0).
void LaunchSoftmaxBackward(float* datt, const float* att, int64_t rows, int64_t T, float scale,
                           cudaStream_t s);

// ---- embedding_backward.cu ---------------------------------------------------------
// Scratch bytes the deterministic embedding backward needs for N = B*T tokens.
size_t EmbeddingBackwardScratchBytes(int64_t N);
// dwte (V,C) += rows of dout gathered by token, summed in position order per token
// (a stable radix sort groups positions by token; deterministic); dwpe (>=T,C) += sum
// over the batch. scratch: EmbeddingBackwardScratchBytes(B*T) bytes, 256-aligned.
void LaunchEmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                             int64_t B, int64_t T, int64_t C, void* scratch, size_t scratch_bytes,
                             cudaStream_t s);
// dwte (V,C) += rows of dout (N,C) gathered by token, the same deterministic sort (no
// position table). scratch: EmbeddingBackwardScratchBytes(N) bytes, 256-aligned.
void LaunchTokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                                  int64_t C, void* scratch, size_t scratch_bytes, cudaStream_t s);

// ---- llama_ops.cu (the Llama family's elementwise ops) -----------------------------
// out (N,C) = wte[tokens[n]].
void LaunchTokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                                 int64_t C, cudaStream_t s);
// Rotary embedding in place (kernels/backend.h RopeForward / RopeBackward): sign +1
// rotates by +angle (forward), -1 by -angle (the backward's transposed rotation). bits
// (REQUIRES row_stride % hs == 0): every row's row_stride values as bf16 too, the heads
// from n_heads on (a packed row's v) as they are.
void LaunchRope(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                int64_t row_stride, int64_t n_heads, int64_t hs, float sign, cudaStream_t s,
                uint16_t* bits = nullptr);
// out (N,F) = silu(gate) * up from gate_up (N,2F).
void LaunchSwiGLUForward(float* out, const float* gate_up, int64_t N, int64_t F, cudaStream_t s,
                         uint16_t* bits = nullptr);
// dgate_up (N,2F) += [dout * up * silu'(gate) | dout * silu(gate)] (accumulate), or =
// (overwritten) when !accumulate.
// bits: dgate_up's bf16 copy (null: none).
void LaunchSwiGLUBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                          int64_t F, bool accumulate, cudaStream_t s, uint16_t* bits = nullptr);
// Mixture-of-experts row ops (llama_ops.cu; kernels/backend.h GatherRows, ScatterAddRows,
// RowDot). scale may be nullptr (all 1). One thread per output element (RowDot: per row).
void LaunchGatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int64_t n,
                      int64_t C, cudaStream_t s);
void LaunchScatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale,
                          int64_t n, int64_t C, cudaStream_t s);
void LaunchRowDot(float* out, const float* a, const float* b, int64_t n, int64_t C, cudaStream_t s);
// out (N,F) = gelu_tanh(gate) * up from gate_up (N,2F) (Gemma's GeGLU).
void LaunchGegluForward(float* out, const float* gate_up, int64_t N, int64_t F, cudaStream_t s,
                        uint16_t* bits = nullptr);
// dgate_up (N,2F) += [dout * up * gelu_tanh'(gate) | dout * gelu_tanh(gate)].
void LaunchGegluBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                         int64_t F, cudaStream_t s);
// dst row r (cols floats, stride dst_ld) = src row r (stride src_ld), r < rows; with bits,
// their bf16 bits at the same offsets of bits (a held copy of dst's buffer) too.
void LaunchCopy2D(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                  int64_t cols, cudaStream_t s, uint16_t* bits = nullptr);
// RMSNorm (reduce.cu): out (N,C) = inp * rstd * weight, rstd (N). One block per row.
void LaunchRMSNormForward(float* out, float* rstd, const float* inp, const float* weight,
                          int64_t N, int64_t C, float eps, cudaStream_t s, uint16_t* bits = nullptr);
// dinp (N,C) = (dresid, or dinp itself when dresid is null) + the gradient through the
// norm; dweight (C) += (deterministic column sums). dinp may alias dresid.
// scratch: >= groups*C floats, groups = NormBackwardGroups(N, C, kFusedRmsNormMaxC).
void LaunchRMSNormBackward(float* dinp, float* dweight, const float* dresid, const float* dout,
                           const float* inp, const float* weight, const float* rstd, int64_t N,
                           int64_t C, float* scratch, int64_t groups, cudaStream_t s,
                           uint16_t* bits = nullptr);

// ---- bert_ops.cu (the BERT family's elementwise ops) ---------------------------------
// out (n) = 0.5 x (1 + erf(x / sqrt(2))) (exact GELU).
void LaunchGeluErfForward(float* out, const float* inp, int64_t n, cudaStream_t s, uint16_t* bits = nullptr);
// dinp (n) += gelu'(inp) * dout.
void LaunchGeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n,
                           cudaStream_t s);
// out (n) = tanh(inp).
void LaunchTanhForward(float* out, const float* inp, int64_t n, cudaStream_t s);
// dinp (n) += (1 - out^2) * dout, from the forward's output.
void LaunchTanhBackward(float* dinp, const float* out, const float* dout, int64_t n,
                        cudaStream_t s);

}  // namespace l2l::kernels::cuda
