// RAII owners for the CUDA resources the backend (and later the CUDA worker) holds: one
// owner per resource, move-only, built by `static Result<T> Create(...)` because a
// constructor cannot return a Status. Destructors log failures and go on (teardown often
// runs after an error has already been reported).
//
//   CudaStream       a non-blocking stream (does not serialise with the legacy stream)
//   CudaEvent        an event without timing by default (cheapest for ordering)
//   CublasLtHandle   a cuBLASLt context
//   CudaBuffer       device memory from cudaMalloc
//   PinnedBuffer     page-locked host memory from cudaMallocHost
//   HostRegistration cudaHostRegister of memory someone else owns (the EPS weight
//                    segment): copies then run by DMA straight out of it
//
// Internal to kernels/cuda: exposes CUDA types. All objects must be created and
// destroyed with the owning device current. Thread-safety: none (values of one owner).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "common/status.h"

namespace l2l::kernels::cuda {

class CudaStream {
 public:
  CudaStream() = default;
  static Result<CudaStream> Create();
  ~CudaStream();
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  // timing=false gives cudaEventDisableTiming (ordering only).
  static Result<CudaEvent> Create(bool timing = false);
  ~CudaEvent();
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class CublasLtHandle {
 public:
  CublasLtHandle() = default;
  static Result<CublasLtHandle> Create();
  ~CublasLtHandle();
  CublasLtHandle(CublasLtHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  CublasLtHandle& operator=(CublasLtHandle&& o) noexcept;
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;
  cublasLtHandle_t get() const { return h_; }

 private:
  cublasLtHandle_t h_ = nullptr;
};

class CudaBuffer {
 public:
  CudaBuffer() = default;
  // Fails with RESOURCE_EXHAUSTED naming the size and the device's free memory.
  static Result<CudaBuffer> Create(size_t bytes);
  ~CudaBuffer();
  CudaBuffer(CudaBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  CudaBuffer& operator=(CudaBuffer&& o) noexcept;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  static Result<PinnedBuffer> Create(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locks [ptr, ptr+bytes) of memory the caller owns and keeps alive longer than this
// object. read_only: cudaHostRegisterReadOnly (the EPS's weight segment is mapped
// read-only by workers; the flag lets the driver register such a mapping).
class HostRegistration {
 public:
  HostRegistration() = default;
  static Result<HostRegistration> Create(void* ptr, size_t bytes, bool read_only);
  ~HostRegistration();
  HostRegistration(HostRegistration&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  HostRegistration& operator=(HostRegistration&& o) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace l2l::kernels::cuda
