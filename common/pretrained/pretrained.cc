// Pretrained import (Hugging Face dir / GGUF -> ModelSpec + per-layer loader), the job
// config's model.from, and streamed export to Hugging Face / GGUF. See pretrained.h.
#include "common/pretrained/pretrained.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/file_util.h"
#include "common/formats/gguf_recipe.h"
#include "common/formats/gguf_writer.h"
#include "common/formats/hf_writer.h"
#include "common/formats/model_config.h"
#include "common/model_spec_table.h"
#include "common/models/family_util.h"
#include "common/models/registry.h"

namespace l2l {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using formats::ModelFormat;
using formats::ModelReader;

// The registry's row of a GGUF general.architecture.
Result<const models::GgufArch*> GgufArchitecture(const formats::ModelConfig& c) {
  const models::FamilyInfo* family = nullptr;
  if (const models::GgufArch* a = models::FindGgufArchitecture(c.model_type, &family)) return a;
  return Unimplemented(c.source + ": GGUF general.architecture '" + c.model_type +
                       "' is not supported (l2l imports " + models::KnownGgufArchitectures() + " GGUF files)");
}

bool IsDir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

Result<std::unique_ptr<Pretrained>> Pretrained::Open(const std::string& path, const PretrainedOptions& options) {
  std::unique_ptr<Pretrained> p(new Pretrained());
  L2L_ASSIGN_OR_RETURN(p->reader_, ModelReader::Open(path, {.gguf_hf_names = true}));
  const ModelReader& r = *p->reader_;
  const formats::ModelConfig& c = r.config();
  if (r.format() == ModelFormat::kHfDir) {
    L2L_ASSIGN_OR_RETURN(p->spec_, models::SpecFromHfConfig(c.raw_json, c.source));
    const models::FamilyInfo& f = models::Family(p->spec_.family);
    const std::string arch = c.raw_json["architectures"][0].get<std::string>();
    for (const std::string& a : f.hf_headless_architectures) p->headless_ = p->headless_ || a == arch;
    if (p->headless_ && options.num_labels >= 0) {
      p->spec_.num_labels = options.num_labels;
      p->spec_.tied_embeddings = options.num_labels == 0;  // the masked-LM decoder is the embedding
      if (Status st = p->spec_.Validate(); !st.ok()) return st.WithContext(c.source + " (headless " + arch + ")");
    }
    p->init_seed_ = options.init_seed;
  } else {
    L2L_ASSIGN_OR_RETURN(const models::GgufArch* arch, GgufArchitecture(c));
    formats::ModelConfig hc = c;
    hc.architecture = arch->hf_architecture;
    hc.model_type = arch->hf_model_type;
    // The head size: attention.key_length, else embedding_length / head_count.
    std::optional<int64_t> head = hc.head_dim;
    if (!head && hc.hidden_size && hc.num_attention_heads && *hc.num_attention_heads > 0) {
      head = *hc.hidden_size / *hc.num_attention_heads;
    }
    if (hc.rope_dimension_count && head && *hc.rope_dimension_count != *head) {
      return InvalidArgument(c.source + ": rope.dimension_count=" + std::to_string(*hc.rope_dimension_count) +
                             " differs from the head size " + std::to_string(*head) +
                             " (partial rotary embeddings are not supported)");
    }
    json j = formats::HfConfigJson(hc);
    if (head && !j.contains("head_dim")) j["head_dim"] = *head;
    const models::FamilyInfo* arch_family = nullptr;
    models::FindGgufArchitecture(c.model_type, &arch_family);
    if (arch_family != nullptr && arch_family->gguf_hf_config_defaults != nullptr) {
      arch_family->gguf_hf_config_defaults(&j);
    }
    L2L_ASSIGN_OR_RETURN(p->spec_, models::SpecFromHfConfig(j, c.source));
  }
  p->layout_ = BuildLayout(p->spec_);
  const models::FamilyInfo& fam = models::Family(p->spec_.family);
  const std::string base = fam.hf_base_prefix;
  // Every tensor the layout needs, under the name the file uses.
  std::set<std::string> used;
  p->file_names_.resize(p->layout_.size());
  for (size_t l = 0; l < p->layout_.size(); ++l) {
    for (const ParamInfo& param : p->layout_[l].params) {
      std::vector<std::string> names = {HfTensorName(p->spec_, param)};
      if (param.name != "lm_head.weight") {
        names.push_back(base + param.name);
        names.push_back(param.name);
      }
      std::string found;
      for (const std::string& n : names) {
        if (r.Find(n) != nullptr) {
          if (!found.empty() && found != n) {
            return InvalidArgument(r.path() + ": tensor '" + param.name + "' is stored twice ('" + found + "' and '" + n + "')");
          }
          found = n;
        }
      }
      if (found.empty() && p->headless_ && l + 1 == p->layout_.size()) {
        p->file_names_[l].push_back("");  // the head a base model lacks: initialised by LoadLayer
        p->initialised_.push_back(param.name);
        continue;
      }
      if (found.empty()) found = names[0];  // CheckShape names it as missing
      L2L_RETURN_IF_ERROR(r.CheckShape(found, param.shape));
      used.insert(found);
      p->file_names_[l].push_back(found);
    }
  }
  // Nothing left over.
  auto skipped = [&](const std::string& name) {
    if (models::IsIgnoredHfTensor(fam, name)) return true;
    if (!p->headless_) return false;
    for (const std::string& unused : fam.hf_unused_base_tensors) {
      if (name == unused || name == base + unused) return true;
    }
    return false;
  };
  for (const formats::ModelTensorInfo& t : r.tensors()) {
    if (used.count(t.name)) continue;
    if (skipped(t.name)) continue;
    if (t.name == "lm_head.weight" && p->spec_.tied_embeddings) {
      // Tied: a stored head must be the embedding itself, or trained weights would be dropped.
      const std::string emb = p->file_names_[0][0];
      L2L_RETURN_IF_ERROR(r.CheckShape(t.name, r.Find(emb)->shape));
      L2L_ASSIGN_OR_RETURN(std::vector<float> a, r.ReadF32(emb));
      L2L_ASSIGN_OR_RETURN(std::vector<float> b, r.ReadF32(t.name));
      if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
        return InvalidArgument(r.FileOf(t.name) + ": tensor 'lm_head.weight' differs from '" + emb +
                               "' but the config ties the embeddings (tie_word_embeddings)");
      }
      continue;
    }
    std::string shape;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    return InvalidArgument(r.FileOf(t.name) + ": tensor '" + t.name + "' (shape [" + shape + "], " + t.dtype +
                           ") is not a parameter of the " + ToString(p->spec_.family) + " model its config describes");
  }
  return p;
}

Status Pretrained::LoadLayer(int64_t l, float* out) const {
  if (l < 0 || l >= static_cast<int64_t>(layout_.size())) {
    return InvalidArgument(path() + ": layer " + std::to_string(l) + " out of range");
  }
  const LayerLayout& lay = layout_[static_cast<size_t>(l)];
  const std::vector<std::string>& names = file_names_[static_cast<size_t>(l)];
  if (std::find(names.begin(), names.end(), std::string()) != names.end()) {
    InitLayerParams(spec_, lay, init_seed_, out);  // then the tensors the file has overwrite theirs
  }
  for (size_t k = 0; k < lay.params.size(); ++k) {
    const ParamInfo& param = lay.params[k];
    const std::string& name = names[k];
    if (name.empty()) continue;
    float* dst = out + param.offset;
    L2L_RETURN_IF_ERROR(reader_->ReadF32(name, dst, param.numel));
    const float shift = models::Family(spec_.family).gguf_norm_shift;
    if (shift != 0.0f && reader_->format() == ModelFormat::kGguf && models::EndsWith(param.name, "norm.weight")) {
      for (size_t i = 0; i < param.numel; ++i) dst[i] -= shift;  // the file holds w + shift
    }
    for (size_t i = 0; i < param.numel; ++i) {
      if (!std::isfinite(dst[i])) {
        return InvalidArgument(reader_->FileOf(name) + ": tensor '" + name + "' holds a non-finite value (" +
                               std::to_string(dst[i]) + ") at flat index " + std::to_string(i));
      }
    }
  }
  return Status::Ok();
}

Result<std::shared_ptr<const Pretrained>> ResolveModelFrom(JobConfig* cfg, const std::string& path) {
  PretrainedOptions opts;
  opts.init_seed = cfg->train.seed;
  for (const auto& [key, where] : cfg->model_keys_set) {
    if (key == "num_labels") opts.num_labels = cfg->model.num_labels;
  }
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<Pretrained> p, Pretrained::Open(path, opts));
  const ModelSpec& file = p->spec();
  for (const auto& [key, where] : cfg->model_keys_set) {
    if (p->headless() && key == "num_labels") continue;  // a headless base model's head is the job's choice
    if (!SameSpecKey(cfg->model, file, key)) {
      return InvalidArgument(where + ": model." + key + "=" + SpecKeyText(cfg->model, key) + " contradicts " + path +
                             ", which has " + key + "=" + SpecKeyText(file, key) + " (drop the key: model.from gives the model)");
    }
  }
  cfg->model = file;
  cfg->imported_from = path;
  cfg->model_from.clear();
  cfg->model_from_written.clear();
  cfg->model_keys_set.clear();
  if (cfg->train.seq_len > cfg->model.seq_len) {
    return InvalidArgument("train.seq_len=" + std::to_string(cfg->train.seq_len) + " exceeds the context of " + path +
                           " (" + std::to_string(cfg->model.seq_len) + ")");
  }
  L2L_RETURN_IF_ERROR(cfg->Validate());
  return std::shared_ptr<const Pretrained>(std::move(p));
}

// ---- Export ---------------------------------------------------------------------------

namespace {

// Hands out one layer at a time to writers that ask for tensors in model order.
class LayerCache {
 public:
  LayerCache(const ModelSpec& spec, const LayerSource& read) : layout_(BuildLayout(spec)), read_(read) {}
  const std::vector<LayerLayout>& layout() const { return layout_; }
  Result<const float*> Tensor(int64_t l, const ParamInfo& p) {
    if (l != cur_) {
      buf_.assign(layout_[static_cast<size_t>(l)].numel, 0.0f);
      L2L_RETURN_IF_ERROR(read_(l, buf_.data()));
      cur_ = l;
    }
    return buf_.data() + p.offset;
  }
  std::vector<float>* scratch() { return &scratch_; }

 private:
  std::vector<LayerLayout> layout_;
  const LayerSource& read_;
  int64_t cur_ = -1;
  std::vector<float> buf_, scratch_;
};

const char* kTokenizerFiles[] = {"tokenizer.json",   "tokenizer_config.json", "special_tokens_map.json",
                                 "vocab.json",       "merges.txt",            "tokenizer.model",
                                 "added_tokens.json", "chat_template.json",   "chat_template.jinja"};

Status CopyFileAtomic(const std::string& from, const std::string& to) {
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(from));
  return WriteFileAtomic(to, text.data(), text.size());
}

}  // namespace

Result<int64_t> ExportHf(const std::string& dir, const ModelSpec& spec, const LayerSource& read,
                         const HfExportOptions& o) {
  if (o.dtype != DType::kF32 && o.dtype != DType::kBF16) {
    return InvalidArgument(std::string("HF export dtype ") + DTypeName(o.dtype) + " is not supported (f32 or bf16)");
  }
  L2L_RETURN_IF_ERROR(spec.Validate());
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InvalidArgument(dir + ": cannot create the directory: " + ec.message());
  LayerCache cache(spec, read);
  std::vector<TensorToWrite> tensors;
  for (const LayerLayout& lay : cache.layout()) {
    for (const ParamInfo& p : lay.params) {
      TensorToWrite t;
      t.name = HfTensorName(spec, p);
      t.shape = p.shape;
      t.dtype = o.dtype;
      const int64_t l = lay.index;
      const ParamInfo* pp = &p;
      t.f32_source = [&cache, l, pp]() { return cache.Tensor(l, *pp); };
      tensors.push_back(std::move(t));
    }
  }
  formats::HfWriteOptions wo;
  wo.max_shard_bytes = o.max_shard_bytes;
  L2L_ASSIGN_OR_RETURN(std::vector<std::string> files, formats::WriteHfSafetensors(dir, tensors, wo));
  int64_t bytes = 0;
  for (const std::string& f : files) bytes += static_cast<int64_t>(fs::file_size(fs::path(dir) / f, ec));

  json config = models::Family(spec.family).to_hf_config(spec);
  config["torch_dtype"] = o.dtype == DType::kBF16 ? "bfloat16" : "float32";
  json gen = {{"_from_model_config", true}};
  const bool from_hf = !o.imported_from.empty() && IsDir(o.imported_from);
  if (from_hf) {
    // Token ids the imported model's config states travel with it.
    if (Result<formats::ModelConfig> src = formats::ReadHfConfig(o.imported_from + "/config.json"); src.ok()) {
      for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
        if (src->raw_json.contains(key)) config[key] = src->raw_json[key];
      }
    }
  } else if (!o.imported_from.empty()) {
    if (Result<formats::GgufReader> g = formats::GgufReader::Open(o.imported_from); g.ok()) {
      if (Result<uint64_t> v = g->GetUInt("tokenizer.ggml.bos_token_id"); v.ok()) config["bos_token_id"] = *v;
      if (Result<uint64_t> v = g->GetUInt("tokenizer.ggml.eos_token_id"); v.ok()) config["eos_token_id"] = *v;
    }
  }
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"}) {
    if (config.contains(key)) gen[key] = config[key];
  }
  const std::string ctext = config.dump(2) + "\n";
  L2L_RETURN_IF_ERROR(WriteFileAtomic(dir + "/config.json", ctext.data(), ctext.size()));
  if (from_hf && fs::is_regular_file(o.imported_from + "/generation_config.json", ec)) {
    L2L_RETURN_IF_ERROR(CopyFileAtomic(o.imported_from + "/generation_config.json", dir + "/generation_config.json"));
  } else {
    const std::string gtext = gen.dump(2) + "\n";
    L2L_RETURN_IF_ERROR(WriteFileAtomic(dir + "/generation_config.json", gtext.data(), gtext.size()));
  }
  if (from_hf) {
    for (const char* f : kTokenizerFiles) {
      const std::string src = o.imported_from + "/" + f;
      if (fs::is_regular_file(src, ec)) L2L_RETURN_IF_ERROR(CopyFileAtomic(src, dir + "/" + f));
    }
  }
  return bytes;
}

Result<int64_t> ExportGguf(const std::string& path, const ModelSpec& spec, const LayerSource& read,
                           const GgufExportOptions& o) {
  using formats::GgmlType;
  const models::FamilyInfo& fam = models::Family(spec.family);
  if (fam.gguf_export_architecture == nullptr) {
    return Unimplemented(std::string("GGUF export of the ") + ToString(spec.family) +
                         " family is not supported (Llama family only; use --format hf)");
  }
  if (fam.gguf_export_architecture(spec) == nullptr) {
    return Unimplemented("GGUF export of a mixture-of-experts model (model.num_experts=" +
                         std::to_string(spec.num_experts) + ") is not supported; use --format hf");
  }
  if (!o.q4_k_m && o.type != GgmlType::kF32 && o.type != GgmlType::kF16 && o.type != GgmlType::kBF16 &&
      o.type != GgmlType::kQ8_0) {
    return InvalidArgument(std::string("GGUF export type ") + formats::GgmlTypeName(o.type) +
                           " is not supported (f32, f16, bf16, q8_0, q4_k_m)");
  }
  L2L_RETURN_IF_ERROR(spec.Validate());
  formats::ModelConfig c;
  c.source = path;
  c.model_type = fam.gguf_export_architecture(spec);
  c.vocab_size = spec.vocab_size;
  c.hidden_size = spec.d_model;
  c.intermediate_size = spec.d_ff;
  c.num_hidden_layers = spec.n_layer;
  c.num_attention_heads = spec.n_head;
  c.num_key_value_heads = spec.kv_heads();
  c.max_position_embeddings = spec.seq_len;
  c.rope_theta = spec.rope_theta;
  c.rms_norm_eps = spec.rms_norm_eps;
  if (spec.head_size > 0) c.head_dim = spec.head_dim();
  if (spec.sliding_window > 0) c.sliding_window = spec.sliding_window;
  if (fam.gguf_export_check != nullptr) {
    if (Status st = fam.gguf_export_check(spec); !st.ok()) return st.WithContext(path);
  }
  formats::GgufWriter w;
  L2L_RETURN_IF_ERROR(formats::AddConfigToGguf(c, &w));
  w.Set("general.name", formats::GgufValue::String(o.name));
  // llama.h's llama_ftype: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7, MOSTLY_Q4_K_M 15, MOSTLY_BF16 32.
  const uint32_t file_type = o.q4_k_m                     ? formats::kGgufFileTypeQ4_K_M
                             : o.type == GgmlType::kQ8_0 ? 7
                             : o.type == GgmlType::kF16  ? 1
                             : o.type == GgmlType::kBF16 ? 32
                                                         : 0;
  w.Set("general.file_type", formats::GgufValue::U32(file_type));
  std::optional<formats::GgufReader> src;
  if (!o.imported_from.empty() && !IsDir(o.imported_from)) {
    Result<formats::GgufReader> g = formats::GgufReader::Open(o.imported_from);
    if (!g.ok()) return g.status().WithContext("GGUF export: reading the tokenizer of the imported file");
    src.emplace(std::move(*g));
    for (const std::string& key : src->keys()) {
      if (key.rfind("tokenizer.", 0) == 0) w.Set(key, *src->Get(key));
    }
  }
  for (const auto& [key, value] : o.metadata) w.Set(key, value);
  LayerCache cache(spec, read);
  const models::FamilyInfo* arch_family = nullptr;
  const models::GgufArch* arch = models::FindGgufArchitecture(c.model_type, &arch_family);
  const bool permute = arch != nullptr && arch->permuted_qk;
  bool has_output = false;  // an untied head: the Q4_K_M mix gives token_embd Q6_K otherwise
  for (const LayerLayout& lay : cache.layout()) {
    for (const ParamInfo& p : lay.params) {
      has_output |= formats::HfToGgufName(fam, HfTensorName(spec, p)) == std::optional<std::string>("output.weight");
    }
  }
  for (const LayerLayout& lay : cache.layout()) {
    for (const ParamInfo& p : lay.params) {
      const std::string hf = HfTensorName(spec, p);
      std::optional<std::string> name = formats::HfToGgufName(fam, hf);
      if (!name) return Internal("no GGUF name for tensor '" + hf + "'");
      formats::GgufTensorToWrite t;
      t.name = *name;
      t.shape = p.shape;
      t.type = p.shape.size() == 2 && (o.type != GgmlType::kQ8_0 || p.shape.back() % 32 == 0) ? o.type : GgmlType::kF32;
      if (o.q4_k_m) t.type = formats::Q4KMTensorType(t.name, p.shape, spec.n_layer, has_output);
      const int64_t l = lay.index;
      const ParamInfo* pp = &p;
      int64_t heads = 0;
      if (permute && (t.name.find(".attn_q.") != std::string::npos)) heads = spec.n_head;
      if (permute && (t.name.find(".attn_k.") != std::string::npos)) heads = spec.kv_heads();
      const float shift = models::EndsWith(p.name, "norm.weight") ? fam.gguf_norm_shift : 0.0f;
      t.f32_source = [&cache, l, pp, heads, shift]() -> Result<const float*> {
        L2L_ASSIGN_OR_RETURN(const float* v, cache.Tensor(l, *pp));
        if (shift != 0.0f) {  // the family's GGUF form of a norm weight (Gemma: 1 + w)
          std::vector<float>* s = cache.scratch();
          s->assign(v, v + pp->numel);
          for (float& x : *s) x += shift;
          return static_cast<const float*>(s->data());
        }
        if (heads == 0) return v;
        std::vector<float>* s = cache.scratch();
        s->assign(pp->numel, 0.0f);
        const int64_t rows = pp->shape[0], cols = static_cast<int64_t>(pp->numel) / rows;
        L2L_RETURN_IF_ERROR(formats::PermuteLlamaRows(v, s->data(), rows, cols, heads));
        return static_cast<const float*>(s->data());
      };
      L2L_RETURN_IF_ERROR(w.AddTensor(std::move(t)));
    }
  }
  L2L_RETURN_IF_ERROR(w.Write(path));
  std::error_code ec;
  const auto bytes = fs::file_size(path, ec);
  return ec ? int64_t{0} : static_cast<int64_t>(bytes);
}

}  // namespace l2l
