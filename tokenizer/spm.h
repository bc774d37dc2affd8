// SentencePiece-style BPE on one piece of text (no added tokens in it, spaces already
// escaped to U+2581 "▁"): the model half of a BpeModel::kSentencePiece Tokenizer
// (tokenizer/tokenizer.h runs added tokens, normalizers, prefix and pre-tokenizer first).
//
// Two ways to pick the next merge, one per source format:
//  * by score (GGUF tokenizer.ggml.model "llama": SentencePiece's bpe_model.cc and
//    llama.cpp's llm_tokenizer_spm): symbols start as the UTF-8 characters; every
//    adjacent pair whose concatenated text is a token is a candidate with that token's
//    score; the highest score merges first, the leftmost on ties. A symbol left that is
//    not a token is spelled as its bytes' <0xNN> tokens (else the unknown token).
//  * by merge rank (tokenizer.json model BPE with byte_fallback, as `tokenizers` runs
//    it): a character without a token becomes its <0xNN> byte tokens up front (else the
//    unknown token, consecutive ones fused when fuse_unk), then the listed merges apply,
//    the lowest rank first, the leftmost on ties.
// Both keep candidates in a priority queue over the linked symbols: O(n log n) in the
// piece's length, never quadratic.
//
// Ownership: an SpmModel owns its tables; Thread-safety: EncodePiece is const and
// reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace l2l::tok {

// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's stand-in for a space.
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

// `text` with every ' ' replaced by "▁".
std::string EscapeSpmSpaces(std::string_view text);

// The bytes a SentencePiece piece stands for: "▁" -> ' ', "<0xNN>" (when `byte_token`)
// -> that byte, anything else as is.
std::string SpmPieceBytes(std::string_view piece, bool byte_token);

// The byte of a "<0xNN>" piece (hex digits of either case), or -1.
int ParseByteToken(std::string_view piece);

class SpmModel {
 public:
  // `spec.model` must be kSentencePiece. Checks merges against the vocabulary, the types
  // and scores against the token count. `what` names the source in errors.
  static Result<SpmModel> Create(const BpeSpec& spec, const std::string& what);

  // Appends the ids of `piece` to `out`.
  void EncodePiece(std::string_view piece, std::vector<int32_t>* out) const;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, int32_t, Hash, std::equal_to<>>;

  void EncodeByScore(std::string_view piece, std::vector<int32_t>* out) const;
  void EncodeByRank(std::string_view piece, std::vector<int32_t>* out) const;
  // Appends the byte tokens of `bytes` (true), or nothing when one is missing (false).
  bool AppendBytes(std::string_view bytes, std::vector<int32_t>* out) const;

  PieceMap pieces_;             // piece text -> id (tokens a merge or a character may become)
  std::vector<float> scores_;   // by score: id -> score
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // by rank: (a,b) -> (rank, id)
  int32_t byte_id_[256];        // <0xNN> token ids; -1: none
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false;
  bool by_score_ = false;
};

}  // namespace l2l::tok
