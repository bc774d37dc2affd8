// tokenizer.json (Hugging Face `tokenizers`) -> BpeSpec, and BpeSpec -> tokenizer.json
// (GGUF metadata -> BpeSpec is tokenizer/gguf_spec.cc). See tokenizer/tokenizer.h.
//
// Supported: model BPE (vocab; merges as "a b" strings or [a, b] pairs; ignore_merges;
// no subword prefix/suffix, no dropout), normalizer null / NFC / NFD /
// NFKC / NFKD / Sequence of them, pre-tokenizer
// ByteLevel / Split (Regex or String pattern) / Digits / Sequence of them, decoder
// ByteLevel (or a Sequence holding only ByteLevel), post-processor null / ByteLevel /
// TemplateProcessing / RobertaProcessing / BertProcessing / Sequence of them. With
// model.byte_fallback true the tokenizer is SentencePiece-style (Llama 2, Gemma): then the
// normalizer may also hold Prepend("▁") and Replace(" ", "▁"), the pre-tokenizer may be
// Metaspace (replacement "▁"; prepend_scheme always / first / never; split) or a Split,
// and the decoder is a Sequence of Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)
// or Metaspace; model.unk_token and fuse_unk are honoured. Anything
// else is an error naming the field, so a tokenizer we would encode differently is
// refused rather than silently approximated.
//
// Thread-safety: free functions over their arguments.
#include <algorithm>
#include <filesystem>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "tokenizer/json_ids.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"

namespace l2l::tok {
namespace {

using json = nlohmann::json;

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
bool Bool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}

Status ParsePreTokenizer(const json& j, const std::string& where, std::vector<PreTokenizerStep>* steps) {
  if (j.is_null()) return Status::Ok();
  const std::string type = Str(j, "type");
  if (type == "Sequence") {
    const json& list = j.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      L2L_RETURN_IF_ERROR(ParsePreTokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", steps));
    }
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    steps->push_back(PreTokenizerStep::ByteLevel(Bool(j, "add_prefix_space", true), Bool(j, "use_regex", true)));
    return Status::Ok();
  }
  if (type == "Split") {
    const json& pat = j.at("pattern");
    std::string regex;
    if (pat.contains("Regex")) {
      regex = pat.at("Regex").get<std::string>();
    } else if (pat.contains("String")) {
      regex = EscapeRegex(pat.at("String").get<std::string>());
    } else {
      return InvalidArgument(where + ".pattern: neither Regex nor String");
    }
    auto behavior = ParseSplitBehavior(Str(j, "behavior"));
    if (!behavior.ok()) return behavior.status().WithContext(where + ".behavior");
    steps->push_back(PreTokenizerStep::Split(regex, *behavior, Bool(j, "invert", false)));
    return Status::Ok();
  }
  if (type == "Digits") {
    // HF splits on char::is_numeric (categories Nd, Nl, No) = \p{N}.
    const bool individual = Bool(j, "individual_digits", false);
    steps->push_back(PreTokenizerStep::Split(R"(\p{N})", individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous));
    return Status::Ok();
  }
  return Unimplemented(where + ": pre-tokenizer type \"" + type +
                       "\" is not supported (ByteLevel, Split, Digits, Sequence are)");
}

Status ParseNormalizer(const json& j, const std::string& where, std::vector<Normalization>* out) {
  if (j.is_null()) return Status::Ok();
  const std::string type = Str(j, "type");
  if (type == "Sequence") {
    const json& list = j.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i) {
      L2L_RETURN_IF_ERROR(ParseNormalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]", out));
    }
    return Status::Ok();
  }
  auto n = ParseNormalization(type);
  if (!n.ok()) return n.status().WithContext(where);
  out->push_back(*n);
  return Status::Ok();
}

Status ParsePostProcessor(const json& j, const std::string& where, int64_t n_ids, std::vector<int32_t>* prefix,
                          std::vector<int32_t>* suffix) {
  if (j.is_null()) return Status::Ok();
  const std::string type = Str(j, "type");
  if (type == "ByteLevel") return Status::Ok();  // offsets only
  if (type == "Sequence") {
    const json& list = j.at("processors");
    for (size_t i = 0; i < list.size(); ++i) {
      L2L_RETURN_IF_ERROR(
          ParsePostProcessor(list[i], where + ".processors[" + std::to_string(i) + "]", n_ids, prefix, suffix));
    }
    return Status::Ok();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    L2L_ASSIGN_OR_RETURN(const int32_t cls, JsonTokenId(j.at("cls").at(1), n_ids, where + ".cls[1]"));
    L2L_ASSIGN_OR_RETURN(const int32_t sep, JsonTokenId(j.at("sep").at(1), n_ids, where + ".sep[1]"));
    prefix->push_back(cls);
    suffix->push_back(sep);
    return Status::Ok();
  }
  if (type == "TemplateProcessing") {
    const json& single = j.at("single");
    const json& specials = j.at("special_tokens");
    bool seen_sequence = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& item = single[i];
      if (item.contains("Sequence")) {
        if (item.at("Sequence").at("id").get<std::string>() != "A") {
          return InvalidArgument(where + ".single[" + std::to_string(i) + "]: a single-sequence template names sequence B");
        }
        seen_sequence = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      auto it = specials.find(name);
      if (it == specials.end()) {
        return InvalidArgument(where + ".single[" + std::to_string(i) + "]: special token \"" + name +
                               "\" is not in special_tokens");
      }
      const json& ids = it->at("ids");
      for (size_t k = 0; k < ids.size(); ++k) {
        L2L_ASSIGN_OR_RETURN(const int32_t id,
                             JsonTokenId(ids[k], n_ids, where + ".special_tokens[\"" + name + "\"].ids[" + std::to_string(k) + "]"));
        (seen_sequence ? suffix : prefix)->push_back(id);
      }
    }
    return Status::Ok();
  }
  return Unimplemented(where + ": post-processor type \"" + type + "\" is not supported");
}

Status CheckDecoder(const json& j, const std::string& where) {
  if (j.is_null()) return Status::Ok();  // tokens concatenated: the same bytes for byte-level
  const std::string type = Str(j, "type");
  if (type == "ByteLevel") return Status::Ok();
  if (type == "Sequence") {
    const json& list = j.at("decoders");
    for (size_t i = 0; i < list.size(); ++i) L2L_RETURN_IF_ERROR(CheckDecoder(list[i], where + ".decoders[" + std::to_string(i) + "]"));
    return Status::Ok();
  }
  return Unimplemented(where + ": decoder type \"" + type + "\" is not supported (ByteLevel is)");
}

// ---- SentencePiece-style (byte_fallback) pieces --------------------------------------

constexpr const char* kSpace = "\xE2\x96\x81";  // "▁"

bool IsStringPattern(const json& j, const char* s) {
  return j.is_object() && j.contains("String") && j.at("String").is_string() && j.at("String").get<std::string>() == s;
}

Status ParseSpmNormalizer(const json& j, const std::string& where, BpeSpec* spec) {
  if (j.is_null()) return Status::Ok();
  const std::string type = Str(j, "type");
  if (type == "Sequence") {
    const json& list = j.at("normalizers");
    for (size_t i = 0; i < list.size(); ++i) {
      L2L_RETURN_IF_ERROR(ParseSpmNormalizer(list[i], where + ".normalizers[" + std::to_string(i) + "]", spec));
    }
    return Status::Ok();
  }
  if (type == "Prepend") {
    if (Str(j, "prepend") != kSpace) return Unimplemented(where + ": Prepend of anything but \"▁\" is not supported");
    spec->space_prefix = SpacePrefix::kAlways;
    return Status::Ok();
  }
  if (type == "Replace") {
    if (!IsStringPattern(j.at("pattern"), " ") || Str(j, "content") != kSpace) {
      return Unimplemented(where + ": only Replace(\" \", \"▁\") is supported");
    }
    spec->escape_spaces = true;
    return Status::Ok();
  }
  auto n = ParseNormalization(type);
  if (!n.ok()) return n.status().WithContext(where);
  if (spec->escape_spaces || spec->space_prefix != SpacePrefix::kNone) {
    return Unimplemented(where + ": a Unicode normalizer after Prepend / Replace is not supported");
  }
  spec->normalizers.push_back(*n);
  return Status::Ok();
}

Status ParseSpmPreTokenizer(const json& j, const std::string& where, BpeSpec* spec) {
  if (j.is_null()) return Status::Ok();
  const std::string type = Str(j, "type");
  if (type == "Sequence") {
    const json& list = j.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      L2L_RETURN_IF_ERROR(ParseSpmPreTokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]", spec));
    }
    return Status::Ok();
  }
  if (type == "Metaspace") {
    if (Str(j, "replacement") != kSpace) return Unimplemented(where + ": a Metaspace replacement other than \"▁\"");
    if (!spec->pre_tokenizer.empty() || spec->escape_spaces || spec->space_prefix != SpacePrefix::kNone) {
      return Unimplemented(where + ": Metaspace after other pre-tokenizers or space normalizers is not supported");
    }
    std::string scheme = Str(j, "prepend_scheme");
    if (scheme.empty()) scheme = Bool(j, "add_prefix_space", true) ? "always" : "never";  // tokenizers < 0.14
    if (scheme == "always") {
      spec->space_prefix = SpacePrefix::kMetaspaceAlways;
    } else if (scheme == "first") {
      spec->space_prefix = SpacePrefix::kMetaspaceFirst;
    } else if (scheme != "never") {
      return InvalidArgument(where + ".prepend_scheme: \"" + scheme + "\" (always, first, never)");
    }
    spec->escape_spaces = true;
    spec->metaspace_split = Bool(j, "split", true);
    return Status::Ok();
  }
  if (type == "Split") return ParsePreTokenizer(j, where, &spec->pre_tokenizer);
  return Unimplemented(where + ": pre-tokenizer type \"" + type +
                       "\" in a SentencePiece-style tokenizer is not supported (Metaspace, Split, Sequence are)");
}

Status ParseSpmDecoder(const json& j, const std::string& where, BpeSpec* spec) {
  if (j.is_null()) return Status::Ok();
  const std::string type = Str(j, "type");
  if (type == "Sequence") {
    const json& list = j.at("decoders");
    for (size_t i = 0; i < list.size(); ++i) {
      L2L_RETURN_IF_ERROR(ParseSpmDecoder(list[i], where + ".decoders[" + std::to_string(i) + "]", spec));
    }
    return Status::Ok();
  }
  if (type == "ByteFallback" || type == "Fuse") return Status::Ok();
  if (type == "Replace" && IsStringPattern(j.at("pattern"), kSpace) && Str(j, "content") == " ") return Status::Ok();
  if (type == "Strip" && Str(j, "content") == " " && j.value("start", 0) <= 1 && j.value("stop", 0) == 0) {
    spec->decode_strip_space = j.value("start", 0) == 1;
    return Status::Ok();
  }
  if (type == "Metaspace" && Str(j, "replacement") == kSpace) {
    std::string scheme = Str(j, "prepend_scheme");
    if (scheme.empty()) scheme = Bool(j, "add_prefix_space", true) ? "always" : "never";
    spec->decode_strip_space = scheme != "never";
    return Status::Ok();
  }
  return Unimplemented(where + ": decoder type \"" + type +
                       "\" in a SentencePiece-style tokenizer is not supported (Replace(\"▁\", \" \"), ByteFallback, "
                       "Fuse, Strip(\" \", 1, 0), Metaspace are)");
}

Result<BpeSpec> SpecFromJson(const json& root, const std::string& what) {
  BpeSpec spec;
  const json& model = root.at("model");
  const std::string mtype = Str(model, "type");
  if (!mtype.empty() && mtype != "BPE") {
    return Unimplemented(what + ": model.type \"" + mtype + "\" is not supported (only BPE)" +
                         (mtype == "WordPiece" ? "; a WordPiece (BERT) tokenizer loads with tok::WordPieceTokenizer" : ""));
  }
  if (Bool(model, "byte_fallback", false)) {
    spec.model = BpeModel::kSentencePiece;
    spec.escape_spaces = false;  // set by a Replace normalizer or a Metaspace pre-tokenizer
    spec.fuse_unk = Bool(model, "fuse_unk", false);
  }
  const bool spm = spec.model == BpeModel::kSentencePiece;
  if (!Str(model, "continuing_subword_prefix").empty() || !Str(model, "end_of_word_suffix").empty()) {
    return Unimplemented(what + ": model.continuing_subword_prefix / end_of_word_suffix are not supported");
  }
  if (model.contains("dropout") && !model.at("dropout").is_null()) {
    return Unimplemented(what + ": model.dropout is not supported (encoding would be random)");
  }
  spec.ignore_merges = Bool(model, "ignore_merges", false);
  if (!model.at("vocab").is_object()) return InvalidArgument(what + ": model.vocab is not an object {token: id}");
  const int64_t n_ids = TokenizerJsonIdCount(root);
  for (const auto& [tok, id_json] : model.at("vocab").items()) {
    L2L_ASSIGN_OR_RETURN(const int32_t id, JsonTokenId(id_json, n_ids, what + ": model.vocab[\"" + tok + "\"]"));
    if (static_cast<size_t>(id) >= spec.tokens.size()) spec.tokens.resize(static_cast<size_t>(id) + 1);
    if (!spec.tokens[id].empty()) {
      return InvalidArgument(what + ": model.vocab id " + std::to_string(id) + " is given to both \"" + spec.tokens[id] +
                             "\" and \"" + tok + "\"");
    }
    spec.tokens[id] = tok;
  }
  const json& merges = model.at("merges");
  spec.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& mj = merges[i];
    if (mj.is_string()) {
      const std::string s = mj.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return InvalidArgument(what + ": model.merges[" + std::to_string(i) + "] \"" + s + "\" is not \"a b\"");
      }
      spec.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (mj.is_array() && mj.size() == 2) {
      spec.merges.emplace_back(mj[0].get<std::string>(), mj[1].get<std::string>());
    } else {
      return InvalidArgument(what + ": model.merges[" + std::to_string(i) + "] is neither \"a b\" nor [a, b]");
    }
  }
  if (root.contains("added_tokens")) {
    const json& list = root.at("added_tokens");
    for (size_t i = 0; i < list.size(); ++i) {
      const json& a = list[i];
      AddedToken t;
      L2L_ASSIGN_OR_RETURN(t.id, JsonTokenId(a.at("id"), n_ids, what + ": added_tokens[" + std::to_string(i) + "].id"));
      t.content = a.at("content").get<std::string>();
      t.special = Bool(a, "special", false);
      t.lstrip = Bool(a, "lstrip", false);
      t.rstrip = Bool(a, "rstrip", false);
      t.normalized = Bool(a, "normalized", !t.special);
      t.single_word = Bool(a, "single_word", false);
      spec.added_tokens.push_back(std::move(t));
    }
  }
  if (spm) {
    if (root.contains("normalizer")) L2L_RETURN_IF_ERROR(ParseSpmNormalizer(root.at("normalizer"), what + ": normalizer", &spec));
    if (root.contains("pre_tokenizer")) L2L_RETURN_IF_ERROR(ParseSpmPreTokenizer(root.at("pre_tokenizer"), what + ": pre_tokenizer", &spec));
    if (root.contains("decoder")) L2L_RETURN_IF_ERROR(ParseSpmDecoder(root.at("decoder"), what + ": decoder", &spec));
    const std::string unk = Str(model, "unk_token");
    if (!unk.empty()) {
      auto it = model.at("vocab").find(unk);
      if (it == model.at("vocab").end()) return InvalidArgument(what + ": model.unk_token \"" + unk + "\" is not in model.vocab");
      L2L_ASSIGN_OR_RETURN(spec.unk_id, JsonTokenId(*it, n_ids, what + ": model.vocab[\"" + unk + "\"]"));
    }
  } else {
    if (root.contains("normalizer")) L2L_RETURN_IF_ERROR(ParseNormalizer(root.at("normalizer"), what + ": normalizer", &spec.normalizers));
    if (root.contains("pre_tokenizer")) L2L_RETURN_IF_ERROR(ParsePreTokenizer(root.at("pre_tokenizer"), what + ": pre_tokenizer", &spec.pre_tokenizer));
  }
  if (root.contains("post_processor")) {
    L2L_RETURN_IF_ERROR(ParsePostProcessor(root.at("post_processor"), what + ": post_processor", n_ids, &spec.prefix_ids, &spec.suffix_ids));
  }
  if (!spm && root.contains("decoder")) L2L_RETURN_IF_ERROR(CheckDecoder(root.at("decoder"), what + ": decoder"));
  if (spec.prefix_ids.size() == 1) spec.bos_id = spec.prefix_ids[0];
  return spec;
}

}  // namespace

Result<Tokenizer> Tokenizer::FromTokenizerJsonText(std::string_view text, const std::string& what) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return InvalidArgument(what + ": not a JSON object (tokenizer.json)");
  Result<BpeSpec> spec = InvalidArgument("unset");
  try {
    spec = SpecFromJson(root, what);
  } catch (const json::exception& e) {
    return InvalidArgument(what + ": malformed tokenizer.json: " + e.what());
  }
  if (!spec.ok()) return spec.status();
  return Create(std::move(spec).value(), what);
}

Result<Tokenizer> Tokenizer::FromTokenizerJson(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(BpeSpec spec, SpecFromTokenizerJson(path));
  std::error_code ec;
  const std::string what =
      std::filesystem::is_directory(path, ec) ? (std::filesystem::path(path) / "tokenizer.json").string() : path;
  return Create(std::move(spec), what);
}

Result<BpeSpec> Tokenizer::SpecFromTokenizerJson(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  std::string config_file;  // the model directory's tokenizer_config.json, when there is one
  if (std::filesystem::is_directory(path, ec)) {
    file = (std::filesystem::path(path) / "tokenizer.json").string();
    if (!std::filesystem::exists(file, ec)) return NotFound(path + ": a directory without tokenizer.json");
    config_file = (std::filesystem::path(path) / "tokenizer_config.json").string();
    if (!std::filesystem::exists(config_file, ec)) config_file.clear();
  }
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return InvalidArgument(file + ": not a JSON object (tokenizer.json)");
  Result<BpeSpec> spec = InvalidArgument("unset");
  try {
    spec = SpecFromJson(root, file);
  } catch (const json::exception& e) {
    return InvalidArgument(file + ": malformed tokenizer.json: " + e.what());
  }
  if (!spec.ok()) return spec.status();
  if (!config_file.empty()) {
    // tokenizer_config.json names the EOS (and BOS) tokens, which tokenizer.json lacks.
    L2L_ASSIGN_OR_RETURN(std::string ctext, ReadFileToString(config_file));
    const json config = json::parse(ctext, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) return InvalidArgument(config_file + ": not a JSON object");
    auto token_id = [&](const char* key) -> Result<int32_t> {
      auto it = config.find(key);
      if (it == config.end() || it->is_null()) return -1;
      std::string content;
      if (it->is_string()) {
        content = it->get<std::string>();
      } else if (it->is_object() && it->contains("content") && it->at("content").is_string()) {
        content = it->at("content").get<std::string>();
      } else {
        return InvalidArgument(config_file + ": \"" + key + "\" is neither a string nor {\"content\": ...}");
      }
      for (const AddedToken& t : spec->added_tokens) {
        if (t.content == content) return t.id;
      }
      for (size_t id = 0; id < spec->tokens.size(); ++id) {
        if (spec->tokens[id] == content) return static_cast<int32_t>(id);
      }
      return InvalidArgument(config_file + ": " + key + " \"" + content + "\" is not a token of " + file);
    };
    L2L_ASSIGN_OR_RETURN(int32_t eos, token_id("eos_token"));
    L2L_ASSIGN_OR_RETURN(int32_t bos, token_id("bos_token"));
    if (eos >= 0) spec->eos_id = eos;
    if (bos >= 0) spec->bos_id = bos;
  }
  return spec;
}

// ---- export ----------------------------------------------------------------------------

namespace {

const char* BehaviorName(SplitBehavior b) {
  switch (b) {
    case SplitBehavior::kIsolated: return "Isolated";
    case SplitBehavior::kRemoved: return "Removed";
    case SplitBehavior::kMergedWithPrevious: return "MergedWithPrevious";
    case SplitBehavior::kMergedWithNext: return "MergedWithNext";
    case SplitBehavior::kContiguous: return "Contiguous";
  }
  return "Isolated";
}

const char* NormalizationName(Normalization n) {
  switch (n) {
    case Normalization::kNFC: return "NFC";
    case Normalization::kNFD: return "NFD";
    case Normalization::kNFKC: return "NFKC";
    case Normalization::kNFKD: return "NFKD";
  }
  return "NFC";
}

// A SentencePiece spec's merges: every split of a piece (not control, not byte) into two
// pieces, ordered by the piece's score, highest first (ties: the longer left part, the
// longer right part, then by id and the parts' ids), as transformers' generate_merges
// makes them. With merges already in
// the spec, those.
std::vector<std::pair<std::string, std::string>> SpmMerges(const BpeSpec& spec) {
  if (spec.scores.empty()) return spec.merges;
  std::unordered_map<std::string_view, int32_t> ids;
  auto mergeable = [&](size_t id) {
    const int32_t type = spec.token_types.empty() ? 1 : spec.token_types[id];
    return !spec.tokens[id].empty() && type != 3 && type != 6;
  };
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (mergeable(id)) ids.emplace(spec.tokens[id], static_cast<int32_t>(id));
  }
  struct M {
    float score;
    int32_t id, left, right;
    size_t split, left_chars, right_chars;  // split: bytes; *_chars: code points
  };
  auto chars = [](std::string_view s) {
    size_t n = 0;
    for (char c : s) n += (static_cast<unsigned char>(c) >> 6) != 0x2;
    return n;
  };
  std::vector<M> all;
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (!mergeable(id)) continue;
    const std::string_view t = spec.tokens[id];
    for (size_t k = 1; k < t.size(); ++k) {
      if ((static_cast<unsigned char>(t[k]) >> 6) == 0x2) continue;  // inside a character
      auto l = ids.find(t.substr(0, k));
      auto r = ids.find(t.substr(k));
      if (l != ids.end() && r != ids.end()) {
        all.push_back({spec.scores[id], static_cast<int32_t>(id), l->second, r->second, k, chars(t.substr(0, k)),
                       chars(t.substr(k))});
      }
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const M& a, const M& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    if (a.right_chars != b.right_chars) return a.right_chars > b.right_chars;
    if (a.id != b.id) return a.id < b.id;
    return a.left != b.left ? a.left < b.left : a.right < b.right;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(all.size());
  for (const M& m : all) out.emplace_back(spec.tokens[m.id].substr(0, m.split), spec.tokens[m.id].substr(m.split));
  return out;
}

}  // namespace

std::string BpeSpecToTokenizerJson(const BpeSpec& spec) {
  const bool spm = spec.model == BpeModel::kSentencePiece;
  json added = json::array();
  std::vector<std::string> content(spec.tokens);  // id -> token text, added tokens included
  for (const AddedToken& t : spec.added_tokens) {
    added.push_back({{"id", t.id}, {"content", t.content}, {"single_word", t.single_word}, {"lstrip", t.lstrip},
                     {"rstrip", t.rstrip}, {"normalized", t.normalized}, {"special", t.special}});
    if (static_cast<size_t>(t.id) >= content.size()) content.resize(static_cast<size_t>(t.id) + 1);
    content[t.id] = t.content;
  }
  json normalizer = nullptr;
  if (spec.normalizers.size() == 1) {
    normalizer = {{"type", NormalizationName(spec.normalizers[0])}};
  } else if (!spec.normalizers.empty()) {
    json list = json::array();
    for (Normalization n : spec.normalizers) list.push_back({{"type", NormalizationName(n)}});
    normalizer = {{"type", "Sequence"}, {"normalizers", list}};
  }
  if (spm) {
    json list = json::array();
    for (Normalization n : spec.normalizers) list.push_back({{"type", NormalizationName(n)}});
    if (spec.space_prefix == SpacePrefix::kAlways) list.push_back({{"type", "Prepend"}, {"prepend", kSpace}});
    if (spec.escape_spaces) list.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}});
    normalizer = list.empty() ? json(nullptr) : json{{"type", "Sequence"}, {"normalizers", list}};
  }
  json steps = json::array();
  for (const PreTokenizerStep& s : spec.pre_tokenizer) {
    if (s.kind == PreTokenizerStep::Kind::kByteLevel) {
      steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", s.add_prefix_space}, {"trim_offsets", true},
                       {"use_regex", s.use_regex}});
    } else {
      steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", s.regex}}}, {"behavior", BehaviorName(s.behavior)},
                       {"invert", s.invert}});
    }
  }
  json post = nullptr;
  if (!spec.prefix_ids.empty() || !spec.suffix_ids.empty()) {
    json single = json::array(), pair = json::array(), specials = json::object();
    auto special = [&](int32_t id, int type_id) {
      const std::string& name = content[id];
      specials[name] = {{"id", name}, {"ids", {id}}, {"tokens", {name}}};
      return json{{"SpecialToken", {{"id", name}, {"type_id", type_id}}}};
    };
    for (int32_t id : spec.prefix_ids) single.push_back(special(id, 0)), pair.push_back(special(id, 0));
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    pair.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    for (int32_t id : spec.suffix_ids) single.push_back(special(id, 0)), pair.push_back(special(id, 0));
    for (int32_t id : spec.prefix_ids) pair.push_back(special(id, 1));
    pair.push_back({{"Sequence", {{"id", "B"}, {"type_id", 1}}}});
    for (int32_t id : spec.suffix_ids) pair.push_back(special(id, 1));
    post = {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};
  }
  json vocab = json::object();
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (!spec.tokens[id].empty()) vocab[spec.tokens[id]] = id;
  }
  json merges = json::array();
  for (const auto& [a, b] : spm ? SpmMerges(spec) : spec.merges) merges.push_back({a, b});
  json decoder = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  if (spm) {
    json list = {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                 {{"type", "ByteFallback"}},
                 {{"type", "Fuse"}}};
    if (spec.decode_strip_space) list.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    decoder = {{"type", "Sequence"}, {"decoders", list}};
  }
  const bool has_unk = spm && spec.unk_id >= 0 && static_cast<size_t>(spec.unk_id) < content.size();
  const json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", normalizer},
      {"pre_tokenizer", steps.empty() ? json(nullptr) : json{{"type", "Sequence"}, {"pretokenizers", steps}}},
      {"post_processor", post},
      {"decoder", decoder},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", has_unk ? json(content[spec.unk_id]) : json(nullptr)},
        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", spm && spec.fuse_unk},
        {"byte_fallback", spm},
        {"ignore_merges", spec.ignore_merges}, {"vocab", vocab}, {"merges", merges}}},
  };
  return root.dump(1);
}

}  // namespace l2l::tok
