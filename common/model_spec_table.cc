// The ModelSpec field table and the readers/writers it drives. See
// common/model_spec_table.h.
#include "common/model_spec_table.h"

#include <charconv>
#include <cstdio>
#include <map>

#include "common/json_util.h"

namespace l2l {
namespace {

using json = nlohmann::json;

constexpr uint32_t kLlama = FamilyBit(ModelFamily::kLlama);
constexpr uint32_t kBert = FamilyBit(ModelFamily::kBert);
constexpr uint32_t kGemma3 = FamilyBit(ModelFamily::kGemma3);
constexpr uint32_t kRope = kLlama | kGemma3;  // the rotary-embedding decoders
constexpr IntRange kPositive{.min = 1};
constexpr IntRange kNonNegative{.min = 0};
constexpr FloatRange kAboveZero{.min = 0, .min_exclusive = true};
constexpr IntRange kAnyInt{};
constexpr FloatRange kAnyFloat{};

#define L2L_MEMBER(path) [](ModelSpec* s) -> void* { return &s->path; }

// One row per field. Columns: key, type, families, member, int bounds, float bounds,
// json_required, json_omit_default, group_selector, effective, HF config.json attribute, GGUF
// "<arch>." key, doc.
const std::vector<SpecField> kSpecFields = {
    {"family", SpecType::kFamily, kEveryFamily, L2L_MEMBER(family), kAnyInt, kAnyFloat, false, true, false, nullptr,
     "architectures[0]", "general.architecture", "the model family: gpt2 | llama | bert"},
    {"vocab_size", SpecType::kInt, kEveryFamily, L2L_MEMBER(vocab_size), kPositive, kAnyFloat, true, false, false,
     nullptr, "vocab_size", "vocab_size", "V: token ids are in [0, V)"},
    {"seq_len", SpecType::kInt, kEveryFamily, L2L_MEMBER(seq_len), kPositive, kAnyFloat, true, false, false, nullptr,
     "max_position_embeddings", "context_length", "T: the maximum context length"},
    {"d_model", SpecType::kInt, kEveryFamily, L2L_MEMBER(d_model), kPositive, kAnyFloat, true, false, false, nullptr,
     "hidden_size", "embedding_length", "C: the residual width"},
    {"n_layer", SpecType::kInt, kEveryFamily, L2L_MEMBER(n_layer), kPositive, kAnyFloat, true, false, false, nullptr,
     "num_hidden_layers", "block_count", "transformer blocks"},
    {"n_head", SpecType::kInt, kEveryFamily, L2L_MEMBER(n_head), kPositive, kAnyFloat, true, false, false, nullptr,
     "num_attention_heads", "attention.head_count", "attention (query) heads; divides d_model"},
    {"d_ff", SpecType::kInt, kEveryFamily, L2L_MEMBER(d_ff), kPositive, kAnyFloat, true, false, false, nullptr,
     "intermediate_size", "feed_forward_length", "F: the MLP's hidden width"},
    {"tied_embeddings", SpecType::kBool, kEveryFamily, L2L_MEMBER(tied_embeddings), kAnyInt, kAnyFloat, true, false,
     false, nullptr, "tie_word_embeddings", "", "the head reads the embedding matrix (GGUF: no output.weight)"},
    {"n_kv_heads", SpecType::kInt, kRope, L2L_MEMBER(n_kv_heads), kNonNegative, kAnyFloat, false, false, false,
     [](const ModelSpec& s) { return s.kv_heads(); }, "num_key_value_heads", "attention.head_count_kv",
     "key/value heads of grouped-query attention; 0 = n_head"},
    {"rope_theta", SpecType::kFloat, kRope, L2L_MEMBER(rope_theta), kAnyInt, kAboveZero, false, false, false, nullptr,
     "rope_theta", "rope.freq_base", "the RoPE base"},
    {"rms_norm_eps", SpecType::kFloat, kRope, L2L_MEMBER(rms_norm_eps), kAnyInt, kAboveZero, false, false, false,
     nullptr, "rms_norm_eps", "attention.layer_norm_rms_epsilon", "RMSNorm epsilon"},
    {"qkv_bias", SpecType::kBool, kLlama, L2L_MEMBER(qkv_bias), kAnyInt, kAnyFloat, false, false, false, nullptr,
     "attention_bias", "", "q/k/v projections have biases (Qwen2; GGUF: a blk.0.attn_q.bias tensor)"},
    {"num_experts", SpecType::kInt, kLlama, L2L_MEMBER(num_experts), kNonNegative, kAnyFloat, false, true, false,
     nullptr, "num_local_experts", "expert_count", "mixture of experts: E experts per block; 0 = a dense MLP"},
    {"experts_per_token", SpecType::kInt, kLlama, L2L_MEMBER(experts_per_token), kNonNegative, kAnyFloat, false, true,
     false, nullptr, "num_experts_per_tok", "expert_used_count", "mixture of experts: k experts run per token"},
    {"norm_topk_prob", SpecType::kBool, kLlama, L2L_MEMBER(norm_topk_prob), kAnyInt, kAnyFloat, false, true, false,
     nullptr, "norm_topk_prob", "", "mixture of experts: renormalise the top-k router weights to sum 1"},
    {"router_aux_loss_coef", SpecType::kFloat, kLlama, L2L_MEMBER(router_aux_loss_coef), kAnyInt,
     FloatRange{.min = 0}, false, true, false, nullptr, "router_aux_loss_coef", "",
     "mixture of experts: weight of the load-balancing loss"},
    {"output_router_logits", SpecType::kBool, kLlama, L2L_MEMBER(output_router_logits), kAnyInt, kAnyFloat, false,
     true, false, nullptr, "output_router_logits", "", "mixture of experts: add the load-balancing loss"},
    {"rope_scaling.type", SpecType::kRopeType, kRope, L2L_MEMBER(rope_scaling.type), kAnyInt, kAnyFloat, false, false,
     true, nullptr, "rope_scaling.rope_type", "rope.scaling.type", "none | linear | llama3"},
    {"rope_scaling.factor", SpecType::kFloat, kRope, L2L_MEMBER(rope_scaling.factor), kAnyInt, FloatRange{.min = 1},
     false, false, false, nullptr, "rope_scaling.factor", "rope.scaling.factor", "context extension factor (>= 1)"},
    {"rope_scaling.low_freq_factor", SpecType::kFloat, kRope, L2L_MEMBER(rope_scaling.low_freq_factor), kAnyInt,
     kAboveZero, false, false, false, nullptr, "rope_scaling.low_freq_factor", "", "llama3 scaling"},
    {"rope_scaling.high_freq_factor", SpecType::kFloat, kRope, L2L_MEMBER(rope_scaling.high_freq_factor), kAnyInt,
     kAboveZero, false, false, false, nullptr, "rope_scaling.high_freq_factor", "", "llama3 scaling"},
    {"rope_scaling.original_max_position_embeddings", SpecType::kInt, kRope,
     L2L_MEMBER(rope_scaling.original_max_position_embeddings), kPositive, kAnyFloat, false, false, false, nullptr,
     "rope_scaling.original_max_position_embeddings", "rope.scaling.original_context_length",
     "llama3: the pre-extension context length"},
    {"head_size", SpecType::kInt, kRope, L2L_MEMBER(head_size), kNonNegative, kAnyFloat, false, false, false,
     nullptr, "head_dim", "attention.key_length",
     "attention head size; 0 = d_model / n_head", true},
    {"qk_norm", SpecType::kBool, kRope, L2L_MEMBER(qk_norm), kAnyInt, kAnyFloat, false, false, false, nullptr, "", "",
     "RMSNorm over each q and k head before RoPE (Qwen3; Gemma 3 always)", true},
    {"sliding_window", SpecType::kInt, kRope, L2L_MEMBER(sliding_window), kNonNegative, kAnyFloat, false, false, false,
     nullptr, "sliding_window", "attention.sliding_window",
     "sliding blocks: query i sees keys (i - sliding_window, i]; 0 = none", true},
    {"max_window_layers", SpecType::kInt, kRope, L2L_MEMBER(max_window_layers), kNonNegative, kAnyFloat, false, false,
     false, nullptr, "max_window_layers", "", "blocks below this index never slide (Qwen2)", true},
    {"sliding_window_pattern", SpecType::kInt, kRope, L2L_MEMBER(sliding_window_pattern), kNonNegative, kAnyFloat,
     false, false, false, nullptr, "sliding_window_pattern", "",
     "> 0: every pattern-th block is global, the others slide (Gemma 3: 6)", true},
    {"rope_local_theta", SpecType::kFloat, kGemma3, L2L_MEMBER(rope_local_theta), kAnyInt, kAboveZero, false, false,
     false, nullptr, "rope_local_base_freq", "", "Gemma 3: the RoPE base of the sliding blocks", true},
    {"query_pre_attn_scalar", SpecType::kFloat, kGemma3, L2L_MEMBER(query_pre_attn_scalar), kAnyInt, kAboveZero, false,
     false, false, nullptr, "query_pre_attn_scalar", "", "Gemma 3: attention scores scaled by its -1/2",
     true},
    {"type_vocab_size", SpecType::kInt, kBert, L2L_MEMBER(type_vocab_size), kPositive, kAnyFloat, false, false, false,
     nullptr, "type_vocab_size", "", "rows of the token-type (segment) embedding"},
    {"layer_norm_eps", SpecType::kFloat, kBert, L2L_MEMBER(layer_norm_eps), kAnyInt, kAboveZero, false, false, false,
     nullptr, "layer_norm_eps", "attention.layer_norm_epsilon", "every LayerNorm's epsilon"},
    {"num_labels", SpecType::kInt, kBert, L2L_MEMBER(num_labels), kNonNegative, kAnyFloat, false, false, false, nullptr,
     "num_labels", "", "0 = masked-LM head; > 0 = sequence classification into that many classes"},
};

#undef L2L_MEMBER

template <typename T>
T& At(ModelSpec* s, const SpecField& f) {
  return *static_cast<T*>(f.member(s));
}
template <typename T>
const T& At(const ModelSpec& s, const SpecField& f) {
  return *static_cast<const T*>(f.member(const_cast<ModelSpec*>(&s)));
}

std::string Fmt(double v) {
  char b[64];
  std::snprintf(b, sizeof(b), "%.17g", v);
  return b;
}

// Shortest round-trip text (YAML output).
std::string Shortest(double v) {
  char buf[64];
  const auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, ec == std::errc() ? ptr : buf);
}

// The fields of one top-level key (one field, or a group's fields).
std::vector<const SpecField*> FieldsOf(std::string_view top_key) {
  std::vector<const SpecField*> out;
  for (const SpecField& f : kSpecFields) {
    if (f.key == top_key || SpecGroup(f) == top_key) out.push_back(&f);
  }
  return out;
}

bool SameField(const ModelSpec& a, const ModelSpec& b, const SpecField& f) {
  if (f.effective != nullptr) return f.effective(a) == f.effective(b);
  switch (f.type) {
    case SpecType::kInt: return At<int64_t>(a, f) == At<int64_t>(b, f);
    case SpecType::kFloat: return At<double>(a, f) == At<double>(b, f);
    case SpecType::kBool: return At<bool>(a, f) == At<bool>(b, f);
    case SpecType::kFamily: return At<ModelFamily>(a, f) == At<ModelFamily>(b, f);
    case SpecType::kRopeType: return At<RopeScalingType>(a, f) == At<RopeScalingType>(b, f);
  }
  return false;
}

bool IsDefault(const ModelSpec& s, const SpecField& f) {
  static const ModelSpec kDefault;
  return SameField(s, kDefault, f);
}

std::string JsonTypeError(const SpecField& f, const json& v, const char* expected) {
  return "model spec " + std::string(f.key) + "=" + v.dump() + " is not " + expected;
}

Status FieldFromJson(const SpecField& f, const json& v, ModelSpec* spec) {
  switch (f.type) {
    case SpecType::kInt: {
      if (!v.is_number_integer()) return InvalidArgument(JsonTypeError(f, v, "an integer"));
      L2L_ASSIGN_OR_RETURN(At<int64_t>(spec, f), JsonInt<int64_t>(v, "model spec " + std::string(f.key)));
      return Status::Ok();
    }
    case SpecType::kFloat:
      if (!v.is_number()) return InvalidArgument(JsonTypeError(f, v, "a number"));
      At<double>(spec, f) = v.get<double>();
      return Status::Ok();
    case SpecType::kBool:
      if (!v.is_boolean()) return InvalidArgument(JsonTypeError(f, v, "a boolean"));
      At<bool>(spec, f) = v.get<bool>();
      return Status::Ok();
    case SpecType::kFamily: {
      if (!v.is_string()) return InvalidArgument(JsonTypeError(f, v, "a string"));
      L2L_ASSIGN_OR_RETURN(At<ModelFamily>(spec, f), ParseModelFamily(v.get<std::string>()));
      return Status::Ok();
    }
    case SpecType::kRopeType: {
      if (!v.is_string()) return InvalidArgument(JsonTypeError(f, v, "a string"));
      L2L_ASSIGN_OR_RETURN(At<RopeScalingType>(spec, f), ParseRopeScalingType(v.get<std::string>()));
      return Status::Ok();
    }
  }
  return Internal("unknown spec field type");
}

json FieldToJson(const ModelSpec& s, const SpecField& f) {
  switch (f.type) {
    case SpecType::kInt: return At<int64_t>(s, f);
    case SpecType::kFloat: return At<double>(s, f);
    case SpecType::kBool: return At<bool>(s, f);
    case SpecType::kFamily: return ToString(At<ModelFamily>(s, f));
    case SpecType::kRopeType: return ToString(At<RopeScalingType>(s, f));
  }
  return nullptr;
}

std::string YamlValue(const ModelSpec& s, const SpecField& f) {
  return f.type == SpecType::kFloat ? Shortest(At<double>(s, f)) : SpecFieldText(s, f);
}

Status ReadField(YamlMap* m, const SpecField& f, ModelSpec* spec) {
  const std::string leaf(SpecLeaf(f));
  switch (f.type) {
    case SpecType::kInt: return m->Get(leaf, &At<int64_t>(spec, f), f.int_range);
    case SpecType::kFloat: return m->Get(leaf, &At<double>(spec, f), f.float_range);
    case SpecType::kBool: return m->Get(leaf, &At<bool>(spec, f));
    case SpecType::kFamily: return m->GetEnum(leaf, &At<ModelFamily>(spec, f), ParseModelFamily);
    case SpecType::kRopeType: return m->GetEnum(leaf, &At<RopeScalingType>(spec, f), ParseRopeScalingType);
  }
  return Internal("unknown spec field type");
}

}  // namespace

const std::vector<SpecField>& SpecFields() { return kSpecFields; }

const SpecField* FindSpecField(std::string_view key) {
  for (const SpecField& f : kSpecFields) {
    if (f.key == key) return &f;
  }
  return nullptr;
}

std::string_view SpecGroup(const SpecField& f) {
  const std::string_view k(f.key);
  const size_t dot = k.find('.');
  return dot == std::string_view::npos ? std::string_view() : k.substr(0, dot);
}

std::string_view SpecLeaf(const SpecField& f) {
  const std::string_view k(f.key);
  const size_t dot = k.find('.');
  return dot == std::string_view::npos ? k : k.substr(dot + 1);
}

const std::vector<std::string>& SpecTopLevelKeys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const SpecField& f : kSpecFields) {
      const std::string top(SpecGroup(f).empty() ? std::string_view(f.key) : SpecGroup(f));
      if (out.empty() || out.back() != top) out.push_back(top);
    }
    return out;
  }();
  return keys;
}

bool FamilyUses(const ModelSpec& spec, const SpecField& f) { return (f.families & FamilyBit(spec.family)) != 0; }

std::string SpecFieldText(const ModelSpec& s, const SpecField& f) {
  if (f.effective != nullptr) return std::to_string(f.effective(s));
  switch (f.type) {
    case SpecType::kInt: return std::to_string(At<int64_t>(s, f));
    case SpecType::kFloat: return Fmt(At<double>(s, f));
    case SpecType::kBool: return At<bool>(s, f) ? "true" : "false";
    case SpecType::kFamily: return ToString(At<ModelFamily>(s, f));
    case SpecType::kRopeType: return ToString(At<RopeScalingType>(s, f));
  }
  return "?";
}

std::string SpecKeyText(const ModelSpec& s, std::string_view top_key) {
  const std::vector<const SpecField*> fields = FieldsOf(top_key);
  if (fields.empty()) return "?";
  if (fields.size() == 1 && SpecGroup(*fields[0]).empty()) return SpecFieldText(s, *fields[0]);
  std::string text = "{";
  for (const SpecField* f : fields) {
    text += (text.size() > 1 ? ", " : "") + std::string(SpecLeaf(*f)) + ": " + SpecFieldText(s, *f);
  }
  return text + "}";
}

bool SameSpecKey(const ModelSpec& a, const ModelSpec& b, std::string_view top_key) {
  static const ModelSpec kDefault;
  for (const SpecField* f : FieldsOf(top_key)) {
    if (f->group_selector && SameField(a, kDefault, *f) && SameField(b, kDefault, *f)) return true;
    if (!SameField(a, b, *f)) return false;
  }
  return true;
}

Status ReadSpecFields(YamlMap* model, ModelSpec* spec) {
  std::map<std::string, YamlMap> groups;
  for (const SpecField& f : kSpecFields) {
    const std::string group(SpecGroup(f));
    if (group.empty()) {
      L2L_RETURN_IF_ERROR(ReadField(model, f, spec));
      continue;
    }
    if (!model->Has(group)) continue;
    auto it = groups.find(group);
    if (it == groups.end()) {
      L2L_ASSIGN_OR_RETURN(YamlMap g, model->Map(group));
      it = groups.emplace(group, std::move(g)).first;
    }
    L2L_RETURN_IF_ERROR(ReadField(&it->second, f, spec));
  }
  for (const auto& [name, g] : groups) L2L_RETURN_IF_ERROR(g.Finish());
  return Status::Ok();
}

void WriteSpecYaml(const ModelSpec& spec, int indent, std::ostream& os) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  std::string open_group;
  for (const SpecField& f : kSpecFields) {
    if (!FamilyUses(spec, f) || (f.omit_default && IsDefault(spec, f))) continue;
    const std::string group(SpecGroup(f));
    if (group.empty()) {
      os << pad << f.key << ": " << YamlValue(spec, f) << "\n";
      continue;
    }
    if (group != open_group) {
      os << pad << group << ":\n";
      open_group = group;
    }
    os << pad << "  " << SpecLeaf(f) << ": " << YamlValue(spec, f) << "\n";
  }
}

json SpecToJson(const ModelSpec& spec) {
  json j = json::object();
  for (const SpecField& f : kSpecFields) {
    if (!FamilyUses(spec, f) || ((f.json_omit_default || f.omit_default) && IsDefault(spec, f))) continue;
    const std::string group(SpecGroup(f));
    if (group.empty()) {
      j[f.key] = FieldToJson(spec, f);
    } else {
      j[group][std::string(SpecLeaf(f))] = FieldToJson(spec, f);
    }
  }
  return j;
}

Result<ModelSpec> SpecFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("model spec is not a JSON object: " + j.dump());
  ModelSpec spec;
  for (const auto& [k, v] : j.items()) {
    if (const SpecField* f = FindSpecField(k); f != nullptr) {
      L2L_RETURN_IF_ERROR(FieldFromJson(*f, v, &spec));
      continue;
    }
    const std::vector<const SpecField*> group = FieldsOf(k);
    if (group.empty()) return InvalidArgument("model spec has unknown field '" + k + "'");
    if (!v.is_object()) return InvalidArgument("model spec " + k + "=" + v.dump() + " is not an object");
    for (const auto& [leaf, x] : v.items()) {
      const SpecField* f = FindSpecField(k + "." + leaf);
      if (f == nullptr) return InvalidArgument("model spec " + k + " has unknown field '" + leaf + "'");
      L2L_RETURN_IF_ERROR(FieldFromJson(*f, x, &spec));
    }
  }
  for (const SpecField& f : kSpecFields) {
    if (f.json_required && !j.contains(f.key)) {
      return InvalidArgument("model spec lacks field '" + std::string(f.key) + "'");
    }
  }
  return spec;
}

}  // namespace l2l
