// GGUF (version 3), the llama.cpp / ggml model file: reader, value types, dequantization.
//
// Layout (all little-endian):
//   u32 magic "GGUF", u32 version (3), u64 n_tensors, u64 n_kv,
//   n_kv x { string key, u32 value_type, value }          string = u64 length + bytes
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//   padding to `general.alignment` (default 32), then the data section; each tensor's
//   offset is relative to the data section and a multiple of the alignment.
// ne[0] is the fastest-varying dimension (a row's length); `shape` below is the reversed,
// row-major order (numpy's, Hugging Face's): a (vocab, hidden) embedding has ne = {hidden,
// vocab}. Quantized types store ne[0] / block_size blocks per row.
//
// Reader: maps the file read-only (pages come in as tensors are read, so the resident
// memory of a reader is the header plus what the caller touches) and validates the whole
// header before returning: magic, version, every length and count against the bytes left,
// value types, tensor dims (1..4, non-negative, no overflow), known ggml type, ne[0] a
// multiple of the block size, offsets aligned and inside the file, no duplicate names or
// keys; metadata arrays bounded by their in-memory size before they are allocated (at most
// 8x the file bytes after the array, and L2L_MAX_FILE_BYTES for all arrays of a file).
// Every error names the file, and the key or tensor and the byte offset where there is one.
// Dequantization to fp32 follows ggml's reference (ggml-quants.c) bit for bit for F32, F16,
// BF16, Q8_0, Q4_0, Q4_1 (here) and Q5_0, Q5_1, Q2_K..Q6_K, Q8_K (gguf_quants.h); the other
// ggml types (IQ*, I8..I64, F64, the Q4_0_x_y repacks) are listed but fail when read as
// fp32, naming the type and the tensor.
//
// Ownership: GgufReader owns its mapping; move-only. GgufValue is a value.
// Thread-safety: a reader is immutable after Open() and can be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/status.h"

namespace l2l::formats {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint32_t kGgufDefaultAlignment = 32;

// ggml tensor types (ggml.h enum ggml_type). Values are the on-disk ids.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21,
  kIQ2_S = 22, kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28,
  kIQ1_M = 29, kBF16 = 30, kQ4_0_4_4 = 31, kQ4_0_4_8 = 32, kQ4_0_8_8 = 33,
};

struct GgmlTypeTraits {
  const char* name;     // "Q8_0"
  uint32_t block_size;  // elements per block (1 for plain types)
  uint32_t type_size;   // bytes per block
  bool to_f32;          // ReadF32 supports it
};
// nullopt for an id ggml does not define.
std::optional<GgmlTypeTraits> GgmlTraits(uint32_t type);
const char* GgmlTypeName(GgmlType t);

// GGUF metadata value types (gguf.h enum gguf_type).
enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* GgufValueTypeName(GgufValueType t);

// One metadata value. Scalars: integers (all widths and bool) in `i` (u64 values above
// INT64_MAX keep their bit pattern), floats in `f`, a string in `str`. Arrays: `elem`
// is the element type and exactly one of ints / floats / strings / arrays holds the
// elements (nested arrays are allowed by the format and rare).
struct GgufValue {
  GgufValueType type = GgufValueType::kU32;
  GgufValueType elem = GgufValueType::kU32;  // arrays only
  int64_t i = 0;
  double f = 0;
  std::string str;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::vector<GgufValue> arrays;

  bool is_int() const;    // any integer type or bool
  bool is_float() const;  // F32 or F64
  size_t array_size() const;

  static GgufValue U32(uint32_t v);
  static GgufValue I32(int32_t v);
  static GgufValue U64(uint64_t v);
  static GgufValue F32(float v);
  static GgufValue Bool(bool v);
  static GgufValue String(std::string v);
  static GgufValue StringArray(std::vector<std::string> v);
  // elem: any integer type or kBool.
  static GgufValue IntArray(GgufValueType elem, std::vector<int64_t> v);
  // elem: kF32 or kF64.
  static GgufValue FloatArray(GgufValueType elem, std::vector<double> v);
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;     // ggml order: ne[0] is a row's length
  std::vector<int64_t> shape;  // row-major (reversed ne)
  uint32_t type = 0;           // a ggml type id (GgmlTraits(type) is set)
  uint64_t offset = 0;         // bytes from the start of the data section
  uint64_t nbytes = 0;
  int64_t numel() const;
  GgmlType ggml_type() const { return static_cast<GgmlType>(type); }
};

class GgufReader {
 public:
  static Result<GgufReader> Open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_start_; }  // file offset of the data section

  // In file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* Find(const std::string& name) const;

  // Keys in file order and lookup by key.
  const std::vector<std::string>& keys() const { return keys_; }
  const GgufValue* Get(const std::string& key) const;
  // Typed getters: NotFound when absent, InvalidArgument naming file, key, expected and
  // found type when the type does not fit. GetUInt accepts any non-negative integer,
  // GetFloat F32/F64 and integers, GetInt any integer.
  Result<std::string> GetString(const std::string& key) const;
  Result<uint64_t> GetUInt(const std::string& key) const;
  Result<int64_t> GetInt(const std::string& key) const;
  Result<double> GetFloat(const std::string& key) const;
  Result<bool> GetBool(const std::string& key) const;
  Result<std::vector<std::string>> GetStringArray(const std::string& key) const;
  Result<std::vector<int64_t>> GetIntArray(const std::string& key) const;
  Result<std::vector<double>> GetFloatArray(const std::string& key) const;

  // The tensor's bytes as stored.
  std::span<const uint8_t> Raw(const GgufTensorInfo& t) const {
    return {file_.data() + data_start_ + t.offset, static_cast<size_t>(t.nbytes)};
  }
  // Dequantizes `name` to fp32 into out[0..n), row-major; n must equal its numel. The
  // tensor's file pages are dropped from the resident set afterwards (ReleaseMappedPages).
  Status ReadF32(const std::string& name, float* out, size_t n) const;
  Result<std::vector<float>> ReadF32(const std::string& name) const;

 private:
  explicit GgufReader(MappedFile file) : file_(std::move(file)) {}
  Status Parse();

  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_start_ = 0;
  std::vector<std::string> keys_;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
};

// ---- Block formats (ggml-quants.c reference) ------------------------------------------
// n is a multiple of the block size (32). Dequantize writes n floats; quantize n / 32
// blocks. Q8_0 block: fp16 d, int8 q[32]; x = d * q.
// Q4_0: fp16 d, u8 qs[16]; element j < 16 is the low nibble of qs[j], j >= 16 the high
// nibble of qs[j - 16]; x = d * (nibble - 8). Q4_1: fp16 d, fp16 m, u8 qs[16]; x = d * nibble + m.
void DequantizeQ8_0(const uint8_t* blocks, float* out, size_t n);
void DequantizeQ4_0(const uint8_t* blocks, float* out, size_t n);
void DequantizeQ4_1(const uint8_t* blocks, float* out, size_t n);
// As ggml's quantize_row_q8_0_ref: d = max|x| / 127 (stored as fp16, RNE), q = roundf(x / d)
// (ties away from zero, computed as x * (1/d) in fp32).
void QuantizeQ8_0(const float* x, uint8_t* blocks, size_t n);
// Any supported type: n elements from `data` (numel elements of a tensor, ne[0] a
// multiple of the block size). Unimplemented for types whose to_f32 is false. The first
// form trusts that data holds n / block_size blocks; the second checks data.size()
// against that (DataLoss naming the type and both sizes).
Status DequantizeToF32(uint32_t type, const uint8_t* data, float* out, size_t n);
Status DequantizeToF32(uint32_t type, std::span<const uint8_t> data, float* out, size_t n);

// ---- Llama's q/k row permutation -----------------------------------------------------
// llama.cpp's convert_hf_to_gguf.py stores Llama-architecture attn_q / attn_k weights (and
// biases) with the rows of each head interleaved for its rotary kernel:
//   gguf = hf.reshape(n_head, 2, head_dim/2, cols).swapaxes(1, 2).reshape(rows, cols)
// with n_head = num_attention_heads for q and num_key_value_heads for k.
// PermuteLlamaRows does that (for writers); UnpermuteLlamaRows undoes it (for readers).
// in and out are (rows, cols) row-major and must not alias; rows = n_head * head_dim with
// head_dim even, else InvalidArgument.
Status PermuteLlamaRows(const float* in, float* out, int64_t rows, int64_t cols, int64_t n_head);
Status UnpermuteLlamaRows(const float* in, float* out, int64_t rows, int64_t cols, int64_t n_head);

}  // namespace l2l::formats
