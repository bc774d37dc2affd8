// llama.cpp's Q4_K_M mix. See common/formats/gguf_recipe.h.
#include "common/formats/gguf_recipe.h"

#include <cstdlib>

namespace l2l::formats {
namespace {

// N of "blk.N.", or -1.
int64_t LayerOf(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  char* end = nullptr;
  const long long v = std::strtoll(name.c_str() + 4, &end, 10);
  return end != nullptr && *end == '.' ? v : -1;
}

bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

bool UseMoreBits(int64_t layer, int64_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

GgmlType Q4KMTensorType(const std::string& gguf_name, const std::vector<int64_t>& shape, int64_t n_layer,
                        bool has_output) {
  if (shape.size() < 2) return GgmlType::kF32;
  const int64_t row = shape.back();
  GgmlType t = GgmlType::kQ4_K;
  if (gguf_name == "output.weight" || (!has_output && gguf_name == "token_embd.weight")) {
    t = row % 256 != 0 ? GgmlType::kQ8_0 : GgmlType::kQ6_K;
  } else if (Contains(gguf_name, "attn_v.weight") || Contains(gguf_name, "ffn_down")) {
    const int64_t layer = LayerOf(gguf_name);
    if (layer >= 0 && UseMoreBits(layer, n_layer)) t = GgmlType::kQ6_K;
  }
  if (row % 256 != 0) {
    if (t == GgmlType::kQ4_K) t = GgmlType::kQ5_0;
    if (t == GgmlType::kQ6_K) t = GgmlType::kQ8_0;
  }
  if (row % 32 != 0) t = GgmlType::kF16;
  return t;
}

}  // namespace l2l::formats
