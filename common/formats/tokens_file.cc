// llm.c tokens files and the byte-level tokenizer. See common/formats/tokens_file.h.
//
// Thread-safety: see the header.
#include "common/formats/tokens_file.h"

#include <cstring>
#include <limits>

namespace l2l {
namespace {

struct Header {
  size_t count;
  int token_bytes;
};

// Validates a tokens file's header and size.
Result<Header> CheckHeader(const std::string& path, const uint8_t* bytes, size_t file_size) {
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
  int width = 0;
  if (header[1] == kTokensVersion && (header[3] == 0 || header[3] == 2)) {
    width = 2;
  } else if (header[1] == kTokensVersion32 && header[3] == 4) {
    width = 4;
  } else if (header[1] == kTokensVersion || header[1] == kTokensVersion32) {
    return InvalidArgument(path + ": tokens file version " + std::to_string(header[1]) + " with " +
                           std::to_string(header[3]) + " bytes per token (header[3]); expected " +
                           (header[1] == kTokensVersion ? "0 or 2" : "4"));
  } else {
    return InvalidArgument(path + ": unsupported tokens file version " + std::to_string(header[1]) + ", expected " +
                           std::to_string(kTokensVersion) + " (uint16 tokens) or " + std::to_string(kTokensVersion32) +
                           " (uint32 tokens)");
  }
  if (header[2] < 0) return DataLoss(path + ": negative token count " + std::to_string(header[2]) + " in header");
  const size_t count = static_cast<size_t>(header[2]);
  const size_t expected = kTokensHeaderBytes + count * static_cast<size_t>(width);
  if (file_size < expected) {
    return DataLoss(path + ": truncated tokens file: header says " + std::to_string(count) + " tokens (" +
                    std::to_string(expected) + " bytes) but the file has " + std::to_string(file_size) + " bytes");
  }
  if (file_size > expected) {
    return DataLoss(path + ": " + std::to_string(file_size - expected) + " bytes of trailing garbage after the " +
                    std::to_string(count) + " tokens the header announces");
  }
  return Header{count, width};
}

template <typename T>
Status CheckTokensT(std::span<const T> tokens, int64_t vocab_size, const std::string& what) {
  if (vocab_size <= 0 || static_cast<uint64_t>(vocab_size) > uint64_t{std::numeric_limits<T>::max()} + 1) {
    return Status::Ok();  // every value fits
  }
  const T limit = static_cast<T>(vocab_size - 1);
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] > limit) {
      return OutOfRange(what + ": token " + std::to_string(i) + " is " + std::to_string(tokens[i]) +
                        ", not below the vocabulary size " + std::to_string(vocab_size));
    }
  }
  return Status::Ok();
}

Status WriteWithHeader(const std::string& path, int32_t magic, int32_t version, int32_t width, const void* data,
                       size_t count, size_t bytes) {
  if (count > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return InvalidArgument(path + ": " + std::to_string(count) +
                           " entries do not fit the format's int32 count; split the corpus into shards");
  }
  int32_t header[kTokensHeaderInts] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count);
  header[3] = width;
  L2L_ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Create(path));
  L2L_RETURN_IF_ERROR(w.Append(header, sizeof(header)));
  L2L_RETURN_IF_ERROR(w.Append(data, bytes));
  return w.Commit();
}

}  // namespace

Status CheckTokens(std::span<const uint16_t> tokens, int64_t vocab_size, const std::string& what) {
  return CheckTokensT(tokens, vocab_size, what);
}
Status CheckTokens(std::span<const uint32_t> tokens, int64_t vocab_size, const std::string& what) {
  return CheckTokensT(tokens, vocab_size, what);
}

TokensFile::TokensFile(MappedFile file, const void* data, size_t size, int token_bytes)
    : file_(std::move(file)), size_(size), token_bytes_(token_bytes) {
  if (token_bytes == 2) {
    data_ = static_cast<const uint16_t*>(data);
  } else {
    data32_ = static_cast<const uint32_t*>(data);
  }
}

std::span<const uint16_t> TokensFile::tokens() const {
  L2L_CHECK(token_bytes_ == 2) << path() << " holds uint32 tokens (version 2): use tokens32() or token(i)";
  return {data_, size_};
}

std::span<const uint32_t> TokensFile::tokens32() const {
  L2L_CHECK(token_bytes_ == 4) << path() << " holds uint16 tokens (version 1): use tokens() or token(i)";
  return {data32_, size_};
}

Result<TokensFile> TokensFile::Open(const std::string& path, int64_t vocab_size) {
  L2L_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  L2L_ASSIGN_OR_RETURN(Header h, CheckHeader(path, file.data(), file.size()));
  // The data starts 1024 bytes into a page-aligned mapping: aligned for either width.
  const uint8_t* data = file.data() + kTokensHeaderBytes;
  if (h.token_bytes == 2) {
    L2L_RETURN_IF_ERROR(CheckTokens({reinterpret_cast<const uint16_t*>(data), h.count}, vocab_size, path));
  } else {
    L2L_RETURN_IF_ERROR(CheckTokens({reinterpret_cast<const uint32_t*>(data), h.count}, vocab_size, path));
  }
  return TokensFile(std::move(file), data, h.count, h.token_bytes);
}

Result<std::vector<uint16_t>> ReadTokensFile(const std::string& path, int64_t vocab_size) {
  L2L_ASSIGN_OR_RETURN(TokensFile f, TokensFile::Open(path, vocab_size));
  if (f.token_bytes() != 2) {
    return InvalidArgument(path + ": a version-2 tokens file (uint32 ids); this reader takes uint16 ids only "
                           "(ReadTokensFile32 reads both)");
  }
  return std::vector<uint16_t>(f.tokens().begin(), f.tokens().end());
}

Result<std::vector<uint32_t>> ReadTokensFile32(const std::string& path, int64_t vocab_size) {
  L2L_ASSIGN_OR_RETURN(TokensFile f, TokensFile::Open(path, vocab_size));
  std::vector<uint32_t> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = f.token(i);
  return out;
}

Status WriteTokensFile(const std::string& path, std::span<const uint16_t> tokens) {
  // Version 1 keeps header[3] = 0, byte for byte what llm.c writes.
  return WriteWithHeader(path, kTokensMagic, kTokensVersion, 0, tokens.data(), tokens.size(), tokens.size_bytes());
}

Status WriteTokensFileForVocab(const std::string& path, std::span<const uint32_t> tokens, int64_t vocab_size) {
  if (vocab_size <= 0 || vocab_size > (int64_t{1} << 32)) {
    return InvalidArgument(path + ": vocabulary size " + std::to_string(vocab_size) + " is not in [1, 2^32]");
  }
  L2L_RETURN_IF_ERROR(CheckTokens(tokens, vocab_size, path));
  if (vocab_size <= 65536) {
    std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
    return WriteTokensFile(path, narrow);
  }
  return WriteWithHeader(path, kTokensMagic, kTokensVersion32, 4, tokens.data(), tokens.size(), tokens.size_bytes());
}

std::string LossMaskPath(const std::string& tokens_path) { return tokens_path + ".mask"; }

Status WriteLossMaskFile(const std::string& path, std::span<const uint8_t> mask) {
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] > 1) return InvalidArgument(path + ": loss mask byte " + std::to_string(i) + " is " + std::to_string(mask[i]) + ", not 0 or 1");
  }
  return WriteWithHeader(path, kLossMaskMagic, kLossMaskVersion, 0, mask.data(), mask.size(), mask.size());
}

Result<std::vector<uint8_t>> ReadLossMaskFile(const std::string& path, int64_t expected_count) {
  L2L_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  if (file.size() < kTokensHeaderBytes) {
    return DataLoss(path + ": truncated loss mask: " + std::to_string(file.size()) + " bytes, shorter than the " +
                    std::to_string(kTokensHeaderBytes) + "-byte header");
  }
  int32_t header[kTokensHeaderInts];
  std::memcpy(header, file.data(), kTokensHeaderBytes);
  if (header[0] != kLossMaskMagic) {
    return InvalidArgument(path + ": not a loss mask file: magic " + std::to_string(header[0]) + ", expected " +
                           std::to_string(kLossMaskMagic));
  }
  if (header[1] != kLossMaskVersion) {
    return InvalidArgument(path + ": unsupported loss mask version " + std::to_string(header[1]) + ", expected " +
                           std::to_string(kLossMaskVersion));
  }
  if (header[2] < 0) return DataLoss(path + ": negative count " + std::to_string(header[2]) + " in loss mask header");
  const size_t count = static_cast<size_t>(header[2]);
  if (file.size() != kTokensHeaderBytes + count) {
    return DataLoss(path + ": loss mask header says " + std::to_string(count) + " entries (" +
                    std::to_string(kTokensHeaderBytes + count) + " bytes) but the file has " +
                    std::to_string(file.size()) + " bytes");
  }
  if (expected_count >= 0 && static_cast<int64_t>(count) != expected_count) {
    return InvalidArgument(path + ": loss mask has " + std::to_string(count) + " entries, the tokens file " +
                           std::to_string(expected_count));
  }
  std::vector<uint8_t> mask(file.data() + kTokensHeaderBytes, file.data() + kTokensHeaderBytes + count);
  for (size_t i = 0; i < count; ++i) {
    if (mask[i] > 1) {
      return DataLoss(path + ": loss mask byte " + std::to_string(i) + " is " + std::to_string(mask[i]) + ", not 0 or 1");
    }
  }
  return mask;
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
