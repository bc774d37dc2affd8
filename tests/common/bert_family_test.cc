// The BERT entry of the model-family registry: layout names and adjacency, the Hugging
// Face names (base tensors under "bert.", heads without), parameter counts against the
// layout, YAML/JSON round trips of its fields, config.json both ways, and the refusals.
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/formats/model_io.h"
#include "common/model_spec.h"
#include "common/models/registry.h"
#include "tests/testing/jobs.h"

namespace l2l {
namespace {

// V 50, T 32, C 24 in 4 heads, F 40, 2 blocks, 3 token types, LayerNorm eps 1e-7.
ModelSpec SmallBert(int64_t num_labels) {
  return testing::BertModel({50, 32, 24, 2, 4, 40, 3, 1e-7}, num_labels);
}

void ExpectError(const Status& st, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(st.ok());
  INFO("message: " << st.message());
  for (const std::string& n : needles) CHECK(st.message().find(n) != std::string::npos);
}

TEST_CASE("A BERT spec lays out BertModel names, q|k|v adjacent, heads by num_labels", "[model_spec][bert]") {
  for (int64_t labels : {0, 3}) {
    const ModelSpec s = SmallBert(labels);
    REQUIRE(s.Validate().ok());
    const auto layers = BuildLayout(s);
    REQUIRE(layers.size() == 4);
    CHECK(EmbeddingTable(s, layers[0]).name == "embeddings.word_embeddings.weight");
    CHECK(layers[0].Find("embeddings.token_type_embeddings.weight")->shape == std::vector<int64_t>{3, 24});
    CHECK(HfTensorName(s, layers[0].params[0]) == "bert.embeddings.word_embeddings.weight");
    const LayerLayout& b = layers[2];
    const auto* q = b.Find("encoder.layer.1.attention.self.query.weight");
    const auto* k = b.Find("encoder.layer.1.attention.self.key.weight");
    const auto* v = b.Find("encoder.layer.1.attention.self.value.weight");
    const auto* qb = b.Find("encoder.layer.1.attention.self.query.bias");
    const auto* vb = b.Find("encoder.layer.1.attention.self.value.bias");
    REQUIRE((q && k && v && qb && vb));
    CHECK(k->offset == q->offset + 24 * 24);
    CHECK(v->offset == k->offset + 24 * 24);
    CHECK(vb->offset == qb->offset + 2 * 24);
    CHECK(HfTensorName(s, *q) == "bert.encoder.layer.1.attention.self.query.weight");
    const LayerLayout& head = layers.back();
    if (labels == 0) {
      CHECK(HfTensorName(s, *head.Find("cls.predictions.bias")) == "cls.predictions.bias");
      CHECK(head.Find("cls.predictions.bias")->shape == std::vector<int64_t>{50});
    } else {
      CHECK(HfTensorName(s, *head.Find("pooler.dense.weight")) == "bert.pooler.dense.weight");
      CHECK(HfTensorName(s, *head.Find("classifier.weight")) == "classifier.weight");
      CHECK(head.Find("classifier.weight")->shape == std::vector<int64_t>{3, 24});
    }
    int64_t total = 0;
    for (const LayerLayout& l : layers) total += static_cast<int64_t>(l.numel);
    CHECK(s.NumParams() == total);  // nothing tied inside the layout (the decoder reads layer 0)
  }
}

TEST_CASE("BERT fields survive YAML and JSON round trips - bad ones are named", "[model_spec][config][bert]") {
  for (int64_t labels : {0, 2}) {
    JobConfig job;
    job.model = SmallBert(labels);
    auto back = ParseJobConfig(JobConfigToYaml(job), "<test>");
    INFO(back.status().ToString());
    REQUIRE(back.ok());
    CHECK(back->model == job.model);
    auto spec = ModelSpecFromJson(ModelSpecToJson(job.model));
    REQUIRE(spec.ok());
    CHECK(*spec == job.model);
  }
  const std::string base = "model:\n  vocab_size: 50\n  d_model: 24\n  n_head: 6\n";
  ExpectError(ParseJobConfig(base + "  num_labels: 2\n", "<yaml>").status(), {"num_labels", "family=bert"});
  ExpectError(ParseJobConfig(base + "  type_vocab_size: 4\n", "<yaml>").status(), {"type_vocab_size", "family=bert"});
  ExpectError(ParseJobConfig(base + "  family: bert\n  tied_embeddings: false\n", "<yaml>").status(),
              {"tied_embeddings", "masked-LM"});
  ExpectError(ParseJobConfig(base + "  family: bert\n  n_kv_heads: 2\n", "<yaml>").status(), {"n_kv_heads"});
}

TEST_CASE("BERT config.json maps to a spec and back", "[model_spec][bert]") {
  for (int64_t labels : {0, 3}) {
    const ModelSpec s = SmallBert(labels);
    const nlohmann::json c = models::Family(ModelFamily::kBert).to_hf_config(s);
    CHECK(c["architectures"][0] == (labels == 0 ? "BertForMaskedLM" : "BertForSequenceClassification"));
    auto back = models::SpecFromHfConfig(c, "config.json");
    INFO(back.status().ToString());
    REQUIRE(back.ok());
    CHECK(*back == s);
  }
  nlohmann::json c = models::Family(ModelFamily::kBert).to_hf_config(SmallBert(0));
  c["hidden_act"] = "relu";
  ExpectError(models::SpecFromHfConfig(c, "cfg.json").status(), {"cfg.json", "hidden_act=relu"});
  c["hidden_act"] = "gelu";
  c["position_embedding_type"] = "relative_key";
  ExpectError(models::SpecFromHfConfig(c, "cfg.json").status(), {"position_embedding_type=relative_key"});
}

}  // namespace
}  // namespace l2l
