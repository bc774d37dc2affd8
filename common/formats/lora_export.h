// A LoRA job's layers (common/lora.h BuildLoraLayout: base tensors, then per targeted
// linear lora_A / lora_B) turned into what exports write, one layer at a time:
//
//   AdapterFromLayers   the trained adapter (formats::LoraAdapter): every A and B
//                       (ExtractLoraAdapters' values and module names) and the
//                       modules_to_save tensors as trained, under their Hugging Face
//                       names; r, alpha, dropout, target_modules (the resolved targets'
//                       module names, once each), family from the job. Written with
//                       WritePeftAdapter (peft_adapter.h) or WriteGgufLora (gguf_lora.h).
//   MergedLayerSource   a layer reader of the MERGED model in BuildLayout(spec) order
//                       (W + scale * B A in the family's orientation, MergeLoraIntoLayer;
//                       modules_to_save tensors as trained), for ExportHf / ExportGguf /
//                       SaveModelStreamed (l2lctl export --merge).
//
// Both pull layers through `read_full_layer(l, out)`, which fills BuildLoraLayout(spec,
// lora)[l].numel floats (the daemon's EpsCore::ExportWith reader of a LoRA job), and hold
// one LoRA layer at a time (AdapterFromLayers also the adapter it builds).
//
// Thread-safety: free functions; the returned reader holds its own copies of spec and
// lora and may be called from one thread at a time.
#pragma once

#include <cstdint>
#include <functional>

#include "common/formats/lora_adapter.h"
#include "common/lora.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace l2l::formats {

// Fills layer l's BuildLoraLayout(spec, lora)[l].numel floats.
using LoraLayerReader = std::function<Status(int64_t layer, float* out)>;

// The adapter of a LoRA job. Errors: lora not enabled or invalid for spec (ValidateLora's
// message), the reader's (with the layer's index), a result ValidateLoraAdapter refuses
// (e.g. a non-finite trained value, naming the module).
Result<LoraAdapter> AdapterFromLayers(const ModelSpec& spec, const LoraConfig& lora,
                                      const LoraLayerReader& read_full_layer);

// A reader of the merged model: reader(l, out) fills BuildLayout(spec)[l].numel floats.
// REQUIRES: lora.enabled and ValidateLora(spec, lora) ok (otherwise every call returns
// ValidateLora's error). Each call reads layer l once through read_full_layer.
std::function<Status(int64_t, float*)> MergedLayerSource(const ModelSpec& spec, const LoraConfig& lora,
                                                         LoraLayerReader read_full_layer);

}  // namespace l2l::formats
