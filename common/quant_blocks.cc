// Block quantization codecs (NF4, Q4_0, Q8_0). See common/quant_blocks.h.
#include "common/quant_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/dtype.h"
#include "common/formats/gguf.h"

namespace l2l {
namespace {

// bitsandbytes' dQuantizeNF4 thresholds (csrc/kernels.cu), ascending: the midpoints of
// neighbouring kNf4Code values. Its decision tree is a binary search over them with
// `x > t` at every node, so the code is the number of thresholds below x.
constexpr float kNf4Thresholds[15] = {
    -0.8480964004993439f,  -0.6106329262256622f, -0.4599952697753906f,  -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,   0.2035212516784668f,  0.2920137718319893f,   0.3893125355243683f,
    0.5016634166240692f,   0.6427869200706482f,  0.8614784181118011f,
};

Status CheckCount(QuantFormat f, int64_t n) {
  const QuantFormatInfo info = Info(f);
  if (n < 0 || n % info.block_elems != 0) {
    return InvalidArgument(std::string(ToString(f)) + ": " + std::to_string(n) +
                           " elements are not a whole number of blocks of " +
                           std::to_string(info.block_elems));
  }
  return Status::Ok();
}

}  // namespace

const char* ToString(QuantFormat f) {
  switch (f) {
    case QuantFormat::kNf4: return "nf4";
    case QuantFormat::kQ4_0: return "q4_0";
    case QuantFormat::kQ8_0: return "q8_0";
  }
  return "?";
}

Result<QuantFormat> ParseQuantFormat(std::string_view s) {
  for (QuantFormat f : {QuantFormat::kNf4, QuantFormat::kQ4_0, QuantFormat::kQ8_0}) {
    if (s == ToString(f)) return f;
  }
  return InvalidArgument("unknown block format \"" + std::string(s) + "\": expected nf4, q4_0 or q8_0");
}

Result<QuantFormat> QuantFormatForBaseDtype(std::string_view base_dtype) {
  if (base_dtype == "q4") return QuantFormat::kNf4;
  if (base_dtype == "q8") return QuantFormat::kQ8_0;
  return InvalidArgument("base_dtype \"" + std::string(base_dtype) +
                         "\" is not a block format: expected q4 (NF4) or q8 (Q8_0)");
}

QuantFormatInfo Info(QuantFormat f) {
  switch (f) {
    case QuantFormat::kNf4: return {kNf4BlockElems, kNf4BlockBytes};
    case QuantFormat::kQ4_0: return {32, 18};
    case QuantFormat::kQ8_0: return {32, 34};
  }
  return {1, 0};
}

Result<size_t> QuantizedBytes(QuantFormat f, int64_t n) {
  L2L_RETURN_IF_ERROR(CheckCount(f, n));
  const QuantFormatInfo info = Info(f);
  return static_cast<size_t>(n / info.block_elems) * static_cast<size_t>(info.block_bytes);
}

uint8_t Nf4Code(float normalized) {
  uint8_t code = 0;
  for (float t : kNf4Thresholds) code += normalized > t ? 1 : 0;
  return code;
}

void QuantizeNf4(const float* x, uint8_t* blocks, size_t n) {
  for (size_t b = 0; b < n / kNf4BlockElems; ++b) {
    const float* xb = x + b * kNf4BlockElems;
    uint8_t* blk = blocks + b * kNf4BlockBytes;
    float absmax = 0.0f;
    for (int64_t j = 0; j < kNf4BlockElems; ++j) absmax = std::max(absmax, std::fabs(xb[j]));
    std::memcpy(blk, &absmax, 4);
    // bitsandbytes multiplies by the reciprocal (kQuantizeBlockwise: local_abs_max = 1/absmax).
    const float inv = 1.0f / absmax;
    for (int64_t i = 0; i < kNf4BlockElems / 2; ++i) {
      const uint8_t hi = absmax == 0.0f ? 7 : Nf4Code(xb[2 * i] * inv);
      const uint8_t lo = absmax == 0.0f ? 7 : Nf4Code(xb[2 * i + 1] * inv);
      blk[4 + i] = static_cast<uint8_t>(hi << 4 | lo);
    }
  }
}

void DequantizeNf4(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / kNf4BlockElems; ++b) {
    const uint8_t* blk = blocks + b * kNf4BlockBytes;
    float absmax;
    std::memcpy(&absmax, blk, 4);
    float* ob = out + b * kNf4BlockElems;
    for (int64_t i = 0; i < kNf4BlockElems / 2; ++i) {
      ob[2 * i] = kNf4Code[blk[4 + i] >> 4] * absmax;
      ob[2 * i + 1] = kNf4Code[blk[4 + i] & 0x0f] * absmax;
    }
  }
}

void QuantizeQ4_0(const float* x, uint8_t* blocks, size_t n) {
  for (size_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > amax) {  // strict: the first element of largest magnitude
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* blk = blocks + b * 18;
    const uint16_t dh = FloatToFp16(d);
    std::memcpy(blk, &dh, 2);
    auto code = [&](float v) {
      // ggml computes fmaf(v, id, 8.5f) (its reference is built with contraction); gguf-py
      // computes it in double and rounds to fp32 before truncating. We do what gguf-py does.
      const float s = static_cast<float>(static_cast<double>(v) * static_cast<double>(id) + 8.5);
      return static_cast<uint8_t>(std::min(15.0f, std::trunc(s)));
    };
    for (int j = 0; j < 16; ++j) blk[2 + j] = static_cast<uint8_t>(code(xb[j]) | code(xb[j + 16]) << 4);
  }
}

Status Quantize(QuantFormat f, const float* x, int64_t n, uint8_t* out) {
  L2L_RETURN_IF_ERROR(CheckCount(f, n));
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      return InvalidArgument(std::string(ToString(f)) + ": element " + std::to_string(i) + " of " +
                             std::to_string(n) + " is not finite (" + std::to_string(x[i]) + ")");
    }
  }
  const size_t count = static_cast<size_t>(n);
  switch (f) {
    case QuantFormat::kNf4: QuantizeNf4(x, out, count); break;
    case QuantFormat::kQ4_0: QuantizeQ4_0(x, out, count); break;
    case QuantFormat::kQ8_0: formats::QuantizeQ8_0(x, out, count); break;
  }
  return Status::Ok();
}

Status Dequantize(QuantFormat f, const uint8_t* blocks, int64_t n, float* out) {
  L2L_RETURN_IF_ERROR(CheckCount(f, n));
  const size_t count = static_cast<size_t>(n);
  switch (f) {
    case QuantFormat::kNf4: DequantizeNf4(blocks, out, count); break;
    case QuantFormat::kQ4_0: formats::DequantizeQ4_0(blocks, out, count); break;
    case QuantFormat::kQ8_0: formats::DequantizeQ8_0(blocks, out, count); break;
  }
  return Status::Ok();
}

}  // namespace l2l
