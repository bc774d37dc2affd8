// The contract between the pieces of the CUDA emulator (cuda_emu): the error and
// handle types every emulated header shares, and the few runtime services cuBLASLt and
// CUB need from the emulated runtime (queueing work on a stream, recognising device
// memory, reporting an asynchronous failure).
//
// What the emulator is: a CPU implementation of exactly the subset of the CUDA runtime,
// cuBLASLt and CUB that kernels/cuda uses, so the CUDA backend, the worker's CUDA path
// and the GPU tests (tests/gpu) build with g++ and run on a machine without a GPU
// (CMake -DL2L_CUDA=EMU). Kernels run as CPU fibers, one per CUDA thread, with real
// __syncthreads and warp-shuffle semantics; streams are threads; device memory is host
// memory with guard pages. It never ships: only the EMU configuration builds it.
// It checks what a GPU would not tell us: misuse of an API (wrong copy kind, bad layout)
// is an error return, not silent corruption. It cannot show performance or the GPU's
// memory model.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

// Values as in the real driver_types.h, so messages and logs read the same.
enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidPitchValue = 12,
  cudaErrorInvalidSymbol = 13,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorIllegalAddress = 700,
  cudaErrorHostMemoryAlreadyRegistered = 712,
  cudaErrorHostMemoryNotRegistered = 713,
  cudaErrorLaunchFailure = 719,
  cudaErrorNotSupported = 801,
  cudaErrorUnknown = 999,
};
typedef enum cudaError_t cudaError;

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
struct CUevent_st;
typedef struct CUevent_st* cudaEvent_t;

namespace l2l_cuda_emu {

// Queues `work` on stream `s` (nullptr: the legacy default stream, which runs it at once
// after every other stream has drained). Work on one stream runs in order on that
// stream's own thread; it may call ReportAsyncError. Returns cudaErrorInvalidResourceHandle
// for a destroyed or unknown stream.
cudaError_t Enqueue(cudaStream_t s, std::function<void()> work);

// True when $L2L_CUDA_EMU_SKIP_COMPUTE=1 (read at each launch, on the launching
// thread): kernel launches and cuBLASLt
// matmuls are checked and queued as usual but do not run, so their outputs keep whatever
// bytes they held. Allocations, copies, memsets, events and the CUB sort still run. For
// measuring what a program allocates (the backend's own accounting) at shapes whose math
// the CPU could not finish; every computed value is then meaningless.
bool SkipCompute();

// True when [p, p + bytes) lies inside one live cudaMalloc allocation.
bool IsDeviceRange(const void* p, size_t bytes);

// From work running on a stream: records a sticky asynchronous error (as a faulting
// kernel would), printed to stderr with `what`, and returned by later synchronising calls
// (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize, cudaGetLastError).
void ReportAsyncError(cudaError_t e, const std::string& what);

}  // namespace l2l_cuda_emu
