// SentencePiece-style BPE merges. See tokenizer/spm.h.
//
// Thread-safety: see the header.
#include "tokenizer/spm.h"

#include <algorithm>
#include <queue>

namespace l2l::tok {
namespace {

// Length of the UTF-8 character at s[i]: its sequence length when well formed, else 1
// (a stray byte is a symbol of its own and ends up as its byte token).
size_t CharLen(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return 1;
  }
  return n;
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

constexpr int32_t kControl = 3, kByte = 6;

}  // namespace

std::string EscapeSpmSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ') {
      out += kSpmSpace;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

int ParseByteToken(std::string_view p) {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
  };
  const int hi = hex(p[3]), lo = hex(p[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string SpmPieceBytes(std::string_view piece, bool byte_token) {
  if (byte_token) {
    const int b = ParseByteToken(piece);
    if (b >= 0) return std::string(1, static_cast<char>(b));
  }
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
      out.push_back(' ');
      i += kSpmSpace.size();
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

Result<SpmModel> SpmModel::Create(const BpeSpec& spec, const std::string& what) {
  SpmModel m;
  const size_t n = spec.tokens.size();
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    return InvalidArgument(what + ": " + std::to_string(spec.token_types.size()) + " token types for " +
                           std::to_string(n) + " tokens");
  }
  m.by_score_ = !spec.scores.empty();
  if (m.by_score_ && spec.scores.size() != n) {
    return InvalidArgument(what + ": " + std::to_string(spec.scores.size()) + " scores for " + std::to_string(n) + " tokens");
  }
  std::fill(std::begin(m.byte_id_), std::end(m.byte_id_), -1);
  m.pieces_.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const std::string& t = spec.tokens[id];
    if (t.empty()) continue;
    const int32_t type = spec.token_types.empty() ? 1 : spec.token_types[id];
    // Byte tokens: by type in a GGUF, by their text in a tokenizer.json (as tokenizers).
    const bool byte_token = spec.token_types.empty() || type == kByte;
    const int b = byte_token ? ParseByteToken(t) : -1;
    if (b >= 0 && m.byte_id_[b] < 0) m.byte_id_[b] = static_cast<int32_t>(id);
    // Control and byte tokens are never the result of a merge (SentencePiece keeps them
    // out of its piece table); in a tokenizer.json every vocab entry is a piece.
    if (!spec.token_types.empty() && (type == kControl || type == kByte)) continue;
    m.pieces_.emplace(t, static_cast<int32_t>(id));  // the first id of a repeated text wins
  }
  if (m.by_score_) m.scores_ = spec.scores;
  for (size_t r = 0; r < spec.merges.size() && !m.by_score_; ++r) {
    const std::string& a = spec.merges[r].first;
    const std::string& b = spec.merges[r].second;
    auto lookup = [&](const std::string& s) -> Result<int32_t> {
      auto it = m.pieces_.find(s);
      if (it == m.pieces_.end()) {
        return InvalidArgument(what + ": merge " + std::to_string(r) + " (\"" + a + "\" \"" + b + "\"): \"" + s +
                               "\" is not in the vocabulary");
      }
      return it->second;
    };
    L2L_ASSIGN_OR_RETURN(const int32_t ia, lookup(a));
    L2L_ASSIGN_OR_RETURN(const int32_t ib, lookup(b));
    L2L_ASSIGN_OR_RETURN(const int32_t inew, lookup(a + b));
    // A repeated pair takes its last rank, as tokenizers' merge map (collected in order) does.
    m.merges_[PairKey(ia, ib)] = {static_cast<int32_t>(r), inew};
  }
  m.unk_id_ = spec.unk_id;
  m.fuse_unk_ = spec.fuse_unk;
  return m;
}

bool SpmModel::AppendBytes(std::string_view bytes, std::vector<int32_t>* out) const {
  for (char c : bytes) {
    if (byte_id_[static_cast<uint8_t>(c)] < 0) return false;
  }
  for (char c : bytes) out->push_back(byte_id_[static_cast<uint8_t>(c)]);
  return true;
}

void SpmModel::EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (by_score_) {
    EncodeByScore(piece, out);
  } else {
    EncodeByRank(piece, out);
  }
}

void SpmModel::EncodeByScore(std::string_view w, std::vector<int32_t>* out) const {
  struct Sym {
    uint32_t start, len;
    int32_t prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(w.size());
  for (size_t i = 0; i < w.size();) {
    const size_t len = CharLen(w, i);
    const auto k = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(len), k - 1, -1});
    if (k > 0) syms[k - 1].next = k;
    i += len;
  }
  struct Cand {
    float score;
    int32_t left, right;
    uint32_t size;
    // Lower priority: a lower score, or the same score further right.
    bool operator<(const Cand& o) const { return score < o.score || (score == o.score && left > o.left); }
  };
  std::priority_queue<Cand> heap;
  auto try_add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t size = syms[l].len + syms[r].len;
    auto it = pieces_.find(w.substr(syms[l].start, size));
    if (it == pieces_.end()) return;
    heap.push({scores_[it->second], l, r, size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = syms[c.left];
    Sym& r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.size) continue;  // stale
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    try_add(l.prev, c.left);
    try_add(c.left, l.next);
  }
  bool prev_unk = false;
  for (int32_t i = 0; i >= 0 && !syms.empty(); i = syms[i].next) {
    const std::string_view text = w.substr(syms[i].start, syms[i].len);
    auto it = pieces_.find(text);
    if (it != pieces_.end()) {
      out->push_back(it->second);
      prev_unk = false;
    } else if (AppendBytes(text, out)) {
      prev_unk = false;
    } else if (unk_id_ >= 0 && !(fuse_unk_ && prev_unk)) {
      out->push_back(unk_id_);
      prev_unk = true;
    }
  }
}

void SpmModel::EncodeByRank(std::string_view w, std::vector<int32_t>* out) const {
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> syms;
  syms.reserve(w.size());
  auto add = [&](int32_t id) {
    const auto k = static_cast<int32_t>(syms.size());
    syms.push_back({id, k - 1, -1});
    if (k > 0) syms[k - 1].next = k;
  };
  // An unknown character's <unk> is held back as tokenizers 0.20 holds it: written at the
  // next character that is a token, at the next unknown character when not fusing, or at
  // the end; byte-fallback characters in between neither write it nor end the fusing
  // (so "😐د" gives <0xD8> <0xAF> <unk> when 😐 has no byte tokens).
  bool pending_unk = false;
  std::vector<int32_t> bytes;
  for (size_t i = 0; i < w.size();) {
    const size_t len = CharLen(w, i);
    const std::string_view ch = w.substr(i, len);
    i += len;
    auto it = pieces_.find(ch);
    if (it != pieces_.end()) {
      if (pending_unk) add(unk_id_);
      pending_unk = false;
      add(it->second);
      continue;
    }
    bytes.clear();
    if (AppendBytes(ch, &bytes)) {
      for (int32_t b : bytes) add(b);
      continue;
    }
    if (unk_id_ < 0) continue;  // no unknown token: the character is dropped
    if (pending_unk && !fuse_unk_) add(unk_id_);
    pending_unk = true;
  }
  if (pending_unk) add(unk_id_);
  struct Cand {
    int32_t rank, pos, new_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || syms[pos].next < 0) return;
    auto it = merges_.find(PairKey(syms[pos].id, syms[syms[pos].next].id));
    if (it != merges_.end()) heap.push({it->second.first, pos, it->second.second});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);
  while (!heap.empty()) {
    const Cand top = heap.top();
    heap.pop();
    Sym& left = syms[top.pos];
    if (left.id < 0 || left.next < 0) continue;  // merged away, or now last
    const Sym& right = syms[left.next];
    auto it = merges_.find(PairKey(left.id, right.id));
    if (it == merges_.end() || it->second.second != top.new_id || it->second.first != top.rank) continue;  // stale
    const int32_t right_pos = left.next;
    left.id = top.new_id;
    left.next = right.next;
    syms[right_pos].id = -1;
    if (left.next >= 0) syms[left.next].prev = top.pos;
    push(left.prev);
    push(top.pos);
  }
  for (const Sym& s : syms) {
    if (s.id >= 0) out->push_back(s.id);
  }
}

}  // namespace l2l::tok
