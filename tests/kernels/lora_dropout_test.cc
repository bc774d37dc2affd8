// LoRA adapter dropout's mask (kernels/backend.h Backend::CounterDropout on the CPU
// backend, common/lora.h LoraDropoutStream): the kept fraction lies within binomial
// bounds of 1 - p, kept elements are scaled by 1/(1-p), the bits are common/rng.h's
// formula, every field of the key changes the mask, and a block call without dropout
// (p = 0, or a layout without adapters) is untouched by it. The CUDA backend's bits are
// checked against the CPU's in tests/gpu/lora_test.cc; the masks' effect on training
// against PEFT in tests/oracle/peft_oracle.py.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/lora.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"
#include "kernels/layers/lora.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::layers {
namespace {

using kernels::DeviceBuffer;
using kernels::testing::RandomVec;
using kernels::testing::Upload;

std::vector<float> Host(kernels::Backend& be, const DeviceBuffer& b) {
  std::vector<float> v(b.bytes() / sizeof(float));
  be.CopyToHost(v.data(), b.data(), b.bytes());
  return v;
}

TEST_CASE("CounterDropout keeps 1-p of the elements (binomial bounds), scaled by 1/(1-p), by the rng.h formula",
          "[kernels][lora]") {
  auto be = kernels::CreateCpuBackend(2);
  const double p = GENERATE(0.1, 0.5);
  CAPTURE(p);
  const int64_t N = 512, C = 2048, ldx = C + 3;  // 2^20 draws
  const uint64_t stream = LoraDropoutStream(1234, 7, 2, 5, "mlp.down_proj.weight");
  const uint32_t threshold = DropoutThreshold(p);
  CHECK(threshold == static_cast<uint32_t>(std::floor(p * 16777216.0)));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  std::mt19937 rng(3);
  const std::vector<float> x = RandomVec(rng, N * ldx, 0.5f, 1.5f);  // never 0
  DeviceBuffer dx = Upload(*be, x);
  DeviceBuffer dout = Upload(*be, std::vector<float>(N * C, -1.0f));
  be->CounterDropout(dout.f32(), C, dx.f32(), ldx, N, C, stream, threshold, scale, /*accumulate=*/false);
  const std::vector<float> out = Host(*be, dout);
  int64_t kept = 0, wrong = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const float v = out[n * C + c];
      const bool keep = v != 0.0f;
      kept += keep;
      wrong += keep != DropoutKeep(stream, static_cast<uint64_t>(n * C + c), threshold);
      wrong += keep && v != x[n * ldx + c] * scale;
    }
  }
  CHECK(wrong == 0);
  const double n = static_cast<double>(N * C);
  const double mean = n * (1.0 - p), sd = std::sqrt(n * p * (1.0 - p));
  INFO("kept " << kept << " of " << n << ", expected " << mean << " +- " << sd);
  CHECK(std::fabs(static_cast<double>(kept) - mean) <= 5.0 * sd);
}

TEST_CASE("LoraDropoutStream: seed, step, block, micro-batch and weight each change the mask", "[kernels][lora]") {
  const uint64_t base = LoraDropoutStream(1, 2, 3, 4, "self_attn.q_proj.weight");
  const std::vector<uint64_t> others = {
      LoraDropoutStream(9, 2, 3, 4, "self_attn.q_proj.weight"),
      LoraDropoutStream(1, 5, 3, 4, "self_attn.q_proj.weight"),
      LoraDropoutStream(1, 2, 0, 4, "self_attn.q_proj.weight"),
      LoraDropoutStream(1, 2, 3, 1, "self_attn.q_proj.weight"),
      LoraDropoutStream(1, 2, 3, 4, "self_attn.k_proj.weight")};
  CHECK(base == LoraDropoutStream(1, 2, 3, 4, "self_attn.q_proj.weight"));  // a pure function
  const uint32_t threshold = DropoutThreshold(0.5);
  for (size_t k = 0; k < others.size(); ++k) {
    CAPTURE(k);
    CHECK(others[k] != base);
    int64_t differ = 0;
    for (uint64_t i = 0; i < 4096; ++i) differ += DropoutKeep(base, i, threshold) != DropoutKeep(others[k], i, threshold);
    CHECK(differ > 1500);  // independent masks at p = 0.5 differ in about half
  }
}

ModelSpec LlamaSpec() {
  ModelSpec s;
  s.family = ModelFamily::kLlama;
  s.vocab_size = 40;
  s.seq_len = 12;
  s.d_model = 16;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_heads = 2;
  s.d_ff = 40;
  return s;
}

// out of one block forward on `params` (the block's flat buffer) for `seq`.
std::vector<float> Forward(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& block,
                           const std::vector<float>& params, const std::vector<float>& in, const SequenceInputs& seq,
                           double dropout, LoraDropout* after) {
  const int64_t B = 2, T = 6;
  auto ws = LayerWorkspace::Create(&be, spec, B, T);
  REQUIRE(ws.ok());
  REQUIRE(ReserveLoraScratch(&be, {block}, &*ws, dropout).ok());
  CHECK((ws->lora_x.bytes() > 0) == (dropout > 0 && block.lora_r > 0));
  DeviceBuffer p = Upload(be, params), x = Upload(be, in), out = Upload(be, std::vector<float>(in.size()));
  BlockForward(be, spec, block, p.f32(), x.f32(), out.f32(), B, T, *ws, seq);
  *after = ws->lora_dropout;
  return Host(be, out);
}

TEST_CASE("LoRA dropout changes a block's output only where it applies", "[kernels][lora]") {
  auto be = kernels::CreateCpuBackend(1);
  const ModelSpec spec = LlamaSpec();
  LoraConfig lora;
  lora.enabled = true;
  lora.r = 3;
  lora.dropout = 0.2;
  REQUIRE(ValidateLora(spec, lora).ok());
  const LayerLayout base = BuildLayout(spec)[1], with = BuildLoraLayout(spec, lora)[1];
  std::mt19937 rng(8);
  const std::vector<float> in = RandomVec(rng, 2 * 6 * spec.d_model);
  std::vector<float> pb(base.numel);
  InitLayerParams(spec, base, 3, pb.data());
  std::vector<float> pl = pb;
  for (size_t i = pb.size(); i < with.numel; ++i) pl.push_back(std::uniform_real_distribution<float>(-0.3f, 0.3f)(rng));
  SequenceInputs none, train;
  train.lora_dropout = {0.2, 5, 1, 0};
  LoraDropout after;
  // Full-parameter training: the key is ignored, bit for bit, and no scratch exists.
  CHECK(Forward(*be, spec, base, pb, in, train, 0.2, &after) == Forward(*be, spec, base, pb, in, none, 0.0, &after));
  // LoRA: dropout changes the output; the same key gives the same output; another
  // micro-batch another one; the workspace forgets the key after the call.
  const std::vector<float> plain = Forward(*be, spec, with, pl, in, none, 0.2, &after);
  const std::vector<float> a = Forward(*be, spec, with, pl, in, train, 0.2, &after);
  CHECK(after.p == 0.0);
  CHECK(a != plain);
  CHECK(a == Forward(*be, spec, with, pl, in, train, 0.2, &after));
  SequenceInputs other = train;
  other.lora_dropout.micro_batch = 1;
  CHECK(a != Forward(*be, spec, with, pl, in, other, 0.2, &after));
  // p = 0 in the key: no dropout, bit for bit the plain forward.
  SequenceInputs zero = train;
  zero.lora_dropout.p = 0;
  CHECK(plain == Forward(*be, spec, with, pl, in, zero, 0.0, &after));
}

}  // namespace
}  // namespace l2l::layers
