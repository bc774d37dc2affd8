// ModelReader over Hugging Face directories (safetensors, sharded or not) and GGUF files.
// See common/formats/model_reader.h.
#include "common/formats/model_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/formats/mapped_pages.h"
#include "common/formats/safetensors.h"
#include "common/models/registry.h"

namespace l2l::formats {
namespace {

using json = nlohmann::json;

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

bool IsFile(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// ---- Hugging Face directory -----------------------------------------------------------

class HfDirReader final : public ModelReader {
 public:
  explicit HfDirReader(const std::string& dir) : ModelReader(ModelFormat::kHfDir, dir) {}

  Status Init() {
    L2L_ASSIGN_OR_RETURN(config_, ReadHfConfig(path_ + "/config.json"));
    const std::string index = path_ + "/model.safetensors.index.json";
    const std::string single = path_ + "/model.safetensors";
    if (IsFile(index)) return InitSharded(index);
    if (!IsFile(single)) {
      return NotFound(path_ + ": no model.safetensors or model.safetensors.index.json (only safetensors "
                      "weights are read; convert pytorch_model.bin with transformers' save_pretrained)");
    }
    L2L_ASSIGN_OR_RETURN(SafeTensorsReader r, SafeTensorsReader::Open(single));
    shards_.push_back(std::move(r));
    for (const SafeTensorInfo& t : shards_[0].tensors()) {
      L2L_RETURN_IF_ERROR(AddChecked(t, 0));
    }
    return Status::Ok();
  }

  std::string FileOf(const std::string& name) const override {
    auto it = shard_of_.find(name);
    return it == shard_of_.end() ? "" : shards_[it->second].path();
  }

  Status ReadF32(const std::string& name, float* out, size_t n) const override {
    auto it = shard_of_.find(name);
    if (it == shard_of_.end()) return NotFound(path_ + ": no tensor '" + name + "'");
    const SafeTensorsReader& shard = shards_[it->second];
    Status s = shard.ReadAsFloat(name, out, n);
    const auto raw = shard.Raw(*shard.Find(name));
    ReleaseMappedPages(shard.Mapping(), raw);
    return s;
  }

 private:
  Status AddChecked(const SafeTensorInfo& t, size_t shard) {
    shard_of_[t.name] = shard;
    AddTensor({t.name, t.shape, t.dtype_name, t.dtype.has_value()});
    return Status::Ok();
  }

  Status InitSharded(const std::string& index) {
    L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index));
    json j;
    try {
      j = json::parse(text);
    } catch (const std::exception& e) {
      return InvalidArgument(index + ": not valid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return InvalidArgument(index + ": needs an object 'weight_map' {tensor: shard file}");
    }
    std::map<std::string, std::vector<std::string>> by_shard;  // shard file -> tensors
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) return InvalidArgument(index + ": weight_map['" + name + "'] is not a string");
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        return InvalidArgument(index + ": weight_map['" + name + "'] = '" + f + "' is not a file name in the directory");
      }
      by_shard[f].push_back(name);
    }
    if (by_shard.empty()) return InvalidArgument(index + ": weight_map is empty");
    for (const auto& [file, names] : by_shard) {
      const std::string p = path_ + "/" + file;
      if (!IsFile(p)) {
        return NotFound(p + ": shard missing (listed in " + index + " for tensor '" + names[0] + "' and " +
                        std::to_string(names.size() - 1) + " more)");
      }
      L2L_ASSIGN_OR_RETURN(SafeTensorsReader r, SafeTensorsReader::Open(p));
      for (const std::string& n : names) {
        if (r.Find(n) == nullptr) return NotFound(p + ": no tensor '" + n + "', which " + index + " places in this shard");
      }
      for (const SafeTensorInfo& t : r.tensors()) {
        auto it = std::find(names.begin(), names.end(), t.name);
        if (it == names.end()) {
          return InvalidArgument(p + ": tensor '" + t.name + "' is not in " + index + "'s weight_map for this shard");
        }
      }
      shards_.push_back(std::move(r));
    }
    // Listed in weight_map (name) order.
    std::map<std::string, size_t> shard_index;
    for (size_t i = 0; i < shards_.size(); ++i) {
      for (const SafeTensorInfo& t : shards_[i].tensors()) shard_index[t.name] = i;
    }
    for (const auto& [name, i] : shard_index) L2L_RETURN_IF_ERROR(AddChecked(*shards_[i].Find(name), i));
    return Status::Ok();
  }

  std::vector<SafeTensorsReader> shards_;
  std::map<std::string, size_t> shard_of_;
};

// ---- GGUF ------------------------------------------------------------------------------

class GgufModelReader final : public ModelReader {
 public:
  GgufModelReader(const std::string& path, GgufReader r) : ModelReader(ModelFormat::kGguf, path), g_(std::move(r)) {}

  Status Init(const ModelOpenOptions& o) {
    L2L_ASSIGN_OR_RETURN(config_, ConfigFromGguf(g_));
    // The family that imports this architecture names the tensors (none: GGUF names).
    const models::FamilyInfo* family = nullptr;
    const models::GgufArch* arch = models::FindGgufArchitecture(config_.model_type, &family);
    const bool hf_names = o.gguf_hf_names && arch != nullptr;
    const bool unpermute = hf_names && arch->permuted_qk;
    for (const GgufTensorInfo& t : g_.tensors()) {
      const auto tr = GgmlTraits(t.type);
      std::string name = t.name;
      if (hf_names) {
        if (auto hf = GgufToHfName(*family, t.name)) name = *hf;
      }
      if (by_name_.count(name)) return InvalidArgument(path_ + ": tensors '" + t.name + "' and another both map to '" + name + "'");
      Source s{t.name, 0};
      if (unpermute) {
        const bool q = t.name.find(".attn_q.") != std::string::npos, k = t.name.find(".attn_k.") != std::string::npos;
        if (q || k) {
          const auto& heads = q ? config_.num_attention_heads : config_.num_key_value_heads;
          if (!heads) {
            return InvalidArgument(path_ + ": tensor '" + t.name + "' needs llama." +
                                   (q ? "attention.head_count" : "attention.head_count_kv") + " to undo its row permutation");
          }
          const int64_t rows = t.shape[0];
          if (*heads <= 0 || rows % *heads != 0 || (rows / *heads) % 2 != 0) {
            return InvalidArgument(path_ + ": tensor '" + t.name + "' has " + std::to_string(rows) + " rows, not " +
                                   std::to_string(*heads) + " heads of an even head_dim");
          }
          s.n_head = *heads;
        }
      }
      source_[name] = s;
      AddTensor({name, t.shape, tr->name, tr->to_f32});
    }
    return Status::Ok();
  }

  std::string FileOf(const std::string& name) const override { return source_.count(name) ? path_ : ""; }

  Status ReadF32(const std::string& name, float* out, size_t n) const override {
    auto it = source_.find(name);
    if (it == source_.end()) return NotFound(path_ + ": no tensor '" + name + "'");
    const Source& s = it->second;
    if (s.n_head == 0) return g_.ReadF32(s.gguf_name, out, n);
    const GgufTensorInfo* t = g_.Find(s.gguf_name);
    if (n != static_cast<size_t>(t->numel())) return g_.ReadF32(s.gguf_name, out, n);  // the size error
    std::vector<float> tmp(n);
    L2L_RETURN_IF_ERROR(g_.ReadF32(s.gguf_name, tmp.data(), n));
    const int64_t rows = t->shape[0];
    return UnpermuteLlamaRows(tmp.data(), out, rows, static_cast<int64_t>(n) / rows, s.n_head);
  }

  const GgufReader* gguf() const override { return &g_; }

 private:
  struct Source {
    std::string gguf_name;
    int64_t n_head;  // > 0: unpermute rows with this many heads
  };
  GgufReader g_;
  std::map<std::string, Source> source_;
};

}  // namespace

const char* ModelFormatName(ModelFormat f) {
  switch (f) {
    case ModelFormat::kHfDir:
      return "hf";
    case ModelFormat::kGguf:
      return "gguf";
  }
  return "?";
}

int64_t ModelTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void ModelReader::AddTensor(ModelTensorInfo t) {
  by_name_[t.name] = tensors_.size();
  tensors_.push_back(std::move(t));
}

const ModelTensorInfo* ModelReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Status ModelReader::CheckShape(const std::string& name, const std::vector<int64_t>& shape) const {
  const ModelTensorInfo* t = Find(name);
  if (t == nullptr) return NotFound(path_ + ": missing tensor '" + name + "' (expected shape " + ShapeText(shape) + ")");
  if (t->shape != shape) {
    return InvalidArgument(FileOf(name) + ": tensor '" + name + "' has shape " + ShapeText(t->shape) + ", expected " +
                           ShapeText(shape));
  }
  if (!t->to_f32) {
    return Unimplemented(FileOf(name) + ": tensor '" + name + "' has dtype " + t->dtype + ", which l2l cannot convert to fp32 (" +
                         (format_ == ModelFormat::kGguf ? "GGUF: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, Q8_K" : "safetensors: F32, BF16, F16") + ")");
  }
  return Status::Ok();
}

Result<std::vector<float>> ModelReader::ReadF32(const std::string& name) const {
  const ModelTensorInfo* t = Find(name);
  if (t == nullptr) return NotFound(path_ + ": no tensor '" + name + "'");
  std::vector<float> out(static_cast<size_t>(t->numel()));
  L2L_RETURN_IF_ERROR(ReadF32(name, out.data(), out.size()));
  return out;
}

Result<std::unique_ptr<ModelReader>> ModelReader::Open(const std::string& path, const ModelOpenOptions& options) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError("stat", path, errno);
  if (S_ISDIR(st.st_mode)) {
    std::string dir = path;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    auto r = std::make_unique<HfDirReader>(dir);
    L2L_RETURN_IF_ERROR(r->Init());
    return std::unique_ptr<ModelReader>(std::move(r));
  }
  auto ends_with = [&](const std::string& s) {
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".safetensors") || ends_with(".json")) {
    return InvalidArgument(path + ": a Hugging Face model is read from its directory (config.json + model.safetensors "
                           "or model.safetensors.index.json); pass the directory, or a .gguf file");
  }
  L2L_ASSIGN_OR_RETURN(GgufReader g, GgufReader::Open(path));
  auto r = std::make_unique<GgufModelReader>(path, std::move(g));
  L2L_RETURN_IF_ERROR(r->Init(options));
  return std::unique_ptr<ModelReader>(std::move(r));
}

// ---- Names ----------------------------------------------------------------------------

namespace {

// "<stem>.weight" / "<stem>.bias" -> stem and suffix.
bool SplitSuffix(const std::string& name, std::string* stem, std::string* suffix) {
  for (const char* s : {".weight", ".bias"}) {
    const size_t n = std::strlen(s);
    if (name.size() > n && name.compare(name.size() - n, n, s) == 0) {
      *stem = name.substr(0, name.size() - n);
      *suffix = s;
      return true;
    }
  }
  return false;
}

// "<prefix><digits>.<rest>" -> layer number and rest.
bool SplitLayer(const std::string& stem, const std::string& prefix, std::string* layer, std::string* rest) {
  if (stem.compare(0, prefix.size(), prefix) != 0) return false;
  size_t i = prefix.size(), j = i;
  while (j < stem.size() && std::isdigit(static_cast<unsigned char>(stem[j]))) ++j;
  if (j == i || j >= stem.size() || stem[j] != '.' || (stem[i] == '0' && j - i > 1)) return false;
  *layer = stem.substr(i, j - i);
  *rest = stem.substr(j + 1);
  return true;
}
}  // namespace

std::optional<std::string> GgufToHfName(const models::FamilyInfo& family, const std::string& name) {
  std::string stem, suffix, layer, rest;
  if (!SplitSuffix(name, &stem, &suffix)) return std::nullopt;
  for (const models::NamePair& p : family.gguf_global_names) {
    if (stem == p.gguf) return std::string(p.hf) + suffix;
  }
  if (!SplitLayer(stem, "blk.", &layer, &rest)) return std::nullopt;
  for (const models::NamePair& p : family.gguf_block_names) {
    if (rest == p.gguf) return family.hf_block_prefix + layer + "." + p.hf + suffix;
  }
  return std::nullopt;
}

std::optional<std::string> HfToGgufName(const models::FamilyInfo& family, const std::string& name) {
  std::string stem, suffix, layer, rest;
  if (!SplitSuffix(name, &stem, &suffix)) return std::nullopt;
  for (const models::NamePair& p : family.gguf_global_names) {
    if (stem == p.hf) return std::string(p.gguf) + suffix;
  }
  if (!SplitLayer(stem, family.hf_block_prefix, &layer, &rest)) return std::nullopt;
  for (const models::NamePair& p : family.gguf_block_names) {
    if (rest == p.hf) return "blk." + layer + "." + p.gguf + suffix;
  }
  return std::nullopt;
}

std::optional<std::string> LlamaGgufToHfName(const std::string& name) {
  return GgufToHfName(models::LlamaFamily(), name);
}

std::optional<std::string> LlamaHfToGgufName(const std::string& name) {
  return HfToGgufName(models::LlamaFamily(), name);
}

}  // namespace l2l::formats
