// Causal multi-head attention on the GPU as batched cuBLASLt GEMMs around our fused
// causal-softmax kernels (softmax.cu); the bidirectional key-masked form (encoders) swaps
// in the masked softmax and is otherwise the same code.
//
// This backend stores the full (B,NH,T,T) probability matrix in `att` for its backward
// (the contract lets each backend keep its own stash there: the CPU backend keeps only
// row log-sum-exps and recomputes blocks). The two products are exactly what cuBLASLt's
// tensor-core GEMMs do best; the softmax is one fused pass per row (max, exp-sum,
// normalise, causal mask). The cost is computing the masked upper triangle of Q K^T
// (about 2x the causal FLOPs of those two products) and the T x T memory; the backend's
// default is the fused kernel of flash_attention.h where the head size allows, and this
// path serves L2L_CUDA_ATTENTION=gemm and the other head sizes.
//
// Layout: qkv (B,T,3C) rows hold q|k|v, each NH heads of hs = C/NH. Head h of batch b
// is the (T, hs) matrix at qkv + b*T*3C + {0,C,2C} + h*hs with row stride 3C, so the NH
// heads of one batch element form a strided batch (stride hs, interleaved); we loop
// over b. If cuBLASLt rejects an interleaved batch we fall back to one GEMM per head.
//
// Grouped-query attention (the Llama family): qkv rows hold q (NH heads), k and v (NKV
// heads each), W = (NH + 2*NKV)*hs wide; query head h = g*rep + r (rep = NH/NKV) reads
// key/value head g. For each r the heads {g*rep + r : g < NKV} form a strided batch of
// NKV matrices (query stride rep*hs, key/value stride hs, probability stride rep*T*T),
// so a product is rep batched GEMMs per batch element; the key/value gradients of a
// group add up over the rep passes (beta 1, stream-ordered). Multi-head attention is
// the case NKV == NH (rep 1: one batch of NH heads, the layout above).
//
// bf16 mode (the backend's CudaGemmPrecision::kBf16, PyTorch-autocast numerics): every
// operand tensor is cast to bf16 (round to nearest even) once, whole, into backend
// scratch, and the products read the copy at the same element offsets (so the
// interleaved head layout is unchanged) with fp32 accumulation into the fp32 outputs.
// qkv (and dout in the backward) are cast once per call for all B; the (NH,T,T)
// probabilities / softmax gradients once per batch element (keeps the scratch at
// NH*T*T bf16 instead of B*NH*T*T). The softmax itself stays fp32.
//
// Internal to kernels/cuda. Thread-safety: as the LtGemm it uses.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "kernels/cuda/gemm.h"

namespace l2l::kernels::cuda {

// How the attention products compute (the backend's fp32-GEMM mode).
struct AttentionGemmMode {
  // fp32 mode: the cuBLASLt compute type (CUBLAS_COMPUTE_32F or _32F_FAST_TF32).
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  // Set: bf16 mode. Returns device scratch for `elems` bf16 values in slot 0 or 1 (two
  // distinct buffers), valid until the next request for the same slot; a request may
  // wait for the stream (when the slot grows), never for the other slot's contents.
  std::function<uint16_t*(int slot, int64_t elems)> bf16_scratch;
};

// out (B,T,C), att (B,NH,T,T) probabilities, from qkv (B,T,3C).
void AttentionForward(LtGemm& gemm, const AttentionGemmMode& mode, float* out, float* att,
                      const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                      cudaStream_t s);
// dqkv (B,T,3C) += gradient from dout (B,T,C); scratch (B,NH,T,T) overwritten.
void AttentionBackward(LtGemm& gemm, const AttentionGemmMode& mode, float* dqkv, float* scratch,
                       const float* dout, const float* qkv, const float* att, int64_t B,
                       int64_t T, int64_t C, int64_t NH, cudaStream_t s);

// Grouped-query forms (kernels/backend.h AttentionForwardGqa / AttentionBackwardGqa):
// qkv and dqkv (B,T,W), out and dout (B,T,NH*hs), att and scratch (B,NH,T,T).
// REQUIRES NKV > 0, NH % NKV == 0.
// window > 0: sliding-window attention (keys t - window < j <= t; the masked softmax
// zeroes the rest of the full (T,T) rows); 0: plain causal.
void AttentionForwardGqa(LtGemm& gemm, const AttentionGemmMode& mode, float* out, float* att,
                         const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                         int64_t hs, cudaStream_t s, int64_t window = 0);
void AttentionBackwardGqa(LtGemm& gemm, const AttentionGemmMode& mode, float* dqkv, float* scratch,
                          const float* dout, const float* qkv, const float* att, int64_t B,
                          int64_t T, int64_t NH, int64_t NKV, int64_t hs, cudaStream_t s,
                          int64_t window = 0);

// Bidirectional multi-head attention with a key padding mask (kernels/backend.h
// AttentionForwardMasked / AttentionBackwardMasked; the BERT family): the same products
// as AttentionForward with the masked full-row softmax (softmax.cu) in place of the
// causal one. qkv and dqkv (B,T,3C), out and dout (B,T,C), att and scratch (B,NH,T,T);
// key_mask (B,T) int32 device memory or nullptr. The backward reads the mask from att's
// zeros.
void AttentionForwardMasked(LtGemm& gemm, const AttentionGemmMode& mode, float* out, float* att,
                            const float* qkv, const int32_t* key_mask, int64_t B, int64_t T,
                            int64_t C, int64_t NH, cudaStream_t s);
void AttentionBackwardMasked(LtGemm& gemm, const AttentionGemmMode& mode, float* dqkv,
                             float* scratch, const float* dout, const float* qkv, const float* att,
                             int64_t B, int64_t T, int64_t C, int64_t NH, cudaStream_t s);

}  // namespace l2l::kernels::cuda
