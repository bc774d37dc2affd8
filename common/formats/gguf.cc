// GGUF reader, value helpers, block (de)quantization and the Llama q/k permutation.
// See common/formats/gguf.h.
//
// Thread-safety: see the header.
#include "common/formats/gguf.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/file_util.h"
#include "common/formats/gguf_quants.h"
#include "common/formats/mapped_pages.h"

namespace l2l::formats {
namespace {

constexpr uint32_t kMaxDims = 4;          // GGML_MAX_DIMS
constexpr uint32_t kMaxNesting = 4;       // nested arrays we accept (files use 0)

struct TraitsEntry {
  uint32_t id;
  GgmlTypeTraits t;
};
// ggml's type table (ggml.c type_traits; gguf-py GGML_QUANT_SIZES).
// What DequantizeToF32 converts (the types whose to_f32 is true), for error messages.
constexpr const char* kReadableTypes = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K";

const TraitsEntry kTraits[] = {
    {0, {"F32", 1, 4, true}},          {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 18, true}},       {3, {"Q4_1", 32, 20, true}},
    {6, {"Q5_0", 32, 22, true}},       {7, {"Q5_1", 32, 24, true}},
    {8, {"Q8_0", 32, 34, true}},       {9, {"Q8_1", 32, 40, false}},
    {10, {"Q2_K", 256, 84, true}},     {11, {"Q3_K", 256, 110, true}},
    {12, {"Q4_K", 256, 144, true}},    {13, {"Q5_K", 256, 176, true}},
    {14, {"Q6_K", 256, 210, true}},    {15, {"Q8_K", 256, 292, true}},
    {16, {"IQ2_XXS", 256, 66, false}}, {17, {"IQ2_XS", 256, 74, false}},
    {18, {"IQ3_XXS", 256, 98, false}}, {19, {"IQ1_S", 256, 50, false}},
    {20, {"IQ4_NL", 32, 18, false}},   {21, {"IQ3_S", 256, 110, false}},
    {22, {"IQ2_S", 256, 82, false}},   {23, {"IQ4_XS", 256, 136, false}},
    {24, {"I8", 1, 1, false}},         {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},        {27, {"I64", 1, 8, false}},
    {28, {"F64", 1, 8, false}},        {29, {"IQ1_M", 256, 56, false}},
    {30, {"BF16", 1, 2, true}},        {31, {"Q4_0_4_4", 32, 18, false}},
    {32, {"Q4_0_4_8", 32, 18, false}}, {33, {"Q4_0_8_8", 32, 18, false}},
};

size_t ScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
      return 8;
    case GgufValueType::kString:  // u64 length, at least
      return 8;
    case GgufValueType::kArray:   // u32 type + u64 count, at least
      return 12;
  }
  return 0;
}

// What one array element takes in memory once read, whatever its size in the file:
// integers widen to int64 (GgufValue::ints), floats to double, strings and nested arrays
// are objects (a string's characters come from the file bytes, one for one).
size_t InMemorySize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kString: return sizeof(std::string);
    case GgufValueType::kArray: return sizeof(GgufValue);
    case GgufValueType::kF32:
    case GgufValueType::kF64: return sizeof(double);
    default: return sizeof(int64_t);
  }
}

// The memory the metadata arrays of one file may take, checked before each array is
// allocated: an array at most kMaxExpansion times the file bytes left after its header
// (its elements come out of them; 8 = a u8 array read into int64 values), and all arrays
// together at most `cap` (MaxFileBytes(), L2L_MAX_FILE_BYTES), however large the file.
constexpr uint64_t kMaxExpansion = 8;
struct MetadataBudget {
  uint64_t cap = 0;
  uint64_t used = 0;
};

bool ValidValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kF64); }

// Bounds-checked reads over the mapped header. Errors name the file, what was being read
// and the byte offset.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, size_t size) : path_(path), data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  template <typename T>
  Status Read(T* out, const std::string& what) {
    if (left() < sizeof(T)) return Truncated(what, sizeof(T));
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status ReadString(std::string* out, const std::string& what) {
    uint64_t n = 0;
    L2L_RETURN_IF_ERROR(Read(&n, what + " (string length)"));
    if (n > left()) {
      return DataLoss(path_ + ": " + what + ": string length " + std::to_string(n) + " at byte " +
                      std::to_string(pos_ - 8) + " runs past the end of the " + std::to_string(size_) +
                      "-byte file (truncated or corrupt)");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return Status::Ok();
  }
  Status Truncated(const std::string& what, size_t need) const {
    return DataLoss(path_ + ": truncated: " + what + " needs " + std::to_string(need) + " bytes at byte " +
                    std::to_string(pos_) + " but the file has " + std::to_string(size_) + " bytes");
  }
  const std::string& path() const { return path_; }

 private:
  const std::string& path_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

Status ReadScalarInt(Cursor& c, GgufValueType t, int64_t* out, const std::string& what) {
  switch (t) {
    case GgufValueType::kU8: { uint8_t v = 0; L2L_RETURN_IF_ERROR(c.Read(&v, what)); *out = v; return Status::Ok(); }
    case GgufValueType::kI8: { int8_t v = 0; L2L_RETURN_IF_ERROR(c.Read(&v, what)); *out = v; return Status::Ok(); }
    case GgufValueType::kBool: {
      uint8_t v = 0;
      L2L_RETURN_IF_ERROR(c.Read(&v, what));
      if (v > 1) return DataLoss(c.path() + ": " + what + ": bool value " + std::to_string(v) + " is not 0 or 1");
      *out = v;
      return Status::Ok();
    }
    case GgufValueType::kU16: { uint16_t v = 0; L2L_RETURN_IF_ERROR(c.Read(&v, what)); *out = v; return Status::Ok(); }
    case GgufValueType::kI16: { int16_t v = 0; L2L_RETURN_IF_ERROR(c.Read(&v, what)); *out = v; return Status::Ok(); }
    case GgufValueType::kU32: { uint32_t v = 0; L2L_RETURN_IF_ERROR(c.Read(&v, what)); *out = v; return Status::Ok(); }
    case GgufValueType::kI32: { int32_t v = 0; L2L_RETURN_IF_ERROR(c.Read(&v, what)); *out = v; return Status::Ok(); }
    case GgufValueType::kU64: { uint64_t v = 0; L2L_RETURN_IF_ERROR(c.Read(&v, what)); *out = static_cast<int64_t>(v); return Status::Ok(); }
    case GgufValueType::kI64: { int64_t v = 0; L2L_RETURN_IF_ERROR(c.Read(&v, what)); *out = v; return Status::Ok(); }
    default:
      return Internal("ReadScalarInt on a non-integer type");
  }
}

// Refuses an array of n elements of type `elem` whose in-memory estimate exceeds the
// budget (see MetadataBudget), before anything is allocated for it; else charges it.
Status ChargeArray(const Cursor& c, GgufValueType elem, uint64_t n, size_t at, const std::string& what,
                   MetadataBudget* budget) {
  const uint64_t per = InMemorySize(elem);
  const uint64_t need = n > UINT64_MAX / per ? UINT64_MAX : n * per;
  const uint64_t left = c.left();
  const uint64_t relative = left > UINT64_MAX / kMaxExpansion ? UINT64_MAX : left * kMaxExpansion;
  const std::string head = c.path() + ": " + what + ": array of " + std::to_string(n) + " " + GgufValueTypeName(elem) +
                           " at byte " + std::to_string(at) + " would take " + std::to_string(need) + " bytes in memory";
  if (need > relative) {
    return DataLoss(head + ", more than " + std::to_string(kMaxExpansion) + "x the " + std::to_string(left) +
                    " file bytes after it (corrupt)");
  }
  if (need > budget->cap - budget->used) {
    return InvalidArgument(head + "; with the " + std::to_string(budget->used) +
                           " bytes of the arrays before it, more than the " + std::to_string(budget->cap) +
                           "-byte limit on one GGUF file's metadata (L2L_MAX_FILE_BYTES; set it higher to read "
                           "a larger file)");
  }
  budget->used += need;
  return Status::Ok();
}

Status ReadValue(Cursor& c, GgufValueType t, GgufValue* v, const std::string& what, uint32_t depth,
                 MetadataBudget* budget) {
  v->type = t;
  switch (t) {
    case GgufValueType::kF32: {
      float f;
      L2L_RETURN_IF_ERROR(c.Read(&f, what));
      v->f = f;
      return Status::Ok();
    }
    case GgufValueType::kF64:
      return c.Read(&v->f, what);
    case GgufValueType::kString:
      return c.ReadString(&v->str, what);
    case GgufValueType::kArray: {
      uint32_t et = 0;
      uint64_t n = 0;
      const size_t at = c.pos();
      L2L_RETURN_IF_ERROR(c.Read(&et, what + " (array element type)"));
      L2L_RETURN_IF_ERROR(c.Read(&n, what + " (array length)"));
      if (!ValidValueType(et)) {
        return DataLoss(c.path() + ": " + what + ": unknown array element type " + std::to_string(et) + " at byte " +
                        std::to_string(at));
      }
      v->elem = static_cast<GgufValueType>(et);
      if (v->elem == GgufValueType::kArray && depth >= kMaxNesting) {
        return DataLoss(c.path() + ": " + what + ": arrays nested deeper than " + std::to_string(kMaxNesting));
      }
      // Every element takes at least ScalarSize bytes: a count that cannot fit is corrupt
      // (and must not drive a huge allocation).
      if (n > c.left() / ScalarSize(v->elem)) {
        return DataLoss(c.path() + ": " + what + ": array of " + std::to_string(n) + " " + GgufValueTypeName(v->elem) +
                        " at byte " + std::to_string(at) + " runs past the end of the file (truncated or corrupt)");
      }
      L2L_RETURN_IF_ERROR(ChargeArray(c, v->elem, n, at, what, budget));
      const size_t count = static_cast<size_t>(n);
      if (v->elem == GgufValueType::kString) {
        v->strings.reserve(count);
      } else if (v->elem == GgufValueType::kF32 || v->elem == GgufValueType::kF64) {
        v->floats.reserve(count);
      } else if (v->elem == GgufValueType::kArray) {
        v->arrays.reserve(count);
      } else {
        v->ints.reserve(count);
      }
      const std::string ew = what + " element";
      for (uint64_t k = 0; k < n; ++k) {
        if (v->elem == GgufValueType::kString) {
          std::string s;
          L2L_RETURN_IF_ERROR(c.ReadString(&s, ew));
          v->strings.push_back(std::move(s));
        } else if (v->elem == GgufValueType::kF32 || v->elem == GgufValueType::kF64) {
          GgufValue e;
          L2L_RETURN_IF_ERROR(ReadValue(c, v->elem, &e, ew, depth + 1, budget));
          v->floats.push_back(e.f);
        } else if (v->elem == GgufValueType::kArray) {
          GgufValue e;
          L2L_RETURN_IF_ERROR(ReadValue(c, v->elem, &e, ew, depth + 1, budget));
          v->arrays.push_back(std::move(e));
        } else {
          int64_t x;
          L2L_RETURN_IF_ERROR(ReadScalarInt(c, v->elem, &x, ew));
          v->ints.push_back(x);
        }
      }
      return Status::Ok();
    }
    default:
      return ReadScalarInt(c, t, &v->i, what);
  }
}

std::string Hex(uint32_t x) {
  char b[16];
  std::snprintf(b, sizeof(b), "0x%08x", x);
  return b;
}

std::string NeText(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace

std::optional<GgmlTypeTraits> GgmlTraits(uint32_t type) {
  for (const TraitsEntry& e : kTraits) {
    if (e.id == type) return e.t;
  }
  return std::nullopt;
}

const char* GgmlTypeName(GgmlType t) {
  const auto tr = GgmlTraits(static_cast<uint32_t>(t));
  return tr ? tr->name : "?";
}

const char* GgufValueTypeName(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: return "UINT8";
    case GgufValueType::kI8: return "INT8";
    case GgufValueType::kU16: return "UINT16";
    case GgufValueType::kI16: return "INT16";
    case GgufValueType::kU32: return "UINT32";
    case GgufValueType::kI32: return "INT32";
    case GgufValueType::kF32: return "FLOAT32";
    case GgufValueType::kBool: return "BOOL";
    case GgufValueType::kString: return "STRING";
    case GgufValueType::kArray: return "ARRAY";
    case GgufValueType::kU64: return "UINT64";
    case GgufValueType::kI64: return "INT64";
    case GgufValueType::kF64: return "FLOAT64";
  }
  return "?";
}

// ---- GgufValue ------------------------------------------------------------------------

bool GgufValue::is_int() const {
  return type != GgufValueType::kF32 && type != GgufValueType::kF64 && type != GgufValueType::kString &&
         type != GgufValueType::kArray;
}
bool GgufValue::is_float() const { return type == GgufValueType::kF32 || type == GgufValueType::kF64; }
size_t GgufValue::array_size() const { return ints.size() + floats.size() + strings.size() + arrays.size(); }

GgufValue GgufValue::U32(uint32_t v) { GgufValue x; x.type = GgufValueType::kU32; x.i = v; return x; }
GgufValue GgufValue::I32(int32_t v) { GgufValue x; x.type = GgufValueType::kI32; x.i = v; return x; }
GgufValue GgufValue::U64(uint64_t v) { GgufValue x; x.type = GgufValueType::kU64; x.i = static_cast<int64_t>(v); return x; }
GgufValue GgufValue::F32(float v) { GgufValue x; x.type = GgufValueType::kF32; x.f = v; return x; }
GgufValue GgufValue::Bool(bool v) { GgufValue x; x.type = GgufValueType::kBool; x.i = v; return x; }
GgufValue GgufValue::String(std::string v) { GgufValue x; x.type = GgufValueType::kString; x.str = std::move(v); return x; }
GgufValue GgufValue::StringArray(std::vector<std::string> v) {
  GgufValue x;
  x.type = GgufValueType::kArray;
  x.elem = GgufValueType::kString;
  x.strings = std::move(v);
  return x;
}
GgufValue GgufValue::IntArray(GgufValueType elem, std::vector<int64_t> v) {
  GgufValue x;
  x.type = GgufValueType::kArray;
  x.elem = elem;
  x.ints = std::move(v);
  return x;
}
GgufValue GgufValue::FloatArray(GgufValueType elem, std::vector<double> v) {
  GgufValue x;
  x.type = GgufValueType::kArray;
  x.elem = elem;
  x.floats = std::move(v);
  return x;
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

// ---- Reader ---------------------------------------------------------------------------

Result<GgufReader> GgufReader::Open(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  GgufReader r(std::move(file));
  L2L_RETURN_IF_ERROR(r.Parse());
  return r;
}

Status GgufReader::Parse() {
  const std::string& p = file_.path();
  Cursor c(p, file_.data(), file_.size());
  uint32_t magic = 0;
  if (file_.size() < 4) {
    return DataLoss(p + ": not a GGUF file: " + std::to_string(file_.size()) + " bytes, less than the 4-byte magic");
  }
  L2L_RETURN_IF_ERROR(c.Read(&magic, "magic"));
  if (magic != kGgufMagic) {
    return DataLoss(p + ": not a GGUF file: bad magic " + Hex(magic) + " (expected " + Hex(kGgufMagic) + ", \"GGUF\")");
  }
  L2L_RETURN_IF_ERROR(c.Read(&version_, "version"));
  if (version_ != kGgufVersion) {
    return InvalidArgument(p + ": GGUF version " + std::to_string(version_) + " is not supported (only version 3)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  L2L_RETURN_IF_ERROR(c.Read(&n_tensors, "tensor count"));
  L2L_RETURN_IF_ERROR(c.Read(&n_kv, "metadata count"));
  // Each kv takes >= 8 + 4 bytes, each tensor info >= 8 + 4 + 4 + 8.
  if (n_kv > c.left() / 12 || n_tensors > c.left() / 24) {
    return DataLoss(p + ": header claims " + std::to_string(n_tensors) + " tensors and " + std::to_string(n_kv) +
                    " metadata entries, more than the " + std::to_string(file_.size()) +
                    "-byte file can hold (truncated or corrupt)");
  }

  MetadataBudget budget;
  L2L_ASSIGN_OR_RETURN(budget.cap, MaxFileBytes());
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    L2L_RETURN_IF_ERROR(c.ReadString(&key, "metadata key #" + std::to_string(k)));
    const std::string what = "metadata '" + key + "'";
    uint32_t t = 0;
    const size_t at = c.pos();
    L2L_RETURN_IF_ERROR(c.Read(&t, what + " (type)"));
    if (!ValidValueType(t)) {
      return DataLoss(p + ": " + what + ": unknown value type " + std::to_string(t) + " at byte " + std::to_string(at));
    }
    GgufValue v;
    L2L_RETURN_IF_ERROR(ReadValue(c, static_cast<GgufValueType>(t), &v, what, 0, &budget));
    if (kv_.count(key)) return DataLoss(p + ": metadata key '" + key + "' appears twice");
    keys_.push_back(key);
    kv_.emplace(key, std::move(v));
  }

  if (const GgufValue* a = Get("general.alignment")) {
    if (a->type != GgufValueType::kU32) {
      return DataLoss(p + ": metadata 'general.alignment' has type " + GgufValueTypeName(a->type) +
                      ", expected UINT32");
    }
    if (a->i == 0 || (a->i & (a->i - 1)) != 0) {
      return DataLoss(p + ": metadata 'general.alignment' = " + std::to_string(a->i) + " is not a power of two");
    }
    alignment_ = static_cast<uint32_t>(a->i);
  }

  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensorInfo t;
    L2L_RETURN_IF_ERROR(c.ReadString(&t.name, "tensor info #" + std::to_string(k) + " name"));
    const std::string where = p + ": tensor '" + t.name + "'";
    const std::string what = "tensor '" + t.name + "'";
    uint32_t n_dims = 0;
    L2L_RETURN_IF_ERROR(c.Read(&n_dims, what + " n_dims"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return DataLoss(where + ": n_dims " + std::to_string(n_dims) + " is not in 1..4");
    }
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t x = 0;
      L2L_RETURN_IF_ERROR(c.Read(&x, what + " ne[" + std::to_string(d) + "]"));
      if (x > static_cast<uint64_t>(INT64_MAX)) return DataLoss(where + ": dimension " + std::to_string(x) + " is negative");
      t.ne.push_back(static_cast<int64_t>(x));
    }
    t.shape.assign(t.ne.rbegin(), t.ne.rend());
    L2L_RETURN_IF_ERROR(c.Read(&t.type, what + " type"));
    L2L_RETURN_IF_ERROR(c.Read(&t.offset, what + " offset"));
    const auto tr = GgmlTraits(t.type);
    if (!tr) return DataLoss(where + ": unknown ggml tensor type " + std::to_string(t.type));
    if (t.ne[0] % tr->block_size != 0) {
      return DataLoss(where + ": shape ne=" + NeText(t.ne) + ": row length " + std::to_string(t.ne[0]) +
                      " is not a multiple of the " + tr->name + " block size " + std::to_string(tr->block_size));
    }
    // Both the byte size and the element count (numel()) must fit: a row of 2^62 F32
    // would otherwise wrap to 0 bytes and pass the bounds check below.
    uint64_t nb = 0;
    int64_t numel = t.ne[0];
    bool overflow = __builtin_mul_overflow(static_cast<uint64_t>(t.ne[0]) / tr->block_size,
                                           uint64_t{tr->type_size}, &nb);
    for (size_t d = 1; d < t.ne.size(); ++d) {
      overflow |= __builtin_mul_overflow(nb, static_cast<uint64_t>(t.ne[d]), &nb);
      overflow |= __builtin_mul_overflow(numel, t.ne[d], &numel);
    }
    if (overflow) {
      return DataLoss(where + ": shape ne=" + NeText(t.ne) + ": its element count or byte size overflows 64 bits");
    }
    t.nbytes = nb;
    if (t.offset % alignment_ != 0) {
      return DataLoss(where + ": data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                      std::to_string(alignment_));
    }
    if (by_name_.count(t.name)) return DataLoss(where + ": name appears twice");
    by_name_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  const uint64_t pad = (alignment_ - c.pos() % alignment_) % alignment_;
  data_start_ = c.pos() + pad;
  if (data_start_ > file_.size() && !tensors_.empty()) {
    return DataLoss(p + ": truncated: the data section would start at byte " + std::to_string(data_start_) +
                    " but the file has " + std::to_string(file_.size()) + " bytes");
  }
  const uint64_t data_size = file_.size() >= data_start_ ? file_.size() - data_start_ : 0;
  for (const GgufTensorInfo& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return DataLoss(p + ": tensor '" + t.name + "': data at offset " + std::to_string(t.offset) + " + " +
                      std::to_string(t.nbytes) + " bytes (" + GgmlTraits(t.type)->name + ", ne=" + NeText(t.ne) +
                      ") runs past the end of the " + std::to_string(data_size) +
                      "-byte data section (truncated file or offset out of range)");
    }
  }
  return Status::Ok();
}

const GgufTensorInfo* GgufReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufReader::Get(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
Status WrongType(const std::string& path, const std::string& key, const GgufValue& v, const char* expected) {
  std::string found = GgufValueTypeName(v.type);
  if (v.type == GgufValueType::kArray) found += std::string(" of ") + GgufValueTypeName(v.elem);
  return InvalidArgument(path + ": metadata '" + key + "' has type " + found + ", expected " + expected);
}
}  // namespace

#define L2L_GGUF_GET(key)                                                       \
  const GgufValue* v = Get(key);                                                \
  if (v == nullptr) return NotFound(path() + ": no metadata key '" + (key) + "'")

Result<std::string> GgufReader::GetString(const std::string& key) const {
  L2L_GGUF_GET(key);
  if (v->type != GgufValueType::kString) return WrongType(path(), key, *v, "STRING");
  return v->str;
}
Result<uint64_t> GgufReader::GetUInt(const std::string& key) const {
  L2L_GGUF_GET(key);
  if (!v->is_int() || (v->i < 0 && v->type != GgufValueType::kU64)) return WrongType(path(), key, *v, "a non-negative integer");
  return static_cast<uint64_t>(v->i);
}
Result<int64_t> GgufReader::GetInt(const std::string& key) const {
  L2L_GGUF_GET(key);
  if (!v->is_int()) return WrongType(path(), key, *v, "an integer");
  return v->i;
}
Result<double> GgufReader::GetFloat(const std::string& key) const {
  L2L_GGUF_GET(key);
  if (v->is_float()) return v->f;
  if (v->is_int() && v->type != GgufValueType::kBool) return static_cast<double>(v->i);
  return WrongType(path(), key, *v, "FLOAT32/FLOAT64");
}
Result<bool> GgufReader::GetBool(const std::string& key) const {
  L2L_GGUF_GET(key);
  if (v->type != GgufValueType::kBool) return WrongType(path(), key, *v, "BOOL");
  return v->i != 0;
}
Result<std::vector<std::string>> GgufReader::GetStringArray(const std::string& key) const {
  L2L_GGUF_GET(key);
  if (v->type != GgufValueType::kArray || v->elem != GgufValueType::kString) {
    return WrongType(path(), key, *v, "ARRAY of STRING");
  }
  return v->strings;
}
Result<std::vector<int64_t>> GgufReader::GetIntArray(const std::string& key) const {
  L2L_GGUF_GET(key);
  if (v->type != GgufValueType::kArray || !(v->ints.size() == v->array_size())) {
    return WrongType(path(), key, *v, "ARRAY of integers");
  }
  return v->ints;
}
Result<std::vector<double>> GgufReader::GetFloatArray(const std::string& key) const {
  L2L_GGUF_GET(key);
  if (v->type != GgufValueType::kArray || (v->elem != GgufValueType::kF32 && v->elem != GgufValueType::kF64)) {
    return WrongType(path(), key, *v, "ARRAY of FLOAT32/FLOAT64");
  }
  return v->floats;
}
#undef L2L_GGUF_GET

Status GgufReader::ReadF32(const std::string& name, float* out, size_t n) const {
  const GgufTensorInfo* t = Find(name);
  if (t == nullptr) return NotFound(path() + ": no tensor '" + name + "'");
  if (n != static_cast<size_t>(t->numel())) {
    return InvalidArgument(path() + ": tensor '" + name + "' has " + std::to_string(t->numel()) +
                           " elements (ne=" + NeText(t->ne) + "), the destination " + std::to_string(n));
  }
  Status s = DequantizeToF32(t->type, Raw(*t), out, n);
  ReleaseMappedPages({file_.data(), file_.size()}, Raw(*t));
  if (!s.ok()) return s.WithContext(path() + ": tensor '" + name + "'");
  return s;
}

Result<std::vector<float>> GgufReader::ReadF32(const std::string& name) const {
  const GgufTensorInfo* t = Find(name);
  if (t == nullptr) return NotFound(path() + ": no tensor '" + name + "'");
  std::vector<float> out(static_cast<size_t>(t->numel()));
  L2L_RETURN_IF_ERROR(ReadF32(name, out.data(), out.size()));
  return out;
}

// ---- Blocks ---------------------------------------------------------------------------

namespace {
inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFloat(h);
}
}  // namespace

void DequantizeQ8_0(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = blocks + b * 34;
    const float d = HalfAt(blk);
    const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
    for (int j = 0; j < 32; ++j) out[b * 32 + j] = static_cast<float>(q[j]) * d;
  }
}

void DequantizeQ4_0(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = blocks + b * 18;
    const float d = HalfAt(blk);
    const uint8_t* qs = blk + 2;
    for (int j = 0; j < 16; ++j) {
      out[b * 32 + j] = static_cast<float>(static_cast<int>(qs[j] & 0x0f) - 8) * d;
      out[b * 32 + j + 16] = static_cast<float>(static_cast<int>(qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantizeQ4_1(const uint8_t* blocks, float* out, size_t n) {
  for (size_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = blocks + b * 20;
    const float d = HalfAt(blk);
    const float m = HalfAt(blk + 2);
    const uint8_t* qs = blk + 4;
    for (int j = 0; j < 16; ++j) {
      // Product and sum rounded separately (as ggml's reference and gguf-py compute it);
      // this file builds without FP contraction (-std=c++20 implies -ffp-contract=off).
      const float lo = static_cast<float>(qs[j] & 0x0f) * d;
      const float hi = static_cast<float>(qs[j] >> 4) * d;
      out[b * 32 + j] = lo + m;
      out[b * 32 + j + 16] = hi + m;
    }
  }
}

void QuantizeQ8_0(const float* x, uint8_t* blocks, size_t n) {
  for (size_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* blk = blocks + b * 34;
    const uint16_t dh = FloatToFp16(d);
    std::memcpy(blk, &dh, 2);
    for (int j = 0; j < 32; ++j) {
      const float v = xb[j] * id;
      blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(v)));
    }
  }
}

Status DequantizeToF32(uint32_t type, const uint8_t* data, float* out, size_t n) {
  const auto tr = GgmlTraits(type);
  if (!tr) return InvalidArgument("unknown ggml tensor type " + std::to_string(type));
  if (n % tr->block_size != 0) {
    return InvalidArgument(std::to_string(n) + " elements are not whole " + tr->name + " blocks");
  }
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(out, data, n * sizeof(float));  // an empty tensor's buffers may be null
      return Status::Ok();
    case GgmlType::kF16:
      ConvertToFloat(data, DType::kF16, out, n);
      return Status::Ok();
    case GgmlType::kBF16:
      ConvertToFloat(data, DType::kBF16, out, n);
      return Status::Ok();
    case GgmlType::kQ8_0:
      DequantizeQ8_0(data, out, n);
      return Status::Ok();
    case GgmlType::kQ4_0:
      DequantizeQ4_0(data, out, n);
      return Status::Ok();
    case GgmlType::kQ4_1:
      DequantizeQ4_1(data, out, n);
      return Status::Ok();
    case GgmlType::kQ5_0:
      DequantizeQ5_0(data, out, n);
      return Status::Ok();
    case GgmlType::kQ5_1:
      DequantizeQ5_1(data, out, n);
      return Status::Ok();
    case GgmlType::kQ2_K:
      DequantizeQ2_K(data, out, n);
      return Status::Ok();
    case GgmlType::kQ3_K:
      DequantizeQ3_K(data, out, n);
      return Status::Ok();
    case GgmlType::kQ4_K:
      DequantizeQ4_K(data, out, n);
      return Status::Ok();
    case GgmlType::kQ5_K:
      DequantizeQ5_K(data, out, n);
      return Status::Ok();
    case GgmlType::kQ6_K:
      DequantizeQ6_K(data, out, n);
      return Status::Ok();
    case GgmlType::kQ8_K:
      DequantizeQ8_K(data, out, n);
      return Status::Ok();
    default:
      return Unimplemented(std::string("tensor type ") + tr->name + " cannot be read as fp32 (supported: " +
                           kReadableTypes + ")");
  }
}

Status DequantizeToF32(uint32_t type, std::span<const uint8_t> data, float* out, size_t n) {
  const auto tr = GgmlTraits(type);
  if (!tr) return InvalidArgument("unknown ggml tensor type " + std::to_string(type));
  if (n % tr->block_size != 0) {
    return InvalidArgument(std::to_string(n) + " elements are not whole " + tr->name + " blocks");
  }
  const uint64_t want = static_cast<uint64_t>(n / tr->block_size) * tr->type_size;
  if (data.size() != want) {
    return DataLoss(std::string(tr->name) + ": " + std::to_string(n) + " elements take " + std::to_string(want) +
                    " bytes (" + std::to_string(n / tr->block_size) + " blocks of " + std::to_string(tr->type_size) +
                    "), the data holds " + std::to_string(data.size()));
  }
  return DequantizeToF32(type, data.data(), out, n);
}

// ---- Llama q/k permutation ------------------------------------------------------------

namespace {
Status CheckPermuteArgs(int64_t rows, int64_t cols, int64_t n_head) {
  if (n_head <= 0 || rows <= 0 || cols < 0 || rows % n_head != 0 || (rows / n_head) % 2 != 0) {
    return InvalidArgument("q/k permutation: " + std::to_string(rows) + " rows are not n_head=" +
                           std::to_string(n_head) + " heads of an even head_dim");
  }
  return Status::Ok();
}
}  // namespace

// Head h, row r = h * hd + j * (hd/2) + i in HF order sits at h * hd + 2 * i + j in GGUF order.
Status PermuteLlamaRows(const float* in, float* out, int64_t rows, int64_t cols, int64_t n_head) {
  L2L_RETURN_IF_ERROR(CheckPermuteArgs(rows, cols, n_head));
  const int64_t hd = rows / n_head, half = hd / 2;
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t src = h * hd + j * half + i, dst = h * hd + 2 * i + j;
        std::memcpy(out + dst * cols, in + src * cols, static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
  return Status::Ok();
}

Status UnpermuteLlamaRows(const float* in, float* out, int64_t rows, int64_t cols, int64_t n_head) {
  L2L_RETURN_IF_ERROR(CheckPermuteArgs(rows, cols, n_head));
  const int64_t hd = rows / n_head, half = hd / 2;
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t hf = h * hd + j * half + i, gg = h * hd + 2 * i + j;
        std::memcpy(out + hf * cols, in + gg * cols, static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
  return Status::Ok();
}

}  // namespace l2l::formats
