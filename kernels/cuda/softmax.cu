// Softmax kernels: the causal softmax of attention and the bidirectional one with a key
// padding mask (forward and backward, one warp per row of the (B*NH*T, T) score matrix,
// in place) and the fused softmax + cross-entropy
// of the LM head (one block per row of V logits). Launchers in ops.h.
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

// att (R*T, T) with R = B*NH: row r is query t = r % T. In place; keys outside [lo, t]
// become 0, lo = max(0, t - window + 1) with a window (> 0), else 0.
__global__ void CausalSoftmaxForwardKernel(float* att, int64_t total_rows, int64_t T, int64_t window) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5);
  if (r >= total_rows) return;  // whole warp leaves together
  const int64_t t = r % T;
  const int64_t lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
  float* p = att + r * T;
  float mx = -INFINITY;
  for (int64_t j = lo + lane; j <= t; j += 32) mx = fmaxf(mx, p[j]);
  mx = WarpMax(mx);
  float sum = 0.0f;
  for (int64_t j = lo + lane; j <= t; j += 32) sum += expf(p[j] - mx);
  const float inv = 1.0f / WarpSum(sum);
  for (int64_t j = lane; j < T; j += 32) p[j] = j >= lo && j <= t ? expf(p[j] - mx) * inv : 0.0f;
}

// datt = scale * att * (datt - <att, datt>) on [lo, t] (as the forward's), 0 elsewhere.
// In place on datt.
__global__ void CausalSoftmaxBackwardKernel(float* datt, const float* att, int64_t total_rows,
                                            int64_t T, float scale, int64_t window) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5);
  if (r >= total_rows) return;
  const int64_t t = r % T;
  const int64_t lo = window > 0 && t - window + 1 > 0 ? t - window + 1 : 0;
  float* d = datt + r * T;
  const float* p = att + r * T;
  float dot = 0.0f;
  for (int64_t j = lo + lane; j <= t; j += 32) dot += p[j] * d[j];
  dot = WarpSum(dot);
  for (int64_t j = lane; j < T; j += 32) d[j] = j >= lo && j <= t ? scale * p[j] * (d[j] - dot) : 0.0f;
}

// att (B*NH*T, T): row r belongs to sequence b = r / (NH*T). Keys j with
// key_mask[b*T + j] == 0 get probability 0; so does a whole row without a real key
// (no NaN: the sum is 0 and nothing is divided by it).
__global__ void MaskedSoftmaxForwardKernel(float* att, const int32_t* key_mask, int64_t total_rows,
                                           int64_t rows_per_seq, int64_t T) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5);
  if (r >= total_rows) return;  // whole warp leaves together
  const int32_t* m = key_mask != nullptr ? key_mask + (r / rows_per_seq) * T : nullptr;
  float* p = att + r * T;
  float mx = -INFINITY;
  for (int64_t j = lane; j < T; j += 32) {
    if (m == nullptr || m[j] != 0) mx = fmaxf(mx, p[j]);
  }
  mx = WarpMax(mx);
  float sum = 0.0f;
  for (int64_t j = lane; j < T; j += 32) {
    if (m == nullptr || m[j] != 0) sum += expf(p[j] - mx);
  }
  sum = WarpSum(sum);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (int64_t j = lane; j < T; j += 32) {
    p[j] = (m == nullptr || m[j] != 0) ? expf(p[j] - mx) * inv : 0.0f;
  }
}

// datt = scale * att * (datt - <att, datt>) over the whole row. In place on datt.
__global__ void SoftmaxBackwardKernel(float* datt, const float* att, int64_t total_rows, int64_t T,
                                      float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t r = blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5);
  if (r >= total_rows) return;
  float* d = datt + r * T;
  const float* p = att + r * T;
  float dot = 0.0f;
  for (int64_t j = lane; j < T; j += 32) dot += p[j] * d[j];
  dot = WarpSum(dot);
  for (int64_t j = lane; j < T; j += 32) d[j] = scale * p[j] * (d[j] - dot);
}

// One block per row. probs may alias logits: every read of the row happens before the
// last block reduction's barrier, every write after it.
__global__ void CrossEntropyForwardKernel(float* losses, float* probs, const float* logits,
                                          const int32_t* targets, int64_t V) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  const int32_t target = targets[row];
  const bool valid = target >= 0 && target < V;
  const float xt = (threadIdx.x == 0 && valid) ? x[target] : 0.0f;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = BlockMax(mx, smem);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += expf(x[j] - mx);
  sum = BlockSum(sum, smem);
  const float inv = 1.0f / sum;
  float* p = probs + row * V;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) p[j] = expf(x[j] - mx) * inv;
  // An ignored position (target kIgnoreTarget = -1) has loss 0; any other invalid target NaN.
  if (threadIdx.x == 0) losses[row] = valid ? logf(sum) - (xt - mx) : (target == -1 ? 0.0f : NAN);
}

unsigned WarpRowBlocks(int64_t rows) {
  const int64_t per_block = kThreads / 32;
  return static_cast<unsigned>((rows + per_block - 1) / per_block);
}

}  // namespace

void LaunchCausalSoftmaxForward(float* att, int64_t rows, int64_t T, cudaStream_t s, int64_t window) {
  if (rows <= 0 || T <= 0) return;
  L2L_LAUNCH(CausalSoftmaxForwardKernel, WarpRowBlocks(rows * T), kThreads, 0, s)(att, rows * T, T, window);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchCausalSoftmaxBackward(float* datt, const float* att, int64_t rows, int64_t T,
                                 float scale, cudaStream_t s, int64_t window) {
  if (rows <= 0 || T <= 0) return;
  L2L_LAUNCH(CausalSoftmaxBackwardKernel, WarpRowBlocks(rows * T), kThreads, 0, s)(
      datt, att, rows * T, T, scale, window);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchMaskedSoftmaxForward(float* att, const int32_t* key_mask, int64_t B, int64_t NH,
                                int64_t T, cudaStream_t s) {
  if (B <= 0 || NH <= 0 || T <= 0) return;
  const int64_t rows = B * NH * T;
  L2L_LAUNCH(MaskedSoftmaxForwardKernel, WarpRowBlocks(rows), kThreads, 0, s)(att, key_mask, rows,
                                                                             NH * T, T);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchSoftmaxBackward(float* datt, const float* att, int64_t rows, int64_t T, float scale,
                           cudaStream_t s) {
  if (rows <= 0 || T <= 0) return;
  L2L_LAUNCH(SoftmaxBackwardKernel, WarpRowBlocks(rows * T), kThreads, 0, s)(datt, att, rows * T,
                                                                            T, scale);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchCrossEntropyForward(float* losses, float* probs, const float* logits,
                               const int32_t* targets, int64_t N, int64_t V, cudaStream_t s) {
  if (N <= 0 || V <= 0) return;
  L2L_LAUNCH(CrossEntropyForwardKernel, static_cast<unsigned>(N), 512, 0, s)(
      losses, probs, logits, targets, V);
  L2L_CUDA_CHECK_LAUNCH();
}

}  // namespace l2l::kernels::cuda
