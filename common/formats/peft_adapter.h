// PEFT LoRA adapter directories (Hugging Face peft's save_pretrained layout): write and read.
//
//   DIR/adapter_config.json        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r,
//                                   "lora_alpha": alpha, "lora_dropout": p, "bias": "none",
//                                   "target_modules": [...], "fan_in_fan_out": bool,
//                                   "base_model_name_or_path": ..., "use_rslora": bool, ...}
//                                  (the keys PEFT 0.13 writes for a LoraConfig)
//   DIR/adapter_model.safetensors  "base_model.model.<module>.lora_A.weight" (r, in) and
//                                  "base_model.model.<module>.lora_B.weight" (out, r), fp32,
//                                  and per modules_to_save tensor "base_model.model.<name>"
//                                  (e.g. "base_model.model.lm_head.weight"), fp32: the key
//                                  PEFT 0.13's get_peft_model_state_dict writes for
//                                  <module>.modules_to_save.<adapter>.weight and
//                                  set_peft_model_state_dict maps back to it
//
// fan_in_fan_out is true for a family whose linear weights are stored (in, out) (GPT-2's
// Conv1D; FamilyInfo::hf_weights_in_out): PEFT then adds (B A)^T; A and B keep their shapes.
// transformers + peft load a written directory with PeftModel.from_pretrained (tested with
// peft 0.13.2: no missing or unexpected keys, logits equal to the hand-merged model's).
//
// Reader: adapter_config.json (at most 1 MiB) must say peft_type LORA, r > 0, a numeric
// lora_alpha, bias "none", no DoRA and no rank/alpha patterns; modules_to_save may list
// modules; adapter_model.safetensors (a pickled adapter_model.bin is refused: re-save with
// safe_serialization) may hold only lora_A / lora_B weights of the config's rank, in
// pairs, and tensors of the modules in modules_to_save (each such module at least one),
// in F32, BF16 or F16. Every error names the file and the key.
// The family of the returned adapter is left at its default: the caller knows the model.
//
// Thread-safety: free functions; one writer per directory.
#pragma once

#include <string>

#include "common/formats/lora_adapter.h"
#include "common/status.h"

namespace l2l::formats {

inline constexpr char kPeftConfigFile[] = "adapter_config.json";
inline constexpr char kPeftWeightsFile[] = "adapter_model.safetensors";

// Validates `adapter` (ValidateLoraAdapter), creates `dir` if needed and writes both files
// (each atomically).
Status WritePeftAdapter(const std::string& dir, const LoraAdapter& adapter);

Result<LoraAdapter> ReadPeftAdapter(const std::string& dir);

}  // namespace l2l::formats
