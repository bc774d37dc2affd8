// The family table (see registry.h): the one place that lists the families.
#include "common/models/registry.h"

#include "common/models/family_util.h"

namespace l2l::models {

const std::vector<const FamilyInfo*>& AllFamilies() {
  static const std::vector<const FamilyInfo*> kAll = {&Gpt2Family(), &LlamaFamily(), &BertFamily(), &Gemma3Family()};
  return kAll;
}

const FamilyInfo& Family(ModelFamily family) {
  for (const FamilyInfo* f : AllFamilies()) {
    if (f->family == family) return *f;
  }
  L2L_CHECK(false) << "model family " << static_cast<int>(family) << " is not registered";
  return Gpt2Family();
}

const GgufArch* FindGgufArchitecture(const std::string& name, const FamilyInfo** family) {
  for (const FamilyInfo* f : AllFamilies()) {
    for (const GgufArch& a : f->gguf_architectures) {
      if (name == a.name) {
        *family = f;
        return &a;
      }
    }
  }
  return nullptr;
}

std::string KnownGgufArchitectures() {
  std::string known;
  for (const FamilyInfo* f : AllFamilies()) {
    for (const GgufArch& a : f->gguf_architectures) known += (known.empty() ? "" : ", ") + std::string(a.name);
  }
  return known;
}

bool IsIgnoredHfTensor(const FamilyInfo& family, const std::string& name) {
  for (const std::string& suffix : family.hf_ignored_suffixes) {
    if (EndsWith(name, suffix)) return true;
  }
  return false;
}

bool IsEncoder(const ModelSpec& spec) { return Family(spec.family).encoder; }

Result<ModelSpec> SpecFromHfConfig(const nlohmann::json& config, const std::string& origin) {
  if (!config.is_object()) return InvalidArgument(origin + ": config.json is not a JSON object");
  const auto it = config.find("architectures");
  if (it == config.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) {
    return InvalidArgument(origin + ": config.json has no \"architectures\" list naming the model class");
  }
  const std::string arch = (*it)[0].get<std::string>();
  std::string known;
  for (const FamilyInfo* f : AllFamilies()) {
    for (const std::string& a : f->hf_architectures) {
      if (a == arch) return f->from_hf_config(config, origin);
      known += (known.empty() ? "" : ", ") + a;
    }
  }
  return InvalidArgument(origin + ": architecture " + arch + " is not supported (known: " + known + ")");
}

}  // namespace l2l::models
