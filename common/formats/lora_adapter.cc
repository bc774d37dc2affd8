// LoRA adapters as plain data; merging into a model. See common/formats/lora_adapter.h.
#include "common/formats/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "common/models/registry.h"

namespace l2l::formats {
namespace {

constexpr std::string_view kWeightSuffix = ".weight";

std::string Shape(int64_t a, int64_t b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; }

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "(" + s + ")";
}

// Whether the saved tensor `name` ("model.embed_tokens.weight") belongs to `module`
// ("embed_tokens"): its name without the last component is the module or ends with
// "." + module (PEFT's suffix match of modules_to_save).
bool SavedOf(const std::string& name, const std::string& module) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  const std::string owner = name.substr(0, dot);
  return owner == module || owner.ends_with("." + module);
}

// Where each saved tensor of `adapter` lives in the model (in adapter.saved's order).
Result<std::vector<LoraTarget>> MatchSavedToModel(const ModelSpec& spec, const std::vector<LayerLayout>& layout,
                                                  const LoraAdapter& adapter) {
  std::vector<LoraTarget> out;
  if (adapter.saved.empty()) return out;
  std::map<std::string, LoraTarget> by_name;
  for (const LayerLayout& lay : layout) {
    for (const ParamInfo& p : lay.params) by_name[HfParameterName(spec, p)] = LoraTarget{lay.index, &p};
  }
  for (const LoraSavedTensor& t : adapter.saved) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return InvalidArgument("LoRA adapter saved tensor (modules_to_save) " + t.name + " is not a tensor of this " +
                             ToString(spec.family) + " model");
    }
    if (it->second.param->shape != t.shape) {
      return InvalidArgument("LoRA adapter saved tensor (modules_to_save) " + t.name + " has shape " +
                             ShapeText(t.shape) + ", the model's is " + ShapeText(it->second.param->shape));
    }
    out.push_back(it->second);
  }
  return out;
}

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
  std::set<std::string> saved_names;
  for (const LoraSavedTensor& t : a.saved) {
    if (!saved_names.insert(t.name).second) {
      return InvalidArgument("LoRA adapter: saved tensor " + t.name + " appears twice");
    }
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d <= 0) return InvalidArgument("LoRA adapter: saved tensor " + t.name + " has shape " + ShapeText(t.shape));
      n *= static_cast<uint64_t>(d);
    }
    if (t.shape.empty() || t.values.size() != n) {
      return InvalidArgument("LoRA adapter: saved tensor " + t.name + " holds " + std::to_string(t.values.size()) +
                             " values, its shape " + ShapeText(t.shape) + " " + std::to_string(n));
    }
    bool owned = false;
    for (const std::string& m : a.modules_to_save) owned = owned || SavedOf(t.name, m);
    if (!owned) {
      return InvalidArgument("LoRA adapter: saved tensor " + t.name + " belongs to no module of modules_to_save [" +
                             [&] {
                               std::string l;
                               for (const std::string& m : a.modules_to_save) l += (l.empty() ? "" : ", ") + m;
                               return l;
                             }() + "]");
    }
    for (size_t i = 0; i < t.values.size(); ++i) {
      if (!std::isfinite(t.values[i])) {
        return InvalidArgument("LoRA adapter: saved tensor " + t.name + "[" + std::to_string(i) + "] is not finite");
      }
    }
  }
  for (const std::string& m : a.modules_to_save) {
    bool any = false;
    for (const LoraSavedTensor& t : a.saved) any = any || SavedOf(t.name, m);
    if (!any) return InvalidArgument("LoRA adapter: modules_to_save lists " + m + " but no tensor of it is saved");
  }
  return Status::Ok();
}

std::string HfParameterName(const ModelSpec& spec, const ParamInfo& param) {
  const models::FamilyInfo& f = models::Family(spec.family);
  if (param.name == "lm_head.weight") return param.name;
  if (f.hf_tensor_name != nullptr) return f.hf_tensor_name(spec, param);
  return std::string(f.hf_base_prefix) + param.name;
}

std::string HfModuleName(const ModelSpec& spec, const ParamInfo& param) {
  std::string name = HfParameterName(spec, param);
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
  L2L_RETURN_IF_ERROR(MatchSavedToModel(spec, layout, adapter).status());
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
  L2L_ASSIGN_OR_RETURN(std::vector<LoraTarget> saved, MatchSavedToModel(spec, layout, adapter));
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i].layer != layer) continue;
    const std::vector<float>& v = adapter.saved[i].values;
    std::copy(v.begin(), v.end(), data + saved[i].param->offset);
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
