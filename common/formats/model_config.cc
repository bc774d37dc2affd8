// ModelConfig from config.json and GGUF metadata, and back to config.json.
// See common/formats/model_config.h.
//
// nlohmann::json throws on malformed text; parsing sits in try blocks so no exception
// leaves this file.
#include "common/formats/model_config.h"

#include <exception>

#include "common/file_util.h"
#include "common/json_util.h"

namespace l2l::formats {
namespace {

using json = nlohmann::json;

class Fields {
 public:
  Fields(const json& j, const std::string& path) : j_(j), path_(path) {}

  // Absent or null -> nullopt; present with another JSON type -> error.
  Status Int(const char* key, std::optional<int64_t>* out) {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_number_integer()) return Wrong(key, *v, "an integer");
    L2L_ASSIGN_OR_RETURN(*out, JsonInt<int64_t>(*v, path_ + ": key '" + key + "'"));
    return Status::Ok();
  }
  Status Float(const char* key, std::optional<double>* out) {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_number()) return Wrong(key, *v, "a number");
    *out = v->get<double>();
    return Status::Ok();
  }
  Status Bool(const char* key, std::optional<bool>* out) {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return Wrong(key, *v, "true or false");
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status String(const char* key, std::string* out) {
    const json* v = Find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_string()) return Wrong(key, *v, "a string");
    *out = v->get<std::string>();
    return Status::Ok();
  }
  const json* Find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  Status Wrong(const std::string& key, const json& v, const char* expected) const {
    std::string shown = v.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    return InvalidArgument(path_ + ": key '" + key + "' must be " + expected + ", found " + v.type_name() + " " + shown);
  }

 private:
  const json& j_;
  const std::string& path_;
};

Status ParseRopeScaling(const json& v, const std::string& path, RopeScaling* rs) {
  const std::string key = "rope_scaling";
  Fields f(v, path);
  rs->json = v;
  if (const json* t = f.Find("rope_type")) {
    if (!t->is_string()) return f.Wrong(key + ".rope_type", *t, "a string");
    rs->type = t->get<std::string>();
  } else if (const json* t2 = f.Find("type")) {
    if (!t2->is_string()) return f.Wrong(key + ".type", *t2, "a string");
    rs->type = t2->get<std::string>();
  }
  struct F {
    const char* name;
    std::optional<double>* out;
  };
  for (const F& x : {F{"factor", &rs->factor}, F{"low_freq_factor", &rs->low_freq_factor},
                     F{"high_freq_factor", &rs->high_freq_factor}}) {
    if (const json* n = f.Find(x.name)) {
      if (!n->is_number()) return f.Wrong(key + "." + x.name, *n, "a number");
      *x.out = n->get<double>();
    }
  }
  if (const json* n = f.Find("original_max_position_embeddings")) {
    if (!n->is_number_integer()) return f.Wrong(key + ".original_max_position_embeddings", *n, "an integer");
    L2L_ASSIGN_OR_RETURN(rs->original_max_position_embeddings,
                         JsonInt<int64_t>(*n, path + ": key '" + key + ".original_max_position_embeddings'"));
  }
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ParseHfConfig(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgument(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgument(path + ": config must be a JSON object");
  ModelConfig c;
  c.source = path;
  c.raw_json = j;
  Fields f(j, path);
  if (const json* a = f.Find("architectures")) {
    if (!a->is_array()) return f.Wrong("architectures", *a, "a list of strings");
    if (!a->empty()) {
      if (!(*a)[0].is_string()) return f.Wrong("architectures[0]", (*a)[0], "a string");
      c.architecture = (*a)[0].get<std::string>();
    }
  }
  L2L_RETURN_IF_ERROR(f.String("model_type", &c.model_type));
  L2L_RETURN_IF_ERROR(f.Int("vocab_size", &c.vocab_size));
  L2L_RETURN_IF_ERROR(f.Int("hidden_size", &c.hidden_size));
  L2L_RETURN_IF_ERROR(f.Int("intermediate_size", &c.intermediate_size));
  L2L_RETURN_IF_ERROR(f.Int("num_hidden_layers", &c.num_hidden_layers));
  L2L_RETURN_IF_ERROR(f.Int("num_attention_heads", &c.num_attention_heads));
  L2L_RETURN_IF_ERROR(f.Int("num_key_value_heads", &c.num_key_value_heads));
  L2L_RETURN_IF_ERROR(f.Int("head_dim", &c.head_dim));
  L2L_RETURN_IF_ERROR(f.Int("max_position_embeddings", &c.max_position_embeddings));
  L2L_RETURN_IF_ERROR(f.Float("rope_theta", &c.rope_theta));
  L2L_RETURN_IF_ERROR(f.Float("rms_norm_eps", &c.rms_norm_eps));
  L2L_RETURN_IF_ERROR(f.Float("layer_norm_epsilon", &c.layer_norm_epsilon));
  L2L_RETURN_IF_ERROR(f.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  L2L_RETURN_IF_ERROR(f.Bool("attention_bias", &c.attention_bias));
  L2L_RETURN_IF_ERROR(f.Int("sliding_window", &c.sliding_window));
  L2L_RETURN_IF_ERROR(f.Bool("use_sliding_window", &c.use_sliding_window));
  L2L_RETURN_IF_ERROR(f.String("torch_dtype", &c.torch_dtype));
  L2L_RETURN_IF_ERROR(f.Int("bos_token_id", &c.bos_token_id));
  if (const json* e = f.Find("eos_token_id")) {
    if (e->is_number_integer()) {
      L2L_ASSIGN_OR_RETURN(const int64_t id, JsonInt<int64_t>(*e, path + ": key 'eos_token_id'"));
      c.eos_token_ids.push_back(id);
    } else if (e->is_array()) {
      for (size_t i = 0; i < e->size(); ++i) {
        const json& x = (*e)[i];
        if (!x.is_number_integer()) return f.Wrong("eos_token_id", *e, "an integer or a list of integers");
        L2L_ASSIGN_OR_RETURN(const int64_t id, JsonInt<int64_t>(x, path + ": key 'eos_token_id[" + std::to_string(i) + "]'"));
        c.eos_token_ids.push_back(id);
      }
    } else {
      return f.Wrong("eos_token_id", *e, "an integer or a list of integers");
    }
  }
  if (const json* rs = f.Find("rope_scaling")) {
    if (!rs->is_object()) return f.Wrong("rope_scaling", *rs, "an object");
    RopeScaling r;
    L2L_RETURN_IF_ERROR(ParseRopeScaling(*rs, path, &r));
    c.rope_scaling = std::move(r);
  }
  // GPT-2's names. A file stating both spellings of one value must agree.
  struct Alias {
    const char* gpt2;
    const char* standard;
    std::optional<int64_t>* out;
  };
  for (const Alias& a : {Alias{"n_embd", "hidden_size", &c.hidden_size}, Alias{"n_layer", "num_hidden_layers", &c.num_hidden_layers},
                         Alias{"n_head", "num_attention_heads", &c.num_attention_heads},
                         Alias{"n_positions", "max_position_embeddings", &c.max_position_embeddings},
                         Alias{"n_inner", "intermediate_size", &c.intermediate_size}}) {
    std::optional<int64_t> v;
    L2L_RETURN_IF_ERROR(f.Int(a.gpt2, &v));
    if (!v) continue;
    if (*a.out && **a.out != *v) {
      return InvalidArgument(path + ": key '" + a.gpt2 + "' = " + std::to_string(*v) + " contradicts '" + a.standard +
                             "' = " + std::to_string(**a.out));
    }
    *a.out = v;
    c.gpt2_keys = true;
  }
  return c;
}

Result<ModelConfig> ReadHfConfig(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseHfConfig(text, path);
}

Result<ModelConfig> ConfigFromGguf(const GgufReader& g) {
  ModelConfig c;
  c.source = g.path();
  L2L_ASSIGN_OR_RETURN(c.model_type, g.GetString("general.architecture"));
  const std::string a = c.model_type + ".";
  auto get_int = [&](const std::string& key, std::optional<int64_t>* out) -> Status {
    if (g.Get(key) == nullptr) return Status::Ok();
    L2L_ASSIGN_OR_RETURN(uint64_t v, g.GetUInt(key));
    *out = static_cast<int64_t>(v);
    return Status::Ok();
  };
  auto get_float = [&](const std::string& key, std::optional<double>* out) -> Status {
    if (g.Get(key) == nullptr) return Status::Ok();
    L2L_ASSIGN_OR_RETURN(double v, g.GetFloat(key));
    *out = v;
    return Status::Ok();
  };
  if (g.Get(a + "expert_count") != nullptr) {
    L2L_ASSIGN_OR_RETURN(uint64_t experts, g.GetUInt(a + "expert_count"));
    if (experts > 0) {
      return Unimplemented(g.path() + ": " + a + "expert_count=" + std::to_string(experts) +
                           ": mixture-of-experts GGUF files (3-D ffn_*_exps tensors) are not imported; use the "
                           "model's Hugging Face checkpoint (MixtralForCausalLM)");
    }
  }
  L2L_RETURN_IF_ERROR(get_int(a + "embedding_length", &c.hidden_size));
  L2L_RETURN_IF_ERROR(get_int(a + "block_count", &c.num_hidden_layers));
  L2L_RETURN_IF_ERROR(get_int(a + "attention.head_count", &c.num_attention_heads));
  L2L_RETURN_IF_ERROR(get_int(a + "attention.head_count_kv", &c.num_key_value_heads));
  L2L_RETURN_IF_ERROR(get_int(a + "feed_forward_length", &c.intermediate_size));
  L2L_RETURN_IF_ERROR(get_int(a + "context_length", &c.max_position_embeddings));
  L2L_RETURN_IF_ERROR(get_int(a + "attention.key_length", &c.head_dim));
  L2L_RETURN_IF_ERROR(get_int(a + "rope.dimension_count", &c.rope_dimension_count));
  L2L_RETURN_IF_ERROR(get_int(a + "attention.sliding_window", &c.sliding_window));
  L2L_RETURN_IF_ERROR(get_float(a + "rope.freq_base", &c.rope_theta));
  L2L_RETURN_IF_ERROR(get_float(a + "attention.layer_norm_rms_epsilon", &c.rms_norm_eps));
  L2L_RETURN_IF_ERROR(get_float(a + "attention.layer_norm_epsilon", &c.layer_norm_epsilon));
  if (g.Get("tokenizer.ggml.tokens") != nullptr) {
    L2L_ASSIGN_OR_RETURN(std::vector<std::string> toks, g.GetStringArray("tokenizer.ggml.tokens"));
    c.vocab_size = static_cast<int64_t>(toks.size());
  } else {
    L2L_RETURN_IF_ERROR(get_int(a + "vocab_size", &c.vocab_size));
  }
  L2L_RETURN_IF_ERROR(get_int("tokenizer.ggml.bos_token_id", &c.bos_token_id));
  std::optional<int64_t> eos;
  L2L_RETURN_IF_ERROR(get_int("tokenizer.ggml.eos_token_id", &eos));
  if (eos) c.eos_token_ids.push_back(*eos);

  if (g.Get(a + "rope.scaling.type") != nullptr) {
    RopeScaling rs;
    L2L_ASSIGN_OR_RETURN(rs.type, g.GetString(a + "rope.scaling.type"));
    L2L_RETURN_IF_ERROR(get_float(a + "rope.scaling.factor", &rs.factor));
    L2L_RETURN_IF_ERROR(get_int(a + "rope.scaling.original_context_length", &rs.original_max_position_embeddings));
    if (rs.type != "none") c.rope_scaling = std::move(rs);
  } else if (g.Get(a + "rope.scale_linear") != nullptr) {
    RopeScaling rs;
    rs.type = "linear";
    L2L_RETURN_IF_ERROR(get_float(a + "rope.scale_linear", &rs.factor));
    c.rope_scaling = std::move(rs);
  }
  c.tie_word_embeddings = g.Find("output.weight") == nullptr;
  c.attention_bias = g.Find("blk.0.attn_q.bias") != nullptr;
  return c;
}

Status AddConfigToGguf(const ModelConfig& c, GgufWriter* w) {
  const std::string src = c.source.empty() ? "model config" : c.source;
  if (c.model_type.empty()) return InvalidArgument(src + ": no model_type to write as general.architecture");
  if (c.eos_token_ids.size() > 1) {
    return InvalidArgument(src + ": GGUF holds one eos token id, the config has " + std::to_string(c.eos_token_ids.size()));
  }
  if (c.rope_scaling && c.rope_scaling->type != "linear" && c.rope_scaling->type != "yarn" && c.rope_scaling->type != "none") {
    return InvalidArgument(src + ": rope_scaling type '" + c.rope_scaling->type + "' has no GGUF metadata form");
  }
  const std::string a = c.model_type + ".";
  w->Set("general.architecture", GgufValue::String(c.model_type));
  auto u32 = [&](const std::string& key, const std::optional<int64_t>& v) {
    if (v) w->Set(key, GgufValue::U32(static_cast<uint32_t>(*v)));
  };
  auto f32 = [&](const std::string& key, const std::optional<double>& v) {
    if (v) w->Set(key, GgufValue::F32(static_cast<float>(*v)));
  };
  u32(a + "vocab_size", c.vocab_size);
  u32(a + "context_length", c.max_position_embeddings);
  u32(a + "embedding_length", c.hidden_size);
  u32(a + "block_count", c.num_hidden_layers);
  u32(a + "feed_forward_length", c.intermediate_size);
  u32(a + "attention.head_count", c.num_attention_heads);
  u32(a + "attention.head_count_kv", c.num_key_value_heads);
  std::optional<int64_t> rot = c.rope_dimension_count ? c.rope_dimension_count : c.head_dim;
  if (!rot && c.hidden_size && c.num_attention_heads && *c.num_attention_heads > 0) {
    rot = *c.hidden_size / *c.num_attention_heads;
  }
  u32(a + "rope.dimension_count", rot);
  if (c.head_dim) {
    u32(a + "attention.key_length", c.head_dim);
    u32(a + "attention.value_length", c.head_dim);
  }
  u32(a + "attention.sliding_window", c.sliding_window);
  f32(a + "rope.freq_base", c.rope_theta);
  f32(a + "attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  f32(a + "attention.layer_norm_epsilon", c.layer_norm_epsilon);
  if (c.rope_scaling && c.rope_scaling->type != "none") {
    w->Set(a + "rope.scaling.type", GgufValue::String(c.rope_scaling->type));
    f32(a + "rope.scaling.factor", c.rope_scaling->factor);
    u32(a + "rope.scaling.original_context_length", c.rope_scaling->original_max_position_embeddings);
  }
  u32("tokenizer.ggml.bos_token_id", c.bos_token_id);
  if (!c.eos_token_ids.empty()) u32("tokenizer.ggml.eos_token_id", c.eos_token_ids[0]);
  return Status::Ok();
}

json HfConfigJson(const ModelConfig& c, const json& extra) {
  json j = c.raw_json.is_object() ? c.raw_json : json::object();
  if (!c.architecture.empty()) j["architectures"] = {c.architecture};
  if (!c.model_type.empty()) j["model_type"] = c.model_type;
  auto put = [&](const char* key, const auto& v) {
    if (v) j[key] = *v;
  };
  put(c.gpt2_keys ? "n_embd" : "hidden_size", c.hidden_size);
  put(c.gpt2_keys ? "n_layer" : "num_hidden_layers", c.num_hidden_layers);
  put(c.gpt2_keys ? "n_head" : "num_attention_heads", c.num_attention_heads);
  put(c.gpt2_keys ? "n_positions" : "max_position_embeddings", c.max_position_embeddings);
  put(c.gpt2_keys ? "n_inner" : "intermediate_size", c.intermediate_size);
  put("vocab_size", c.vocab_size);
  put("num_key_value_heads", c.num_key_value_heads);
  put("head_dim", c.head_dim);
  put("rope_theta", c.rope_theta);
  put("rms_norm_eps", c.rms_norm_eps);
  put("layer_norm_epsilon", c.layer_norm_epsilon);
  put("tie_word_embeddings", c.tie_word_embeddings);
  put("attention_bias", c.attention_bias);
  put("sliding_window", c.sliding_window);
  put("use_sliding_window", c.use_sliding_window);
  put("bos_token_id", c.bos_token_id);
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  if (c.rope_scaling) {
    const RopeScaling& r = *c.rope_scaling;
    json rs = r.json.is_object() ? r.json : json::object();
    if (!r.type.empty()) {
      rs["rope_type"] = r.type;
      if (rs.contains("type")) rs["type"] = r.type;
    }
    if (r.factor) rs["factor"] = *r.factor;
    if (r.low_freq_factor) rs["low_freq_factor"] = *r.low_freq_factor;
    if (r.high_freq_factor) rs["high_freq_factor"] = *r.high_freq_factor;
    if (r.original_max_position_embeddings) rs["original_max_position_embeddings"] = *r.original_max_position_embeddings;
    j["rope_scaling"] = rs;
  }
  if (extra.is_object()) j.merge_patch(extra);
  return j;
}

Status WriteHfConfig(const std::string& path, const ModelConfig& c, const json& extra) {
  std::string text;
  try {
    text = HfConfigJson(c, extra).dump(2) + "\n";
  } catch (const std::exception& e) {  // invalid UTF-8 in a string
    return InvalidArgument(path + ": cannot encode config.json: " + e.what());
  }
  return WriteFileAtomic(path, text.data(), text.size());
}

}  // namespace l2l::formats
