// CudaBackend: kernels::Backend on one GPU. Everything runs on one non-blocking compute
// stream in call order; the only host waits are CopyToHost, SumSquares, Synchronize (and
// CopyToDevice from page-locked memory, see there). See cuda_backend.h.
#include "kernels/cuda/cuda_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/adamw.h"
#include "kernels/bf16_copies.h"
#include "common/env.h"
#include "common/name_table.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/bf16_operands.h"
#include "kernels/cuda/copy_queue.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"

namespace l2l::kernels {
namespace cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> Create(int device, const CudaBackendOptions& opt);

  // Finishes queued work with this device current, so buffers are freed after their
  // last use even when another device was made current since.
  ~CudaBackend() override {
    if (cudaSetDevice(device_) != cudaSuccess || cudaStreamSynchronize(stream_.get()) != cudaSuccess) {
      spdlog::warn("{}: teardown: {}", name_, cudaGetErrorString(cudaGetLastError()));
    }
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }

  // ---- memory ----------------------------------------------------------------------
  Result<void*> Alloc(size_t bytes) override {
    MakeCurrent();
    if (bytes == 0) bytes = 1;  // a unique non-null pointer, as malloc(0) may not give
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);  // 256-byte aligned
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      return ResourceExhausted(name_ + ": cannot allocate " + std::to_string(bytes) +
                               " bytes of device memory (" + cudaGetErrorString(e) + "; " +
                               std::to_string(free_b >> 20) + " MiB free of " +
                               std::to_string(total_b >> 20) + " MiB)");
    }
    sizes_[p] = bytes;
    allocated_ += bytes;
    peak_allocated_ = std::max(peak_allocated_, allocated_);
    return p;
  }
  void Free(void* p) override {
    if (p == nullptr) return;
    MakeCurrent();
    L2L_CUDA_CHECK(cudaFree(p));  // waits for work that may still use p
    auto it = sizes_.find(p);
    L2L_CHECK(it != sizes_.end()) << name_ << ": Free of a pointer this backend did not Alloc";
    allocated_ -= it->second;
    sizes_.erase(it);
  }
  // Pageable source: cudaMemcpyAsync has copied it to a staging buffer when it returns,
  // so the caller may reuse it at once and the copy stays ordered on the stream without
  // a host wait. Page-locked source (cudaMallocHost / cudaHostRegister): the DMA reads
  // it later, so we wait for the copy to keep the Backend contract (the caller may
  // overwrite its buffer after we return).
  void CopyToDevice(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    MakeCurrent();
    L2L_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream()));
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, host_src) != cudaSuccess) {
      (void)cudaGetLastError();
      attr.type = cudaMemoryTypeUnregistered;
    }
    if (attr.type != cudaMemoryTypeUnregistered) L2L_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    MakeCurrent();
    L2L_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
    L2L_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void CopyDeviceToDevice(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    MakeCurrent();
    WrittenBytes(dst, bytes);
    L2L_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
  }
  void Zero(void* dst, size_t bytes) override {
    if (bytes == 0) return;
    MakeCurrent();
    WrittenBytes(dst, bytes);
    L2L_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
  }
  void Synchronize() override {
    MakeCurrent();
    L2L_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

  // ---- dense algebra ---------------------------------------------------------------
  void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
            int64_t ldc) override {
    if (M <= 0 || N <= 0) return;
    SetDevice();  // not MakeCurrent: the fresh bf16 operand copies stay fresh across GEMMs
    if (K <= 0) {  // op(A) @ op(B) is zero: C = beta * C
      operands_.Written(C, (M - 1) * ldc + N);
      LaunchScaleMatrix(C, beta, M, N, ldc, stream());
      return;
    }
    LtGemmArgs a{.trans_a = trans_a, .trans_b = trans_b, .M = M, .N = N, .K = K, .alpha = alpha,
                 .beta = beta, .A = A, .lda = lda, .B = B, .ldb = ldb, .C = C, .ldc = ldc,
                 .compute = compute_};
    if (precision_ == CudaGemmPrecision::kBf16) {
      // Autocast: each operand's covered extent (first to last element, ld padding
      // included) cast to bf16 at the same offsets; fp32 accumulation into fp32 C. An
      // ld smaller than the row stages nothing and Run() rejects it below.
      int slot_a = -1, slot_b = -1;
      a.A = StageBf16(A, trans_a ? K : M, trans_a ? M : K, lda, -1, &slot_a);
      a.B = StageBf16(B, trans_b ? N : K, trans_b ? K : N, ldb, slot_a, &slot_b);
      // Copies of C's elements are stale once this GEMM writes them: older ones, and one
      // cast just now (a strided view into C's buffer holds their values before it).
      operands_.Written(C, (M - 1) * ldc + N);
      a.ab_type = CUDA_R_16BF;
      a.compute = CUBLAS_COMPUTE_32F;
    }
    Status st = gemm_.Run(a, stream());
    L2L_CHECK(st.ok()) << name_ << " Gemm: " << st.ToString();
  }
  // The GEMM (fp32, tf32 or bf16 as Gemm), then bias, residual or GELU in one pass over y
  // (elementwise.cu) instead of AddBias + Add / GeluForward: the same bits as the default.
  void LinearForward(float* y, const float* x, const float* w, bool trans_w, const float* bias,
                     int64_t N, int64_t IC, int64_t OC, float* act, const float* residual) override {
    L2L_CHECK(act == nullptr || residual == nullptr) << name_ << " LinearForward: act and residual are exclusive";
    Gemm(false, trans_w, N, OC, IC, 1.0f, x, IC, w, trans_w ? IC : OC, 0.0f, y, OC);
    MakeCurrent();
    LaunchLinearEpilogue(y, bias, act, residual, N, OC, stream(), ProduceBf16(act, N * OC));
  }
  void AddBias(float* out, const float* bias, int64_t N, int64_t OC) override {
    MakeCurrent();
    operands_.Written(out, N * OC);
    LaunchAddBias(out, bias, N, OC, stream());
  }
  void BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC) override {
    if (N <= 0 || OC <= 0) return;
    MakeCurrent();
    const int64_t groups = ColumnSumGroups(N);
    float* scratch = static_cast<float*>(Scratch(sizeof(float) * groups * OC));
    LaunchBiasBackward(dbias, dout, N, OC, scratch, groups, stream());
  }

  // ---- bf16 copies of operands ------------------------------------------------------
  Bf16OperandStats bf16_operand_stats() const override { return gemm_stats_; }
  bool TakesBf16Copies() const override { return precision_ == CudaGemmPrecision::kBf16; }
  void NoteBf16Copy(const float* f32, const uint16_t* bits, int64_t n) override {
    if (TakesBf16Copies() && n > 0) bf16_copies_.Note(f32, bits, n);  // only bf16 GEMMs read them
  }
  void ForgetBf16Copy(const float* f32) override {
    bf16_copies_.Forget(f32);
    operands_.Touch();  // the prefetcher refills the slot next
  }
  void HoldBf16Copy(const float* f32, int64_t n) override {
    if (precision_ == CudaGemmPrecision::kBf16 && hold_bf16_) operands_.Hold(f32, n);  // not with reuse off
  }
  void ReleaseBf16Copy(const float* f32) override { operands_.Release(f32); }

  // ---- elementwise -----------------------------------------------------------------
  void RoundToBf16(float* x, uint16_t* bits, int64_t n) override {
    MakeCurrent();
    LaunchRoundToBf16(x, bits, n, stream());
  }
  void WidenBf16(float* dst, const uint16_t* src, int64_t n) override {
    MakeCurrent();
    LaunchCastBf16ToF32(dst, src, n, stream());
  }
  void Add(float* out, const float* a, const float* b, int64_t n) override {
    MakeCurrent();
    operands_.Written(out, n);
    LaunchAdd(out, a, b, n, stream());
  }
  void Axpy(float* dst, const float* src, float alpha, int64_t n) override {
    MakeCurrent();
    operands_.Written(dst, n);
    LaunchAxpy(dst, src, alpha, n, stream());
  }
  void Scale(float* x, float alpha, int64_t n) override {
    MakeCurrent();
    operands_.Written(x, n);
    LaunchScale(x, alpha, n, stream());
  }
  void CounterDropout(float* out, int64_t ldo, const float* x, int64_t ldx, int64_t N, int64_t C,
                      uint64_t stream_key, uint32_t threshold, float scale, bool accumulate) override {
    MakeCurrent();
    LaunchCounterDropout(out, ldo, x, ldx, N, C, stream_key, threshold, scale, accumulate, stream());
  }
  Status DequantizeBlocks(float* out, const void* blocks, QuantFormat format, int64_t n) override {
    L2L_RETURN_IF_ERROR(QuantizedBytes(format, n).status());
    MakeCurrent();
    LaunchDequantizeBlocks(out, static_cast<const uint8_t*>(blocks), ToBlockFormat(format), n, stream());
    return Status::Ok();
  }
  void AdamW(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStepArgs& args) override {
    MakeCurrent();
    const AdamWScalars a = MakeAdamWScalars(args);
    const AdamWKernelScalars c{a.decay_mul, a.one_minus_b1, a.beta2, a.one_minus_b2,
                               a.bc2_sqrt, a.neg_step_size, a.eps, a.grad_scale};
    LaunchAdamW(p, g, m, v, n, c, stream());
  }
  void GeluForward(float* out, const float* inp, int64_t n) override {
    MakeCurrent();
    LaunchGeluForward(out, inp, n, stream(), ProduceBf16(out, n));
  }
  void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    MakeCurrent();
    LaunchGeluBackward(dinp, inp, dout, n, stream());
  }
  // One pass (reduce.cu): the default's Zero, GeluBackward and BiasBackward read and wrote
  // dinp three times; the same summation order as BiasBackward.
  void GeluBackwardBias(float* dinp, float* dbias, const float* inp, const float* dout, int64_t N,
                        int64_t F) override {
    if (N <= 0 || F <= 0) return;
    MakeCurrent();
    const int64_t groups = ColumnSumGroups(N);
    float* scratch =
        dbias != nullptr ? static_cast<float*>(Scratch(sizeof(float) * groups * F)) : nullptr;
    LaunchGeluBackwardBias(dinp, dbias, inp, dout, N, F, scratch, groups, stream(), ProduceBf16(dinp, N * F));
  }
  double SumSquares(const float* x, int64_t n) override {
    if (n <= 0) return 0.0;
    MakeCurrent();
    auto* scratch = static_cast<double*>(Scratch(sizeof(double) * (kSumSquaresBlocks + 1)));
    LaunchSumSquares(scratch + kSumSquaresBlocks, x, n, scratch, stream());
    double result = 0.0;
    L2L_CUDA_CHECK(cudaMemcpyAsync(result_host_.data(), scratch + kSumSquaresBlocks,
                                   sizeof(double), cudaMemcpyDeviceToHost, stream()));
    L2L_CUDA_CHECK(cudaStreamSynchronize(stream()));
    std::memcpy(&result, result_host_.data(), sizeof(double));
    return result;
  }

  // ---- transformer ops -------------------------------------------------------------
  void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                        int64_t B, int64_t T, int64_t C) override {
    MakeCurrent();
    LaunchEmbeddingForward(out, tokens, wte, wpe, B, T, C, stream());
  }
  void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                         int64_t B, int64_t T, int64_t C) override {
    if (B * T <= 0 || C <= 0) return;
    MakeCurrent();
    const size_t bytes = EmbeddingBackwardScratchBytes(B * T);
    void* scratch = Scratch(bytes);
    LaunchEmbeddingBackward(dwte, dwpe, dout, tokens, B, T, C, scratch, bytes, stream());
  }
  void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                        const float* weight, const float* bias, int64_t N, int64_t C) override {
    MakeCurrent();
    LaunchLayerNormForward(out, mean, rstd, inp, weight, bias, N, C, 1e-5f, stream(), ProduceBf16(out, N * C));
  }
  void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int64_t N, int64_t C) override {
    LayerNormBackwardResidual(dinp, dweight, dbias, nullptr, dout, inp, weight, mean, rstd, N, C);
  }
  // One pass when C <= kFusedLayerNormMaxC (reduce.cu); dresid null: accumulate into dinp.
  void LayerNormBackwardResidual(float* dinp, float* dweight, float* dbias, const float* dresid,
                                 const float* dout, const float* inp, const float* weight,
                                 const float* mean, const float* rstd, int64_t N, int64_t C) override {
    if (N <= 0 || C <= 0) return;
    MakeCurrent();
    const int64_t groups = NormBackwardGroups(N, C, kFusedLayerNormMaxC);
    float* scratch = static_cast<float*>(Scratch(sizeof(float) * 2 * groups * C));
    LaunchLayerNormBackward(dinp, dweight, dbias, dresid, dout, inp, weight, mean, rstd, N, C,
                            scratch, groups, stream(),
                            C <= kFusedLayerNormMaxC ? ProduceBf16(dinp, N * C) : nullptr);
  }
  // ---- attention: the fused kernels (flash_attention.h) where the head size allows and
  // L2L_CUDA_ATTENTION / the options say flash, else the GEMM path (attention.h).
  bool UseFlash(int64_t hs) const {
    return attention_ == CudaAttentionKind::kFlash && cuda::FlashSupportedHeadSize(hs);
  }
  cuda::FlashShape Flash(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t hs) const {
    cuda::FlashShape s;
    s.B = B;
    s.T = T;
    s.NH = NH;
    s.NKV = NKV;
    s.hs = hs;
    s.bf16 = precision_ == CudaGemmPrecision::kBf16;
    return s;
  }
  size_t CausalAttentionFloats(int64_t B, int64_t T, int64_t NH, int64_t hs) const override {
    return UseFlash(hs) ? static_cast<size_t>(B * NH * T) : Backend::CausalAttentionFloats(B, T, NH, hs);
  }
  size_t CausalAttentionScratchFloats(int64_t B, int64_t T, int64_t NH, int64_t hs) const override {
    return UseFlash(hs) ? static_cast<size_t>(B * NH * T)
                        : Backend::CausalAttentionScratchFloats(B, T, NH, hs);
  }
  // Flash: att holds the B*NH*T log-sum-exps, then the key mask (B*T int32; all -1 when
  // none was given: nonzero is a real key), which the backward needs.
  size_t MaskedAttentionFloats(int64_t B, int64_t T, int64_t NH, int64_t hs) const override {
    return UseFlash(hs) ? static_cast<size_t>(B * NH * T + B * T) : Backend::MaskedAttentionFloats(B, T, NH, hs);
  }
  size_t MaskedAttentionScratchFloats(int64_t B, int64_t T, int64_t NH, int64_t hs) const override {
    return UseFlash(hs) ? static_cast<size_t>(B * NH * T)
                        : Backend::MaskedAttentionScratchFloats(B, T, NH, hs);
  }
  void AttentionForward(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                        int64_t C, int64_t NH) override {
    if (B <= 0 || T <= 0) return;
    MakeCurrent();
    if (UseFlash(C / NH)) {
      cuda::FlashAttentionForward(Flash(B, T, NH, NH, C / NH), out, att, qkv, stream(), ProduceBf16(out, B * T * C));
      return;
    }
    cuda::AttentionForward(gemm_, attention_mode_, out, att, qkv, B, T, C, NH, stream());
  }
  void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) override {
    if (B <= 0 || T <= 0) return;
    MakeCurrent();
    if (UseFlash(C / NH)) {
      // The qkv linear layer's backward reads dqkv next (GPT-2 and BERT: no RoPE between).
      cuda::FlashAttentionBackward(Flash(B, T, NH, NH, C / NH), dqkv, scratch, dout, qkv, att, stream(),
                                   ProduceBf16(dqkv, B * T * 3 * C));
      return;
    }
    cuda::AttentionBackward(gemm_, attention_mode_, dqkv, scratch, dout, qkv, att, B, T, C, NH,
                            stream());
  }
  void CrossEntropyForward(float* losses, float* probs, const float* logits,
                           const int32_t* targets, int64_t N, int64_t V) override {
    MakeCurrent();
    LaunchCrossEntropyForward(losses, probs, logits, targets, N, V, stream());
  }
  void CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                            float scale, int64_t N, int64_t V) override {
    MakeCurrent();
    LaunchCrossEntropyBackward(dlogits, probs, targets, scale, N, V, stream());
  }

  // ---- Llama-family ops (kernels/backend.h; kernels in llama_ops.cu, reduce.cu,
  // embedding_backward.cu, attention.cc) -----------------------------------------------
  void TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                             int64_t C) override {
    MakeCurrent();
    LaunchTokenEmbeddingForward(out, tokens, wte, N, C, stream());
  }
  void TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                              int64_t C) override {
    if (N <= 0 || C <= 0) return;
    MakeCurrent();
    const size_t bytes = EmbeddingBackwardScratchBytes(N);
    void* scratch = Scratch(bytes);
    LaunchTokenEmbeddingBackward(dwte, dout, tokens, N, C, scratch, bytes, stream());
  }
  void RMSNormForward(float* out, float* rstd, const float* inp, const float* weight, int64_t N,
                      int64_t C, float eps) override {
    MakeCurrent();
    LaunchRMSNormForward(out, rstd, inp, weight, N, C, eps, stream(), ProduceBf16(out, N * C));
  }
  void RMSNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                       const float* weight, const float* rstd, int64_t N, int64_t C) override {
    RMSNormBackwardResidual(dinp, dweight, nullptr, dout, inp, weight, rstd, N, C);
  }
  // One pass when C <= kFusedRmsNormMaxC (reduce.cu); dresid null: accumulate into dinp.
  void RMSNormBackwardResidual(float* dinp, float* dweight, const float* dresid, const float* dout,
                               const float* inp, const float* weight, const float* rstd, int64_t N,
                               int64_t C) override {
    if (N <= 0 || C <= 0) return;
    MakeCurrent();
    const int64_t groups = NormBackwardGroups(N, C, kFusedRmsNormMaxC);
    float* scratch = static_cast<float*>(Scratch(sizeof(float) * groups * C));
    LaunchRMSNormBackward(dinp, dweight, dresid, dout, inp, weight, rstd, N, C, scratch, groups,
                          stream(), C <= kFusedRmsNormMaxC ? ProduceBf16(dinp, N * C) : nullptr);
  }
  void RopeForward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                   int64_t row_stride, int64_t n_heads, int64_t hs) override {
    L2L_CHECK(hs % 2 == 0) << name_ << " RopeForward: head size " << hs << " is odd";
    MakeCurrent();
    LaunchRope(x, cos, sin, B, T, row_stride, n_heads, hs, 1.0f, stream());
  }
  void RopeBackward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                    int64_t row_stride, int64_t n_heads, int64_t hs) override {
    L2L_CHECK(hs % 2 == 0) << name_ << " RopeBackward: head size " << hs << " is odd";
    MakeCurrent();
    // The qkv layer's dW and dx GEMMs read the whole packed row next (the Llama family):
    // its bf16 copy, v included, in the same pass.
    LaunchRope(dx, cos, sin, B, T, row_stride, n_heads, hs, -1.0f, stream(),
               row_stride % hs == 0 && row_stride / hs >= n_heads ? ProduceBf16(dx, B * T * row_stride) : nullptr);
  }
  void SwiGLUForward(float* out, const float* gate_up, int64_t N, int64_t F) override {
    MakeCurrent();
    LaunchSwiGLUForward(out, gate_up, N, F, stream(), ProduceBf16(out, N * F));
  }
  void SwiGLUBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                      int64_t F) override {
    MakeCurrent();
    LaunchSwiGLUBackward(dgate_up, dout, gate_up, N, F, /*accumulate=*/true, stream());
  }
  void SwiGLUBackwardInto(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                          int64_t F) override {
    MakeCurrent();
    LaunchSwiGLUBackward(dgate_up, dout, gate_up, N, F, /*accumulate=*/false, stream(),
                         ProduceBf16(dgate_up, N * 2 * F));
  }
  void AttentionForwardGqa(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                           int64_t NH, int64_t NKV, int64_t hs) override {
    L2L_CHECK(NKV > 0 && NH % NKV == 0)
        << name_ << " AttentionForwardGqa: NKV=" << NKV << " does not divide NH=" << NH;
    if (B <= 0 || T <= 0) return;
    MakeCurrent();
    if (UseFlash(hs)) {
      cuda::FlashAttentionForward(Flash(B, T, NH, NKV, hs), out, att, qkv, stream(), ProduceBf16(out, B * T * NH * hs));
      return;
    }
    cuda::AttentionForwardGqa(gemm_, attention_mode_, out, att, qkv, B, T, NH, NKV, hs, stream());
  }
  void AttentionBackwardGqa(float* dqkv, float* scratch, const float* dout, const float* qkv,
                            const float* att, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                            int64_t hs) override {
    L2L_CHECK(NKV > 0 && NH % NKV == 0)
        << name_ << " AttentionBackwardGqa: NKV=" << NKV << " does not divide NH=" << NH;
    if (B <= 0 || T <= 0) return;
    MakeCurrent();
    if (UseFlash(hs)) {
      cuda::FlashAttentionBackward(Flash(B, T, NH, NKV, hs), dqkv, scratch, dout, qkv, att, stream());
      return;
    }
    cuda::AttentionBackwardGqa(gemm_, attention_mode_, dqkv, scratch, dout, qkv, att, B, T, NH, NKV,
                               hs, stream());
  }
  void AttentionForwardGqaWindow(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                                 int64_t NH, int64_t NKV, int64_t hs, int64_t window) override {
    L2L_CHECK(NKV > 0 && NH % NKV == 0)
        << name_ << " AttentionForwardGqaWindow: NKV=" << NKV << " does not divide NH=" << NH;
    if (B <= 0 || T <= 0) return;
    MakeCurrent();
    if (UseFlash(hs)) {
      cuda::FlashShape fs = Flash(B, T, NH, NKV, hs);
      fs.window = window >= T ? 0 : window;
      cuda::FlashAttentionForward(fs, out, att, qkv, stream(), ProduceBf16(out, B * T * NH * hs));
      return;
    }
    cuda::AttentionForwardGqa(gemm_, attention_mode_, out, att, qkv, B, T, NH, NKV, hs, stream(),
                              window >= T ? 0 : window);
  }
  void AttentionBackwardGqaWindow(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* att, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                  int64_t hs, int64_t window) override {
    L2L_CHECK(NKV > 0 && NH % NKV == 0)
        << name_ << " AttentionBackwardGqaWindow: NKV=" << NKV << " does not divide NH=" << NH;
    if (B <= 0 || T <= 0) return;
    MakeCurrent();
    if (UseFlash(hs)) {
      cuda::FlashShape fs = Flash(B, T, NH, NKV, hs);
      fs.window = window >= T ? 0 : window;
      cuda::FlashAttentionBackward(fs, dqkv, scratch, dout, qkv, att, stream());
      return;
    }
    cuda::AttentionBackwardGqa(gemm_, attention_mode_, dqkv, scratch, dout, qkv, att, B, T, NH, NKV,
                               hs, stream(), window >= T ? 0 : window);
  }
  void GegluForward(float* out, const float* gate_up, int64_t N, int64_t F) override {
    MakeCurrent();
    LaunchGegluForward(out, gate_up, N, F, stream(), ProduceBf16(out, N * F));
  }
  void GegluBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                     int64_t F) override {
    MakeCurrent();
    LaunchGegluBackward(dgate_up, dout, gate_up, N, F, stream());
  }
  void Copy2D(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
              int64_t cols) override {
    MakeCurrent();
    // Into a held copy's source (a q/k norm's gradient back into dqkv, after RoPE's
    // backward wrote its copy): the copy is kept fresh with the new values' bits.
    const int64_t extent = rows > 0 && cols > 0 ? (rows - 1) * dst_ld + cols : 0;
    uint16_t* bits = precision_ == CudaGemmPrecision::kBf16 && reuse_bf16_ ? operands_.HeldBits(dst, extent) : nullptr;
    LaunchCopy2D(dst, dst_ld, src, src_ld, rows, cols, stream(), bits);
  }

  // ---- mixture-of-experts ops (kernels/backend.h; kernels in llama_ops.cu) -------------
  void GatherRows(float* dst, const float* src, const int32_t* idx, const float* scale, int64_t n,
                  int64_t C) override {
    MakeCurrent();
    LaunchGatherRows(dst, src, idx, scale, n, C, stream());
  }
  void ScatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale,
                      int64_t n, int64_t C) override {
    MakeCurrent();
    LaunchScatterAddRows(dst, src, idx, scale, n, C, stream());
  }
  void RowDot(float* out, const float* a, const float* b, int64_t n, int64_t C) override {
    MakeCurrent();
    LaunchRowDot(out, a, b, n, C, stream());
  }

  // ---- BERT-family ops (kernels/backend.h; kernels in bert_ops.cu, reduce.cu,
  // softmax.cu, attention.cc) -----------------------------------------------------------
  void LayerNormForwardEps(float* out, float* mean, float* rstd, const float* inp,
                           const float* weight, const float* bias, int64_t N, int64_t C,
                           float eps) override {
    MakeCurrent();
    LaunchLayerNormForward(out, mean, rstd, inp, weight, bias, N, C, eps, stream(), ProduceBf16(out, N * C));
  }
  void GeluErfForward(float* out, const float* inp, int64_t n) override {
    MakeCurrent();
    LaunchGeluErfForward(out, inp, n, stream(), ProduceBf16(out, n));
  }
  void GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n) override {
    MakeCurrent();
    LaunchGeluErfBackward(dinp, inp, dout, n, stream());
  }
  void TanhForward(float* out, const float* inp, int64_t n) override {
    MakeCurrent();
    LaunchTanhForward(out, inp, n, stream());
  }
  void TanhBackward(float* dinp, const float* out, const float* dout, int64_t n) override {
    MakeCurrent();
    LaunchTanhBackward(dinp, out, dout, n, stream());
  }
  // The "at least one real key" requirement is checked on the host where the mask is
  // built (worker/data_loader.cc CheckSequenceInputs); checking device memory here
  // would cost a host wait per call. A sequence without one gets zero probabilities.
  void AttentionForwardMasked(float* out, float* att, const float* qkv, const int32_t* key_mask,
                              int64_t B, int64_t T, int64_t C, int64_t NH) override {
    if (B <= 0 || T <= 0) return;
    MakeCurrent();
    if (UseFlash(C / NH)) {
      cuda::FlashShape fs = Flash(B, T, NH, NH, C / NH);
      fs.causal = false;
      fs.key_mask = key_mask;
      cuda::FlashAttentionForward(fs, out, att, qkv, stream(), ProduceBf16(out, B * T * C));
      int32_t* stash = reinterpret_cast<int32_t*>(att + B * NH * T);
      const size_t bytes = sizeof(int32_t) * static_cast<size_t>(B * T);
      L2L_CUDA_CHECK(key_mask != nullptr
                         ? cudaMemcpyAsync(stash, key_mask, bytes, cudaMemcpyDeviceToDevice, stream())
                         : cudaMemsetAsync(stash, 0xff, bytes, stream()));
      return;
    }
    cuda::AttentionForwardMasked(gemm_, attention_mode_, out, att, qkv, key_mask, B, T, C, NH,
                                 stream());
  }
  void AttentionBackwardMasked(float* dqkv, float* scratch, const float* dout, const float* qkv,
                               const float* att, int64_t B, int64_t T, int64_t C,
                               int64_t NH) override {
    if (B <= 0 || T <= 0) return;
    MakeCurrent();
    if (UseFlash(C / NH)) {
      cuda::FlashShape fs = Flash(B, T, NH, NH, C / NH);
      fs.causal = false;
      fs.key_mask = reinterpret_cast<const int32_t*>(att + B * NH * T);
      cuda::FlashAttentionBackward(fs, dqkv, scratch, dout, qkv, att, stream(), ProduceBf16(dqkv, B * T * 3 * C));
      return;
    }
    cuda::AttentionBackwardMasked(gemm_, attention_mode_, dqkv, scratch, dout, qkv, att, B, T, C,
                                  NH, stream());
  }

  // ---- asynchronous transfers (kernels/backend.h; the worker's copy streams) ----------
  bool HasAsyncTransfers() const override { return true; }
  Result<std::unique_ptr<CopyQueue>> CreateCopyQueue() override {
    L2L_ASSIGN_OR_RETURN(auto q, CudaCopyQueue::Create(device_));
    if (precision_ == CudaGemmPrecision::kBf16 && reuse_bf16_) q->set_writes(operands_.copy_writes());
    return std::unique_ptr<CopyQueue>(std::move(q));
  }
  Result<std::unique_ptr<Event>> CreateEvent() override {
    L2L_ASSIGN_OR_RETURN(auto e, CudaEventImpl::Create(device_));
    return std::unique_ptr<Event>(std::move(e));
  }
  void RecordEvent(Event* e) override {
    SetDevice();  // writes nothing: fresh bf16 operand copies stay fresh
    L2L_CUDA_CHECK(cudaEventRecord(NativeEvent(e, "Backend::RecordEvent"), stream()));
  }
  void WaitEvent(Event* e) override {
    MakeCurrent();
    L2L_CUDA_CHECK(cudaStreamWaitEvent(stream(), NativeEvent(e, "Backend::WaitEvent"), 0));
  }
  Result<HostBuffer> AllocHost(size_t bytes) override { return AllocPinnedHost(device_, bytes); }
  int device() const { return device_; }
  Result<std::unique_ptr<HostPin>> PinHostRange(void* p, size_t bytes, bool read_only) override {
    L2L_ASSIGN_OR_RETURN(auto pin, CudaHostPin::Create(device_, p, bytes, read_only));
    return std::unique_ptr<HostPin>(std::move(pin));
  }

  // ---- for the bf16 entry points in cuda_backend.h -----------------------------------
  cudaStream_t stream() const { return stream_.get(); }
  LtGemm& gemm() { return gemm_; }
  CudaMemoryStats MemoryStats() const {
    CudaMemoryStats m;
    m.allocated = allocated_;
    m.peak_allocated = peak_allocated_;
    m.internal = scratch_.bytes() + gemm_.workspace_bytes() + operands_.bytes();
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      m.device_used = total_b - free_b;
      m.device_total = total_b;
    } else {
      (void)cudaGetLastError();
    }
    return m;
  }
  void ResetPeak() { peak_allocated_ = allocated_; }
  // Every op but a GEMM starts here: the device current, the fresh bf16 operand copies
  // stale (the op may write their sources).
  void MakeCurrent() {
    SetDevice();
    operands_.Touch();
  }
  // The plain writes (Zero, copies, Add, Axpy, Scale, AddBias) also make a held copy of
  // what they write stale (Backend::HoldBf16Copy): a caller that breaks its promise gets
  // a cast, not stale bits. (Other ops rely on the promise.)
  void WrittenBytes(const void* dst, size_t bytes) {
    operands_.Written(static_cast<const float*>(dst), static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float)));
  }
  void SetDevice() const {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != device_) L2L_CUDA_CHECK(cudaSetDevice(device_));
  }

 private:
  CudaBackend() = default;

  // Device scratch of at least `bytes`, valid until the next Scratch() call. Growing it
  // waits for queued work that may still read the old buffer (rare: sized at creation).
  void* Scratch(size_t bytes) { return Grow(scratch_, bytes, "op scratch"); }

  // bf16 mode: slot 0 or 1 of the operand copies as the gemm attention's bf16 scratch.
  uint16_t* Bf16Scratch(int slot, int64_t elems) { return operands_.Scratch(slot, elems, stream()); }

  // A producer op's bf16 copy of its output `out` (n values), written in the same pass:
  // where to write it, or null (not the bf16 mode, or reuse off). Call after MakeCurrent.
  uint16_t* ProduceBf16(const float* out, int64_t n) {
    if (precision_ != CudaGemmPrecision::kBf16 || !reuse_bf16_ || out == nullptr || n <= 0) return nullptr;
    return operands_.Produce(out, n, stream());
  }

  // `buf` with at least `bytes`: grown to max(bytes, 2x) after waiting for the queued work
  // that may still read the old buffer. Steady state allocates nothing.
  void* Grow(CudaBuffer& buf, size_t bytes, const char* what) {
    if (bytes > buf.bytes()) {
      L2L_CUDA_CHECK(cudaStreamSynchronize(stream()));
      const size_t grown = std::max(bytes, 2 * buf.bytes());
      spdlog::info("{}: growing {} to {:.1f} MiB", name_, what,
                   static_cast<double>(grown) / (1 << 20));
      buf = CudaBuffer();
      auto created = CudaBuffer::Create(grown);
      L2L_CHECK(created.ok()) << name_ << " " << what << ": " << created.status().ToString();
      buf = std::move(created).value();
    }
    return buf.data();
  }

  // The bf16 copy of the stored (rows, cols) matrix `src` with leading dimension ld:
  // elements [0, (rows-1)*ld + cols), so element i of src is element i of the copy. Read
  // from a noted layer copy (NoteBf16Copy: a layer published as bf16) at the same offset
  // when that address keeps the 16-byte alignment cuBLASLt's bf16 kernels want, else from
  // the operand copies (bf16_operands.h: a fresh copy, or a cast into a slot other than
  // `avoid`; *slot: the slot read, -1 for none).
  const uint16_t* StageBf16(const float* src, int64_t rows, int64_t cols, int64_t ld, int avoid, int* slot) {
    *slot = -1;
    const int64_t n = (rows > 0 && cols > 0 && ld >= cols) ? (rows - 1) * ld + cols : 0;
    const uint16_t* bits = bf16_copies_.Find(src, n);
    if (bits != nullptr && reinterpret_cast<uintptr_t>(bits) % 16 == 0) {
      gemm_stats_.reused_elements += n;
      return bits;
    }
    return operands_.Operand(src, n, avoid, slot, stream(), &gemm_stats_);
  }

  int device_ = 0;
  std::string name_;
  CudaGemmPrecision precision_ = CudaGemmPrecision::kFp32;
  cublasComputeType_t compute_ = CUBLAS_COMPUTE_32F;
  AttentionGemmMode attention_mode_;
  CudaAttentionKind attention_ = CudaAttentionKind::kFlash;
  CudaStream stream_;
  LtGemm gemm_;
  CudaBuffer scratch_;
  Bf16Operands operands_;  // bf16 mode's operand copies (empty until first used)
  bool reuse_bf16_ = true;  // CudaBackendOptions::reuse_bf16_operands
  bool hold_bf16_ = true;   // CudaBackendOptions::hold_bf16_copies
  Bf16Copies bf16_copies_;  // NoteBf16Copy's, until forgotten (a few: the layer slots)
  Bf16OperandStats gemm_stats_;  // StageBf16's counts (bf16_operand_stats)
  PinnedBuffer result_host_;  // 8 bytes for SumSquares' result
  std::unordered_map<void*, size_t> sizes_;  // live Alloc()ations
  size_t allocated_ = 0, peak_allocated_ = 0;
};

Result<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device,
                                                         const CudaBackendOptions& opt) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return FailedPrecondition("cuda:" + std::to_string(device) +
                              ": no usable CUDA driver or GPU (cudaGetDeviceCount: " +
                              cudaGetErrorString(e) + ")");
  }
  if (device < 0 || device >= count) {
    return NotFound("cuda:" + std::to_string(device) + ": no such GPU (" + std::to_string(count) +
                    " visible; check CUDA_VISIBLE_DEVICES)");
  }
  L2L_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaDeviceProp prop{};
  L2L_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));

  std::unique_ptr<CudaBackend> be(new CudaBackend());
  be->device_ = device;
  L2L_ASSIGN_OR_RETURN(const std::optional<CudaGemmPrecision> env,
                       EnvEnum(EnvVar::kCudaGemm, ParseCudaGemmPrecision));
  const CudaGemmPrecision precision = env.value_or(opt.gemm);
  be->precision_ = precision;
  bool reuse = opt.reuse_bf16_operands;
  if (const std::optional<std::string> t = EnvText(EnvVar::kCudaBf16Reuse)) {
    L2L_ASSIGN_OR_RETURN(reuse, ParseEnvBool(EnvInfo(EnvVar::kCudaBf16Reuse), *t));
  }
  be->reuse_bf16_ = reuse;
  be->hold_bf16_ = opt.hold_bf16_copies;
  be->operands_.set_reuse(reuse);
  L2L_ASSIGN_OR_RETURN(const std::optional<CudaAttentionKind> attention_env,
                       EnvEnum(EnvVar::kCudaAttention, ParseCudaAttentionKind));
  be->attention_ = attention_env.value_or(opt.attention);
  be->compute_ = precision == CudaGemmPrecision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                       : CUBLAS_COMPUTE_32F;
  be->attention_mode_.compute = be->compute_;
  if (precision == CudaGemmPrecision::kBf16) {
    CudaBackend* raw = be.get();  // the mode lives in *be and dies with it
    be->attention_mode_.bf16_scratch = [raw](int slot, int64_t elems) {
      return raw->Bf16Scratch(slot, elems);
    };
  }
  be->name_ = "cuda:" + std::to_string(device) + " (" + prop.name + ", sm_" +
              std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
              std::to_string(prop.totalGlobalMem >> 30) + " GiB, gemm " + ToString(precision) +
              (precision == CudaGemmPrecision::kBf16 && !reuse ? " (operand reuse off)" : "") + ", attention " +
              ToString(be->attention_) + ")";
  L2L_ASSIGN_OR_RETURN(be->stream_, CudaStream::Create());
  L2L_ASSIGN_OR_RETURN(be->gemm_, LtGemm::Create(opt.gemm_workspace_bytes));
  L2L_ASSIGN_OR_RETURN(be->scratch_, CudaBuffer::Create(std::max<size_t>(opt.scratch_bytes, 4096)));
  L2L_ASSIGN_OR_RETURN(be->result_host_, PinnedBuffer::Create(sizeof(double)));
  return be;
}

// The backend behind a Backend&, or nullptr when it is not ours.
CudaBackend* AsCuda(Backend& backend) {
  if (backend.kind() != DeviceKind::kCuda) return nullptr;
  return dynamic_cast<CudaBackend*>(&backend);
}

Status NotCuda(const Backend& backend, const char* what) {
  return InvalidArgument(std::string(what) + " needs a CUDA backend, got " + backend.name());
}

}  // namespace
}  // namespace cuda

int CudaBackendDevice(Backend& backend) {
  cuda::CudaBackend* be = cuda::AsCuda(backend);
  return be == nullptr ? -1 : be->device();
}

constexpr std::pair<CudaGemmPrecision, const char*> kCudaGemmNames[] = {
    {CudaGemmPrecision::kFp32, "fp32"}, {CudaGemmPrecision::kTf32, "tf32"}, {CudaGemmPrecision::kBf16, "bf16"}};
const char* ToString(CudaGemmPrecision p) { return NameOf(kCudaGemmNames, p); }
Result<CudaGemmPrecision> ParseCudaGemmPrecision(std::string_view s) { return ParseName(kCudaGemmNames, s); }
constexpr std::pair<CudaAttentionKind, const char*> kCudaAttentionNames[] = {
    {CudaAttentionKind::kFlash, "flash"}, {CudaAttentionKind::kGemm, "gemm"}};
const char* ToString(CudaAttentionKind k) { return NameOf(kCudaAttentionNames, k); }
Result<CudaAttentionKind> ParseCudaAttentionKind(std::string_view s) { return ParseName(kCudaAttentionNames, s); }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  return CreateCudaBackend(device, CudaBackendOptions{});
}

Result<std::unique_ptr<Backend>> CreateCudaBackend(int device, const CudaBackendOptions& options) {
  auto be = cuda::CudaBackend::Create(device, options);
  if (!be.ok()) return be.status();
  return std::unique_ptr<Backend>(std::move(be).value());
}

Status CastF32ToBf16(Backend& backend, uint16_t* dst, const float* src, int64_t n) {
  cuda::CudaBackend* be = cuda::AsCuda(backend);
  if (be == nullptr) return cuda::NotCuda(backend, "CastF32ToBf16");
  be->MakeCurrent();
  cuda::LaunchCastF32ToBf16(dst, src, n, be->stream());
  return Status::Ok();
}

Status CastBf16ToF32(Backend& backend, float* dst, const uint16_t* src, int64_t n) {
  cuda::CudaBackend* be = cuda::AsCuda(backend);
  if (be == nullptr) return cuda::NotCuda(backend, "CastBf16ToF32");
  be->MakeCurrent();
  cuda::LaunchCastBf16ToF32(dst, src, n, be->stream());
  return Status::Ok();
}

Result<CudaMemoryStats> GetCudaMemoryStats(Backend& backend) {
  cuda::CudaBackend* be = cuda::AsCuda(backend);
  if (be == nullptr) return cuda::NotCuda(backend, "GetCudaMemoryStats");
  be->MakeCurrent();
  return be->MemoryStats();
}

Status ResetCudaPeakMemory(Backend& backend) {
  cuda::CudaBackend* be = cuda::AsCuda(backend);
  if (be == nullptr) return cuda::NotCuda(backend, "ResetCudaPeakMemory");
  be->ResetPeak();
  return Status::Ok();
}

Status GemmBf16(Backend& backend, const Bf16GemmArgs& g) {
  cuda::CudaBackend* be = cuda::AsCuda(backend);
  if (be == nullptr) return cuda::NotCuda(backend, "GemmBf16");
  const bool gelu = g.epilogue == GemmEpilogue::kGelu || g.epilogue == GemmEpilogue::kBiasGelu;
  if (gelu && g.beta != 0.0f) {
    return InvalidArgument("GemmBf16: a GELU epilogue needs beta == 0 (got " +
                           std::to_string(g.beta) + ")");
  }
  const bool bias = g.epilogue == GemmEpilogue::kBias || g.epilogue == GemmEpilogue::kBiasGelu;
  if (bias && g.bias == nullptr) return InvalidArgument("GemmBf16: bias epilogue without bias");
  cuda::LtGemmArgs a{.trans_a = g.trans_a, .trans_b = g.trans_b, .M = g.M, .N = g.N, .K = g.K,
                     .alpha = g.alpha, .beta = g.beta, .A = g.A, .lda = g.lda, .B = g.B, .ldb = g.ldb,
                     .C = g.C, .ldc = g.ldc, .ab_type = CUDA_R_16BF,
                     .c_type = g.c_bf16 ? CUDA_R_16BF : CUDA_R_32F, .compute = CUBLAS_COMPUTE_32F};
  switch (g.epilogue) {
    case GemmEpilogue::kNone: a.epilogue = CUBLASLT_EPILOGUE_DEFAULT; break;
    case GemmEpilogue::kBias: a.epilogue = CUBLASLT_EPILOGUE_BIAS; break;
    case GemmEpilogue::kGelu: a.epilogue = CUBLASLT_EPILOGUE_GELU; break;
    case GemmEpilogue::kBiasGelu: a.epilogue = CUBLASLT_EPILOGUE_GELU_BIAS; break;
  }
  a.bias = bias ? g.bias : nullptr;
  be->MakeCurrent();
  return be->gemm().Run(a, be->stream()).WithContext("GemmBf16 on " + be->name());
}

}  // namespace l2l::kernels
