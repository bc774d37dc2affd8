// WordPiece tokenizer (BERT's), as Hugging Face `tokenizers` defines it in tokenizer.json:
// model WordPiece, normalizer BertNormalizer, pre-tokenizer BertPreTokenizer,
// post-processor TemplateProcessing / BertProcessing, decoder WordPiece. It sits beside the
// byte-level BPE Tokenizer (tokenizer/tokenizer.h) as its own class: an encoder model needs
// token types and sentence pairs, which the BPE interface does not have.
//
// Pipeline of Encode(text) (and of each side of EncodePair):
//   1. added tokens ([CLS], [SEP], [MASK], ...) are cut out of the raw text, leftmost-longest
//      (normalized=false tokens on the raw text, then normalized=true ones on the normalized
//      text between them);
//   2. BertNormalizer on the text between them, in HF's order: clean_text (drops NUL, U+FFFD
//      and characters of category C* other than \t \n \r; whitespace becomes ' '),
//      handle_chinese_chars (' ' around each CJK ideograph), strip_accents (NFD, then marks
//      Mn dropped; unset: follows lowercase), lowercase (full per-character lowercasing);
//   3. BertPreTokenizer: split on whitespace (removed), then each punctuation character
//      (ASCII punctuation or Unicode P*) on its own;
//   4. WordPiece: each word greedily longest-match-first; pieces after the first carry the
//      continuing-subword prefix ("##"); a word with more than max_input_chars_per_word
//      characters, or one that cannot be covered, becomes unk_token;
//   5. the post-processor template adds [CLS] / [SEP] and sets the token type ids
//      (single: [CLS] A [SEP], all 0; pair: [CLS] A [SEP] B [SEP], B's part 1).
// Decode(ids) follows HF's decode(ids, skip_special_tokens): special added tokens dropped,
// then the WordPiece decoder (prefix removed from continuation pieces, ' ' before the
// others, HF's per-token cleanup of " ." / " ," / " 's" ...).
//
// tokenizer.json's "truncation" and "padding" are runtime settings of HF's encode and are
// ignored here (callers such as l2l-tokenize --task classify pad and truncate themselves).
// Anything else this class would encode differently (another normalizer, pre-tokenizer,
// model option, added-token flag, decoder) is an error naming the field.
//
// Ownership: a WordPieceTokenizer owns its tables; move-only.
// Thread-safety: Encode, EncodePair and Decode are const and may run from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace l2l::tok {

// One encoded sequence (or pair): ids and, per id, its token type (segment) id.
struct WordPieceEncoding {
  std::vector<int32_t> ids;
  std::vector<int32_t> type_ids;
};

class WordPieceTokenizer {
 public:
  // Parses tokenizer.json (a file, or a model directory holding tokenizer.json).
  static Result<WordPieceTokenizer> FromTokenizerJson(const std::string& path);
  static Result<WordPieceTokenizer> FromTokenizerJsonText(std::string_view json, const std::string& what);

  WordPieceTokenizer(WordPieceTokenizer&&) noexcept;
  WordPieceTokenizer& operator=(WordPieceTokenizer&&) noexcept;
  ~WordPieceTokenizer();

  // `text` must be valid UTF-8 (an error otherwise). add_special applies the
  // post-processor's special tokens ([CLS] A [SEP]).
  Result<WordPieceEncoding> Encode(std::string_view text, bool add_special = true) const;
  // A sentence pair: [CLS] A [SEP] B [SEP] with type ids 0 for A's part and 1 for B's (as the
  // post-processor's pair template says).
  Result<WordPieceEncoding> EncodePair(std::string_view a, std::string_view b, bool add_special = true) const;
  // The post-processor alone, on ids encoded without special tokens (b == nullptr: a single
  // sequence): what Encode / EncodePair do after the model. For truncating parts before the
  // special tokens are added.
  WordPieceEncoding PostProcess(const std::vector<int32_t>& a, const std::vector<int32_t>* b,
                                bool add_special = true) const;
  // Text of `ids` (HF decode): special tokens skipped when skip_special. An id out of range
  // is an OutOfRange error naming its index.
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special = true) const;

  // One past the largest id (vocabulary and added tokens).
  int64_t vocab_size() const;
  // The id of a token (vocabulary or added) with exactly this text; nullopt when none.
  std::optional<int32_t> TokenId(std::string_view token) const;
  // The text of one token ("" for an id the vocabulary skips); id must be in range.
  const std::string& TokenText(int32_t id) const;
  bool IsSpecial(int32_t id) const;  // a special added token
  int32_t unk_id() const;
  // Ids of [CLS], [SEP], [PAD], [MASK] when the vocabulary has them; -1 otherwise.
  int32_t cls_id() const;
  int32_t sep_id() const;
  int32_t pad_id() const;
  int32_t mask_id() const;
  // How many special tokens the post-processor adds to one sequence (2 for BERT) and to a
  // pair (3).
  int num_special_tokens(bool pair) const;

 private:
  struct Impl;
  explicit WordPieceTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The "model.type" of a tokenizer.json (file or model directory): "BPE", "WordPiece", ...
// ("" when the field is absent). Errors name the file.
Result<std::string> TokenizerJsonModelType(const std::string& path);

}  // namespace l2l::tok
