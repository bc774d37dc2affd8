// GGUF LoRA adapter writer. See common/formats/gguf_lora.h.
#include "common/formats/gguf_lora.h"

#include <cmath>
#include <memory>

#include "common/formats/gguf_writer.h"
#include "common/formats/model_reader.h"
#include "common/models/registry.h"

namespace l2l::formats {

Status WriteGgufLora(const std::string& path, const ModelSpec& spec, const LoraAdapter& adapter,
                     const GgufLoraOptions& o) {
  const models::FamilyInfo& fam = models::Family(spec.family);
  if (fam.gguf_export_architecture == nullptr) {
    return Unimplemented(std::string("GGUF LoRA export of the ") + ToString(spec.family) +
                         " family is not supported (it has no GGUF export; use --format peft)");
  }
  if (o.type != GgmlType::kF32 && o.type != GgmlType::kF16 && o.type != GgmlType::kBF16) {
    return InvalidArgument(std::string("GGUF LoRA tensor type ") + GgmlTypeName(o.type) +
                           " is not supported (f32, f16, bf16)");
  }
  L2L_RETURN_IF_ERROR(ValidateLoraAdapter(adapter));
  if (!adapter.saved.empty()) {
    std::string names;
    for (const std::string& m : adapter.modules_to_save) names += (names.empty() ? "" : ", ") + m;
    return InvalidArgument("GGUF LoRA: the adapter has modules_to_save (" + names +
                           ") trained in full; a GGUF LoRA file holds lora_a / lora_b pairs only (as llama.cpp's "
                           "convert_lora_to_gguf.py writes them); export the merged model instead (--format gguf "
                           "--merge) or the PEFT adapter (--format peft)");
  }
  L2L_RETURN_IF_ERROR(spec.Validate());
  const std::vector<LayerLayout> layout = BuildLayout(spec);
  L2L_RETURN_IF_ERROR(MatchLoraToModel(spec, layout, adapter).status());

  const std::string arch = fam.gguf_export_architecture(spec);
  const models::FamilyInfo* arch_family = nullptr;
  const models::GgufArch* ga = models::FindGgufArchitecture(arch, &arch_family);
  const bool permute = ga != nullptr && ga->permuted_qk;
  // llama.cpp's scale is alpha / rank; rsLoRA's is alpha / sqrt(rank).
  const double alpha = adapter.use_rslora ? adapter.alpha * std::sqrt(static_cast<double>(adapter.r)) : adapter.alpha;

  GgufWriter w;
  w.Set("general.architecture", GgufValue::String(arch));
  w.Set("general.type", GgufValue::String("adapter"));
  if (!o.name.empty()) w.Set("general.name", GgufValue::String(o.name));
  w.Set("adapter.type", GgufValue::String("lora"));
  w.Set("adapter.lora.alpha", GgufValue::F32(static_cast<float>(alpha)));

  std::vector<std::unique_ptr<std::vector<float>>> permuted;  // alive until Write returns
  for (const LoraModuleWeights& m : adapter.modules) {
    const std::string hf = m.module + ".weight";
    std::optional<std::string> base = HfToGgufName(fam, hf);
    if (!base) return InvalidArgument("LoRA module " + m.module + " has no GGUF tensor name (" + arch + ")");
    const float* b = m.b.data();
    int64_t heads = 0;
    if (permute && base->find(".attn_q.") != std::string::npos) heads = spec.n_head;
    if (permute && base->find(".attn_k.") != std::string::npos) heads = spec.kv_heads();
    if (heads > 0) {
      auto p = std::make_unique<std::vector<float>>(m.b.size());
      L2L_RETURN_IF_ERROR(PermuteLlamaRows(m.b.data(), p->data(), m.out, adapter.r, heads).WithContext(m.module));
      b = p->data();
      permuted.push_back(std::move(p));
    }
    GgufTensorToWrite ta;
    ta.name = *base + ".lora_a";
    ta.shape = {adapter.r, m.in};
    ta.type = o.type;
    ta.f32 = m.a.data();
    L2L_RETURN_IF_ERROR(w.AddTensor(std::move(ta)));
    GgufTensorToWrite tb;
    tb.name = *base + ".lora_b";
    tb.shape = {m.out, adapter.r};
    tb.type = o.type;
    tb.f32 = b;
    L2L_RETURN_IF_ERROR(w.AddTensor(std::move(tb)));
  }
  return w.Write(path);
}

}  // namespace l2l::formats
