// The Gemma 3 family (Hugging Face Gemma3ForCausalLM, model_type gemma3_text; GGUF
// architecture gemma3): metadata for the registry. Linear weights keep nn.Linear's
// layout, W (out, in); names are the Hugging Face ones without "model.". With hs =
// head_dim() (config head_dim, independent of C / NH), A = NH*hs:
//
//   0              Embedding   embed_tokens (V, C), scaled by sqrt(C) in the forward
//   1..n_layer     Block i-1   layers.i.input_layernorm (C),
//                              self_attn.{q,k,v}_proj (A | NKV*hs | NKV*hs, C) [adjacent],
//                              self_attn.{q,k}_norm (hs each), self_attn.o_proj (C, A),
//                              post_attention_layernorm (C), pre_feedforward_layernorm (C),
//                              post_feedforward_layernorm (C),
//                              mlp.gate_proj (F, C), mlp.up_proj (F, C) [adjacent: (2F, C)],
//                              mlp.down_proj (C, F)
//   n_layer+1      Head        norm (C); lm_head (V, C) only when embeddings are untied.
// Every RMSNorm computes x * rstd * (1 + w) (its weights initialise to 0, as
// Gemma3RMSNorm's). Block i slides (keys (t - sliding_window, t], RoPE base
// rope_local_theta, no scaling) unless (i + 1) % sliding_window_pattern == 0 (global:
// rope_theta and rope_scaling); scores are scaled by query_pre_attn_scalar^-1/2.
// llama.cpp's converter stores every norm weight as 1 + w (gguf_norm_shift).
//
// Thread-safety: pure functions and an immutable table entry.
#include <cmath>

#include "common/models/family_util.h"
#include "common/models/registry.h"

namespace l2l::models {
namespace {

Status Validate(const ModelSpec& s) {
  const int64_t kv = s.kv_heads();
  if (s.n_kv_heads < 0 || s.n_head % kv != 0) {
    return InvalidArgument(Field("n_kv_heads", s.n_kv_heads) + " must divide " + Field("n_head", s.n_head) +
                           " (0 means n_head)");
  }
  if (s.head_dim() % 2 != 0) {
    return InvalidArgument("model head size " + std::to_string(s.head_dim()) + " must be even for rotary embeddings");
  }
  for (const auto& [name, v] : {std::pair<const char*, double>{"rope_theta", s.rope_theta},
                                {"rope_local_theta", s.rope_local_theta},
                                {"rms_norm_eps", s.rms_norm_eps}}) {
    if (!(v > 0) || !std::isfinite(v)) {
      return InvalidArgument(std::string("model.") + name + "=" + std::to_string(v) + " must be a number > 0");
    }
  }
  if (!(s.query_pre_attn_scalar > 0) || !std::isfinite(s.query_pre_attn_scalar)) {
    return InvalidArgument("model.query_pre_attn_scalar=" + std::to_string(s.query_pre_attn_scalar) +
                           " must be a number > 0");
  }
  if (!s.qk_norm) return InvalidArgument("model.qk_norm=false: Gemma 3 always normalises q and k (set it true)");
  if (s.qkv_bias) return InvalidArgument("model.qkv_bias=true is not supported by gemma3 (no attention biases)");
  if (Status st = ValidateAttentionVariant(s); !st.ok()) return st;
  if (s.max_window_layers != 0) {
    return InvalidArgument(Field("max_window_layers", s.max_window_layers) +
                           " needs model.family=llama (Gemma 3 picks its global blocks by sliding_window_pattern)");
  }
  const RopeScaling& r = s.rope_scaling;
  if (r.type != RopeScalingType::kNone && (!(r.factor >= 1.0) || !std::isfinite(r.factor))) {
    return InvalidArgument("model.rope_scaling.factor=" + std::to_string(r.factor) + " must be >= 1");
  }
  if (r.type == RopeScalingType::kLlama3 && !(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor &&
                                               r.original_max_position_embeddings > 0)) {
    return InvalidArgument("model.rope_scaling: llama3 needs 0 < low_freq_factor < high_freq_factor and "
                           "original_max_position_embeddings > 0");
  }
  if (Status st = RequireNoBertFields(s); !st.ok()) return st;
  const double C = double(s.d_model), W = double(s.n_head + 2 * kv) * s.head_dim();
  const double total = double(s.vocab_size) * C * 2 + double(s.n_layer) * (W * C + C * double(s.n_head) * s.head_dim() + 3.0 * C * s.d_ff);
  if (total > 1e15) {
    return InvalidArgument("model is too large (" + std::to_string(total) + " parameters); check model.d_model / n_layer");
  }
  return Status::Ok();
}

int64_t NumParams(const ModelSpec& s) {
  const int64_t C = s.d_model, F = s.d_ff, hs = s.head_dim(), kv = s.kv_heads();
  const int64_t W = (s.n_head + 2 * kv) * hs, A = s.n_head * hs;
  const int64_t block = 4 * C + W * C + 2 * hs + C * A + 3 * C * F;
  return s.vocab_size * C + s.n_layer * block + C + (s.tied_embeddings ? 0 : s.vocab_size * C);
}

double TrainFlopsPerToken(const ModelSpec& s, int64_t T) {
  const double C = double(s.d_model), F = double(s.d_ff), L = double(s.n_layer);
  const double W = double(s.n_head + 2 * s.kv_heads()) * double(s.head_dim());
  const double A = double(s.n_head * s.head_dim());
  const double matmul_params = L * (W * C + C * A + 3.0 * C * F) + double(s.vocab_size) * C;
  // Attention over the keys each query sees (all of its past in a global block, at most
  // the window in a sliding one), counted in full.
  double keys = 0;
  for (int64_t b = 0; b < s.n_layer; ++b) {
    const int64_t w = s.WindowOf(b);
    keys += double(w > 0 && w < T ? w : T);
  }
  return 6.0 * matmul_params + 12.0 * keys * A;
}

std::vector<LayerLayout> BuildLayout(const ModelSpec& spec) {
  const int64_t V = spec.vocab_size, C = spec.d_model, F = spec.d_ff, hs = spec.head_dim();
  const int64_t q = spec.n_head * hs, kv = spec.kv_heads() * hs;
  std::vector<LayerLayout> layers;
  layers.reserve(static_cast<size_t>(spec.NumLayers()));
  LayerLayout emb;
  emb.kind = LayerKind::kEmbedding;
  emb.index = 0;
  AddParam(&emb, "embed_tokens.weight", {V, C}, true);
  layers.push_back(std::move(emb));
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    LayerLayout b;
    b.kind = LayerKind::kBlock;
    b.index = i + 1;
    b.block = i;
    const std::string h = "layers." + std::to_string(i) + ".";
    AddParam(&b, h + "input_layernorm.weight", {C}, false);
    AddParam(&b, h + "self_attn.q_proj.weight", {q, C}, true);
    AddParam(&b, h + "self_attn.k_proj.weight", {kv, C}, true);
    AddParam(&b, h + "self_attn.v_proj.weight", {kv, C}, true);
    AddParam(&b, h + "self_attn.q_norm.weight", {hs}, false);
    AddParam(&b, h + "self_attn.k_norm.weight", {hs}, false);
    AddParam(&b, h + "self_attn.o_proj.weight", {C, q}, true);
    AddParam(&b, h + "post_attention_layernorm.weight", {C}, false);
    AddParam(&b, h + "pre_feedforward_layernorm.weight", {C}, false);
    AddParam(&b, h + "post_feedforward_layernorm.weight", {C}, false);
    AddParam(&b, h + "mlp.gate_proj.weight", {F, C}, true);
    AddParam(&b, h + "mlp.up_proj.weight", {F, C}, true);
    AddParam(&b, h + "mlp.down_proj.weight", {C, F}, true);
    layers.push_back(std::move(b));
  }
  LayerLayout head;
  head.kind = LayerKind::kHead;
  head.index = spec.n_layer + 1;
  AddParam(&head, "norm.weight", {C}, false);
  if (!spec.tied_embeddings) AddParam(&head, "lm_head.weight", {V, C}, true);
  layers.push_back(std::move(head));
  return layers;
}

// Gemma3PreTrainedModel: norm weights 0 (the norm multiplies by 1 + w), N(0, 0.02) else.
void InitLayer(const ModelSpec&, const LayerLayout& layout, uint64_t seed, float* out) {
  const uint64_t layer_key = LayerKey(seed, layout.index);
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const ParamInfo& p = layout.params[k];
    float* dst = out + p.offset;
    if (EndsWith(p.name, "norm.weight")) {
      for (size_t i = 0; i < p.numel; ++i) dst[i] = 0.0f;
    } else {
      FillNormal(TensorKey(layer_key, k), 0.02f, dst, p.numel);
    }
  }
}

Status ReadRopeScaling(const nlohmann::json& c, const std::string& origin, RopeScaling* r) {
  const auto rs = c.find("rope_scaling");
  if (rs == c.end() || rs->is_null()) return Status::Ok();
  if (!rs->is_object()) return InvalidArgument(origin + ": rope_scaling=" + rs->dump() + " is not an object");
  const std::string where = origin + " rope_scaling";
  std::string type;
  L2L_RETURN_IF_ERROR(HfField(*rs, where, "type", &type, false));
  L2L_RETURN_IF_ERROR(HfField(*rs, where, "rope_type", &type, false));
  if (type == "default") return Status::Ok();
  Result<RopeScalingType> t = ParseRopeScalingType(type);
  if (!t.ok() || *t == RopeScalingType::kNone) {
    return InvalidArgument(origin + ": rope_scaling type '" + type + "' is not supported (linear, llama3)");
  }
  r->type = *t;
  L2L_RETURN_IF_ERROR(HfField(*rs, where, "factor", &r->factor, true));
  if (r->type == RopeScalingType::kLlama3) {
    L2L_RETURN_IF_ERROR(HfField(*rs, where, "low_freq_factor", &r->low_freq_factor, true));
    L2L_RETURN_IF_ERROR(HfField(*rs, where, "high_freq_factor", &r->high_freq_factor, true));
    L2L_RETURN_IF_ERROR(
        HfField(*rs, where, "original_max_position_embeddings", &r->original_max_position_embeddings, true));
  }
  return Status::Ok();
}

// sliding_window_pattern from layer_types (transformers >= 4.50 writes them): every
// pattern-th block global, the rest sliding; another arrangement is refused.
Status PatternFromLayerTypes(const nlohmann::json& lt, const std::string& origin, ModelSpec* s) {
  if (!lt.is_array() || int64_t(lt.size()) != s->n_layer) {
    return InvalidArgument(origin + ": layer_types is not a list of num_hidden_layers entries");
  }
  int64_t first_global = -1;
  for (int64_t i = 0; i < s->n_layer; ++i) {
    const nlohmann::json& e = lt[size_t(i)];
    if (!e.is_string() || (e != "sliding_attention" && e != "full_attention")) {
      return InvalidArgument(origin + ": layer_types[" + std::to_string(i) + "]=" + e.dump() +
                             " is not \"sliding_attention\" or \"full_attention\"");
    }
    if (e == "full_attention" && first_global < 0) first_global = i;
  }
  s->sliding_window_pattern = first_global < 0 ? 0 : first_global + 1;
  if (first_global == 0) s->sliding_window = 0;  // every block global
  for (int64_t i = 0; i < s->n_layer; ++i) {
    const bool sliding = lt[size_t(i)] == "sliding_attention";
    if (s->sliding_window > 0 && sliding != s->SlidingBlock(i)) {
      return InvalidArgument(origin + ": layer_types[" + std::to_string(i) + "]=" + lt[size_t(i)].dump() +
                             " breaks the pattern of one global block every " +
                             std::to_string(s->sliding_window_pattern) + " (other arrangements are not supported)");
    }
    if (s->sliding_window == 0 && sliding) {
      return InvalidArgument(origin + ": layer_types mixes global blocks before sliding ones (not supported)");
    }
  }
  return Status::Ok();
}

Result<ModelSpec> FromHfConfig(const nlohmann::json& c, const std::string& origin) {
  ModelSpec s;
  s.family = ModelFamily::kGemma3;
  s.qk_norm = true;
  s.tied_embeddings = true;  // Gemma3TextConfig's defaults below
  s.seq_len = 131072;
  s.rope_theta = 1e6;
  s.n_kv_heads = 4;
  s.head_size = 256;
  s.query_pre_attn_scalar = 256;
  s.sliding_window = 4096;
  s.sliding_window_pattern = 6;
  L2L_RETURN_IF_ERROR(HfField(c, origin, "vocab_size", &s.vocab_size, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "max_position_embeddings", &s.seq_len, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "hidden_size", &s.d_model, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "num_hidden_layers", &s.n_layer, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "num_attention_heads", &s.n_head, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "intermediate_size", &s.d_ff, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "num_key_value_heads", &s.n_kv_heads, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "head_dim", &s.head_size, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "rope_theta", &s.rope_theta, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "rope_local_base_freq", &s.rope_local_theta, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "rms_norm_eps", &s.rms_norm_eps, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "query_pre_attn_scalar", &s.query_pre_attn_scalar, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "tie_word_embeddings", &s.tied_embeddings, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "sliding_window", &s.sliding_window, false));
  if (const auto w = c.find("sliding_window"); w != c.end() && w->is_null()) s.sliding_window = 0;
  L2L_RETURN_IF_ERROR(HfField(c, origin, "sliding_window_pattern", &s.sliding_window_pattern, false));
  std::string act = "gelu_pytorch_tanh";
  L2L_RETURN_IF_ERROR(HfField(c, origin, "hidden_activation", &act, false));
  if (act != "gelu_pytorch_tanh") {
    return InvalidArgument(origin + ": hidden_activation=" + act + " is not supported (gelu_pytorch_tanh)");
  }
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    const auto it = c.find(key);
    if (it != c.end() && !it->is_null()) {
      return InvalidArgument(origin + ": " + key + "=" + it->dump() + " is not supported (l2l computes Gemma 3 "
                             "without logit softcapping; Gemma 3 configs have null)");
    }
  }
  for (const char* key : {"attention_bias", "use_bidirectional_attention"}) {
    bool v = false;
    L2L_RETURN_IF_ERROR(HfField(c, origin, key, &v, false));
    if (v) return InvalidArgument(origin + ": " + key + "=true is not supported");
  }
  // Stored as "the default" when they are what the default means, so that a spec
  // survives its own config.json.
  if (s.n_kv_heads == s.n_head) s.n_kv_heads = 0;
  if (s.n_head > 0 && s.d_model % s.n_head == 0 && s.head_size == s.d_model / s.n_head) s.head_size = 0;
  L2L_RETURN_IF_ERROR(ReadRopeScaling(c, origin, &s.rope_scaling));
  if (const auto lt = c.find("layer_types"); lt != c.end() && !lt->is_null()) {
    L2L_RETURN_IF_ERROR(PatternFromLayerTypes(*lt, origin, &s));
  }
  // A window as long as the context changes nothing.
  if (s.sliding_window >= s.seq_len) s.sliding_window = 0;
  if (s.sliding_window == 0) s.sliding_window_pattern = 0;
  if (Status st = s.Validate(); !st.ok()) return st.WithContext(origin);
  return s;
}

nlohmann::json ToHfConfig(const ModelSpec& s) {
  nlohmann::json layer_types = nlohmann::json::array();
  for (int64_t i = 0; i < s.n_layer; ++i) layer_types.push_back(s.SlidingBlock(i) ? "sliding_attention" : "full_attention");
  nlohmann::json c = {{"architectures", {"Gemma3ForCausalLM"}},
                      {"model_type", "gemma3_text"},
                      {"vocab_size", s.vocab_size},
                      {"max_position_embeddings", s.seq_len},
                      {"hidden_size", s.d_model},
                      {"intermediate_size", s.d_ff},
                      {"num_hidden_layers", s.n_layer},
                      {"num_attention_heads", s.n_head},
                      {"num_key_value_heads", s.kv_heads()},
                      {"head_dim", s.head_dim()},
                      {"hidden_activation", "gelu_pytorch_tanh"},
                      {"rms_norm_eps", s.rms_norm_eps},
                      {"rope_theta", s.rope_theta},
                      {"rope_local_base_freq", s.rope_local_theta},
                      {"query_pre_attn_scalar", s.query_pre_attn_scalar},
                      {"sliding_window", s.sliding_window > 0 ? nlohmann::json(s.sliding_window) : nlohmann::json()},
                      {"layer_types", layer_types},
                      {"attention_bias", false},
                      {"attention_dropout", 0.0},
                      {"attn_logit_softcapping", nullptr},
                      {"final_logit_softcapping", nullptr},
                      {"tie_word_embeddings", s.tied_embeddings},
                      {"torch_dtype", "float32"}};
  const RopeScaling& r = s.rope_scaling;
  if (r.type == RopeScalingType::kLinear) {
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
  } else if (r.type == RopeScalingType::kLlama3) {
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  return c;
}

// llama.cpp's gemma3 fixes these instead of storing them: one global block in 6, local
// RoPE base 10000, scores scaled by key_length^-1/2 (the 27B, 62 blocks: by
// (embedding_length / head_count)^-1/2, its query_pre_attn_scalar 168).
void GgufHfConfigDefaults(nlohmann::json* c) {
  (*c)["sliding_window_pattern"] = 6;
  (*c)["rope_local_base_freq"] = 10000.0;
  if (c->contains("head_dim")) (*c)["query_pre_attn_scalar"] = (*c)["head_dim"];
  const auto n = [&](const char* k) { return c->contains(k) && (*c)[k].is_number_integer() ? (*c)[k].get<int64_t>() : 0; };
  if (n("num_hidden_layers") == 62 && n("num_attention_heads") > 0) {
    (*c)["query_pre_attn_scalar"] = n("hidden_size") / n("num_attention_heads");
  }
  if (!c->contains("sliding_window")) (*c)["sliding_window"] = nullptr;
}

Status GgufExportCheck(const ModelSpec& s) {
  if (s.sliding_window_pattern != 6 || s.rope_local_theta != 10000.0 ||
      s.query_pre_attn_scalar != double(s.head_dim())) {
    return Unimplemented("GGUF gemma3 fixes sliding_window_pattern 6, rope_local_theta 10000 and "
                         "query_pre_attn_scalar = the head size; this model differs: export --format hf");
  }
  return Status::Ok();
}

}  // namespace

const FamilyInfo& Gemma3Family() {
  static const FamilyInfo kInfo{
      .family = ModelFamily::kGemma3,
      .name = "gemma3",
      .hf_architectures = {"Gemma3ForCausalLM"},
      .hf_base_prefix = "model.",
      .hf_file_prefix = "model.",
      .embedding_table = "embed_tokens.weight",
      .validate = &Validate,
      .num_params = &NumParams,
      .train_flops_per_token = &TrainFlopsPerToken,
      .build_layout = &BuildLayout,
      .init_layer = &InitLayer,
      .from_hf_config = &FromHfConfig,
      .to_hf_config = &ToHfConfig,
      .gguf_architectures = {{"gemma3", "Gemma3ForCausalLM", "gemma3_text", false}},
      .gguf_global_names = {{"token_embd", "model.embed_tokens"}, {"output_norm", "model.norm"}, {"output", "lm_head"}},
      .gguf_block_names = {{"attn_norm", "input_layernorm"},
                           {"attn_q", "self_attn.q_proj"},
                           {"attn_k", "self_attn.k_proj"},
                           {"attn_v", "self_attn.v_proj"},
                           {"attn_q_norm", "self_attn.q_norm"},
                           {"attn_k_norm", "self_attn.k_norm"},
                           {"attn_output", "self_attn.o_proj"},
                           {"post_attention_norm", "post_attention_layernorm"},
                           {"ffn_norm", "pre_feedforward_layernorm"},
                           {"post_ffw_norm", "post_feedforward_layernorm"},
                           {"ffn_gate", "mlp.gate_proj"},
                           {"ffn_up", "mlp.up_proj"},
                           {"ffn_down", "mlp.down_proj"}},
      .hf_block_prefix = "model.layers.",
      .gguf_export_architecture = [](const ModelSpec&) { return "gemma3"; },
      .gguf_norm_shift = 1.0f,
      .gguf_hf_config_defaults = &GgufHfConfigDefaults,
      .gguf_export_check = &GgufExportCheck,
  };
  return kInfo;
}

}  // namespace l2l::models
