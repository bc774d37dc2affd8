// The BERT family (Hugging Face BertForMaskedLM, BertForSequenceClassification):
// metadata for the registry. Linear weights keep nn.Linear's layout, W (out, in),
// y = x @ W^T; our names are Hugging Face's BertModel names (no "bert."), the heads' as
// the *For* classes name them.
//
//   0              Embedding   embeddings.word_embeddings (V, C), position_embeddings (T, C),
//                              token_type_embeddings (TT, C), embeddings.LayerNorm (C)
//   1..n_layer     Block i-1   encoder.layer.i.attention.self.{query,key,value}.weight (C, C)
//                              [adjacent: one (3C, C) matrix], then their biases [adjacent:
//                              (3C)], attention.output.dense (C, C), attention.output.LayerNorm,
//                              intermediate.dense (F, C), output.dense (C, F), output.LayerNorm
//   n_layer+1      Head        num_labels == 0 (masked LM): cls.predictions.transform.dense
//                              (C, C), cls.predictions.transform.LayerNorm (C),
//                              cls.predictions.bias (V); the decoder is the word embedding
//                              (tied). num_labels > 0: pooler.dense (C, C), classifier
//                              (num_labels, C).
// In a Hugging Face checkpoint the base model's tensors (embeddings, encoder, pooler) carry
// "bert."; cls.* and classifier.* do not. A plain BertModel checkpoint (sentence encoders
// such as all-MiniLM-L6-v2) has no head and stores its tensors with or without "bert.":
// its spec has the masked-LM head unless the job's model.num_labels picks the
// classification head (common/pretrained), and the head tensors it lacks are initialised.
//
// Thread-safety: pure functions and an immutable table entry.
#include <cmath>

#include "common/models/family_util.h"
#include "common/models/registry.h"

namespace l2l::models {
namespace {

Status Validate(const ModelSpec& s) {
  if (s.n_kv_heads != 0 && s.n_kv_heads != s.n_head) {
    return InvalidArgument(Field("n_kv_heads", s.n_kv_heads) + " needs model.family=llama (BERT has no grouped-query attention)");
  }
  if (s.qkv_bias) return InvalidArgument("model.qkv_bias=true needs model.family=llama (BERT always has biases)");
  if (s.rope_scaling.type != RopeScalingType::kNone) {
    return InvalidArgument("model.rope_scaling needs model.family=llama (BERT has learned positions)");
  }
  if (Status st = RequireNoAttentionVariantFields(s, "BERT"); !st.ok()) return st;
  if (Status st = RequireNoGemma3Fields(s); !st.ok()) return st;
  if (s.type_vocab_size <= 0) return InvalidArgument(Field("type_vocab_size", s.type_vocab_size) + " must be positive");
  if (s.num_labels < 0) return InvalidArgument(Field("num_labels", s.num_labels) + " must be >= 0 (0: masked-LM head)");
  if (!(s.layer_norm_eps > 0) || !std::isfinite(s.layer_norm_eps)) {
    return InvalidArgument("model.layer_norm_eps=" + std::to_string(s.layer_norm_eps) + " must be a number > 0");
  }
  if (s.num_labels == 0 && !s.tied_embeddings) {
    return InvalidArgument("model.tied_embeddings=false: BERT's masked-LM decoder is the word embedding (set it true, "
                           "or num_labels > 0 for a classification head)");
  }
  const double C = double(s.d_model);
  const double total = double(s.vocab_size) * C + double(s.seq_len) * C +
                       double(s.n_layer) * (4.0 * C * C + 2.0 * C * s.d_ff);
  if (total > 1e15) {
    return InvalidArgument("model is too large (" + std::to_string(total) + " parameters); check model.d_model / n_layer");
  }
  return Status::Ok();
}

int64_t NumParams(const ModelSpec& s) {
  const int64_t C = s.d_model, F = s.d_ff, V = s.vocab_size;
  const int64_t embedding = V * C + s.seq_len * C + s.type_vocab_size * C + 2 * C;
  const int64_t block = (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C) + 2 * C;
  const int64_t head = s.num_labels == 0 ? (C * C + C) + 2 * C + V : (C * C + C) + s.num_labels * C + s.num_labels;
  return embedding + s.n_layer * block + head;
}

double TrainFlopsPerToken(const ModelSpec& s, int64_t T) {
  const double C = double(s.d_model), F = double(s.d_ff), L = double(s.n_layer);
  const double head = s.num_labels == 0 ? C * C + double(s.vocab_size) * C : 0.0;
  const double matmul_params = L * (4.0 * C * C + 2.0 * C * F) + head;
  return 6.0 * matmul_params + 12.0 * L * double(T) * C;
}

std::vector<LayerLayout> BuildLayout(const ModelSpec& spec) {
  const int64_t V = spec.vocab_size, T = spec.seq_len, C = spec.d_model, F = spec.d_ff;
  std::vector<LayerLayout> layers;
  layers.reserve(static_cast<size_t>(spec.NumLayers()));

  LayerLayout emb;
  emb.kind = LayerKind::kEmbedding;
  emb.index = 0;
  AddParam(&emb, "embeddings.word_embeddings.weight", {V, C}, true);
  AddParam(&emb, "embeddings.position_embeddings.weight", {T, C}, true);
  AddParam(&emb, "embeddings.token_type_embeddings.weight", {spec.type_vocab_size, C}, true);
  AddParam(&emb, "embeddings.LayerNorm.weight", {C}, false);
  AddParam(&emb, "embeddings.LayerNorm.bias", {C}, false);
  layers.push_back(std::move(emb));

  for (int64_t i = 0; i < spec.n_layer; ++i) {
    LayerLayout b;
    b.kind = LayerKind::kBlock;
    b.index = i + 1;
    b.block = i;
    const std::string h = "encoder.layer." + std::to_string(i) + ".";
    AddParam(&b, h + "attention.self.query.weight", {C, C}, true);
    AddParam(&b, h + "attention.self.key.weight", {C, C}, true);
    AddParam(&b, h + "attention.self.value.weight", {C, C}, true);
    AddParam(&b, h + "attention.self.query.bias", {C}, false);
    AddParam(&b, h + "attention.self.key.bias", {C}, false);
    AddParam(&b, h + "attention.self.value.bias", {C}, false);
    AddParam(&b, h + "attention.output.dense.weight", {C, C}, true);
    AddParam(&b, h + "attention.output.dense.bias", {C}, false);
    AddParam(&b, h + "attention.output.LayerNorm.weight", {C}, false);
    AddParam(&b, h + "attention.output.LayerNorm.bias", {C}, false);
    AddParam(&b, h + "intermediate.dense.weight", {F, C}, true);
    AddParam(&b, h + "intermediate.dense.bias", {F}, false);
    AddParam(&b, h + "output.dense.weight", {C, F}, true);
    AddParam(&b, h + "output.dense.bias", {C}, false);
    AddParam(&b, h + "output.LayerNorm.weight", {C}, false);
    AddParam(&b, h + "output.LayerNorm.bias", {C}, false);
    layers.push_back(std::move(b));
  }

  LayerLayout head;
  head.kind = LayerKind::kHead;
  head.index = spec.n_layer + 1;
  if (spec.num_labels == 0) {
    AddParam(&head, "cls.predictions.transform.dense.weight", {C, C}, true);
    AddParam(&head, "cls.predictions.transform.dense.bias", {C}, false);
    AddParam(&head, "cls.predictions.transform.LayerNorm.weight", {C}, false);
    AddParam(&head, "cls.predictions.transform.LayerNorm.bias", {C}, false);
    AddParam(&head, "cls.predictions.bias", {V}, false);
  } else {
    AddParam(&head, "pooler.dense.weight", {C, C}, true);
    AddParam(&head, "pooler.dense.bias", {C}, false);
    AddParam(&head, "classifier.weight", {spec.num_labels, C}, true);
    AddParam(&head, "classifier.bias", {spec.num_labels}, false);
  }
  layers.push_back(std::move(head));
  return layers;
}

// As BertPreTrainedModel._init_weights: N(0, 0.02) matrices and embeddings, LayerNorm
// weights 1, biases 0.
void InitLayer(const ModelSpec&, const LayerLayout& layout, uint64_t seed, float* out) {
  const uint64_t layer_key = LayerKey(seed, layout.index);
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const ParamInfo& p = layout.params[k];
    float* dst = out + p.offset;
    if (EndsWith(p.name, "LayerNorm.weight")) {
      for (size_t i = 0; i < p.numel; ++i) dst[i] = 1.0f;
    } else if (p.shape.size() == 1) {
      for (size_t i = 0; i < p.numel; ++i) dst[i] = 0.0f;
    } else {
      FillNormal(TensorKey(layer_key, k), 0.02f, dst, p.numel);
    }
  }
}

Result<ModelSpec> FromHfConfig(const nlohmann::json& c, const std::string& origin) {
  const std::string arch = c["architectures"][0].get<std::string>();
  ModelSpec s;
  s.family = ModelFamily::kBert;
  L2L_RETURN_IF_ERROR(HfField(c, origin, "vocab_size", &s.vocab_size, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "max_position_embeddings", &s.seq_len, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "hidden_size", &s.d_model, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "num_hidden_layers", &s.n_layer, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "num_attention_heads", &s.n_head, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "intermediate_size", &s.d_ff, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "type_vocab_size", &s.type_vocab_size, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "layer_norm_eps", &s.layer_norm_eps, false));
  std::string act = "gelu";
  L2L_RETURN_IF_ERROR(HfField(c, origin, "hidden_act", &act, false));
  if (act != "gelu") return InvalidArgument(origin + ": hidden_act=" + act + " is not supported (l2l's BERT uses the erf GELU, gelu)");
  std::string pos = "absolute";
  L2L_RETURN_IF_ERROR(HfField(c, origin, "position_embedding_type", &pos, false));
  if (pos != "absolute") return InvalidArgument(origin + ": position_embedding_type=" + pos + " is not supported (absolute)");
  if (arch == "BertForSequenceClassification") {
    s.tied_embeddings = false;
    s.num_labels = 2;  // transformers' default when the config names no labels
    const auto it = c.find("id2label");
    if (it != c.end() && it->is_object()) s.num_labels = static_cast<int64_t>(it->size());
    L2L_RETURN_IF_ERROR(HfField(c, origin, "num_labels", &s.num_labels, false));
    std::string problem = "single_label_classification";
    L2L_RETURN_IF_ERROR(HfField(c, origin, "problem_type", &problem, false));
    if (problem != "single_label_classification" || s.num_labels < 2) {
      return InvalidArgument(origin + ": problem_type=" + problem + " with " + std::to_string(s.num_labels) +
                             " labels is not supported (single-label classification, >= 2 labels)");
    }
  } else {
    bool tied = true;
    L2L_RETURN_IF_ERROR(HfField(c, origin, "tie_word_embeddings", &tied, false));
    if (!tied) return InvalidArgument(origin + ": tie_word_embeddings=false is not supported (BERT's decoder is tied)");
  }
  if (Status st = s.Validate(); !st.ok()) return st.WithContext(origin);
  return s;
}

nlohmann::json ToHfConfig(const ModelSpec& s) {
  const bool mlm = s.num_labels == 0;
  nlohmann::json c = {{"architectures", {mlm ? "BertForMaskedLM" : "BertForSequenceClassification"}},
                      {"model_type", "bert"},
                      {"vocab_size", s.vocab_size},
                      {"max_position_embeddings", s.seq_len},
                      {"hidden_size", s.d_model},
                      {"intermediate_size", s.d_ff},
                      {"num_hidden_layers", s.n_layer},
                      {"num_attention_heads", s.n_head},
                      {"type_vocab_size", s.type_vocab_size},
                      {"layer_norm_eps", s.layer_norm_eps},
                      {"hidden_act", "gelu"},
                      {"position_embedding_type", "absolute"},
                      {"hidden_dropout_prob", 0.0},
                      {"attention_probs_dropout_prob", 0.0},
                      {"tie_word_embeddings", true},
                      {"torch_dtype", "float32"}};
  if (!mlm) {
    nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
    for (int64_t i = 0; i < s.num_labels; ++i) {
      id2label[std::to_string(i)] = "LABEL_" + std::to_string(i);
      label2id["LABEL_" + std::to_string(i)] = i;
    }
    c["id2label"] = id2label;
    c["label2id"] = label2id;
    c["problem_type"] = "single_label_classification";
  }
  return c;
}

std::string HfTensorName(const ModelSpec&, const ParamInfo& param) {
  if (param.name.rfind("cls.", 0) == 0 || param.name.rfind("classifier.", 0) == 0) return param.name;
  return "bert." + param.name;
}

}  // namespace

const FamilyInfo& BertFamily() {
  static const FamilyInfo kInfo{
      .family = ModelFamily::kBert,
      .name = "bert",
      .hf_architectures = {"BertForMaskedLM", "BertForSequenceClassification", "BertModel"},
      .hf_base_prefix = "bert.",
      .hf_file_prefix = "bert.",
      .embedding_table = "embeddings.word_embeddings.weight",
      .validate = &Validate,
      .num_params = &NumParams,
      .train_flops_per_token = &TrainFlopsPerToken,
      .build_layout = &BuildLayout,
      .init_layer = &InitLayer,
      .from_hf_config = &FromHfConfig,
      .to_hf_config = &ToHfConfig,
      .hf_tensor_name = &HfTensorName,
      .hf_headless_architectures = {"BertModel"},
      .hf_ignored_suffixes = {"embeddings.position_ids"},
      .hf_unused_base_tensors = {"pooler.dense.weight", "pooler.dense.bias"},
      .encoder = true,
  };
  return kInfo;
}

}  // namespace l2l::models
