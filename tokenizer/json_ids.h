// Token ids read from a tokenizer.json (model.vocab, added_tokens, post-processor ids),
// for both loaders (tokenizer/tokenizer_json.cc byte-level BPE, tokenizer/wordpiece.cc).
//
// An id is a JSON integer (common/json_util.h: no floats, strings or negatives) below the
// file's id count: its model.vocab entries plus its added_tokens. Ids are dense in the
// tokenizers we know (GPT-2, Llama 3, Qwen2, BERT), and the loaders keep one slot per id,
// so an id past that count would make a file of a few bytes ask for gigabytes (a vocab
// id of 2^31-2 resized a 2^31-entry table).
//
// Thread-safety: free functions over their arguments.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace l2l::tok {

// The number of ids `root` (a tokenizer.json object) may use: the entries of
// model.vocab plus those of added_tokens (a missing or non-container field counts 0).
int64_t TokenizerJsonIdCount(const nlohmann::json& root);

// `j` as an id in [0, n_ids). Errors name `where` and, for an integer out of range, the
// id count and where it comes from.
Result<int32_t> JsonTokenId(const nlohmann::json& j, int64_t n_ids, const std::string& where);

}  // namespace l2l::tok
