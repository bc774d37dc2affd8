// SavedActivations (kernels/layers/layers.h): a block backward that takes the forward's
// kept intermediates gives bit-identical input and parameter gradients to the backward
// that recomputes them from the input, for every family; and the kept buffers travel
// with the (block, micro-batch) even when other blocks run through the same workspace
// in between. CPU backend, tiny models.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <vector>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::layers {
namespace {

using kernels::DeviceBuffer;

ModelSpec Spec(ModelFamily family) {
  ModelSpec s;
  s.family = family;
  s.vocab_size = 40;
  s.seq_len = 12;
  s.d_model = 16;
  s.n_layer = 2;
  s.n_head = 4;
  s.d_ff = 40;
  if (family == ModelFamily::kLlama) s.n_kv_heads = 2;
  return s;
}

std::vector<float> Host(kernels::Backend& be, const DeviceBuffer& b) {
  std::vector<float> v(b.bytes() / sizeof(float));
  be.CopyToHost(v.data(), b.data(), b.bytes());
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("Block backward from kept intermediates is bit-identical to the recomputing one",
          "[layers][saved]") {
  for (ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama, ModelFamily::kBert}) {
    const ModelSpec spec = Spec(family);
    INFO("family " << ToString(family));
    REQUIRE(spec.Validate().ok());
    REQUIRE(SavedActivations::Supported(spec));
    const int64_t B = 2, T = 10, N = B * T, C = spec.d_model;
    auto be = kernels::CreateCpuBackend(1);
    auto ws = LayerWorkspace::Create(be.get(), spec, B, T);
    REQUIRE(ws.ok());
    const std::vector<LayerLayout> layouts = BuildLayout(spec);
    std::mt19937 rng(7);
    // Two blocks, each with its own kept intermediates; x0 -> block 1 -> x1 -> block 2 -> x2.
    std::vector<DeviceBuffer> params;
    for (int l = 1; l <= 2; ++l) {
      std::vector<float> p(layouts[l].numel);
      InitLayerParams(spec, layouts[l], 11, p.data());
      params.push_back(DeviceBuffer::Create(be.get(), p.size() * sizeof(float)).value());
      be->CopyToDevice(params.back().data(), p.data(), p.size() * sizeof(float));
    }
    auto buf = [&](const std::vector<float>& v) {
      DeviceBuffer b = DeviceBuffer::Create(be.get(), v.size() * sizeof(float)).value();
      be->CopyToDevice(b.data(), v.data(), v.size() * sizeof(float));
      return b;
    };
    DeviceBuffer x0 = buf(kernels::testing::RandomVec(rng, N * C));
    DeviceBuffer x1 = buf(std::vector<float>(N * C)), x2 = buf(std::vector<float>(N * C));
    const std::vector<float> dout_h = kernels::testing::RandomVec(rng, N * C);

    std::vector<SavedActivations> saved;
    for (int k = 0; k < 2; ++k) {
      auto s = SavedActivations::Create(be.get(), spec, *ws);
      REQUIRE(s.ok());
      CHECK(s->bytes() == SavedActivations::Bytes(spec, *ws));
      CHECK(s->bytes() > 0);
      saved.push_back(std::move(s).value());
    }
    // Returns {din of block 1, dparams of blocks 1 and 2} after forward + backward.
    auto run = [&](bool keep) {
      BlockForward(*be, spec, layouts[1], params[0].f32(), x0.f32(), x1.f32(), B, T, *ws, {},
                   keep ? &saved[0] : nullptr);
      BlockForward(*be, spec, layouts[2], params[1].f32(), x1.f32(), x2.f32(), B, T, *ws, {},
                   keep ? &saved[1] : nullptr);
      if (keep) CHECK((saved[0].filled() && saved[1].filled()));
      DeviceBuffer d2 = buf(dout_h), d1 = buf(std::vector<float>(N * C)), d0 = buf(std::vector<float>(N * C));
      DeviceBuffer g2 = buf(std::vector<float>(layouts[2].numel, 0.5f));
      DeviceBuffer g1 = buf(std::vector<float>(layouts[1].numel, 0.5f));
      BlockBackward(*be, spec, layouts[2], params[1].f32(), x1.f32(), d2.f32(), d1.f32(), g2.f32(), B, T, *ws, {},
                    keep ? &saved[1] : nullptr);
      BlockBackward(*be, spec, layouts[1], params[0].f32(), x0.f32(), d1.f32(), d0.f32(), g1.f32(), B, T, *ws, {},
                    keep ? &saved[0] : nullptr);
      if (keep) CHECK((!saved[0].filled() && !saved[1].filled()));
      return std::vector<std::vector<float>>{Host(*be, d0), Host(*be, g1), Host(*be, g2), Host(*be, x2)};
    };
    const auto recomputed = run(false);
    const auto kept = run(true);
    const auto kept_again = run(true);  // the exchanged buffers are reusable step after step
    const char* what[] = {"din", "dparams block 1", "dparams block 2", "forward output"};
    for (int i = 0; i < 4; ++i) {
      INFO(what[i]);
      CHECK(SameBits(recomputed[i], kept[i]));
      CHECK(SameBits(recomputed[i], kept_again[i]));
    }
  }
}

}  // namespace
}  // namespace l2l::layers
