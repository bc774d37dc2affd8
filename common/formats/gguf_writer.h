// GGUF (version 3) writer: metadata of every value type and tensors stored as F32, F16,
// BF16, Q8_0 (quantized as ggml's quantize_row_q8_0_ref), Q5_0 (as quantize_row_q5_0_ref)
// or Q4_K / Q6_K (gguf_quants.h's quantizers), each tensor's data aligned to
// `alignment` (written as general.alignment when it is not the default 32).
//
// Use: Set() metadata (order kept; setting a key twice replaces its value in place),
// AddTensor() in the order they are to be stored, then Write(path) once. Tensor data is
// produced on demand (f32 pointer or f32_source callback) while writing, so a writer holds
// one tensor's encoded bytes at a time. The file goes through an AtomicFileWriter: a crash
// leaves no torn file at `path`.
//
// Shapes are row-major (numpy / Hugging Face order); the file stores them reversed (ne).
// Llama q/k rows are NOT permuted here: callers that write llama.cpp-compatible attn_q /
// attn_k call PermuteLlamaRows (common/formats/gguf.h) first.
//
// Ownership: the writer borrows the f32 pointers until Write() returns.
// Thread-safety: none; one thread per writer.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/formats/gguf.h"
#include "common/status.h"

namespace l2l::formats {

struct GgufTensorToWrite {
  std::string name;
  std::vector<int64_t> shape;        // row-major; 1..4 dims
  // kF32, kF16, kBF16, kQ8_0 / kQ5_0 (shape.back() % 32 == 0), kQ4_K / kQ6_K (% 256 == 0)
  GgmlType type = GgmlType::kF32;
  const float* f32 = nullptr;        // numel values, or ...
  std::function<Result<const float*>()> f32_source = nullptr;  // ... called once, in file order
};

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = kGgufDefaultAlignment) : alignment_(alignment) {}

  void Set(const std::string& key, GgufValue value);
  // Validates name (unique, non-empty), shape and type now, so a bad tensor is reported
  // before any byte is written.
  Status AddTensor(GgufTensorToWrite t);
  Status Write(const std::string& path);

 private:
  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensorToWrite> tensors_;
};

}  // namespace l2l::formats
