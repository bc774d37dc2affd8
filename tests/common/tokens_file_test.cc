// Tests for common/tokens_file.h: round trips, the exact llm.c byte layout, and every kind
// of bad file (wrong magic/version, truncated, trailing garbage, token >= vocab, empty).
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/tokens_file.h"
#include "tests/common/temp_dir.h"

namespace l2l {
namespace {

using testing::TempDir;

// A file built by hand from the format description (not by the code under test).
std::string HandMade(int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& tokens) {
  std::string bytes(1024, '\0');
  std::memcpy(bytes.data(), &magic, 4);
  std::memcpy(bytes.data() + 4, &version, 4);
  std::memcpy(bytes.data() + 8, &count, 4);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
  return bytes;
}

void ExpectError(const Status& s, StatusCode code, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.ToString());
  CHECK(s.code() == code);
  for (const std::string& n : needles) CHECK(s.message().find(n) != std::string::npos);
}

}  // namespace

TEST_CASE("Tokens written are read back identically, whole or mapped, in llm.c's layout", "[tokens]") {
  TempDir dir;
  std::mt19937 rng(3);
  std::vector<uint16_t> tokens(5000);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng() % 50257);
  const std::string path = dir.File("t.bin");
  REQUIRE(WriteTokensFile(path, tokens).ok());
  // Byte layout from the format description.
  CHECK(testing::ReadAll(path) == HandMade(20240520, 1, 5000, tokens));
  Result<std::vector<uint16_t>> back = ReadTokensFile(path, 50257);
  REQUIRE(back.ok());
  CHECK(*back == tokens);
  Result<TokensFile> mapped = TokensFile::Open(path);
  REQUIRE(mapped.ok());
  CHECK(std::vector<uint16_t>(mapped->tokens().begin(), mapped->tokens().end()) == tokens);
  // Overwriting replaces the file atomically and leaves no temp files behind.
  REQUIRE(WriteTokensFile(path, std::vector<uint16_t>{1, 2, 3}).ok());
  CHECK(*ReadTokensFile(path) == std::vector<uint16_t>{1, 2, 3});
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) entries += e.is_regular_file();
  CHECK(entries == 1);
}

TEST_CASE("A tokens file with a wrong magic or version is rejected naming the path", "[tokens][errors]") {
  TempDir dir;
  const std::string p1 = dir.Write("magic.bin", HandMade(20240521, 1, 2, {1, 2}));
  ExpectError(ReadTokensFile(p1).status(), StatusCode::kInvalidArgument, {p1, "magic 20240521", "20240520"});
  const std::string p2 = dir.Write("version.bin", HandMade(20240520, 2, 2, {1, 2}));
  ExpectError(ReadTokensFile(p2).status(), StatusCode::kInvalidArgument, {p2, "version 2"});
}

TEST_CASE("A truncated tokens file or one with trailing bytes is rejected", "[tokens][errors]") {
  TempDir dir;
  const std::string p1 = dir.Write("short.bin", HandMade(20240520, 1, 10, {1, 2, 3}));
  ExpectError(ReadTokensFile(p1).status(), StatusCode::kDataLoss, {p1, "truncated", "10 tokens"});
  const std::string p2 = dir.Write("header.bin", HandMade(20240520, 1, 0, {}).substr(0, 500));
  ExpectError(ReadTokensFile(p2).status(), StatusCode::kDataLoss, {p2, "truncated", "500 bytes"});
  const std::string p3 = dir.Write("long.bin", HandMade(20240520, 1, 2, {1, 2, 3}));
  ExpectError(ReadTokensFile(p3).status(), StatusCode::kDataLoss, {p3, "2 bytes of trailing garbage"});
  const std::string p4 = dir.Write("neg.bin", HandMade(20240520, 1, -1, {}));
  ExpectError(ReadTokensFile(p4).status(), StatusCode::kDataLoss, {p4, "negative"});
  ExpectError(ReadTokensFile(dir.File("missing.bin")).status(), StatusCode::kNotFound, {"missing.bin"});
}

TEST_CASE("A token outside the vocabulary is reported with its index and value", "[tokens][errors]") {
  TempDir dir;
  const std::string p = dir.Write("vocab.bin", HandMade(20240520, 1, 4, {0, 255, 256, 7}));
  ExpectError(ReadTokensFile(p, 256).status(), StatusCode::kOutOfRange, {p, "token 2 is 256", "256"});
  CHECK(ReadTokensFile(p, 257).ok());
  CHECK(ReadTokensFile(p).ok());  // no vocabulary given: no check
}

TEST_CASE("Empty token files: a 0-byte file is truncated, a header with 0 tokens is valid and empty", "[tokens]") {
  TempDir dir;
  const std::string p0 = dir.Write("zero.bin", "");
  ExpectError(ReadTokensFile(p0).status(), StatusCode::kDataLoss, {p0, "truncated"});
  const std::string p1 = dir.File("none.bin");
  REQUIRE(WriteTokensFile(p1, {}).ok());
  Result<std::vector<uint16_t>> r = ReadTokensFile(p1, 256);
  REQUIRE(r.ok());
  CHECK(r->empty());
}

TEST_CASE("The byte tokenizer maps every byte to its value and back", "[tokens]") {
  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  text += "hello, world\n";
  const std::vector<uint16_t> t = ByteTokenize(text);
  REQUIRE(t.size() == text.size());
  for (size_t i = 0; i < 256; ++i) CHECK(t[i] == i);
  CHECK(t[256] == 'h');
  Result<std::string> back = ByteDetokenize(t);
  REQUIRE(back.ok());
  CHECK(*back == text);
  const std::vector<uint16_t> bad = {104, 300};
  ExpectError(ByteDetokenize(bad).status(), StatusCode::kOutOfRange, {"token 1 is 300"});
}

}  // namespace l2l
