// BPE tokenizers: tables, added-token matching, pre-tokenization, byte-level merges,
// decoding; the SentencePiece merges themselves are in tokenizer/spm.cc. See
// tokenizer/tokenizer.h.
//
// Thread-safety: see the header. The word cache is the only mutable state.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <queue>
#include <unordered_map>

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include "tokenizer/regex_split.h"
#include "tokenizer/spm.h"
#include "tokenizer/utf8.h"

namespace l2l::tok {

const char* const kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

namespace {

// ---- GPT-2's byte <-> unicode alphabet ----------------------------------------------
struct ByteAlphabet {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteAlphabet() {
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      byte_to_cp[b] = printable ? b : 256 + n++;
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& Alphabet() {
  static const ByteAlphabet a;
  return a;
}

// Decodes one UTF-8 character at s[i]; returns false for an invalid sequence.
bool DecodeUtf8(std::string_view s, size_t i, uint32_t* cp, size_t* len) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n;
  uint32_t v;
  if (c < 0x80) { *cp = c; *len = 1; return true; }
  if ((c >> 5) == 0x6) { n = 2; v = c & 0x1F; }
  else if ((c >> 4) == 0xE) { n = 3; v = c & 0x0F; }
  else if ((c >> 3) == 0x1E) { n = 4; v = c & 0x07; }
  else return false;
  if (i + n > s.size()) return false;
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d >> 6) != 0x2) return false;
    v = (v << 6) | (d & 0x3F);
  }
  *cp = v;
  *len = n;
  return true;
}

// Unicode White_Space (Rust's char::is_whitespace, which HF's lstrip/rstrip use).
bool IsWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Start of the run of whitespace characters that ends at s.size().
size_t WhitespaceRunStart(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t b = start - 1;  // back up to the lead byte
    while (b > 0 && (static_cast<unsigned char>(s[b]) >> 6) == 0x2 && start - b < 4) --b;
    uint32_t cp;
    size_t len;
    if (!DecodeUtf8(s, b, &cp, &len) || b + len != start || !IsWhitespace(cp)) break;
    start = b;
  }
  return start;
}

// Length of the run of whitespace characters at the start of s.
size_t WhitespaceRunLength(std::string_view s) {
  size_t i = 0;
  uint32_t cp;
  size_t len;
  while (i < s.size() && DecodeUtf8(s, i, &cp, &len) && IsWhitespace(cp)) i += len;
  return i;
}

// Whether the character ending at s.size() (at_end) or starting at 0 is a word character
// (Unicode \w as HF's single_word check uses it: letters, marks, decimal digits,
// connector punctuation, joiners).
bool IsWordChar(std::string_view s, bool at_end) {
  static const Regex* const kWord = [] {
    auto re = Regex::Compile(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", "word character class");
    L2L_CHECK(re.ok()) << re.status().ToString();
    return new Regex(std::move(re).value());
  }();
  if (s.empty()) return false;
  size_t b = 0, len = 0;
  uint32_t cp;
  if (at_end) {
    b = s.size() - 1;
    while (b > 0 && (static_cast<unsigned char>(s[b]) >> 6) == 0x2 && s.size() - b < 4) --b;
  }
  if (!DecodeUtf8(s, b, &cp, &len)) return false;
  return kWord->FullMatch(s.substr(b, len));
}

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StrMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

uint64_t PairKey(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

// A piece of text after added-token matching: either an added token or text to encode.
struct Piece {
  std::string_view text;
  int32_t added_id = -1;
  bool at_start = false;  // text at the start of the input (Metaspace prepend_scheme "first")
};

// Leftmost-longest matcher over a set of added tokens. At each position it looks the text
// up once per distinct token length among the tokens starting with that byte (Gemma has
// 6,000 "<unusedN>" tokens starting with '<': scanning them all at every '<' of HTML made
// encoding 30x slower).
struct AddedMatcher {
  std::unordered_map<std::string_view, const AddedToken*> by_content;  // the first token of each content
  std::vector<size_t> lengths[256];  // by first byte: the distinct lengths, longest first
  bool empty = true;
  void Add(const AddedToken* t) {
    if (t->content.empty()) return;
    if (by_content.emplace(t->content, t).second) lengths[static_cast<unsigned char>(t->content[0])].push_back(t->content.size());
    empty = false;
  }
  void Finish() {
    for (auto& v : lengths) {
      std::sort(v.begin(), v.end(), std::greater<size_t>());
      v.erase(std::unique(v.begin(), v.end()), v.end());
    }
  }
  // The longest token at s[i], or nullptr.
  const AddedToken* LongestAt(std::string_view s, size_t i) const {
    for (size_t len : lengths[static_cast<unsigned char>(s[i])]) {
      if (len > s.size() - i) continue;
      auto it = by_content.find(s.substr(i, len));
      if (it != by_content.end()) return it->second;
    }
    return nullptr;
  }
  // HF AddedVocabulary::find_matches on `s`, appending pieces to `out`.
  void Split(std::string_view s, std::vector<Piece>* out) const {
    if (empty) {
      out->push_back({s, -1});
      return;
    }
    size_t start_offset = 0, i = 0;
    while (i < s.size()) {
      const AddedToken* best = LongestAt(s, i);
      if (best == nullptr) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + best->content.size();
      if (best->single_word) {
        const bool start_ok = !IsWordChar(s.substr(0, start), /*at_end=*/true);
        const bool stop_ok = !IsWordChar(s.substr(stop), /*at_end=*/false);
        if (!start_ok || !stop_ok) {
          i = stop;
          continue;
        }
      }
      if (best->lstrip) start = std::max(WhitespaceRunStart(s.substr(0, start)), start_offset);
      if (best->rstrip) stop += WhitespaceRunLength(s.substr(stop));
      if (start_offset < start) out->push_back({s.substr(start_offset, start - start_offset), -1});
      out->push_back({s.substr(start, stop - start), best->id});
      start_offset = stop;
      i = stop;
    }
    if (start_offset < s.size()) out->push_back({s.substr(start_offset), -1});
  }
};

struct CompiledStep {
  PreTokenizerStep step;
  std::optional<Regex> regex;  // the Split regex, or ByteLevel's GPT-2 regex when use_regex
};

}  // namespace

Result<Normalization> ParseNormalization(std::string_view name) {
  if (name == "NFC") return Normalization::kNFC;
  if (name == "NFD") return Normalization::kNFD;
  if (name == "NFKC") return Normalization::kNFKC;
  if (name == "NFKD") return Normalization::kNFKD;
  return Unimplemented("normalizer \"" + std::string(name) + "\" is not supported (NFC, NFD, NFKC, NFKD and a Sequence of them are)");
}

namespace {

// The ICU normalizer for `n` (process-wide singletons owned by ICU).
Result<const icu::Normalizer2*> IcuNormalizer(Normalization n) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* out = nullptr;
  switch (n) {
    case Normalization::kNFC: out = icu::Normalizer2::getNFCInstance(err); break;
    case Normalization::kNFD: out = icu::Normalizer2::getNFDInstance(err); break;
    case Normalization::kNFKC: out = icu::Normalizer2::getNFKCInstance(err); break;
    case Normalization::kNFKD: out = icu::Normalizer2::getNFKDInstance(err); break;
  }
  if (U_FAILURE(err) || out == nullptr) return Internal(std::string("ICU normalizer unavailable: ") + u_errorName(err));
  return out;
}

}  // namespace

Result<SplitBehavior> ParseSplitBehavior(std::string_view name) {
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return InvalidArgument("unknown split behavior \"" + std::string(name) +
                         "\" (Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous)");
}

PreTokenizerStep PreTokenizerStep::Split(std::string regex, SplitBehavior behavior, bool invert) {
  PreTokenizerStep s;
  s.kind = Kind::kSplit;
  s.regex = std::move(regex);
  s.behavior = behavior;
  s.invert = invert;
  return s;
}

PreTokenizerStep PreTokenizerStep::ByteLevel(bool add_prefix_space, bool use_regex) {
  PreTokenizerStep s;
  s.kind = Kind::kByteLevel;
  s.add_prefix_space = add_prefix_space;
  s.use_regex = use_regex;
  return s;
}

uint32_t ByteToUnicode(uint8_t b) { return Alphabet().byte_to_cp[b]; }

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(ByteToUnicode(static_cast<uint8_t>(c)), &out);
  return out;
}

std::optional<std::string> ByteLevelToBytes(std::string_view token) {
  const ByteAlphabet& a = Alphabet();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    size_t len;
    if (!DecodeUtf8(token, i, &cp, &len)) return std::nullopt;
    auto it = a.cp_to_byte.find(cp);
    if (it == a.cp_to_byte.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
    i += len;
  }
  return out;
}

// ---- Impl ----------------------------------------------------------------------------

struct Tokenizer::Impl {
  BpeModel model = BpeModel::kByteLevel;
  std::optional<SpmModel> spm;         // kSentencePiece: the merges
  SpacePrefix space_prefix = SpacePrefix::kNone;
  bool escape_spaces = false;          // kSentencePiece: ' ' -> "▁"
  bool metaspace = false;              // prefix and escape at pre-tokenization (Metaspace), not normalization
  bool decode_strip_space = false;
  std::vector<std::string> id_bytes;   // id -> raw bytes (decode)
  std::vector<uint8_t> id_known;       // id has a token
  std::vector<uint8_t> id_added;       // id is an added token
  StrMap vocab;                        // raw bytes -> id, model vocabulary only
  StrMap added_by_content;             // added token content -> id
  int32_t byte_id[256];                // single-byte token ids (-1: none)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a,b) -> (rank, new id)
  bool ignore_merges = false;
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher;         // normalized=false tokens
  AddedMatcher normalized_matcher;  // normalized=true tokens
  std::vector<const icu::Normalizer2*> normalizers;
  std::vector<CompiledStep> steps;
  std::vector<int32_t> prefix_ids, suffix_ids;
  int32_t bos_id = -1, eos_id = -1;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>, SvHash, std::equal_to<>> cache;  // GUARDED_BY(cache_mu)
  static constexpr size_t kCacheMaxEntries = 1 << 20;
  static constexpr size_t kCacheMaxWordBytes = 256;

  void BpeWord(std::string_view word, std::vector<int32_t>* out) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  // Create's two halves: ids, vocabulary, merges and added tokens; then normalizers,
  // pre-tokenizer steps and the post-processor's ids.
  Status InitVocab(const BpeSpec& spec, const std::string& what);
  Status InitSpmVocab(const BpeSpec& spec, const std::string& what);
  void InitAdded(const BpeSpec& spec);  // added tokens, their matchers and decoded bytes
  Status InitPipeline(const BpeSpec& spec, const std::string& what);
  // `text` normalized; a view of `text` itself when it already is (the common case).
  Result<std::string_view> Normalize(std::string_view text, std::deque<std::string>* arena) const;
  // kSentencePiece: the "▁" prefix (per space_prefix) and ' ' -> "▁" applied to a piece.
  std::string_view SpmEscape(std::string_view text, bool at_start, std::deque<std::string>* arena) const;
  // Runs pre-tokenizer steps [step, end) on `text` depth first, BPE-encoding each final
  // word into `out` as soon as it is cut (memory does not grow with the text).
  Status PreTokenizeAndEncode(size_t step, std::string_view text, std::vector<int32_t>* out) const;
};

void Tokenizer::Impl::BpeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (spm.has_value()) {
    spm->EncodePiece(word, out);
    return;
  }
  if (ignore_merges) {
    auto it = vocab.find(word);
    if (it != vocab.end()) {
      out->push_back(it->second);
      return;
    }
  }
  struct Sym {
    int32_t id;
    int32_t prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  for (char c : word) {
    const int32_t id = byte_id[static_cast<uint8_t>(c)];
    if (id < 0) continue;  // a byte the vocabulary lacks is dropped (HF BPE without unk)
    const auto n = static_cast<int32_t>(syms.size());
    syms.push_back({id, n - 1, -1});
    if (n > 0) syms[n - 1].next = n;
  }
  if (syms.size() > 1) {
    struct Cand {
      int32_t rank, pos, new_id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](int32_t pos) {
      if (pos < 0 || syms[pos].next < 0) return;
      auto it = merges.find(PairKey(syms[pos].id, syms[syms[pos].next].id));
      if (it != merges.end()) heap.push({it->second.first, pos, it->second.second});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);
    while (!heap.empty()) {
      const Cand top = heap.top();
      heap.pop();
      Sym& left = syms[top.pos];
      if (left.id < 0 || left.next < 0) continue;  // merged away, or now last
      const Sym& right = syms[left.next];
      auto it = merges.find(PairKey(left.id, right.id));
      if (it == merges.end() || it->second.second != top.new_id) continue;  // stale
      const int32_t right_pos = left.next;
      left.id = top.new_id;
      left.next = right.next;
      syms[right_pos].id = -1;
      if (left.next >= 0) syms[left.next].prev = top.pos;
      push(left.prev);
      push(top.pos);
    }
  }
  for (const Sym& s : syms) {
    if (s.id >= 0) out->push_back(s.id);
  }
}

void Tokenizer::Impl::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.size() > kCacheMaxWordBytes) {
    BpeWord(word, out);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(word);
    if (it != cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out->size();
  BpeWord(word, out);
  std::vector<int32_t> ids(out->begin() + static_cast<std::ptrdiff_t>(before), out->end());
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kCacheMaxEntries) cache.clear();
  cache.emplace(std::string(word), std::move(ids));
}

Result<std::string_view> Tokenizer::Impl::Normalize(std::string_view text, std::deque<std::string>* arena) const {
  for (const icu::Normalizer2* n : normalizers) {
    UErrorCode err = U_ZERO_ERROR;
    const icu::StringPiece sp(text.data(), static_cast<int32_t>(text.size()));
    if (n->isNormalizedUTF8(sp, err) && U_SUCCESS(err)) continue;
    err = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
    n->normalizeUTF8(0, sp, sink, nullptr, err);
    if (U_FAILURE(err)) return Internal(std::string("Unicode normalization failed: ") + u_errorName(err));
    arena->push_back(std::move(out));
    text = arena->back();
  }
  return text;
}

std::string_view Tokenizer::Impl::SpmEscape(std::string_view text, bool at_start, std::deque<std::string>* arena) const {
  if (text.empty()) return text;
  const bool starts_space = text[0] == ' ' || text.substr(0, kSpmSpace.size()) == kSpmSpace;
  bool prefix = false;
  switch (space_prefix) {
    case SpacePrefix::kNone: break;
    case SpacePrefix::kAlways: prefix = true; break;
    case SpacePrefix::kMetaspaceAlways: prefix = !starts_space; break;
    case SpacePrefix::kMetaspaceFirst: prefix = at_start && !starts_space; break;
  }
  if (!prefix && (!escape_spaces || text.find(' ') == std::string_view::npos)) return text;
  std::string out = prefix ? std::string(kSpmSpace) : std::string();
  out += escape_spaces ? EscapeSpmSpaces(text) : std::string(text);
  arena->push_back(std::move(out));
  return arena->back();
}

Status Tokenizer::Impl::PreTokenizeAndEncode(size_t step, std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return Status::Ok();
  if (step == steps.size()) {
    EncodeWord(text, out);
    return Status::Ok();
  }
  const CompiledStep& cs = steps[step];
  std::string prefixed;  // lives while the later steps look at pieces of it
  if (cs.step.kind == PreTokenizerStep::Kind::kByteLevel && cs.step.add_prefix_space && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  if (!cs.regex.has_value()) return PreTokenizeAndEncode(step + 1, text, out);
  return cs.regex->Split(text, cs.step.behavior, cs.step.invert,
                         [&](std::string_view piece) { return PreTokenizeAndEncode(step + 1, piece, out); });
}

// ---- Tokenizer -----------------------------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Status Tokenizer::Impl::InitVocab(const BpeSpec& spec, const std::string& what) {
  int64_t n_ids = static_cast<int64_t>(spec.tokens.size());
  for (const AddedToken& t : spec.added_tokens) {
    if (t.id < 0) return InvalidArgument(what + ": added token \"" + t.content + "\" has negative id " + std::to_string(t.id));
    if (t.content.empty()) return InvalidArgument(what + ": added token id " + std::to_string(t.id) + " has empty content");
    n_ids = std::max<int64_t>(n_ids, int64_t{t.id} + 1);
  }
  if (n_ids > (int64_t{1} << 31) - 1) return InvalidArgument(what + ": " + std::to_string(n_ids) + " ids exceed int32");
  id_bytes.resize(static_cast<size_t>(n_ids));
  id_known.assign(static_cast<size_t>(n_ids), 0);
  id_added.assign(static_cast<size_t>(n_ids), 0);
  std::fill(std::begin(byte_id), std::end(byte_id), -1);
  model = spec.model;
  if (model == BpeModel::kSentencePiece) return InitSpmVocab(spec, what);
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    const std::string& t = spec.tokens[id];
    if (t.empty()) continue;
    id_known[id] = 1;
    std::optional<std::string> bytes = ByteLevelToBytes(t);
    if (!bytes.has_value()) {  // not in the byte-level alphabet: never produced by BPE
      id_bytes[id] = t;
      continue;
    }
    id_bytes[id] = *bytes;
    auto [it, inserted] = vocab.emplace(*bytes, static_cast<int32_t>(id));
    if (!inserted) {
      return InvalidArgument(what + ": token \"" + t + "\" appears twice in the vocabulary (ids " +
                             std::to_string(it->second) + " and " + std::to_string(id) + ")");
    }
    if (bytes->size() == 1) byte_id[static_cast<uint8_t>((*bytes)[0])] = static_cast<int32_t>(id);
  }
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    // Plain references, not a structured binding: clang before 16 cannot capture those.
    const std::string& a = spec.merges[r].first;
    const std::string& b = spec.merges[r].second;
    auto lookup = [&](const std::string& s) -> Result<int32_t> {
      std::optional<std::string> bytes = ByteLevelToBytes(s);
      auto it = bytes.has_value() ? vocab.find(*bytes) : vocab.end();
      if (it == vocab.end()) {
        return InvalidArgument(what + ": merge " + std::to_string(r) + " (\"" + a + "\" \"" + b + "\"): \"" + s +
                               "\" is not in the vocabulary");
      }
      return it->second;
    };
    L2L_ASSIGN_OR_RETURN(int32_t ia, lookup(a));
    L2L_ASSIGN_OR_RETURN(int32_t ib, lookup(b));
    L2L_ASSIGN_OR_RETURN(int32_t inew, lookup(a + b));
    // A repeated pair takes its last rank, as HF's merge map (collected in order) does.
    merges[PairKey(ia, ib)] = {static_cast<int32_t>(r), inew};
  }
  ignore_merges = spec.ignore_merges;
  InitAdded(spec);
  return Status::Ok();
}

void Tokenizer::Impl::InitAdded(const BpeSpec& spec) {
  added = spec.added_tokens;
  for (const AddedToken& t : added) {
    id_known[t.id] = 1;
    id_added[t.id] = 1;
    if (model == BpeModel::kSentencePiece) {
      // tokenizers' Replace("▁", " ") decoder sees added tokens too.
      id_bytes[t.id] = SpmPieceBytes(t.content, /*byte_token=*/false);
    } else {
      // HF decodes an added token through the ByteLevel decoder, which falls back to the
      // raw text when a character is outside the byte alphabet.
      std::optional<std::string> bytes = ByteLevelToBytes(t.content);
      id_bytes[t.id] = bytes.has_value() ? *bytes : t.content;
    }
    added_by_content[t.content] = t.id;
  }
  for (const AddedToken& t : added) (t.normalized ? normalized_matcher : raw_matcher).Add(&t);
  raw_matcher.Finish();
  normalized_matcher.Finish();
}

Status Tokenizer::Impl::InitSpmVocab(const BpeSpec& spec, const std::string& what) {
  L2L_ASSIGN_OR_RETURN(SpmModel m, SpmModel::Create(spec, what));  // checks types and scores against tokens
  spm = std::move(m);
  vocab.reserve(spec.tokens.size());
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    const std::string& t = spec.tokens[id];
    if (t.empty()) continue;
    id_known[id] = 1;
    const bool byte_token = spec.token_types.empty() || spec.token_types[id] == 6;
    id_bytes[id] = SpmPieceBytes(t, byte_token);
    vocab.emplace(id_bytes[id], static_cast<int32_t>(id));  // TokenId: the first id of these bytes
  }
  InitAdded(spec);
  if (spec.unk_id >= 0 && (static_cast<size_t>(spec.unk_id) >= id_known.size() || !id_known[spec.unk_id])) {
    return InvalidArgument(what + ": the unknown token id " + std::to_string(spec.unk_id) + " is not a token");
  }
  space_prefix = spec.space_prefix;
  escape_spaces = spec.escape_spaces;
  metaspace = spec.metaspace_split || space_prefix == SpacePrefix::kMetaspaceAlways ||
              space_prefix == SpacePrefix::kMetaspaceFirst;
  decode_strip_space = spec.decode_strip_space;
  return Status::Ok();
}

Status Tokenizer::Impl::InitPipeline(const BpeSpec& spec, const std::string& what) {
  for (Normalization n : spec.normalizers) {
    auto icu_n = IcuNormalizer(n);
    if (!icu_n.ok()) return icu_n.status().WithContext(what);
    normalizers.push_back(*icu_n);
  }
  bool byte_level = false;
  for (size_t i = 0; i < spec.pre_tokenizer.size(); ++i) {
    const PreTokenizerStep& s = spec.pre_tokenizer[i];
    CompiledStep cs{s, std::nullopt};
    if (s.kind == PreTokenizerStep::Kind::kByteLevel) {
      if (model == BpeModel::kSentencePiece) {
        return InvalidArgument(what + ": a ByteLevel pre-tokenizer in a SentencePiece (byte_fallback) tokenizer is not supported");
      }
      byte_level = true;
      if (s.use_regex) {
        L2L_ASSIGN_OR_RETURN(Regex re, Regex::Compile(kGpt2Regex, what + ": ByteLevel pre-tokenizer"));
        cs.regex = std::move(re);
        cs.step.behavior = SplitBehavior::kIsolated;
        cs.step.invert = false;
      }
    } else {
      if (byte_level) {
        return InvalidArgument(what + ": a Split pre-tokenizer after ByteLevel (it would see the byte-level "
                               "alphabet) is not supported");
      }
      L2L_ASSIGN_OR_RETURN(Regex re, Regex::Compile(s.regex, what + ": pre-tokenizer step " + std::to_string(i)));
      cs.regex = std::move(re);
    }
    steps.push_back(std::move(cs));
  }
  if (model == BpeModel::kSentencePiece && spec.metaspace_split) {
    // Metaspace split=true: a piece per "▁" and the text after it.
    L2L_ASSIGN_OR_RETURN(Regex re, Regex::Compile(std::string(kSpmSpace), what + ": Metaspace split"));
    steps.push_back(CompiledStep{PreTokenizerStep::Split(std::string(kSpmSpace), SplitBehavior::kMergedWithNext), std::move(re)});
  }
  if (!byte_level && model == BpeModel::kByteLevel) {
    return InvalidArgument(what + ": no ByteLevel pre-tokenizer: only byte-level BPE tokenizers are supported "
                           "(and SentencePiece-style BPE with model.byte_fallback true)");
  }
  for (const auto* ids : {&spec.prefix_ids, &spec.suffix_ids}) {
    for (int32_t id : *ids) {
      if (id < 0 || static_cast<size_t>(id) >= id_known.size() || !id_known[id]) {
        return InvalidArgument(what + ": post-processor id " + std::to_string(id) + " is not a token");
      }
    }
  }
  prefix_ids = spec.prefix_ids;
  suffix_ids = spec.suffix_ids;
  bos_id = spec.bos_id;
  eos_id = spec.eos_id;
  return Status::Ok();
}

Result<Tokenizer> Tokenizer::Create(BpeSpec spec, const std::string& what) {
  auto impl = std::make_unique<Impl>();
  L2L_RETURN_IF_ERROR(impl->InitVocab(spec, what));
  L2L_RETURN_IF_ERROR(impl->InitPipeline(spec, what));
  return Tokenizer(std::move(impl));
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special) out.insert(out.end(), m.prefix_ids.begin(), m.prefix_ids.end());
  std::deque<std::string> arena;
  std::vector<Piece> raw_pieces, pieces;
  m.raw_matcher.Split(text, &raw_pieces);
  const bool spm = m.model == BpeModel::kSentencePiece;
  for (size_t i = 0; i < raw_pieces.size(); ++i) {
    const Piece& p = raw_pieces[i];
    if (p.added_id >= 0) {
      pieces.push_back(p);
    } else {
      L2L_ASSIGN_OR_RETURN(std::string_view normalized, m.Normalize(p.text, &arena));
      // SentencePiece normalizers (Prepend("▁"), Replace(" ", "▁")) run here.
      if (spm && !m.metaspace) normalized = m.SpmEscape(normalized, i == 0, &arena);
      m.normalized_matcher.Split(normalized, &pieces);
    }
  }
  if (!pieces.empty()) pieces[0].at_start = true;
  for (const Piece& p : pieces) {
    if (p.added_id >= 0) {
      out.push_back(p.added_id);
    } else {
      // The Metaspace pre-tokenizer runs here, after added tokens are cut out.
      const std::string_view piece = spm && m.metaspace ? m.SpmEscape(p.text, p.at_start, &arena) : p.text;
      L2L_RETURN_IF_ERROR(m.PreTokenizeAndEncode(0, piece, &out));
    }
  }
  if (add_special) out.insert(out.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return out;
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids) const {
  const Impl& m = *impl_;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= m.id_bytes.size() || !m.id_known[id]) {
      return OutOfRange("decode: token " + std::to_string(i) + " is " + std::to_string(id) +
                        ", not an id of this tokenizer (vocabulary size " + std::to_string(m.id_bytes.size()) + ")");
    }
    out += m.id_bytes[id];
  }
  if (m.decode_strip_space && !out.empty() && out[0] == ' ') out.erase(0, 1);  // decoder Strip(" ", 1, 0)
  return out;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_bytes.size()); }

std::optional<int32_t> Tokenizer::TokenId(std::string_view text) const {
  auto a = impl_->added_by_content.find(text);
  if (a != impl_->added_by_content.end()) return a->second;
  auto v = impl_->vocab.find(text);
  if (v != impl_->vocab.end()) return v->second;
  return std::nullopt;
}

const std::string& Tokenizer::TokenBytes(int32_t id) const {
  L2L_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->id_bytes.size()) << "token id " << id;
  return impl_->id_bytes[id];
}
bool Tokenizer::IsAddedToken(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_added.size() && impl_->id_added[id];
}
BpeModel Tokenizer::model() const { return impl_->model; }
int32_t Tokenizer::bos_id() const { return impl_->bos_id; }
int32_t Tokenizer::eos_id() const { return impl_->eos_id; }
std::span<const int32_t> Tokenizer::prefix_ids() const { return impl_->prefix_ids; }
std::span<const int32_t> Tokenizer::suffix_ids() const { return impl_->suffix_ids; }

}  // namespace l2l::tok
