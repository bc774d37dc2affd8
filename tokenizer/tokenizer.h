// BPE tokenizers of two flavours behind one class:
//  * byte-level BPE, as Hugging Face `tokenizers` defines it in tokenizer.json (model type
//    BPE, ByteLevel/Split/Digits pre-tokenizers, added tokens, ByteLevel decoder,
//    TemplateProcessing post-processor) and as llama.cpp runs a GGUF file's
//    `tokenizer.ggml.*` vocabulary with tokenizer.ggml.model "gpt2" (split rules chosen by
//    `tokenizer.ggml.pre`);
//  * SentencePiece-style BPE (Llama 2, Gemma): spaces become U+2581 "▁", an optional "▁"
//    prefix, words merged on Unicode characters, characters without a token spelled as
//    <0xNN> byte tokens. From a GGUF with tokenizer.ggml.model "llama" merges follow the
//    token scores (the highest-scoring pair first, leftmost on ties: SentencePiece's BPE
//    and llama.cpp's llm_tokenizer_spm); from a tokenizer.json (model BPE with
//    byte_fallback true, normalizer Replace(" ", "▁") / Prepend("▁") or a Metaspace
//    pre-tokenizer, decoder Replace / ByteFallback / Fuse / Strip) they follow the merges'
//    ranks as `tokenizers` does. See tokenizer/spm.h.
//
// Pipeline of Encode(text):
//   1. added tokens are cut out of the text first (leftmost-longest match; tokens with
//      normalized=false in a first pass, then the normalizer (NFC, ...) runs on the text
//      between them, then normalized=true tokens in a second pass; each honouring
//      lstrip / rstrip / single_word as HF does);
//   2. every remaining piece goes through the pre-tokenizer steps in order (regex
//      splits with PCRE2, UTF + Unicode properties, JIT);
//   3. every resulting word is BPE-merged on its raw bytes (the GPT-2 byte <-> unicode
//      mapping is applied to the vocabulary once at load, so words are never remapped),
//      through a word -> ids cache;
//   4. the post-processor's prefix / suffix ids (e.g. BOS) are added when add_special.
// Decode(ids) concatenates each token's bytes (the ByteLevel decoder; for SentencePiece
// "▁" -> " ", <0xNN> -> that byte, then one leading space stripped when the tokenizer adds
// a prefix space): for any text, Decode(Encode(text, false)) == text when the tokenizer
// neither normalizes, adds a prefix space after an added token nor strips whitespace
// around added tokens.
//
// Ownership: a Tokenizer owns its tables and its cache; move-only.
// Thread-safety: Encode and Decode are const and may run from several threads at once
// (the word cache has its own mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace l2l::tok {

// A token matched in the raw text before pre-tokenization (tokenizer.json "added_tokens").
struct AddedToken {
  int32_t id = -1;
  std::string content;       // raw text (not byte-level mapped)
  bool special = false;      // a control token (<|im_start|>, <|endoftext|>)
  bool lstrip = false;       // also swallows the whitespace to its left
  bool rstrip = false;       // also swallows the whitespace to its right
  bool normalized = false;   // matched in the normalized text (second pass)
  bool single_word = false;  // only when not inside a word
};

// How a Split step treats the pieces its pattern matches (HF SplitDelimiterBehavior).
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
Result<SplitBehavior> ParseSplitBehavior(std::string_view name);  // "Isolated", ...

// One pre-tokenization step, applied to every piece the previous steps produced.
struct PreTokenizerStep {
  enum class Kind {
    kSplit,      // `regex` splits each piece per `behavior` (and `invert`)
    kByteLevel,  // optional prefix space, then (use_regex) the GPT-2 regex, isolated
  };
  Kind kind = Kind::kSplit;
  std::string regex;  // kSplit: PCRE2 pattern (compiled with UTF | UCP)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = true;          // kByteLevel

  static PreTokenizerStep Split(std::string regex, SplitBehavior behavior = SplitBehavior::kIsolated,
                                bool invert = false);
  static PreTokenizerStep ByteLevel(bool add_prefix_space, bool use_regex);
};

// A Unicode normalization (tokenizer.json "normalizer": NFC, NFD, NFKC, NFKD), done with
// ICU. Applied to the text between added tokens with normalized=false, before the
// normalized=true added tokens are matched and before pre-tokenization.
enum class Normalization { kNFC, kNFD, kNFKC, kNFKD };
Result<Normalization> ParseNormalization(std::string_view name);

// The split regexes by name (exactly as the tokenizer.json files / llama.cpp define them).
// GPT-2's ByteLevel regex: 's|'t|... | ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
extern const char* const kGpt2Regex;
extern const char* const kLlama3Regex;  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|...
extern const char* const kQwen2Regex;   // as Llama-3 with \p{N} (one digit per word)

// Which flavour of BPE a BpeSpec describes.
enum class BpeModel {
  kByteLevel,      // GPT-2 byte alphabet, pre-tokenizer with a ByteLevel step
  kSentencePiece,  // "▁" for spaces, merges on characters, <0xNN> byte fallback
};

// Where a SentencePiece tokenizer puts a "▁" before a piece of text (a piece: the text
// between two added tokens).
enum class SpacePrefix {
  kNone,
  kAlways,           // every piece (GGUF add_space_prefix; the Prepend("▁") normalizer)
  kMetaspaceAlways,  // every piece not already starting with "▁" (Metaspace "always")
  kMetaspaceFirst,   // only the piece at the start of the text, when not "▁" already
};

// Everything a BPE tokenizer is made of, as plain data: what tokenizer.json or a GGUF
// file's metadata hold. For kByteLevel `tokens` are in the byte-level alphabet (GPT-2's
// bytes_to_unicode: 'Ġ' for a space), as both formats store them; for kSentencePiece they
// are SentencePiece pieces ("▁the", "<0x0A>").
struct BpeSpec {
  BpeModel model = BpeModel::kByteLevel;
  std::vector<std::string> tokens;  // id -> token text; "" for an id the vocab skips
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order (rank 0 first)
  bool ignore_merges = false;       // a word that is itself a token is that token
  std::vector<AddedToken> added_tokens;
  std::vector<Normalization> normalizers;       // in order; empty: none
  std::vector<PreTokenizerStep> pre_tokenizer;  // must include a ByteLevel step
  std::vector<int32_t> prefix_ids;  // post-processor: ids before the text when add_special
  std::vector<int32_t> suffix_ids;  // ... and after it
  int32_t bos_id = -1;              // -1: none (informational; prefix_ids decide encoding)
  int32_t eos_id = -1;

  // kSentencePiece only.
  std::vector<float> scores;        // per id; non-empty: merge by score (GGUF), else by merges' rank
  std::vector<int32_t> token_types;  // per id (GGUF types; empty: all normal): 3 control, 6 byte
  int32_t unk_id = -1;               // a character with neither a token nor byte tokens; -1: dropped
  bool fuse_unk = false;             // consecutive unknown characters give one unk (tokenizers)
  bool escape_spaces = true;         // ' ' -> "▁" before merging
  SpacePrefix space_prefix = SpacePrefix::kNone;
  bool metaspace_split = false;      // Metaspace split=true: pieces split before each "▁"
  bool decode_strip_space = false;   // Decode drops one leading space (decoder Strip)
};

// A GGUF file's tokenizer metadata, as the GGUF reader hands it over.
struct GgufVocab {
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right"
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (empty: all normal); 1 normal,
                                     // 2 unknown, 3 control, 4 user defined (2-4: added
                                     // tokens), 5 unused, 6 byte (<0xNN>)
  std::vector<float> scores;         // tokenizer.ggml.scores (required for "llama")
  std::string model = "gpt2";        // tokenizer.ggml.model: "gpt2" (byte-level BPE) or
                                     // "llama" (SentencePiece BPE)
  std::string pre;                   // tokenizer.ggml.pre ("" = "default")
  int64_t bos_id = -1;               // tokenizer.ggml.bos_token_id (-1: absent)
  int64_t eos_id = -1;               // tokenizer.ggml.eos_token_id
  std::optional<bool> add_bos;       // tokenizer.ggml.add_bos_token (absent: as llama.cpp)
  std::optional<bool> add_eos;       // tokenizer.ggml.add_eos_token
  std::optional<bool> add_space_prefix;  // tokenizer.ggml.add_space_prefix ("llama"; absent: true)
  int64_t unk_id = -1;               // tokenizer.ggml.unknown_token_id
};

// The pre-tokenizer and flags llama.cpp uses for a `tokenizer.ggml.pre` name: "gpt-2",
// "llama-bpe" (and "llama3", "llama-v3", "falcon3"), "qwen2", "smollm" (and "starcoder",
// "refact", "command-r", "codeshell", "exaone", "minerva-7b"), "default"/"". Unknown or
// unsupported names are an error naming the name.
struct GgufPreRules {
  std::vector<PreTokenizerStep> steps;
  bool ignore_merges = false;
  bool add_bos_default = false;
};
Result<GgufPreRules> PreRulesForGgufPre(std::string_view pre);

// `spec` as a Hugging Face tokenizer.json (model BPE, Split / ByteLevel pre-tokenizers,
// normalizers, added tokens, a TemplateProcessing post-processor for prefix / suffix ids,
// ByteLevel decoder) that `tokenizers` loads and encodes as Tokenizer::Create(spec) does:
// what an export of a GGUF-imported model writes beside its weights. A SentencePiece spec
// with scores becomes model BPE with byte_fallback and merges made from the scores (as
// transformers' SentencePiece converters make them: every split of a token into two
// tokens, ordered by the token's score), normalizer Prepend / Replace, decoder Replace /
// ByteFallback / Fuse (/ Strip).
std::string BpeSpecToTokenizerJson(const BpeSpec& spec);

class Tokenizer {
 public:
  // Validates `spec` (merge parts and results in the vocabulary, ids in range, regexes
  // compile, a ByteLevel step present). `what` names the source in errors.
  static Result<Tokenizer> Create(BpeSpec spec, const std::string& what = "tokenizer");
  // Parses tokenizer.json (a file, or a model directory holding tokenizer.json; there a
  // tokenizer_config.json, when present, gives eos_id / bos_id from eos_token / bos_token).
  static Result<Tokenizer> FromTokenizerJson(const std::string& path);
  // The BpeSpec that FromTokenizerJson builds (exposed for GGUF export).
  static Result<BpeSpec> SpecFromTokenizerJson(const std::string& path);
  static Result<Tokenizer> FromTokenizerJsonText(std::string_view json, const std::string& what);
  // From GGUF metadata: split rules from `vocab.pre` as llama.cpp maps them; control and
  // user-defined tokens become added tokens; BOS/EOS added per add_bos/add_eos.
  static Result<Tokenizer> FromGguf(const GgufVocab& vocab, const std::string& what = "gguf");
  // Builds the BpeSpec that FromGguf uses (exposed for tests and for export).
  static Result<BpeSpec> SpecFromGguf(const GgufVocab& vocab, const std::string& what = "gguf");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `text` (any bytes; invalid UTF-8 is encoded byte by byte). add_special
  // adds the post-processor's prefix / suffix (BOS when the tokenizer adds it).
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special = true) const;
  // The bytes of `ids` concatenated (special tokens included). An id out of range is an
  // OutOfRange error naming its index.
  Result<std::string> Decode(std::span<const int32_t> ids) const;

  // One past the largest id (model vocabulary and added tokens).
  int64_t vocab_size() const;
  // The id of an added token with this content, or of a vocabulary token whose bytes are
  // `text`; nullopt when there is none.
  std::optional<int32_t> TokenId(std::string_view text) const;
  // The raw bytes of one token.
  const std::string& TokenBytes(int32_t id) const;
  bool IsAddedToken(int32_t id) const;
  // The flavour (byte-level or SentencePiece BPE).
  BpeModel model() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  std::span<const int32_t> prefix_ids() const;
  std::span<const int32_t> suffix_ids() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// GPT-2's bytes_to_unicode: the code point that stands for byte b in byte-level tokens.
uint32_t ByteToUnicode(uint8_t b);
// Maps a byte-level token back to bytes; nullopt when a character is outside the alphabet.
std::optional<std::string> ByteLevelToBytes(std::string_view token);
// Maps raw bytes to the byte-level alphabet (UTF-8).
std::string BytesToByteLevel(std::string_view bytes);

}  // namespace l2l::tok
