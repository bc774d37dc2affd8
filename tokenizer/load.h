// One entry point for "the tokenizer of this model": a Hugging Face model directory (its
// tokenizer.json + tokenizer_config.json), a tokenizer.json file, or a GGUF file (the
// tokenizer.ggml.* metadata, split rules from tokenizer.ggml.pre as llama.cpp maps them).
// Used by l2l-tokenize, l2l-eval and l2l-sample so that text is tokenized exactly as the
// model was trained on it.
//
// Thread-safety: free functions; the returned Tokenizer is thread-safe for Encode/Decode.
#pragma once

#include <string>

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

}  // namespace l2l::tok
