// Bulk dtype conversions and DType names. See common/dtype.h.
//
// Thread-safety: pure functions.
#include "common/dtype.h"

#include <cstring>

namespace l2l {

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
  }
  return "unknown";
}

Result<DType> ParseDType(const std::string& s) {
  if (s == "f32" || s == "fp32" || s == "float32") return DType::kF32;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "f16" || s == "fp16" || s == "float16") return DType::kF16;
  return InvalidArgument("unknown dtype '" + s + "' (expected f32, bf16 or f16)");
}

size_t DTypeSize(DType d) { return d == DType::kF32 ? 4 : 2; }

void FloatToBf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}
void Bf16ToFloat(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}
void FloatToFp16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToFp16(in[i]);
}
void Fp16ToFloat(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Fp16ToFloat(in[i]);
}

void ConvertFromFloat(const float* in, DType to, void* out, size_t n) {
  if (n == 0) return;  // an empty tensor's buffers may be null (memcpy's are never)
  switch (to) {
    case DType::kF32:
      std::memcpy(out, in, n * sizeof(float));
      return;
    case DType::kBF16:
    case DType::kF16:
      break;
  }
  // `out` may sit at any byte offset (a file writer's buffer): store via memcpy, as
  // ConvertToFloat loads, never through a uint16_t* that would need 2-byte alignment.
  auto* bytes = static_cast<unsigned char*>(out);
  const bool bf16 = to == DType::kBF16;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = bf16 ? FloatToBf16(in[i]) : FloatToFp16(in[i]);
    std::memcpy(bytes + 2 * i, &h, sizeof(h));
  }
}

void ConvertToFloat(const void* in, DType from, float* out, size_t n) {
  if (n == 0) return;  // an empty tensor's buffers may be null (memcpy's are never)
  const auto* bytes = static_cast<const unsigned char*>(in);
  if (from == DType::kF32) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  // 16-bit inputs may sit at any byte offset inside a file mapping: load via memcpy.
  const bool bf16 = from == DType::kBF16;
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, sizeof(h));
    out[i] = bf16 ? Bf16ToFloat(h) : Fp16ToFloat(h);
  }
}

}  // namespace l2l
