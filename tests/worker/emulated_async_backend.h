// EmulatedAsyncBackend: a test double that gives the CPU backend the optional
// asynchronous-transfer hooks of kernels/backend.h, so the worker's async path (the one
// the CUDA backend takes: copy queues, events, page-locked regions, zero-copy gradient
// slots) runs, and is checked, on a machine without a GPU.
//
//  * Compute ops forward to a real CpuBackend (they complete before returning, like a
//    stream that is always drained): RecordEvent marks the event complete at once;
//    WaitEvent blocks the compute thread until the event's work is done (a CUDA stream
//    would wait on the device instead; the ordering it enforces is the same).
//  * Each CopyQueue is a thread running its operations in order. Every copy first
//    POISONS its destination (NaN bytes), sleeps `copy_delay`, then writes the real
//    bytes: a consumer that reads a destination without waiting for the copy's event sees
//    garbage (the losses go NaN or differ), and a missing wait in the other direction
//    (overwriting a source still being copied) changes the copied bytes. With correct
//    ordering the results are bit-identical to the plain CPU backend's.
//    Limit: because compute is synchronous here, a copy queue's wait on a COMPUTE event
//    (a slot's "freed", a gradient's "ready", the stash's "written") is always already
//    satisfied, so forgetting one of those is not caught on the CPU; the waits in the
//    other direction (consumers of copies: compute waits, host waits before releasing
//    EPS memory or publishing a gradient slot) are. tests/gpu covers the rest on a GPU.
//    (Checked by mutation: removing the stash's load wait or its output-reuse wait, the
//    prefetcher's copy wait or the pusher's copy wait makes the relay tests fail.)
//  * PinHostRange succeeds (records the range; destroying the pin records the unpin) or,
//    with fail_pins, fails like a device that cannot page-lock, to exercise the bounce
//    buffers.
//
// Test-only. Thread-safety: as kernels/backend.h (events are mutex-protected; each
// queue's operations run on its own thread).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "common/quant_blocks.h"
#include "kernels/backend.h"
#include "kernels/bf16_copies.h"

namespace l2l::testing {

// A CUDA-like event: Record bumps `recorded` when queued; the work completes it later.
class EmuEvent final : public kernels::Event {
 public:
  // Queues a record: returns the generation the queue must complete.
  uint64_t Recorded() {
    std::lock_guard<std::mutex> lk(mu_);
    return ++recorded_;
  }
  void Complete(uint64_t gen) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      completed_ = std::max(completed_, gen);
    }
    cv_.notify_all();
  }
  // The generation a wait issued now must see complete.
  uint64_t Target() {
    std::lock_guard<std::mutex> lk(mu_);
    return recorded_;
  }
  void WaitFor(uint64_t gen) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return completed_ >= gen; });
  }
  Status Wait() override {
    WaitFor(Target());
    return Status::Ok();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t recorded_ = 0, completed_ = 0;
};

inline EmuEvent* AsEmu(kernels::Event* e) {
  auto* x = dynamic_cast<EmuEvent*>(e);
  L2L_CHECK(x != nullptr) << "not an emulated event";
  return x;
}

struct EmuStats {
  std::mutex mu;
  int64_t copies_to_device = 0, copies_to_host = 0, widenings = 0, waits = 0;
  // NoteBf16Copy / ForgetBf16Copy calls, the copies noted now, Gemm operands that lay
  // inside a noted copy, and elements of those whose noted bits were not bf16(f32) at
  // the Gemm (a stale copy the CUDA backend would have multiplied).
  int64_t bf16_notes = 0, bf16_forgets = 0, bf16_live = 0, bf16_operand_hits = 0, bf16_stale_elements = 0;
  struct Pin {
    const void* p;
    size_t bytes;
    bool read_only;
    bool active;
  };
  std::vector<Pin> pins;
};

class EmuCopyQueue final : public kernels::CopyQueue {
 public:
  EmuCopyQueue(std::chrono::microseconds delay, std::shared_ptr<EmuStats> stats)
      : delay_(delay), stats_(std::move(stats)), thread_([this] { Loop(); }) {}
  ~EmuCopyQueue() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // runs what is queued first
  }
  void CopyToDevice(void* dst, const void* src, size_t bytes) override {
    Count(&EmuStats::copies_to_device);
    Push([=, this] { PoisonedCopy(dst, src, bytes); });
  }
  void CopyToHost(void* dst, const void* src, size_t bytes) override {
    Count(&EmuStats::copies_to_host);
    Push([=, this] { PoisonedCopy(dst, src, bytes); });
  }
  Status WidenToF32(float* dst, const void* src, DType dtype, int64_t n) override {
    Count(&EmuStats::widenings);
    Push([=, this] {
      std::memset(dst, 0xff, static_cast<size_t>(n) * sizeof(float));
      std::this_thread::sleep_for(delay_);
      ConvertToFloat(src, dtype, dst, static_cast<size_t>(n));
    });
    return Status::Ok();
  }
  Status DequantizeBlocks(float* dst, const void* blocks, QuantFormat format, int64_t n) override {
    L2L_RETURN_IF_ERROR(QuantizedBytes(format, n).status());
    Count(&EmuStats::widenings);
    Push([=, this] {
      std::memset(dst, 0xff, static_cast<size_t>(n) * sizeof(float));
      std::this_thread::sleep_for(delay_);
      Dequantize(format, static_cast<const uint8_t*>(blocks), n, dst).IgnoreError();
    });
    return Status::Ok();
  }
  void Record(kernels::Event* e) override {
    EmuEvent* ev = AsEmu(e);
    const uint64_t gen = ev->Recorded();
    Push([ev, gen] { ev->Complete(gen); });
  }
  void WaitFor(kernels::Event* e) override {
    Count(&EmuStats::waits);
    EmuEvent* ev = AsEmu(e);
    const uint64_t gen = ev->Target();
    Push([ev, gen] { ev->WaitFor(gen); });
  }

 private:
  void Count(int64_t EmuStats::*field) {
    std::lock_guard<std::mutex> lk(stats_->mu);
    ++((*stats_).*field);
  }
  void PoisonedCopy(void* dst, const void* src, size_t bytes) {
    std::memset(dst, 0xff, bytes);  // NaN as floats
    std::this_thread::sleep_for(delay_);
    std::memcpy(dst, src, bytes);
  }
  void Push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      ops_.push_back(std::move(op));
    }
    cv_.notify_all();
  }
  void Loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stop_ || !ops_.empty(); });
      if (ops_.empty()) return;
      std::function<void()> op = std::move(ops_.front());
      ops_.pop_front();
      lk.unlock();
      op();
      lk.lock();
    }
  }

  const std::chrono::microseconds delay_;
  std::shared_ptr<EmuStats> stats_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
  bool stop_ = false;
  std::thread thread_;  // last: started after the fields above
};

class EmuPin final : public kernels::HostPin {
 public:
  EmuPin(std::shared_ptr<EmuStats> stats, size_t index) : stats_(std::move(stats)), index_(index) {}
  ~EmuPin() override {
    std::lock_guard<std::mutex> lk(stats_->mu);
    stats_->pins[index_].active = false;
  }

 private:
  std::shared_ptr<EmuStats> stats_;
  size_t index_;
};

class EmulatedAsyncBackend final : public kernels::Backend {
 public:
  struct Options {
    std::chrono::microseconds copy_delay{200};
    bool fail_pins = false;  // PinHostRange fails (as on a device without support)
  };
  EmulatedAsyncBackend(int threads, Options o)
      : cpu_(kernels::CreateCpuBackend(threads)), opt_(o), stats_(std::make_shared<EmuStats>()) {}

  EmuStats& stats() { return *stats_; }

  kernels::DeviceKind kind() const override { return kernels::DeviceKind::kCpu; }
  std::string name() const override { return "emulated-async(" + cpu_->name() + ")"; }

  bool HasAsyncTransfers() const override { return true; }
  Result<std::unique_ptr<kernels::CopyQueue>> CreateCopyQueue() override {
    return std::unique_ptr<kernels::CopyQueue>(new EmuCopyQueue(opt_.copy_delay, stats_));
  }
  Result<std::unique_ptr<kernels::Event>> CreateEvent() override {
    return std::unique_ptr<kernels::Event>(new EmuEvent());
  }
  void RecordEvent(kernels::Event* e) override {
    EmuEvent* ev = AsEmu(e);
    ev->Complete(ev->Recorded());  // compute ops are done when they return
  }
  void WaitEvent(kernels::Event* e) override { AsEmu(e)->WaitFor(AsEmu(e)->Target()); }
  Result<std::unique_ptr<kernels::HostPin>> PinHostRange(void* p, size_t bytes, bool read_only) override {
    if (opt_.fail_pins) return Unimplemented("emulated device cannot page-lock host memory");
    std::lock_guard<std::mutex> lk(stats_->mu);
    stats_->pins.push_back(EmuStats::Pin{p, bytes, read_only, true});
    return std::unique_ptr<kernels::HostPin>(new EmuPin(stats_, stats_->pins.size() - 1));
  }

  // ---- everything else: the CPU backend -------------------------------------------------
  Result<void*> Alloc(size_t bytes) override { return cpu_->Alloc(bytes); }
  void Free(void* p) override { cpu_->Free(p); }
  void CopyToDevice(void* d, const void* s, size_t n) override { cpu_->CopyToDevice(d, s, n); }
  void CopyToHost(void* d, const void* s, size_t n) override { cpu_->CopyToHost(d, s, n); }
  void CopyDeviceToDevice(void* d, const void* s, size_t n) override { cpu_->CopyDeviceToDevice(d, s, n); }
  void Zero(void* d, size_t n) override { cpu_->Zero(d, n); }
  void Synchronize() override { cpu_->Synchronize(); }
  void Gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) override {
    CheckBf16Copy(A, ta ? K : M, ta ? M : K, lda);
    CheckBf16Copy(B, tb ? N : K, tb ? K : N, ldb);
    cpu_->Gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  void NoteBf16Copy(const float* f32, const uint16_t* bits, int64_t n) override {
    std::lock_guard<std::mutex> lk(stats_->mu);
    ++stats_->bf16_notes;
    bf16_copies_.Note(f32, bits, n);
    stats_->bf16_live = static_cast<int64_t>(bf16_copies_.size());
  }
  void ForgetBf16Copy(const float* f32) override {
    std::lock_guard<std::mutex> lk(stats_->mu);
    ++stats_->bf16_forgets;
    bf16_copies_.Forget(f32);
    stats_->bf16_live = static_cast<int64_t>(bf16_copies_.size());
  }
  void AddBias(float* o, const float* b, int64_t N, int64_t OC) override { cpu_->AddBias(o, b, N, OC); }
  void BiasBackward(float* db, const float* d, int64_t N, int64_t OC) override {
    cpu_->BiasBackward(db, d, N, OC);
  }
  void RoundToBf16(float* x, uint16_t* bits, int64_t n) override { cpu_->RoundToBf16(x, bits, n); }
  void WidenBf16(float* d, const uint16_t* s, int64_t n) override { cpu_->WidenBf16(d, s, n); }
  void Add(float* o, const float* a, const float* b, int64_t n) override { cpu_->Add(o, a, b, n); }
  void Axpy(float* d, const float* s, float a, int64_t n) override { cpu_->Axpy(d, s, a, n); }
  void Scale(float* x, float a, int64_t n) override { cpu_->Scale(x, a, n); }
  void GeluForward(float* o, const float* i, int64_t n) override { cpu_->GeluForward(o, i, n); }
  void GeluBackward(float* di, const float* i, const float* d, int64_t n) override {
    cpu_->GeluBackward(di, i, d, n);
  }
  double SumSquares(const float* x, int64_t n) override { return cpu_->SumSquares(x, n); }
  void EmbeddingForward(float* o, const int32_t* t, const float* wte, const float* wpe, int64_t B,
                        int64_t T, int64_t C) override {
    cpu_->EmbeddingForward(o, t, wte, wpe, B, T, C);
  }
  void EmbeddingBackward(float* dwte, float* dwpe, const float* d, const int32_t* t, int64_t B,
                         int64_t T, int64_t C) override {
    cpu_->EmbeddingBackward(dwte, dwpe, d, t, B, T, C);
  }
  void LayerNormForward(float* o, float* m, float* r, const float* i, const float* w, const float* b,
                        int64_t N, int64_t C) override {
    cpu_->LayerNormForward(o, m, r, i, w, b, N, C);
  }
  void LayerNormBackward(float* di, float* dw, float* db, const float* d, const float* i,
                         const float* w, const float* m, const float* r, int64_t N, int64_t C) override {
    cpu_->LayerNormBackward(di, dw, db, d, i, w, m, r, N, C);
  }
  void AttentionForward(float* o, float* att, const float* qkv, int64_t B, int64_t T, int64_t C,
                        int64_t NH) override {
    cpu_->AttentionForward(o, att, qkv, B, T, C, NH);
  }
  void AttentionBackward(float* dqkv, float* s, const float* d, const float* qkv, const float* att,
                         int64_t B, int64_t T, int64_t C, int64_t NH) override {
    cpu_->AttentionBackward(dqkv, s, d, qkv, att, B, T, C, NH);
  }
  void TokenEmbeddingForward(float* o, const int32_t* t, const float* wte, int64_t N, int64_t C) override {
    cpu_->TokenEmbeddingForward(o, t, wte, N, C);
  }
  void TokenEmbeddingBackward(float* dwte, const float* d, const int32_t* t, int64_t N, int64_t C) override {
    cpu_->TokenEmbeddingBackward(dwte, d, t, N, C);
  }
  void RMSNormForward(float* o, float* r, const float* i, const float* w, int64_t N, int64_t C, float eps) override {
    cpu_->RMSNormForward(o, r, i, w, N, C, eps);
  }
  void RMSNormBackward(float* di, float* dw, const float* d, const float* i, const float* w, const float* r,
                       int64_t N, int64_t C) override {
    cpu_->RMSNormBackward(di, dw, d, i, w, r, N, C);
  }
  void RopeForward(float* x, const float* c, const float* s, int64_t B, int64_t T, int64_t stride, int64_t nh,
                   int64_t hs) override {
    cpu_->RopeForward(x, c, s, B, T, stride, nh, hs);
  }
  void RopeBackward(float* dx, const float* c, const float* s, int64_t B, int64_t T, int64_t stride, int64_t nh,
                    int64_t hs) override {
    cpu_->RopeBackward(dx, c, s, B, T, stride, nh, hs);
  }
  void CounterDropout(float* o, int64_t ldo, const float* x, int64_t ldx, int64_t N, int64_t C, uint64_t stream,
                      uint32_t threshold, float scale, bool accumulate) override {
    cpu_->CounterDropout(o, ldo, x, ldx, N, C, stream, threshold, scale, accumulate);
  }
  void SwiGLUForward(float* o, const float* gu, int64_t N, int64_t F) override { cpu_->SwiGLUForward(o, gu, N, F); }
  void SwiGLUBackward(float* dgu, const float* d, const float* gu, int64_t N, int64_t F) override {
    cpu_->SwiGLUBackward(dgu, d, gu, N, F);
  }
  void AttentionForwardGqa(float* o, float* att, const float* qkv, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                           int64_t hs) override {
    cpu_->AttentionForwardGqa(o, att, qkv, B, T, NH, NKV, hs);
  }
  void AttentionBackwardGqa(float* dqkv, float* s, const float* d, const float* qkv, const float* att, int64_t B,
                            int64_t T, int64_t NH, int64_t NKV, int64_t hs) override {
    cpu_->AttentionBackwardGqa(dqkv, s, d, qkv, att, B, T, NH, NKV, hs);
  }
  void CrossEntropyForward(float* l, float* p, const float* lg, const int32_t* t, int64_t N,
                           int64_t V) override {
    cpu_->CrossEntropyForward(l, p, lg, t, N, V);
  }
  void CrossEntropyBackward(float* dl, const float* p, const int32_t* t, float s, int64_t N,
                            int64_t V) override {
    cpu_->CrossEntropyBackward(dl, p, t, s, N, V);
  }

 private:
  // A (rows, cols) operand with leading dimension ld inside a noted copy: its extent's
  // bits must be bf16(f32) now (what the CUDA backend's bf16 mode reads instead of a cast).
  void CheckBf16Copy(const float* src, int64_t rows, int64_t cols, int64_t ld) {
    if (rows <= 0 || cols <= 0 || ld < cols) return;
    const int64_t n = (rows - 1) * ld + cols;
    std::lock_guard<std::mutex> lk(stats_->mu);
    const uint16_t* bits = bf16_copies_.Find(src, n);
    if (bits == nullptr) return;
    ++stats_->bf16_operand_hits;
    for (int64_t i = 0; i < n; ++i) stats_->bf16_stale_elements += FloatToBf16(src[i]) != bits[i];
  }

  std::unique_ptr<kernels::Backend> cpu_;
  Options opt_;
  std::shared_ptr<EmuStats> stats_;
  kernels::Bf16Copies bf16_copies_;  // guarded by stats_->mu
};

}  // namespace l2l::testing
