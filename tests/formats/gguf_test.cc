// Tests for common/formats/gguf.h and gguf_writer.h against the `gguf` python package
// (tests/formats/gguf_oracle.py): files written by GGUFWriter read with every metadata
// type, dequantized values equal to gguf.quants.dequantize bit for bit (F32 ... Q4_1 from
// gguf's quantizer; Q5_0, Q5_1 and the K-quants from random blocks with edge-case scales),
// llama.cpp's q/k permutation undone, files we write read back by GGUFReader with gguf's
// own quantizer's bytes (Q4_K / Q6_K, which gguf cannot quantize: decoded as we decode
// them, within stated error bounds), llama.cpp's Q4_K_M type choices, and every malformed
// file rejected with a message naming the file and the tensor.
#include <cmath>
#include <cstring>
#include <fstream>
#include <span>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/formats/gguf.h"
#include "common/formats/gguf_recipe.h"
#include "common/formats/gguf_writer.h"
#include "tests/common/temp_dir.h"
#include "tests/testing/scoped_env.h"
#include "tests/formats/oracle_util.h"

namespace l2l::formats {
namespace {

using testing::ReadF32File;
using testing::RunOracle;
using testing::SameBits;
using testing::TempDir;

void ExpectError(const Status& s, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.ToString());
  for (const std::string& n : needles) CHECK(s.message().find(n) != std::string::npos);
}

nlohmann::json Manifest(const TempDir& dir) {
  return nlohmann::json::parse(testing::ReadAll(dir.File("manifest.json")));
}

}  // namespace

TEST_CASE("GGUF files written by the gguf package read back: metadata of every type", "[formats][gguf]") {
  TempDir dir;
  RunOracle("gguf_oracle.py", {"fixtures", dir.path()});
  Result<GgufReader> r = GgufReader::Open(dir.File("mixed.gguf"));
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->version() == 3);
  CHECK(r->alignment() == 32);
  CHECK(*r->GetString("general.architecture") == "llama");
  CHECK(*r->GetUInt("t.u8") == 200);
  CHECK(*r->GetInt("t.i8") == -100);
  CHECK(*r->GetUInt("t.u16") == 60000);
  CHECK(*r->GetInt("t.i16") == -30000);
  CHECK(*r->GetUInt("t.u32") == 4000000000u);
  CHECK(*r->GetInt("t.i32") == -2000000000);
  CHECK(*r->GetFloat("t.f32") == static_cast<double>(0.1f));
  CHECK(r->Get("t.f32")->type == GgufValueType::kF32);
  CHECK(*r->GetBool("t.bool") == true);
  CHECK(*r->GetString("t.str") == "h\u00e9llo w\u00f6rld");
  CHECK(*r->GetUInt("t.u64") == (1ull << 40) + 3);
  CHECK(*r->GetInt("t.i64") == -(1ll << 40) - 5);
  CHECK(*r->GetFloat("t.f64") == 3.141592653589793);
  CHECK(*r->GetStringArray("t.arr_str") == std::vector<std::string>{"a", "", "\u0120the", "<|im_start|>"});
  CHECK(*r->GetIntArray("t.arr_int") == std::vector<int64_t>{1, -2, 3});
  CHECK(*r->GetFloatArray("t.arr_f32") == std::vector<double>{0.5, -1.25});
  CHECK(*r->GetIntArray("t.arr_bool") == std::vector<int64_t>{1, 0, 1});
  const GgufValue* nested = r->Get("t.arr_nested");
  REQUIRE(nested != nullptr);
  REQUIRE(nested->arrays.size() == 2);
  CHECK(nested->arrays[0].ints == std::vector<int64_t>{1, 2});
  CHECK(nested->arrays[1].ints == std::vector<int64_t>{3});
  CHECK(*r->GetUInt("llama.block_count") == 2);

  // Typed getters name the file, key and both types.
  ExpectError(r->GetString("t.u32").status(), {dir.File("mixed.gguf"), "t.u32", "UINT32", "STRING"});
  ExpectError(r->GetUInt("t.i8").status(), {"t.i8", "non-negative"});
  ExpectError(r->GetStringArray("t.arr_int").status(), {"t.arr_int", "ARRAY of INT32"});
  ExpectError(r->GetUInt("no.such.key").status(), {"no.such.key", dir.File("mixed.gguf")});
}

TEST_CASE("GGUF tensors dequantize exactly as gguf.quants.dequantize (F32 F16 BF16 Q8_0 Q4_0 Q4_1)",
          "[formats][gguf]") {
  TempDir dir;
  RunOracle("gguf_oracle.py", {"fixtures", dir.path()});
  const nlohmann::json m = Manifest(dir);
  for (const char* file : {"mixed", "align64"}) {
    Result<GgufReader> r = GgufReader::Open(dir.File(std::string(file) + ".gguf"));
    INFO(file << ": " << r.status().ToString());
    REQUIRE(r.ok());
    REQUIRE(r->tensors().size() == m[file].size());
    if (std::string(file) == "align64") CHECK(r->alignment() == 64);
    for (const auto& [name, spec] : m[file].items()) {
      INFO("tensor " << name);
      const GgufTensorInfo* t = r->Find(name);
      REQUIRE(t != nullptr);
      CHECK(t->shape == spec["shape"].get<std::vector<int64_t>>());
      CHECK(t->type == spec["type"].get<uint32_t>());
      CHECK(t->offset % r->alignment() == 0);
      Result<std::vector<float>> got = r->ReadF32(name);
      REQUIRE(got.ok());
      CHECK(SameBits(*got, ReadF32File(dir.File(name + ".f32"))));
    }
  }
}

TEST_CASE("UnpermuteLlamaRows undoes llama.cpp's q/k permutation - PermuteLlamaRows redoes it", "[formats][gguf]") {
  TempDir dir;
  RunOracle("gguf_oracle.py", {"fixtures", dir.path()});
  const nlohmann::json p = Manifest(dir)["perm"];
  const int64_t n_head = p["n_head"], n_kv = p["n_kv"], hd = p["head_dim"], hid = p["hidden"];
  Result<GgufReader> r = GgufReader::Open(dir.File("perm.gguf"));
  REQUIRE(r.ok());
  struct Case {
    const char* name;
    const char* hf_file;
    int64_t heads, cols;
  };
  for (const Case& c : {Case{"blk.0.attn_q.weight", "hf.q.f32", n_head, hid}, Case{"blk.0.attn_k.weight", "hf.k.f32", n_kv, hid},
                        Case{"blk.0.attn_q.bias", "hf.qb.f32", n_head, 1}}) {
    INFO(c.name);
    std::vector<float> stored = *r->ReadF32(c.name), hf(stored.size()), again(stored.size());
    const int64_t rows = c.heads * hd;
    REQUIRE(UnpermuteLlamaRows(stored.data(), hf.data(), rows, c.cols, c.heads).ok());
    CHECK(SameBits(hf, ReadF32File(dir.File(c.hf_file))));
    CHECK_FALSE(SameBits(hf, stored));
    REQUIRE(PermuteLlamaRows(hf.data(), again.data(), rows, c.cols, c.heads).ok());
    CHECK(SameBits(again, stored));
  }
  std::vector<float> a(6 * 4), b(a.size());
  ExpectError(UnpermuteLlamaRows(a.data(), b.data(), 6, 4, 4), {"n_head=4"});
  ExpectError(UnpermuteLlamaRows(a.data(), b.data(), 6, 4, 2), {"even head_dim"});
}

TEST_CASE("Malformed GGUF files fail with an error naming the file and the tensor", "[formats][gguf]") {
  TempDir dir;
  RunOracle("gguf_oracle.py", {"fixtures", dir.path()});
  struct Case {
    const char* file;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"bad_magic", {"bad magic", "GGUF"}},
      {"version2", {"version 2", "only version 3"}},
      {"unknown_type", {"tensor 'w.unknown'", "unknown ggml tensor type 99"}},
      {"offset_out", {"tensor 'w.far'", "runs past the end", "offset 4096"}},
      {"misaligned", {"tensor 'w.mis'", "not a multiple of the alignment 32"}},
      {"bad_row", {"tensor 'w.row33'", "not a multiple of the Q8_0 block size 32"}},
      {"dup_tensor", {"tensor 'w.dup'", "twice"}},
      {"bad_kv_type", {"metadata 'k.bad'", "unknown value type 13"}},
      {"huge_string", {"metadata 'k.str'", "runs past the end"}},
      {"bad_alignment", {"general.alignment", "24", "power of two"}},
      {"truncated_data", {"tensor 'w.ok'", "runs past the end", "truncated"}},
      {"truncated_header", {"truncated", "tensor"}},
      {"bad_row_k", {"tensor 'w.row96'", "not a multiple of the Q4_K block size 256"}},
  };
  for (const Case& c : cases) {
    const std::string path = dir.File(std::string(c.file) + ".gguf");
    INFO(c.file);
    Result<GgufReader> r = GgufReader::Open(path);
    std::vector<std::string> needles = c.needles;
    needles.push_back(path);
    REQUIRE_FALSE(r.ok());
    INFO("message: " << r.status().ToString());
    for (const std::string& n : needles) CHECK(r.status().message().find(n) != std::string::npos);
  }
  ExpectError(GgufReader::Open(dir.File("missing.gguf")).status(), {dir.File("missing.gguf")});

  // Reading: a destination of the wrong size, an unknown name, a type we do not convert.
  Result<GgufReader> r = GgufReader::Open(dir.File("mixed.gguf"));
  REQUIRE(r.ok());
  std::vector<float> small(10);
  ExpectError(r->ReadF32("q8_0.w", small.data(), small.size()), {dir.File("mixed.gguf"), "q8_0.w", "512", "10"});
  ExpectError(r->ReadF32("nope").status(), {dir.File("mixed.gguf"), "nope"});
  // (Q6_K was the unconvertible example here until K-quants were read; IQ2_XXS is now.)
  std::vector<uint8_t> iq2(66);
  std::vector<float> big(256);
  ExpectError(DequantizeToF32(static_cast<uint32_t>(GgmlType::kIQ2_XXS), iq2.data(), big.data(), 256), {"IQ2_XXS"});
  // The checked form compares the bytes with the type's block size.
  std::vector<uint8_t> q6(210 * 2 - 1);
  ExpectError(DequantizeToF32(static_cast<uint32_t>(GgmlType::kQ6_K), std::span<const uint8_t>(q6), big.data(), 256),
              {"Q6_K", "256 elements take 210 bytes", "holds 419"});
  ExpectError(DequantizeToF32(static_cast<uint32_t>(GgmlType::kQ4_K), std::span<const uint8_t>(q6), big.data(), 255),
              {"Q4_K", "not whole"});
  // Types the reader lists but does not convert: the file opens, reading names type and tensor.
  Result<GgufReader> u = GgufReader::Open(dir.File("unreadable.gguf"));
  INFO(u.status().ToString());
  REQUIRE(u.ok());
  ExpectError(u->ReadF32("w.iq2").status(), {dir.File("unreadable.gguf"), "tensor 'w.iq2'", "IQ2_XXS", "Q6_K"});
  ExpectError(u->ReadF32("w.i32").status(), {dir.File("unreadable.gguf"), "tensor 'w.i32'", "I32"});
}

TEST_CASE("GGUF K-quant, Q5_0 and Q5_1 tensors dequantize exactly as gguf.quants (random blocks, edge scales)",
          "[formats][gguf]") {
  // Random bytes in every field; fp16 scales ordinary, negative, subnormal, +-0 and the
  // largest finite; all-zero blocks. Expected: gguf.quants.dequantize (Q8_K: the oracle's
  // own reference from llama.cpp's definition, gguf 0.10.0 has none).
  TempDir dir;
  RunOracle("gguf_oracle.py", {"fixtures", dir.path()});
  const nlohmann::json m = Manifest(dir)["kquant"];
  REQUIRE(m.size() == 8);
  Result<GgufReader> r = GgufReader::Open(dir.File("kquant.gguf"));
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  for (const auto& [name, spec] : m.items()) {
    INFO("tensor " << name);
    const GgufTensorInfo* t = r->Find(name);
    REQUIRE(t != nullptr);
    CHECK(t->shape == spec["shape"].get<std::vector<int64_t>>());
    CHECK(t->type == spec["type"].get<uint32_t>());
    Result<std::vector<float>> got = r->ReadF32(name);
    INFO(got.status().ToString());
    REQUIRE(got.ok());
    const std::vector<float> want = ReadF32File(dir.File(name + ".f32"));
    REQUIRE(got->size() == want.size());
    size_t first_diff = got->size();
    for (size_t i = 0; i < got->size() && first_diff == got->size(); ++i) {
      if (std::memcmp(&(*got)[i], &want[i], 4) != 0) first_diff = i;
    }
    INFO("first difference at element " << first_diff);
    CHECK(first_diff == got->size());
    // The all-zero first block decodes to +0 everywhere (a non-vacuous fixture).
    const size_t block = GgmlTraits(t->type)->block_size;
    for (size_t i = 0; i < block; ++i) CHECK(std::memcmp(&(*got)[i], &want[i], 4) == 0);
  }
}

TEST_CASE("GGUF files l2l writes are read by gguf.GGUFReader with gguf's own quantized bytes", "[formats][gguf]") {
  TempDir dir;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct T {
    std::string name;
    std::vector<int64_t> shape;
    GgmlType type;
    std::vector<float> v;
  };
  std::vector<T> ts = {{"tok.f32", {5, 64}, GgmlType::kF32, {}},   {"w.bf16", {3, 40}, GgmlType::kBF16, {}},
                       {"w.f16", {7, 33}, GgmlType::kF16, {}},     {"w.q8", {6, 96}, GgmlType::kQ8_0, {}},
                       {"w3.q8", {2, 2, 32}, GgmlType::kQ8_0, {}}, {"norm", {64}, GgmlType::kF32, {}}};
  for (T& t : ts) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    t.v.resize(n);
    for (float& x : t.v) x = nd(rng) * 3.0f;
  }
  // Quantizer edge cases: an all-zero block, equal values, and exact ties at .5 steps.
  for (int j = 0; j < 32; ++j) ts[3].v[j] = 0.0f;
  for (int j = 32; j < 64; ++j) ts[3].v[j] = 2.5f;
  for (int j = 64; j < 96; ++j) ts[3].v[j] = static_cast<float>(j - 80) * 0.5f;  // d = 1: x.5 are ties
  ts[3].v[95] = 127.0f;

  for (uint32_t alignment : {32u, 64u}) {
    INFO("alignment " << alignment);
    GgufWriter w(alignment);
    w.Set("general.architecture", GgufValue::String("llama"));
    w.Set("llama.block_count", GgufValue::U32(3));
    w.Set("t.i32", GgufValue::I32(-7));
    w.Set("t.u64", GgufValue::U64(1ull << 35));
    w.Set("t.f32", GgufValue::F32(0.25f));
    w.Set("t.bool", GgufValue::Bool(true));
    w.Set("tokenizer.ggml.tokens", GgufValue::StringArray({"<s>", "\u0120hello", "\u00e9"}));
    w.Set("t.ints", GgufValue::IntArray(GgufValueType::kI32, {3, -1, 9}));
    w.Set("t.floats", GgufValue::FloatArray(GgufValueType::kF32, {0.5, -2.0}));
    w.Set("llama.block_count", GgufValue::U32(4));  // replaces the first value
    nlohmann::json spec;
    spec["path"] = dir.File("ours.gguf");
    spec["alignment"] = alignment;
    spec["metadata"] = {{"general.architecture", "llama"}, {"llama.block_count", 4}, {"t.i32", -7},
                        {"t.u64", 1ull << 35}, {"t.f32", 0.25}, {"t.bool", true},
                        {"tokenizer.ggml.tokens", {"<s>", "\u0120hello", "\u00e9"}},
                        {"t.ints", {3, -1, 9}}, {"t.floats", {0.5, -2.0}}};
    spec["types"] = {{"general.architecture", {8}}, {"llama.block_count", {4}}, {"t.i32", {5}}, {"t.u64", {10}},
                     {"t.f32", {6}}, {"t.bool", {7}}, {"tokenizer.ggml.tokens", {9, 8}}, {"t.ints", {9, 5}},
                     {"t.floats", {9, 6}}};
    if (alignment != 32) {
      spec["metadata"]["general.alignment"] = alignment;
      spec["types"]["general.alignment"] = {4};
    }
    spec["tensors"] = nlohmann::json::array();
    for (const T& t : ts) {
      const std::string src = dir.File(t.name + ".src.f32");
      testing::WriteF32File(src, t.v);
      spec["tensors"].push_back({{"name", t.name}, {"shape", t.shape}, {"type", static_cast<uint32_t>(t.type)},
                                 {"source", src}});
      if (t.name == "norm") {
        const float* p = t.v.data();
        REQUIRE(w.AddTensor({t.name, t.shape, t.type, nullptr, [p]() -> Result<const float*> { return p; }}).ok());
      } else {
        REQUIRE(w.AddTensor({t.name, t.shape, t.type, t.v.data(), nullptr}).ok());
      }
    }
    REQUIRE(w.Write(dir.File("ours.gguf")).ok());
    testing::WriteFileForTest(dir.File("spec.json"), spec.dump());
    RunOracle("gguf_oracle.py", {"check_written", dir.File("spec.json")});

    // Our reader agrees with our writer: Q8_0 within half a quantization step per block.
    Result<GgufReader> r = GgufReader::Open(dir.File("ours.gguf"));
    REQUIRE(r.ok());
    CHECK(r->alignment() == alignment);
    std::vector<float> q = *r->ReadF32("w.q8");
    for (size_t b = 0; b < q.size() / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(ts[3].v[b * 32 + j]));
      for (int j = 0; j < 32; ++j) CHECK(std::fabs(q[b * 32 + j] - ts[3].v[b * 32 + j]) <= amax / 127 * 0.51f + 1e-6f);
    }
    CHECK(SameBits(*r->ReadF32("tok.f32"), ts[0].v));
  }

  GgufWriter w;
  std::vector<float> x(33);
  ExpectError(w.AddTensor({"odd.q8", {33}, GgmlType::kQ8_0, x.data(), nullptr}), {"odd.q8", "multiple of 32"});
  ExpectError(w.AddTensor({"q4", {32}, GgmlType::kQ4_0, x.data(), nullptr}), {"q4", "Q4_0"});
  REQUIRE(w.AddTensor({"a", {32}, GgmlType::kF32, x.data(), nullptr}).ok());
  ExpectError(w.AddTensor({"a", {32}, GgmlType::kF32, x.data(), nullptr}), {"'a'", "twice"});
}

// Relative RMS error (rms(decoded - x) / rms(x)) bounds of the export quantizers on
// Gaussian weights, checked by the oracle on gguf's decoding of our bytes. Measured
// 2026-11-27 (N(0, 0.02) 64x1024 / N(0, 1) 16x512): Q4_K 0.0719 / 0.0712, Q6_K 0.0179 /
// 0.0181, Q5_0 0.0427, Q8_0 0.00535; the bounds sit 10-15% above.
constexpr double kMaxRelRmsQ4_K = 0.08, kMaxRelRmsQ6_K = 0.0205, kMaxRelRmsQ5_0 = 0.048, kMaxRelRmsQ8_0 = 0.006;

TEST_CASE("GGUF Q4_K / Q6_K / Q5_0 tensors l2l writes: gguf decodes them as l2l does, within the error bounds",
          "[formats][gguf]") {
  TempDir dir;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct T {
    std::string name;
    std::vector<int64_t> shape;
    GgmlType type;
    float sigma;     // Gaussian weights of this standard deviation; 0: edge-case blocks
    double bound;    // relative RMS error bound (Gaussian only)
    std::vector<float> v;
  };
  std::vector<T> ts = {{"g.q4k", {64, 1024}, GgmlType::kQ4_K, 0.02f, kMaxRelRmsQ4_K, {}},
                       {"g1.q4k", {16, 512}, GgmlType::kQ4_K, 1.0f, kMaxRelRmsQ4_K, {}},
                       {"g.q6k", {64, 1024}, GgmlType::kQ6_K, 0.02f, kMaxRelRmsQ6_K, {}},
                       {"g1.q6k", {16, 512}, GgmlType::kQ6_K, 1.0f, kMaxRelRmsQ6_K, {}},
                       {"g.q50", {64, 1024}, GgmlType::kQ5_0, 0.02f, kMaxRelRmsQ5_0, {}},
                       {"g.q80", {64, 1024}, GgmlType::kQ8_0, 0.02f, kMaxRelRmsQ8_0, {}},
                       {"e.q4k", {6, 256}, GgmlType::kQ4_K, 0.0f, 0, {}},
                       {"e.q6k", {6, 256}, GgmlType::kQ6_K, 0.0f, 0, {}},
                       {"e.q50", {6, 32}, GgmlType::kQ5_0, 0.0f, 0, {}}};
  for (T& t : ts) {
    const size_t n = static_cast<size_t>(t.shape[0] * t.shape[1]);
    t.v.resize(n);
    if (t.sigma > 0) {
      for (float& x : t.v) x = nd(rng) * t.sigma;
      continue;
    }
    // Rows (one block each): all zero; all equal; all equal and negative; one outlier in
    // small noise; tiny values (fp16-subnormal scales); alternating +-1.
    const size_t c = static_cast<size_t>(t.shape[1]);
    for (size_t i = 0; i < c; ++i) {
      t.v[i] = 0.0f;
      t.v[c + i] = 0.75f;
      t.v[2 * c + i] = -3.0f;
      t.v[3 * c + i] = (i == 7 ? 50.0f : 0.01f * nd(rng));
      t.v[4 * c + i] = 1e-7f * nd(rng);
      t.v[5 * c + i] = (i % 2 ? 1.0f : -1.0f);
    }
  }
  GgufWriter w;
  w.Set("general.architecture", GgufValue::String("llama"));
  for (const T& t : ts) REQUIRE(w.AddTensor({t.name, t.shape, t.type, t.v.data(), nullptr}).ok());
  REQUIRE(w.Write(dir.File("k.gguf")).ok());

  Result<GgufReader> r = GgufReader::Open(dir.File("k.gguf"));
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  nlohmann::json spec;
  spec["path"] = dir.File("k.gguf");
  spec["alignment"] = 32;
  spec["metadata"] = {{"general.architecture", "llama"}};
  spec["types"] = {{"general.architecture", {8}}};
  spec["tensors"] = nlohmann::json::array();
  for (const T& t : ts) {
    INFO(t.name);
    const std::string src = dir.File(t.name + ".src.f32"), ours = dir.File(t.name + ".l2l.f32");
    testing::WriteF32File(src, t.v);
    Result<std::vector<float>> got = r->ReadF32(t.name);
    REQUIRE(got.ok());
    testing::WriteF32File(ours, *got);
    nlohmann::json e = {{"name", t.name}, {"shape", t.shape}, {"type", static_cast<uint32_t>(t.type)},
                        {"source", src}, {"l2l_f32", ours}};
    if (t.sigma > 0) e["max_rel_rms"] = t.bound;
    spec["tensors"].push_back(e);
    if (t.sigma == 0) {
      // Edge rows: zeros stay exact zeros; constant rows come back within 1%; the
      // outlier row keeps its outlier within 2% and stays finite everywhere.
      const size_t c = static_cast<size_t>(t.shape[1]);
      for (size_t i = 0; i < c; ++i) {
        CHECK((*got)[i] == 0.0f);
        CHECK(std::fabs((*got)[c + i] - 0.75f) <= 0.0075f);
        CHECK(std::fabs((*got)[2 * c + i] + 3.0f) <= 0.03f);
        CHECK(std::isfinite((*got)[3 * c + i]));
        CHECK(std::fabs((*got)[4 * c + i]) < 1e-5f);
        // Q5_0's levels are -16..15 steps of max/-16: the sign opposite to the first
        // largest element tops out one step short (+-1 -> 0.9375), as in ggml.
        CHECK(std::fabs(std::fabs((*got)[5 * c + i]) - 1.0f) <= (t.type == GgmlType::kQ5_0 ? 0.0625f : 0.01f));
      }
      CHECK(std::fabs((*got)[3 * c + 7] - 50.0f) <= 1.0f);
    }
  }
  testing::WriteFileForTest(dir.File("spec.json"), spec.dump());
  const std::string out = RunOracle("gguf_oracle.py", {"check_written", dir.File("spec.json")});
  UNSCOPED_INFO(out);
  CHECK(out.find("g.q4k: Q4_K relative RMS error") != std::string::npos);  // the bounds were checked

  GgufWriter bad;
  std::vector<float> x(512);
  ExpectError(bad.AddTensor({"odd.q4k", {2, 160}, GgmlType::kQ4_K, x.data(), nullptr}),
              {"odd.q4k", "Q4_K", "multiple of 256", "160"});
  ExpectError(bad.AddTensor({"odd.q6k", {320}, GgmlType::kQ6_K, x.data(), nullptr}), {"Q6_K", "multiple of 256"});
  ExpectError(bad.AddTensor({"odd.q50", {40}, GgmlType::kQ5_0, x.data(), nullptr}), {"Q5_0", "multiple of 32"});
  ExpectError(bad.AddTensor({"q5k", {256}, GgmlType::kQ5_K, x.data(), nullptr}), {"q5k", "Q5_K", "supported"});
}

}  // namespace l2l::formats

namespace l2l::formats {
namespace {

// Appends v little-endian.
template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

TEST_CASE("A GGUF tensor whose element count or byte size overflows 64 bits is refused",
          "[formats][gguf]") {
  // ne = [2^62, 3] F32: 2^62 * 4 bytes wraps to 0 (an empty tensor that passes the bounds
  // check) and the element count 3 * 2^62 does not fit int64. (A fuzzing regression input.)
  TempDir dir;
  for (const std::vector<uint64_t>& ne : {std::vector<uint64_t>{uint64_t{1} << 62, 3},
                                          std::vector<uint64_t>{uint64_t{1} << 62},
                                          std::vector<uint64_t>{32, uint64_t{1} << 40, uint64_t{1} << 40}}) {
    std::string b = "GGUF";
    Put<uint32_t>(&b, 3);  // version
    Put<uint64_t>(&b, 1);  // tensors
    Put<uint64_t>(&b, 0);  // metadata
    Put<uint64_t>(&b, 5);
    b += "w.big";
    Put<uint32_t>(&b, static_cast<uint32_t>(ne.size()));
    for (uint64_t x : ne) Put<uint64_t>(&b, x);
    Put<uint32_t>(&b, 0);  // F32
    Put<uint64_t>(&b, 0);  // offset
    b.resize((b.size() + 31) / 32 * 32, '\0');
    const std::string path = dir.File("overflow.gguf");
    std::ofstream(path, std::ios::binary) << b;
    Result<GgufReader> r = GgufReader::Open(path);
    REQUIRE_FALSE(r.ok());
    INFO("message: " << r.status().ToString());
    for (const char* n : {"tensor 'w.big'", "overflows 64 bits"}) CHECK(r.status().message().find(n) != std::string::npos);
    CHECK(r.status().message().find(path) != std::string::npos);
  }
}

// A GGUF file with only metadata: each entry is (key, type, value bytes).
std::string MetadataOnlyGguf(const std::vector<std::pair<std::string, std::string>>& kvs) {
  std::string b = "GGUF";
  Put<uint32_t>(&b, 3);  // version
  Put<uint64_t>(&b, 0);  // tensors
  Put<uint64_t>(&b, kvs.size());
  for (const auto& [key, typed_value] : kvs) {
    Put<uint64_t>(&b, key.size());
    b += key;
    b += typed_value;
  }
  return b;
}

// The typed value of an array of n elements of `elem`, each `elem_bytes`.
std::string ArrayValue(GgufValueType elem, uint64_t n, const std::string& elem_bytes) {
  std::string v;
  Put<uint32_t>(&v, static_cast<uint32_t>(GgufValueType::kArray));
  Put<uint32_t>(&v, static_cast<uint32_t>(elem));
  Put<uint64_t>(&v, n);
  for (uint64_t i = 0; i < n; ++i) v += elem_bytes;
  return v;
}

TEST_CASE("GGUF metadata arrays are bounded by their in-memory size: per file byte and per file",
          "[formats][gguf]") {
  testing::ScopedEnv unset("L2L_MAX_FILE_BYTES", "");
  TempDir dir;
  auto open = [&](const std::string& name, const std::string& bytes) {
    const std::string path = dir.File(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return GgufReader::Open(path);
  };
  // 4000 empty arrays: 12 bytes each in the file, a GgufValue (> 100 bytes) each in memory,
  // more than 8x the file. Before, the reader built them all.
  std::string empty_u8;
  Put<uint32_t>(&empty_u8, static_cast<uint32_t>(GgufValueType::kU8));
  Put<uint64_t>(&empty_u8, 0);
  const Result<GgufReader> nested =
      open("nested.gguf", MetadataOnlyGguf({{"x.nested", ArrayValue(GgufValueType::kArray, 4000, empty_u8)}}));
  REQUIRE_FALSE(nested.ok());
  INFO(nested.status().ToString());
  CHECK(nested.status().code() == StatusCode::kDataLoss);
  for (const char* part : {"metadata 'x.nested'", "array of 4000 ARRAY", "bytes in memory", "8x"}) {
    CHECK(nested.status().message().find(part) != std::string::npos);
  }
  // Real metadata arrays stay well inside: strings (4x), i32 (2x), u8 (8x) read.
  std::string str3;
  Put<uint64_t>(&str3, 3);
  str3 += "abc";
  std::string i32;
  Put<int32_t>(&i32, 7);
  const std::string ok_file = MetadataOnlyGguf({{"t.tokens", ArrayValue(GgufValueType::kString, 3000, str3)},
                                                {"t.types", ArrayValue(GgufValueType::kI32, 3000, i32)},
                                                {"t.flags", ArrayValue(GgufValueType::kU8, 3000, std::string(1, '\1'))}});
  {
    const Result<GgufReader> ok = open("ok.gguf", ok_file);
    INFO((ok.ok() ? std::string() : ok.status().ToString()));
    REQUIRE(ok.ok());
    CHECK(ok->GetStringArray("t.tokens")->size() == 3000);
    CHECK(ok->GetIntArray("t.flags")->at(2999) == 1);
  }
  // The same file under a cap on one file's metadata that holds the strings
  // (3000 * sizeof(std::string) bytes) but not the int32s (3000 * 8 more) as well.
  {
    const std::string strings = std::to_string(3000 * sizeof(std::string));
    const std::string limit = std::to_string(3000 * sizeof(std::string) + 4000);
    testing::ScopedEnv cap("L2L_MAX_FILE_BYTES", limit);
    const Result<GgufReader> capped = open("ok.gguf", ok_file);
    REQUIRE_FALSE(capped.ok());
    INFO(capped.status().ToString());
    for (const std::string& part : {std::string("metadata 't.types'"), "with the " + strings + " bytes of the arrays before it",
                                    limit + "-byte limit", std::string("L2L_MAX_FILE_BYTES")}) {
      CHECK(capped.status().message().find(part) != std::string::npos);
    }
  }
}

TEST_CASE("The Q4_K_M mix gives each tensor llama.cpp's type (llama-quant.cpp, Q4_K_M, no imatrix)",
          "[formats][gguf]") {
  // 8 layers: use_more_bits picks 0 and 7 (first / last eighth) and 3, 6 ((i - 1) % 3 == 2).
  std::vector<int64_t> more;
  for (int64_t i = 0; i < 8; ++i) {
    if (UseMoreBits(i, 8)) more.push_back(i);
  }
  CHECK(more == std::vector<int64_t>{0, 3, 6, 7});
  // 30 layers (SmolLM2-135M): 0-2, 26-29 and 5, 8, ..., 23: 14 layers.
  int n30 = 0;
  for (int64_t i = 0; i < 30; ++i) n30 += UseMoreBits(i, 30) ? 1 : 0;
  CHECK(n30 == 14);
  struct Case {
    const char* name;
    std::vector<int64_t> shape;
    bool has_output;
    GgmlType want;
  };
  const std::vector<Case> cases = {
      {"output.weight", {1000, 512}, true, GgmlType::kQ6_K},
      {"output.weight", {1000, 576}, true, GgmlType::kQ8_0},      // rows not whole super-blocks
      {"token_embd.weight", {1000, 512}, true, GgmlType::kQ4_K},  // untied: an ordinary weight
      {"token_embd.weight", {1000, 512}, false, GgmlType::kQ6_K}, // tied: it is the output
      {"token_embd.weight", {1000, 576}, false, GgmlType::kQ8_0},
      {"blk.3.attn_v.weight", {128, 512}, true, GgmlType::kQ6_K},
      {"blk.2.attn_v.weight", {128, 512}, true, GgmlType::kQ4_K},
      {"blk.7.ffn_down.weight", {512, 1024}, true, GgmlType::kQ6_K},
      {"blk.6.ffn_down.weight", {512, 576}, true, GgmlType::kQ8_0},  // Q6_K's fallback
      {"blk.1.ffn_down.weight", {512, 576}, true, GgmlType::kQ5_0},  // Q4_K's fallback
      {"blk.0.attn_q.weight", {512, 512}, true, GgmlType::kQ4_K},    // only attn_v / ffn_down get more
      {"blk.0.ffn_up.weight", {64, 96}, true, GgmlType::kQ5_0},
      {"blk.0.ffn_up.weight", {64, 40}, true, GgmlType::kF16},       // not even whole 32-blocks
      {"blk.0.attn_norm.weight", {512}, true, GgmlType::kF32},
      {"blk.0.attn_q.bias", {512}, true, GgmlType::kF32},
  };
  for (const Case& c : cases) {
    INFO(c.name << " row " << c.shape.back() << " has_output " << c.has_output);
    CHECK(GgmlTypeName(Q4KMTensorType(c.name, c.shape, 8, c.has_output)) == std::string(GgmlTypeName(c.want)));
  }
}

TEST_CASE("An empty GGUF tensor dequantizes to nothing (null buffers, every readable type)", "[formats][gguf]") {
  // A tensor with a zero dimension has no bytes: its buffers may be null (a fuzzing
  // regression input: memcpy from null was undefined behaviour).
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0,
                     GgmlType::kQ5_1, GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K,
                     GgmlType::kQ8_K}) {
    INFO(GgmlTypeName(t));
    CHECK(DequantizeToF32(static_cast<uint32_t>(t), nullptr, nullptr, 0).ok());
  }
}

}  // namespace
}  // namespace l2l::formats
