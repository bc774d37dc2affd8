// Causal multi-head attention on the GPU as batched cuBLASLt GEMMs around our fused
// causal-softmax kernels (softmax.cu).
//
// Why not a fused flash-attention kernel: Backend::AttentionForward must return the full
// (B,NH,T,T) probability matrix (the backward contract reads it), so the memory saving
// that motivates flash attention is not available behind this interface, and the two
// products are then exactly what cuBLASLt's tensor-core GEMMs do best. The softmax is
// one fused pass per row (max, exp-sum, normalise, causal mask). The cost is computing
// the masked upper triangle of Q K^T (about 2x the causal FLOPs of those two products).
// The bf16 relay path can later swap in a flash kernel behind its own entry point.
//
// Layout: qkv (B,T,3C) rows hold q|k|v, each NH heads of hs = C/NH. Head h of batch b
// is the (T, hs) matrix at qkv + b*T*3C + {0,C,2C} + h*hs with row stride 3C, so the NH
// heads of one batch element form a strided batch (stride hs, interleaved); we loop
// over b. If cuBLASLt rejects an interleaved batch we fall back to one GEMM per head.
//
// Internal to kernels/cuda. Thread-safety: as the LtGemm it uses.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gemm.h"

namespace l2l::kernels::cuda {

// out (B,T,C), att (B,NH,T,T) probabilities, from qkv (B,T,3C).
void AttentionForward(LtGemm& gemm, cublasComputeType_t compute, float* out, float* att,
                      const float* qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                      cudaStream_t s);
// dqkv (B,T,3C) += gradient from dout (B,T,C); scratch (B,NH,T,T) overwritten.
void AttentionBackward(LtGemm& gemm, cublasComputeType_t compute, float* dqkv, float* scratch,
                       const float* dout, const float* qkv, const float* att, int64_t B,
                       int64_t T, int64_t C, int64_t NH, cudaStream_t s);

}  // namespace l2l::kernels::cuda
