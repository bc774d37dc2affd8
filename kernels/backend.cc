// Backend registry (CreateBackend: "cpu" | "cuda:N"), DeviceBuffer (the RAII owner of one
// Backend::Alloc) and the defaults of the optional asynchronous-transfer hooks (what a
// backend without copy engines answers). The one place that knows which backends this
// build has.
#include "kernels/backend.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <utility>

#ifdef L2L_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace l2l::kernels {

Result<std::unique_ptr<Backend>> CreateBackend(const std::string& device) {
  if (device == "cpu") return CreateCpuBackend(CpuBackendOptions{});
  const std::string prefix = "cuda:";
  if (device.rfind(prefix, 0) == 0) {
    const char* first = device.data() + prefix.size();
    const char* last = device.data() + device.size();
    int index = -1;
    auto [ptr, ec] = std::from_chars(first, last, index);
    if (first == last || ec != std::errc() || ptr != last || index < 0) {
      return InvalidArgument("device \"" + device +
                             "\": expected \"cpu\" or \"cuda:N\" with N a GPU index >= 0");
    }
#ifdef L2L_HAVE_CUDA
    return CreateCudaBackend(index);
#else
    return FailedPrecondition("device \"" + device +
                              "\": this build has no CUDA support (configured with L2L_CUDA=OFF "
                              "or nvcc not found); use device \"cpu\"");
#endif
  }
  return InvalidArgument("unknown device \"" + device + "\": expected \"cpu\" or \"cuda:N\"");
}

Result<std::vector<std::unique_ptr<DeviceCollective>>> CreateDeviceCollectives(
    const std::vector<Backend*>& backends) {
  if (backends.empty()) return InvalidArgument("a device group needs at least one device");
  for (Backend* b : backends) {
    if (b == nullptr || b->kind() != DeviceKind::kCuda)
      return InvalidArgument("a device group needs CUDA devices, got " +
                             (b == nullptr ? std::string("null") : b->name()));
  }
#ifdef L2L_HAVE_CUDA
  return CreateNcclCollectives(backends);
#else
  return FailedPrecondition("device groups need CUDA; this build has none");
#endif
}

Status Backend::DequantizeBlocks(float*, const void*, QuantFormat format, int64_t) {
  return Unimplemented(name() + " has no DequantizeBlocks (" + ToString(format) + ")");
}

// ---- asynchronous transfers: defaults for backends without them (the CPU backend) -------

Result<std::unique_ptr<CopyQueue>> Backend::CreateCopyQueue() {
  return Unimplemented(name() + " has no copy queues (its device memory is host memory)");
}

Result<std::unique_ptr<Event>> Backend::CreateEvent() {
  return Unimplemented(name() + " has no events (its ops complete before they return)");
}

void Backend::RecordEvent(Event*) {
  L2L_CHECK(false) << name() << ": RecordEvent on a backend without events";
}

void Backend::WaitEvent(Event*) {
  L2L_CHECK(false) << name() << ": WaitEvent on a backend without events";
}

namespace {
void FreeAligned(void* p) { std::free(p); }
}  // namespace

Result<HostBuffer> Backend::AllocHost(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;  // aligned_alloc needs a multiple
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) {
    return ResourceExhausted(name() + ": cannot allocate " + std::to_string(bytes) +
                             " bytes of host memory");
  }
  return HostBuffer(p, bytes, &FreeAligned);
}

Result<std::unique_ptr<HostPin>> Backend::PinHostRange(void*, size_t, bool) {
  return Unimplemented(name() + " does not page-lock host memory (it copies with the CPU)");
}

// ---- Llama-family ops: defaults for backends that do not implement them yet ---------------

namespace {
[[noreturn]] void NotImplemented(const Backend& be, const char* op) {
  L2L_CHECK(false) << be.name() << ": " << op
                   << " is not implemented on this backend (UNIMPLEMENTED); the model "
                      "family that uses it needs it (see kernels/backend.h for the contract)";
  std::abort();
}
}  // namespace

void Backend::LinearForward(float* y, const float* x, const float* w, bool trans_w,
                            const float* bias, int64_t N, int64_t IC, int64_t OC, float* act,
                            const float* residual) {
  L2L_CHECK(act == nullptr || residual == nullptr) << "LinearForward: act and residual are exclusive";
  Gemm(false, trans_w, N, OC, IC, 1.0f, x, IC, w, trans_w ? IC : OC, 0.0f, y, OC);
  if (bias != nullptr) AddBias(y, bias, N, OC);
  if (act != nullptr) GeluForward(act, y, N * OC);
  if (residual != nullptr) Add(y, y, residual, N * OC);
}

void Backend::GeluBackwardBias(float* dinp, float* dbias, const float* inp, const float* dout,
                               int64_t N, int64_t F) {
  Zero(dinp, size_t(N * F) * sizeof(float));
  GeluBackward(dinp, inp, dout, N * F);
  if (dbias != nullptr) BiasBackward(dbias, dinp, N, F);
}

void Backend::LayerNormBackwardResidual(float* dinp, float* dweight, float* dbias,
                                        const float* dresid, const float* dout, const float* inp,
                                        const float* weight, const float* mean, const float* rstd,
                                        int64_t N, int64_t C) {
  if (dinp != dresid) CopyDeviceToDevice(dinp, dresid, size_t(N * C) * sizeof(float));
  LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void Backend::RMSNormBackwardResidual(float* dinp, float* dweight, const float* dresid,
                                      const float* dout, const float* inp, const float* weight,
                                      const float* rstd, int64_t N, int64_t C) {
  if (dinp != dresid) CopyDeviceToDevice(dinp, dresid, size_t(N * C) * sizeof(float));
  RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C);
}

void Backend::SwiGLUBackwardInto(float* dgate_up, const float* dout, const float* gate_up,
                                 int64_t N, int64_t F) {
  Zero(dgate_up, size_t(N * 2 * F) * sizeof(float));
  SwiGLUBackward(dgate_up, dout, gate_up, N, F);
}

void Backend::CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits,
                                          const int32_t* targets, float scale, int64_t N, int64_t V) {
  CrossEntropyForward(losses, dlogits, logits, targets, N, V);
  CrossEntropyBackward(dlogits, dlogits, targets, scale, N, V);
}

void Backend::TokenEmbeddingForward(float*, const int32_t*, const float*, int64_t, int64_t) {
  NotImplemented(*this, "TokenEmbeddingForward");
}
void Backend::TokenEmbeddingBackward(float*, const float*, const int32_t*, int64_t, int64_t) {
  NotImplemented(*this, "TokenEmbeddingBackward");
}
void Backend::RMSNormForward(float*, float*, const float*, const float*, int64_t, int64_t, float) {
  NotImplemented(*this, "RMSNormForward");
}
void Backend::RMSNormBackward(float*, float*, const float*, const float*, const float*,
                              const float*, int64_t, int64_t) {
  NotImplemented(*this, "RMSNormBackward");
}
void Backend::RopeForward(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                          int64_t) {
  NotImplemented(*this, "RopeForward");
}
void Backend::RopeBackward(float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                           int64_t) {
  NotImplemented(*this, "RopeBackward");
}
void Backend::AdamW(float*, const float*, float*, float*, int64_t, const AdamWStepArgs&) {
  NotImplemented(*this, "AdamW");
}
void Backend::GatherRows(float*, const float*, const int32_t*, const float*, int64_t, int64_t) {
  NotImplemented(*this, "GatherRows");
}
void Backend::ScatterAddRows(float*, const float*, const int32_t*, const float*, int64_t, int64_t) {
  NotImplemented(*this, "ScatterAddRows");
}
void Backend::RowDot(float*, const float*, const float*, int64_t, int64_t) { NotImplemented(*this, "RowDot"); }
void Backend::SwiGLUForward(float*, const float*, int64_t, int64_t) {
  NotImplemented(*this, "SwiGLUForward");
}
void Backend::SwiGLUBackward(float*, const float*, const float*, int64_t, int64_t) {
  NotImplemented(*this, "SwiGLUBackward");
}
void Backend::AttentionForwardGqa(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                                  int64_t NH, int64_t NKV, int64_t hs) {
  if (NKV != NH) NotImplemented(*this, "AttentionForwardGqa with n_kv_heads < n_heads");
  AttentionForward(out, att, qkv, B, T, NH * hs, NH);
}
void Backend::AttentionBackwardGqa(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                   const float* att, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                   int64_t hs) {
  if (NKV != NH) NotImplemented(*this, "AttentionBackwardGqa with n_kv_heads < n_heads");
  AttentionBackward(dqkv, scratch, dout, qkv, att, B, T, NH * hs, NH);
}

void Backend::AttentionForwardGqaWindow(float* out, float* att, const float* qkv, int64_t B,
                                        int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                                        int64_t window) {
  if (window > 0 && window < T) NotImplemented(*this, "AttentionForwardGqaWindow (sliding-window attention)");
  AttentionForwardGqa(out, att, qkv, B, T, NH, NKV, hs);
}
void Backend::AttentionBackwardGqaWindow(float* dqkv, float* scratch, const float* dout,
                                         const float* qkv, const float* att, int64_t B, int64_t T,
                                         int64_t NH, int64_t NKV, int64_t hs, int64_t window) {
  if (window > 0 && window < T) NotImplemented(*this, "AttentionBackwardGqaWindow (sliding-window attention)");
  AttentionBackwardGqa(dqkv, scratch, dout, qkv, att, B, T, NH, NKV, hs);
}
void Backend::GegluForward(float*, const float*, int64_t, int64_t) { NotImplemented(*this, "GegluForward"); }
void Backend::GegluBackward(float*, const float*, const float*, int64_t, int64_t) {
  NotImplemented(*this, "GegluBackward");
}
void Backend::Copy2D(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                     int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    CopyDeviceToDevice(dst + r * dst_ld, src + r * src_ld, static_cast<size_t>(cols) * sizeof(float));
  }
}

void Backend::CounterDropout(float*, int64_t, const float*, int64_t, int64_t, int64_t, uint64_t, uint32_t, float,
                             bool) {
  NotImplemented(*this, "CounterDropout");
}

// ---- BERT-family ops: defaults for backends that do not implement them yet ----------------

void Backend::LayerNormForwardEps(float* out, float* mean, float* rstd, const float* inp,
                                  const float* weight, const float* bias, int64_t N, int64_t C,
                                  float eps) {
  if (eps != 1e-5f) NotImplemented(*this, "LayerNormForwardEps with eps != 1e-5");
  LayerNormForward(out, mean, rstd, inp, weight, bias, N, C);
}
void Backend::GeluErfForward(float*, const float*, int64_t) { NotImplemented(*this, "GeluErfForward"); }
void Backend::GeluErfBackward(float*, const float*, const float*, int64_t) {
  NotImplemented(*this, "GeluErfBackward");
}
void Backend::TanhForward(float*, const float*, int64_t) { NotImplemented(*this, "TanhForward"); }
void Backend::TanhBackward(float*, const float*, const float*, int64_t) {
  NotImplemented(*this, "TanhBackward");
}
void Backend::AttentionForwardMasked(float*, float*, const float*, const int32_t*, int64_t, int64_t,
                                     int64_t, int64_t) {
  NotImplemented(*this, "AttentionForwardMasked");
}
void Backend::AttentionBackwardMasked(float*, float*, const float*, const float*, const float*,
                                      int64_t, int64_t, int64_t, int64_t) {
  NotImplemented(*this, "AttentionBackwardMasked");
}

// ---- DeviceBuffer ----------------------------------------------------------------------

Result<DeviceBuffer> DeviceBuffer::Create(Backend* backend, size_t bytes) {
  L2L_CHECK(backend != nullptr) << "DeviceBuffer::Create needs a backend";
  Result<void*> p = backend->Alloc(bytes);
  if (!p.ok()) return p.status();
  DeviceBuffer buf;
  buf.backend_ = backend;
  buf.ptr_ = *p;
  buf.bytes_ = bytes;
  return buf;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) backend_->Free(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : backend_(std::exchange(o.backend_, nullptr)),
      ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) backend_->Free(ptr_);
    backend_ = std::exchange(o.backend_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace l2l::kernels
