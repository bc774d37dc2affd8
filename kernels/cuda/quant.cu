// Dequantization of common/quant_blocks.h's block formats on the GPU (a LoRA job's frozen
// base): NF4 { fp32 absmax, 32 bytes of codes, high nibble first }, Q4_0 { fp16 d, 16
// bytes: low nibbles then high nibbles }, Q8_0 { fp16 d, 32 int8 }. One thread per output
// element (grid-stride); each computes code * scale with one fp32 multiply, as the CPU
// code does, so the results are bit-equal. The launcher is declared in ops.h.
#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {
namespace {

// The NF4 code table (common/quant_blocks.h kNf4Code), passed by value as a kernel
// argument (it lands in the constant bank).
struct Nf4Table {
  float v[16];
};
constexpr Nf4Table kNf4 = {{-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
                            -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
                            0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f,
                            0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f,
                            0.7229568362236023f, 1.0f}};

// IEEE binary16 bits -> fp32, exactly (common/dtype.h Fp16ToFloat).
__device__ __forceinline__ float HalfToFloat(const uint8_t* p) {
  const uint32_t h = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * 0x1.0p-24f;
    return sign ? -mag : mag;
  }
  const uint32_t bits = exp == 0x1f ? (sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u))
                                    : (sign | ((exp + (127 - 15)) << 23) | (mant << 13));
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

__global__ void DequantizeNf4Kernel(float* out, const uint8_t* blocks, int64_t n, Nf4Table table) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{blockDim.x} * gridDim.x) {
    const uint8_t* blk = blocks + (i / 64) * 36;
    float absmax;
    memcpy(&absmax, blk, 4);
    const int j = static_cast<int>(i % 64);
    const uint8_t q = blk[4 + j / 2];
    out[i] = table.v[(j & 1) ? (q & 0x0f) : (q >> 4)] * absmax;
  }
}

__global__ void DequantizeQ4_0Kernel(float* out, const uint8_t* blocks, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{blockDim.x} * gridDim.x) {
    const uint8_t* blk = blocks + (i / 32) * 18;
    const int j = static_cast<int>(i % 32);
    const uint8_t q = blk[2 + (j % 16)];
    const int nibble = j < 16 ? (q & 0x0f) : (q >> 4);
    out[i] = static_cast<float>(nibble - 8) * HalfToFloat(blk);
  }
}

__global__ void DequantizeQ8_0Kernel(float* out, const uint8_t* blocks, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{blockDim.x} * gridDim.x) {
    const uint8_t* blk = blocks + (i / 32) * 34;
    const int8_t q = static_cast<int8_t>(blk[2 + i % 32]);
    out[i] = static_cast<float>(q) * HalfToFloat(blk);
  }
}

}  // namespace

void LaunchDequantizeBlocks(float* out, const uint8_t* blocks, BlockFormat format, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  switch (format) {
    case BlockFormat::kNf4:
      L2L_LAUNCH(DequantizeNf4Kernel, GridFor(n), kThreads, 0, s)(out, blocks, n, kNf4);
      break;
    case BlockFormat::kQ4_0:
      L2L_LAUNCH(DequantizeQ4_0Kernel, GridFor(n), kThreads, 0, s)(out, blocks, n);
      break;
    case BlockFormat::kQ8_0:
      L2L_LAUNCH(DequantizeQ8_0Kernel, GridFor(n), kThreads, 0, s)(out, blocks, n);
      break;
  }
  L2L_CUDA_CHECK_LAUNCH();
}

}  // namespace l2l::kernels::cuda
