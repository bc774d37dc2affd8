// The Llama family (Hugging Face LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM,
// Qwen3ForCausalLM; sliding windows as Mistral / Qwen2 / Qwen3 configure them;
// MixtralForCausalLM and Qwen3MoeForCausalLM: the same blocks with a mixture-of-experts
// MLP): metadata for the
// registry. Linear weights keep nn.Linear's
// layout, W (out, in), y = x @ W^T; the names are the Hugging Face ones without "model.".
//
//   0              Embedding   embed_tokens (V, C)  (no position table: RoPE)
//   1..n_layer     Block i-1   layers.i.input_layernorm (C),
//                              self_attn.{q,k,v}_proj.weight (NH*hs | NKV*hs | NKV*hs, C)
//                              [adjacent: one (W, C) matrix, W = (NH + 2 NKV) hs],
//                              self_attn.{q,k,v}_proj.bias (only with qkv_bias; adjacent),
//                              self_attn.{q,k}_norm (hs each; only with qk_norm: Qwen3),
//                              self_attn.o_proj (C, NH*hs), post_attention_layernorm (C),
//                              mlp.gate_proj (F, C), mlp.up_proj (F, C) [adjacent: (2F, C)],
//                              mlp.down_proj (C, F)
//   n_layer+1      Head        norm (C); lm_head (V, C) only when embeddings are untied.
// With num_experts = E > 0 (Mixtral) the mlp.* tensors are replaced by
//                              block_sparse_moe.gate.weight (E, C) (the router), then per
//                              expert e: block_sparse_moe.experts.e.w1.weight (F, C) (gate),
//                              .w3.weight (F, C) (up) [adjacent: (2F, C)], .w2.weight (C, F)
//                              (down); experts are contiguous, 3FC floats apart.
// Qwen3-MoE (E > 0 with qk_norm) has the same tensors under its own names: mlp.gate.weight
//                              (E, C), then per expert mlp.experts.e.gate_proj (F, C),
//                              .up_proj (F, C), .down_proj (C, F), F = moe_intermediate_size.
// The adjacency lets the kernels run q|k|v and gate|up as one product each.
//
// Thread-safety: pure functions and an immutable table entry.
#include <algorithm>
#include <cmath>

#include "common/models/family_util.h"
#include "common/models/registry.h"

namespace l2l::models {
namespace {

// The mixture-of-experts fields: all defaults without experts; 1 <= k <= E with them.
Status ValidateMoe(const ModelSpec& s) {
  const ModelSpec d;
  if (s.num_experts < 0 || s.num_experts > 4096) {
    return InvalidArgument(Field("num_experts", s.num_experts) + " must be in [0, 4096] (0: a dense MLP)");
  }
  if (s.num_experts > 0 && s.qkv_bias) {
    return InvalidArgument("model.qkv_bias with model.num_experts > 0 is not supported (Mixtral has no q/k/v biases)");
  }
  if (s.num_experts > 0 && s.sliding_window > 0) {
    return Unimplemented("model.sliding_window with model.num_experts > 0 (a windowed Mixtral or Qwen3-MoE) is "
                         "not supported yet");
  }
  if (s.num_experts == 0) {
    if (s.experts_per_token != 0 || s.norm_topk_prob != d.norm_topk_prob ||
        s.router_aux_loss_coef != d.router_aux_loss_coef || s.output_router_logits != d.output_router_logits) {
      return InvalidArgument("model.experts_per_token, norm_topk_prob, router_aux_loss_coef and output_router_logits "
                             "need model.num_experts > 0 (a mixture-of-experts model)");
    }
    return Status::Ok();
  }
  if (s.experts_per_token < 1 || s.experts_per_token > s.num_experts) {
    return InvalidArgument(Field("experts_per_token", s.experts_per_token) + " must be in [1, " +
                           Field("num_experts", s.num_experts) + "]");
  }
  if (!(s.router_aux_loss_coef >= 0) || !std::isfinite(s.router_aux_loss_coef)) {
    return InvalidArgument("model.router_aux_loss_coef=" + std::to_string(s.router_aux_loss_coef) +
                           " must be a number >= 0");
  }
  return Status::Ok();
}

Status Validate(const ModelSpec& s) {
  const int64_t kv = s.kv_heads();
  if (s.n_kv_heads < 0 || s.n_head % kv != 0) {
    return InvalidArgument(Field("n_kv_heads", s.n_kv_heads) + " must divide " + Field("n_head", s.n_head) +
                           " (0 means n_head)");
  }
  if (s.head_dim() % 2 != 0) {
    return InvalidArgument("model.d_model/n_head=" + std::to_string(s.head_dim()) +
                           " (the head size) must be even for rotary embeddings");
  }
  if (Status st = ValidateAttentionVariant(s); !st.ok()) return st;
  if (s.sliding_window_pattern != 0) {
    return InvalidArgument(Field("sliding_window_pattern", s.sliding_window_pattern) +
                           " needs model.family=gemma3 (Llama-family windows slide from max_window_layers on)");
  }
  if (s.max_window_layers > 0 && !s.qkv_bias && !s.qk_norm) {
    return InvalidArgument(Field("max_window_layers", s.max_window_layers) +
                           " needs qkv_bias or qk_norm: only Qwen2 and Qwen3 keep the first blocks global "
                           "(Mistral slides every block)");
  }
  if (Status st = RequireNoGemma3Fields(s); !st.ok()) return st;
  if (!(s.rope_theta > 0) || !std::isfinite(s.rope_theta)) {
    return InvalidArgument("model.rope_theta=" + std::to_string(s.rope_theta) + " must be a number > 0");
  }
  if (!(s.rms_norm_eps > 0) || !std::isfinite(s.rms_norm_eps)) {
    return InvalidArgument("model.rms_norm_eps=" + std::to_string(s.rms_norm_eps) + " must be a number > 0");
  }
  const RopeScaling& r = s.rope_scaling;
  if (r.type != RopeScalingType::kNone && (!(r.factor >= 1.0) || !std::isfinite(r.factor))) {
    return InvalidArgument("model.rope_scaling.factor=" + std::to_string(r.factor) + " must be >= 1");
  }
  if (r.type == RopeScalingType::kLlama3) {
    if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor)) {
      return InvalidArgument("model.rope_scaling: low_freq_factor=" + std::to_string(r.low_freq_factor) +
                             " and high_freq_factor=" + std::to_string(r.high_freq_factor) +
                             " must satisfy 0 < low_freq_factor < high_freq_factor");
    }
    if (r.original_max_position_embeddings <= 0) {
      return InvalidArgument(Field("rope_scaling.original_max_position_embeddings", r.original_max_position_embeddings) +
                             " must be positive");
    }
  }
  if (Status st = RequireNoBertFields(s); !st.ok()) return st;
  if (Status st = ValidateMoe(s); !st.ok()) return st;
  const double C = double(s.d_model), W = double(s.n_head + 2 * kv) * s.head_dim();
  const double experts = double(std::max<int64_t>(1, s.num_experts));
  const double total = double(s.vocab_size) * C * 2 +
                       double(s.n_layer) * (W * C + C * double(s.n_head) * s.head_dim() +
                                            3.0 * C * s.d_ff * experts + double(s.num_experts) * C);
  if (total > 1e15) {
    return InvalidArgument("model is too large (" + std::to_string(total) + " parameters); check model.d_model / n_layer");
  }
  return Status::Ok();
}

int64_t NumParams(const ModelSpec& s) {
  const int64_t C = s.d_model, F = s.d_ff, hs = s.head_dim(), kv = s.kv_heads();
  const int64_t W = (s.n_head + 2 * kv) * hs, q = s.n_head * hs;
  const int64_t mlp = s.moe() ? s.num_experts * (C + 3 * C * F) : 3 * C * F;  // router + experts
  const int64_t block = C + W * C + (s.qkv_bias ? W : 0) + (s.qk_norm ? 2 * hs : 0) + C * q + C + mlp;
  return s.vocab_size * C + s.n_layer * block + C + (s.tied_embeddings ? 0 : s.vocab_size * C);
}

double TrainFlopsPerToken(const ModelSpec& s, int64_t T) {
  const double C = double(s.d_model), F = double(s.d_ff), L = double(s.n_layer);
  const double W = double(s.n_head + 2 * s.kv_heads()) * double(s.head_dim());
  const double q = double(s.n_head * s.head_dim());  // = C unless head_size is set
  // A mixture of experts runs the router and k of its E experts per token.
  const double mlp = s.moe() ? double(s.num_experts) * C + double(s.experts_per_token) * 3.0 * C * F : 3.0 * C * F;
  const double matmul_params = L * (W * C + C * q + mlp) + double(s.vocab_size) * C;
  return 6.0 * matmul_params + 12.0 * L * double(T) * q;
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
    if (spec.qkv_bias) {
      AddParam(&b, h + "self_attn.q_proj.bias", {q}, false);
      AddParam(&b, h + "self_attn.k_proj.bias", {kv}, false);
      AddParam(&b, h + "self_attn.v_proj.bias", {kv}, false);
    }
    if (spec.qk_norm) {
      AddParam(&b, h + "self_attn.q_norm.weight", {hs}, false);
      AddParam(&b, h + "self_attn.k_norm.weight", {hs}, false);
    }
    AddParam(&b, h + "self_attn.o_proj.weight", {C, q}, true);
    AddParam(&b, h + "post_attention_layernorm.weight", {C}, false);
    if (spec.moe()) {
      const MoeNames n = MoeTensorNames(spec);
      const std::string m = h + n.prefix;
      AddParam(&b, m + "gate.weight", {spec.num_experts, C}, true);
      for (int64_t e = 0; e < spec.num_experts; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        AddParam(&b, x + n.gate + ".weight", {F, C}, true);
        AddParam(&b, x + n.up + ".weight", {F, C}, true);
        AddParam(&b, x + n.down + ".weight", {C, F}, true);
      }
    } else {
      AddParam(&b, h + "mlp.gate_proj.weight", {F, C}, true);
      AddParam(&b, h + "mlp.up_proj.weight", {F, C}, true);
      AddParam(&b, h + "mlp.down_proj.weight", {C, F}, true);
    }
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

std::vector<LoraTarget> LoraTargetsOf(const ModelSpec& spec) {
  const int64_t C = spec.d_model, F = spec.d_ff, hs = spec.head_dim();
  const int64_t q = spec.n_head * hs, kv = spec.kv_heads() * hs;
  return {{"q_proj", "self_attn.q_proj.weight", C, q},   {"k_proj", "self_attn.k_proj.weight", C, kv},
          {"v_proj", "self_attn.v_proj.weight", C, kv},  {"o_proj", "self_attn.o_proj.weight", q, C},
          {"gate_proj", "mlp.gate_proj.weight", C, F},   {"up_proj", "mlp.up_proj.weight", C, F},
          {"down_proj", "mlp.down_proj.weight", F, C}};
}

void InitLayer(const ModelSpec&, const LayerLayout& layout, uint64_t seed, float* out) {
  const uint64_t layer_key = LayerKey(seed, layout.index);
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const ParamInfo& p = layout.params[k];
    float* dst = out + p.offset;
    if (EndsWith(p.name, "norm.weight")) {
      for (size_t i = 0; i < p.numel; ++i) dst[i] = 1.0f;
    } else if (p.shape.size() == 1) {  // q/k/v biases
      for (size_t i = 0; i < p.numel; ++i) dst[i] = 0.0f;
    } else {
      FillNormal(TensorKey(layer_key, k), 0.02f, dst, p.numel);
    }
  }
}

Result<ModelSpec> FromHfConfig(const nlohmann::json& c, const std::string& origin) {
  const std::string arch = c["architectures"][0].get<std::string>();
  ModelSpec s;
  s.family = ModelFamily::kLlama;
  s.tied_embeddings = false;  // the default of LlamaConfig, Qwen2Config and MistralConfig
  L2L_RETURN_IF_ERROR(HfField(c, origin, "vocab_size", &s.vocab_size, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "max_position_embeddings", &s.seq_len, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "hidden_size", &s.d_model, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "num_hidden_layers", &s.n_layer, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "num_attention_heads", &s.n_head, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "intermediate_size", &s.d_ff, true));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "num_key_value_heads", &s.n_kv_heads, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "rope_theta", &s.rope_theta, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "rms_norm_eps", &s.rms_norm_eps, false));
  L2L_RETURN_IF_ERROR(HfField(c, origin, "tie_word_embeddings", &s.tied_embeddings, false));
  std::string act = "silu";
  L2L_RETURN_IF_ERROR(HfField(c, origin, "hidden_act", &act, false));
  if (act != "silu") return InvalidArgument(origin + ": hidden_act=" + act + " is not supported (SwiGLU needs silu)");
  if (s.n_head > 0) {
    int64_t head_dim = 0;
    L2L_RETURN_IF_ERROR(HfField(c, origin, "head_dim", &head_dim, false));
    // Set only when it differs from hidden_size/num_attention_heads (0 means that).
    if (head_dim > 0 && (s.d_model % s.n_head != 0 || head_dim != s.d_model / s.n_head)) s.head_size = head_dim;
  }
  const bool qwen3 = arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM";
  if (arch == "Qwen2ForCausalLM" || qwen3) {
    s.qkv_bias = arch == "Qwen2ForCausalLM";  // Qwen2's q/k/v projections always have biases
    s.qk_norm = qwen3;                        // Qwen3 (and Qwen3-MoE) normalises every q and k head
    if (s.qk_norm) {
      bool bias = false;
      L2L_RETURN_IF_ERROR(HfField(c, origin, "attention_bias", &bias, false));
      if (bias) return InvalidArgument(origin + ": attention_bias=true is not supported (Qwen3 then biases o_proj too)");
    }
    // transformers 4.57: sliding_window applies when use_sliding_window, to the blocks
    // i >= max_window_layers (layer_types "sliding_attention").
    bool window = false;
    L2L_RETURN_IF_ERROR(HfField(c, origin, "use_sliding_window", &window, false));
    if (window) {
      s.sliding_window = 4096;  // Qwen2Config's / Qwen3Config's defaults
      s.max_window_layers = 28;
      L2L_RETURN_IF_ERROR(HfField(c, origin, "sliding_window", &s.sliding_window, false));
      L2L_RETURN_IF_ERROR(HfField(c, origin, "max_window_layers", &s.max_window_layers, false));
      if (s.sliding_window <= 0) {
        return InvalidArgument(origin + ": use_sliding_window=true with sliding_window=" +
                               std::to_string(s.sliding_window) + " (must be > 0)");
      }
      if (s.max_window_layers >= s.n_layer) s.max_window_layers = 0, s.sliding_window = 0;  // no block slides
    }
  } else {
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      bool bias = false;
      L2L_RETURN_IF_ERROR(HfField(c, origin, key, &bias, false));
      if (bias) return InvalidArgument(origin + ": " + key + "=true is not supported (Llama layers have no such biases)");
    }
  }
  if (arch == "MixtralForCausalLM") {
    L2L_RETURN_IF_ERROR(HfField(c, origin, "num_local_experts", &s.num_experts, true));
    L2L_RETURN_IF_ERROR(HfField(c, origin, "num_experts_per_tok", &s.experts_per_token, true));
    L2L_RETURN_IF_ERROR(HfField(c, origin, "router_aux_loss_coef", &s.router_aux_loss_coef, false));
    L2L_RETURN_IF_ERROR(HfField(c, origin, "output_router_logits", &s.output_router_logits, false));
    double jitter = 0.0;
    L2L_RETURN_IF_ERROR(HfField(c, origin, "router_jitter_noise", &jitter, false));
    if (jitter != 0.0) {
      return InvalidArgument(origin + ": router_jitter_noise=" + std::to_string(jitter) +
                             " is not supported (the router has no input noise in l2l)");
    }
    if (s.num_experts <= 0) return InvalidArgument(origin + ": num_local_experts must be positive");
  }
  if (arch == "Qwen3MoeForCausalLM") {
    // transformers 4.57 Qwen3MoeConfig: every block sparse when decoder_sparse_step is 1 and
    // mlp_only_layers is empty (the only layout l2l models); experts moe_intermediate_size wide.
    L2L_RETURN_IF_ERROR(HfField(c, origin, "num_experts", &s.num_experts, true));
    L2L_RETURN_IF_ERROR(HfField(c, origin, "num_experts_per_tok", &s.experts_per_token, true));
    L2L_RETURN_IF_ERROR(HfField(c, origin, "moe_intermediate_size", &s.d_ff, true));
    s.norm_topk_prob = false;  // Qwen3MoeConfig's default
    L2L_RETURN_IF_ERROR(HfField(c, origin, "norm_topk_prob", &s.norm_topk_prob, false));
    L2L_RETURN_IF_ERROR(HfField(c, origin, "router_aux_loss_coef", &s.router_aux_loss_coef, false));
    L2L_RETURN_IF_ERROR(HfField(c, origin, "output_router_logits", &s.output_router_logits, false));
    int64_t step = 1;
    L2L_RETURN_IF_ERROR(HfField(c, origin, "decoder_sparse_step", &step, false));
    if (step != 1) {
      return InvalidArgument(origin + ": decoder_sparse_step=" + std::to_string(step) +
                             " is not supported (every block must be sparse: 1)");
    }
    if (const auto m = c.find("mlp_only_layers"); m != c.end() && !m->is_null() && !(m->is_array() && m->empty())) {
      return InvalidArgument(origin + ": mlp_only_layers=" + m->dump() +
                             " is not supported (every block must be sparse: [])");
    }
    if (s.num_experts <= 0) return InvalidArgument(origin + ": num_experts must be positive");
  }
  if (arch == "MixtralForCausalLM") {
    int64_t window = 0;
    L2L_RETURN_IF_ERROR(HfField(c, origin, "sliding_window", &window, false));
    if (window > 0 && window < s.seq_len) {
      return InvalidArgument(origin + ": sliding_window=" + std::to_string(window) + " < max_position_embeddings=" +
                             std::to_string(s.seq_len) + ": sliding-window attention is not supported");
    }
  }
  if (arch == "MistralForCausalLM") {
    // Every Mistral block slides (transformers 4.57 MistralAttention).
    L2L_RETURN_IF_ERROR(HfField(c, origin, "sliding_window", &s.sliding_window, false));
    if (s.sliding_window < 0) {
      return InvalidArgument(origin + ": sliding_window=" + std::to_string(s.sliding_window) + " must be > 0 or null");
    }
  }
  // A window as long as the context changes nothing: left out, so such a spec stays
  // what it was (Mistral 7B v0.2+ configs: null; v0.1: 4096 of 32768).
  if (s.sliding_window >= s.seq_len) s.sliding_window = 0, s.max_window_layers = 0;
  // transformers >= 4.57 also writes the per-block kinds: they must be what the fields give.
  if (const auto lt = c.find("layer_types"); lt != c.end() && !lt->is_null()) {
    if (!lt->is_array() || int64_t(lt->size()) != s.n_layer) {
      return InvalidArgument(origin + ": layer_types is not a list of num_hidden_layers entries");
    }
    for (int64_t i = 0; i < s.n_layer; ++i) {
      const std::string want = s.SlidingBlock(i) ? "sliding_attention" : "full_attention";
      const nlohmann::json& e = (*lt)[size_t(i)];
      // A window >= the context is full attention whatever the entry says.
      if (!e.is_string() || (e.get<std::string>() != want && !(s.sliding_window == 0 && e == "sliding_attention"))) {
        return InvalidArgument(origin + ": layer_types[" + std::to_string(i) + "]=" + e.dump() + " but the config's " +
                               "sliding_window / use_sliding_window / max_window_layers give " + want +
                               " (per-block patterns other than those are not supported)");
      }
    }
  }
  const auto rs = c.find("rope_scaling");
  if (rs != c.end() && !rs->is_null()) {
    if (!rs->is_object()) return InvalidArgument(origin + ": rope_scaling=" + rs->dump() + " is not an object");
    std::string type;
    L2L_RETURN_IF_ERROR(HfField(*rs, origin + " rope_scaling", "type", &type, false));
    L2L_RETURN_IF_ERROR(HfField(*rs, origin + " rope_scaling", "rope_type", &type, false));
    if (type != "default") {
      Result<RopeScalingType> t = ParseRopeScalingType(type);
      if (!t.ok() || *t == RopeScalingType::kNone) {
        return InvalidArgument(origin + ": rope_scaling type '" + type + "' is not supported (linear, llama3)");
      }
      RopeScaling& r = s.rope_scaling;
      r.type = *t;
      L2L_RETURN_IF_ERROR(HfField(*rs, origin + " rope_scaling", "factor", &r.factor, true));
      if (r.type == RopeScalingType::kLlama3) {
        L2L_RETURN_IF_ERROR(HfField(*rs, origin + " rope_scaling", "low_freq_factor", &r.low_freq_factor, true));
        L2L_RETURN_IF_ERROR(HfField(*rs, origin + " rope_scaling", "high_freq_factor", &r.high_freq_factor, true));
        L2L_RETURN_IF_ERROR(HfField(*rs, origin + " rope_scaling", "original_max_position_embeddings",
                                    &r.original_max_position_embeddings, true));
      }
    }
  }
  if (Status st = s.Validate(); !st.ok()) return st.WithContext(origin);
  return s;
}

// The Hugging Face class of a spec: Mixtral (experts), Qwen3 (q/k norms), Qwen2 (q/k/v biases), Mistral (a
// sliding window in every block), else Llama.
const char* HfArchitecture(const ModelSpec& s) {
  if (s.moe()) return s.qk_norm ? "Qwen3MoeForCausalLM" : "MixtralForCausalLM";
  if (s.qk_norm) return "Qwen3ForCausalLM";
  if (s.qkv_bias) return "Qwen2ForCausalLM";
  return s.sliding_window > 0 ? "MistralForCausalLM" : "LlamaForCausalLM";
}

nlohmann::json ToHfConfig(const ModelSpec& s) {
  const std::string arch = HfArchitecture(s);
  const char* model_type = arch == "Qwen3ForCausalLM"   ? "qwen3"
                           : arch == "Qwen2ForCausalLM" ? "qwen2"
                           : arch == "MistralForCausalLM" ? "mistral"
                           : arch == "MixtralForCausalLM" ? "mixtral"
                           : arch == "Qwen3MoeForCausalLM" ? "qwen3_moe"
                                                          : "llama";
  nlohmann::json c = {{"architectures", {arch}},
                      {"model_type", model_type},
                      {"vocab_size", s.vocab_size},
                      {"max_position_embeddings", s.seq_len},
                      {"hidden_size", s.d_model},
                      {"intermediate_size", s.d_ff},
                      {"num_hidden_layers", s.n_layer},
                      {"num_attention_heads", s.n_head},
                      {"num_key_value_heads", s.kv_heads()},
                      {"head_dim", s.head_dim()},
                      {"hidden_act", "silu"},
                      {"rms_norm_eps", s.rms_norm_eps},
                      {"rope_theta", s.rope_theta},
                      {"attention_dropout", 0.0},
                      {"tie_word_embeddings", s.tied_embeddings},
                      {"torch_dtype", "float32"}};
  if (s.moe() && s.qk_norm) {  // Qwen3MoeConfig
    c["num_experts"] = s.num_experts;
    c["num_experts_per_tok"] = s.experts_per_token;
    c["moe_intermediate_size"] = s.d_ff;
    c["norm_topk_prob"] = s.norm_topk_prob;
    c["router_aux_loss_coef"] = s.router_aux_loss_coef;
    c["output_router_logits"] = s.output_router_logits;
    c["decoder_sparse_step"] = 1;
    c["mlp_only_layers"] = nlohmann::json::array();
    c["attention_bias"] = false;
    c["use_sliding_window"] = false;
    c["sliding_window"] = nullptr;
  } else if (s.moe()) {
    c["num_local_experts"] = s.num_experts;
    c["num_experts_per_tok"] = s.experts_per_token;
    c["router_aux_loss_coef"] = s.router_aux_loss_coef;
    c["output_router_logits"] = s.output_router_logits;
    c["router_jitter_noise"] = 0.0;
    c["sliding_window"] = nullptr;
  } else if (s.qkv_bias || s.qk_norm) {
    c["use_sliding_window"] = s.sliding_window > 0;
    if (s.sliding_window > 0) {
      c["sliding_window"] = s.sliding_window;
      c["max_window_layers"] = s.max_window_layers;
    }
    if (s.qk_norm) c["attention_bias"] = false;
    if (s.qk_norm || s.sliding_window > 0) {  // as transformers 4.57 writes them (older ones ignore them)
      nlohmann::json types = nlohmann::json::array();
      for (int64_t i = 0; i < s.n_layer; ++i) types.push_back(s.SlidingBlock(i) ? "sliding_attention" : "full_attention");
      c["layer_types"] = types;
    }
  } else {
    if (s.sliding_window > 0) c["sliding_window"] = s.sliding_window;
    if (arch == "LlamaForCausalLM") {
      c["attention_bias"] = false;
      c["mlp_bias"] = false;
    }
  }
  const RopeScaling& r = s.rope_scaling;
  switch (r.type) {
    case RopeScalingType::kNone:
      c["rope_scaling"] = nullptr;
      break;
    case RopeScalingType::kLinear:
      c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
      break;
    case RopeScalingType::kLlama3:
      c["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", r.factor},
                           {"low_freq_factor", r.low_freq_factor},
                           {"high_freq_factor", r.high_freq_factor},
                           {"original_max_position_embeddings", r.original_max_position_embeddings}};
      break;
  }
  return c;
}

Status GgufExportCheck(const ModelSpec& s) {
  if (s.sliding_window > 0) {
    return Unimplemented("a sliding window has no GGUF form in l2l's writer and reader for the llama family; "
                         "export --format hf");
  }
  return Status::Ok();
}

}  // namespace

const FamilyInfo& LlamaFamily() {
  static const FamilyInfo kInfo{
      .family = ModelFamily::kLlama,
      .name = "llama",
      .hf_architectures = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM",
                           "MixtralForCausalLM", "Qwen3MoeForCausalLM"},
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
      // llama.cpp's converter permutes q/k rows for "llama" (Llama, SmolLM); l2l reads
      // "mistral" files unpermuted, as it always has, and Qwen2 is not permuted.
      .gguf_architectures = {{"llama", "LlamaForCausalLM", "llama", true},
                             {"mistral", "LlamaForCausalLM", "llama", false},
                             {"qwen2", "Qwen2ForCausalLM", "qwen2", false},
                             {"qwen3", "Qwen3ForCausalLM", "qwen3", false}},
      .gguf_global_names = {{"token_embd", "model.embed_tokens"}, {"output_norm", "model.norm"}, {"output", "lm_head"}},
      .gguf_block_names = {{"attn_norm", "input_layernorm"},      {"attn_q", "self_attn.q_proj"},
                           {"attn_k", "self_attn.k_proj"},        {"attn_v", "self_attn.v_proj"},
                           {"attn_output", "self_attn.o_proj"},   {"ffn_norm", "post_attention_layernorm"},
                           {"ffn_gate", "mlp.gate_proj"},         {"ffn_up", "mlp.up_proj"},
                           {"ffn_down", "mlp.down_proj"},         {"attn_q_norm", "self_attn.q_norm"},
                           {"attn_k_norm", "self_attn.k_norm"}},
      .hf_block_prefix = "model.layers.",
      // No GGUF export of a mixture of experts (llama.cpp stacks the experts in 3-D tensors).
      .gguf_export_architecture = [](const ModelSpec& s) -> const char* {
        return s.moe() ? nullptr : s.qk_norm ? "qwen3" : s.qkv_bias ? "qwen2" : "llama";
      },
      .gguf_export_check = &GgufExportCheck,
      .lora_targets = &LoraTargetsOf,
  };
  return kInfo;
}

}  // namespace l2l::models
