// The GPT-2 family (Hugging Face GPT2LMHeadModel): metadata for the registry.
//
//   0              Embedding   wte (V, C), wpe (T, C)
//   1..n_layer     Block i-1   ln_1, attn.c_attn (C, 3C), attn.c_proj (C, C), ln_2,
//                              mlp.c_fc (C, F), mlp.c_proj (F, C)  (Hugging Face Conv1D
//                              layout: y = x @ W + b, W stored (in, out))
//   n_layer+1      Head        ln_f; lm_head (V, C) only when embeddings are untied.
//
// Thread-safety: pure functions and an immutable table entry.
#include <cmath>

#include "common/models/family_util.h"
#include "common/models/registry.h"

namespace l2l::models {
namespace {

Status Validate(const ModelSpec& s) {
  if (s.n_kv_heads != 0 && s.n_kv_heads != s.n_head) {
    return InvalidArgument(Field("n_kv_heads", s.n_kv_heads) + " needs model.family=llama (GPT-2 has no grouped-query attention)");
  }
  if (s.qkv_bias) return InvalidArgument("model.qkv_bias=true needs model.family=llama (GPT-2 always has biases)");
  if (s.rope_scaling.type != RopeScalingType::kNone) {
    return InvalidArgument("model.rope_scaling needs model.family=llama (GPT-2 has learned positions)");
  }
  if (Status st = RequireNoBertFields(s); !st.ok()) return st;
  if (Status st = RequireNoAttentionVariantFields(s, "GPT-2"); !st.ok()) return st;
  if (Status st = RequireNoGemma3Fields(s); !st.ok()) return st;
  const double total = static_cast<double>(s.vocab_size) * s.d_model * 2 + static_cast<double>(s.seq_len) * s.d_model +
                       static_cast<double>(s.n_layer) * (12.0 * s.d_model * s.d_model + 2.0 * s.d_model * s.d_ff);
  if (total > 1e15) {
    return InvalidArgument("model is too large (" + std::to_string(total) + " parameters); check model.d_model / n_layer");
  }
  return Status::Ok();
}

int64_t NumParams(const ModelSpec& s) {
  const int64_t C = s.d_model, F = s.d_ff;
  const int64_t embedding = s.vocab_size * C + s.seq_len * C;
  const int64_t block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * F + F) + (F * C + C);
  const int64_t head = 2 * C + (s.tied_embeddings ? 0 : s.vocab_size * C);
  return embedding + s.n_layer * block + head;
}

double TrainFlopsPerToken(const ModelSpec& s, int64_t T) {
  const double C = double(s.d_model), F = double(s.d_ff), L = double(s.n_layer);
  const double matmul_params = L * (4.0 * C * C + 2.0 * C * F) + double(s.vocab_size) * C;
  return 6.0 * matmul_params + 12.0 * L * double(T) * C;
}

std::vector<LayerLayout> BuildLayout(const ModelSpec& spec) {
  const int64_t V = spec.vocab_size, T = spec.seq_len, C = spec.d_model, F = spec.d_ff;
  std::vector<LayerLayout> layers;
  layers.reserve(static_cast<size_t>(spec.NumLayers()));

  LayerLayout emb;
  emb.kind = LayerKind::kEmbedding;
  emb.index = 0;
  AddParam(&emb, "wte.weight", {V, C}, true);
  AddParam(&emb, "wpe.weight", {T, C}, true);
  layers.push_back(std::move(emb));

  for (int64_t i = 0; i < spec.n_layer; ++i) {
    LayerLayout b;
    b.kind = LayerKind::kBlock;
    b.index = i + 1;
    b.block = i;
    const std::string h = "h." + std::to_string(i) + ".";
    AddParam(&b, h + "ln_1.weight", {C}, false);
    AddParam(&b, h + "ln_1.bias", {C}, false);
    AddParam(&b, h + "attn.c_attn.weight", {C, 3 * C}, true);
    AddParam(&b, h + "attn.c_attn.bias", {3 * C}, false);
    AddParam(&b, h + "attn.c_proj.weight", {C, C}, true);
    AddParam(&b, h + "attn.c_proj.bias", {C}, false);
    AddParam(&b, h + "ln_2.weight", {C}, false);
    AddParam(&b, h + "ln_2.bias", {C}, false);
    AddParam(&b, h + "mlp.c_fc.weight", {C, F}, true);
    AddParam(&b, h + "mlp.c_fc.bias", {F}, false);
    AddParam(&b, h + "mlp.c_proj.weight", {F, C}, true);
    AddParam(&b, h + "mlp.c_proj.bias", {C}, false);
    layers.push_back(std::move(b));
  }

  LayerLayout head;
  head.kind = LayerKind::kHead;
  head.index = spec.n_layer + 1;
  AddParam(&head, "ln_f.weight", {C}, false);
  AddParam(&head, "ln_f.bias", {C}, false);
  if (!spec.tied_embeddings) AddParam(&head, "lm_head.weight", {V, C}, true);
  layers.push_back(std::move(head));
  return layers;
}

// Conv1D weights are (in, out); PEFT's adapters are A (r, in), B (out, r) all the same.
// "c_proj" is both attn.c_proj and mlp.c_proj (PEFT matches the name's end).
std::vector<LoraTarget> LoraTargetsOf(const ModelSpec& spec) {
  const int64_t C = spec.d_model, F = spec.d_ff;
  return {{"c_attn", "attn.c_attn.weight", C, 3 * C},
          {"c_proj", "attn.c_proj.weight", C, C},
          {"c_fc", "mlp.c_fc.weight", C, F},
          {"c_proj", "mlp.c_proj.weight", F, C}};
}

void InitLayer(const ModelSpec& spec, const LayerLayout& layout, uint64_t seed, float* out) {
  const float kStd = 0.02f;
  const float proj_std = kStd / static_cast<float>(std::sqrt(2.0 * static_cast<double>(spec.n_layer)));
  const uint64_t layer_key = LayerKey(seed, layout.index);
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const ParamInfo& p = layout.params[k];
    float* dst = out + p.offset;
    const bool is_ln_weight = EndsWith(p.name, "ln_1.weight") || EndsWith(p.name, "ln_2.weight") ||
                              p.name == "ln_f.weight";
    if (is_ln_weight) {
      for (size_t i = 0; i < p.numel; ++i) dst[i] = 1.0f;
    } else if (p.shape.size() == 1) {  // biases
      for (size_t i = 0; i < p.numel; ++i) dst[i] = 0.0f;
    } else {
      const bool residual_proj = EndsWith(p.name, "c_proj.weight");
      FillNormal(TensorKey(layer_key, k), residual_proj ? proj_std : kStd, dst, p.numel);
    }
  }
}

Result<ModelSpec> FromHfConfig(const nlohmann::json& c, const std::string& origin) {
  ModelSpec s;
  s.family = ModelFamily::kGpt2;
  L2L_RETURN_IF_ERROR(HfField(c, origin, "vocab_size", &s.vocab_size, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "n_positions", &s.seq_len, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "n_embd", &s.d_model, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "n_layer", &s.n_layer, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "n_head", &s.n_head, true));
  s.d_ff = 4 * s.d_model;
  L2L_RETURN_IF_ERROR(HfField(c, origin, "n_inner", &s.d_ff, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "tie_word_embeddings", &s.tied_embeddings, false));
  std::string act = "gelu_new";
  L2L_RETURN_IF_ERROR(HfField(c, origin, "activation_function", &act, false));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return InvalidArgument(origin + ": activation_function=" + act + " is not supported (l2l's GPT-2 uses the tanh GELU, gelu_new)");
  }
  double eps = 1e-5;
  L2L_RETURN_IF_ERROR(HfField(c, origin, "layer_norm_epsilon", &eps, false));
  if (eps != 1e-5) {
    return InvalidArgument(origin + ": layer_norm_epsilon=" + std::to_string(eps) + " is not supported (l2l's GPT-2 uses 1e-5)");
  }
  if (Status st = s.Validate(); !st.ok()) return st.WithContext(origin);
  return s;
}

nlohmann::json ToHfConfig(const ModelSpec& s) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", s.vocab_size},
          {"n_positions", s.seq_len},
          {"n_ctx", s.seq_len},
          {"n_embd", s.d_model},
          {"n_layer", s.n_layer},
          {"n_head", s.n_head},
          {"n_inner", s.d_ff},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"tie_word_embeddings", s.tied_embeddings},
          {"torch_dtype", "float32"}};
}

}  // namespace

const FamilyInfo& Gpt2Family() {
  static const FamilyInfo kInfo{
      .family = ModelFamily::kGpt2,
      .name = "gpt2",
      .hf_architectures = {"GPT2LMHeadModel"},
      .hf_base_prefix = "transformer.",
      .hf_file_prefix = "",
      .embedding_table = "wte.weight",
      .validate = &Validate,
      .num_params = &NumParams,
      .train_flops_per_token = &TrainFlopsPerToken,
      .build_layout = &BuildLayout,
      .init_layer = &InitLayer,
      .from_hf_config = &FromHfConfig,
      .to_hf_config = &ToHfConfig,
      // Non-parameter attention buffers (causal masks) in older hub checkpoints.
      .hf_ignored_suffixes = {".attn.bias", ".attn.masked_bias"},
      .hf_weights_in_out = true,  // Conv1D
      .lora_targets = &LoraTargetsOf,
  };
  return kInfo;
}

}  // namespace l2l::models
