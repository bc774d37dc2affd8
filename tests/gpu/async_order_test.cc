// Ordering between the compute stream and the relay's copy queues (worker/prefetch.h, async
// mode), tested WITHOUT synchronising the compute stream: the relay synchronises once per
// layer today (worker/relay.cc), which hides a missing cross-stream wait from every
// end-to-end test; these drive LayerPrefetcher / GradientPusher directly so that each of
// the two waits is the only thing between a correct result and a race:
//  * prefetcher slot reuse: with 2 ring slots, layer 3 is copied into the slot layer 1
//    occupied as soon as layer 1 is Released. Compute work reading layer 1's slot is still
//    queued on the compute stream at Release; the copy must wait for it (the slot's "freed"
//    event). Oracle: the result computed on the host from layer 1's known values.
//  * gradient push: Submit is called right after queueing the compute work that writes the
//    gradient; the pusher's device-to-host copy must wait for it (the "gradient ready"
//    event). Oracle: the host's computation of the gradient.
// Each test sizes its compute work to the device: passes are doubled until they keep the
// compute stream busy for max(30 ms, 20 x one measured fetch / push latency), and the test
// checks that it got there, so a copy that did not wait starts long before the compute it
// should follow is done (else a missing wait could pass unnoticed).
// Under the CPU emulator (L2L_CUDA=EMU) a copy first fills its destination with 0xFF, so
// a copy overlapping a reader gives NaNs; on a real GPU the same race gives layer 3's
// values or a partial gradient. Label gpu: fails (never skips) without a GPU.
// Thread-safety: test-only; the fake client is called from the engines' threads (mutex).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/gpu/gpu_test_util.h"
#include "worker/eps_client.h"
#include "worker/prefetch.h"

namespace l2l::gpu_test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// An EpsClient that serves fixed fp32 layers from host vectors and records pushed gradients.
class FixedLayersClient : public worker::EpsClient {
 public:
  explicit FixedLayersClient(std::vector<std::vector<float>> layers) : layers_(std::move(layers)) {}
  const worker::WorkerRegistration& registration() const override { return reg_; }
  Result<worker::LayerWeights> AcquireLayer(int64_t layer, int64_t min_version,
                                            std::chrono::milliseconds) override {
    if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) {
      return InvalidArgument("no layer " + std::to_string(layer));
    }
    worker::LayerWeights w;
    w.data = layers_[static_cast<size_t>(layer)].data();
    w.dtype = DType::kF32;
    w.numel = layers_[static_cast<size_t>(layer)].size();
    w.version = min_version;
    return w;
  }
  void ReleaseLayer(int64_t) override {}
  Status PushGradient(int64_t layer, int64_t step, int64_t, const float* grad,
                      size_t numel) override {
    std::lock_guard<std::mutex> lk(mu_);
    pushed_[{layer, step}].assign(grad, grad + numel);
    return Status::Ok();
  }
  Status StepDone(const worker::StepReport&) override { return Status::Ok(); }
  std::vector<float> Pushed(int64_t layer, int64_t step) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pushed_.find({layer, step});
    return it == pushed_.end() ? std::vector<float>{} : it->second;
  }

 private:
  worker::WorkerRegistration reg_;
  const std::vector<std::vector<float>> layers_;
  std::mutex mu_;
  std::map<std::pair<int64_t, int64_t>, std::vector<float>> pushed_;
};

// Values exactly representable with every partial sum below (multiples of 1/4, small).
std::vector<float> LayerValues(int64_t layer, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(layer) + 0.25f * static_cast<float>(i % 13);
  return v;
}

constexpr size_t kN = size_t{1} << 18;  // floats per layer / gradient (1 MiB)
constexpr int kMaxPasses = 1 << 16;     // keeps every partial sum below exact in fp32

// The number of compute passes (`queue(passes)` queues them) that keep the compute stream
// busy for at least max(30 ms, 20 x copy_latency_s): doubled from 4 until they do, each
// try timed with a Synchronize (4-8 passes under the emulator; thousands expected on a GPU).
template <typename Queue>
int CalibratePasses(Backend* gpu, double copy_latency_s, Queue queue, double* busy_s) {
  const double target = std::max(0.030, 20 * copy_latency_s);
  for (int passes = 4;; passes *= 2) {
    gpu->Synchronize();
    const auto t0 = Clock::now();
    queue(passes);
    gpu->Synchronize();
    *busy_s = Since(t0);
    if (*busy_s >= target || passes >= kMaxPasses) return passes;
  }
}

TEST_CASE("async prefetcher: a slot is not refilled while queued compute still reads it",
          "[gpu][worker]") {
  Backends& b = Both();
  Backend* gpu = b.gpu.get();
  std::vector<std::vector<float>> layers;
  for (int64_t l = 0; l < 4; ++l) layers.push_back(LayerValues(l, l == 0 ? 1024 : kN));
  FixedLayersClient client(layers);
  auto pf = worker::LayerPrefetcher::Create(&client, gpu, {1024, kN, kN, kN}, /*ring_slots=*/2);
  INFO(pf.status().ToString());
  REQUIRE(pf.ok());
  REQUIRE((*pf)->mode() == worker::CopyMode::kAsync);
  auto out = DeviceBuffer::Create(gpu, kN * sizeof(float));
  REQUIRE(out.ok());
  const auto n = static_cast<int64_t>(kN);

  (*pf)->Begin({1, 2, 3}, 0, 10000ms);
  double fetch_s = 0;
  auto r1 = (*pf)->Next(&fetch_s);  // ~ one fetch's latency (the ring starts empty)
  INFO(r1.status().ToString());
  REQUIRE(r1.ok());
  REQUIRE(r1->layer == 1);
  auto queue = [&](int passes) {
    gpu->Zero(out->data(), kN * sizeof(float));
    for (int i = 0; i < passes; ++i) gpu->Axpy(out->f32(), r1->params, 1.0f, n);
  };
  double busy_s = 0;
  const int passes = CalibratePasses(gpu, fetch_s, queue, &busy_s);
  // Queue compute reading layer 1's slot, then hand the slot back at once: the prefetch
  // thread starts fetching layer 3 into it while these passes are still queued.
  queue(passes);
  const auto released = Clock::now();
  (*pf)->Release(*r1);
  auto r2 = (*pf)->Next(nullptr);
  auto r3 = (*pf)->Next(nullptr);  // layer 3, in layer 1's old slot
  REQUIRE(r2.ok());
  REQUIRE(r3.ok());
  CHECK(r3->slot == r1->slot);
  gpu->Synchronize();
  const double compute_after_release_s = Since(released);

  std::vector<float> want(kN), got(kN), got3(kN), got2(kN);
  for (size_t i = 0; i < kN; ++i) want[i] = static_cast<float>(passes) * layers[1][i];
  gpu->CopyToHost(got.data(), out->data(), kN * sizeof(float));
  gpu->CopyToHost(got2.data(), r2->params, kN * sizeof(float));
  gpu->CopyToHost(got3.data(), r3->params, kN * sizeof(float));
  ExpectClose(got, want, 0.0, 0.0, "sum of layer 1 over the compute passes queued before Release");
  ExpectClose(got2, layers[2], 0.0, 0.0, "layer 2 as fetched");
  ExpectClose(got3, layers[3], 0.0, 0.0, "layer 3 as fetched into the reused slot");
  (*pf)->Release(*r2);
  (*pf)->Release(*r3);
  // Sensitivity: the compute passes outlived the release by several fetch latencies, so
  // a copy that did not wait would have overwritten the slot while they read it.
  INFO("one fetch took " << fetch_s * 1e3 << " ms; " << passes << " compute passes took "
                         << busy_s * 1e3 << " ms calibrating, ran " << compute_after_release_s * 1e3
                         << " ms after Release");
  CHECK(busy_s > 10 * fetch_s);
}

TEST_CASE("async gradient pusher: the device-to-host copy waits for the compute writing the gradient",
          "[gpu][worker]") {
  Backends& b = Both();
  Backend* gpu = b.gpu.get();
  FixedLayersClient client({LayerValues(0, 16), LayerValues(1, 16)});
  auto pusher = worker::GradientPusher::Create(&client, gpu, kN);
  INFO(pusher.status().ToString());
  REQUIRE(pusher.ok());
  REQUIRE((*pusher)->mode() == worker::CopyMode::kAsync);
  const auto n = static_cast<int64_t>(kN);
  const std::vector<float> src_host = LayerValues(2, kN);
  auto src = DeviceBuffer::Create(gpu, kN * sizeof(float));
  auto grad = DeviceBuffer::Create(gpu, kN * sizeof(float));
  REQUIRE(src.ok());
  REQUIRE(grad.ok());
  gpu->CopyToDevice(src->data(), src_host.data(), kN * sizeof(float));
  gpu->Synchronize();

  // A warm-up push of a finished buffer: one push's latency when nothing has to wait.
  auto t0 = Clock::now();
  auto warm = (*pusher)->Submit(/*layer=*/1, /*step=*/0, 1, src->f32(), kN, nullptr);
  REQUIRE(warm.ok());
  REQUIRE((*pusher)->WaitAll(nullptr).ok());
  const double push_s = Since(t0);
  ExpectClose(client.Pushed(1, 0), src_host, 0.0, 0.0, "warm-up push of a finished buffer");

  auto queue = [&](int passes) {
    gpu->Zero(grad->data(), kN * sizeof(float));
    for (int i = 0; i < passes; ++i) gpu->Axpy(grad->f32(), src->f32(), 1.0f, n);
  };
  double busy_s = 0;
  const int passes = CalibratePasses(gpu, push_s, queue, &busy_s);
  // The gradient: stale bytes, then zeroed and accumulated over the passes, all queued;
  // Submit at once.
  gpu->CopyToDevice(grad->data(), LayerValues(7, kN).data(), kN * sizeof(float));
  gpu->Synchronize();
  queue(passes);
  const auto submitted = Clock::now();
  auto ticket = (*pusher)->Submit(/*layer=*/1, /*step=*/1, 2, grad->f32(), kN, nullptr);
  REQUIRE(ticket.ok());
  Status st = (*pusher)->WaitAll(nullptr);
  INFO(st.ToString());
  REQUIRE(st.ok());
  gpu->Synchronize();
  const double compute_after_submit_s = Since(submitted);

  std::vector<float> want(kN);
  for (size_t i = 0; i < kN; ++i) want[i] = static_cast<float>(passes) * src_host[i];
  ExpectClose(client.Pushed(1, 1), want, 0.0, 0.0,
              "pushed gradient (the passes queued before Submit, summed)");
  INFO("one push took " << push_s * 1e3 << " ms; " << passes << " compute passes took "
                        << busy_s * 1e3 << " ms calibrating, ran " << compute_after_submit_s * 1e3
                        << " ms after Submit");
  CHECK(busy_s > 10 * push_s);
}

}  // namespace
}  // namespace l2l::gpu_test
