// llm.c tokens files and the byte-level tokenizer. See common/tokens_file.h.
//
// Thread-safety: see the header.
#include "common/tokens_file.h"

#include <cstring>
#include <limits>

namespace l2l {
namespace {

// Validates header and size; returns the token count.
Result<size_t> CheckHeader(const std::string& path, const uint8_t* bytes, size_t file_size) {
  if (file_size < kTokensHeaderBytes) {
    return DataLoss(path + ": truncated tokens file: " + std::to_string(file_size) + " bytes, shorter than the " +
                    std::to_string(kTokensHeaderBytes) + "-byte header");
  }
  int32_t header[kTokensHeaderInts];
  std::memcpy(header, bytes, kTokensHeaderBytes);
  if (header[0] != kTokensMagic) {
    return InvalidArgument(path + ": not an llm.c tokens file: magic " + std::to_string(header[0]) + ", expected " +
                           std::to_string(kTokensMagic));
  }
  if (header[1] != kTokensVersion) {
    return InvalidArgument(path + ": unsupported tokens file version " + std::to_string(header[1]) + ", expected " +
                           std::to_string(kTokensVersion) + " (uint16 tokens)");
  }
  if (header[2] < 0) return DataLoss(path + ": negative token count " + std::to_string(header[2]) + " in header");
  const size_t count = static_cast<size_t>(header[2]);
  const size_t expected = kTokensHeaderBytes + count * sizeof(uint16_t);
  if (file_size < expected) {
    return DataLoss(path + ": truncated tokens file: header says " + std::to_string(count) + " tokens (" +
                    std::to_string(expected) + " bytes) but the file has " + std::to_string(file_size) + " bytes");
  }
  if (file_size > expected) {
    return DataLoss(path + ": " + std::to_string(file_size - expected) + " bytes of trailing garbage after the " +
                    std::to_string(count) + " tokens the header announces");
  }
  return count;
}

}  // namespace

Status CheckTokens(std::span<const uint16_t> tokens, int64_t vocab_size, const std::string& what) {
  if (vocab_size <= 0 || vocab_size > 65536) return Status::Ok();  // every uint16 fits
  const uint16_t limit = static_cast<uint16_t>(vocab_size - 1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] > limit) {
      return OutOfRange(what + ": token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                        ", not below the vocabulary size " + std::to_string(vocab_size));
    }
  }
  return Status::Ok();
}

Result<TokensFile> TokensFile::Open(const std::string& path, int64_t vocab_size) {
  L2L_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  L2L_ASSIGN_OR_RETURN(size_t count, CheckHeader(path, file.data(), file.size()));
  // The data starts 1024 bytes into a page-aligned mapping: aligned for uint16_t.
  const auto* tokens = reinterpret_cast<const uint16_t*>(file.data() + kTokensHeaderBytes);
  L2L_RETURN_IF_ERROR(CheckTokens({tokens, count}, vocab_size, path));
  return TokensFile(std::move(file), tokens, count);
}

Result<std::vector<uint16_t>> ReadTokensFile(const std::string& path, int64_t vocab_size) {
  L2L_ASSIGN_OR_RETURN(TokensFile f, TokensFile::Open(path, vocab_size));
  return std::vector<uint16_t>(f.tokens().begin(), f.tokens().end());
}

Status WriteTokensFile(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument(path + ": " + std::to_string(tokens.size()) +
                           " tokens do not fit the format's int32 count; split the corpus into shards");
  }
  int32_t header[kTokensHeaderInts] = {};
  header[0] = kTokensMagic;
  header[1] = kTokensVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  L2L_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Create(path));
  L2L_RETURN_IF_ERROR(w.Append(header, sizeof(header)));
  L2L_RETURN_IF_ERROR(w.Append(tokens.data(), tokens.size_bytes()));
  return w.Commit();
}

std::vector<uint16_t> ByteTokenize(std::string_view text) {
  std::vector<uint16_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

Result<std::string> ByteDetokenize(std::span<const uint16_t> tokens) {
  L2L_RETURN_IF_ERROR(CheckTokens(tokens, kByteVocabSize, "byte detokenize"));
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) out[i] = static_cast<char>(tokens[i]);
  return out;
}

}  // namespace l2l
