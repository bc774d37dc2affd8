// A LoRA adapter as plain data, and merging it into a model's weights.
//
// An adapter is a set of low-rank updates of linear weights: for a module with base weight
// W (out, in), delta W = scale * B A with A (r, in), B (out, r) and scale = alpha / r
// (alpha / sqrt(r) with rsLoRA). Modules are named as Hugging Face names them in the
// *ForCausalLM model ("model.layers.3.self_attn.q_proj", "transformer.h.0.attn.c_attn"),
// the names PEFT's adapter files use after "base_model.model.". An adapter may also carry
// modules_to_save: tensors trained in full beside the low-rank updates (an untied
// lm_head, the embedding), which REPLACE the base model's tensors of the same Hugging
// Face name. The writers (peft_adapter.h, gguf_lora.h) and the reader (peft_adapter.h)
// speak this struct; a LoRA job's layers become one through lora_export.h
// (AdapterFromLayers).
//
// Merging: l2l's layers hold each linear weight in the family's Hugging Face orientation
// ((out, in) for torch.nn.Linear; (in, out) for GPT-2's Conv1D, FamilyInfo::
// hf_weights_in_out), so W += scale * B A, or its transpose, is added in place to a layer's
// flat fp32 buffer (BuildLayout order). MatchLoraToModel checks an adapter against a model
// before anything is merged: every module a 2-D weight of the model with the adapter's
// (out, in), every saved tensor a tensor of the model with its shape; errors naming the
// module, its shapes and the model's. Saved tensors are copied over the model's.
//
// Thread-safety: plain values and free functions.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "common/status.h"

namespace l2l::formats {

struct LoraModuleWeights {
  std::string module;  // "model.layers.3.self_attn.q_proj"
  int64_t in = 0;      // the base linear's input features
  int64_t out = 0;     // and output features
  std::vector<float> a;  // (r, in) row-major: PEFT's lora_A.weight
  std::vector<float> b;  // (out, r) row-major: PEFT's lora_B.weight
};

// A modules_to_save tensor: PEFT stores it as "base_model.model.<name>" (e.g.
// "base_model.model.lm_head.weight") and loads it into <module>.modules_to_save.<adapter>.
struct LoraSavedTensor {
  std::string name;            // the Hugging Face tensor name: "lm_head.weight", "model.embed_tokens.weight"
  std::vector<int64_t> shape;  // as the model holds it
  std::vector<float> values;   // row-major, product(shape) values
};

struct LoraAdapter {
  int64_t r = 0;                            // rank
  double alpha = 0;                         // lora_alpha
  bool use_rslora = false;                  // scale alpha / sqrt(r) instead of alpha / r
  double dropout = 0;                       // lora_dropout (training only; recorded)
  std::vector<std::string> target_modules;  // PEFT's target_modules: "q_proj", "v_proj", ...
  std::string base_model;                   // base_model_name_or_path ("" when unknown)
  ModelFamily family = ModelFamily::kLlama;  // the base model's family (writers need it)
  std::vector<LoraModuleWeights> modules;
  // PEFT's modules_to_save (module names as PEFT matches them by suffix: "lm_head",
  // "embed_tokens") and their trained tensors (every tensor of those modules).
  std::vector<std::string> modules_to_save;
  std::vector<LoraSavedTensor> saved;

  double scale() const;  // alpha / r, or alpha / sqrt(r) with use_rslora
};

// r > 0, finite alpha, dropout in [0, 1), at least one module, unique non-empty module
// names, in/out > 0, a.size() == r*in, b.size() == r*out, finite values; saved tensors
// with unique names, positive dims, product(shape) finite values, each of a module in
// modules_to_save (its name without the last component ends with "." + the module, or
// is it) and every module in modules_to_save with at least one saved tensor.
Status ValidateLoraAdapter(const LoraAdapter& adapter);

// The Hugging Face module name of one of spec's 2-D weights: "layers.3.self_attn.q_proj.weight"
// -> "model.layers.3.self_attn.q_proj" (the family's hf_base_prefix; "lm_head" for the
// untied head).
std::string HfModuleName(const ModelSpec& spec, const ParamInfo& param);
// The same with the last component kept, i.e. the parameter's name in the transformers
// *ForCausalLM model (named_parameters; PEFT's keys after "base_model.model."):
// "model.layers.3.self_attn.q_proj.weight", "lm_head.weight", "transformer.ln_f.bias"
// (unlike common/model_spec.h HfTensorName, the name in the family's checkpoint files,
// which for GPT-2 lacks "transformer.").
std::string HfParameterName(const ModelSpec& spec, const ParamInfo& param);

// Where a module lives in a model.
struct LoraTarget {
  int64_t layer = 0;               // index into the layout
  const ParamInfo* param = nullptr;  // a 2-D weight of layout[layer] (points into `layout`)
};

// One target per adapter.modules entry, in its order. Errors (InvalidArgument, naming the
// module): a module that is no 2-D weight of the model (the message lists a few module
// names the model has), or whose (out, in) differs from the weight's; a saved tensor that
// is no tensor of the model, or of another shape.
Result<std::vector<LoraTarget>> MatchLoraToModel(const ModelSpec& spec, const std::vector<LayerLayout>& layout,
                                                 const LoraAdapter& adapter);

// W += scale * B A for every module of `adapter` in layer `layer` (layout[layer].numel
// floats at `data`, fp32; the product accumulated in double), and the saved tensors of
// the layer copied over the model's. The adapter is matched against the model first
// (MatchLoraToModel's errors).
Status MergeLoraIntoLayer(const ModelSpec& spec, const std::vector<LayerLayout>& layout, const LoraAdapter& adapter,
                          int64_t layer, float* data);

// The same for a whole model held as one buffer per layer (BuildLayout order).
Status MergeLoraIntoModel(const ModelSpec& spec, const LoraAdapter& adapter, std::vector<std::vector<float>>* layers);

// A layer reader (the shape of common/pretrained's LayerSource: fill layer l's
// layout-numel floats) that returns `read`'s layer with `adapter` merged in: ExportHf /
// ExportGguf of it write the merged model (l2lctl export --merge). The adapter is matched
// against spec here, so a misfit fails before any layer is read.
using LayerReader = std::function<Status(int64_t layer, float* out)>;
Result<LayerReader> MergedLayerReader(const ModelSpec& spec, LayerReader read,
                                      std::shared_ptr<const LoraAdapter> adapter);

}  // namespace l2l::formats
