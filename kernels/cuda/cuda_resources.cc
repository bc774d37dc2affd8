// RAII owners of CUDA resources and the shared GPU error text. See cuda_resources.h and
// cuda_check.h.
#include "kernels/cuda/cuda_resources.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace l2l::kernels::cuda {

std::string GpuErrorMessage(const char* stmt, const char* what, const char* file, int line) {
  int dev = -1;
  std::string device = cudaGetDevice(&dev) == cudaSuccess ? "cuda:" + std::to_string(dev) : "cuda:?";
  return std::string(stmt) + " failed on " + device + ": " + (what ? what : "unknown error") +
         " (" + file + ":" + std::to_string(line) + ")";
}

void GpuCheckFailed(const char* stmt, const char* what, const char* file, int line) {
  std::string msg = GpuErrorMessage(stmt, what, file, line);
  std::fprintf(stderr, "l2l: fatal GPU error: %s\n", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace {
// Destructors log and go on (nccl's CUDACHECKIGNORE).
void LogIfError(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    spdlog::warn("l2l cuda: {} failed during teardown: {}", what, cudaGetErrorString(e));
    (void)cudaGetLastError();  // do not leave the sticky-free error for the next check
  }
}

std::string MiB(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }
}  // namespace

// ---- CudaStream --------------------------------------------------------------------
Result<CudaStream> CudaStream::Create() {
  CudaStream s;
  L2L_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking));
  return s;
}
CudaStream::~CudaStream() {
  if (s_) LogIfError(cudaStreamDestroy(s_), "cudaStreamDestroy");
}
CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    if (s_) LogIfError(cudaStreamDestroy(s_), "cudaStreamDestroy");
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}

// ---- CudaEvent ---------------------------------------------------------------------
Result<CudaEvent> CudaEvent::Create(bool timing) {
  CudaEvent e;
  L2L_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e.e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}
CudaEvent::~CudaEvent() {
  if (e_) LogIfError(cudaEventDestroy(e_), "cudaEventDestroy");
}
CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    if (e_) LogIfError(cudaEventDestroy(e_), "cudaEventDestroy");
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

// ---- CublasLtHandle ----------------------------------------------------------------
Result<CublasLtHandle> CublasLtHandle::Create() {
  CublasLtHandle h;
  L2L_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&h.h_));
  return h;
}
CublasLtHandle::~CublasLtHandle() {
  if (h_ && cublasLtDestroy(h_) != CUBLAS_STATUS_SUCCESS) {
    spdlog::warn("l2l cuda: cublasLtDestroy failed during teardown");
  }
}
CublasLtHandle& CublasLtHandle::operator=(CublasLtHandle&& o) noexcept {
  if (this != &o) {
    if (h_) (void)cublasLtDestroy(h_);
    h_ = std::exchange(o.h_, nullptr);
  }
  return *this;
}

// ---- CudaBuffer --------------------------------------------------------------------
Result<CudaBuffer> CudaBuffer::Create(size_t bytes) {
  CudaBuffer b;
  if (bytes == 0) return b;
  cudaError_t e = cudaMalloc(&b.p_, bytes);
  if (e != cudaSuccess) {
    b.p_ = nullptr;
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    (void)cudaMemGetInfo(&free_b, &total_b);
    return ResourceExhausted("cudaMalloc of " + std::to_string(bytes) + " bytes (" + MiB(bytes) +
                             ") failed: " + cudaGetErrorString(e) + "; device has " +
                             MiB(free_b) + " free of " + MiB(total_b));
  }
  b.bytes_ = bytes;
  return b;
}
CudaBuffer::~CudaBuffer() {
  if (p_) LogIfError(cudaFree(p_), "cudaFree");
}
CudaBuffer& CudaBuffer::operator=(CudaBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) LogIfError(cudaFree(p_), "cudaFree");
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// ---- PinnedBuffer ------------------------------------------------------------------
Result<PinnedBuffer> PinnedBuffer::Create(size_t bytes) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  cudaError_t e = cudaMallocHost(&b.p_, bytes);
  if (e != cudaSuccess) {
    b.p_ = nullptr;
    (void)cudaGetLastError();
    return ResourceExhausted("cudaMallocHost of " + std::to_string(bytes) + " bytes (" +
                             MiB(bytes) + ") failed: " + cudaGetErrorString(e) +
                             " (check the memlock limit, `ulimit -l`)");
  }
  b.bytes_ = bytes;
  return b;
}
PinnedBuffer::~PinnedBuffer() {
  if (p_) LogIfError(cudaFreeHost(p_), "cudaFreeHost");
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) LogIfError(cudaFreeHost(p_), "cudaFreeHost");
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// ---- HostRegistration --------------------------------------------------------------
Result<HostRegistration> HostRegistration::Create(void* ptr, size_t bytes, bool read_only) {
  HostRegistration r;
  if (ptr == nullptr || bytes == 0) {
    return InvalidArgument("cudaHostRegister needs a non-empty range (got ptr=" +
                           std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                           ", bytes=" + std::to_string(bytes) + ")");
  }
  // Portable: every device of the process may DMA from it (a device group pins once).
  unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
  cudaError_t e = cudaHostRegister(ptr, bytes, flags);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Internal("cudaHostRegister of " + std::to_string(bytes) + " bytes (" + MiB(bytes) +
                    ") failed: " + cudaGetErrorString(e) +
                    " (check the memlock limit, `ulimit -l`, and that the range is mapped)");
  }
  r.p_ = ptr;
  r.bytes_ = bytes;
  return r;
}
HostRegistration::~HostRegistration() {
  if (p_) LogIfError(cudaHostUnregister(p_), "cudaHostUnregister");
}
HostRegistration& HostRegistration::operator=(HostRegistration&& o) noexcept {
  if (this != &o) {
    if (p_) LogIfError(cudaHostUnregister(p_), "cudaHostUnregister");
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace l2l::kernels::cuda
