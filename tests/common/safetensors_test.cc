// Tests for common/formats/safetensors.h: round trips in every dtype (values checked against the
// scalar conversions of common/dtype.h, themselves tested exhaustively), the exact byte
// layout of a small file built by hand from the format description, and rejection of
// each kind of corrupt file with a message naming the path and the tensor.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/formats/safetensors.h"
#include "tests/common/temp_dir.h"

namespace l2l {
namespace {

using testing::TempDir;

// A safetensors file from a header string and raw data, built by hand.
std::string HandMade(const std::string& header, const std::string& data, int64_t header_len = -1) {
  const uint64_t n = header_len >= 0 ? static_cast<uint64_t>(header_len) : header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

void ExpectError(const Status& s, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.ToString());
  for (const std::string& n : needles) CHECK(s.message().find(n) != std::string::npos);
}

}  // namespace

TEST_CASE("Tensors of every dtype survive write -> read, with metadata", "[safetensors]") {
  TempDir dir;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> a(3 * 5), b(7), c(2 * 3 * 4);
  for (auto* v : {&a, &b, &c}) {
    for (float& x : *v) x = nd(rng);
  }
  std::vector<uint16_t> raw_bf16(4);
  for (size_t i = 0; i < raw_bf16.size(); ++i) raw_bf16[i] = FloatToBf16(static_cast<float>(i) - 1.5f);
  const std::vector<TensorToWrite> tensors = {
      {"a.f32", {3, 5}, DType::kF32, a.data(), nullptr},
      {"b.bf16", {7}, DType::kBF16, b.data(), nullptr},
      {"c.f16", {2, 3, 4}, DType::kF16, c.data(), nullptr},
      {"d.raw", {2, 2}, DType::kBF16, nullptr, raw_bf16.data()},
      {"e.empty", {0, 4}, DType::kF32, a.data(), nullptr},
  };
  const std::string path = dir.File("x.safetensors");
  REQUIRE(WriteSafeTensors(path, tensors, {{"format", "pt"}, {"note", "h\u00e9llo \"q\""}}).ok());

  Result<SafeTensorsReader> r = SafeTensorsReader::Open(path);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(r->tensors().size() == 5);
  CHECK(r->metadata().at("format") == "pt");
  CHECK(r->metadata().at("note") == "h\u00e9llo \"q\"");
  const SafeTensorInfo* ci = r->Find("c.f16");
  REQUIRE(ci != nullptr);
  CHECK(ci->dtype_name == "F16");
  CHECK(ci->shape == std::vector<int64_t>{2, 3, 4});
  CHECK(ci->nbytes == 48);

  CHECK(*r->ReadAsFloat("a.f32") == a);
  const std::vector<float> bb = *r->ReadAsFloat("b.bf16");
  for (size_t i = 0; i < b.size(); ++i) CHECK(bb[i] == Bf16ToFloat(FloatToBf16(b[i])));
  const std::vector<float> cc = *r->ReadAsFloat("c.f16");
  for (size_t i = 0; i < c.size(); ++i) CHECK(cc[i] == Fp16ToFloat(FloatToFp16(c[i])));
  CHECK(*r->ReadAsFloat("d.raw") == std::vector<float>{-1.5f, -0.5f, 0.5f, 1.5f});
  CHECK(r->ReadAsFloat("e.empty")->empty());
  // The data section starts 8-byte aligned.
  uint64_t n;
  std::memcpy(&n, testing::ReadAll(path).data(), 8);
  CHECK(n % 8 == 0);

  std::vector<float> wrong(3);
  ExpectError(r->ReadAsFloat("a.f32", wrong.data(), wrong.size()), {"a.f32", "15 elements"});
  ExpectError(r->ReadAsFloat("nope").status(), {path, "no tensor 'nope'"});
}

TEST_CASE("A hand-built safetensors file reads as the format describes", "[safetensors]") {
  TempDir dir;
  const float vals[3] = {1.0f, -2.0f, 0.25f};
  const uint16_t half = 0x3c00;  // 1.0 in F16
  std::string data(reinterpret_cast<const char*>(vals), 12);
  data.append(reinterpret_cast<const char*>(&half), 2);
  const std::string p = dir.Write(
      "h.safetensors",
      HandMade(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"s":{"dtype":"F16","shape":[],"data_offsets":[12,14]}})",
               data));
  Result<SafeTensorsReader> r = SafeTensorsReader::Open(p);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(*r->ReadAsFloat("w") == std::vector<float>{1.0f, -2.0f, 0.25f});
  CHECK(*r->ReadAsFloat("s") == std::vector<float>{1.0f});  // a scalar: shape []
}

TEST_CASE("A header length beyond the file is rejected", "[safetensors][errors]") {
  TempDir dir;
  const std::string p = dir.Write("len.safetensors", HandMade("{}", "", 1000));
  ExpectError(SafeTensorsReader::Open(p).status(), {p, "header length 1000"});
  const std::string q = dir.Write("tiny.safetensors", "abc");
  ExpectError(SafeTensorsReader::Open(q).status(), {q, "3 bytes"});
}

TEST_CASE("A header that is not JSON, or not the expected JSON, is rejected", "[safetensors][errors]") {
  TempDir dir;
  const std::string p = dir.Write("json.safetensors", HandMade(R"({"w":{"dtype":"F32",)", ""));
  ExpectError(SafeTensorsReader::Open(p).status(), {p, "not valid JSON"});
  const std::string q = dir.Write("arr.safetensors", HandMade("[1,2]", ""));
  ExpectError(SafeTensorsReader::Open(q).status(), {q, "not a JSON object"});
  const std::string s = dir.Write("shape.safetensors", HandMade(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"));
  ExpectError(SafeTensorsReader::Open(s).status(), {s, "tensor 'w'", "shape"});
  const std::string m = dir.Write("meta.safetensors", HandMade(R"({"__metadata__":{"a":1}})", ""));
  ExpectError(SafeTensorsReader::Open(m).status(), {m, "__metadata__"});
}

TEST_CASE("Out-of-bounds, overlapping, gapped or mis-sized offsets are rejected naming the tensor",
          "[safetensors][errors]") {
  TempDir dir;
  const std::string d8(8, 'x');
  const std::string oob = dir.Write(
      "oob.safetensors", HandMade(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", d8));
  ExpectError(SafeTensorsReader::Open(oob).status(), {oob, "tensor 'w'", "past the 8-byte data section"});
  const std::string overlap = dir.Write(
      "overlap.safetensors", HandMade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                      d8));
  ExpectError(SafeTensorsReader::Open(overlap).status(), {overlap, "overlaps", "'a'", "'b'"});
  const std::string size = dir.Write(
      "size.safetensors", HandMade(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8));
  ExpectError(SafeTensorsReader::Open(size).status(), {size, "tensor 'w'", "needs 12"});
  const std::string gap = dir.Write(
      "gap.safetensors", HandMade(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8));
  ExpectError(SafeTensorsReader::Open(gap).status(), {gap, "before tensor 'w'"});
  const std::string tail = dir.Write(
      "tail.safetensors", HandMade(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8));
  ExpectError(SafeTensorsReader::Open(tail).status(), {tail, "4 bytes after the last tensor"});
  const std::string rev = dir.Write(
      "rev.safetensors", HandMade(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", d8));
  ExpectError(SafeTensorsReader::Open(rev).status(), {rev, "tensor 'w'", "begin > end"});
}

TEST_CASE("Unknown dtypes are rejected, known non-float dtypes only when read as fp32", "[safetensors][errors]") {
  TempDir dir;
  const std::string d8(8, 'x');
  const std::string unk = dir.Write(
      "unk.safetensors", HandMade(R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", d8));
  ExpectError(SafeTensorsReader::Open(unk).status(), {unk, "tensor 'w'", "unknown dtype 'F33'"});
  const std::string i64 = dir.Write(
      "i64.safetensors", HandMade(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", d8));
  Result<SafeTensorsReader> r = SafeTensorsReader::Open(i64);
  REQUIRE(r.ok());
  ExpectError(r->ReadAsFloat("ids").status(), {i64, "tensor 'ids'", "I64"});
}

TEST_CASE("The writer rejects duplicate names and bad tensor specs without leaving a file", "[safetensors][errors]") {
  TempDir dir;
  const float x[2] = {1, 2};
  const std::string p = dir.File("w.safetensors");
  ExpectError(WriteSafeTensors(p, {{"a", {2}, DType::kF32, x, nullptr}, {"a", {2}, DType::kF32, x, nullptr}}),
              {"'a' given twice"});
  ExpectError(WriteSafeTensors(p, {{"a", {-2}, DType::kF32, x, nullptr}}), {"'a'", "bad shape"});
  ExpectError(WriteSafeTensors(p, {{"a", {2}, DType::kF32, nullptr, nullptr}}), {"'a'", "exactly one"});
  CHECK_FALSE(std::filesystem::exists(p));
  CHECK(std::filesystem::is_empty(dir.path()));
}

}  // namespace l2l
