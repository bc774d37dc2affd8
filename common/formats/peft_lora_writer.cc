// PEFT LoRA adapter writer. See common/formats/peft_lora_writer.h.
#include "common/formats/peft_lora_writer.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/formats/safetensors.h"
#include "common/models/registry.h"

namespace l2l {

Status WritePeftLoraAdapter(const std::string& dir, const ModelSpec& spec, const LoraConfig& lora,
                            const std::vector<LayerLayout>& layouts, const std::vector<std::vector<float>>& layers) {
  if (!lora.enabled) return InvalidArgument("PEFT adapter: the job has no lora section");
  if (layers.size() != layouts.size()) {
    return InvalidArgument("PEFT adapter: " + std::to_string(layers.size()) + " layers given, the model has " +
                           std::to_string(layouts.size()));
  }
  for (size_t l = 0; l < layouts.size(); ++l) {
    if (layers[l].size() != layouts[l].numel) {
      return InvalidArgument("PEFT adapter: layer " + std::to_string(l) + " has " + std::to_string(layers[l].size()) +
                             " floats, its LoRA layout " + std::to_string(layouts[l].numel));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoError("mkdir -p", dir, ec.value());

  const std::vector<LoraAdapterTensors> adapters = ExtractLoraAdapters(spec, lora, layouts, layers);
  std::vector<TensorToWrite> tensors;
  for (const LoraAdapterTensors& a : adapters) {
    tensors.push_back({"base_model.model." + a.module + ".lora_A.weight", {a.r, a.in}, DType::kF32, a.A.data()});
    tensors.push_back({"base_model.model." + a.module + ".lora_B.weight", {a.out, a.r}, DType::kF32, a.B.data()});
  }
  const std::string prefix = models::Family(spec.family).hf_base_prefix;
  for (size_t l = 0; l < layouts.size(); ++l) {
    if (layouts[l].kind == LayerKind::kBlock) continue;
    for (const ParamInfo& p : layouts[l].params) {
      if (!p.trainable) continue;
      const std::string name = p.name == "lm_head.weight" ? p.name : prefix + p.name;
      tensors.push_back({"base_model.model." + name, p.shape, DType::kF32, layers[l].data() + p.offset});
    }
  }
  L2L_RETURN_IF_ERROR(WriteSafeTensors(dir + "/adapter_model.safetensors", tensors, {{"format", "pt"}}));

  std::vector<std::string> modules;
  for (const LoraTarget& t : ResolvedTargets(spec, lora)) {
    if (std::find(modules.begin(), modules.end(), t.module) == modules.end()) modules.push_back(t.module);
  }
  nlohmann::json cfg = {{"peft_type", "LORA"},
                        {"task_type", "CAUSAL_LM"},
                        {"r", lora.r},
                        {"lora_alpha", lora.alpha},
                        {"lora_dropout", lora.dropout},
                        {"target_modules", modules},
                        {"bias", "none"},
                        {"fan_in_fan_out", spec.family == ModelFamily::kGpt2},
                        {"inference_mode", true},
                        {"init_lora_weights", true},
                        {"base_model_name_or_path", nullptr},
                        {"use_rslora", false},
                        {"use_dora", false}};
  cfg["modules_to_save"] = lora.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(lora.modules_to_save);
  const std::string path = dir + "/adapter_config.json";
  std::ofstream out(path);
  out << cfg.dump(2) << "\n";
  if (!out.good()) return ErrnoError("write", path, errno);
  return Status::Ok();
}

}  // namespace l2l
