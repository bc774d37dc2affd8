// GGUF writer. See common/formats/gguf_writer.h.
//
// Thread-safety: see the header.
#include "common/formats/gguf_writer.h"

#include <cstring>
#include <set>

#include "common/dtype.h"
#include "common/file_util.h"
#include "common/formats/gguf_quants.h"

namespace l2l::formats {
namespace {

class Buf {
 public:
  template <typename T>
  void Put(T v) {
    const size_t at = b_.size();
    b_.resize(at + sizeof(T));
    std::memcpy(b_.data() + at, &v, sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
  }
  void Pad(size_t align) { b_.resize(b_.size() + (align - b_.size() % align) % align, 0); }
  const std::vector<uint8_t>& bytes() const { return b_; }

 private:
  std::vector<uint8_t> b_;
};

void PutInt(Buf& b, GgufValueType t, int64_t v) {
  switch (t) {
    case GgufValueType::kU8: b.Put<uint8_t>(static_cast<uint8_t>(v)); break;
    case GgufValueType::kI8: b.Put<int8_t>(static_cast<int8_t>(v)); break;
    case GgufValueType::kBool: b.Put<uint8_t>(v ? 1 : 0); break;
    case GgufValueType::kU16: b.Put<uint16_t>(static_cast<uint16_t>(v)); break;
    case GgufValueType::kI16: b.Put<int16_t>(static_cast<int16_t>(v)); break;
    case GgufValueType::kU32: b.Put<uint32_t>(static_cast<uint32_t>(v)); break;
    case GgufValueType::kI32: b.Put<int32_t>(static_cast<int32_t>(v)); break;
    case GgufValueType::kU64: b.Put<uint64_t>(static_cast<uint64_t>(v)); break;
    case GgufValueType::kI64: b.Put<int64_t>(v); break;
    default: break;
  }
}

void PutFloat(Buf& b, GgufValueType t, double v) {
  if (t == GgufValueType::kF32) {
    b.Put<float>(static_cast<float>(v));
  } else {
    b.Put<double>(v);
  }
}

Status PutValue(Buf& b, const GgufValue& v, const std::string& key) {
  switch (v.type) {
    case GgufValueType::kString:
      b.PutString(v.str);
      return Status::Ok();
    case GgufValueType::kF32:
    case GgufValueType::kF64:
      PutFloat(b, v.type, v.f);
      return Status::Ok();
    case GgufValueType::kArray: {
      b.Put<uint32_t>(static_cast<uint32_t>(v.elem));
      b.Put<uint64_t>(v.array_size());
      if (v.elem == GgufValueType::kString) {
        if (v.strings.size() != v.array_size()) break;
        for (const std::string& s : v.strings) b.PutString(s);
      } else if (v.elem == GgufValueType::kF32 || v.elem == GgufValueType::kF64) {
        if (v.floats.size() != v.array_size()) break;
        for (double f : v.floats) PutFloat(b, v.elem, f);
      } else if (v.elem == GgufValueType::kArray) {
        if (v.arrays.size() != v.array_size()) break;
        for (const GgufValue& e : v.arrays) {
          L2L_RETURN_IF_ERROR(PutValue(b, e, key));
        }
      } else {
        if (v.ints.size() != v.array_size()) break;
        for (int64_t x : v.ints) PutInt(b, v.elem, x);
      }
      return Status::Ok();
    }
    default:
      PutInt(b, v.type, v.i);
      return Status::Ok();
  }
  return InvalidArgument("GGUF metadata '" + key + "': array of " + GgufValueTypeName(v.elem) +
                         " holds elements of another type");
}

size_t TensorBytes(const GgufTensorToWrite& t) {
  const GgmlTypeTraits tr = *GgmlTraits(static_cast<uint32_t>(t.type));
  size_t n = 1;
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n / tr.block_size * tr.type_size;
}

}  // namespace

void GgufWriter::Set(const std::string& key, GgufValue value) {
  for (auto& [k, v] : kv_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

Status GgufWriter::AddTensor(GgufTensorToWrite t) {
  const std::string where = "GGUF tensor '" + t.name + "'";
  if (t.name.empty()) return InvalidArgument("GGUF tensor with an empty name");
  for (const GgufTensorToWrite& o : tensors_) {
    if (o.name == t.name) return InvalidArgument(where + " added twice");
  }
  if (t.shape.empty() || t.shape.size() > 4) return InvalidArgument(where + ": needs 1..4 dimensions");
  for (int64_t d : t.shape) {
    if (d < 0) return InvalidArgument(where + ": negative dimension");
  }
  if ((t.f32 != nullptr) == (t.f32_source != nullptr)) return InvalidArgument(where + ": set exactly one of f32 and f32_source");
  switch (t.type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
      break;
    case GgmlType::kQ8_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K: {
      const uint32_t block = GgmlTraits(static_cast<uint32_t>(t.type))->block_size;
      if (t.shape.back() % block != 0) {
        return InvalidArgument(where + ": " + GgmlTypeName(t.type) + " needs rows of a multiple of " +
                               std::to_string(block) + " elements, got " + std::to_string(t.shape.back()));
      }
      break;
    }
    default:
      return Unimplemented(where + ": writing type " + GgmlTypeName(t.type) +
                           " (supported: F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q6_K)");
  }
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status GgufWriter::Write(const std::string& path) {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
    return InvalidArgument(path + ": GGUF alignment " + std::to_string(alignment_) + " is not a power of two");
  }
  if (alignment_ != kGgufDefaultAlignment) Set("general.alignment", GgufValue::U32(alignment_));
  Buf h;
  h.Put<uint32_t>(kGgufMagic);
  h.Put<uint32_t>(kGgufVersion);
  h.Put<uint64_t>(tensors_.size());
  h.Put<uint64_t>(kv_.size());
  for (const auto& [k, v] : kv_) {
    h.PutString(k);
    h.Put<uint32_t>(static_cast<uint32_t>(v.type));
    Status s = PutValue(h, v, k);
    if (!s.ok()) return s.WithContext(path);
  }
  uint64_t offset = 0;
  for (const GgufTensorToWrite& t : tensors_) {
    h.PutString(t.name);
    h.Put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) h.Put<uint64_t>(static_cast<uint64_t>(*it));
    h.Put<uint32_t>(static_cast<uint32_t>(t.type));
    h.Put<uint64_t>(offset);
    const uint64_t nb = TensorBytes(t);
    offset += nb + (alignment_ - nb % alignment_) % alignment_;
  }
  h.Pad(alignment_);

  L2L_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Create(path));
  L2L_RETURN_IF_ERROR(w.Append(h.bytes().data(), h.bytes().size()));
  std::vector<uint8_t> enc;
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (const GgufTensorToWrite& t : tensors_) {
    const float* x = t.f32;
    if (t.f32_source) {
      Result<const float*> r = t.f32_source();
      if (!r.ok()) return r.status().WithContext(path + ": tensor '" + t.name + "'");
      x = *r;
    }
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    const size_t nb = TensorBytes(t);
    switch (t.type) {
      case GgmlType::kF32:
        L2L_RETURN_IF_ERROR(w.Append(x, nb));
        break;
      case GgmlType::kF16:
      case GgmlType::kBF16:
        enc.resize(nb);
        ConvertFromFloat(x, t.type == GgmlType::kF16 ? DType::kF16 : DType::kBF16, enc.data(), n);
        L2L_RETURN_IF_ERROR(w.Append(enc.data(), nb));
        break;
      case GgmlType::kQ8_0:
      case GgmlType::kQ5_0:
      case GgmlType::kQ4_K:
      case GgmlType::kQ6_K:
        enc.resize(nb);
        if (t.type == GgmlType::kQ8_0) QuantizeQ8_0(x, enc.data(), n);
        if (t.type == GgmlType::kQ5_0) QuantizeQ5_0(x, enc.data(), n);
        if (t.type == GgmlType::kQ4_K) QuantizeQ4_K(x, enc.data(), n);
        if (t.type == GgmlType::kQ6_K) QuantizeQ6_K(x, enc.data(), n);
        L2L_RETURN_IF_ERROR(w.Append(enc.data(), nb));
        break;
      default:
        return Internal("unchecked GGUF tensor type");
    }
    L2L_RETURN_IF_ERROR(w.Append(zeros.data(), (alignment_ - nb % alignment_) % alignment_));
  }
  return w.Commit();
}

}  // namespace l2l::formats
