// safetensors files (the Hugging Face tensor format): read and write.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v", ...},                       (optional, strings only)
//    "<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...}
// then the data section; offsets are bytes relative to its start, row-major, little-endian.
//
// Reader: maps the file and validates everything before handing out a byte: N within the
// file (and <= 100 MB), well-formed JSON object, every entry's fields and types, a known
// dtype, end - begin == numel * element size, offsets inside the data section, and --
// as the reference implementation requires -- tensors that tile the data section exactly
// (no overlap, no gap, no trailing bytes). Every error names the path and, where there
// is one, the tensor. Any standard safetensors dtype is accepted structurally; F32, BF16
// and F16 can be read as fp32, others (I64, BOOL, ...) fail only when read as fp32.
//
// Writer: tensors in the given order, contiguous; the header padded with spaces to a
// multiple of 8 bytes (as the reference writer does) so the data section is 8-byte
// aligned. Streams through an AtomicFileWriter (temp, fsync, rename): a crash leaves the
// old file or the new one, never a torn one.
//
// Ownership: SafeTensorsReader owns a read-only mapping; move-only.
// Thread-safety: a reader is immutable after Open() and can be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/file_util.h"
#include "common/status.h"

namespace l2l {

// Safetensors' own dtype names: "F32", "BF16", "F16".
const char* SafeTensorsDTypeName(DType d);

struct SafeTensorInfo {
  std::string name;
  std::string dtype_name;       // as in the file, e.g. "BF16" or "I64"
  std::optional<DType> dtype;   // set for the dtypes l2l converts (F32, BF16, F16)
  size_t element_size = 0;      // bytes
  std::vector<int64_t> shape;   // row-major; [] is a scalar
  size_t offset = 0;            // bytes from the start of the data section
  size_t nbytes = 0;
  size_t numel() const;
};

class SafeTensorsReader {
 public:
  static Result<SafeTensorsReader> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  // In file (offset) order.
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const SafeTensorInfo* Find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The whole file's mapping (for ReleaseMappedPages).
  std::span<const uint8_t> Mapping() const { return {file_.data(), file_.size()}; }
  // The tensor's bytes as stored (not necessarily aligned).
  std::span<const uint8_t> Raw(const SafeTensorInfo& t) const {
    return {file_.data() + data_start_ + t.offset, t.nbytes};
  }
  // Converts `name` to fp32 into out[0..n); n must equal its numel.
  Status ReadAsFloat(const std::string& name, float* out, size_t n) const;
  Result<std::vector<float>> ReadAsFloat(const std::string& name) const;

 private:
  explicit SafeTensorsReader(MappedFile file) : file_(std::move(file)) {}
  Status Parse();

  MappedFile file_;
  size_t data_start_ = 0;  // 8 + header length
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;  // index into tensors_
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;    // how it is stored in the file
  const float* f32 = nullptr;   // either fp32 values, converted to dtype on write (RNE) ...
  const void* raw = nullptr;    // ... or numel * DTypeSize(dtype) bytes already encoded
  // ... or fp32 values produced on demand: called once, in file order, right before the
  // tensor is written (streaming writers keep one piece of the model in memory at a time).
  std::function<Result<const float*>()> f32_source = nullptr;
};

// Writes `tensors` (unique, non-empty names other than "__metadata__") and `metadata`.
Status WriteSafeTensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace l2l
