// The frozen base of a LoRA layer as the daemon holds it and workers receive it: which
// tensors are frozen, how each is encoded (fp32, bf16 or quantized blocks), and where its
// bytes lie in the layer's frozen record.
//
// A LoRA layer (common/lora.h BuildLoraLayout) is its trainable span -- contiguous, the
// adapters and modules_to_save, held by the daemon as fp32 masters with AdamW moments and
// published double-buffered like any layer -- and the rest, the frozen base, which never
// changes: the daemon encodes it ONCE into a frozen record (one copy, read by every
// worker) and never keeps it in fp32. The record is the frozen tensors in layout order,
// each one piece:
//
//   base_dtype   block linears (2-D weights of a block)      everything else (norms,
//                                                            biases, embeddings, head)
//   fp32         f32                                         f32
//   bf16         bf16                                        bf16
//   q4           NF4 blocks of 64 (QLoRA; quant_blocks.h)    bf16
//   q8           Q8_0 blocks of 32 (ggml)                    bf16
//
// as QLoRA does it (bitsandbytes quantizes the Linear layers of the blocks and keeps the
// embeddings, norms and lm_head in 16 bits). A block linear whose size is not a whole
// number of blocks stays bf16. Consecutive pieces of one encoding are merged; each piece
// starts at a multiple of 64 bytes (block structs and bf16 runs need no more, device
// kernels read aligned words), and the record's size is a multiple of 64 bytes.
//
// Bytes per frozen parameter: fp32 4, bf16 2, q4 0.5625 (36-byte blocks of 64), q8
// 1.0625 (34-byte blocks of 32), plus the bf16 norms and embeddings.
//
// The values a worker computes with are Decode(Encode(x)); RoundToHeld applies the same
// rounding in place, so the reference trainer and test fakes run on the base the daemon
// serves. Both sides derive the plan from the job (spec + lora): nothing about it is sent.
//
// Thread-safety: pure functions of values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/lora.h"
#include "common/model_spec.h"
#include "common/quant_blocks.h"
#include "common/status.h"

namespace l2l {

enum class FrozenEncoding { kF32, kBF16, kNf4, kQ8_0 };
const char* ToString(FrozenEncoding e);  // "f32" | "bf16" | "nf4" | "q8_0"

struct FrozenPiece {
  size_t offset = 0;       // first float of the piece in the layer's flat buffer
  size_t numel = 0;        // floats
  FrozenEncoding enc = FrozenEncoding::kF32;
  size_t byte_offset = 0;  // in the frozen record, a multiple of 64
  size_t bytes = 0;        // encoded bytes
};

struct FrozenPlan {
  std::vector<FrozenPiece> pieces;  // layout order
  size_t bytes = 0;                 // the record's size (a multiple of 64; 0: nothing frozen)
  size_t frozen_numel = 0;          // floats the pieces cover
  TrainableSpan trainable;          // the layer's trainable span (common/lora.h)
};

// The plan of one layer of a LoRA layout. Without LoRA (lora.enabled false) nothing is
// frozen: an empty plan whose trainable span is the whole layer.
FrozenPlan PlanFrozenBase(const LayerLayout& layout, const LoraConfig& lora);

// Encodes the frozen tensors of `full` (layout.numel floats) into `record` (plan.bytes;
// the padding is zeroed). InvalidArgument when a quantized tensor holds a non-finite
// value (the message names the layer offset).
Status EncodeFrozen(const FrozenPlan& plan, const float* full, uint8_t* record);
// Decodes the record into the frozen tensors of `full`; the trainable span is untouched.
void DecodeFrozen(const FrozenPlan& plan, const uint8_t* record, float* full);

// full's frozen tensors = Decode(Encode(full's frozen tensors)): the values the daemon
// serves for the base. Trainable tensors are untouched.
Status RoundToHeld(const LayerLayout& layout, const LoraConfig& lora, float* full);

}  // namespace l2l
