// LoRA adapters as plain data; merging into a model. See common/formats/lora_adapter.h.
#include "common/formats/lora_adapter.h"

#include <cmath>
#include <map>
#include <set>

#include "common/models/registry.h"

namespace l2l::formats {
namespace {

constexpr std::string_view kWeightSuffix = ".weight";

std::string Shape(int64_t a, int64_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

}  // namespace

double LoraAdapter::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

Status ValidateLoraAdapter(const LoraAdapter& a) {
  if (a.r <= 0) return InvalidArgument("LoRA adapter: r = " + std::to_string(a.r) + ", expected > 0");
  if (!std::isfinite(a.alpha)) return InvalidArgument("LoRA adapter: lora_alpha is not finite");
  if (!(a.dropout >= 0 && a.dropout < 1)) {
    return InvalidArgument("LoRA adapter: lora_dropout = " + std::to_string(a.dropout) + ", expected in [0, 1)");
  }
  if (a.modules.empty()) return InvalidArgument("LoRA adapter: no modules");
  std::set<std::string> seen;
  for (const LoraModuleWeights& m : a.modules) {
    if (m.module.empty()) return InvalidArgument("LoRA adapter: a module without a name");
    if (!seen.insert(m.module).second) return InvalidArgument("LoRA adapter: module " + m.module + " appears twice");
    if (m.in <= 0 || m.out <= 0) {
      return InvalidArgument("LoRA adapter: module " + m.module + " has in/out " + Shape(m.in, m.out));
    }
    const uint64_t want_a = static_cast<uint64_t>(a.r) * static_cast<uint64_t>(m.in);
    const uint64_t want_b = static_cast<uint64_t>(a.r) * static_cast<uint64_t>(m.out);
    if (m.a.size() != want_a || m.b.size() != want_b) {
      return InvalidArgument("LoRA adapter: module " + m.module + ": A holds " + std::to_string(m.a.size()) +
                             " and B " + std::to_string(m.b.size()) + " values, expected A " + Shape(a.r, m.in) +
                             " and B " + Shape(m.out, a.r));
    }
    for (const std::vector<float>* v : {&m.a, &m.b}) {
      for (size_t i = 0; i < v->size(); ++i) {
        if (!std::isfinite((*v)[i])) {
          return InvalidArgument("LoRA adapter: module " + m.module + ": " + (v == &m.a ? "A" : "B") + "[" +
                                 std::to_string(i) + "] is not finite");
        }
      }
    }
  }
  return Status::Ok();
}

std::string HfModuleName(const ModelSpec& spec, const ParamInfo& param) {
  const models::FamilyInfo& f = models::Family(spec.family);
  std::string name;
  if (param.name == "lm_head.weight") {
    name = param.name;
  } else if (f.hf_tensor_name != nullptr) {
    name = f.hf_tensor_name(spec, param);
  } else {
    name = std::string(f.hf_base_prefix) + param.name;
  }
  if (name.size() > kWeightSuffix.size() && name.ends_with(kWeightSuffix)) name.resize(name.size() - kWeightSuffix.size());
  return name;
}

Result<std::vector<LoraTarget>> MatchLoraToModel(const ModelSpec& spec, const std::vector<LayerLayout>& layout,
                                                 const LoraAdapter& adapter) {
  std::map<std::string, LoraTarget> by_module;
  for (const LayerLayout& lay : layout) {
    if (lay.kind == LayerKind::kEmbedding) continue;  // embeddings are no linear layers (PEFT's lora_embedding_*)
    for (const ParamInfo& p : lay.params) {
      if (p.shape.size() != 2 || !p.name.ends_with(kWeightSuffix)) continue;
      by_module[HfModuleName(spec, p)] = LoraTarget{lay.index, &p};
    }
  }
  const bool in_out = models::Family(spec.family).hf_weights_in_out;
  std::vector<LoraTarget> targets;
  for (const LoraModuleWeights& m : adapter.modules) {
    auto it = by_module.find(m.module);
    if (it == by_module.end()) {
      std::string some;
      int shown = 0;
      for (const auto& [name, t] : by_module) {
        if (name.find("layers.0.") == std::string::npos && name.find("h.0.") == std::string::npos) continue;
        some += (shown++ ? ", " : "") + name;
      }
      return InvalidArgument("LoRA adapter module " + m.module + " is not a linear weight of this " +
                             ToString(spec.family) + " model (its block 0 has: " + some + ")");
    }
    const ParamInfo& p = *it->second.param;
    const int64_t out = in_out ? p.shape[1] : p.shape[0];
    const int64_t in = in_out ? p.shape[0] : p.shape[1];
    if (out != m.out || in != m.in) {
      return InvalidArgument("LoRA adapter module " + m.module + " has (out, in) " + Shape(m.out, m.in) +
                             " (B " + Shape(m.out, adapter.r) + ", A " + Shape(adapter.r, m.in) +
                             "), the model's weight is (out, in) " + Shape(out, in));
    }
    targets.push_back(it->second);
  }
  return targets;
}

Status MergeLoraIntoLayer(const ModelSpec& spec, const std::vector<LayerLayout>& layout, const LoraAdapter& adapter,
                          int64_t layer, float* data) {
  L2L_ASSIGN_OR_RETURN(std::vector<LoraTarget> targets, MatchLoraToModel(spec, layout, adapter));
  const bool in_out = models::Family(spec.family).hf_weights_in_out;
  const double scale = adapter.scale();
  const int64_t r = adapter.r;
  std::vector<double> row;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i].layer != layer) continue;
    const LoraModuleWeights& m = adapter.modules[i];
    float* w = data + targets[i].param->offset;
    row.resize(static_cast<size_t>(m.in));
    for (int64_t o = 0; o < m.out; ++o) {
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t k = 0; k < r; ++k) {
        const double bk = m.b[o * r + k];
        const float* ak = m.a.data() + k * m.in;
        for (int64_t j = 0; j < m.in; ++j) row[j] += bk * ak[j];
      }
      for (int64_t j = 0; j < m.in; ++j) {
        float& dst = in_out ? w[j * m.out + o] : w[o * m.in + j];
        dst = static_cast<float>(dst + scale * row[j]);
      }
    }
  }
  return Status::Ok();
}

Status MergeLoraIntoModel(const ModelSpec& spec, const LoraAdapter& adapter, std::vector<std::vector<float>>* layers) {
  const std::vector<LayerLayout> layout = BuildLayout(spec);
  if (layers->size() != layout.size()) {
    return InvalidArgument("LoRA merge: " + std::to_string(layers->size()) + " layer buffers, the model has " +
                           std::to_string(layout.size()) + " layers");
  }
  for (size_t l = 0; l < layout.size(); ++l) {
    if ((*layers)[l].size() != layout[l].numel) {
      return InvalidArgument("LoRA merge: layer " + std::to_string(l) + " holds " + std::to_string((*layers)[l].size()) +
                             " floats, its layout " + std::to_string(layout[l].numel));
    }
  }
  L2L_RETURN_IF_ERROR(MatchLoraToModel(spec, layout, adapter).status());
  for (size_t l = 0; l < layout.size(); ++l) {
    L2L_RETURN_IF_ERROR(MergeLoraIntoLayer(spec, layout, adapter, static_cast<int64_t>(l), (*layers)[l].data()));
  }
  return Status::Ok();
}

Result<LayerReader> MergedLayerReader(const ModelSpec& spec, LayerReader read,
                                      std::shared_ptr<const LoraAdapter> adapter) {
  auto layout = std::make_shared<const std::vector<LayerLayout>>(BuildLayout(spec));
  L2L_RETURN_IF_ERROR(ValidateLoraAdapter(*adapter));
  L2L_RETURN_IF_ERROR(MatchLoraToModel(spec, *layout, *adapter).status());
  return LayerReader([spec, read = std::move(read), adapter = std::move(adapter), layout](int64_t l, float* out) {
    L2L_RETURN_IF_ERROR(read(l, out));
    return MergeLoraIntoLayer(spec, *layout, *adapter, l, out);
  });
}

}  // namespace l2l::formats
