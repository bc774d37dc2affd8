// One entry point for "the tokenizer of this model": a Hugging Face model directory (its
// tokenizer.json + tokenizer_config.json), a tokenizer.json file, or a GGUF file (the
// tokenizer.ggml.* metadata: tokenizer.ggml.model "gpt2" with split rules from
// tokenizer.ggml.pre as llama.cpp maps them, or "llama", SentencePiece BPE from
// tokenizer.ggml.scores / token_type / add_space_prefix; the architecture does not matter).
// Used by l2l-tokenize, l2l-eval and l2l-sample so that text is tokenized exactly as the
// model was trained on it.
//
// Thread-safety: free functions; the returned Tokenizer is thread-safe for Encode/Decode.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/formats/gguf.h"
#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace l2l::tok {

// The tokenizer.ggml.* metadata of an open GGUF file as GgufVocab (errors name the file
// and the key that is missing or of the wrong type).
Result<GgufVocab> GgufVocabFromReader(const formats::GgufReader& gguf);

// True when `path` is a file starting with the GGUF magic.
bool IsGgufFile(const std::string& path);

// The tokenizer of `path` (model dir, tokenizer.json or .gguf).
Result<Tokenizer> LoadTokenizer(const std::string& path);

// Writes the tokenizer of a GGUF file as Hugging Face files into `dir`: tokenizer.json
// (the same split rules, vocabulary, merges and added tokens; BpeSpecToTokenizerJson) and
// tokenizer_config.json (bos/eos tokens, the GGUF's chat template when it has one), so a
// Hugging Face export of a GGUF import loads with AutoTokenizer and l2l's own tools.
Status WriteHfTokenizerFromGguf(const std::string& gguf_path, const std::string& dir);

// The reverse: the tokenizer of a Hugging Face model directory (tokenizer.json,
// tokenizer_config.json, config.json) as GGUF metadata, keys in the order llama.cpp's
// converter writes them: tokenizer.ggml.model "gpt2", .pre (the llama.cpp name of the
// pre-tokenizer: "gpt-2", "llama-bpe", "qwen2" or "smollm", chosen by comparing the
// tokenizer.json steps with the rules PreRulesForGgufPre gives each name), .tokens (byte-level
// vocabulary with added tokens' text in their ids; ids up to `vocab_size` the tokenizer does
// not use become "[PAD<id>]"), .token_type (1 normal, 3 control = special added token, 4
// user defined = other added token, 5 unused pad), .merges ("a b"), .bos/.eos/.padding
// token ids (tokenizer_config.json's tokens, else config.json's ids), .add_bos_token /
// .add_eos_token (from the post-processor), and tokenizer.chat_template when
// tokenizer_config.json has one. LoadTokenizer of a GGUF holding these keys encodes as the
// tokenizer.json does.
// An empty list when `dir` has no tokenizer.json; Unimplemented, naming what, when the
// tokenizer has no GGUF form (not byte-level BPE: SentencePiece-style tokenizer.json files
// have no scores, a normalizer, a pre-tokenizer none of the
// names above runs, ignore_merges unlike that name's, prefix/suffix ids other than BOS/EOS);
// InvalidArgument when it holds more ids than `vocab_size`.
using GgufMetadata = std::vector<std::pair<std::string, formats::GgufValue>>;
Result<GgufMetadata> GgufTokenizerMetadataFromHf(const std::string& dir, int64_t vocab_size);

}  // namespace l2l::tok
