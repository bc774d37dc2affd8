// Tokens files in llm.c's format (extended to 32-bit ids), loss-mask files beside them,
// and the byte-level tokenizer the demos use. docs/formats.md documents both formats.
//
// Tokens file layout (little-endian): a 1024-byte header of 256 int32 -- [0] magic
// 20240520, [1] version, [2] token count N, [3] bytes per token, the rest zero --
// followed by exactly N tokens:
//   version 1: uint16 tokens (llm.c's format; [3] is 0 as llm.c writes it, or 2);
//   version 2: uint32 tokens ([3] must be 4), for vocabularies above 65,536 ids.
// The reader checks all of it: magic, version and width, a non-negative count, a file
// size of exactly 1024 + width*N bytes (shorter: truncated; longer: trailing garbage)
// and, when given a vocabulary size, that every token is below it. Errors name the path
// (and for a bad token its index and value). Writes are atomic (temp file, fsync, rename).
//
// Loss-mask file layout: a 1024-byte header of 256 int32 -- [0] magic 20240522,
// [1] version 1, [2] count N, the rest zero -- followed by N bytes, each 0 (the token is
// not a target: its loss and gradient are skipped) or 1 (trained on). Mask byte i belongs
// to token i of the tokens file it sits beside (LossMaskPath: "<tokens path>.mask").
//
// Ownership: TokensFile owns a read-only mapping of the file; move-only.
// Thread-safety: a TokensFile is immutable after Open() and may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/file_util.h"
#include "common/status.h"

namespace l2l {

inline constexpr int32_t kTokensMagic = 20240520;
inline constexpr int32_t kTokensVersion = 1;    // uint16 tokens (llm.c)
inline constexpr int32_t kTokensVersion32 = 2;  // uint32 tokens
inline constexpr int32_t kLossMaskMagic = 20240522;
inline constexpr int32_t kLossMaskVersion = 1;
inline constexpr size_t kTokensHeaderInts = 256;
inline constexpr size_t kTokensHeaderBytes = kTokensHeaderInts * sizeof(int32_t);
inline constexpr int64_t kByteVocabSize = 256;  // the byte-level tokenizer's vocabulary

class TokensFile {
 public:
  // Maps and validates `path`. vocab_size > 0 also checks every token is < vocab_size.
  static Result<TokensFile> Open(const std::string& path, int64_t vocab_size = 0);

  // Bytes per token: 2 (version 1) or 4 (version 2).
  int token_bytes() const { return token_bytes_; }
  // Token i, either width.
  uint32_t token(size_t i) const { return token_bytes_ == 2 ? data_[i] : data32_[i]; }
  // The tokens of a version-1 (uint16) file. REQUIRES: token_bytes() == 2.
  std::span<const uint16_t> tokens() const;
  const uint16_t* data() const { return tokens().data(); }
  // The tokens of a version-2 (uint32) file. REQUIRES: token_bytes() == 4.
  std::span<const uint32_t> tokens32() const;
  size_t size() const { return size_; }
  const std::string& path() const { return file_.path(); }

 private:
  TokensFile(MappedFile file, const void* data, size_t size, int token_bytes);
  MappedFile file_;
  const uint16_t* data_ = nullptr;    // width 2: inside file_'s mapping, at offset 1024
  const uint32_t* data32_ = nullptr;  // width 4: likewise (4-byte aligned)
  size_t size_ = 0;
  int token_bytes_ = 2;
};

// Reads and validates a whole version-1 (uint16) tokens file into memory; a version-2
// file is an InvalidArgument error saying to use ReadTokensFile32.
Result<std::vector<uint16_t>> ReadTokensFile(const std::string& path, int64_t vocab_size = 0);
// Reads a tokens file of either version, widened to uint32.
Result<std::vector<uint32_t>> ReadTokensFile32(const std::string& path, int64_t vocab_size = 0);

// Writes `tokens` atomically as version 1. At most 2^31-1 tokens (the header's count is
// an int32).
Status WriteTokensFile(const std::string& path, std::span<const uint16_t> tokens);
// Writes `tokens` atomically: version 1 (uint16) when vocab_size <= 65536, else version 2
// (uint32). Every token must be below vocab_size (OutOfRange naming the first that is not).
Status WriteTokensFileForVocab(const std::string& path, std::span<const uint32_t> tokens, int64_t vocab_size);

// OutOfRange naming `what`, the first bad index and its value when a token >= vocab_size.
Status CheckTokens(std::span<const uint16_t> tokens, int64_t vocab_size, const std::string& what);
Status CheckTokens(std::span<const uint32_t> tokens, int64_t vocab_size, const std::string& what);

// "<tokens_path>.mask": where the loss mask of a tokens file lives.
std::string LossMaskPath(const std::string& tokens_path);
// Writes a loss mask (each byte 0 or 1) atomically.
Status WriteLossMaskFile(const std::string& path, std::span<const uint8_t> mask);
// Reads and validates a loss mask: header, exact size, every byte 0 or 1 (an error names
// the index of the first that is not) and, when expected_count >= 0, N == expected_count.
Result<std::vector<uint8_t>> ReadLossMaskFile(const std::string& path, int64_t expected_count = -1);

// Byte-level tokenizer: each byte of the text is one token in [0, 256).
std::vector<uint16_t> ByteTokenize(std::string_view text);
// Inverse; a token >= 256 is an OutOfRange error naming its index and value.
Result<std::string> ByteDetokenize(std::span<const uint16_t> tokens);

}  // namespace l2l
