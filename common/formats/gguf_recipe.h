// llama.cpp's Q4_K_M quantization mix (llama-quant.cpp llama_tensor_get_type with
// LLAMA_FTYPE_MOSTLY_Q4_K_M, non-Falcon, no MoE, no importance matrix): which ggml type
// each tensor of an exported GGUF gets.
//
//   1-D tensors (norms, biases)                       F32
//   output.weight (token_embd.weight when the model
//     has no output.weight: tied embeddings)          Q6_K
//   blk.N.attn_v.weight, blk.N.ffn_down.weight        Q6_K where UseMoreBits(N, n_layer),
//                                                     else Q4_K
//   every other 2-D weight                            Q4_K
// Then llama.cpp's fallback for rows that are not whole 256-element super-blocks:
// Q4_K -> Q5_0, Q6_K -> Q8_0 (output.weight goes straight to Q8_0), and F16 for rows that
// are not a multiple of 32 either.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/formats/gguf.h"

namespace l2l::formats {

// GGUF general.file_type of the mix (llama.h LLAMA_FTYPE_MOSTLY_Q4_K_M).
inline constexpr uint32_t kGgufFileTypeQ4_K_M = 15;

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third
// layer in between.
bool UseMoreBits(int64_t layer, int64_t n_layer);

// gguf_name: the tensor's GGUF name ("blk.3.attn_v.weight"); shape: row-major (the row
// length is shape.back()); has_output: the file has an output.weight tensor.
GgmlType Q4KMTensorType(const std::string& gguf_name, const std::vector<int64_t>& shape, int64_t n_layer,
                        bool has_output);

}  // namespace l2l::formats
