// "Load a model for inference": the spec, the fp32 weights of every layer and where its
// tokenizer comes from, from any of the places a model lives:
//   - a Hugging Face model directory (config.json + safetensors) or a GGUF file, through
//     Pretrained (common/pretrained); the tokenizer is the same path;
//   - an EPS checkpoint directory (manifest.json) or a checkpoint root (`latest`): the
//     job's model spec from the manifest, each layer's fp32 master read from its layer
//     file (64-byte header, then master, m, v; sizes checked against the manifest and
//     the layout); the tokenizer is the job's imported_from, when it has one;
//   - an l2l safetensors file (common/formats/model_io.h's SaveModel, l2lctl export): no tokenizer.
// Errors are one line naming the path (and the layer file) that is wrong.
//
// Thread-safety: free functions; the result is a plain value owned by the caller.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/model_spec.h"
#include "common/pretrained/pretrained.h"
#include "common/status.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::tools {

enum class ModelSourceKind { kHfDir, kGguf, kCheckpoint, kSafetensors };
const char* ModelSourceKindName(ModelSourceKind k);

struct InferenceModel {
  ModelSpec spec;
  std::vector<std::vector<float>> layers;  // BuildLayout(spec) order, fp32
  ModelSourceKind kind = ModelSourceKind::kSafetensors;
  std::string path;            // the model as resolved (for a checkpoint: its step directory)
  std::string tokenizer_path;  // model dir, tokenizer.json or GGUF; "" when none is known
  int64_t step = -1;           // a checkpoint's optimizer step; -1 otherwise
  std::string adapter;         // a LoRA adapter merged into `layers` (ApplyAdapter); "" = none
};

// Detects the kind of `path` (directory with manifest.json or `latest`: checkpoint;
// directory with config.json: Hugging Face; a GGUF file; otherwise safetensors) and loads it.
// `pretrained` applies to a headless base model (BertModel): the head to build and the
// seed of its initialisation, as a job's model.num_labels and train.seed would.
Result<InferenceModel> LoadInferenceModel(const std::string& path, const PretrainedOptions& pretrained = {});

// A checkpoint directory or checkpoint root only.
Result<InferenceModel> LoadCheckpointModel(const std::string& path);

// Reads the PEFT LoRA adapter directory `dir` (common/formats/peft_adapter.h) and merges it
// into m's fp32 weights: W += scale * B A for every module (l2l-eval / l2l-sample
// --adapter). An adapter that does not fit the model (a module name it lacks, other
// shapes) fails before any weight changes, naming the module, and the adapter dir.
Status ApplyAdapter(InferenceModel* m, const std::string& dir);

// A CPU ReferenceTrainer over m's weights (moved out of m->layers), used for its forward
// pass only (Evaluate, Probs).
Result<std::unique_ptr<worker::ReferenceTrainer>> CreateInferenceTrainer(InferenceModel* m);

// "hf PATH", "checkpoint DIR (step N)", "... + adapter DIR", ... for messages.
std::string DescribeModel(const InferenceModel& m);

}  // namespace l2l::tools
