// Emulated cuda_runtime.h (cuda_emu): the subset of the CUDA runtime API that
// kernels/cuda, worker and tests/gpu use, implemented on the CPU by runtime.cc; plus the
// device side (l2l_cuda_emu_device.h). Enum values and flags are those of the real
// driver_types.h. Semantics are CUDA's, made strict where a GPU would be silent:
//  - streams are one worker thread each (FIFO); the legacy default stream (0,
//    cudaStreamLegacy, cudaStreamPerThread) waits for every blocking stream (not those
//    created with cudaStreamNonBlocking, as in CUDA) and then runs the work inline;
//  - device memory is mmap'd, end-aligned against a PROT_NONE guard page (an overrun
//    past the 256-byte-rounded size faults) and filled with 0xFF bytes (NaN as floats);
//  - copies check the kind against the pointers; an asynchronous copy on a stream first
//    fills its destination with 0xFF bytes and sleeps $L2L_CUDA_EMU_COPY_DELAY_US
//    (default 50) microseconds, so a reader that forgot to wait sees poison;
//  - errors: a per-thread last error, and a sticky per-device error after a kernel
//    failure, returned by later synchronising calls and cudaGetLastError.
// Environment: L2L_CUDA_EMU_DEVICES (default 1), L2L_CUDA_EMU_MEMORY_BYTES (per device,
// default 80 GiB), L2L_CUDA_EMU_NO_HOST_REGISTER=1 (cudaHostRegister unsupported),
// L2L_CUDA_EMU_COPY_DELAY_US, L2L_CUDA_EMU_SKIP_COMPUTE=1 (kernels and matmuls queued but
// not run: for allocation measurements only; see l2l_cuda_emu.h SkipCompute).
//
// Thread-safety: every function is thread-safe, as in CUDA.
#pragma once

#include <library_types.h>

#include <cstddef>

#include "l2l_cuda_emu.h"
#include "l2l_cuda_emu_device.h"

// ---- Flags (values as in driver_types.h) ------------------------------------------------
#define cudaHostAllocDefault 0x00
#define cudaHostAllocPortable 0x01
#define cudaHostAllocMapped 0x02
#define cudaHostAllocWriteCombined 0x04
#define cudaHostRegisterDefault 0x00
#define cudaHostRegisterPortable 0x01
#define cudaHostRegisterMapped 0x02
#define cudaHostRegisterIoMemory 0x04
#define cudaHostRegisterReadOnly 0x08
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaEventInterprocess 0x04

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxBlockDimX = 2,
  cudaDevAttrMaxBlockDimY = 3,
  cudaDevAttrMaxBlockDimZ = 4,
  cudaDevAttrMaxGridDimX = 5,
  cudaDevAttrMaxGridDimY = 6,
  cudaDevAttrMaxGridDimZ = 7,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrL2CacheSize = 38,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrHostRegisterSupported = 99,
  cudaDevAttrHostRegisterReadOnlySupported = 113,
};

// The fields anyone reads; the rest of the real struct is left out.
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int regsPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  size_t totalConstMem;
  int major;
  int minor;
  int multiProcessorCount;
  int l2CacheSize;
  int memoryBusWidth;
  size_t sharedMemPerMultiprocessor;
  int maxThreadsPerMultiProcessor;
  int unifiedAddressing;
  int canMapHostMemory;
  int pciBusID;
  int pciDeviceID;
};

// ---- Errors -----------------------------------------------------------------------------
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);

// ---- Devices ----------------------------------------------------------------------------
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaDriverGetVersion(int* version);

// ---- Memory -----------------------------------------------------------------------------
cudaError_t cudaMalloc(void** dev_ptr, size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** dev_ptr, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(dev_ptr), bytes);
}
cudaError_t cudaFree(void* dev_ptr);
cudaError_t cudaMallocHost(void** ptr, size_t bytes);
template <class T>
cudaError_t cudaMallocHost(T** ptr, size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags);
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int flags);
cudaError_t cudaHostUnregister(void* ptr);
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr);

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s = 0);
cudaError_t cudaMemset(void* dev_ptr, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t bytes, cudaStream_t s = 0);

// ---- Streams and events -----------------------------------------------------------------
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

namespace l2l_cuda_emu {

// Tests only: forgets the current device's sticky error (as cudaDeviceReset would,
// without destroying anything), after draining every stream.
void ClearStickyErrorForTesting();

}  // namespace l2l_cuda_emu
