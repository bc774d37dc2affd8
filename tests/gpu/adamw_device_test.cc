// The interleaved optimizer's device AdamW (kernels/cuda/adamw.cu through
// Backend::AdamW, and worker/device_updater.h's copy-in/update/copy-out on a CUDA
// backend) against the scalar reference common/adamw.h AdamWStep: bit for bit, over
// sizes that do not divide the block size, several steps t (bias correction), weight
// decay on and off, a grad_scale != 1, and gradients with large and tiny magnitudes.
// On the emulator build this runs as the emu label (scripts/emu_test.sh).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "common/adamw.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/device_updater.h"

namespace l2l::gpu_test {
namespace {

struct Inputs {
  std::vector<float> p, m, v, g;
};

Inputs MakeInputs(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Inputs in;
  for (size_t i = 0; i < n; ++i) {
    in.p.push_back(d(rng) * 0.1f);
    in.m.push_back(d(rng) * 1e-3f);
    in.v.push_back(std::abs(d(rng)) * 1e-6f);
    // Mixed magnitudes: rounding differences (an FMA) would show in some elements.
    in.g.push_back(d(rng) * (i % 3 == 0 ? 10.0f : i % 3 == 1 ? 1e-4f : 0.3f));
  }
  return in;
}

TEST_CASE("device AdamW is bitwise common/adamw.h AdamWStep", "[gpu][adamw][offload]") {
  Backends& b = Both();
  for (size_t n : {size_t{1}, size_t{255}, size_t{1000}, size_t{4099}}) {
    for (int64_t t : {int64_t{1}, int64_t{2}, int64_t{7}}) {
      for (float wd : {0.0f, 0.1f}) {
        CAPTURE(n, t, wd);
        Inputs ref = MakeInputs(n, static_cast<uint32_t>(n * 31 + t));
        Inputs dev = ref;
        const AdamWStepArgs args{.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wd,
                                 .t = t, .grad_scale = 1.0f / 6.0f};
        AdamWStep(ref.p.data(), ref.g.data(), ref.m.data(), ref.v.data(), n, args);
        auto mem = b.gpu->Alloc(4 * n * sizeof(float));
        REQUIRE(mem.ok());
        float* d = static_cast<float*>(*mem);
        b.gpu->CopyToDevice(d, dev.p.data(), n * 4);
        b.gpu->CopyToDevice(d + n, dev.m.data(), n * 4);
        b.gpu->CopyToDevice(d + 2 * n, dev.v.data(), n * 4);
        b.gpu->CopyToDevice(d + 3 * n, dev.g.data(), n * 4);
        b.gpu->AdamW(d, d + 3 * n, d + n, d + 2 * n, static_cast<int64_t>(n), args);
        b.gpu->CopyToHost(dev.p.data(), d, n * 4);
        b.gpu->CopyToHost(dev.m.data(), d + n, n * 4);
        b.gpu->CopyToHost(dev.v.data(), d + 2 * n, n * 4);
        b.gpu->Synchronize();
        b.gpu->Free(d);
        CHECK(std::memcmp(ref.p.data(), dev.p.data(), n * 4) == 0);
        CHECK(std::memcmp(ref.m.data(), dev.m.data(), n * 4) == 0);
        CHECK(std::memcmp(ref.v.data(), dev.v.data(), n * 4) == 0);
        // The CPU backend's AdamW (what a CPU-backend worker runs) too.
        Inputs cpu = MakeInputs(n, static_cast<uint32_t>(n * 31 + t));
        b.cpu->AdamW(cpu.p.data(), cpu.g.data(), cpu.m.data(), cpu.v.data(), static_cast<int64_t>(n), args);
        CHECK(std::memcmp(ref.p.data(), cpu.p.data(), n * 4) == 0);
        CHECK(std::memcmp(ref.v.data(), cpu.v.data(), n * 4) == 0);
      }
    }
  }
}

TEST_CASE("a worker's device update of an exchange segment is bitwise AdamWStep, ranges and decay included",
          "[gpu][adamw][offload]") {
  auto be = kernels::CreateCudaBackend(0);
  REQUIRE(be.ok());
  worker::DeviceUpdater u(std::move(be).value());
  const size_t n = 3001, cap = 4096;
  Inputs in = MakeInputs(n, 5);
  // The segment as the daemon lays it out: p, m, v, g at array_bytes strides.
  const size_t array_bytes = cap * sizeof(float);
  std::vector<char> seg(4 * array_bytes);
  std::memcpy(seg.data(), in.p.data(), n * 4);
  std::memcpy(seg.data() + array_bytes, in.m.data(), n * 4);
  std::memcpy(seg.data() + 2 * array_bytes, in.v.data(), n * 4);
  std::memcpy(seg.data() + 3 * array_bytes, in.g.data(), n * 4);
  worker::UpdateAssignment a;
  a.has_task = true;
  a.task_id = 1;
  a.numel = static_cast<int64_t>(n);
  a.p_offset = 0;
  a.m_offset = array_bytes;
  a.v_offset = 2 * array_bytes;
  a.g_offset = 3 * array_bytes;
  a.adamw = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-6f, .weight_decay = 0.05f, .t = 3,
             .grad_scale = 0.5f};
  a.ranges = {{0, 1000, true}, {1000, 1001, false}, {1001, 3001, true}};
  REQUIRE(u.Run(a, seg.data(), seg.size()).ok());
  Inputs ref = in;
  for (const auto& r : a.ranges) {
    AdamWStep(ref.p.data() + r.begin, ref.g.data() + r.begin, ref.m.data() + r.begin, ref.v.data() + r.begin,
              static_cast<size_t>(r.end - r.begin), WithDecay(a.adamw, r.decay));
  }
  CHECK(std::memcmp(seg.data(), ref.p.data(), n * 4) == 0);
  CHECK(std::memcmp(seg.data() + array_bytes, ref.m.data(), n * 4) == 0);
  CHECK(std::memcmp(seg.data() + 2 * array_bytes, ref.v.data(), n * 4) == 0);
  CHECK(std::memcmp(seg.data() + 3 * array_bytes, in.g.data(), n * 4) == 0);  // the gradient is read only

  // Bad assignments are refused before anything is touched.
  const std::vector<char> before = seg;
  worker::UpdateAssignment bad = a;
  bad.g_offset = seg.size() - 8;
  Status s = u.Run(bad, seg.data(), seg.size());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("g_offset"));
  bad = a;
  bad.ranges = {{0, 4000, true}};
  s = u.Run(bad, seg.data(), seg.size());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("range [0, 4000)"));
  CHECK(seg == before);

  // The rates it reports at Register.
  auto offer = worker::MeasureDeviceRates(u.backend(), 1 << 12);
  REQUIRE(offer.ok());
  CHECK(offer->takes_updates);
  CHECK(offer->update_params_per_s > 0);
  CHECK(offer->h2d_bytes_per_s > 0);
  CHECK(offer->d2h_bytes_per_s > 0);
}

}  // namespace
}  // namespace l2l::gpu_test
