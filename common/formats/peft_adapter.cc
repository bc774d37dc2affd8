// PEFT LoRA adapter directories. See common/formats/peft_adapter.h.
#include "common/formats/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/formats/safetensors.h"
#include "common/models/registry.h"

namespace l2l::formats {
namespace {

namespace fs = std::filesystem;

constexpr char kKeyPrefix[] = "base_model.model.";
constexpr char kASuffix[] = ".lora_A.weight";
constexpr char kBSuffix[] = ".lora_B.weight";
constexpr uint64_t kMaxConfigBytes = 1 << 20;

nlohmann::json ConfigJson(const LoraAdapter& a) {
  nlohmann::json alpha = a.alpha;
  if (a.alpha == std::floor(a.alpha) && std::fabs(a.alpha) < 1e15) alpha = static_cast<int64_t>(a.alpha);
  return nlohmann::json{
      {"alpha_pattern", nlohmann::json::object()},
      {"auto_mapping", nullptr},
      {"base_model_name_or_path", a.base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.base_model)},
      {"bias", "none"},
      {"fan_in_fan_out", models::Family(a.family).hf_weights_in_out},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"layer_replication", nullptr},
      {"layers_pattern", nullptr},
      {"layers_to_transform", nullptr},
      {"loftq_config", nlohmann::json::object()},
      {"lora_alpha", alpha},
      {"lora_dropout", a.dropout},
      {"megatron_config", nullptr},
      {"megatron_core", "megatron.core"},
      {"modules_to_save", a.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.modules_to_save)},
      {"peft_type", "LORA"},
      {"r", a.r},
      {"rank_pattern", nlohmann::json::object()},
      {"revision", nullptr},
      {"target_modules", a.target_modules},
      {"task_type", "CAUSAL_LM"},
      {"use_dora", false},
      {"use_rslora", a.use_rslora},
  };
}

// The config's fields into *a; errors name the file and the key.
Status ParseConfig(const nlohmann::json& j, const std::string& path, LoraAdapter* a) {
  auto bad = [&](const std::string& key, const std::string& why) {
    return InvalidArgument(path + ": \"" + key + "\" " + why);
  };
  if (!j.is_object()) return InvalidArgument(path + ": not a JSON object");
  if (!j.contains("peft_type") || j["peft_type"] != "LORA") {
    return bad("peft_type", "is " + (j.contains("peft_type") ? j["peft_type"].dump() : std::string("absent")) +
                                ", expected \"LORA\" (l2l reads LoRA adapters only)");
  }
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() <= 0) {
    return bad("r", "must be a positive integer");
  }
  a->r = j["r"].get<int64_t>();
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number()) return bad("lora_alpha", "must be a number");
  a->alpha = j["lora_alpha"].get<double>();
  if (j.contains("lora_dropout") && j["lora_dropout"].is_number()) a->dropout = j["lora_dropout"].get<double>();
  if (j.contains("use_rslora") && j["use_rslora"].is_boolean()) a->use_rslora = j["use_rslora"].get<bool>();
  if (j.contains("bias") && j["bias"] != "none") {
    return bad("bias", "is " + j["bias"].dump() + ": only \"none\" is supported (l2l merges low-rank updates only)");
  }
  if (j.contains("use_dora") && j["use_dora"] == true) return bad("use_dora", "is true: DoRA adapters are not supported");
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (j.contains(key) && !j[key].is_null() && !j[key].empty()) {
      return bad(key, "is set: per-module ranks / alphas are not supported");
    }
  }
  if (j.contains("modules_to_save") && !j["modules_to_save"].is_null()) {
    const nlohmann::json& m = j["modules_to_save"];
    if (!m.is_array()) return bad("modules_to_save", "must be null or a list of module names");
    for (const nlohmann::json& e : m) {
      if (!e.is_string() || e.get<std::string>().empty()) return bad("modules_to_save", "must hold module names");
      a->modules_to_save.push_back(e.get<std::string>());
    }
  }
  if (j.contains("target_modules")) {
    const nlohmann::json& t = j["target_modules"];
    if (t.is_string()) {
      a->target_modules = {t.get<std::string>()};
    } else if (t.is_array()) {
      for (const nlohmann::json& e : t) {
        if (!e.is_string()) return bad("target_modules", "must hold strings");
        a->target_modules.push_back(e.get<std::string>());
      }
    } else if (!t.is_null()) {
      return bad("target_modules", "must be a string or a list of strings");
    }
  }
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string()) {
    a->base_model = j["base_model_name_or_path"].get<std::string>();
  }
  return Status::Ok();
}

}  // namespace

Status WritePeftAdapter(const std::string& dir, const LoraAdapter& adapter) {
  L2L_RETURN_IF_ERROR(ValidateLoraAdapter(adapter));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Internal(dir + ": cannot create the adapter directory: " + ec.message());
  std::vector<TensorToWrite> tensors;
  for (const LoraModuleWeights& m : adapter.modules) {
    TensorToWrite a;
    a.name = std::string(kKeyPrefix) + m.module + kASuffix;
    a.shape = {adapter.r, m.in};
    a.f32 = m.a.data();
    TensorToWrite b;
    b.name = std::string(kKeyPrefix) + m.module + kBSuffix;
    b.shape = {m.out, adapter.r};
    b.f32 = m.b.data();
    tensors.push_back(std::move(a));
    tensors.push_back(std::move(b));
  }
  for (const LoraSavedTensor& t : adapter.saved) {  // PEFT's modules_to_save, under the tensor's own name
    TensorToWrite w;
    w.name = std::string(kKeyPrefix) + t.name;
    w.shape = t.shape;
    w.f32 = t.values.data();
    tensors.push_back(std::move(w));
  }
  L2L_RETURN_IF_ERROR(WriteSafeTensors((fs::path(dir) / kPeftWeightsFile).string(), tensors, {{"format", "pt"}}));
  const std::string config = ConfigJson(adapter).dump(2) + "\n";
  return WriteFileAtomic((fs::path(dir) / kPeftConfigFile).string(), config.data(), config.size());
}

Result<LoraAdapter> ReadPeftAdapter(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound(dir + ": no such adapter directory");
  const std::string config_path = (fs::path(dir) / kPeftConfigFile).string();
  if (!fs::exists(config_path, ec)) {
    return NotFound(dir + ": no " + kPeftConfigFile + " (not a PEFT adapter directory)");
  }
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path, kMaxConfigBytes));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(config_path + ": not valid JSON");
  LoraAdapter adapter;
  L2L_RETURN_IF_ERROR(ParseConfig(j, config_path, &adapter));

  const std::string weights_path = (fs::path(dir) / kPeftWeightsFile).string();
  if (!fs::exists(weights_path, ec)) {
    if (fs::exists(fs::path(dir) / "adapter_model.bin", ec)) {
      return InvalidArgument(dir + ": adapter_model.bin (a pickle) is not read; save the adapter with "
                             "safe_serialization=True (adapter_model.safetensors)");
    }
    return NotFound(dir + ": no " + kPeftWeightsFile);
  }
  L2L_ASSIGN_OR_RETURN(SafeTensorsReader st, SafeTensorsReader::Open(weights_path));
  std::map<std::string, size_t> index;  // module -> position in adapter.modules
  auto module_of = [&](const std::string& module) -> LoraModuleWeights& {
    auto [it, fresh] = index.emplace(module, adapter.modules.size());
    if (fresh) {
      adapter.modules.emplace_back();
      adapter.modules.back().module = module;
    }
    return adapter.modules[it->second];
  };
  for (const SafeTensorInfo& t : st.tensors()) {
    const bool is_a = t.name.ends_with(kASuffix), is_b = t.name.ends_with(kBSuffix);
    const size_t prefix = sizeof(kKeyPrefix) - 1, suffix = sizeof(kASuffix) - 1;  // both suffixes are as long
    const bool lora = t.name.starts_with(kKeyPrefix) && (is_a || is_b) && t.name.size() > prefix + suffix;
    bool saved = false;  // a modules_to_save tensor: base_model.model.<name of a tensor of such a module>
    if (!lora && t.name.starts_with(kKeyPrefix) && t.name.find(".lora_") == std::string::npos) {
      const std::string name = t.name.substr(prefix);
      const size_t dot = name.rfind('.');
      for (const std::string& m : adapter.modules_to_save) {
        const std::string owner = dot == std::string::npos ? "" : name.substr(0, dot);
        saved = saved || owner == m || owner.ends_with("." + m);
      }
    }
    if (!lora && !saved) {
      return InvalidArgument(weights_path + ": unexpected tensor \"" + t.name + "\" (l2l reads " + kKeyPrefix +
                             "<module>" + kASuffix + " / " + kBSuffix +
                             " and the tensors of adapter_config.json's modules_to_save only)");
    }
    if (!t.dtype) return InvalidArgument(weights_path + ": tensor " + t.name + " has dtype " + t.dtype_name + ", expected F32, BF16 or F16");
    if (saved) {
      LoraSavedTensor s;
      s.name = t.name.substr(prefix);
      s.shape = t.shape;
      L2L_ASSIGN_OR_RETURN(s.values, st.ReadAsFloat(t.name));
      adapter.saved.push_back(std::move(s));
      continue;
    }
    if (t.shape.size() != 2 || t.shape[is_a ? 0 : 1] != adapter.r) {
      std::string shape;
      for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      return InvalidArgument(weights_path + ": tensor " + t.name + " has shape (" + shape + "), expected " +
                             (is_a ? "(r, in)" : "(out, r)") + " with r = " + std::to_string(adapter.r) +
                             " (adapter_config.json)");
    }
    LoraModuleWeights& m = module_of(t.name.substr(prefix, t.name.size() - prefix - suffix));
    std::vector<float>& dst = is_a ? m.a : m.b;
    if (!dst.empty()) return InvalidArgument(weights_path + ": tensor " + t.name + " appears twice");
    (is_a ? m.in : m.out) = is_a ? t.shape[1] : t.shape[0];
    L2L_ASSIGN_OR_RETURN(dst, st.ReadAsFloat(t.name));
  }
  for (const LoraModuleWeights& m : adapter.modules) {
    if (m.a.empty() || m.b.empty()) {
      return InvalidArgument(weights_path + ": module " + m.module + " has " + (m.a.empty() ? "no lora_A" : "no lora_B") +
                             " weight");
    }
  }
  if (adapter.modules.empty()) return InvalidArgument(weights_path + ": no LoRA weights");
  Status s = ValidateLoraAdapter(adapter);
  if (!s.ok()) return s.WithContext(dir);
  return adapter;
}

}  // namespace l2l::formats
