// LoRA job layers -> adapter / merged layers. See common/formats/lora_export.h.
#include "common/formats/lora_export.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace l2l::formats {
namespace {

Status CheckLora(const ModelSpec& spec, const LoraConfig& lora) {
  if (!lora.enabled) return InvalidArgument("LoRA export: the job has no lora section");
  return ValidateLora(spec, lora).WithContext("LoRA export");
}

// The adapter's header fields (no tensors) of a LoRA job.
LoraAdapter EmptyAdapter(const ModelSpec& spec, const LoraConfig& lora) {
  LoraAdapter a;
  a.r = lora.r;
  a.alpha = lora.alpha;
  a.dropout = lora.dropout;
  a.family = spec.family;
  a.modules_to_save = lora.modules_to_save;
  for (const l2l::LoraTarget& t : ResolvedTargets(spec, lora)) {
    if (std::find(a.target_modules.begin(), a.target_modules.end(), t.module) == a.target_modules.end()) {
      a.target_modules.push_back(t.module);
    }
  }
  return a;
}

// Appends the adapters of one LoRA layer (`full`: layout.numel floats) and, with
// `saved`, its modules_to_save tensors.
void AppendLayer(const ModelSpec& spec, const LoraConfig& lora, const LayerLayout& layout, std::vector<float> full,
                 bool saved, LoraAdapter* out) {
  const std::vector<LayerLayout> one = {layout};
  std::vector<std::vector<float>> layers;
  layers.push_back(std::move(full));
  for (LoraAdapterTensors& t : ExtractLoraAdapters(spec, lora, one, layers)) {
    LoraModuleWeights m;
    m.module = std::move(t.module);
    m.in = t.in;
    m.out = t.out;
    m.a = std::move(t.A);
    m.b = std::move(t.B);
    out->modules.push_back(std::move(m));
  }
  if (!saved || layout.kind == LayerKind::kBlock) return;  // modules_to_save are embedding / head tensors
  for (const ParamInfo& p : layout.params) {
    if (!p.trainable) continue;
    LoraSavedTensor s;
    s.name = HfParameterName(spec, p);
    s.shape = p.shape;
    s.values.assign(layers[0].begin() + static_cast<ptrdiff_t>(p.offset),
                    layers[0].begin() + static_cast<ptrdiff_t>(p.offset + p.numel));
    out->saved.push_back(std::move(s));
  }
}

}  // namespace

Result<LoraAdapter> AdapterFromLayers(const ModelSpec& spec, const LoraConfig& lora,
                                      const LoraLayerReader& read_full_layer) {
  L2L_RETURN_IF_ERROR(CheckLora(spec, lora));
  const std::vector<LayerLayout> layouts = BuildLoraLayout(spec, lora);
  LoraAdapter adapter = EmptyAdapter(spec, lora);
  for (const LayerLayout& layout : layouts) {
    std::vector<float> full(layout.numel);
    L2L_RETURN_IF_ERROR(read_full_layer(layout.index, full.data())
                            .WithContext("LoRA export: reading layer " + std::to_string(layout.index)));
    AppendLayer(spec, lora, layout, std::move(full), /*saved=*/true, &adapter);
  }
  L2L_RETURN_IF_ERROR(ValidateLoraAdapter(adapter).WithContext("LoRA export"));
  return adapter;
}

std::function<Status(int64_t, float*)> MergedLayerSource(const ModelSpec& spec, const LoraConfig& lora,
                                                         LoraLayerReader read_full_layer) {
  struct State {
    ModelSpec spec;
    LoraConfig lora;
    Status valid;
    std::vector<LayerLayout> lora_layouts;  // BuildLoraLayout
    std::vector<LayerLayout> base_layouts;  // BuildLayout: what the reader fills
    LoraLayerReader read;
  };
  auto st = std::make_shared<State>();
  st->spec = spec;
  st->lora = lora;
  st->valid = CheckLora(spec, lora);
  if (st->valid.ok()) {
    st->lora_layouts = BuildLoraLayout(spec, lora);
    st->base_layouts = BuildLayout(spec);
  }
  st->read = std::move(read_full_layer);
  return [st](int64_t l, float* out) -> Status {
    L2L_RETURN_IF_ERROR(st->valid);
    if (l < 0 || static_cast<size_t>(l) >= st->lora_layouts.size()) {
      return InvalidArgument("LoRA merge: layer " + std::to_string(l) + " of a model with " +
                             std::to_string(st->lora_layouts.size()) + " layers");
    }
    const LayerLayout& layout = st->lora_layouts[static_cast<size_t>(l)];
    std::vector<float> full(layout.numel);
    L2L_RETURN_IF_ERROR(st->read(l, full.data()).WithContext("LoRA merge: reading layer " + std::to_string(l)));
    // The base tensors are a prefix of the LoRA layout (common/lora.h): copy them (the
    // modules_to_save tensors among them as trained, so the adapter of the layer need not
    // carry them), then add this layer's B A.
    const size_t base = st->base_layouts[static_cast<size_t>(l)].numel;
    std::copy(full.begin(), full.begin() + static_cast<ptrdiff_t>(base), out);
    LoraAdapter adapter = EmptyAdapter(st->spec, st->lora);
    adapter.modules_to_save.clear();
    AppendLayer(st->spec, st->lora, layout, std::move(full), /*saved=*/false, &adapter);
    return MergeLoraIntoLayer(st->spec, st->base_layouts, adapter, l, out).WithContext("LoRA merge");
  };
}

}  // namespace l2l::formats
