// LoRA layouts, validation and initialisation. See common/lora.h.
#include "common/lora.h"

#include <cmath>
#include <set>

#include "common/dtype.h"
#include "common/models/registry.h"
#include "common/rng.h"

namespace l2l {
namespace {

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string ListText(const std::vector<std::string>& v) { return "[" + Join(v) + "]"; }

std::string DoubleText(double x) {
  std::string s = std::to_string(x);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// The module name of a base weight: "layers.3.self_attn.q_proj.weight" -> "...q_proj".
std::string ModuleOf(const std::string& weight) { return weight.substr(0, weight.size() - 7); }

// Whether the embedding/head tensor `p` belongs to module `module` ("lm_head" holds
// "lm_head.weight", GPT-2's "ln_f" its weight and bias).
bool InModule(const LayerLayout& layout, const ParamInfo& p, const std::string& module) {
  return layout.kind != LayerKind::kBlock && p.name.compare(0, module.size() + 1, module + ".") == 0;
}

// The first embedding/head tensor of `module`, or nullptr.
const ParamInfo* SavedTensor(const LayerLayout& layout, const std::string& module) {
  for (const ParamInfo& p : layout.params) {
    if (InModule(layout, p, module)) return &p;
  }
  return nullptr;
}

}  // namespace

const char* ToString(LoraBaseDType d) {
  switch (d) {
    case LoraBaseDType::kF32: return "fp32";
    case LoraBaseDType::kBF16: return "bf16";
    case LoraBaseDType::kQ4: return "q4";
    case LoraBaseDType::kQ8: return "q8";
  }
  return "?";
}

Result<LoraBaseDType> ParseLoraBaseDType(std::string_view text) {
  if (text == "fp32" || text == "f32") return LoraBaseDType::kF32;
  if (text == "bf16") return LoraBaseDType::kBF16;
  if (text == "q4") return LoraBaseDType::kQ4;
  if (text == "q8") return LoraBaseDType::kQ8;
  return InvalidArgument("unknown base dtype \"" + std::string(text) + "\"; expected bf16, fp32, q4 or q8");
}

std::vector<LoraTarget> LoraTargets(const ModelSpec& spec) {
  const models::FamilyInfo& f = models::Family(spec.family);
  return f.lora_targets != nullptr ? f.lora_targets(spec) : std::vector<LoraTarget>{};
}

uint64_t LoraDropoutStream(uint64_t seed, int64_t step, int64_t block, int64_t micro_batch,
                           std::string_view weight) {
  const uint64_t name = Fnv1a64(weight.data(), weight.size());
  uint64_t k = SplitMix64(seed ^ kLoraDropoutTag);
  k = SplitMix64(k ^ static_cast<uint64_t>(step));
  k = SplitMix64(k ^ static_cast<uint64_t>(block));
  k = SplitMix64(k ^ static_cast<uint64_t>(micro_batch));
  return SplitMix64(k ^ name);
}

Status ValidateLora(const ModelSpec& spec, const LoraConfig& lora) {
  if (!lora.enabled) return Status::Ok();
  if (lora.r <= 0) return InvalidArgument("lora.r=" + std::to_string(lora.r) + ": expected an integer > 0 (the rank)");
  if (!(lora.alpha > 0) || !std::isfinite(lora.alpha)) {
    return InvalidArgument("lora.alpha=" + DoubleText(lora.alpha) + ": expected a number > 0");
  }
  if (!(lora.dropout >= 0 && lora.dropout < 1)) {
    return InvalidArgument("lora.dropout=" + DoubleText(lora.dropout) + ": expected a number in [0, 1)");
  }
  if (spec.moe()) {
    return InvalidArgument("lora: a mixture-of-experts model (model.num_experts=" + std::to_string(spec.num_experts) +
                           ") has no LoRA support in this build");
  }
  const std::vector<LoraTarget> known = LoraTargets(spec);
  if (known.empty()) {
    return InvalidArgument("lora.target=" + ListText(lora.target) + ": the " + ToString(spec.family) +
                           " family has no LoRA support in this build (gpt2 and llama have)");
  }
  std::vector<std::string> names;
  for (const LoraTarget& t : known) {
    if (names.empty() || names.back() != t.module) {
      bool seen = false;
      for (const std::string& n : names) seen = seen || n == t.module;
      if (!seen) names.push_back(t.module);
    }
  }
  if (lora.target.empty()) {
    return InvalidArgument("lora.target=[]: expected all-linear or a list of the " + std::string(ToString(spec.family)) +
                           " family's modules: " + Join(names));
  }
  for (const std::string& t : lora.target) {
    if (t == "all-linear") {
      if (lora.target.size() != 1) {
        return InvalidArgument("lora.target=" + ListText(lora.target) + ": all-linear stands alone");
      }
      continue;
    }
    bool found = false;
    for (const std::string& n : names) found = found || n == t;
    if (!found) {
      return InvalidArgument("lora.target=" + ListText(lora.target) + ": the " + ToString(spec.family) +
                             " family has no module \"" + t + "\"; its linears are " + Join(names) +
                             " (or all-linear)");
    }
  }
  const std::vector<LayerLayout> base = BuildLayout(spec);
  for (const std::string& m : lora.modules_to_save) {
    if (SavedTensor(base.front(), m) == nullptr && SavedTensor(base.back(), m) == nullptr) {
      std::vector<std::string> ok;
      for (const LayerLayout* l : {&base.front(), &base.back()}) {
        for (const ParamInfo& p : l->params) {
          const std::string module = p.name.substr(0, p.name.rfind('.'));
          if (ok.empty() || ok.back() != module) ok.push_back(module);
        }
      }
      std::string why = (m == "lm_head" && spec.tied_embeddings)
                            ? " (its embeddings are tied: the head reads the embedding, name that)"
                            : "";
      return InvalidArgument("lora.modules_to_save=" + ListText(lora.modules_to_save) + ": the model has no \"" + m +
                             "\"" + why + "; modules that can train in full: " + Join(ok));
    }
  }
  // What trains must be one contiguous run of each layer (the gradient a worker pushes).
  for (const LayerLayout& l : BuildLoraLayout(spec, lora)) {
    int runs = 0;
    bool prev = false;
    for (const ParamInfo& p : l.params) {
      if (p.trainable && !prev) ++runs;
      prev = p.trainable;
    }
    if (runs > 1) {
      return InvalidArgument("lora.modules_to_save=" + ListText(lora.modules_to_save) + ": layer " +
                             std::to_string(l.index) + " (" + LayerKindName(l.kind) +
                             ") would train tensors that are not adjacent; save its other modules too");
    }
  }
  return Status::Ok();
}

std::vector<LoraTarget> ResolvedTargets(const ModelSpec& spec, const LoraConfig& lora) {
  std::vector<LoraTarget> out;
  const bool all = lora.target.size() == 1 && lora.target[0] == "all-linear";
  for (const LoraTarget& t : LoraTargets(spec)) {
    bool want = all;
    for (const std::string& n : lora.target) want = want || n == t.module;
    if (want) out.push_back(t);
  }
  return out;
}

std::vector<LayerLayout> BuildLoraLayout(const ModelSpec& spec, const LoraConfig& lora) {
  std::vector<LayerLayout> layers = BuildLayout(spec);
  if (!lora.enabled) return layers;
  const std::vector<LoraTarget> targets = ResolvedTargets(spec, lora);
  const std::set<std::string> saved(lora.modules_to_save.begin(), lora.modules_to_save.end());
  for (LayerLayout& l : layers) {
    for (ParamInfo& p : l.params) {
      bool whole = false;
      for (const std::string& m : saved) whole = whole || InModule(l, p, m);
      p.trainable = whole;
    }
    if (l.kind != LayerKind::kBlock) continue;
    l.lora_r = lora.r;
    l.lora_scale = lora.scale();
    for (const LoraTarget& t : targets) {
      const ParamInfo* w = l.Find(t.weight);
      const std::string module = ModuleOf(w->name);
      for (int ab = 0; ab < 2; ++ab) {
        ParamInfo p;
        p.name = module + (ab == 0 ? ".lora_A.weight" : ".lora_B.weight");
        p.shape = ab == 0 ? std::vector<int64_t>{lora.r, t.in} : std::vector<int64_t>{t.out, lora.r};
        p.numel = static_cast<size_t>(p.shape[0] * p.shape[1]);
        p.offset = l.numel;
        p.decay = true;
        p.trainable = true;
        l.numel += p.numel;
        l.params.push_back(std::move(p));
      }
    }
  }
  return layers;
}

size_t BaseNumel(const LayerLayout& layout) {
  size_t n = 0;
  for (const ParamInfo& p : layout.params) {
    if (p.name.find(".lora_") == std::string::npos) n += p.numel;
  }
  return n;
}

TrainableSpan TrainableRange(const LayerLayout& layout) {
  TrainableSpan s;
  bool found = false;
  for (const ParamInfo& p : layout.params) {
    if (!p.trainable) continue;
    if (!found) s.offset = p.offset;
    found = true;
    s.numel = p.offset + p.numel - s.offset;
  }
  return s;
}

size_t TrainableNumel(const LayerLayout& layout) {
  size_t n = 0;
  for (const ParamInfo& p : layout.params) n += p.trainable ? p.numel : 0;
  return n;
}

LayerLayout TrainableLayout(const LayerLayout& layout) {
  const TrainableSpan span = TrainableRange(layout);
  if (span.offset == 0 && span.numel == layout.numel) return layout;
  LayerLayout t = layout;
  t.params.clear();
  t.numel = 0;
  for (const ParamInfo& p : layout.params) {
    if (!p.trainable) continue;
    ParamInfo q = p;
    q.offset = p.offset - span.offset;
    t.numel += q.numel;
    t.params.push_back(std::move(q));
  }
  return t;
}

void PackTrainable(const LayerLayout& layout, const float* full, float* packed) {
  size_t k = 0;
  for (const ParamInfo& p : layout.params) {
    if (!p.trainable) continue;
    for (size_t i = 0; i < p.numel; ++i) packed[k + i] = full[p.offset + i];
    k += p.numel;
  }
}

void UnpackTrainable(const LayerLayout& layout, const float* packed, float* full) {
  size_t k = 0;
  for (const ParamInfo& p : layout.params) {
    if (!p.trainable) continue;
    for (size_t i = 0; i < p.numel; ++i) full[p.offset + i] = packed[k + i];
    k += p.numel;
  }
}

void InitLoraAdapters(const LoraConfig& lora, const LayerLayout& layout, float* full) {
  const uint64_t layer_key = SplitMix64(lora.init_seed ^ (0x4C6F5241ull * static_cast<uint64_t>(layout.index + 1)));
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const ParamInfo& p = layout.params[k];
    const bool a = p.name.size() > 14 && p.name.compare(p.name.size() - 14, 14, ".lora_A.weight") == 0;
    const bool b = p.name.size() > 14 && p.name.compare(p.name.size() - 14, 14, ".lora_B.weight") == 0;
    if (b) {
      for (size_t i = 0; i < p.numel; ++i) full[p.offset + i] = 0.0f;
    } else if (a) {
      // kaiming_uniform_(a=sqrt(5)): gain sqrt(2/(1+5)), bound gain*sqrt(3/fan_in) = 1/sqrt(fan_in).
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.shape[1]));
      const uint64_t key = SplitMix64(layer_key + 0x1000193ull * (k + 1));
      for (size_t i = 0; i < p.numel; ++i) {
        const double u = static_cast<double>(SplitMix64(key + i) >> 11) * 0x1.0p-53;  // [0, 1)
        full[p.offset + i] = static_cast<float>((2.0 * u - 1.0) * bound);
      }
    }
  }
}

std::vector<LoraAdapterTensors> ExtractLoraAdapters(const ModelSpec& spec, const LoraConfig& lora,
                                                    const std::vector<LayerLayout>& layouts,
                                                    const std::vector<std::vector<float>>& layers) {
  std::vector<LoraAdapterTensors> out;
  const std::string prefix = models::Family(spec.family).hf_base_prefix;
  for (size_t l = 0; l < layouts.size() && l < layers.size(); ++l) {
    const LayerLayout& layout = layouts[l];
    for (size_t k = 0; k + 1 < layout.params.size(); ++k) {
      const ParamInfo& a = layout.params[k];
      const size_t at = a.name.rfind(".lora_A.weight");
      if (at == std::string::npos || at + 14 != a.name.size()) continue;
      const ParamInfo& b = layout.params[k + 1];
      LoraAdapterTensors t;
      t.module = prefix + a.name.substr(0, at);
      t.r = lora.r;
      t.in = a.shape[1];
      t.out = b.shape[0];
      t.A.assign(layers[l].begin() + a.offset, layers[l].begin() + a.offset + a.numel);
      t.B.assign(layers[l].begin() + b.offset, layers[l].begin() + b.offset + b.numel);
      out.push_back(std::move(t));
    }
  }
  return out;
}

}  // namespace l2l
