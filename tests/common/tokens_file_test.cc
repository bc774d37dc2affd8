// Tests for common/formats/tokens_file.h: round trips, the exact llm.c byte layout, and every kind
// of bad file (wrong magic/version, truncated, trailing garbage, token >= vocab, empty).
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/formats/tokens_file.h"
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

// A version-2 (uint32) file by hand: header[3] = 4 bytes per token.
std::string HandMade32(int32_t version, int32_t width, int32_t count, const std::vector<uint32_t>& tokens) {
  std::string bytes(1024, '\0');
  const int32_t magic = 20240520;
  std::memcpy(bytes.data(), &magic, 4);
  std::memcpy(bytes.data() + 4, &version, 4);
  std::memcpy(bytes.data() + 8, &count, 4);
  std::memcpy(bytes.data() + 12, &width, 4);
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  return bytes;
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

TEST_CASE("Vocabularies above 65536 ids write version-2 uint32 files, smaller ones stay llm.c's uint16", "[tokens]") {
  TempDir dir;
  std::mt19937 rng(5);
  std::vector<uint32_t> big(3000);
  for (uint32_t& t : big) t = rng() % 151936;
  big[7] = 151935;
  const std::string p = dir.File("big.bin");
  REQUIRE(WriteTokensFileForVocab(p, big, 151936).ok());
  CHECK(testing::ReadAll(p) == HandMade32(2, 4, 3000, big));
  Result<std::vector<uint32_t>> back = ReadTokensFile32(p, 151936);
  REQUIRE(back.ok());
  CHECK(*back == big);
  Result<TokensFile> mapped = TokensFile::Open(p);
  REQUIRE(mapped.ok());
  CHECK(mapped->token_bytes() == 4);
  CHECK(mapped->token(7) == 151935u);
  CHECK(std::vector<uint32_t>(mapped->tokens32().begin(), mapped->tokens32().end()) == big);
  // The uint16 reader refuses it clearly; a vocabulary check names the bad token.
  ExpectError(ReadTokensFile(p).status(), StatusCode::kInvalidArgument, {p, "version-2", "ReadTokensFile32"});
  ExpectError(ReadTokensFile32(p, 151935).status(), StatusCode::kOutOfRange, {p, "token 7 is 151935"});
  ExpectError(WriteTokensFileForVocab(dir.File("x.bin"), big, 1000), StatusCode::kOutOfRange, {"not below"});

  // A small vocabulary gives the old layout, readable by both readers.
  const std::vector<uint32_t> small = {0, 5, 49151};
  const std::string q = dir.File("small.bin");
  REQUIRE(WriteTokensFileForVocab(q, small, 49152).ok());
  CHECK(testing::ReadAll(q) == HandMade(20240520, 1, 3, {0, 5, 49151}));
  CHECK(*ReadTokensFile32(q) == small);
  // Old files (version 1, header[3] = 0) and version 1 with an explicit width 2 still read.
  const std::string r = dir.Write("old.bin", HandMade(20240520, 1, 2, {9, 8}));
  CHECK(*ReadTokensFile32(r) == std::vector<uint32_t>{9, 8});
  CHECK(*ReadTokensFile(r) == std::vector<uint16_t>{9, 8});
}

TEST_CASE("A version-2 tokens file with a wrong width or size is rejected", "[tokens][errors]") {
  TempDir dir;
  const std::string p1 = dir.Write("w.bin", HandMade32(2, 2, 2, {1, 2}));
  ExpectError(ReadTokensFile32(p1).status(), StatusCode::kInvalidArgument, {p1, "version 2", "expected 4"});
  const std::string p2 = dir.Write("t.bin", HandMade32(2, 4, 3, {1, 2}));
  ExpectError(ReadTokensFile32(p2).status(), StatusCode::kDataLoss, {p2, "truncated", "3 tokens"});
  const std::string p3 = dir.Write("v.bin", HandMade32(3, 4, 2, {1, 2}));
  ExpectError(ReadTokensFile32(p3).status(), StatusCode::kInvalidArgument, {p3, "unsupported", "version 3"});
}

TEST_CASE("Loss masks round-trip in their documented layout and bad ones are rejected", "[tokens][mask]") {
  TempDir dir;
  const std::vector<uint8_t> mask = {0, 0, 1, 1, 1, 0, 1};
  const std::string p = LossMaskPath(dir.File("train.bin"));
  CHECK(p == dir.File("train.bin") + ".mask");
  REQUIRE(WriteLossMaskFile(p, mask).ok());
  std::string expect(1024, '\0');
  const int32_t hdr[3] = {20240522, 1, 7};
  std::memcpy(expect.data(), hdr, sizeof(hdr));
  expect.append(reinterpret_cast<const char*>(mask.data()), mask.size());
  CHECK(testing::ReadAll(p) == expect);
  CHECK(*ReadLossMaskFile(p, 7) == mask);
  ExpectError(ReadLossMaskFile(p, 8).status(), StatusCode::kInvalidArgument, {p, "7 entries", "8"});
  std::string bad = expect;
  bad[1024 + 3] = 2;
  const std::string b = dir.Write("bad.mask", bad);
  ExpectError(ReadLossMaskFile(b).status(), StatusCode::kDataLoss, {b, "byte 3 is 2"});
  const std::string t = dir.Write("short.mask", expect.substr(0, 1027));
  ExpectError(ReadLossMaskFile(t).status(), StatusCode::kDataLoss, {t, "7 entries"});
  const std::string m = dir.Write("magic.mask", HandMade(20240520, 1, 0, {}));
  ExpectError(ReadLossMaskFile(m).status(), StatusCode::kInvalidArgument, {m, "not a loss mask"});
  ExpectError(WriteLossMaskFile(dir.File("x.mask"), std::vector<uint8_t>{0, 3}), StatusCode::kInvalidArgument, {"byte 1 is 3"});
}

}  // namespace l2l
