// Tests for common/lora_frozen.h: which tensors of a LoRA layer are frozen and how each is
// encoded (QLoRA's choice: block linears quantized, norms / embeddings / head in bf16),
// that the record decodes to the block codecs' own values (common/quant_blocks.h, itself
// checked bit for bit against gguf and an NF4 reference in tests/formats), the bytes per
// parameter the docs state, and that RoundToHeld is exactly decode(encode(x)).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/dtype.h"
#include "common/lora.h"
#include "common/lora_frozen.h"
#include "common/model_spec.h"
#include "common/quant_blocks.h"

namespace l2l {
namespace {

ModelSpec Llama() {
  ModelSpec s;
  s.family = ModelFamily::kLlama;
  s.vocab_size = 64;
  s.seq_len = 16;
  s.d_model = 64;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_heads = 2;
  s.d_ff = 128;
  s.tied_embeddings = false;
  REQUIRE(s.Validate().ok());
  return s;
}

LoraConfig Lora(LoraBaseDType base) {
  LoraConfig l;
  l.enabled = true;
  l.r = 4;
  l.alpha = 8;
  l.base_dtype = base;
  l.modules_to_save = {"lm_head"};
  return l;
}

std::vector<float> Values(const LayerLayout& layout, uint64_t seed) {
  std::vector<float> v(layout.numel);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint64_t h = (seed + i) * 0x9E3779B97F4A7C15ull;
    v[i] = static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-53 - 0.5) * 0.2f;
  }
  return v;
}

const FrozenPiece* PieceAt(const FrozenPlan& plan, size_t offset) {
  for (const FrozenPiece& p : plan.pieces) {
    if (offset >= p.offset && offset < p.offset + p.numel) return &p;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("Frozen plan: QLoRA's split, aligned pieces, the trainable span left out", "[lora][frozen]") {
  const ModelSpec spec = Llama();
  const LoraBaseDType base = GENERATE(LoraBaseDType::kF32, LoraBaseDType::kBF16, LoraBaseDType::kQ4, LoraBaseDType::kQ8);
  INFO("base_dtype " << ToString(base));
  const LoraConfig lora = Lora(base);
  for (const LayerLayout& l : BuildLoraLayout(spec, lora)) {
    const FrozenPlan plan = PlanFrozenBase(l, lora);
    const TrainableSpan span = TrainableRange(l);
    CHECK(plan.trainable.offset == span.offset);
    CHECK(plan.trainable.numel == span.numel);
    CHECK(plan.frozen_numel + TrainableNumel(l) == l.numel);
    CHECK(plan.bytes % 64 == 0);
    size_t end = 0;
    for (const FrozenPiece& p : plan.pieces) {
      CHECK(p.byte_offset % 64 == 0);
      CHECK(p.byte_offset >= end);
      end = p.byte_offset + p.bytes;
    }
    CHECK(end <= plan.bytes);
    for (const ParamInfo& p : l.params) {
      const FrozenPiece* piece = PieceAt(plan, p.offset);
      if (p.trainable) {
        CHECK(piece == nullptr);
        continue;
      }
      REQUIRE(piece != nullptr);
      CHECK(piece->offset + piece->numel >= p.offset + p.numel);  // a tensor is never split
      const bool linear = l.kind == LayerKind::kBlock && p.shape.size() == 2;
      FrozenEncoding want = FrozenEncoding::kF32;
      if (base == LoraBaseDType::kBF16) want = FrozenEncoding::kBF16;
      if (base == LoraBaseDType::kQ4) want = linear ? FrozenEncoding::kNf4 : FrozenEncoding::kBF16;
      if (base == LoraBaseDType::kQ8) want = linear ? FrozenEncoding::kQ8_0 : FrozenEncoding::kBF16;
      INFO(p.name);
      CHECK(piece->enc == want);
    }
  }
  // Without LoRA nothing is frozen.
  const LayerLayout plain = BuildLayout(spec)[1];
  const FrozenPlan none = PlanFrozenBase(plain, LoraConfig{});
  CHECK(none.bytes == 0);
  CHECK(none.pieces.empty());
  CHECK(none.trainable.numel == plain.numel);
}

TEST_CASE("Frozen record: decodes to the block codecs' values, 0.5625 / 1.0625 B per quantized param",
          "[lora][frozen]") {
  const ModelSpec spec = Llama();
  const LoraBaseDType base = GENERATE(LoraBaseDType::kF32, LoraBaseDType::kBF16, LoraBaseDType::kQ4, LoraBaseDType::kQ8);
  INFO("base_dtype " << ToString(base));
  const LoraConfig lora = Lora(base);
  const LayerLayout block = BuildLoraLayout(spec, lora)[1];
  const std::vector<float> x = Values(block, 7);
  const FrozenPlan plan = PlanFrozenBase(block, lora);
  std::vector<uint8_t> record(plan.bytes, 0xAB);
  REQUIRE(EncodeFrozen(plan, x.data(), record.data()).ok());
  std::vector<float> y(block.numel, -7.0f);
  DecodeFrozen(plan, record.data(), y.data());
  size_t quantized = 0, quantized_bytes = 0;
  for (const ParamInfo& p : block.params) {
    INFO(p.name);
    if (p.trainable) {  // untouched by the decode
      CHECK(y[p.offset] == -7.0f);
      continue;
    }
    const FrozenPiece* piece = PieceAt(plan, p.offset);
    REQUIRE(piece != nullptr);
    std::vector<float> want(p.numel);
    switch (piece->enc) {
      case FrozenEncoding::kF32: std::memcpy(want.data(), x.data() + p.offset, p.numel * 4); break;
      case FrozenEncoding::kBF16:
        for (size_t i = 0; i < p.numel; ++i) want[i] = Bf16ToFloat(FloatToBf16(x[p.offset + i]));
        break;
      case FrozenEncoding::kNf4:
      case FrozenEncoding::kQ8_0: {
        const QuantFormat f = piece->enc == FrozenEncoding::kNf4 ? QuantFormat::kNf4 : QuantFormat::kQ8_0;
        auto bytes = QuantizedBytes(f, static_cast<int64_t>(p.numel));
        REQUIRE(bytes.ok());
        std::vector<uint8_t> blocks(*bytes);
        REQUIRE(Quantize(f, x.data() + p.offset, static_cast<int64_t>(p.numel), blocks.data()).ok());
        REQUIRE(Dequantize(f, blocks.data(), static_cast<int64_t>(p.numel), want.data()).ok());
        CHECK(piece->bytes == *bytes);
        quantized += p.numel;
        quantized_bytes += *bytes;
        break;
      }
    }
    CHECK(std::memcmp(y.data() + p.offset, want.data(), p.numel * 4) == 0);
  }
  if (base == LoraBaseDType::kQ4) CHECK(static_cast<double>(quantized_bytes) / quantized == 0.5625);
  if (base == LoraBaseDType::kQ8) CHECK(static_cast<double>(quantized_bytes) / quantized == 1.0625);
  if (base == LoraBaseDType::kF32) CHECK(plan.bytes >= plan.frozen_numel * 4);
  // RoundToHeld is decode(encode(x)) on the frozen tensors, the trainable ones untouched.
  std::vector<float> held = x;
  REQUIRE(RoundToHeld(block, lora, held.data()).ok());
  for (const ParamInfo& p : block.params) {
    for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
      if (p.trainable) {
        REQUIRE(held[i] == x[i]);
      } else {
        REQUIRE(held[i] == y[i]);
      }
    }
  }
}

TEST_CASE("Frozen record: a non-finite quantized value is refused naming the tensor", "[lora][frozen]") {
  const LoraConfig lora = Lora(LoraBaseDType::kQ4);
  const LayerLayout block = BuildLoraLayout(Llama(), lora)[1];
  std::vector<float> x = Values(block, 3);
  const ParamInfo* q = block.Find("self_attn.q_proj.weight");
  REQUIRE(q != nullptr);
  x[q->offset + 5] = std::nanf("");
  const FrozenPlan plan = PlanFrozenBase(block, lora);
  std::vector<uint8_t> record(plan.bytes);
  const Status s = EncodeFrozen(plan, x.data(), record.data());
  REQUIRE_FALSE(s.ok());
  CHECK(s.message().find("offset " + std::to_string(q->offset)) != std::string::npos);
}

TEST_CASE("TrainableLayout: the trainable tensors from offset 0, everything else left out", "[lora]") {
  const LoraConfig lora = Lora(LoraBaseDType::kBF16);
  for (const LayerLayout& l : BuildLoraLayout(Llama(), lora)) {
    const LayerLayout t = TrainableLayout(l);
    CHECK(t.numel == TrainableNumel(l));
    const TrainableSpan span = TrainableRange(l);
    size_t k = 0;
    for (const ParamInfo& p : l.params) {
      if (!p.trainable) continue;
      REQUIRE(k < t.params.size());
      CHECK(t.params[k].name == p.name);
      CHECK(t.params[k].offset == p.offset - span.offset);
      ++k;
    }
    CHECK(k == t.params.size());
  }
}

}  // namespace l2l
