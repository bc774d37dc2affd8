// Model export/import in Hugging Face safetensors form (the family's tensor names). See common/formats/model_io.h.
//
// Thread-safety: pure functions.
#include "common/formats/model_io.h"

#include <cstring>
#include <exception>
#include <set>

#include <nlohmann/json.hpp>

#include "common/formats/safetensors.h"
#include "common/model_spec_table.h"
#include "common/models/registry.h"

namespace l2l {
namespace {

using json = nlohmann::json;

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

// Our name of a tensor stored under `name`: without the base model's state_dict prefix
// ("transformer." for GPT-2, "model." for Llama).
std::string Canonical(const ModelSpec& spec, const std::string& name) {
  const std::string prefix = models::Family(spec.family).hf_base_prefix;
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

Result<ModelSpec> SpecFromMetadata(const SafeTensorsReader& r) {
  auto it = r.metadata().find(kModelSpecMetadataKey);
  if (it == r.metadata().end()) {
    return NotFound(r.path() + ": no \"" + std::string(kModelSpecMetadataKey) +
                    "\" in the metadata (not written by l2l); load it with an explicit ModelSpec");
  }
  Result<ModelSpec> spec = ModelSpecFromJson(it->second);
  if (!spec.ok()) return spec.status().WithContext(r.path() + ": metadata " + kModelSpecMetadataKey);
  return spec;
}

Result<LoadedModel> LoadFrom(const SafeTensorsReader& r, const ModelSpec& spec) {
  L2L_RETURN_IF_ERROR(spec.Validate());
  const std::vector<LayerLayout> layout = BuildLayout(spec);
  // Canonical name -> name in the file.
  std::map<std::string, std::string> in_file;
  for (const SafeTensorInfo& t : r.tensors()) {
    const std::string c = Canonical(spec, t.name);
    if (!in_file.emplace(c, t.name).second) {
      return InvalidArgument(r.path() + ": tensor '" + c + "' is stored twice (with and without '" +
                             models::Family(spec.family).hf_base_prefix + "')");
    }
  }
  LoadedModel m;
  m.spec = spec;
  m.metadata = r.metadata();
  std::set<std::string> used;
  for (const LayerLayout& l : layout) {
    std::vector<float> buf(l.numel);
    for (const ParamInfo& p : l.params) {
      auto it = in_file.find(p.name);
      if (it == in_file.end()) {
        return NotFound(r.path() + ": missing tensor '" + p.name + "' of shape " + ShapeText(p.shape));
      }
      const SafeTensorInfo* t = r.Find(it->second);
      if (t->shape != p.shape) {
        return InvalidArgument(r.path() + ": tensor '" + t->name + "' has shape " + ShapeText(t->shape) +
                               ", expected " + ShapeText(p.shape) + " for this model");
      }
      L2L_RETURN_IF_ERROR(r.ReadAsFloat(t->name, buf.data() + p.offset, p.numel));
      used.insert(p.name);
    }
    m.layers.push_back(std::move(buf));
  }
  for (const auto& [canonical, name] : in_file) {
    if (used.count(canonical) != 0 || models::IsIgnoredHfTensor(models::Family(spec.family), canonical)) continue;
    if (canonical == "lm_head.weight" && spec.tied_embeddings) {
      // Accept only a copy of the embedding (HF may store the tied matrix twice).
      const SafeTensorInfo* t = r.Find(name);
      const ParamInfo* wte = &EmbeddingTable(spec, layout[0]);
      if (t->shape == wte->shape) {
        std::vector<float> head(t->numel());
        L2L_RETURN_IF_ERROR(r.ReadAsFloat(name, head.data(), head.size()));
        if (std::memcmp(head.data(), m.layers[0].data() + wte->offset, head.size() * sizeof(float)) == 0) continue;
      }
      return InvalidArgument(r.path() + ": the file has an lm_head.weight that differs from wte.weight but the "
                             "model spec ties embeddings; load it with tied_embeddings: false");
    }
    return InvalidArgument(r.path() + ": unexpected tensor '" + name +
                           "' (not part of this model: " + ModelSpecToJson(spec) + ")");
  }
  return m;
}

}  // namespace

std::string ModelSpecToJson(const ModelSpec& spec) { return SpecToJson(spec).dump(); }

Result<ModelSpec> ModelSpecFromJson(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    return InvalidArgument("model spec is not valid JSON: " + std::string(e.what()));
  }
  L2L_ASSIGN_OR_RETURN(ModelSpec spec, SpecFromJson(j));
  L2L_RETURN_IF_ERROR(spec.Validate());
  return spec;
}

Status SaveModel(const std::string& path, const ModelSpec& spec, const std::vector<std::vector<float>>& layers,
                 DType dtype, const std::map<std::string, std::string>& extra_metadata) {
  L2L_RETURN_IF_ERROR(spec.Validate());
  const std::vector<LayerLayout> layout = BuildLayout(spec);
  if (layers.size() != layout.size()) {
    return InvalidArgument("SaveModel(" + path + "): " + std::to_string(layers.size()) + " layer buffers for a model of " +
                           std::to_string(layout.size()) + " layers");
  }
  for (size_t i = 0; i < layout.size(); ++i) {
    if (layers[i].size() != layout[i].numel) {
      return InvalidArgument("SaveModel(" + path + "): layer " + std::to_string(i) + " (" +
                             LayerKindName(layout[i].kind) + ") has " + std::to_string(layers[i].size()) +
                             " floats, its layout " + std::to_string(layout[i].numel));
    }
  }
  return SaveModelStreamed(
      path, spec,
      [&layers](int64_t l, float* out) {
        std::copy(layers[l].begin(), layers[l].end(), out);
        return Status::Ok();
      },
      dtype, extra_metadata);
}

Status SaveModelStreamed(const std::string& path, const ModelSpec& spec,
                         const std::function<Status(int64_t layer, float* out)>& read_layer, DType dtype,
                         const std::map<std::string, std::string>& extra_metadata) {
  L2L_RETURN_IF_ERROR(spec.Validate());
  const std::vector<LayerLayout> layout = BuildLayout(spec);
  // Tensors are written in model order, so one layer buffer serves them all: each
  // layer's first tensor loads it.
  std::vector<float> cur;
  int64_t cur_layer = -1;
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < layout.size(); ++i) {
    for (const ParamInfo& p : layout[i].params) {
      TensorToWrite t{HfTensorName(spec, p), p.shape, dtype, nullptr, nullptr, nullptr};
      const int64_t l = static_cast<int64_t>(i);
      const size_t numel = layout[i].numel, offset = p.offset;
      t.f32_source = [&cur, &cur_layer, &read_layer, &path, l, numel, offset]() -> Result<const float*> {
        if (cur_layer != l) {
          cur.assign(numel, 0.0f);
          L2L_RETURN_IF_ERROR(read_layer(l, cur.data()).WithContext("SaveModel(" + path + ") layer " +
                                                                     std::to_string(l)));
          cur_layer = l;
        }
        return static_cast<const float*>(cur.data() + offset);
      };
      tensors.push_back(std::move(t));
    }
  }
  std::map<std::string, std::string> meta = extra_metadata;
  meta["format"] = "pt";
  meta[kModelSpecMetadataKey] = ModelSpecToJson(spec);
  return WriteSafeTensors(path, tensors, meta);
}

Result<LoadedModel> LoadModel(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(SafeTensorsReader r, SafeTensorsReader::Open(path));
  L2L_ASSIGN_OR_RETURN(ModelSpec spec, SpecFromMetadata(r));
  return LoadFrom(r, spec);
}

Result<LoadedModel> LoadModel(const std::string& path, const ModelSpec& spec) {
  L2L_ASSIGN_OR_RETURN(SafeTensorsReader r, SafeTensorsReader::Open(path));
  if (r.metadata().count(kModelSpecMetadataKey) != 0) {
    L2L_ASSIGN_OR_RETURN(ModelSpec stored, SpecFromMetadata(r));
    if (!(stored == spec)) {
      return InvalidArgument(path + ": the file holds model " + ModelSpecToJson(stored) + ", expected " +
                             ModelSpecToJson(spec));
    }
  }
  return LoadFrom(r, spec);
}

Result<ModelSpec> ReadModelSpec(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(SafeTensorsReader r, SafeTensorsReader::Open(path));
  return SpecFromMetadata(r);
}

}  // namespace l2l
