// GGUF LoRA adapters as llama.cpp reads them (llama-adapter.cpp llama_adapter_lora_init;
// written like its convert_lora_to_gguf.py): a GGUF v3 file with
//   general.architecture   the base model's ("llama", "qwen2"; llama.cpp refuses a mismatch)
//   general.type           "adapter"
//   adapter.type           "lora"
//   adapter.lora.alpha     f32 alpha (llama.cpp scales by alpha / rank, rank = lora_a's
//                          ne[1]; an rsLoRA adapter is written with alpha * sqrt(r) so the
//                          scale is alpha / sqrt(r))
//   general.name           optional
// and two tensors per adapted weight, named after the base tensor's GGUF name:
//   blk.N.attn_q.weight.lora_a   shape (r, in)   (ggml ne = [in, r]: ne[0] = the base's ne[0])
//   blk.N.attn_q.weight.lora_b   shape (out, r)  (ggml ne = [r, out]: ne[1] = the base's ne[1])
// which is the orientation llama.cpp checks (a->ne[0] == W->ne[0], b->ne[1] == W->ne[1],
// a->ne[1] == b->ne[0]). For an architecture whose attn_q / attn_k rows llama.cpp's
// converter permutes (GgufArch::permuted_qk: "llama"), lora_b's rows are permuted the same
// way (PermuteLlamaRows with num_attention_heads / num_key_value_heads): (P B) A = P (B A).
// Families without a GGUF export (GPT-2, BERT) are refused (UNIMPLEMENTED), and so are
// adapters with modules_to_save tensors (InvalidArgument: the file holds lora_a / lora_b
// pairs only, as llama.cpp's convert_lora_to_gguf.py writes them; export merged instead).
//
// Thread-safety: free function.
#pragma once

#include <string>

#include "common/formats/gguf.h"
#include "common/formats/lora_adapter.h"
#include "common/model_spec.h"
#include "common/status.h"

namespace l2l::formats {

struct GgufLoraOptions {
  GgmlType type = GgmlType::kF32;  // lora_a / lora_b storage: kF32, kF16 or kBF16
  std::string name;                // general.name ("" = not written)
};

// Checks `adapter` against `spec` (ValidateLoraAdapter, MatchLoraToModel) and writes `path`
// atomically.
Status WriteGgufLora(const std::string& path, const ModelSpec& spec, const LoraAdapter& adapter,
                     const GgufLoraOptions& options = {});

}  // namespace l2l::formats
