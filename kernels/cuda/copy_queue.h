// The CUDA side of the Backend's optional asynchronous transfers (kernels/backend.h):
//   CudaEventImpl   kernels::Event over a cudaEvent_t (no timing, blocking host waits)
//   CudaCopyQueue   kernels::CopyQueue over a non-blocking stream of its own, beside the
//                   backend's compute stream; H2D/D2H copies with cudaMemcpyAsync and the
//                   bf16 -> fp32 widening kernel, ordered against other streams by events
//   CudaHostPin     kernels::HostPin over cudaHostRegister (read-only ranges with
//                   cudaHostRegisterReadOnly, checked against the device attribute first)
// and AllocPinnedHost (cudaMallocHost as a kernels::HostBuffer).
//
// Every call makes the owning device current first: the queue and events are used from
// the worker's prefetch and push threads, where no device has been selected.
// Internal to kernels/cuda: exposes CUDA types.
// Thread-safety: a CudaCopyQueue is used by one thread at a time; events may be used from
// any thread (the CUDA runtime serialises; callers order records before waits).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/bf16_operands.h"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {

// quant.cu's name for a common/quant_blocks.h format (the same block layouts).
BlockFormat ToBlockFormat(QuantFormat format);

// Created with cudaEventDisableTiming | cudaEventBlockingSync: the worker's prefetch and
// push threads wait on these, and a blocking wait yields the core instead of spinning
// beside the compute thread (the wake-up costs microseconds against copies of
// milliseconds).
class CudaEventImpl final : public Event {
 public:
  static Result<std::unique_ptr<CudaEventImpl>> Create(int device);
  ~CudaEventImpl() override;
  Status Wait() override;
  cudaEvent_t get() const { return event_; }
  int device() const { return device_; }

 private:
  CudaEventImpl() = default;
  int device_ = 0;
  cudaEvent_t event_ = nullptr;
};

// The cudaEvent_t behind `e`; aborts naming `who` when `e` is not a CudaEventImpl.
cudaEvent_t NativeEvent(Event* e, const char* who);

class CudaCopyQueue final : public CopyQueue {
 public:
  static Result<std::unique_ptr<CudaCopyQueue>> Create(int device);
  ~CudaCopyQueue() override;  // waits for the queue's work, then destroys the stream

  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override;
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  Status WidenToF32(float* dst, const void* src, DType dtype, int64_t n) override;
  Status DequantizeBlocks(float* dst, const void* blocks, QuantFormat format, int64_t n) override;
  void Record(Event* e) override;
  void WaitFor(Event* e) override;
  cudaStream_t stream() const { return stream_.get(); }
  // Every transfer to device memory adds its destination to *writes (the backend's
  // Bf16Operands: a fresh bf16 copy of memory this queue writes is stale).
  void set_writes(std::shared_ptr<WrittenRanges> writes) { writes_ = std::move(writes); }

 private:
  CudaCopyQueue() = default;
  void MakeCurrent() const;
  int device_ = 0;
  CudaStream stream_;
  std::shared_ptr<WrittenRanges> writes_;
  void Wrote(const void* dst, size_t bytes) const {
    if (writes_ != nullptr) writes_->Add(dst, bytes);
  }
};

class CudaHostPin final : public HostPin {
 public:
  // Fails with UNIMPLEMENTED when the device cannot register host memory at all
  // (cudaDevAttrHostRegisterSupported) or, for read_only, cannot register read-only
  // mappings (cudaDevAttrHostRegisterReadOnlySupported); INTERNAL with cudaHostRegister's
  // error otherwise (the caller falls back to a pinned bounce buffer and logs this).
  static Result<std::unique_ptr<CudaHostPin>> Create(int device, void* p, size_t bytes,
                                                     bool read_only);
  ~CudaHostPin() override;

 private:
  CudaHostPin() = default;
  int device_ = 0;
  HostRegistration reg_;
};

// cudaMallocHost(bytes) owned by a HostBuffer (freed with cudaFreeHost).
Result<HostBuffer> AllocPinnedHost(int device, size_t bytes);

}  // namespace l2l::kernels::cuda
