// The Export rpc's choice (proto/control.proto ExportRequest: format, dtype,
// max_shard_bytes, merge) parsed and checked against the job: a LoRA job (a `lora:`
// section) exports its adapter (peft: a PEFT directory; gguf-lora: llama.cpp's GGUF LoRA)
// or, with merge, the merged model (safetensors | hf | gguf); any other job exports its
// weights and refuses peft, gguf-lora and merge. Every refusal names the flags to use.
//
// Thread-safety: a pure function of its arguments.
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/formats/gguf.h"
#include "common/status.h"

namespace l2l {

enum class ExportFormat { kSafetensors, kHf, kGguf, kPeft, kGgufLora };

// The request's fields as sent (format "" = safetensors, dtype "" = f32).
struct ExportRequestFields {
  std::string format;
  std::string dtype;
  int64_t max_shard_bytes = 0;
  bool merge = false;
};

struct ExportChoice {
  ExportFormat format = ExportFormat::kSafetensors;
  // kF32, kBF16 or (gguf) kF16, kQ8_0; gguf-lora kF32, kF16 or kBF16; peft kF32.
  formats::GgmlType type = formats::GgmlType::kF32;
  bool q4_k_m = false;          // gguf: the Q4_K_M mix (type unused)
  int64_t max_shard_bytes = 0;  // hf; 0 = HfExportOptions' default
  bool merge = false;           // a LoRA job's merged model (safetensors | hf | gguf)
  DType dtype() const { return type == formats::GgmlType::kBF16 ? DType::kBF16 : DType::kF32; }
};

const char* ToString(ExportFormat f);  // "safetensors" | "hf" | "gguf" | "peft" | "gguf-lora"

// Errors: InvalidArgument for a bad format, dtype or max_shard_bytes, merge with peft /
// gguf-lora; FailedPrecondition for a choice the job cannot take (peft, gguf-lora or merge
// without LoRA; safetensors, hf or gguf of a LoRA job without merge).
Result<ExportChoice> ParseExportChoice(const ExportRequestFields& req, bool lora_job);

}  // namespace l2l
