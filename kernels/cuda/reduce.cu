// Reduction kernels: bias backward (column sums), the GELU backward with its bias
// gradient in one pass, LayerNorm forward (one warp per row) and backward, RMSNorm forward
// (one block per row) and backward, sum of squares in double. The norm backwards are one
// pass when C fits the block's shared accumulators (ops.h kFused*NormMaxC): a block walks a
// group of rows, writing each row's input gradient and adding its parameter-gradient
// terms into per-column accumulators, then the groups' partials are summed; wider rows
// take two passes (input kernel, then column sums). Every
// reduction runs in a fixed order (partials per block, then a fixed-order pass), so the
// results are bitwise reproducible run to run; no atomics. Launchers in ops.h.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

constexpr int kColTile = 32;   // columns per block (one warp-wide coalesced row segment)
constexpr int kRowLanes = 8;   // rows processed in parallel per block

// The block-wide column sums of the column-partial kernels (block (kColTile, kRowLanes)):
// every thread puts its row lane's sum acc for its column into tile, and thread row 0 gets
// back the sum over the lanes, in lane order (0 elsewhere). Contains a __syncthreads: call
// it from every thread of the block.
__device__ float SumRowLanes(float (&tile)[kRowLanes][kColTile + 1], float acc) {
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  float sum = 0.0f;
  if (threadIdx.y == 0) {
    for (int i = 0; i < kRowLanes; ++i) sum += tile[i][threadIdx.x];
  }
  return sum;
}

// partial (groups, cols): partial[g, c] = sum over rows of group g of dout[r, c].
// grid (ceil(cols/32), groups), block (32, 8).
__global__ void ColumnSumPartialKernel(float* partial, const float* dout, int64_t N, int64_t cols,
                                       int64_t rows_per_group) {
  __shared__ float smem[kRowLanes][kColTile + 1];
  const int64_t c = blockIdx.x * int64_t{kColTile} + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_group;
  const int64_t r1 = min(N, r0 + rows_per_group);
  float acc = 0.0f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) acc += dout[r * cols + c];
  }
  const float sum = SumRowLanes(smem, acc);
  if (threadIdx.y == 0 && c < cols) partial[blockIdx.y * cols + c] = sum;
}

// dst (cols) += sum over g of partial (groups, cols), g in order.
__global__ void ColumnSumFinalKernel(float* dst, const float* partial, int64_t groups,
                                     int64_t cols) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
       c += int64_t{blockDim.x} * gridDim.x) {
    float sum = 0.0f;
    for (int64_t g = 0; g < groups; ++g) sum += partial[g * cols + c];
    dst[c] += sum;
  }
}

// The GELU backward with its bias gradient, one pass (the grid and summation order of
// ColumnSumPartialKernel): dinp[r, c] = gelu'(inp) * dout (overwritten); partial[g, c] =
// sum over the group's rows of that dinp (skipped when partial is null).
__global__ void GeluBackwardBiasPartialKernel(float* partial, float* dinp, const float* inp,
                                              const float* dout, int64_t N, int64_t cols,
                                              int64_t rows_per_group, __nv_bfloat16* bits) {
  __shared__ float smem[kRowLanes][kColTile + 1];
  const int64_t c = blockIdx.x * int64_t{kColTile} + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_group;
  const int64_t r1 = min(N, r0 + rows_per_group);
  float acc = 0.0f;
  if (c < cols) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const int64_t i = r * cols + c;
      const float g = GeluTanhGrad(inp[i]) * dout[i];
      dinp[i] = g;
      if (bits != nullptr) bits[i] = __float2bfloat16_rn(g);
      acc += g;
    }
  }
  if (partial == nullptr) return;  // uniform over the block
  const float sum = SumRowLanes(smem, acc);
  if (threadIdx.y == 0 && c < cols) partial[blockIdx.y * cols + c] = sum;
}

// One pass of the LayerNorm backward for rows of C <= kFusedLayerNormMaxC: block g walks rows
// [g*rows_per_group, ...) in order, the whole block on one row at a time (thread t owns
// columns t, t + blockDim.x, ...). Per row: dinp = (dresid ? dresid : dinp) +
// rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight; the owner thread adds
// dout * xhat and dout into its columns' shared accumulators, which end as partial (2,
// groups, C): [0] dweight terms, [1] dbias terms. Each element is read and written by
// one thread, so dinp may alias dresid.
__global__ void LayerNormBackwardFusedKernel(float* partial, float* dinp, const float* dresid,
                                             const float* dout, const float* inp,
                                             const float* weight, const float* mean,
                                             const float* rstd, int64_t N, int64_t C,
                                             int64_t rows_per_group, __nv_bfloat16* bits) {
  __shared__ float sdw[kFusedLayerNormMaxC];
  __shared__ float sdb[kFusedLayerNormMaxC];
  __shared__ float smem[32];
  const int64_t r0 = blockIdx.x * rows_per_group;
  const int64_t r1 = min(N, r0 + rows_per_group);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sdw[c] = sdb[c] = 0.0f;
  for (int64_t row = r0; row < r1; ++row) {
    const float* x = inp + row * C;
    const float* dy = dout + row * C;
    const float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float g = dy[c] * weight[c];
      sg += g;
      sgx += g * (x[c] - m) * r;
    }
    sg = BlockSum(sg, smem) / static_cast<float>(C);
    sgx = BlockSum(sgx, smem) / static_cast<float>(C);
    float* dx = dinp + row * C;
    const float* base = dresid != nullptr ? dresid + row * C : dx;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float xhat = (x[c] - m) * r, d = dy[c];
      const float v = base[c] + r * (d * weight[c] - sg - xhat * sgx);
      dx[c] = v;
      if (bits != nullptr) bits[row * C + c] = __float2bfloat16_rn(v);
      sdw[c] += d * xhat;
      sdb[c] += d;
    }
  }
  const int64_t groups = gridDim.x;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    partial[blockIdx.x * C + c] = sdw[c];
    partial[(groups + blockIdx.x) * C + c] = sdb[c];
  }
}

// The RMSNorm backward's one pass, as LayerNormBackwardFusedKernel: dinp = (dresid ?
// dresid : dinp) + rstd * (weight*dout - norm * mean(weight*dout*norm)), norm = x * rstd;
// partial (groups, C): the groups' sums of dout * norm (the dweight terms).
__global__ void RMSNormBackwardFusedKernel(float* partial, float* dinp, const float* dresid,
                                           const float* dout, const float* inp,
                                           const float* weight, const float* rstd, int64_t N,
                                           int64_t C, int64_t rows_per_group, __nv_bfloat16* bits) {
  __shared__ float sdw[kFusedRmsNormMaxC];
  __shared__ float smem[32];
  const int64_t r0 = blockIdx.x * rows_per_group;
  const int64_t r1 = min(N, r0 + rows_per_group);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sdw[c] = 0.0f;
  for (int64_t row = r0; row < r1; ++row) {
    const float* x = inp + row * C;
    const float* dy = dout + row * C;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += (weight[c] * dy[c]) * (x[c] * r);
    const float mean_dot = BlockSum(dot, smem) / static_cast<float>(C);
    float* dx = dinp + row * C;
    const float* base = dresid != nullptr ? dresid + row * C : dx;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float norm = x[c] * r, d = dy[c];
      const float v = base[c] + r * (weight[c] * d - norm * mean_dot);
      dx[c] = v;
      if (bits != nullptr) bits[row * C + c] = __float2bfloat16_rn(v);
      sdw[c] += norm * d;
    }
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) partial[blockIdx.x * C + c] = sdw[c];
}

// One warp per row. block 256 = 8 rows.
__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int64_t N,
                                       int64_t C, float eps, __nv_bfloat16* bits) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5);
  if (row >= N) return;  // whole warp leaves together
  const float* x = inp + row * C;
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += x[c];
  const float m = WarpSum(s) / static_cast<float>(C);
  float v = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    float d = x[c] - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(WarpSum(v) / static_cast<float>(C) + eps);
  float* y = out + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = (x[c] - m) * r * weight[c] + bias[c];
    y[c] = v;
    if (bits != nullptr) bits[row * C + c] = __float2bfloat16_rn(v);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight. Warp per row.
__global__ void LayerNormBackwardInputKernel(float* dinp, const float* dout, const float* inp,
                                             const float* weight, const float* mean,
                                             const float* rstd, int64_t N, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5);
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    float g = dy[c] * weight[c];
    sg += g;
    sgx += g * (x[c] - m) * r;
  }
  sg = WarpSum(sg) / static_cast<float>(C);
  sgx = WarpSum(sgx) / static_cast<float>(C);
  float* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    float xhat = (x[c] - m) * r;
    dx[c] += r * (dy[c] * weight[c] - sg - xhat * sgx);
  }
}

// partial (2, groups, C): [0] sums of dout * xhat (dweight), [1] sums of dout (dbias).
__global__ void LayerNormParamGradPartialKernel(float* partial, const float* dout,
                                                const float* inp, const float* mean,
                                                const float* rstd, int64_t N, int64_t C,
                                                int64_t rows_per_group) {
  __shared__ float sw[kRowLanes][kColTile + 1];
  __shared__ float sb[kRowLanes][kColTile + 1];
  const int64_t c = blockIdx.x * int64_t{kColTile} + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_group;
  const int64_t r1 = min(N, r0 + rows_per_group);
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      float dy = dout[r * C + c];
      aw += dy * (inp[r * C + c] - mean[r]) * rstd[r];
      ab += dy;
    }
  }
  const float w = SumRowLanes(sw, aw), b = SumRowLanes(sb, ab);
  if (threadIdx.y == 0 && c < C) {
    const int64_t groups = gridDim.y;
    partial[blockIdx.y * C + c] = w;
    partial[(groups + blockIdx.y) * C + c] = b;
  }
}

// Threads per block for the one-block-per-row RMSNorm kernels: about 4 columns a thread,
// a multiple of 32 in [32, 256].
int RowThreads(int64_t C) {
  int64_t t = ((C + 3) / 4 + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

// One block per row: rstd = 1/sqrt(mean(x^2) + eps), out = x * rstd * weight.
__global__ void RMSNormForwardKernel(float* out, float* rstd, const float* inp,
                                     const float* weight, int64_t C, float eps, __nv_bfloat16* bits) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
  ss = BlockSum(ss, smem);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  float* y = out + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = (x[c] * r) * weight[c];
    y[c] = v;
    if (bits != nullptr) bits[row * C + c] = __float2bfloat16_rn(v);
  }
  if (threadIdx.x == 0) rstd[row] = r;
}

// One block per row: dinp += rstd * (weight*dout - norm * mean(weight*dout*norm)).
__global__ void RMSNormBackwardInputKernel(float* dinp, const float* dout, const float* inp,
                                           const float* weight, const float* rstd, int64_t C) {
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float r = rstd[row];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += (weight[c] * dy[c]) * (x[c] * r);
  const float mean_dot = BlockSum(dot, smem) / static_cast<float>(C);
  float* dx = dinp + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    dx[c] += r * (weight[c] * dy[c] - (x[c] * r) * mean_dot);
  }
}

// partial (groups, C): sums over the group's rows of dout * x * rstd (the dweight terms).
__global__ void RMSNormWeightGradPartialKernel(float* partial, const float* dout, const float* inp,
                                               const float* rstd, int64_t N, int64_t C,
                                               int64_t rows_per_group) {
  __shared__ float sw[kRowLanes][kColTile + 1];
  const int64_t c = blockIdx.x * int64_t{kColTile} + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per_group;
  const int64_t r1 = min(N, r0 + rows_per_group);
  float aw = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      aw += (inp[r * C + c] * rstd[r]) * dout[r * C + c];
    }
  }
  const float w = SumRowLanes(sw, aw);
  if (threadIdx.y == 0 && c < C) partial[blockIdx.y * C + c] = w;
}

__global__ void SumSquaresPartialKernel(double* partial, const float* x, int64_t n) {
  __shared__ double smem[32];
  double acc = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    double v = x[i];
    acc += v * v;
  }
  acc = BlockSum(acc, smem);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void SumSquaresFinalKernel(double* result, const double* partial, int parts) {
  __shared__ double smem[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) acc += partial[i];
  acc = BlockSum(acc, smem);
  if (threadIdx.x == 0) *result = acc;
}

void LaunchColumnPartial(const float* dout, int64_t N, int64_t cols, float* scratch,
                         int64_t groups, cudaStream_t s) {
  const int64_t rows_per_group = (N + groups - 1) / groups;
  dim3 grid(static_cast<unsigned>((cols + kColTile - 1) / kColTile), static_cast<unsigned>(groups));
  L2L_LAUNCH(ColumnSumPartialKernel, grid, dim3(kColTile, kRowLanes), 0, s)(
      scratch, dout, N, cols, rows_per_group);
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchColumnFinal(float* dst, const float* partial, int64_t groups, int64_t cols,
                       cudaStream_t s) {
  L2L_LAUNCH(ColumnSumFinalKernel, GridFor(cols), kThreads, 0, s)(dst, partial, groups, cols);
  L2L_CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t ColumnSumGroups(int64_t N) {
  // ~64 rows per group amortises the partial write; at most 64 groups keeps the final
  // pass short and the scratch small (64 x cols floats).
  int64_t g = (N + 63) / 64;
  return g < 1 ? 1 : (g > 64 ? 64 : g);
}

int64_t NormBackwardGroups(int64_t N, int64_t C, int64_t max_fused_c) {
  if (C > max_fused_c) return ColumnSumGroups(N);
  // One block per >= 8 rows, at most kFusedNormMaxGroups blocks (2 per SM of an H100):
  // the rows of a group run one after another, so the groups are the parallelism.
  int64_t g = (N + 7) / 8;
  return g < 1 ? 1 : (g > kFusedNormMaxGroups ? kFusedNormMaxGroups : g);
}

void LaunchGeluBackwardBias(float* dinp, float* dbias, const float* inp, const float* dout,
                            int64_t N, int64_t F, float* scratch, int64_t groups, cudaStream_t s,
                            uint16_t* bits) {
  if (N <= 0 || F <= 0) return;
  const int64_t rows_per_group = (N + groups - 1) / groups;
  dim3 grid(static_cast<unsigned>((F + kColTile - 1) / kColTile), static_cast<unsigned>(groups));
  L2L_LAUNCH(GeluBackwardBiasPartialKernel, grid, dim3(kColTile, kRowLanes), 0, s)(
      dbias != nullptr ? scratch : nullptr, dinp, inp, dout, N, F, rows_per_group,
      reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
  if (dbias != nullptr) LaunchColumnFinal(dbias, scratch, groups, F, s);
}

void LaunchBiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC, float* scratch,
                        int64_t groups, cudaStream_t s) {
  if (N <= 0 || OC <= 0) return;
  LaunchColumnPartial(dout, N, OC, scratch, groups, s);
  LaunchColumnFinal(dbias, scratch, groups, OC, s);
}

void LaunchLayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int64_t N, int64_t C,
                            float eps, cudaStream_t s, uint16_t* bits) {
  if (N <= 0 || C <= 0) return;
  const int rows_per_block = kThreads / 32;
  const auto blocks = static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block);
  L2L_LAUNCH(LayerNormForwardKernel, blocks, kThreads, 0, s)(
      out, mean, rstd, inp, weight, bias, N, C, eps, reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchLayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dresid,
                             const float* dout, const float* inp, const float* weight,
                             const float* mean, const float* rstd, int64_t N, int64_t C,
                             float* scratch, int64_t groups, cudaStream_t s, uint16_t* bits) {
  if (N <= 0 || C <= 0) return;
  L2L_CHECK(bits == nullptr || C <= kFusedLayerNormMaxC) << "LayerNorm backward: a bf16 copy needs the one-pass path";
  if (C <= kFusedLayerNormMaxC) {
    const int64_t rows_per_group = (N + groups - 1) / groups;
    L2L_LAUNCH(LayerNormBackwardFusedKernel, static_cast<unsigned>(groups), RowThreads(C), 0, s)(
        scratch, dinp, dresid, dout, inp, weight, mean, rstd, N, C, rows_per_group,
        reinterpret_cast<__nv_bfloat16*>(bits));
    L2L_CUDA_CHECK_LAUNCH();
    LaunchColumnFinal(dweight, scratch, groups, C, s);
    LaunchColumnFinal(dbias, scratch + groups * C, groups, C, s);
    return;
  }
  if (dresid != nullptr && dresid != dinp) {
    L2L_CUDA_CHECK(cudaMemcpyAsync(dinp, dresid, sizeof(float) * N * C, cudaMemcpyDeviceToDevice, s));
  }
  const int rows_per_block = kThreads / 32;
  const auto blocks = static_cast<unsigned>((N + rows_per_block - 1) / rows_per_block);
  L2L_LAUNCH(LayerNormBackwardInputKernel, blocks, kThreads, 0, s)(
      dinp, dout, inp, weight, mean, rstd, N, C);
  L2L_CUDA_CHECK_LAUNCH();
  const int64_t rows_per_group = (N + groups - 1) / groups;
  dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile), static_cast<unsigned>(groups));
  L2L_LAUNCH(LayerNormParamGradPartialKernel, grid, dim3(kColTile, kRowLanes), 0, s)(
      scratch, dout, inp, mean, rstd, N, C, rows_per_group);
  L2L_CUDA_CHECK_LAUNCH();
  LaunchColumnFinal(dweight, scratch, groups, C, s);
  LaunchColumnFinal(dbias, scratch + groups * C, groups, C, s);
}

void LaunchRMSNormForward(float* out, float* rstd, const float* inp, const float* weight,
                          int64_t N, int64_t C, float eps, cudaStream_t s, uint16_t* bits) {
  if (N <= 0 || C <= 0) return;
  L2L_LAUNCH(RMSNormForwardKernel, static_cast<unsigned>(N), RowThreads(C), 0, s)(
      out, rstd, inp, weight, C, eps, reinterpret_cast<__nv_bfloat16*>(bits));
  L2L_CUDA_CHECK_LAUNCH();
}

void LaunchRMSNormBackward(float* dinp, float* dweight, const float* dresid, const float* dout,
                           const float* inp, const float* weight, const float* rstd, int64_t N,
                           int64_t C, float* scratch, int64_t groups, cudaStream_t s, uint16_t* bits) {
  if (N <= 0 || C <= 0) return;
  L2L_CHECK(bits == nullptr || C <= kFusedRmsNormMaxC) << "RMSNorm backward: a bf16 copy needs the one-pass path";
  if (C <= kFusedRmsNormMaxC) {
    const int64_t rows_per_group = (N + groups - 1) / groups;
    L2L_LAUNCH(RMSNormBackwardFusedKernel, static_cast<unsigned>(groups), RowThreads(C), 0, s)(
        scratch, dinp, dresid, dout, inp, weight, rstd, N, C, rows_per_group,
        reinterpret_cast<__nv_bfloat16*>(bits));
    L2L_CUDA_CHECK_LAUNCH();
    LaunchColumnFinal(dweight, scratch, groups, C, s);
    return;
  }
  if (dresid != nullptr && dresid != dinp) {
    L2L_CUDA_CHECK(cudaMemcpyAsync(dinp, dresid, sizeof(float) * N * C, cudaMemcpyDeviceToDevice, s));
  }
  L2L_LAUNCH(RMSNormBackwardInputKernel, static_cast<unsigned>(N), RowThreads(C), 0, s)(
      dinp, dout, inp, weight, rstd, C);
  L2L_CUDA_CHECK_LAUNCH();
  const int64_t rows_per_group = (N + groups - 1) / groups;
  dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile), static_cast<unsigned>(groups));
  L2L_LAUNCH(RMSNormWeightGradPartialKernel, grid, dim3(kColTile, kRowLanes), 0, s)(
      scratch, dout, inp, rstd, N, C, rows_per_group);
  L2L_CUDA_CHECK_LAUNCH();
  LaunchColumnFinal(dweight, scratch, groups, C, s);
}

void LaunchSumSquares(double* result, const float* x, int64_t n, double* scratch,
                      cudaStream_t s) {
  L2L_LAUNCH(SumSquaresPartialKernel, kSumSquaresBlocks, kThreads, 0, s)(scratch, x, n);
  L2L_CUDA_CHECK_LAUNCH();
  L2L_LAUNCH(SumSquaresFinalKernel, 1, kThreads, 0, s)(result, scratch, kSumSquaresBlocks);
  L2L_CUDA_CHECK_LAUNCH();
}

}  // namespace l2l::kernels::cuda
