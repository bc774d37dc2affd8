// GGUF tokenizer metadata (tokenizer.ggml.*, as GgufVocab) -> BpeSpec: "gpt2" byte-level
// BPE with llama.cpp's split rules for tokenizer.ggml.pre, and "llama" SentencePiece BPE
// merged by tokenizer.ggml.scores. See tokenizer/tokenizer.h.
//
// Thread-safety: free functions over their arguments.
#include <string>
#include <string_view>
#include <utility>

#include "tokenizer/spm.h"
#include "tokenizer/tokenizer.h"

namespace l2l::tok {

Result<GgufPreRules> PreRulesForGgufPre(std::string_view pre) {
  // llama.cpp's regexes (llama-vocab.cpp, llm_tokenizer_bpe), applied one after another,
  // each splitting every piece the previous one left (matches and gaps isolated).
  static const char* const kLlamaCppGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
  static const char* const kLlamaCppLlama3 =
      R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static const char* const kLlamaCppQwen2 =
      R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  GgufPreRules r;
  auto split = [&](const char* re) { r.steps.push_back(PreTokenizerStep::Split(re)); };
  if (pre == "default" || pre.empty()) {
    split(R"([\p{P}\$\+<=>\^~\|]+)");
    split(kLlamaCppGpt2);
    split(R"(\p{N}+)");
    split(R"([0-9][0-9][0-9])");
  } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "falcon3") {
    split(kLlamaCppLlama3);
    r.ignore_merges = true;
    r.add_bos_default = true;
  } else if (pre == "qwen2" || pre == "megrez" || pre == "stablelm2") {
    split(kLlamaCppQwen2);
  } else if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" || pre == "codeshell" ||
             pre == "exaone" || pre == "minerva-7b") {
    split(R"(\p{N})");
    split(kLlamaCppGpt2);
  } else if (pre == "gpt-2" || pre == "phi-2" || pre == "roberta-bpe" || pre == "mpt" || pre == "olmo" ||
             pre == "jais") {
    split(kLlamaCppGpt2);
  } else {
    return Unimplemented("tokenizer.ggml.pre \"" + std::string(pre) +
                         "\" is not supported (supported: default, gpt-2, llama-bpe/llama3, qwen2, smollm and "
                         "their llama.cpp aliases)");
  }
  r.steps.push_back(PreTokenizerStep::ByteLevel(/*add_prefix_space=*/false, /*use_regex=*/false));
  return r;
}

namespace {

// tokenizer.ggml.model "llama": SentencePiece BPE driven by the token scores, as llama.cpp's
// llm_tokenizer_spm runs it (add_space_prefix default true, BOS added by default).
Result<BpeSpec> SpmSpecFromGguf(const GgufVocab& v, const std::string& what) {
  const size_t n = v.tokens.size();
  if (v.scores.empty()) {
    return InvalidArgument(what + ": tokenizer.ggml.scores is missing or empty (a \"llama\" (SentencePiece) "
                           "tokenizer merges by score)");
  }
  if (v.scores.size() != n) {
    return InvalidArgument(what + ": tokenizer.ggml.scores has " + std::to_string(v.scores.size()) +
                           " entries, tokenizer.ggml.tokens " + std::to_string(n));
  }
  BpeSpec spec;
  spec.model = BpeModel::kSentencePiece;
  spec.tokens = v.tokens;
  spec.scores = v.scores;
  spec.token_types = v.token_types;
  for (size_t id = 0; id < v.token_types.size(); ++id) {
    const int32_t type = v.token_types[id];
    if (type < 0 || type > 6) {
      return InvalidArgument(what + ": tokenizer.ggml.token_type[" + std::to_string(id) + "] is " + std::to_string(type) +
                             " (0 undefined, 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte)");
    }
    if (type == 6 && ParseByteToken(v.tokens[id]) < 0) {
      return InvalidArgument(what + ": tokenizer.ggml.tokens[" + std::to_string(id) + "] \"" + v.tokens[id] +
                             "\" has token type 6 (byte) but is not <0xNN>");
    }
    if (type == 2 || type == 3 || type == 4) {
      if (v.tokens[id].empty()) {
        return InvalidArgument(what + ": tokenizer.ggml.tokens[" + std::to_string(id) + "] is empty but has token type " +
                               std::to_string(type));
      }
      AddedToken t;
      t.id = static_cast<int32_t>(id);
      t.content = v.tokens[id];
      t.special = type != 4;
      spec.added_tokens.push_back(std::move(t));
    }
  }
  const bool space_prefix = v.add_space_prefix.value_or(true);
  spec.space_prefix = space_prefix ? SpacePrefix::kAlways : SpacePrefix::kNone;
  spec.escape_spaces = true;
  spec.decode_strip_space = space_prefix;
  if (v.unk_id >= static_cast<int64_t>(n)) {
    return InvalidArgument(what + ": tokenizer.ggml.unknown_token_id " + std::to_string(v.unk_id) +
                           " is not below the vocabulary size " + std::to_string(n));
  }
  spec.unk_id = static_cast<int32_t>(v.unk_id);
  return spec;
}

}  // namespace

namespace {

// tokenizer.ggml.model "gpt2": byte-level BPE, split rules from tokenizer.ggml.pre.
Result<BpeSpec> ByteLevelSpecFromGguf(const GgufVocab& v, const GgufPreRules& rules, const std::string& what) {
  BpeSpec spec;
  spec.tokens = v.tokens;
  spec.pre_tokenizer = rules.steps;
  spec.ignore_merges = rules.ignore_merges;
  spec.merges.reserve(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& s = v.merges[i];
    const size_t sp = s.size() > 1 ? s.find(' ', 1) : std::string::npos;  // as llama.cpp
    if (sp == std::string::npos) {
      return InvalidArgument(what + ": tokenizer.ggml.merges[" + std::to_string(i) + "] \"" + s + "\" is not \"a b\"");
    }
    spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
  }
  // llama.cpp matches unknown (2), control (3) and user-defined (4) tokens in the text.
  for (size_t id = 0; id < v.token_types.size(); ++id) {
    const int32_t type = v.token_types[id];
    if (type == 2 || type == 3 || type == 4) {
      AddedToken t;
      t.id = static_cast<int32_t>(id);
      t.content = v.tokens[id];
      t.special = type != 4;
      spec.added_tokens.push_back(std::move(t));
    }
  }
  return spec;
}

}  // namespace

Result<BpeSpec> Tokenizer::SpecFromGguf(const GgufVocab& v, const std::string& what) {
  if (v.model != "gpt2" && v.model != "llama") {
    return Unimplemented(what + ": tokenizer.ggml.model \"" + v.model +
                         "\" is not supported (gpt2: byte-level BPE; llama: SentencePiece BPE)");
  }
  if (v.tokens.empty()) return InvalidArgument(what + ": tokenizer.ggml.tokens is empty");
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size()) {
    return InvalidArgument(what + ": tokenizer.ggml.token_type has " + std::to_string(v.token_types.size()) +
                           " entries, tokenizer.ggml.tokens " + std::to_string(v.tokens.size()));
  }
  BpeSpec spec;
  bool add_bos_default = true;  // llama.cpp: SentencePiece vocabularies add BOS unless the file says not
  if (v.model == "llama") {
    L2L_ASSIGN_OR_RETURN(spec, SpmSpecFromGguf(v, what));
  } else {
    auto rules = PreRulesForGgufPre(v.pre);
    if (!rules.ok()) return rules.status().WithContext(what);
    add_bos_default = rules->add_bos_default;
    L2L_ASSIGN_OR_RETURN(spec, ByteLevelSpecFromGguf(v, *rules, what));
  }
  const auto check_id = [&](int64_t id, const char* key) -> Status {
    if (id >= static_cast<int64_t>(v.tokens.size())) {
      return InvalidArgument(what + ": " + key + " " + std::to_string(id) + " is not below the vocabulary size " +
                             std::to_string(v.tokens.size()));
    }
    return Status::Ok();
  };
  L2L_RETURN_IF_ERROR(check_id(v.bos_id, "tokenizer.ggml.bos_token_id"));
  L2L_RETURN_IF_ERROR(check_id(v.eos_id, "tokenizer.ggml.eos_token_id"));
  spec.bos_id = static_cast<int32_t>(v.bos_id);
  spec.eos_id = static_cast<int32_t>(v.eos_id);
  if (v.add_bos.value_or(add_bos_default)) {
    if (v.bos_id < 0) return InvalidArgument(what + ": tokenizer.ggml.add_bos_token is set but there is no bos_token_id");
    spec.prefix_ids.push_back(static_cast<int32_t>(v.bos_id));
  }
  if (v.add_eos.value_or(false)) {
    if (v.eos_id < 0) return InvalidArgument(what + ": tokenizer.ggml.add_eos_token is set but there is no eos_token_id");
    spec.suffix_ids.push_back(static_cast<int32_t>(v.eos_id));
  }
  return spec;
}

Result<Tokenizer> Tokenizer::FromGguf(const GgufVocab& v, const std::string& what) {
  L2L_ASSIGN_OR_RETURN(BpeSpec spec, SpecFromGguf(v, what));
  return Create(std::move(spec), what);
}

}  // namespace l2l::tok
