// A minimal writer of Hugging Face PEFT LoRA adapters (a directory PeftModel.from_pretrained
// loads): adapter_config.json and adapter_model.safetensors with PEFT's key names,
//   base_model.model.<module>.lora_A.weight  (r, in)   fp32
//   base_model.model.<module>.lora_B.weight  (out, r)  fp32
//   base_model.model.<module>.weight          a modules_to_save tensor (e.g. lm_head)
// from the layers of a LoRA job (common/lora.h BuildLoraLayout order). fan_in_fan_out is
// set for GPT-2 (its Conv1D weights), as PEFT sets it for Conv1D targets.
// Thread-safety: a function of its arguments; writes only under `dir`.
#pragma once

#include <string>
#include <vector>

#include "common/lora.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace l2l {

// Writes dir/adapter_config.json and dir/adapter_model.safetensors (dir is created).
// layers[l] holds layouts[l].numel floats. Errors: a disabled lora config, size
// mismatches, I/O (naming the file).
Status WritePeftLoraAdapter(const std::string& dir, const ModelSpec& spec, const LoraConfig& lora,
                            const std::vector<LayerLayout>& layouts, const std::vector<std::vector<float>>& layers);

}  // namespace l2l
