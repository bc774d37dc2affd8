// Tokens files in llm.c's format, and the byte-level tokenizer the demos use.
//
// Layout (little-endian): a 1024-byte header of 256 int32 -- [0] magic 20240520,
// [1] version 1, [2] token count N, the rest zero -- followed by exactly N uint16 tokens.
// The reader checks all of it: magic, version, a non-negative count, a file size of
// exactly 1024 + 2N bytes (shorter: truncated; longer: trailing garbage) and, when given
// a vocabulary size, that every token is below it. Errors name the path (and for a bad
// token its index and value). Writes are atomic (temp file, fsync, rename).
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
inline constexpr int32_t kTokensVersion = 1;
inline constexpr size_t kTokensHeaderInts = 256;
inline constexpr size_t kTokensHeaderBytes = kTokensHeaderInts * sizeof(int32_t);
inline constexpr int64_t kByteVocabSize = 256;  // the byte-level tokenizer's vocabulary

class TokensFile {
 public:
  // Maps and validates `path`. vocab_size > 0 also checks every token is < vocab_size.
  static Result<TokensFile> Open(const std::string& path, int64_t vocab_size = 0);

  std::span<const uint16_t> tokens() const { return {data_, size_}; }
  const uint16_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return file_.path(); }

 private:
  TokensFile(MappedFile file, const uint16_t* data, size_t size) : file_(std::move(file)), data_(data), size_(size) {}
  MappedFile file_;
  const uint16_t* data_ = nullptr;  // inside file_'s mapping, 2-byte aligned (offset 1024)
  size_t size_ = 0;
};

// Reads and validates a whole tokens file into memory (see TokensFile::Open).
Result<std::vector<uint16_t>> ReadTokensFile(const std::string& path, int64_t vocab_size = 0);

// Writes `tokens` atomically. At most 2^31-1 tokens (the header's count is an int32).
Status WriteTokensFile(const std::string& path, std::span<const uint16_t> tokens);

// OutOfRange naming `what`, the first bad index and its value when a token >= vocab_size.
Status CheckTokens(std::span<const uint16_t> tokens, int64_t vocab_size, const std::string& what);

// Byte-level tokenizer: each byte of the text is one token in [0, 256).
std::vector<uint16_t> ByteTokenize(std::string_view text);
// Inverse; a token >= 256 is an OutOfRange error naming its index and value.
Result<std::string> ByteDetokenize(std::span<const uint16_t> tokens);

}  // namespace l2l
