// Mixture-of-experts specs (the Llama family with num_experts > 0, Hugging Face's
// MixtralForCausalLM): the block layout (router, then per expert w1 | w3 | w2, contiguous,
// under the checkpoint's names), the parameter count, ExpertRanges, validation messages,
// and config.json both ways (Mixtral-8x7B's own config as the hub ships it).
#include <catch2/catch.hpp>

#include <string>

#include <nlohmann/json.hpp>

#include "common/model_spec.h"
#include "common/models/registry.h"

namespace l2l {
namespace {

ModelSpec Moe() {
  ModelSpec s;
  s.family = ModelFamily::kLlama;
  s.vocab_size = 64;
  s.seq_len = 16;
  s.d_model = 32;
  s.n_layer = 2;
  s.n_head = 4;
  s.n_kv_heads = 2;
  s.d_ff = 24;
  s.tied_embeddings = false;
  s.num_experts = 4;
  s.experts_per_token = 2;
  return s;
}

void ExpectError(const Status& st, const std::vector<std::string>& parts) {
  INFO(st.ToString());
  REQUIRE_FALSE(st.ok());
  for (const std::string& p : parts) CHECK(st.ToString().find(p) != std::string::npos);
}

TEST_CASE("A Mixtral block holds the router, then each expert's w1, w3, w2 under the checkpoint's names",
          "[model_spec][moe]") {
  const ModelSpec s = Moe();
  REQUIRE(s.Validate().ok());
  const std::vector<LayerLayout> layouts = BuildLayout(s);
  const LayerLayout& b = layouts[2];  // block 1
  const ParamInfo* router = b.Find("block_sparse_moe.gate.weight");
  REQUIRE(router != nullptr);
  CHECK(router->shape == std::vector<int64_t>{4, 32});
  CHECK(HfTensorName(s, *router) == "model.layers.1.block_sparse_moe.gate.weight");
  CHECK(b.Find("mlp.gate_proj.weight") == nullptr);
  const std::vector<ExpertRange> ranges = ExpertRanges(s, b);
  REQUIRE(ranges.size() == 4);
  for (int64_t e = 0; e < 4; ++e) {
    const std::string x = "block_sparse_moe.experts." + std::to_string(e) + ".";
    const ParamInfo* w1 = b.Find(x + "w1.weight");
    const ParamInfo* w3 = b.Find(x + "w3.weight");
    const ParamInfo* w2 = b.Find(x + "w2.weight");
    REQUIRE(w1 != nullptr);
    REQUIRE(w3 != nullptr);
    REQUIRE(w2 != nullptr);
    CHECK(w1->shape == std::vector<int64_t>{24, 32});
    CHECK(w2->shape == std::vector<int64_t>{32, 24});
    CHECK(w3->offset == w1->offset + w1->numel);  // gate|up adjacent: one product
    CHECK(w2->offset == w3->offset + w3->numel);
    CHECK(w1->decay);
    CHECK(HfTensorName(s, *w2) == "model.layers.1." + x + "w2.weight");
    CHECK(ranges[static_cast<size_t>(e)].begin == w1->offset);
    CHECK(ranges[static_cast<size_t>(e)].end == w2->offset + w2->numel);
  }
  CHECK(ranges.back().end == b.numel);
  CHECK(ExpertRanges(s, layouts[0]).empty());
  CHECK(ExpertRanges(s, layouts.back()).empty());
  int64_t total = 0;
  for (const LayerLayout& l : layouts) total += static_cast<int64_t>(l.numel);
  CHECK(s.NumParams() == total);
  ModelSpec dense = s;
  dense.num_experts = dense.experts_per_token = 0;
  CHECK(ExpertRanges(dense, BuildLayout(dense)[1]).empty());
  // Training FLOPs count the router and k experts per token, not E.
  CHECK(s.TrainFlopsPerToken(16) - dense.TrainFlopsPerToken(16) ==
        Approx(6.0 * 2 * (4.0 * 32 + 2 * 3.0 * 32 * 24 - 3.0 * 32 * 24)));
}

TEST_CASE("Mixture-of-experts fields are validated with messages naming them", "[model_spec][moe]") {
  ModelSpec s = Moe();
  s.experts_per_token = 5;
  ExpectError(s.Validate(), {"experts_per_token=5", "num_experts=4"});
  s = Moe();
  s.experts_per_token = 0;
  ExpectError(s.Validate(), {"experts_per_token=0"});
  s = Moe();
  s.qkv_bias = true;
  ExpectError(s.Validate(), {"qkv_bias", "num_experts"});
  s = Moe();
  s.router_aux_loss_coef = -1;
  ExpectError(s.Validate(), {"router_aux_loss_coef"});
  ModelSpec dense = Moe();
  dense.num_experts = 0;
  ExpectError(dense.Validate(), {"experts_per_token", "num_experts > 0"});
  dense.experts_per_token = 0;
  dense.output_router_logits = true;
  ExpectError(dense.Validate(), {"output_router_logits", "num_experts > 0"});
}

TEST_CASE("MixtralForCausalLM's config.json reads as a mixture-of-experts spec and writes back", "[model_spec][moe]") {
  // Mixtral-8x7B-v0.1's config.json as the hub ships it.
  const nlohmann::json c = nlohmann::json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})");
  Result<ModelSpec> s = models::SpecFromHfConfig(c, "config.json");
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  CHECK(s->family == ModelFamily::kLlama);
  CHECK(s->num_experts == 8);
  CHECK(s->experts_per_token == 2);
  CHECK(s->router_aux_loss_coef == 0.02);
  CHECK_FALSE(s->output_router_logits);
  CHECK(s->d_ff == 14336);
  CHECK(s->kv_heads() == 8);
  CHECK(s->NumParams() == 46702792704);  // Mixtral-8x7B: 46.7 B parameters
  const nlohmann::json back = models::Family(s->family).to_hf_config(*s);
  CHECK(back["architectures"][0] == "MixtralForCausalLM");
  CHECK(back["model_type"] == "mixtral");
  CHECK(back["num_local_experts"] == 8);
  Result<ModelSpec> again = models::SpecFromHfConfig(back, "written");
  REQUIRE(again.ok());
  CHECK(*again == *s);

  nlohmann::json jitter = c;
  jitter["router_jitter_noise"] = 0.1;
  ExpectError(models::SpecFromHfConfig(jitter, "config.json").status(), {"router_jitter_noise"});
  nlohmann::json window = c;
  window["sliding_window"] = 4096;
  ExpectError(models::SpecFromHfConfig(window, "config.json").status(), {"sliding_window=4096"});
}

}  // namespace
}  // namespace l2l
