// ModelSpec: mode parsing, the checks every family shares, and the dispatch of layouts,
// names, parameter counts and initialisation to the family registry
// (common/models/registry.h). See common/model_spec.h.
//
// Thread-safety: pure functions.
#include "common/model_spec.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "common/models/family_util.h"
#include "common/models/registry.h"

namespace l2l {
namespace {

using models::Field;

Status Bad(const std::string& msg) { return InvalidArgument(msg); }

}  // namespace

const char* ToString(ModelFamily family) { return models::Family(family).name; }

Result<ModelFamily> ParseModelFamily(std::string_view text) {
  std::string known;
  for (const models::FamilyInfo* f : models::AllFamilies()) {
    if (text == f->name) return f->family;
    known += (known.empty() ? "" : ", ") + std::string(f->name);
  }
  return InvalidArgument("model.family='" + std::string(text) + "' is not one of: " + known);
}

const char* ToString(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kLlama3:
      return "llama3";
  }
  return "unknown";
}

Result<RopeScalingType> ParseRopeScalingType(std::string_view text) {
  for (RopeScalingType t : {RopeScalingType::kNone, RopeScalingType::kLinear, RopeScalingType::kLlama3}) {
    if (text == ToString(t)) return t;
  }
  return InvalidArgument("model.rope_scaling.type='" + std::string(text) + "' is not one of: none, linear, llama3");
}

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kBlock:
      return "block";
    case LayerKind::kHead:
      return "head";
  }
  return "unknown";
}

Status ModelSpec::Validate() const {
  if (vocab_size <= 0) return Bad(Field("vocab_size", vocab_size) + " must be positive");
  if (vocab_size > (int64_t{1} << 31)) return Bad(Field("vocab_size", vocab_size) + " must be < 2^31");
  if (seq_len <= 0) return Bad(Field("seq_len", seq_len) + " must be positive");
  if (d_model <= 0) return Bad(Field("d_model", d_model) + " must be positive");
  if (n_layer <= 0) return Bad(Field("n_layer", n_layer) + " must be positive");
  if (n_head <= 0) return Bad(Field("n_head", n_head) + " must be positive");
  if (d_ff <= 0) return Bad(Field("d_ff", d_ff) + " must be positive");
  if (head_size < 0) return Bad(Field("head_size", head_size) + " must be >= 0 (0: d_model / n_head)");
  if (head_size == 0 && d_model % n_head != 0) {
    return Bad(Field("n_head", n_head) + " does not divide " + Field("d_model", d_model));
  }
  return models::Family(family).validate(*this);
}

LayerKind ModelSpec::KindOf(int64_t index) const {
  L2L_CHECK(index >= 0 && index < NumLayers()) << "layer " << index << " of a " << NumLayers() << "-layer model";
  if (index == 0) return LayerKind::kEmbedding;
  return index == n_layer + 1 ? LayerKind::kHead : LayerKind::kBlock;
}

std::vector<LayerKind> ModelSpec::LayerKinds() const {
  std::vector<LayerKind> kinds;
  for (int64_t i = 0; i < NumLayers(); ++i) kinds.push_back(KindOf(i));
  return kinds;
}

int64_t ModelSpec::NumParams() const { return models::Family(family).num_params(*this); }

double ModelSpec::TrainFlopsPerToken(int64_t T) const {
  return models::Family(family).train_flops_per_token(*this, T);
}

const ParamInfo* LayerLayout::Find(const std::string& suffix) const {
  for (const ParamInfo& p : params) {
    if (p.name == suffix) return &p;
  }
  if (block < 0) return nullptr;
  // Block tensors also answer to the name after their "<blocks>.N." prefix.
  for (const ParamInfo& p : params) {
    const size_t first = p.name.find('.');
    if (first == std::string::npos) continue;
    const size_t dot = p.name.find('.', first + 1);
    if (dot == std::string::npos) continue;
    if (p.name.compare(dot + 1, std::string::npos, suffix) == 0) return &p;
  }
  return nullptr;
}

std::vector<ExpertRange> ExpertRanges(const ModelSpec& spec, const LayerLayout& layout) {
  std::vector<ExpertRange> out;
  if (spec.num_experts <= 0 || layout.kind != LayerKind::kBlock) return out;
  out.assign(static_cast<size_t>(spec.num_experts), ExpertRange{SIZE_MAX, 0});
  for (const ParamInfo& p : layout.params) {
    const size_t at = p.name.find(".experts.");
    if (at == std::string::npos) continue;
    const size_t first = at + 9, dot = p.name.find('.', first);
    if (dot == std::string::npos) continue;
    const int64_t e = std::stoll(p.name.substr(first, dot - first));
    L2L_CHECK(e >= 0 && e < spec.num_experts) << "expert tensor " << p.name << " outside num_experts";
    ExpertRange& r = out[static_cast<size_t>(e)];
    r.begin = std::min(r.begin, p.offset);
    r.end = std::max(r.end, p.offset + p.numel);
  }
  for (size_t e = 0; e < out.size(); ++e) {
    L2L_CHECK(out[e].end > out[e].begin) << "layer " << layout.index << " has no tensors of expert " << e;
  }
  return out;
}

std::vector<LayerLayout> BuildLayout(const ModelSpec& spec) { return models::Family(spec.family).build_layout(spec); }

const ParamInfo& EmbeddingTable(const ModelSpec& spec, const LayerLayout& embedding) {
  const char* name = models::Family(spec.family).embedding_table;
  const ParamInfo* p = embedding.Find(name);
  L2L_CHECK(embedding.kind == LayerKind::kEmbedding && p != nullptr)
      << "layer " << embedding.index << " has no embedding table " << name;
  return *p;
}

std::string HfTensorName(const ModelSpec& spec, const ParamInfo& param) {
  const models::FamilyInfo& f = models::Family(spec.family);
  if (f.hf_tensor_name != nullptr) return f.hf_tensor_name(spec, param);
  if (param.name == "lm_head.weight") return param.name;
  return f.hf_file_prefix + param.name;
}

void InitLayerParams(const ModelSpec& spec, const LayerLayout& layout, uint64_t seed, float* out) {
  models::Family(spec.family).init_layer(spec, layout, seed, out);
}

}  // namespace l2l
