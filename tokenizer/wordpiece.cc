// WordPiece tokenizer from tokenizer.json. See tokenizer/wordpiece.h.
//
// Unicode properties come from ICU: White_Space (Rust's char::is_whitespace), general
// categories (Cc Cf Cs Co for clean_text's control characters, P* for punctuation, Mn for accents),
// NFD and full per-character lowercasing (Rust's char::to_lowercase, no final-sigma context).
//
// Thread-safety: the tables are read-only after FromTokenizerJson.
#include "tokenizer/wordpiece.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include "common/file_util.h"
#include "common/json_util.h"
#include "tokenizer/json_ids.h"
#include "tokenizer/utf8.h"

namespace l2l::tok {
namespace {

using json = nlohmann::json;
using CodePoints = std::vector<UChar32>;

bool DecodeUtf8(std::string_view s, CodePoints* out) {
  const int32_t n = static_cast<int32_t>(s.size());
  int32_t i = 0;
  while (i < n) {
    UChar32 c;
    U8_NEXT(reinterpret_cast<const uint8_t*>(s.data()), i, n, c);
    if (c < 0) return false;
    out->push_back(c);
  }
  return true;
}

bool IsWhitespace(UChar32 c) { return c == '\t' || c == '\n' || c == '\r' || u_isUWhiteSpace(c); }

// clean_text's "control": categories Cc, Cf, Cs, Co except \t \n \r. Unassigned code
// points (Cn) are kept, as HF's tables list only assigned characters.
bool IsControl(UChar32 c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  switch (u_charType(c)) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
      return true;
    default:
      return false;
  }
}

// The CJK ideograph blocks HF's BertNormalizer puts spaces around (its table, as is).
bool IsChineseChar(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BertPreTokenizer's punctuation: ASCII punctuation (which includes $ + < = > ^ ` | ~) or
// a Unicode P* category.
bool IsPunctuation(UChar32 c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  switch (u_charType(c)) {
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_CONNECTOR_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

void AppendLower(UChar32 c, CodePoints* out) {
  if (c < 0x80) {
    out->push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  UChar src[2];
  int32_t n = 0;
  U16_APPEND_UNSAFE(src, n, c);
  UChar dst[8];
  UErrorCode err = U_ZERO_ERROR;
  const int32_t m = u_strToLower(dst, 8, src, n, "", &err);
  if (U_FAILURE(err) || m > 8) {
    out->push_back(c);
    return;
  }
  for (int32_t i = 0; i < m;) {
    UChar32 d;
    U16_NEXT(dst, i, m, d);
    out->push_back(d);
  }
}

struct AddedTok {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool normalized = false;
};

// One piece of a post-processor template.
struct TemplatePiece {
  bool special = false;
  std::vector<int32_t> ids;  // special: the token ids it stands for
  int sequence = 0;          // not special: 0 = A, 1 = B
  int32_t type_id = 0;
};

std::string Str(const json& j, const char* key, const std::string& def = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : def;
}

Status CheckKeys(const json& j, const std::string& where, std::initializer_list<const char*> known) {
  for (const auto& item : j.items()) {
    const std::string& key = item.key();  // not a structured binding: clang < 16 cannot capture one
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return key == k; }) == known.end()) {
      return Unimplemented(where + "." + key + " is not supported by the WordPiece tokenizer");
    }
  }
  return Status::Ok();
}

}  // namespace

struct WordPieceTokenizer::Impl {
  std::string what;
  std::unordered_map<std::string, int32_t> vocab;  // model vocabulary and added tokens
  std::vector<std::string> tokens;                 // id -> text
  std::vector<uint8_t> special;                    // id -> special added token
  std::vector<AddedTok> added;                     // sorted by content length, longest first
  std::unordered_set<UChar32> added_first;         // first code points of the added tokens
  int32_t unk = -1;
  std::string prefix = "##";
  int64_t max_chars = 100;
  // BertNormalizer (absent: no normalization).
  bool normalize = false, clean_text = true, chinese = true, strip_accents = true, lowercase = true;
  // Post-processor.
  bool has_template = false;
  std::vector<TemplatePiece> single, pair;
  // Decoder.
  bool wordpiece_decoder = false;
  std::string decoder_prefix = "##";
  bool cleanup = true;

  int32_t Lookup(std::string_view s) const {
    auto it = vocab.find(std::string(s));
    return it == vocab.end() ? -1 : it->second;
  }

  CodePoints Normalize(const CodePoints& in) const {
    if (!normalize) return in;
    CodePoints a;
    a.reserve(in.size());
    for (UChar32 c : in) {
      if (clean_text) {
        if (c == 0 || c == 0xFFFD || IsControl(c)) continue;
        if (IsWhitespace(c)) c = ' ';
      }
      if (chinese && IsChineseChar(c)) {
        a.push_back(' ');
        a.push_back(c);
        a.push_back(' ');
      } else {
        a.push_back(c);
      }
    }
    if (strip_accents) {
      UErrorCode err = U_ZERO_ERROR;
      const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(err);
      icu::UnicodeString s;
      for (UChar32 c : a) s.append(c);
      icu::UnicodeString d = nfd->normalize(s, err);
      a.clear();
      for (int32_t i = 0; i < d.length();) {
        const UChar32 c = d.char32At(i);
        i += U16_LENGTH(c);
        if (u_charType(c) != U_NON_SPACING_MARK) a.push_back(c);
      }
    }
    if (lowercase) {
      CodePoints b;
      b.reserve(a.size());
      for (UChar32 c : a) AppendLower(c, &b);
      return b;
    }
    return a;
  }

  // WordPiece on one pre-tokenized word.
  void EncodeWord(const CodePoints& word, std::vector<int32_t>* out) const {
    if (static_cast<int64_t>(word.size()) > max_chars) {
      out->push_back(unk);
      return;
    }
    std::string utf8;
    std::vector<size_t> off;  // byte offset of each character, and the end
    for (UChar32 c : word) {
      off.push_back(utf8.size());
      AppendUtf8(static_cast<uint32_t>(c), &utf8);
    }
    off.push_back(utf8.size());
    const size_t first = out->size();
    size_t start = 0;
    std::string sub;
    while (start < word.size()) {
      size_t end = word.size();
      int32_t found = -1;
      while (start < end) {
        sub.clear();
        if (start > 0) sub = prefix;
        sub.append(utf8, off[start], off[end] - off[start]);
        found = Lookup(sub);
        if (found >= 0) break;
        --end;
      }
      if (found < 0) {
        out->resize(first);
        out->push_back(unk);
        return;
      }
      out->push_back(found);
      start = end;
    }
  }

  // Normalizer, pre-tokenizer and model on text between added tokens.
  void EncodePlain(const CodePoints& text, std::vector<int32_t>* out) const {
    const CodePoints norm = Normalize(text);
    // normalized=true added tokens are matched in the normalized text.
    std::vector<std::pair<size_t, const AddedTok*>> hits;
    size_t pos = 0;
    CodePoints word;
    auto flush_words = [&](size_t from, size_t to) {
      word.clear();
      for (size_t i = from; i < to; ++i) {
        const UChar32 c = norm[i];
        if (IsWhitespace(c)) {
          if (!word.empty()) EncodeWord(word, out);
          word.clear();
        } else if (IsPunctuation(c)) {
          if (!word.empty()) EncodeWord(word, out);
          word.assign(1, c);
          EncodeWord(word, out);
          word.clear();
        } else {
          word.push_back(c);
        }
      }
      if (!word.empty()) EncodeWord(word, out);
    };
    size_t i = 0;
    while (i < norm.size()) {
      const AddedTok* t = MatchAt(norm, i, /*normalized=*/true);
      if (t == nullptr) {
        ++i;
        continue;
      }
      flush_words(pos, i);
      out->push_back(t->id);
      i += CodePointCount(t->content);
      pos = i;
    }
    flush_words(pos, norm.size());
  }

  static size_t CodePointCount(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  // The longest added token (of the given `normalized` kind) starting at text[i].
  const AddedTok* MatchAt(const CodePoints& text, size_t i, bool normalized) const {
    if (added_first.count(text[i]) == 0) return nullptr;
    const AddedTok* best = nullptr;
    for (const AddedTok& t : added) {  // longest first: the first match is the longest
      if (t.normalized != normalized) continue;
      size_t k = i;
      int32_t j = 0;
      const int32_t n = static_cast<int32_t>(t.content.size());
      bool ok = true;
      while (j < n) {
        UChar32 c;
        U8_NEXT(reinterpret_cast<const uint8_t*>(t.content.data()), j, n, c);
        if (k >= text.size() || text[k] != c) {
          ok = false;
          break;
        }
        ++k;
      }
      if (ok) {
        best = &t;
        break;
      }
    }
    return best;
  }

  Result<std::vector<int32_t>> EncodeSequence(std::string_view text) const {
    CodePoints cps;
    if (!DecodeUtf8(text, &cps)) return InvalidArgument(what + ": text to encode is not valid UTF-8");
    std::vector<int32_t> out;
    size_t pos = 0, i = 0;
    CodePoints piece;
    while (i < cps.size()) {
      const AddedTok* t = MatchAt(cps, i, /*normalized=*/false);
      if (t == nullptr) {
        ++i;
        continue;
      }
      piece.assign(cps.begin() + static_cast<ptrdiff_t>(pos), cps.begin() + static_cast<ptrdiff_t>(i));
      EncodePlain(piece, &out);
      out.push_back(t->id);
      i += CodePointCount(t->content);
      pos = i;
    }
    piece.assign(cps.begin() + static_cast<ptrdiff_t>(pos), cps.end());
    EncodePlain(piece, &out);
    return out;
  }

  WordPieceEncoding Apply(const std::vector<int32_t>* seqs[2], bool is_pair, bool add_special) const {
    WordPieceEncoding e;
    if (!has_template) {
      for (int s = 0; s < (is_pair ? 2 : 1); ++s) {
        e.ids.insert(e.ids.end(), seqs[s]->begin(), seqs[s]->end());
        e.type_ids.insert(e.type_ids.end(), seqs[s]->size(), s);
      }
      return e;
    }
    for (const TemplatePiece& p : is_pair ? pair : single) {
      if (p.special) {
        if (!add_special) continue;
        e.ids.insert(e.ids.end(), p.ids.begin(), p.ids.end());
        e.type_ids.insert(e.type_ids.end(), p.ids.size(), p.type_id);
      } else {
        const std::vector<int32_t>& s = *seqs[p.sequence];
        e.ids.insert(e.ids.end(), s.begin(), s.end());
        e.type_ids.insert(e.type_ids.end(), s.size(), p.type_id);
      }
    }
    return e;
  }

  // A template's "type_id": absent is 0; token type ids are stored as bytes (rows files).
  static Result<int32_t> TypeId(const json& item, const std::string& where) {
    auto it = item.find("type_id");
    if (it == item.end() || it->is_null()) return 0;
    L2L_ASSIGN_OR_RETURN(const int64_t t, JsonToInt(*it, 0, 255, where + ".type_id"));
    return static_cast<int32_t>(t);
  }

  Status ParseTemplate(const json& list, const json& specials, const std::string& where, bool is_pair,
                       int64_t n_ids, std::vector<TemplatePiece>* out) {
    bool seen[2] = {false, false};
    for (size_t i = 0; i < list.size(); ++i) {
      const json& item = list[i];
      const std::string at = where + "[" + std::to_string(i) + "]";
      TemplatePiece p;
      if (item.contains("Sequence")) {
        const std::string id = item.at("Sequence").at("id").get<std::string>();
        if (id != "A" && id != "B") return InvalidArgument(at + ".Sequence.id \"" + id + "\" is neither A nor B");
        p.sequence = id == "A" ? 0 : 1;
        if (p.sequence == 1 && !is_pair) return InvalidArgument(at + ": a single-sequence template names sequence B");
        seen[p.sequence] = true;
        L2L_ASSIGN_OR_RETURN(p.type_id, TypeId(item.at("Sequence"), at + ".Sequence"));
      } else if (item.contains("SpecialToken")) {
        p.special = true;
        const std::string name = item.at("SpecialToken").at("id").get<std::string>();
        auto it = specials.find(name);
        if (it == specials.end()) return InvalidArgument(at + ": special token \"" + name + "\" is not in special_tokens");
        const json& ids = it->at("ids");
        if (!ids.is_array()) return InvalidArgument(at + ": special_tokens[\"" + name + "\"].ids is not a list");
        for (size_t k = 0; k < ids.size(); ++k) {
          L2L_ASSIGN_OR_RETURN(const int32_t id, JsonTokenId(ids[k], n_ids, at + ": special_tokens[\"" + name + "\"].ids[" +
                                                                                    std::to_string(k) + "]"));
          p.ids.push_back(id);
        }
        L2L_ASSIGN_OR_RETURN(p.type_id, TypeId(item.at("SpecialToken"), at + ".SpecialToken"));
      } else {
        return InvalidArgument(at + ": neither Sequence nor SpecialToken");
      }
      out->push_back(std::move(p));
    }
    if (!seen[0] || (is_pair && !seen[1])) return InvalidArgument(where + ": the template does not place every sequence");
    return Status::Ok();
  }

  Status Parse(const json& root) {
    L2L_RETURN_IF_ERROR(CheckKeys(root, what + ": ", {"version", "truncation", "padding", "added_tokens", "normalizer",
                                                      "pre_tokenizer", "post_processor", "decoder", "model"}));
    const json& model = root.at("model");
    const std::string mtype = Str(model, "type");
    if (mtype != "WordPiece") return InvalidArgument(what + ": model.type \"" + mtype + "\" is not WordPiece");
    L2L_RETURN_IF_ERROR(CheckKeys(model, what + ": model", {"type", "unk_token", "continuing_subword_prefix",
                                                              "max_input_chars_per_word", "vocab"}));
    prefix = Str(model, "continuing_subword_prefix", "##");
    if (auto m = model.find("max_input_chars_per_word"); m != model.end() && !m->is_null()) {
      L2L_ASSIGN_OR_RETURN(max_chars, JsonToInt(*m, 0, std::numeric_limits<int64_t>::max(),
                                                what + ": model.max_input_chars_per_word"));
    }
    if (!model.at("vocab").is_object()) return InvalidArgument(what + ": model.vocab is not an object {token: id}");
    const int64_t n_ids = TokenizerJsonIdCount(root);
    for (const auto& [tok, id_json] : model.at("vocab").items()) {
      L2L_ASSIGN_OR_RETURN(const int32_t id, JsonTokenId(id_json, n_ids, what + ": model.vocab[\"" + tok + "\"]"));
      if (static_cast<size_t>(id) >= tokens.size()) tokens.resize(static_cast<size_t>(id) + 1);
      if (!tokens[id].empty()) {
        return InvalidArgument(what + ": model.vocab id " + std::to_string(id) + " is given to both \"" + tokens[id] +
                               "\" and \"" + tok + "\"");
      }
      tokens[id] = tok;
      vocab[tok] = static_cast<int32_t>(id);
    }
    const std::string unk_token = Str(model, "unk_token", "[UNK]");
    auto uit = vocab.find(unk_token);
    if (uit == vocab.end()) return InvalidArgument(what + ": model.unk_token \"" + unk_token + "\" is not in model.vocab");
    unk = uit->second;
    special.assign(tokens.size(), 0);
    if (root.contains("added_tokens")) {
      const json& list = root.at("added_tokens");
      for (size_t i = 0; i < list.size(); ++i) {
        const json& a = list[i];
        const std::string at = what + ": added_tokens[" + std::to_string(i) + "]";
        for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
          if (a.value(flag, false)) return Unimplemented(at + "." + flag + " true is not supported by the WordPiece tokenizer");
        }
        AddedTok t;
        L2L_ASSIGN_OR_RETURN(t.id, JsonTokenId(a.at("id"), n_ids, at + ".id"));
        t.content = a.at("content").get<std::string>();
        t.special = a.value("special", false);
        t.normalized = a.value("normalized", !t.special);
        if (t.content.empty()) return InvalidArgument(at + ".content is empty");
        if (static_cast<size_t>(t.id) >= tokens.size()) {
          tokens.resize(static_cast<size_t>(t.id) + 1);
          special.resize(tokens.size(), 0);
        }
        if (!tokens[t.id].empty() && tokens[t.id] != t.content) {
          return InvalidArgument(at + ": id " + std::to_string(t.id) + " is \"" + tokens[t.id] + "\" in the vocabulary");
        }
        tokens[t.id] = t.content;
        vocab[t.content] = t.id;
        special[t.id] = t.special;
        {
          CodePoints first;
          DecodeUtf8(t.content, &first);
          if (first.empty()) return InvalidArgument(at + ".content is not valid UTF-8");
          added_first.insert(first[0]);
        }
        added.push_back(std::move(t));
      }
      std::stable_sort(added.begin(), added.end(),
                       [](const AddedTok& x, const AddedTok& y) { return x.content.size() > y.content.size(); });
    }
    if (root.contains("normalizer") && !root.at("normalizer").is_null()) {
      const json& n = root.at("normalizer");
      if (Str(n, "type") != "BertNormalizer") {
        return Unimplemented(what + ": normalizer.type \"" + Str(n, "type") + "\" is not supported (BertNormalizer is)");
      }
      L2L_RETURN_IF_ERROR(CheckKeys(n, what + ": normalizer", {"type", "clean_text", "handle_chinese_chars", "strip_accents", "lowercase"}));
      normalize = true;
      clean_text = n.value("clean_text", true);
      chinese = n.value("handle_chinese_chars", true);
      lowercase = n.value("lowercase", true);
      const auto sa = n.find("strip_accents");
      strip_accents = sa == n.end() || sa->is_null() ? lowercase : sa->get<bool>();
    }
    const json pre = root.value("pre_tokenizer", json());
    if (pre.is_null() || Str(pre, "type") != "BertPreTokenizer") {
      return Unimplemented(what + ": pre_tokenizer " + (pre.is_null() ? std::string("null") : "type \"" + Str(pre, "type") + "\"") +
                           " is not supported (BertPreTokenizer is)");
    }
    const json post = root.value("post_processor", json());
    if (!post.is_null()) {
      const std::string type = Str(post, "type");
      if (type == "TemplateProcessing") {
        L2L_RETURN_IF_ERROR(CheckKeys(post, what + ": post_processor", {"type", "single", "pair", "special_tokens"}));
        const json& specials = post.at("special_tokens");
        L2L_RETURN_IF_ERROR(ParseTemplate(post.at("single"), specials, what + ": post_processor.single", false, n_ids, &single));
        L2L_RETURN_IF_ERROR(ParseTemplate(post.at("pair"), specials, what + ": post_processor.pair", true, n_ids, &pair));
        has_template = true;
      } else if (type == "BertProcessing") {
        L2L_RETURN_IF_ERROR(CheckKeys(post, what + ": post_processor", {"type", "sep", "cls"}));
        L2L_ASSIGN_OR_RETURN(const int32_t cls, JsonTokenId(post.at("cls").at(1), n_ids, what + ": post_processor.cls[1]"));
        L2L_ASSIGN_OR_RETURN(const int32_t sep, JsonTokenId(post.at("sep").at(1), n_ids, what + ": post_processor.sep[1]"));
        auto sp = [](int32_t id, int32_t type) { TemplatePiece p; p.special = true; p.ids = {id}; p.type_id = type; return p; };
        auto sq = [](int s) { TemplatePiece p; p.sequence = s; p.type_id = s; return p; };
        single = {sp(cls, 0), sq(0), sp(sep, 0)};
        pair = {sp(cls, 0), sq(0), sp(sep, 0), sq(1), sp(sep, 1)};
        has_template = true;
      } else {
        return Unimplemented(what + ": post_processor.type \"" + type +
                             "\" is not supported (TemplateProcessing, BertProcessing are)");
      }
      for (const auto* t : {&single, &pair}) {
        for (const TemplatePiece& p : *t) {
          for (int32_t id : p.ids) {
            if (id < 0 || static_cast<size_t>(id) >= tokens.size()) {
              return InvalidArgument(what + ": post_processor names id " + std::to_string(id) + ", outside the vocabulary");
            }
          }
        }
      }
    }
    const json dec = root.value("decoder", json());
    if (!dec.is_null()) {
      if (Str(dec, "type") != "WordPiece") {
        return Unimplemented(what + ": decoder.type \"" + Str(dec, "type") + "\" is not supported (WordPiece is)");
      }
      L2L_RETURN_IF_ERROR(CheckKeys(dec, what + ": decoder", {"type", "prefix", "cleanup"}));
      wordpiece_decoder = true;
      decoder_prefix = Str(dec, "prefix", "##");
      cleanup = dec.value("cleanup", true);
    }
    return Status::Ok();
  }
};

namespace {

// HF's WordPiece decoder cleanup, applied to each token (with its leading space).
std::string Cleanup(std::string s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},   {" ?", "?"},   {" !", "!"},   {" ,", ","},   {" ' ", "'"},        {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    const std::string f(from), t(to);
    std::string out;
    size_t pos = 0;
    for (size_t hit; (hit = s.find(f, pos)) != std::string::npos; pos = hit + f.size()) {
      out.append(s, pos, hit - pos);
      out += t;
    }
    out.append(s, pos, std::string::npos);
    s = std::move(out);
  }
  return s;
}

}  // namespace

WordPieceTokenizer::WordPieceTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WordPieceTokenizer::WordPieceTokenizer(WordPieceTokenizer&&) noexcept = default;
WordPieceTokenizer& WordPieceTokenizer::operator=(WordPieceTokenizer&&) noexcept = default;
WordPieceTokenizer::~WordPieceTokenizer() = default;

Result<WordPieceTokenizer> WordPieceTokenizer::FromTokenizerJsonText(std::string_view text, const std::string& what) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return InvalidArgument(what + ": not a JSON object (tokenizer.json)");
  auto impl = std::make_unique<Impl>();
  impl->what = what;
  try {
    L2L_RETURN_IF_ERROR(impl->Parse(root));
  } catch (const json::exception& e) {
    return InvalidArgument(what + ": malformed tokenizer.json: " + e.what());
  }
  return WordPieceTokenizer(std::move(impl));
}

namespace {
Result<std::string> TokenizerJsonFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  const std::string file = (std::filesystem::path(path) / "tokenizer.json").string();
  if (!std::filesystem::exists(file, ec)) return NotFound(path + ": a directory without tokenizer.json");
  return file;
}
}  // namespace

Result<WordPieceTokenizer> WordPieceTokenizer::FromTokenizerJson(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(std::string file, TokenizerJsonFile(path));
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
  return FromTokenizerJsonText(text, file);
}

Result<std::string> TokenizerJsonModelType(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(std::string file, TokenizerJsonFile(path));
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return InvalidArgument(file + ": not a JSON object (tokenizer.json)");
  auto m = root.find("model");
  if (m == root.end() || !m->is_object()) return InvalidArgument(file + ": no \"model\" object");
  return Str(*m, "type");
}

Result<WordPieceEncoding> WordPieceTokenizer::Encode(std::string_view text, bool add_special) const {
  L2L_ASSIGN_OR_RETURN(std::vector<int32_t> a, impl_->EncodeSequence(text));
  const std::vector<int32_t>* seqs[2] = {&a, nullptr};
  return impl_->Apply(seqs, false, add_special);
}

Result<WordPieceEncoding> WordPieceTokenizer::EncodePair(std::string_view a, std::string_view b, bool add_special) const {
  L2L_ASSIGN_OR_RETURN(std::vector<int32_t> ea, impl_->EncodeSequence(a));
  L2L_ASSIGN_OR_RETURN(std::vector<int32_t> eb, impl_->EncodeSequence(b));
  const std::vector<int32_t>* seqs[2] = {&ea, &eb};
  return impl_->Apply(seqs, true, add_special);
}

WordPieceEncoding WordPieceTokenizer::PostProcess(const std::vector<int32_t>& a, const std::vector<int32_t>* b,
                                                  bool add_special) const {
  const std::vector<int32_t>* seqs[2] = {&a, b};
  return impl_->Apply(seqs, b != nullptr, add_special);
}

Result<std::string> WordPieceTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  size_t n = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) {
      return OutOfRange(impl_->what + ": id " + std::to_string(id) + " at index " + std::to_string(i) +
                        " is outside the vocabulary (" + std::to_string(impl_->tokens.size()) + ")");
    }
    if (skip_special && impl_->special[id]) continue;
    std::string t = impl_->tokens[id];
    if (!impl_->wordpiece_decoder) {
      if (n > 0) out += ' ';
      out += t;
    } else {
      if (n > 0) {
        const std::string& p = impl_->decoder_prefix;
        if (t.compare(0, p.size(), p) == 0) {
          t.erase(0, p.size());
        } else {
          t.insert(0, " ");
        }
      }
      out += impl_->cleanup ? Cleanup(std::move(t)) : t;
    }
    ++n;
  }
  return out;
}

int64_t WordPieceTokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }

std::optional<int32_t> WordPieceTokenizer::TokenId(std::string_view token) const {
  const int32_t id = impl_->Lookup(token);
  return id < 0 ? std::nullopt : std::optional<int32_t>(id);
}

const std::string& WordPieceTokenizer::TokenText(int32_t id) const { return impl_->tokens.at(static_cast<size_t>(id)); }
bool WordPieceTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() && impl_->special[id];
}
int32_t WordPieceTokenizer::unk_id() const { return impl_->unk; }
int32_t WordPieceTokenizer::cls_id() const { return impl_->Lookup("[CLS]"); }
int32_t WordPieceTokenizer::sep_id() const { return impl_->Lookup("[SEP]"); }
int32_t WordPieceTokenizer::pad_id() const { return impl_->Lookup("[PAD]"); }
int32_t WordPieceTokenizer::mask_id() const { return impl_->Lookup("[MASK]"); }

int WordPieceTokenizer::num_special_tokens(bool pair) const {
  int n = 0;
  for (const TemplatePiece& p : pair ? impl_->pair : impl_->single) n += static_cast<int>(p.ids.size());
  return n;
}

}  // namespace l2l::tok
