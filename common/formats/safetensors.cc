// safetensors reader and writer. See common/formats/safetensors.h.
//
// nlohmann::json throws on malformed input; parsing sits in a try block so no exception
// leaves this file.
//
// Thread-safety: see the header.
#include "common/formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "common/json_util.h"

namespace l2l {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as the reference implementation
constexpr size_t kConvertChunk = 1 << 20;            // floats converted per write

struct DTypeEntry {
  const char* name;
  size_t size;
  std::optional<DType> ours;
};
// Every dtype of the safetensors specification.
const DTypeEntry kDTypes[] = {
    {"F32", 4, DType::kF32},     {"BF16", 2, DType::kBF16},   {"F16", 2, DType::kF16},
    {"F64", 8, std::nullopt},    {"I64", 8, std::nullopt},    {"U64", 8, std::nullopt},
    {"I32", 4, std::nullopt},    {"U32", 4, std::nullopt},    {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},    {"I8", 1, std::nullopt},     {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt},   {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
};

const DTypeEntry* FindDType(const std::string& name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

// numel * elem, false on overflow or a negative dimension.
bool ByteSize(const std::vector<int64_t>& shape, size_t elem, size_t* out) {
  size_t n = elem;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<size_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

const char* SafeTensorsDTypeName(DType d) {
  switch (d) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
  }
  return "?";
}

size_t SafeTensorInfo::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

Result<SafeTensorsReader> SafeTensorsReader::Open(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  SafeTensorsReader r(std::move(file));
  L2L_RETURN_IF_ERROR(r.Parse());
  return r;
}

Status SafeTensorsReader::Parse() {
  const std::string& p = file_.path();
  const size_t size = file_.size();
  if (size < 8) {
    return DataLoss(p + ": not a safetensors file: " + std::to_string(size) + " bytes, less than the 8-byte header length");
  }
  uint64_t n = 0;
  std::memcpy(&n, file_.data(), 8);
  if (n > size - 8) {
    return DataLoss(p + ": safetensors header length " + std::to_string(n) + " runs past the end of the " +
                    std::to_string(size) + "-byte file (truncated or not a safetensors file)");
  }
  if (n > kMaxHeaderBytes) {
    return InvalidArgument(p + ": safetensors header length " + std::to_string(n) + " exceeds the 100 MB limit");
  }
  data_start_ = 8 + static_cast<size_t>(n);
  const size_t data_size = size - data_start_;
  const char* hb = reinterpret_cast<const char*>(file_.data() + 8);
  json header;
  try {
    header = json::parse(hb, hb + n);
  } catch (const std::exception& e) {
    return DataLoss(p + ": safetensors header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return DataLoss(p + ": safetensors header is not a JSON object");

  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return DataLoss(p + ": __metadata__ is not a JSON object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) return DataLoss(p + ": __metadata__[\"" + k + "\"] is not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = p + ": tensor '" + name + "'";
    if (name.empty()) return DataLoss(p + ": a tensor has an empty name");
    if (!entry.is_object()) return DataLoss(where + ": entry is not a JSON object");
    for (const auto& [k, v] : entry.items()) {
      if (k != "dtype" && k != "shape" && k != "data_offsets") return DataLoss(where + ": unexpected field '" + k + "'");
    }
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) return DataLoss(where + ": missing string 'dtype'");
    if (!entry.contains("shape") || !entry["shape"].is_array()) return DataLoss(where + ": missing array 'shape'");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      return DataLoss(where + ": 'data_offsets' must be [begin, end]");
    }
    SafeTensorInfo t;
    t.name = name;
    t.dtype_name = entry["dtype"].get<std::string>();
    const DTypeEntry* dt = FindDType(t.dtype_name);
    if (dt == nullptr) return DataLoss(where + ": unknown dtype '" + t.dtype_name + "'");
    t.dtype = dt->ours;
    t.element_size = dt->size;
    const json& shape = entry["shape"];
    for (size_t i = 0; i < shape.size(); ++i) {
      if (!shape[i].is_number_unsigned()) return DataLoss(where + ": shape " + JsonSnippet(shape) + " has a non-integer or negative dimension");
      Result<int64_t> d = JsonToInt(shape[i], 0, std::numeric_limits<int64_t>::max(), where + ": shape[" + std::to_string(i) + "]");
      if (!d.ok()) return DataLoss(d.status().message());
      t.shape.push_back(*d);
    }
    const json& offs = entry["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      return DataLoss(where + ": data_offsets " + JsonSnippet(offs) + " must be non-negative integers");
    }
    Result<uint64_t> begin_r = JsonInt<uint64_t>(offs[0], where + ": data_offsets[0]");
    Result<uint64_t> end_r = JsonInt<uint64_t>(offs[1], where + ": data_offsets[1]");
    if (!begin_r.ok() || !end_r.ok()) return DataLoss((begin_r.ok() ? end_r : begin_r).status().message());
    const uint64_t begin = *begin_r, end = *end_r;
    if (begin > end) return DataLoss(where + ": data_offsets " + offs.dump() + " has begin > end");
    if (end > data_size) {
      return DataLoss(where + ": data_offsets " + offs.dump() + " run past the " + std::to_string(data_size) +
                      "-byte data section");
    }
    size_t expected;
    if (!ByteSize(t.shape, t.element_size, &expected) || expected != end - begin) {
      return DataLoss(where + ": data_offsets " + offs.dump() + " span " + std::to_string(end - begin) +
                      " bytes but shape " + ShapeText(t.shape) + " of " + t.dtype_name + " needs " +
                      (ByteSize(t.shape, t.element_size, &expected) ? std::to_string(expected) : "too many"));
    }
    t.offset = static_cast<size_t>(begin);
    t.nbytes = static_cast<size_t>(end - begin);
    tensors_.push_back(std::move(t));
  }

  // The tensors must tile the data section: sorted by offset, each starts where the
  // previous ended, the last ends at the end of the file.
  std::sort(tensors_.begin(), tensors_.end(), [](const SafeTensorInfo& a, const SafeTensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  size_t pos = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SafeTensorInfo& t = tensors_[i];
    if (t.offset < pos) {
      return DataLoss(p + ": tensor '" + t.name + "' (bytes " + std::to_string(t.offset) + ".." +
                      std::to_string(t.offset + t.nbytes) + ") overlaps tensor '" + tensors_[i - 1].name + "'");
    }
    if (t.offset > pos) {
      return DataLoss(p + ": " + std::to_string(t.offset - pos) + " unused bytes before tensor '" + t.name +
                      "' (data offsets must be contiguous)");
    }
    pos = t.offset + t.nbytes;
    by_name_[t.name] = i;
  }
  if (pos != data_size) {
    return DataLoss(p + ": " + std::to_string(data_size - pos) + " bytes after the last tensor (truncated header or trailing garbage)");
  }
  return Status::Ok();
}

const SafeTensorInfo* SafeTensorsReader::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Status SafeTensorsReader::ReadAsFloat(const std::string& name, float* out, size_t n) const {
  const SafeTensorInfo* t = Find(name);
  if (t == nullptr) return NotFound(path() + ": no tensor '" + name + "'");
  if (!t->dtype.has_value()) {
    return InvalidArgument(path() + ": tensor '" + name + "' has dtype " + t->dtype_name +
                           "; only F32, BF16 and F16 convert to fp32");
  }
  if (n != t->numel()) {
    return InvalidArgument(path() + ": tensor '" + name + "' has " + std::to_string(t->numel()) +
                           " elements, the destination " + std::to_string(n));
  }
  ConvertToFloat(Raw(*t).data(), *t->dtype, out, n);
  return Status::Ok();
}

Result<std::vector<float>> SafeTensorsReader::ReadAsFloat(const std::string& name) const {
  const SafeTensorInfo* t = Find(name);
  if (t == nullptr) return NotFound(path() + ": no tensor '" + name + "'");
  std::vector<float> out(t->numel());
  L2L_RETURN_IF_ERROR(ReadAsFloat(name, out.data(), out.size()));
  return out;
}

Status WriteSafeTensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> names;
  size_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string where = path + ": tensor '" + t.name + "'";
    if (t.name.empty() || t.name == "__metadata__") return InvalidArgument(path + ": invalid tensor name '" + t.name + "'");
    if (!names.insert(t.name).second) return InvalidArgument(where + " given twice");
    if ((t.f32 != nullptr) + (t.raw != nullptr) + (t.f32_source != nullptr) != 1) {
      return InvalidArgument(where + ": set exactly one of f32, raw and f32_source");
    }
    size_t nbytes;
    if (!ByteSize(t.shape, DTypeSize(t.dtype), &nbytes)) {
      return InvalidArgument(where + ": bad shape " + ShapeText(t.shape));
    }
    header[t.name] = {{"dtype", SafeTensorsDTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const std::exception& e) {  // invalid UTF-8 in a name or metadata value
    return InvalidArgument(path + ": cannot encode the safetensors header: " + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();

  L2L_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Create(path));
  L2L_RETURN_IF_ERROR(w.Append(&n, sizeof(n)));
  L2L_RETURN_IF_ERROR(w.Append(text.data(), text.size()));
  std::vector<uint8_t> chunk;
  for (const TensorToWrite& t : tensors) {
    size_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<size_t>(d);
    const float* f32 = t.f32;
    if (t.f32_source) {
      L2L_ASSIGN_OR_RETURN(f32, t.f32_source());
    }
    if (t.raw != nullptr) {
      L2L_RETURN_IF_ERROR(w.Append(t.raw, numel * DTypeSize(t.dtype)));
    } else if (t.dtype == DType::kF32) {
      L2L_RETURN_IF_ERROR(w.Append(f32, numel * sizeof(float)));
    } else {
      const size_t esz = DTypeSize(t.dtype);
      chunk.resize(std::min(numel, kConvertChunk) * esz);
      for (size_t i = 0; i < numel; i += kConvertChunk) {
        const size_t m = std::min(kConvertChunk, numel - i);
        ConvertFromFloat(f32 + i, t.dtype, chunk.data(), m);
        L2L_RETURN_IF_ERROR(w.Append(chunk.data(), m * esz));
      }
    }
  }
  return w.Commit();
}

}  // namespace l2l
