// See common/lora_frozen.h.
#include "common/lora_frozen.h"

#include <cmath>
#include <cstring>
#include <string>

#include "common/dtype.h"

namespace l2l {
namespace {

constexpr size_t kPieceAlign = 64;

size_t RoundUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

FrozenEncoding EncodingOf(const LayerLayout& layout, const ParamInfo& p, LoraBaseDType base) {
  if (base == LoraBaseDType::kF32) return FrozenEncoding::kF32;
  if (base == LoraBaseDType::kBF16) return FrozenEncoding::kBF16;
  const bool linear = layout.kind == LayerKind::kBlock && p.shape.size() == 2;
  const QuantFormat f = base == LoraBaseDType::kQ4 ? QuantFormat::kNf4 : QuantFormat::kQ8_0;
  if (!linear || p.numel % static_cast<size_t>(Info(f).block_elems) != 0) return FrozenEncoding::kBF16;
  return f == QuantFormat::kNf4 ? FrozenEncoding::kNf4 : FrozenEncoding::kQ8_0;
}

QuantFormat FormatOf(FrozenEncoding e) { return e == FrozenEncoding::kNf4 ? QuantFormat::kNf4 : QuantFormat::kQ8_0; }

size_t EncodedBytes(FrozenEncoding e, size_t numel) {
  switch (e) {
    case FrozenEncoding::kF32: return numel * 4;
    case FrozenEncoding::kBF16: return numel * 2;
    case FrozenEncoding::kNf4:
    case FrozenEncoding::kQ8_0:  // whole blocks: EncodingOf chose a block format only then
      return QuantizedBytes(FormatOf(e), static_cast<int64_t>(numel)).value();
  }
  return 0;
}

bool Quantized(FrozenEncoding e) { return e == FrozenEncoding::kNf4 || e == FrozenEncoding::kQ8_0; }


}  // namespace

const char* ToString(FrozenEncoding e) {
  switch (e) {
    case FrozenEncoding::kF32: return "f32";
    case FrozenEncoding::kBF16: return "bf16";
    case FrozenEncoding::kNf4: return "nf4";
    case FrozenEncoding::kQ8_0: return "q8_0";
  }
  return "?";
}

FrozenPlan PlanFrozenBase(const LayerLayout& layout, const LoraConfig& lora) {
  FrozenPlan plan;
  if (!lora.enabled) {
    plan.trainable = {0, layout.numel};
    return plan;
  }
  plan.trainable = TrainableRange(layout);
  size_t at = 0;
  for (const ParamInfo& p : layout.params) {
    if (p.trainable || p.numel == 0) continue;
    const FrozenEncoding e = EncodingOf(layout, p, lora.base_dtype);
    plan.frozen_numel += p.numel;
    // A raw piece that continues the previous one (same encoding, adjacent floats) grows it;
    // quantized tensors stay pieces of their own (block boundaries per tensor).
    if (!plan.pieces.empty() && !Quantized(e)) {
      FrozenPiece& last = plan.pieces.back();
      if (last.enc == e && last.offset + last.numel == p.offset) {
        last.numel += p.numel;
        last.bytes = EncodedBytes(e, last.numel);
        at = last.byte_offset + last.bytes;
        continue;
      }
    }
    FrozenPiece piece;
    piece.offset = p.offset;
    piece.numel = p.numel;
    piece.enc = e;
    piece.byte_offset = RoundUp(at, kPieceAlign);
    piece.bytes = EncodedBytes(e, p.numel);
    at = piece.byte_offset + piece.bytes;
    plan.pieces.push_back(piece);
  }
  plan.bytes = RoundUp(at, kPieceAlign);
  return plan;
}

Status EncodeFrozen(const FrozenPlan& plan, const float* full, uint8_t* record) {
  std::memset(record, 0, plan.bytes);
  for (const FrozenPiece& p : plan.pieces) {
    const float* x = full + p.offset;
    uint8_t* out = record + p.byte_offset;
    switch (p.enc) {
      case FrozenEncoding::kF32: std::memcpy(out, x, p.numel * sizeof(float)); break;
      case FrozenEncoding::kBF16: FloatToBf16(x, reinterpret_cast<uint16_t*>(out), p.numel); break;
      case FrozenEncoding::kNf4:
      case FrozenEncoding::kQ8_0: {
        Status s = Quantize(FormatOf(p.enc), x, static_cast<int64_t>(p.numel), out);
        if (!s.ok()) {
          return s.WithContext("frozen base tensor at offset " + std::to_string(p.offset) + " (" +
                               std::to_string(p.numel) + " values, " + ToString(p.enc) + ")");
        }
        break;
      }
    }
  }
  return Status::Ok();
}

void DecodeFrozen(const FrozenPlan& plan, const uint8_t* record, float* full) {
  for (const FrozenPiece& p : plan.pieces) {
    float* y = full + p.offset;
    const uint8_t* in = record + p.byte_offset;
    switch (p.enc) {
      case FrozenEncoding::kF32: std::memcpy(y, in, p.numel * sizeof(float)); break;
      case FrozenEncoding::kBF16: Bf16ToFloat(reinterpret_cast<const uint16_t*>(in), y, p.numel); break;
      case FrozenEncoding::kNf4:
      case FrozenEncoding::kQ8_0:
        // The sizes are the plan's own (whole blocks): Dequantize cannot fail here.
        Dequantize(FormatOf(p.enc), in, static_cast<int64_t>(p.numel), y).IgnoreError();
        break;
    }
  }
}

Status RoundToHeld(const LayerLayout& layout, const LoraConfig& lora, float* full) {
  if (!lora.enabled || lora.base_dtype == LoraBaseDType::kF32) return Status::Ok();
  const FrozenPlan plan = PlanFrozenBase(layout, lora);
  std::vector<uint8_t> record(plan.bytes);
  L2L_RETURN_IF_ERROR(EncodeFrozen(plan, full, record.data()));
  DecodeFrozen(plan, record.data(), full);
  return Status::Ok();
}

}  // namespace l2l
