// Whole-model import/export as safetensors with the family's Hugging Face tensor names
// (HfTensorName, common/model_spec.h) and layouts, so a model trained by l2l loads in
// transformers (GPT2LMHeadModel, LlamaForCausalLM, ...) and a GPT-2
// checkpoint from the hub loads into l2l.
//
// In memory a model is one flat fp32 buffer per layer, in model order (embedding,
// blocks, head), laid out by BuildLayout(spec) (common/model_spec.h). In the file each
// ParamInfo becomes one tensor under its HF name: wte.weight (V,C), wpe.weight (T,C),
// h.{i}.ln_1.weight (C), h.{i}.attn.c_attn.weight (C,3C) [Conv1D: (in, out)], ...,
// ln_f.weight/bias (C), and lm_head.weight (V,C) only when embeddings are untied (HF ties
// it to wte and does not store it).
//
// Metadata: "format": "pt" (transformers requires it) and "l2l.model_spec": the
// ModelSpec as JSON, so l2l reloads a file without a config.
//
// Loading rules:
//   * every tensor of the layout must be present with exactly its shape; the error
//     names the tensor, the expected and the found shape;
//   * F32, BF16 and F16 are converted to fp32;
//   * names may carry the base model's prefix ("transformer." for GPT-2, as
//     GPT2LMHeadModel.state_dict(); "model." for Llama) or not;
//   * GPT-2 is described below; other families name their tensors as their HF class
//     does (common/models/<family>.cc) and store them under HfTensorName.
//   * HF's non-parameter buffers "h.{i}.attn.bias" and "h.{i}.attn.masked_bias" (causal
//     masks in older checkpoints) are ignored;
//   * with tied embeddings a stored "lm_head.weight" is accepted only if it equals
//     wte.weight (as HF writes it when ties are saved), since otherwise trained weights
//     would be dropped silently;
//   * any other tensor is an error: a file for a different model must not load
//     partially.
//
// Thread-safety: pure functions over caller-owned data.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace l2l {

inline constexpr char kModelSpecMetadataKey[] = "l2l.model_spec";

std::string ModelSpecToJson(const ModelSpec& spec);
// Strict: every field present and an integer/bool of the right kind; validated.
Result<ModelSpec> ModelSpecFromJson(const std::string& text);

// layers[i] holds BuildLayout(spec)[i].numel floats. dtype: F32, BF16 or F16 in the file.
Status SaveModel(const std::string& path, const ModelSpec& spec, const std::vector<std::vector<float>>& layers,
                 DType dtype = DType::kF32, const std::map<std::string, std::string>& extra_metadata = {});
// The same file, streamed: read_layer(l, out) fills layer l's numel fp32 values; it is
// called once per layer, in model order, and only one layer is held in memory (the
// daemon's Export of a model larger than RAM). Its errors abort the write (no file).
Status SaveModelStreamed(const std::string& path, const ModelSpec& spec,
                         const std::function<Status(int64_t layer, float* out)>& read_layer,
                         DType dtype = DType::kF32, const std::map<std::string, std::string>& extra_metadata = {});

struct LoadedModel {
  ModelSpec spec;
  std::vector<std::vector<float>> layers;        // in model order, fp32
  std::map<std::string, std::string> metadata;   // the file's __metadata__
};

// Loads a file written by SaveModel (the spec comes from its metadata).
Result<LoadedModel> LoadModel(const std::string& path);
// Loads a file for a known spec (e.g. a hub GPT-2 without l2l metadata). When the file
// does carry a spec it must equal `spec`.
Result<LoadedModel> LoadModel(const std::string& path, const ModelSpec& spec);
// The spec stored in a file's metadata (NotFound when it has none).
Result<ModelSpec> ReadModelSpec(const std::string& path);

}  // namespace l2l
