// Device side of the CUDA emulator (cuda_emu): what a .cu file sees when it is
// compiled as C++ with g++ against the emulator (L2L_CUDA_EMULATOR): the vector types
// (dim3, uint3), the CUDA keywords as macros (__global__, __shared__, ...), the built-in
// variables (threadIdx, blockIdx, blockDim, gridDim, warpSize), barriers and warp
// shuffles, CUDA's global integer min/max, and l2l_cuda_emu::Launch, which the
// L2L_LAUNCH macro of kernels/cuda/cuda_common.cuh expands to.
//
// Execution model (implemented in fiber.cc): a launch is queued on its stream; the
// stream's thread runs the blocks one at a time in x, y, z order, and each CUDA thread of
// a block is a fiber on that OS thread. Fibers switch only at __syncthreads, __syncwarp
// and the shuffles, so a kernel sees real barrier semantics; __shared__ is
// `static thread_local` (one block at a time per OS thread = one copy per block).
// Deadlocks and divergent warp collectives are reported as an asynchronous
// cudaErrorLaunchFailure naming the kernel and block, and the launch is abandoned.
//
// The warp matrix (WMMA) API is in mma.h (include <mma.h>, as in CUDA).
//
// Not supported: dynamic shared memory (a launch with smem_bytes > 0 fails with
// cudaErrorInvalidConfiguration), atomics, cooperative groups, texture memory.
//
// Thread-safety: the device functions may only be called from a kernel running under
// Launch (they read the calling fiber's context); Launch itself is thread-safe.
#pragma once

#include <math.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "l2l_cuda_emu.h"

// ---- Vector types ---------------------------------------------------------------------
struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}  // NOLINT: implicit as in CUDA
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// ---- Keywords ---------------------------------------------------------------------------
// Guarded: cuda_bf16.h of the emulator may define the same ones.
#ifndef __global__
#define __global__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ inline
#endif
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
// One block runs at a time on an OS thread, with all its fibers: a thread_local static is
// exactly one copy per running block. Its contents carry over from the previous block
// run on the same thread (on a GPU they are undefined), so do not rely on either.
#ifndef __shared__
#define __shared__ static thread_local
#endif
// __restrict__ is a g++ keyword already.

namespace l2l_cuda_emu {
namespace detail {

// The running CUDA thread's built-in variables; one per fiber.
struct ThreadContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

// The fiber running on this OS thread (null outside a kernel). __thread, not
// thread_local: constant-initialised, so reads need no TLS wrapper call.
extern __thread const ThreadContext* t_thread;

enum class ShflMode { kIdx, kXor, kUp, kDown };

// A warp shuffle of 8 bytes: write this lane's value, warp barrier over `mask`, read the
// source lane's value, warp barrier. A source lane outside the mask or the block gives
// all-ones bits (NaN for floats; undefined on a GPU).
uint64_t ShuffleBits(unsigned mask, uint64_t bits, ShflMode mode, int arg, int width,
                     const char* what);
// Barriers; block until every live thread of the warp (mask) / block has arrived.
void WarpBarrier(unsigned mask, const char* what);
void BlockBarrier();

template <class T>
T Shuffle(unsigned mask, T var, ShflMode mode, int arg, int width, const char* what) {
  static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 4 || sizeof(T) == 8),
                "the emulator's warp shuffles take 4- or 8-byte values");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = ShuffleBits(mask, bits, mode, arg, width, what);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// The kernel and its arguments of one launch, run once per CUDA thread.
struct GridWork {
  void (*run)(void* closure);
  std::shared_ptr<void> closure;
  const char* name;
  dim3 grid;
  dim3 block;
};

// False (with the thread's last error set to cudaErrorInvalidConfiguration and a stderr
// line naming the kernel) when the configuration is not one CUDA would launch.
bool CheckLaunchConfig(const char* name, dim3 grid, dim3 block, size_t smem_bytes);
// Queues the grid on `s` (the legacy stream: runs it now); sets the last error on a bad
// stream.
void EnqueueGrid(cudaStream_t s, GridWork work);

// Whether a kernel may dereference p: inside a device allocation or a page-locked host
// range (cudaMallocHost / cudaHostRegister, mapped on a UVA system). Null is fine (the
// kernel may not use it). Otherwise the launch fails on its stream with
// cudaErrorIllegalAddress, as the GPU would fault, naming the kernel and the argument.
bool CheckKernelPointer(cudaStream_t s, const char* kernel, int index, const void* p);

template <class T>
bool CheckKernelArg(cudaStream_t s, const char* kernel, int index, const T& v) {
  if constexpr (std::is_pointer_v<T>) {
    return CheckKernelPointer(s, kernel, index, static_cast<const void*>(v));
  } else {
    return true;
  }
}

// Converts a launch argument to the kernel's parameter type as a call would (implicit
// conversions only).
template <class T>
T KernelArg(std::type_identity_t<T> v) {
  return v;
}

}  // namespace detail

// The object L2L_LAUNCH(K, g, b, smem, s) yields; (args...) queues the launch.
template <class... P>
class KernelLaunch {
 public:
  KernelLaunch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, size_t smem_bytes,
               cudaStream_t s)
      : kernel_(kernel), name_(name), grid_(grid), block_(block), smem_(smem_bytes), stream_(s) {}

  template <class... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P),
                  "kernel launched with the wrong number of arguments");
    static_assert((!std::is_reference_v<P> && ...), "kernel parameters must be values");
    if (!detail::CheckLaunchConfig(name_, grid_, block_, smem_)) return;
    auto closure = std::make_shared<Closure>(
        kernel_, std::tuple<P...>(detail::KernelArg<P>(std::forward<A>(args))...));
    const bool pointers_ok = std::apply(
        [this](const P&... v) {
          int i = 0;
          bool ok = true;  // a comma fold: left to right, every argument checked
          ((ok = detail::CheckKernelArg(stream_, name_, i++, v) && ok), ...);
          return ok;
        },
        closure->second);
    if (!pointers_ok) return;
    detail::EnqueueGrid(stream_, detail::GridWork{&Run, std::move(closure), name_, grid_, block_});
  }

 private:
  using Closure = std::pair<void (*)(P...), std::tuple<P...>>;
  static void Run(void* p) {
    auto* c = static_cast<Closure*>(p);
    std::apply(c->first, c->second);  // each CUDA thread gets its own copies of the params
  }

  void (*kernel_)(P...);
  const char* name_;
  dim3 grid_, block_;
  size_t smem_;
  cudaStream_t stream_;
};

template <class... P>
auto Launch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, size_t smem_bytes,
            cudaStream_t s) {
  return KernelLaunch<P...>(kernel, name, grid, block, smem_bytes, s);
}

}  // namespace l2l_cuda_emu

// ---- Built-in variables -----------------------------------------------------------------
#define threadIdx (::l2l_cuda_emu::detail::t_thread->thread_idx)
#define blockIdx (::l2l_cuda_emu::detail::t_thread->block_idx)
#define blockDim (::l2l_cuda_emu::detail::t_thread->block_dim)
#define gridDim (::l2l_cuda_emu::detail::t_thread->grid_dim)
inline constexpr int warpSize = 32;

// ---- Barriers and shuffles --------------------------------------------------------------
inline void __syncthreads() { ::l2l_cuda_emu::detail::BlockBarrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::l2l_cuda_emu::detail::WarpBarrier(mask, "__syncwarp");
}

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return ::l2l_cuda_emu::detail::Shuffle(mask, var, ::l2l_cuda_emu::detail::ShflMode::kIdx,
                                         src_lane, width, "__shfl_sync");
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return ::l2l_cuda_emu::detail::Shuffle(mask, var, ::l2l_cuda_emu::detail::ShflMode::kXor,
                                         lane_mask, width, "__shfl_xor_sync");
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::l2l_cuda_emu::detail::Shuffle(mask, var, ::l2l_cuda_emu::detail::ShflMode::kUp,
                                         static_cast<int>(delta), width, "__shfl_up_sync");
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::l2l_cuda_emu::detail::Shuffle(mask, var, ::l2l_cuda_emu::detail::ShflMode::kDown,
                                         static_cast<int>(delta), width, "__shfl_down_sync");
}

// ---- CUDA's global min/max (math_functions.hpp has the same set) ------------------------
#define L2L_CUDA_EMU_MINMAX(T)                     \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
L2L_CUDA_EMU_MINMAX(int)
L2L_CUDA_EMU_MINMAX(unsigned int)
L2L_CUDA_EMU_MINMAX(long)
L2L_CUDA_EMU_MINMAX(unsigned long)
L2L_CUDA_EMU_MINMAX(long long)
L2L_CUDA_EMU_MINMAX(unsigned long long)
#undef L2L_CUDA_EMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// IEEE round-to-nearest float intrinsics (CUDA's __f*_rn: never contracted into an FMA).
// Out-of-line so that no caller's -ffp-contract setting can fuse them.
__attribute__((noinline)) inline float __fadd_rn(float a, float b) { return a + b; }
__attribute__((noinline)) inline float __fsub_rn(float a, float b) { return a - b; }
__attribute__((noinline)) inline float __fmul_rn(float a, float b) { return a * b; }
__attribute__((noinline)) inline float __fdiv_rn(float a, float b) { return a / b; }
__attribute__((noinline)) inline float __fsqrt_rn(float a) { return std::sqrt(a); }
