// Deterministic embedding backward (GPT-2's token + position tables, and the Llama
// family's token table alone). dwpe is a plain sum over the batch (one thread per
// (t, c), batch summed in order). dwte is a scatter-add by token id, which done with
// atomics would sum repeated tokens in a different order each run; instead a stable
// CUB radix sort of (token, position) pairs groups each token's positions in increasing
// order, and one warp per distinct token sums its rows in that order. Same inputs give
// the same bits, as kernels/backend.h requires. Launchers in ops.h.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

size_t CubSortBytes(int64_t N) {
  size_t bytes = 0;
  // A size query only (null temp storage): no device work, no stream use.
  L2L_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr),
                                                 static_cast<const int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr), static_cast<int>(N)));
  return bytes;
}

__global__ void IotaKernel(int32_t* v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    v[i] = static_cast<int32_t>(i);
  }
}

// dwpe (T,C) += sum over b of dout (B,T,C).
__global__ void EmbeddingPositionBackwardKernel(float* dwpe, const float* dout, int64_t B,
                                                int64_t T, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < T * C;
       i += int64_t{blockDim.x} * gridDim.x) {
    float sum = 0.0f;
    for (int64_t b = 0; b < B; ++b) sum += dout[b * T * C + i];
    dwpe[i] += sum;
  }
}

// Warp per sorted index i; only the first index of each run of equal tokens works:
// dwte[token] += sum of dout[pos] over the run, positions ascending.
__global__ void EmbeddingTokenBackwardKernel(float* dwte, const float* dout,
                                             const int32_t* sorted_tokens,
                                             const int32_t* sorted_pos, int64_t N, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t i = blockIdx.x * int64_t{blockDim.x / 32} + (threadIdx.x >> 5);
  if (i >= N) return;
  const int32_t tok = sorted_tokens[i];
  if (tok < 0 || (i > 0 && sorted_tokens[i - 1] == tok)) return;
  int64_t end = i + 1;
  while (end < N && sorted_tokens[end] == tok) ++end;
  float* dst = dwte + int64_t{tok} * C;
  for (int64_t c = lane; c < C; c += 32) {
    float sum = 0.0f;
    for (int64_t j = i; j < end; ++j) sum += dout[int64_t{sorted_pos[j]} * C + c];
    dst[c] += sum;
  }
}

}  // namespace

size_t EmbeddingBackwardScratchBytes(int64_t N) {
  if (N <= 0) return 0;
  return 3 * AlignUp(static_cast<size_t>(N) * sizeof(int32_t)) + AlignUp(CubSortBytes(N));
}

void LaunchEmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                             int64_t B, int64_t T, int64_t C, void* scratch, size_t scratch_bytes,
                             cudaStream_t s) {
  const int64_t N = B * T;
  if (N <= 0 || C <= 0) return;
  L2L_LAUNCH(EmbeddingPositionBackwardKernel, GridFor(T * C), kThreads, 0, s)(dwpe, dout, B, T, C);
  L2L_CUDA_CHECK_LAUNCH();
  LaunchTokenEmbeddingBackward(dwte, dout, tokens, N, C, scratch, scratch_bytes, s);
}

void LaunchTokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                                  int64_t C, void* scratch, size_t scratch_bytes, cudaStream_t s) {
  if (N <= 0 || C <= 0) return;
  const size_t ints = AlignUp(static_cast<size_t>(N) * sizeof(int32_t));
  char* base = static_cast<char*>(scratch);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(base);
  auto* pos = reinterpret_cast<int32_t*>(base + ints);
  auto* sorted_pos = reinterpret_cast<int32_t*>(base + 2 * ints);
  void* temp = base + 3 * ints;
  size_t temp_bytes = CubSortBytes(N);
  if (scratch_bytes < 3 * ints + temp_bytes) {
    GpuCheckFailed("LaunchTokenEmbeddingBackward scratch", "scratch smaller than "
                   "EmbeddingBackwardScratchBytes(N)", __FILE__, __LINE__);
  }
  L2L_LAUNCH(IotaKernel, GridFor(N), kThreads, 0, s)(pos, N);
  L2L_CUDA_CHECK_LAUNCH();
  // Stable LSD radix sort on all 32 key bits: equal tokens keep ascending positions.
  L2L_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, tokens, sorted_tokens, pos,
                                                 sorted_pos, static_cast<int>(N), 0, 32, s));
  const int64_t warps_per_block = kThreads / 32;
  const auto blocks = static_cast<unsigned>((N + warps_per_block - 1) / warps_per_block);
  L2L_LAUNCH(EmbeddingTokenBackwardKernel, blocks, kThreads, 0, s)(
      dwte, dout, sorted_tokens, sorted_pos, N, C);
  L2L_CUDA_CHECK_LAUNCH();
}

}  // namespace l2l::kernels::cuda
