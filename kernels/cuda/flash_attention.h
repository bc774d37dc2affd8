// Fused (FlashAttention-2 style) attention on the GPU: no (T,T) buffer anywhere. The
// forward runs one block of 4 warps per (64 query rows, head, batch element): the warps
// share each 16-key tile of K and V in static shared memory, and each warp owns 16 of the
// rows: its S tile, a running row max and row sum (online softmax, fp32, two lanes per
// row), its P tile and its output accumulators (in registers), with warp barriers only
// between the block's two per tile; it writes out and one log-sum-exp per row
// (L = m + log l). The backward
// recomputes each (16 x 16) probability tile from q, k and L: a first pass (the forward's
// code) recomputes the output rows and stores D = rowsum(dO * O) per row in `scratch`;
// then one block per (16 keys, key/value head, batch element) accumulates dK and dV over
// every query row of the key/value head's query heads (GQA: the group's NH/NKV heads, so
// no atomics: each block owns its dK/dV rows), and one block per (16 query rows, head,
// batch element) accumulates dQ over the key tiles. The gradients are added (+=) to dqkv.
//
// Products (the tile GEMMs S = Q K^T, P V, dP = dO V^T, P^T dO, dS^T Q, dS K) run on
// 16x16 shared-memory tiles in one of two modes:
//   fp32 (bf16 == false; the backend's fp32 / tf32 GEMM modes): fp32 FMA dot products,
//     so the result agrees with the CPU backend at fp32 tolerances (tf32 would not buy
//     much here: the kernel is not the cuBLASLt path, and fp32 keeps the conformance
//     bounds of the GEMM path's fp32 mode);
//   bf16 (the backend's kBf16 mode): q, k, v, dout and the P / dS tiles are rounded to
//     bf16 (nearest even) when they are written to shared memory, and the products are
//     WMMA (nvcuda::wmma, 16x16x16 bf16 tensor-core MMAs) with fp32 accumulation, as the
//     GEMM path's bf16 mode rounds the same operands. The softmax stays fp32.
// Both modes share the tiling and every non-product line.
//
// Masks: causal (key j <= query t), causal sliding window (t - window < j <= t, window >
// 0) or bidirectional with a key padding mask (key_mask (B,T) int32, 0 = padded; a row
// with no real key gets zero output and L = +inf, so its gradients are zero).
//
// Layout (kernels/backend.h): qkv rows of W = (NH + 2*NKV)*hs floats hold q (NH heads),
// k and v (NKV heads each); query head h reads key/value head h / (NH/NKV). The MHA form
// is NKV == NH (W = 3C). out / dout rows have NH*hs floats.
//
// Head sizes: 64, 80, 96, 128 (FlashSupportedHeadSize); the kernels are templates on
// the head size with static shared memory under 48 KiB per block (the fp32 backward at
// hs = 128 is the largest, about 45 KiB).
//
// Internal to kernels/cuda. Thread-safety: launches on the given stream only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace l2l::kernels::cuda {

bool FlashSupportedHeadSize(int64_t hs);

struct FlashShape {
  int64_t B = 0, T = 0, NH = 0, NKV = 0, hs = 0;
  int64_t window = 0;                 // > 0: causal sliding window; causal forms only
  bool causal = true;                 // false: bidirectional with key_mask
  const int32_t* key_mask = nullptr;  // (B,T) int32 device memory, or nullptr (all real)
  bool bf16 = false;                  // WMMA bf16 products (see above)
};

// out (B,T,NH*hs), lse (B,NH,T) at lse[(b*NH + h)*T + t], from qkv (B,T,W). out_bits
// (optional): out's values as bf16 (nearest even) too, for the bf16 GEMM that reads out
// next (the backend's Bf16Operands::Produce).
// REQUIRES FlashSupportedHeadSize(hs), NKV > 0, NH % NKV == 0.
void FlashAttentionForward(const FlashShape& s, float* out, float* lse, const float* qkv,
                           cudaStream_t stream, uint16_t* out_bits = nullptr);
// dqkv (B,T,W) += gradient from dout (B,T,NH*hs), qkv and the forward's lse; d_rows
// (B*NH*T floats) is overwritten with D = rowsum(dO * O). dqkv_bits (optional): dqkv's
// resulting values as bf16 too (every element of dqkv is written by the two passes).
void FlashAttentionBackward(const FlashShape& s, float* dqkv, float* d_rows, const float* dout,
                            const float* qkv, const float* lse, cudaStream_t stream,
                            uint16_t* dqkv_bits = nullptr);

}  // namespace l2l::kernels::cuda
