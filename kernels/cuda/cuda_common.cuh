// Device helpers shared by our .cu files: launch-size arithmetic and warp/block
// reductions. Internal to kernels/cuda. Thread-safety: stateless.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace l2l::kernels::cuda {

// Kernel launch: L2L_LAUNCH(kernel, grid, block, smem, stream)(args...) is
// kernel<<<grid, block, smem, stream>>>(args...). Written as a macro so the same .cu
// files also build with g++ against the CPU emulator (cuda_emu, -DL2L_CUDA=EMU),
// which runs the kernel's threads as fibers.
#ifdef L2L_CUDA_EMULATOR
#define L2L_LAUNCH(kernel, grid, block, smem, stream) \
  ::l2l_cuda_emu::Launch(kernel, #kernel, grid, block, smem, stream)
#else
#define L2L_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#endif

// Fully unrolls the loop that follows (nvcc: a loop over a register array must be unrolled
// for the array to stay in registers); nothing on the emulator, whose g++ has no
// `#pragma unroll`.
#ifdef L2L_CUDA_EMULATOR
#define L2L_UNROLL
#else
#define L2L_UNROLL _Pragma("unroll")
#endif

inline constexpr int kThreads = 256;  // default block size for elementwise kernels

// Blocks for a grid-stride loop over n items: enough to fill an H100 (132 SMs x 16
// blocks of 256 threads) without launching millions of tiny blocks.
inline unsigned GridFor(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 132 * 16) blocks = 132 * 16;
  return static_cast<unsigned>(blocks);
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions; every thread gets the result. REQUIRES blockDim.x a multiple
// of 32 (<= 1024) and `smem` >= 32 elements. Fixed order, so deterministic.
template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // smem may still be read by a previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : T(0);
  return WarpSum(v);
}

__device__ __forceinline__ float BlockMax(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : -INFINITY;
  return WarpMax(v);
}

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

// GELU, tanh approximation (kernels/backend.h GeluForward). One definition for
// GeluForward and the fused linear epilogue (elementwise.cu), so they give the same bits.
__device__ __forceinline__ float GeluTanh(float x) {
  return 0.5f * x * (1.0f + tanhf(kGeluScale * (x + 0.044715f * x * x * x)));
}

// d/dx of GeluTanh at x. Shared by GeluBackward (elementwise.cu) and the fused
// GeluBackwardBias (reduce.cu).
__device__ __forceinline__ float GeluTanhGrad(float x) {
  float u = kGeluScale * (x + 0.044715f * x * x * x);
  float th = tanhf(u);
  float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
}

}  // namespace l2l::kernels::cuda
