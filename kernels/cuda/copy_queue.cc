// CUDA copy queues, events, host pins and pinned host buffers. See copy_queue.h.
#include "kernels/cuda/copy_queue.h"

#include <spdlog/spdlog.h>

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/ops.h"

namespace l2l::kernels::cuda {

BlockFormat ToBlockFormat(QuantFormat format) {
  switch (format) {
    case QuantFormat::kNf4: return BlockFormat::kNf4;
    case QuantFormat::kQ4_0: return BlockFormat::kQ4_0;
    case QuantFormat::kQ8_0: return BlockFormat::kQ8_0;
  }
  return BlockFormat::kNf4;
}

namespace {

void SetDevice(int device) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != device) L2L_CUDA_CHECK(cudaSetDevice(device));
}

}  // namespace

// ---- CudaEventImpl -----------------------------------------------------------------------

Result<std::unique_ptr<CudaEventImpl>> CudaEventImpl::Create(int device) {
  SetDevice(device);
  std::unique_ptr<CudaEventImpl> e(new CudaEventImpl());
  e->device_ = device;
  L2L_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e->event_, cudaEventDisableTiming | cudaEventBlockingSync));
  return e;
}

CudaEventImpl::~CudaEventImpl() {
  if (event_ == nullptr) return;
  // Destroying an event with recorded work pending is allowed: the runtime frees it
  // once that work completes.
  if (cudaSetDevice(device_) != cudaSuccess || cudaEventDestroy(event_) != cudaSuccess) {
    spdlog::warn("cuda:{} event teardown: {}", device_, cudaGetErrorString(cudaGetLastError()));
  }
}

Status CudaEventImpl::Wait() {
  SetDevice(device_);
  // Blocks until the latest record's work is done (a never-recorded event returns at
  // once); fails with the device's error for that work.
  L2L_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(event_));
  return Status::Ok();
}

cudaEvent_t NativeEvent(Event* e, const char* who) {
  auto* ce = dynamic_cast<CudaEventImpl*>(e);
  L2L_CHECK(ce != nullptr) << who << ": the event does not come from a CUDA backend";
  return ce->get();
}

// ---- CudaCopyQueue -----------------------------------------------------------------------

Result<std::unique_ptr<CudaCopyQueue>> CudaCopyQueue::Create(int device) {
  SetDevice(device);
  std::unique_ptr<CudaCopyQueue> q(new CudaCopyQueue());
  q->device_ = device;
  L2L_ASSIGN_OR_RETURN(q->stream_, CudaStream::Create());
  return q;
}

CudaCopyQueue::~CudaCopyQueue() {
  if (stream_.get() == nullptr) return;
  if (cudaSetDevice(device_) != cudaSuccess || cudaStreamSynchronize(stream_.get()) != cudaSuccess) {
    spdlog::warn("cuda:{} copy queue teardown: {}", device_, cudaGetErrorString(cudaGetLastError()));
  }
}

void CudaCopyQueue::MakeCurrent() const { SetDevice(device_); }

void CudaCopyQueue::CopyToDevice(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  MakeCurrent();
  Wrote(dst, bytes);
  L2L_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_.get()));
}

void CudaCopyQueue::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  MakeCurrent();
  L2L_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_.get()));
}

Status CudaCopyQueue::WidenToF32(float* dst, const void* src, DType dtype, int64_t n) {
  if (n <= 0) return Status::Ok();
  MakeCurrent();
  Wrote(dst, static_cast<size_t>(n) * sizeof(float));
  switch (dtype) {
    case DType::kF32:
      if (dst != src) {
        L2L_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float),
                                                 cudaMemcpyDeviceToDevice, stream_.get()));
      }
      return Status::Ok();
    case DType::kBF16:
      LaunchCastBf16ToF32(dst, static_cast<const uint16_t*>(src), n, stream_.get());
      return Status::Ok();
    default:
      return Unimplemented(std::string("cuda copy queue: no widening kernel for ") + DTypeName(dtype) +
                           " (the worker fetches f32 or bf16)");
  }
}

Status CudaCopyQueue::DequantizeBlocks(float* dst, const void* blocks, QuantFormat format, int64_t n) {
  L2L_RETURN_IF_ERROR(QuantizedBytes(format, n).status());
  if (n == 0) return Status::Ok();
  MakeCurrent();
  Wrote(dst, static_cast<size_t>(n) * sizeof(float));
  LaunchDequantizeBlocks(dst, static_cast<const uint8_t*>(blocks), ToBlockFormat(format), n, stream_.get());
  return Status::Ok();
}

void CudaCopyQueue::Record(Event* e) {
  MakeCurrent();
  L2L_CUDA_CHECK(cudaEventRecord(NativeEvent(e, "CopyQueue::Record"), stream_.get()));
}

void CudaCopyQueue::WaitFor(Event* e) {
  MakeCurrent();
  L2L_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), NativeEvent(e, "CopyQueue::WaitFor"), 0));
}

// ---- CudaHostPin -------------------------------------------------------------------------

Result<std::unique_ptr<CudaHostPin>> CudaHostPin::Create(int device, void* p, size_t bytes,
                                                         bool read_only) {
  SetDevice(device);
  int supported = 0;
  L2L_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterSupported, device));
  if (supported == 0) {
    return Unimplemented("cuda:" + std::to_string(device) +
                         " cannot page-lock existing host memory (cudaDevAttrHostRegisterSupported = 0)");
  }
  if (read_only) {
    L2L_CUDA_RETURN_IF_ERROR(
        cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device));
    if (supported == 0) {
      return Unimplemented("cuda:" + std::to_string(device) +
                           " cannot page-lock a read-only mapping "
                           "(cudaDevAttrHostRegisterReadOnlySupported = 0)");
    }
  }
  std::unique_ptr<CudaHostPin> pin(new CudaHostPin());
  pin->device_ = device;
  L2L_ASSIGN_OR_RETURN(pin->reg_, HostRegistration::Create(p, bytes, read_only));
  return pin;
}

CudaHostPin::~CudaHostPin() {
  if (reg_.data() == nullptr) return;
  if (cudaSetDevice(device_) != cudaSuccess) (void)cudaGetLastError();
  reg_ = HostRegistration();  // cudaHostUnregister, with the device current
}

// ---- pinned host buffers -----------------------------------------------------------------

namespace {
void FreePinned(void* p) {
  const cudaError_t e = cudaFreeHost(p);
  if (e != cudaSuccess) {
    spdlog::warn("l2l cuda: cudaFreeHost failed during teardown: {}", cudaGetErrorString(e));
    (void)cudaGetLastError();
  }
}
}  // namespace

Result<HostBuffer> AllocPinnedHost(int device, size_t bytes) {
  SetDevice(device);
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return ResourceExhausted("cuda:" + std::to_string(device) + ": cudaMallocHost of " +
                             std::to_string(bytes) + " bytes (" + std::to_string(bytes >> 20) +
                             " MiB) failed: " + cudaGetErrorString(e) +
                             " (check the memlock limit, `ulimit -l`)");
  }
  return HostBuffer(p, bytes, &FreePinned);
}

}  // namespace l2l::kernels::cuda
