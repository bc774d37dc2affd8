// Backend: every piece of compute l2l does, behind one interface, so the relay and the
// reference trainer run unchanged on the CPU (cpu/, the reference: oneDNN + TBB) or a
// GPU (cuda/, cuBLASLt + our kernels). Modelled on ggml's backend interface.
//
// Contracts shared by every op:
//  * All pointers are "device" pointers of this backend (host memory for the CPU
//    backend): get them from Alloc() and move bytes with CopyToDevice/CopyToHost.
//  * Tensors are fp32, row-major, contiguous; token ids are int32. Shapes are in the
//    comments: B batch, T time, C channels, NH heads, hs = C/NH, V vocab, N = B*T rows.
//  * Ops run in order on the backend's compute stream; CopyToHost and Synchronize()
//    wait for earlier work. Ops do not allocate.
//  * Backward ops ACCUMULATE (+=) into every gradient output, so residual branches and
//    micro-batches sum for free; callers zero gradients when they start a new sum.
//    Exceptions are named in the op's comment.
//  * Forward ops overwrite their outputs.
//
// Optional asynchronous transfers (below the ops): a backend whose copy engines work apart
// from its compute units (CUDA) hands out CopyQueues (one more in-order queue each: a CUDA
// stream) and Events that order the queues against the compute stream without host waits,
// plus page-locked host memory. The CPU backend has none of these (its "device" memory IS
// host memory, the worker reads and writes it in place): CreateCopyQueue/CreateEvent/
// PinHostRange return UNIMPLEMENTED there and callers keep their synchronous path, so the
// CPU path is unchanged.
//
// Thread-safety: a Backend is used by one thread at a time (its "compute thread"). A
// CopyQueue is used by one thread at a time, which may be another thread; an Event may be
// recorded, waited for and queried from any thread (callers order Record before the
// waits they mean, e.g. with a mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/adamw.h"
#include "common/dtype.h"
#include "common/quant_blocks.h"
#include "common/status.h"

namespace l2l::kernels {

enum class DeviceKind { kCpu, kCuda };

// A target id meaning "no target here": the cross-entropy ops give it loss 0 and gradient 0.
inline constexpr int32_t kIgnoreTarget = -1;

// A point in one queue's work (a CUDA event). Recording it on a queue (CopyQueue::Record,
// Backend::RecordEvent) marks everything queued there so far; waiting on it waits for the
// work of its LATEST record at the time of the wait. Never recorded: already complete.
class Event {
 public:
  virtual ~Event() = default;
  // Blocks the calling thread until the work of the latest record is done. Fails (never
  // aborts) when the device reported an error for that work.
  virtual Status Wait() = 0;
};

// An in-order queue of copies beside the compute stream (a second CUDA stream).
// Asynchronous: each call queues work and returns; sources must stay valid and unchanged,
// destinations unread, until an Event recorded after the copy is complete. Host memory
// should be page-locked (AllocHost, or PinHostRange) so the copy is a DMA the queue runs
// on its own; pageable host memory works but the driver stages it (slower, may block).
class CopyQueue {
 public:
  virtual ~CopyQueue() = default;  // waits for the queue's work
  virtual void CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  // dst (n) fp32 = exact widening of src (n) of `dtype` (f32: a copy; bf16), both device
  // memory of this backend. UNIMPLEMENTED for a dtype the backend cannot widen.
  virtual Status WidenToF32(float* dst, const void* src, DType dtype, int64_t n) = 0;
  // dst (n) fp32 = the blocks (QuantizedBytes(format, n) bytes) dequantized, as
  // Backend::DequantizeBlocks, both device memory of this backend, on this queue.
  virtual Status DequantizeBlocks(float* dst, const void* blocks, QuantFormat format, int64_t n) = 0;
  virtual void Record(Event* e) = 0;
  // Work queued on this queue after this call starts after `e`'s latest record is done
  // (no host wait).
  virtual void WaitFor(Event* e) = 0;
};

// One rank of a group of devices in one process (a communicator: NCCL on CUDA). The
// collectives are queued on a CopyQueue of this rank's backend, ordered against other
// queues by events like any of its copies, and operate IN PLACE on a buffer of
// size() * count elements: rank r's part is elements [r * count, (r + 1) * count).
// Every rank must issue the same collectives in the same order on its communicator (a
// communicator is one ordered channel; use one per issuing thread).
// Thread-safety: one thread at a time per DeviceCollective.
class DeviceCollective {
 public:
  virtual ~DeviceCollective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank's part of buf is copied to every rank (dtype f32 or bf16).
  virtual Status AllGather(void* buf, size_t count, DType dtype, CopyQueue* queue) = 0;
  // Part rank() of buf becomes the sum over ranks of their part rank() (fp32); the other
  // parts keep what they held.
  virtual Status ReduceScatterSum(float* buf, size_t count, CopyQueue* queue) = 0;
  // From any thread, while collectives may be in flight: ends the communicator for every
  // rank; collectives waiting for a peer fail (their queue reports an error) instead of
  // waiting forever. The group is unusable afterwards.
  virtual void Abort() = 0;
};

// Host memory owned through a release function (page-locked on a GPU backend). Move-only.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(void* p, size_t bytes, void (*release)(void*)) : p_(p), bytes_(bytes), release_(release) {}
  ~HostBuffer() { Reset(); }
  HostBuffer(HostBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_), release_(o.release_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      p_ = o.p_;
      bytes_ = o.bytes_;
      release_ = o.release_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  void* data() const { return p_; }
  float* f32() const { return static_cast<float*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (p_ != nullptr && release_ != nullptr) release_(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  void* p_ = nullptr;
  size_t bytes_ = 0;
  void (*release_)(void*) = nullptr;
};

// A page-locked range of memory someone else owns (cudaHostRegister); destroying it
// unlocks the range. It must be destroyed before the memory is unmapped or freed.
class HostPin {
 public:
  virtual ~HostPin() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu (oneDNN, 2 threads)", "cuda:0 (H100)"

  // ---- memory ------------------------------------------------------------------
  // 64-byte aligned, uninitialised. Fails with RESOURCE_EXHAUSTED naming the size.
  virtual Result<void*> Alloc(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual void CopyToDevice(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void CopyDeviceToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void Zero(void* dst, size_t bytes) = 0;
  virtual void Synchronize() = 0;

  // ---- dense algebra -------------------------------------------------------------
  // C (M,N) = alpha * op(A) @ op(B) + beta * C, row-major, fp32 in and out.
  // op(A) is (M,K): A is (M,K) with lda >= K, or (K,M) when trans_a.
  // op(B) is (K,N): B is (K,N) with ldb >= N, or (N,K) when trans_b.
  virtual void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                    int64_t ldc) = 0;
  // out (N,OC) += bias (OC) broadcast over rows.
  virtual void AddBias(float* out, const float* bias, int64_t N, int64_t OC) = 0;
  // dbias (OC) += column sums of dout (N,OC).
  virtual void BiasBackward(float* dbias, const float* dout, int64_t N, int64_t OC) = 0;
  // A linear layer with its epilogue: y (N,OC) = x (N,IC) @ W + bias, W (IC,OC) row-major
  // or, when trans_w, (OC,IC) (y = x W^T); bias (OC) may be null. Then, at most one of:
  // act (N,OC) = gelu_tanh(y) when act is not null (y keeps the pre-activation), or
  // y += residual (N,OC) when residual is not null. y must not alias x, W, act or
  // residual. Results equal Gemm, AddBias, GeluForward / Add in that order (bit for bit
  // on the CPU); the default runs exactly those, a backend may fuse them.
  virtual void LinearForward(float* y, const float* x, const float* w, bool trans_w,
                             const float* bias, int64_t N, int64_t IC, int64_t OC, float* act,
                             const float* residual);

  // ---- bf16 layer boundaries (train.stash_dtype bf16, worker/stash.h) --------------
  // x (n) rounded in place to bf16 values (round to nearest even, exactly common/dtype.h's
  // FloatToBf16), and those values' bf16 bits written to bits (n) unless bits is null.
  virtual void RoundToBf16(float* x, uint16_t* bits, int64_t n) = 0;
  // dst (n) = the exact fp32 widening of the bf16 bits src (n).
  virtual void WidenBf16(float* dst, const uint16_t* src, int64_t n) = 0;

  // ---- bf16 copies of fp32 operands (a backend whose GEMMs cast operands to bf16) ----
  // Notes that `bits` (n bf16 values, this backend's memory) are exactly the bf16 values
  // of the fp32 tensor `f32` (n; f32 is their widening: a layer published as bf16), and
  // that both stay unchanged until ForgetBf16Copy(f32). A bf16-mode GEMM whose operand
  // lies inside f32 then reads it from bits instead of casting it again (the same values:
  // the same results, one cast pass fewer). Noting f32 again replaces its copy. The
  // default keeps nothing (fp32 GEMMs). The CPU backend's bf16 mode reads an operand
  // from a copy only where it is the B of a product stored dense row-major (a weight not
  // transposed: GPT-2's forward); its packing transposes the others anyway.
  // TakesBf16Copies: whether noting does anything here (callers skip keeping copies).
  virtual bool TakesBf16Copies() const { return false; }
  virtual void NoteBf16Copy(const float* f32, const uint16_t* bits, int64_t n) {
    (void)f32, (void)bits, (void)n;
  }
  virtual void ForgetBf16Copy(const float* f32) { (void)f32; }
  // Holds the bf16 copy of the activation f32 (n values) that a producer op writes beside
  // it (a backend whose producers write operand copies: CUDA's bf16 GEMM mode), so that
  // GEMMs read it later than the very next one: a block's weight-gradient GEMMs read the
  // forward's (recomputed) activations after the rest of the backward ran. The caller
  // promises that until ReleaseBf16Copy(f32) no op writes f32's n values but a producer
  // op writing exactly them (which refreshes the copy), Copy2D (which writes the bits of
  // what it copies into the copy too), a GEMM or a copy transfer (which the backend sees:
  // the copy is dropped). Breaking that promise would make GEMMs read
  // stale bits. The default holds nothing (kernels/layers/registry.h: HeldBf16Copies).
  virtual void HoldBf16Copy(const float* f32, int64_t n) { (void)f32, (void)n; }
  virtual void ReleaseBf16Copy(const float* f32) { (void)f32; }
  // Operand elements a bf16-mode backend's Gemm / LinearForward cast to bf16 (one pass
  // each) and read from an existing copy instead (a noted layer copy; on CUDA also a
  // fresh copy its producer op wrote or the GEMM before cast: kernels/cuda/bf16_operands.h),
  // since it was made (not the attention products). Zeros where GEMMs cast nothing (fp32
  // modes).
  struct Bf16OperandStats {
    int64_t cast_elements = 0;
    int64_t reused_elements = 0;
  };
  virtual Bf16OperandStats bf16_operand_stats() const { return {}; }

  // ---- elementwise ---------------------------------------------------------------
  // out = a + b (n). out may alias a or b.
  virtual void Add(float* out, const float* a, const float* b, int64_t n) = 0;
  // dst += alpha * src (n).
  virtual void Axpy(float* dst, const float* src, float alpha, int64_t n) = 0;
  // x *= alpha (n).
  virtual void Scale(float* x, float alpha, int64_t n) = 0;
  // GELU, tanh approximation (GPT-2): out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void GeluForward(float* out, const float* inp, int64_t n) = 0;
  // dinp += gelu'(inp) * dout.
  virtual void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;
  // The MLP's activation backward with its input layer's bias gradient, fused:
  // dinp (N,F) = gelu'(inp) * dout (overwritten, not accumulated); dbias (F) += column sums
  // of that dinp (skipped when dbias is null). The default runs Zero, GeluBackward and
  // BiasBackward; a backend may do it in one pass over memory.
  virtual void GeluBackwardBias(float* dinp, float* dbias, const float* inp, const float* dout,
                                int64_t N, int64_t F);
  // Sum of squares of x (n), computed in double, returned to the host (synchronises).
  virtual double SumSquares(const float* x, int64_t n) = 0;

  // ---- transformer ops -------------------------------------------------------------
  // out (B,T,C) = wte[tokens[b,t]] + wpe[t]. tokens (B,T) int32 in [0,V); wte (V,C), wpe (>=T,C).
  virtual void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                int64_t B, int64_t T, int64_t C) = 0;
  // dwte (V,C) += scatter of dout rows by token; dwpe (>=T,C) += sum over batch.
  // Deterministic: the same inputs give the same bits.
  virtual void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                 int64_t B, int64_t T, int64_t C) = 0;
  // out (N,C) = (inp - mean) * rstd * weight + bias; saves mean (N), rstd (N). eps = 1e-5.
  virtual void LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                                const float* weight, const float* bias, int64_t N, int64_t C) = 0;
  // dinp (N,C) +=, dweight (C) +=, dbias (C) += ; uses mean/rstd from the forward.
  virtual void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                                 const float* inp, const float* weight, const float* mean,
                                 const float* rstd, int64_t N, int64_t C) = 0;
  // LayerNormBackward with the residual stream's gradient folded in (a pre-LN block's
  // "dx = dresid; dx += norm backward" in one pass instead of a copy and the op):
  // dinp (N,C) = dresid + the gradient through the norm (OVERWRITTEN; dinp may alias
  // dresid, nothing else); dweight (C) +=, dbias (C) += as LayerNormBackward. The same
  // bits as CopyDeviceToDevice(dinp, dresid) then LayerNormBackward on every backend (the
  // default runs exactly those).
  virtual void LayerNormBackwardResidual(float* dinp, float* dweight, float* dbias,
                                         const float* dresid, const float* dout, const float* inp,
                                         const float* weight, const float* mean, const float* rstd,
                                         int64_t N, int64_t C);
  // Causal multi-head self-attention. qkv (B,T,3C) holds q|k|v per row, each split in NH
  // heads of hs. out (B,T,C) = softmax(q k^T / sqrt(hs), causal) v per head (heads
  // concatenated). att (B,NH,T,T floats) is this backend's stash for its backward: pass it
  // unchanged to the same backend's AttentionBackward, do not read it. The CPU backend and
  // the CUDA backend's fused kernel keep only each row's log-sum-exp, at
  // att[(b*NH + h)*T + t], and recompute the probabilities in the backward; the CUDA
  // GEMM path (L2L_CUDA_ATTENTION=gemm, or head sizes the fused kernel lacks) stores the
  // softmax probabilities (row t zero past t). Size it with CausalAttentionFloats. Softmax in fp32 with the max subtracted.
  virtual void AttentionForward(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                                int64_t C, int64_t NH) = 0;
  // Floats the causal attention ops (AttentionForward/Backward and the Gqa forms) need in
  // `att` and in `scratch` for (B, T, NH, head size hs): the layers allocate exactly these
  // (and keep `att` per layer when activations are kept), so a backend that stashes less
  // says so. Default: the full (B,NH,T,T) for both. The CPU backend: B*NH*T log-sum-exps,
  // no scratch. The CUDA backend: B*NH*T for both with its fused kernel (head sizes it
  // supports), else the default.
  virtual size_t CausalAttentionFloats(int64_t B, int64_t T, int64_t NH, int64_t hs) const {
    (void)hs;
    return static_cast<size_t>(B * NH) * static_cast<size_t>(T * T);
  }
  virtual size_t CausalAttentionScratchFloats(int64_t B, int64_t T, int64_t NH, int64_t hs) const {
    (void)hs;
    return static_cast<size_t>(B * NH) * static_cast<size_t>(T * T);
  }
  // dqkv (B,T,3C) += gradient through the attention, from dout (B,T,C) and the forward's
  // qkv and att. scratch: CausalAttentionScratchFloats floats the op may overwrite.
  virtual void AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                 const float* att, int64_t B, int64_t T, int64_t C, int64_t NH) = 0;
  // Fused softmax + cross-entropy. logits (N,V); targets (N) int32 in [0,V), or
  // kIgnoreTarget (-1): a position that is not trained on (a loss-masked prompt token);
  // its loss is 0 and its dlogits row 0.
  // probs (N,V) = softmax(logits) (overwritten; probs may alias logits, as
  // layers::HeadForwardBackward relies on); losses (N) = -log probs[target].
  virtual void CrossEntropyForward(float* losses, float* probs, const float* logits,
                                   const int32_t* targets, int64_t N, int64_t V) = 0;
  // dlogits (N,V) = scale * (probs - onehot(targets)); rows whose target is
  // kIgnoreTarget are 0. OVERWRITES dlogits (it may alias probs). scale is d(loss)/d(per-token loss), e.g. 1/(N * micro_batches).
  virtual void CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                                    float scale, int64_t N, int64_t V) = 0;
  // CrossEntropyForward, then CrossEntropyBackward with `scale`, in one op: losses (N) as
  // the forward; dlogits (N,V) = scale * (softmax(logits) - onehot(targets)), 0 rows for
  // kIgnoreTarget (the probabilities are not kept; dlogits may alias logits). The same
  // bits as the two ops (the default runs them); a backend may do it in one pass per row.
  virtual void CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits,
                                           const int32_t* targets, float scale, int64_t N, int64_t V);

  // ---- Llama-family ops ---------------------------------------------------------------
  // Not pure: backends that lack them inherit defaults (backend.cc) that abort naming the
  // op and the backend, so a backend builds before it implements them. Shapes add NKV
  // key/value heads (NH % NKV == 0), hs head size, F MLP width, and W = (NH + 2*NKV)*hs
  // the width of a packed q|k|v row.
  //
  // out (N,C) = wte[tokens[n]] (no position table). tokens (N) int32 in [0,V); wte (V,C).
  virtual void TokenEmbeddingForward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                                     int64_t C);
  // dwte (V,C) += scatter of dout (N,C) rows by token. Deterministic: the same inputs give
  // the same bits (rows sharing a token add in a fixed order).
  virtual void TokenEmbeddingBackward(float* dwte, const float* dout, const int32_t* tokens,
                                      int64_t N, int64_t C);
  // RMSNorm (no mean, no bias): rstd[n] = 1/sqrt(mean_c(inp[n,c]^2) + eps), out (N,C) =
  // inp * rstd * weight (C). Saves rstd (N) for the backward. The mean of squares is
  // accumulated in at least fp32 (the CPU uses double).
  virtual void RMSNormForward(float* out, float* rstd, const float* inp, const float* weight,
                              int64_t N, int64_t C, float eps);
  // With norm = inp * rstd (the forward's rstd):
  //   dinp (N,C) += rstd * (weight*dout - norm * mean_c(weight*dout*norm))
  //   dweight (C) += sum_n dout * norm   (deterministic: rows summed in a fixed order)
  virtual void RMSNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                               const float* weight, const float* rstd, int64_t N, int64_t C);
  // RMSNormBackward with the residual stream's gradient folded in, as
  // LayerNormBackwardResidual: dinp (N,C) = dresid + the gradient through the norm
  // (OVERWRITTEN; dinp may alias dresid, nothing else); dweight (C) += as RMSNormBackward.
  // The same bits as CopyDeviceToDevice(dinp, dresid) then RMSNormBackward (the default).
  virtual void RMSNormBackwardResidual(float* dinp, float* dweight, const float* dresid,
                                       const float* dout, const float* inp, const float* weight,
                                       const float* rstd, int64_t N, int64_t C);
  // Rotary position embedding, IN PLACE, Hugging Face's "rotate_half" convention. x holds
  // N = B*T rows, row n starting at x + n*row_stride, position t = n % T; each row has
  // n_heads heads of hs (even) contiguous floats from its start. For head element
  // i < hs/2, with c = cos[t, i], s = sin[t, i] (tables (>=T, hs/2), row t for position t):
  //   x'[i]        = x[i] * c - x[i + hs/2] * s
  //   x'[i + hs/2] = x[i + hs/2] * c + x[i] * s
  // Callers rotate q and k of a packed q|k|v row in one call (n_heads = NH + NKV,
  // row_stride = W).
  virtual void RopeForward(float* x, const float* cos, const float* sin, int64_t B, int64_t T,
                           int64_t row_stride, int64_t n_heads, int64_t hs);
  // The inverse (transposed) rotation, IN PLACE (an exception to "backward accumulates"):
  // turns the gradient w.r.t. the rotated x' into the gradient w.r.t. x. Same layout:
  //   dx[i]        = dx'[i] * c + dx'[i + hs/2] * s
  //   dx[i + hs/2] = dx'[i + hs/2] * c - dx'[i] * s
  virtual void RopeBackward(float* dx, const float* cos, const float* sin, int64_t B, int64_t T,
                            int64_t row_stride, int64_t n_heads, int64_t hs);
  // SwiGLU: gate_up (N,2F) holds gate | up per row; out (N,F) = silu(gate) * up with
  // silu(g) = g * sigmoid(g) = g / (1 + exp(-g)).
  virtual void SwiGLUForward(float* out, const float* gate_up, int64_t N, int64_t F);
  // dgate_up (N,2F) += [dout * up * silu'(gate) | dout * silu(gate)], with
  // silu'(g) = sigmoid(g) * (1 + g * (1 - sigmoid(g))).
  virtual void SwiGLUBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                              int64_t F);
  // SwiGLUBackward into a fresh gradient: dgate_up (N,2F) = [...] (OVERWRITTEN, not
  // accumulated), without the separate zeroing pass. Equal to Zero then SwiGLUBackward
  // (the default) value for value (0 + x == x; only a -0 may come out as +0 there).
  virtual void SwiGLUBackwardInto(float* dgate_up, const float* dout, const float* gate_up,
                                  int64_t N, int64_t F);
  // Causal grouped-query attention. qkv (B,T,W) holds per row q (NH heads of hs), then k
  // (NKV heads), then v (NKV heads). Query head h attends with key/value head
  // h / (NH/NKV) (Hugging Face's repeat_kv). out (B,T,NH*hs) = softmax(q k^T / sqrt(hs),
  // causal) v per head, heads concatenated; att (B,NH,T,T floats) the backend's stash for
  // the backward, as in AttentionForward. NKV == NH is ordinary multi-head attention with the same layout as
  // AttentionForward (C = NH*hs): the default delegates to it then and aborts otherwise.
  virtual void AttentionForwardGqa(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                                   int64_t NH, int64_t NKV, int64_t hs);
  // dqkv (B,T,W) += gradient through AttentionForwardGqa from dout (B,T,NH*hs) and the
  // forward's qkv and att; a key/value head's gradient sums over its NH/NKV query heads.
  // scratch: (B,NH,T,T) floats the op may overwrite. Default: as the forward's.
  virtual void AttentionBackwardGqa(float* dqkv, float* scratch, const float* dout,
                                    const float* qkv, const float* att, int64_t B, int64_t T,
                                    int64_t NH, int64_t NKV, int64_t hs);

  // The same with a sliding window (Mistral, Qwen2/3 sliding blocks, Gemma 3's local
  // blocks): query t sees keys j with t - window < j <= t (Hugging Face's
  // sliding-window mask). window <= 0 or >= T is the plain causal attention, and then
  // these delegate to the forms above (the same bits). Default: that delegation, and an
  // abort naming the op for a window < T.
  virtual void AttentionForwardGqaWindow(float* out, float* att, const float* qkv, int64_t B,
                                         int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                                         int64_t window);
  virtual void AttentionBackwardGqaWindow(float* dqkv, float* scratch, const float* dout,
                                          const float* qkv, const float* att, int64_t B,
                                          int64_t T, int64_t NH, int64_t NKV, int64_t hs,
                                          int64_t window);
  // GeGLU (Gemma): gate_up (N,2F) holds gate | up per row; out (N,F) = gelu_tanh(gate) * up,
  // gelu_tanh as GeluForward (PyTorch's gelu(approximate="tanh")).
  virtual void GegluForward(float* out, const float* gate_up, int64_t N, int64_t F);
  // dgate_up (N,2F) += [dout * up * gelu_tanh'(gate) | dout * gelu_tanh(gate)].
  virtual void GegluBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N,
                             int64_t F);
  // Strided 2-D copy: dst row r (cols floats at dst + r*dst_ld) = src row r (at src +
  // r*src_ld), r < rows; the regions must not overlap. Default: one CopyDeviceToDevice
  // per row.
  virtual void Copy2D(float* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t rows,
                      int64_t cols);
  // Inverted dropout with a counter-based mask (LoRA's adapter dropout,
  // kernels/layers/lora.h). For n < N, c < C and element index i = n*C + c:
  //   keep(i) = (SplitMix64(stream + i) >> 40) >= threshold   (common/rng.h SplitMix64,
  //             uint64 arithmetic mod 2^64: a 24-bit uniform draw against
  //             threshold = floor(p * 2^24), so P(keep) = 1 - threshold / 2^24)
  //   out[n*ldo + c] = keep(i) ? x[n*ldx + c] * scale : 0      (accumulate: += instead)
  // The mask is a pure function of (stream, i): every backend draws the same bits, and a
  // backward regenerates its forward's mask from the same stream. out and x must not
  // overlap. Default: aborts naming the op.
  virtual void CounterDropout(float* out, int64_t ldo, const float* x, int64_t ldx, int64_t N,
                              int64_t C, uint64_t stream, uint32_t threshold, float scale,
                              bool accumulate);

  // ---- BERT-family ops -------------------------------------------------------------------
  // Not pure, as the Llama-family ops: a backend that lacks them inherits defaults
  // (backend.cc) that abort naming the op and the backend.
  //
  // LayerNorm with a given epsilon: as LayerNormForward with eps in place of 1e-5
  // (BERT uses 1e-12). LayerNormBackward serves it unchanged (it reads the saved rstd).
  // Default: delegates to LayerNormForward when eps == 1e-5f, aborts otherwise.
  virtual void LayerNormForwardEps(float* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int64_t N, int64_t C,
                                   float eps);
  // GELU, exact (erf) form (BERT, torch's nn.GELU()): out = 0.5 x (1 + erf(x / sqrt(2))).
  virtual void GeluErfForward(float* out, const float* inp, int64_t n);
  // dinp += gelu'(inp) * dout with gelu'(x) = 0.5 (1 + erf(x/sqrt(2))) + x exp(-x^2/2)/sqrt(2 pi).
  virtual void GeluErfBackward(float* dinp, const float* inp, const float* dout, int64_t n);
  // out = tanh(inp) (n).
  virtual void TanhForward(float* out, const float* inp, int64_t n);
  // dinp += (1 - out^2) * dout, from the forward's OUTPUT out = tanh(inp).
  virtual void TanhBackward(float* dinp, const float* out, const float* dout, int64_t n);
  // Bidirectional (non-causal) multi-head self-attention with a key padding mask.
  // qkv (B,T,3C) as AttentionForward's. key_mask (B,T) int32: 1 = a real token, 0 =
  // padding; nullptr = every key is real. Query t of sequence b attends to every key j with
  // key_mask[b,j] != 0 (a padded key's score is -inf before the softmax); a sequence needs
  // at least one real key. out (B,T,C) = softmax(q k^T / sqrt(hs) + mask) v per head;
  // att: MaskedAttentionFloats floats, the backend's stash for the backward (default and
  // CPU: the (B,NH,T,T) probabilities, 0 at padded keys).
  virtual void AttentionForwardMasked(float* out, float* att, const float* qkv,
                                      const int32_t* key_mask, int64_t B, int64_t T, int64_t C,
                                      int64_t NH);
  // dqkv (B,T,3C) += gradient through AttentionForwardMasked from dout (B,T,C) and the
  // forward's qkv and att (the mask is in att's zeros). scratch:
  // MaskedAttentionScratchFloats floats the op may overwrite.
  virtual void AttentionBackwardMasked(float* dqkv, float* scratch, const float* dout,
                                       const float* qkv, const float* att, int64_t B, int64_t T,
                                       int64_t C, int64_t NH);
  // Floats AttentionForwardMasked / AttentionBackwardMasked need in `att` and `scratch`
  // (as CausalAttentionFloats). Default: (B,NH,T,T) each.
  virtual size_t MaskedAttentionFloats(int64_t B, int64_t T, int64_t NH, int64_t hs) const {
    (void)hs;
    return static_cast<size_t>(B * NH) * static_cast<size_t>(T * T);
  }
  virtual size_t MaskedAttentionScratchFloats(int64_t B, int64_t T, int64_t NH, int64_t hs) const {
    (void)hs;
    return static_cast<size_t>(B * NH) * static_cast<size_t>(T * T);
  }

  // ---- quantized weights (a LoRA job's frozen base; common/quant_blocks.h) ------------
  // out (n) fp32 = blocks dequantized: n / block_elems whole blocks of `format`
  // (QuantizedBytes(format, n) bytes), both device memory of this backend; bit-equal to
  // common/quant_blocks.h Dequantize on every backend. A run of whole blocks is
  // self-contained, so a caller may dequantize a whole layer (a scratch of the layer's
  // floats: 4 bytes per parameter beside its 0.5625 (NF4, Q4_0) or 1.0625 (Q8_0)) or only
  // the rows one GEMM tile reads (blocks + first_block * block_bytes, when a row's length
  // is a multiple of the block size) into a scratch of the tile's floats. An exception
  // to "ops do not fail": InvalidArgument when n is not whole blocks, UNIMPLEMENTED on a
  // backend without the op (the default).
  virtual Status DequantizeBlocks(float* out, const void* blocks, QuantFormat format, int64_t n);

  // ---- mixture-of-experts ops (kernels/layers/moe.cc) -----------------------------------
  // Not pure, as the Llama-family ops (defaults abort naming the op and the backend).
  // idx (n) int32 device row indices; scale (n) device floats or nullptr (all 1).
  //
  // dst (n,C) = scale[i] * src[idx[i]] (rows gathered, optionally scaled; dst is
  // overwritten and must not alias src).
  virtual void GatherRows(float* dst, const float* src, const int32_t* idx, const float* scale,
                          int64_t n, int64_t C);
  // dst[idx[i]] (C) += scale[i] * src[i] for i in [0, n), the product rounded to fp32 before
  // the sum (torch's index_add_ of src * scale). REQUIRES the idx distinct (so every dst row
  // gets at most one term per call: deterministic).
  virtual void ScatterAddRows(float* dst, const float* src, const int32_t* idx, const float* scale,
                              int64_t n, int64_t C);
  // out (n) = sum_c a[i,c] * b[i,c], accumulated in fp32 in column order (one row at a time).
  virtual void RowDot(float* out, const float* a, const float* b, int64_t n, int64_t C);

  // ---- asynchronous transfers (optional; see the header comment) ----------------------
  // True when CreateCopyQueue/CreateEvent work (and PinHostRange may).
  // One AdamW step over n device-resident floats, in place: bitwise common/adamw.h
  // AdamWStep(p, g, m, v, n, args) (the interleaved optimizer's device update: the
  // daemon's result, computed here).
  virtual void AdamW(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStepArgs& args);

  virtual bool HasAsyncTransfers() const { return false; }
  // A new copy queue (a stream of its own) / event. UNIMPLEMENTED: the backend has none.
  virtual Result<std::unique_ptr<CopyQueue>> CreateCopyQueue();
  virtual Result<std::unique_ptr<Event>> CreateEvent();
  // Records `e` on the compute stream / makes later compute ops wait for `e` (no host
  // wait). REQUIRES: `e` came from this backend's CreateEvent.
  virtual void RecordEvent(Event* e);
  virtual void WaitEvent(Event* e);
  // Host memory for asynchronous copies: page-locked on a GPU (cudaMallocHost), 64-byte
  // aligned heap memory on the CPU backend. RESOURCE_EXHAUSTED names the size.
  virtual Result<HostBuffer> AllocHost(size_t bytes);
  // Page-locks [p, p+bytes), memory the caller owns and keeps mapped longer than the pin
  // (an EPS shared-memory segment), so copies DMA straight out of / into it. read_only:
  // the range is mapped PROT_READ. UNIMPLEMENTED on the CPU backend (nothing to pin);
  // other failures say why (no support on this device, memlock limits, ...).
  virtual Result<std::unique_ptr<HostPin>> PinHostRange(void* p, size_t bytes, bool read_only);
};

// The CPU backend (always available; the reference). num_threads <= 0: all cores.
// This overload is always fp32 and ignores L2L_CPU_GEMM (tests use it as the fp32
// reference); CreateCpuBackend(options) and CreateBackend("cpu") read the variable.
std::unique_ptr<Backend> CreateCpuBackend(int num_threads = 0);

// How the CPU backend's matrix products (Gemm, LinearForward, the attention products)
// compute. kFp32: fp32 oneDNN matmuls (the default and the reference). kBf16: PyTorch
// bf16-autocast matmul numerics, as the CUDA backend's kBf16: both operands are cast to
// bf16 (round to nearest even) and oneDNN multiplies bf16 x bf16 with fp32 accumulation
// into fp32 outputs (C, alpha, beta and the fused epilogues as in fp32 mode; every
// other op stays fp32). Runs on oneDNN's AMX / AVX512_BF16 kernels; refused on CPUs
// without AVX512_BF16, where oneDNN would fall back to its slow reference kernels.
// Environment override (wins over the options): L2L_CPU_GEMM=fp32|bf16 (common/env.h).
enum class CpuGemmPrecision { kFp32, kBf16 };
const char* ToString(CpuGemmPrecision p);                            // "fp32" | "bf16"
Result<CpuGemmPrecision> ParseCpuGemmPrecision(std::string_view s);  // inverse of ToString
struct CpuBackendOptions {
  int num_threads = 0;  // <= 0: all cores
  CpuGemmPrecision gemm = CpuGemmPrecision::kFp32;
};
// INVALID_ARGUMENT names a bad L2L_CPU_GEMM; FAILED_PRECONDITION says why bf16 cannot
// run here (no AVX512_BF16 on this CPU, or L2L_CPU_ISA caps the ISA below it).
Result<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options);
// The precision CreateCpuBackend(options) would use for `requested`: L2L_CPU_GEMM applied,
// the same errors. For programs that check before they start work (l2l-worker refuses
// before it registers with the EPS).
Result<CpuGemmPrecision> ResolveCpuGemm(CpuGemmPrecision requested);
// Whether this CPU has AVX512_BF16 (AMX-BF16 CPUs all do) and L2L_CPU_ISA does not cap
// the ISA below it (L2L_CPU_ISA=avx512|avx2|base: a test hook for the refusal).
bool CpuHasBf16Gemm();
// One communicator per backend, rank i on backends[i]: CUDA backends on distinct devices
// (NCCL). Fails with a message when a backend is not CUDA, devices repeat, or this build
// has no NCCL (UNIMPLEMENTED).
Result<std::vector<std::unique_ptr<DeviceCollective>>> CreateDeviceCollectives(
    const std::vector<Backend*>& backends);


// "cpu" or "cuda:N". Fails with a message when the device is unknown, CUDA support was not
// built, or no such GPU is present.
Result<std::unique_ptr<Backend>> CreateBackend(const std::string& device);

// Owns one Alloc()ation of a backend. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> Create(Backend* backend, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  int32_t* i32() const { return static_cast<int32_t*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace l2l::kernels
