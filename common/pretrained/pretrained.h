// Pretrained models in and out of l2l.
//
// Import: OpenPretrained(path) opens a Hugging Face model directory (config.json +
// model.safetensors or a sharded index; F32/F16/BF16) or a GGUF file (F32/F16/BF16/Q8_0/
// Q4_0/Q4_1) through formats::ModelReader with Hugging Face tensor names (Llama q/k rows
// unpermuted), derives the ModelSpec (config.json through the family registry's
// from_hf_config; GGUF metadata through ModelConfig, then the same registry call) and
// maps every parameter of BuildLayout(spec) to a tensor of the file. Everything that can
// be checked without reading weights is checked at Open, so a caller fails before it
// writes any state: every needed tensor present with its exact shape and a convertible
// dtype (ModelReader::CheckShape), no tensor left over (except Hugging Face's GPT-2
// attention-mask buffers and, with tied embeddings, an lm_head.weight, which must equal
// the embedding: compared at Open), the GGUF architecture known. LoadLayer(l, out) then
// fills layer l's flat fp32 buffer tensor by tensor (one tensor resident besides `out`)
// and refuses non-finite values. Errors are one line naming the file and the tensor.
//
// GPT-2 files store Conv1D weights (in, out), which is l2l's GPT-2 layout already: the
// shapes are checked, nothing is transposed. A GPT-2 directory may name tensors with or
// without "transformer." (save_pretrained vs the hub's files).
//
// Export: ExportHf writes config.json (the registry's to_hf_config), generation_config.json,
// weights as safetensors (sharded with an index above max_shard_bytes) and the tokenizer
// files of the Hugging Face directory the job was imported from; ExportGguf writes a GGUF
// (Llama family: llama.cpp names, q/k rows permuted for general.architecture "llama",
// tokenizer.* metadata copied from a GGUF the job was imported from). Both pull one layer
// at a time through a LayerSource, so a model larger than RAM exports.
//
// Ownership: a Pretrained owns its reader (file mappings). Thread-safety: a Pretrained is
// immutable after Open; LoadLayer may run on several threads for different layers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/formats/gguf.h"
#include "common/formats/model_reader.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace l2l {

struct JobConfig;

// How to open a base-model checkpoint without a task head (the family's
// hf_headless_architectures, e.g. BertModel); ignored for a file with its head.
struct PretrainedOptions {
  int64_t num_labels = -1;  // >= 0: the head to build (BERT: 0 masked LM, > 0 classes); -1: the family's default
  uint64_t init_seed = 0;   // seed of the head tensors the file lacks (InitLayerParams, as a new job's)
};

class Pretrained {
 public:
  static Result<std::unique_ptr<Pretrained>> Open(const std::string& path, const PretrainedOptions& options = {});

  const ModelSpec& spec() const { return spec_; }
  const std::string& path() const { return reader_->path(); }
  const formats::ModelReader& reader() const { return *reader_; }
  const std::vector<LayerLayout>& layout() const { return layout_; }
  // Fills layer l's layout()[l].numel floats.
  Status LoadLayer(int64_t l, float* out) const;
  // A base model without its head (BertModel): the head's missing tensors are initialised.
  bool headless() const { return headless_; }
  // Our names of the tensors LoadLayer initialises instead of reading ("" joined by ", ").
  const std::vector<std::string>& initialised() const { return initialised_; }

 private:
  Pretrained() = default;
  ModelSpec spec_;
  std::unique_ptr<formats::ModelReader> reader_;
  std::vector<LayerLayout> layout_;
  std::vector<std::vector<std::string>> file_names_;  // [layer][param]: the tensor in the file, "" = initialised
  bool headless_ = false;
  uint64_t init_seed_ = 0;
  std::vector<std::string> initialised_;
};

inline Result<std::unique_ptr<Pretrained>> OpenPretrained(const std::string& path) { return Pretrained::Open(path); }

// Applies `model.from` of a parsed job config (JobConfig::model_from; a no-op without
// it): opens `path` (the caller's resolution of model_from, e.g. confined to a daemon's
// state dir), replaces cfg->model by the file's spec after checking every model key the
// YAML also set against it (an error naming the key, both values and both places), sets
// cfg->imported_from = path, clears model_from and runs the config's cross-field checks.
// Returns the opened model for the caller's loader. A headless base model (BertModel) is
// opened with the head the YAML's model.num_labels picks (0: masked LM, the default) and
// train.seed for the head tensors it lacks; model.num_labels is then a choice, not a check.
Result<std::shared_ptr<const Pretrained>> ResolveModelFrom(JobConfig* cfg, const std::string& path);

// Reads layer l's fp32 values (layout numel floats) into out.
using LayerSource = std::function<Status(int64_t layer, float* out)>;

struct HfExportOptions {
  DType dtype = DType::kF32;                    // kF32 or kBF16
  uint64_t max_shard_bytes = 5'000'000'000;     // transformers' default "5GB"
  std::string imported_from;                    // HF dir: its tokenizer/generation files are copied
};
// Writes `dir` (created if needed). Returns the bytes of weights written.
Result<int64_t> ExportHf(const std::string& dir, const ModelSpec& spec, const LayerSource& read,
                         const HfExportOptions& options = {});

struct GgufExportOptions {
  // kF32, kF16, kBF16 or kQ8_0 for 2-D weights (rows that are not whole Q8_0 blocks: F32);
  // ignored when q4_k_m is set.
  formats::GgmlType type = formats::GgmlType::kF32;
  // llama.cpp's Q4_K_M mix, tensor by tensor (common/formats/gguf_recipe.h).
  bool q4_k_m = false;
  std::string imported_from;   // a GGUF: its tokenizer.* metadata is copied
  // Written after the keys above, replacing any of the same name: the tokenizer of a
  // Hugging Face import as GGUF metadata (tok::GgufTokenizerMetadataFromHf).
  std::vector<std::pair<std::string, formats::GgufValue>> metadata;
  std::string name = "l2l";    // general.name
};
// Llama family only. Returns the file's size.
Result<int64_t> ExportGguf(const std::string& path, const ModelSpec& spec, const LayerSource& read,
                           const GgufExportOptions& options = {});

}  // namespace l2l
