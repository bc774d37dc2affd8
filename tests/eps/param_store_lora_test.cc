// Tests of eps_server/param_store.h for a LoRA job: state only for the trainable vectors,
// the frozen base held once in its record (bf16 / NF4 / Q8_0 as common/lora_frozen.h
// says), published beside the trainable span, never rewritten, named by BaseHash; and the
// host bytes that follow from it.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "common/dtype.h"
#include "common/lora.h"
#include "common/lora_frozen.h"
#include "eps_server/param_store.h"

namespace l2l::eps {
namespace {

ModelSpec Spec() {
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

ParamStoreOptions Opts(LoraBaseDType base) {
  ParamStoreOptions o;
  o.page_bytes = 4096;
  o.publish_dtype = DType::kF32;
  o.lora.enabled = true;
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.init_seed = 5;
  o.lora.base_dtype = base;
  o.lora.modules_to_save = {"lm_head"};
  return o;
}

// What a worker must compute with: the seed's base, PEFT-style adapters, the base rounded
// as held.
std::vector<float> Expected(const ModelSpec& spec, const LoraConfig& lora, int64_t l, uint64_t seed) {
  const LayerLayout full = BuildLoraLayout(spec, lora)[static_cast<size_t>(l)];
  std::vector<float> v(full.numel, 0.0f);
  InitLayerParams(spec, BuildLayout(spec)[static_cast<size_t>(l)], seed, v.data());
  InitLoraAdapters(lora, full, v.data());
  REQUIRE(RoundToHeld(full, lora, v.data()).ok());
  return v;
}

}  // namespace

TEST_CASE("ParamStore LoRA: state for adapters only, the base held once and published beside them",
          "[eps][param_store][lora]") {
  const ModelSpec spec = Spec();
  const LoraBaseDType base = GENERATE(LoraBaseDType::kF32, LoraBaseDType::kBF16, LoraBaseDType::kQ4, LoraBaseDType::kQ8);
  INFO("base_dtype " << ToString(base));
  const ParamStoreOptions o = Opts(base);
  auto store = ParamStore::Create(spec, o);
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  ParamStore& ps = **store;
  REQUIRE(ps.InitFromSeed(11).ok());
  const std::string hash = ps.BaseHash();
  CHECK(hash.size() == 16);
  for (int64_t l = 0; l < ps.num_layers(); ++l) {
    INFO("layer " << l);
    const LayerLayout& full = ps.full_layout(l);
    CHECK(ps.layout(l).numel == TrainableNumel(full));
    CHECK(ps.base_numel(l) == BuildLayout(spec)[static_cast<size_t>(l)].numel);
    const std::vector<float> want = Expected(spec, o.lora, l, 11);
    std::vector<float> got(full.numel);
    REQUIRE(ps.ReadFullLayer(l, got.data()).ok());
    CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
    // Published: the trainable span in the slot, the record beside it.
    REQUIRE(ps.PublishMaster(l, 0).ok());
    auto pin = ps.Acquire(l, 0, std::chrono::milliseconds(100));
    REQUIRE(pin.ok());
    const FrozenPlan& plan = ps.frozen_plan(l);
    CHECK(pin->bytes() == plan.trainable.numel * 4);
    CHECK(pin->frozen_bytes() == plan.bytes);
    std::vector<float> seen(full.numel, 0.0f);
    if (plan.bytes > 0) {
      REQUIRE(pin->frozen_data() != nullptr);
      DecodeFrozen(plan, static_cast<const uint8_t*>(pin->frozen_data()), seen.data());
    } else {
      CHECK(pin->frozen_data() == nullptr);
    }
    std::memcpy(seen.data() + plan.trainable.offset, pin->data(), pin->bytes());
    CHECK(std::memcmp(seen.data(), want.data(), want.size() * 4) == 0);
  }
  // The head trains in full (modules_to_save), the embedding is frozen, blocks train their
  // adapters only.
  CHECK(ps.layout(0).numel == 0);
  CHECK(ps.layout(ps.num_layers() - 1).numel == static_cast<size_t>(spec.vocab_size * spec.d_model));
  // A reload (a rollback) keeps the record: the base never changes for the store's life.
  std::vector<float> other(ps.base_numel(1), 0.25f);
  REQUIRE(ps.WriteInitialLayer(1, other.data()).ok());
  CHECK(ps.BaseHash() == hash);
}

TEST_CASE("ParamStore LoRA: BaseHash names the base by content and base_dtype", "[eps][param_store][lora]") {
  const ModelSpec spec = Spec();
  auto hash_of = [&](LoraBaseDType base, uint64_t seed) {
    auto store = ParamStore::Create(spec, Opts(base));
    REQUIRE(store.ok());
    REQUIRE((*store)->InitFromSeed(seed).ok());
    return (*store)->BaseHash();
  };
  CHECK(hash_of(LoraBaseDType::kQ4, 1) == hash_of(LoraBaseDType::kQ4, 1));
  CHECK(hash_of(LoraBaseDType::kQ4, 1) != hash_of(LoraBaseDType::kQ4, 2));
  CHECK(hash_of(LoraBaseDType::kQ4, 1) != hash_of(LoraBaseDType::kQ8, 1));
  CHECK(hash_of(LoraBaseDType::kBF16, 1) != hash_of(LoraBaseDType::kF32, 1));
  auto plain = ParamStore::Create(spec, ParamStoreOptions{});
  REQUIRE(plain.ok());
  CHECK((*plain)->BaseHash().empty());
}

TEST_CASE("ParamStore LoRA: host bytes fall with the base's dtype", "[eps][param_store][lora]") {
  // A model large enough that the frozen base dominates (4 blocks of 256 x 1024 MLPs).
  ModelSpec spec = Spec();
  spec.d_model = 256;
  spec.d_ff = 1024;
  spec.n_layer = 4;
  spec.n_head = 8;
  spec.n_kv_heads = 8;
  spec.vocab_size = 256;
  REQUIRE(spec.Validate().ok());
  ParamStoreOptions full;
  full.page_bytes = 4096;
  full.publish_dtype = DType::kBF16;
  const size_t params = static_cast<size_t>(spec.NumParams());
  const size_t b_full = ParamStore::RequiredHostBytes(spec, full);
  size_t prev = b_full;
  for (LoraBaseDType base : {LoraBaseDType::kF32, LoraBaseDType::kBF16, LoraBaseDType::kQ8, LoraBaseDType::kQ4}) {
    ParamStoreOptions o = Opts(base);
    o.publish_dtype = DType::kBF16;
    o.lora.modules_to_save.clear();
    const size_t b = ParamStore::RequiredHostBytes(spec, o);
    INFO(ToString(base) << ": " << b << " bytes, " << static_cast<double>(b) / params << " B/param");
    CHECK(b < prev);
    prev = b;
    // The frozen base at its stated bytes per parameter (+ adapters' state, headers, pages).
    const double per = static_cast<double>(b) / static_cast<double>(params);
    if (base == LoraBaseDType::kF32) CHECK(per < 4.6);
    if (base == LoraBaseDType::kBF16) CHECK(per < 2.6);
    if (base == LoraBaseDType::kQ8) CHECK(per < 1.7);
    if (base == LoraBaseDType::kQ4) CHECK(per < 1.2);
  }
  CHECK(static_cast<double>(b_full) / static_cast<double>(params) > 15.0);  // 12 B state + 2 x 2 B published
}

}  // namespace l2l::eps
