// PCRE2 regex and HF-style splitting. See tokenizer/regex_split.h.
//
// Thread-safety: see the header.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex_split.h"

#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace l2l::tok {
namespace {

// Per-thread scratch: match data sized for the largest pattern's captures and a JIT
// stack that grows to 64 MiB (long whitespace runs backtrack deeply in \s+(?!\S)).
struct ThreadScratch {
  pcre2_match_data* md = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* mctx = nullptr;
  ThreadScratch() {
    md = pcre2_match_data_create(32, nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    if (jit_stack != nullptr) pcre2_jit_stack_assign(mctx, nullptr, jit_stack);
  }
  ~ThreadScratch() {
    pcre2_match_context_free(mctx);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(md);
  }
};

ThreadScratch& Scratch() {
  thread_local ThreadScratch scratch;
  return scratch;
}

// Length of the UTF-8 sequence starting with byte c (1 for a stray byte).
size_t Utf8Len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

struct Segment {
  size_t begin, end;
  bool is_match;
};

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(std::string pattern, std::unique_ptr<Code> code) : pattern_(std::move(pattern)), code_(std::move(code)) {}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

Result<Regex> Regex::Compile(const std::string& pattern, const std::string& what) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return InvalidArgument(what + ": regex /" + pattern + "/ does not compile at offset " +
                           std::to_string(err_offset) + ": " + reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation: without it (an unsupported platform) pcre2_match interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  auto c = std::make_unique<Code>();
  c->code = code;
  return Regex(pattern, std::move(c));
}

namespace {

// Folds the stream of gap / match segments into pieces per an HF SplitDelimiterBehavior,
// holding at most one pending piece.
class PieceFolder {
 public:
  PieceFolder(std::string_view text, SplitBehavior behavior, const Regex::Emit& emit)
      : text_(text), behavior_(behavior), emit_(emit) {}

  Status Add(Segment g) {
    switch (behavior_) {
      case SplitBehavior::kIsolated:
        return Emit(g);
      case SplitBehavior::kRemoved:
        return g.is_match ? Status::Ok() : Emit(g);
      case SplitBehavior::kMergedWithPrevious:  // a match joins the gap before it
        if (g.is_match && !previous_match_ && has_pending_) {
          pending_.end = g.end;
        } else {
          L2L_RETURN_IF_ERROR(Flush());
          Hold(g);
        }
        break;
      case SplitBehavior::kMergedWithNext:  // a match joins the gap after it
        if (has_pending_ && pending_.is_match && !g.is_match) {
          pending_.end = g.end;
          pending_.is_match = false;  // merged: complete
          L2L_RETURN_IF_ERROR(Flush());
        } else {
          L2L_RETURN_IF_ERROR(Flush());
          if (g.is_match) {
            Hold(g);
          } else {
            L2L_RETURN_IF_ERROR(Emit(g));
          }
        }
        break;
      case SplitBehavior::kContiguous:  // runs of matches (and of gaps) join
        if (has_pending_ && g.is_match == previous_match_) {
          pending_.end = g.end;
        } else {
          L2L_RETURN_IF_ERROR(Flush());
          Hold(g);
        }
        break;
    }
    previous_match_ = g.is_match;
    return Status::Ok();
  }

  Status Finish() { return Flush(); }

 private:
  void Hold(Segment g) {
    pending_ = g;
    has_pending_ = true;
  }
  Status Flush() {
    if (!has_pending_) return Status::Ok();
    has_pending_ = false;
    return Emit(pending_);
  }
  Status Emit(Segment g) {
    if (g.end <= g.begin) return Status::Ok();
    return emit_(text_.substr(g.begin, g.end - g.begin));
  }

  std::string_view text_;
  SplitBehavior behavior_;
  const Regex::Emit& emit_;
  Segment pending_{0, 0, false};
  bool has_pending_ = false;
  bool previous_match_ = false;
};

}  // namespace

Status Regex::Split(std::string_view text, SplitBehavior behavior, bool invert, const Emit& emit) const {
  if (text.empty()) return Status::Ok();
  ThreadScratch& s = Scratch();
  PieceFolder folder(text, behavior, emit);
  // Matches and the gaps between them, in order, covering the text (HF find_matches).
  auto add = [&](size_t b, size_t e, bool is_match) { return folder.Add({b, e, is_match != invert}); };
  size_t prev = 0, offset = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (offset <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), offset, 0, s.md, s.mctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return Internal("regex /" + pattern_ + "/ failed on a " + std::to_string(text.size()) +
                      "-byte piece: " + reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.md);
    const size_t b = ov[0], e = ov[1];
    if (b != prev) L2L_RETURN_IF_ERROR(add(prev, b, false));
    L2L_RETURN_IF_ERROR(add(b, e, true));
    prev = e;
    if (e == b) {  // an empty match: step over one character
      if (e >= text.size()) break;
      offset = e + Utf8Len(static_cast<unsigned char>(text[e]));
    } else {
      offset = e;
    }
  }
  if (prev != text.size()) L2L_RETURN_IF_ERROR(add(prev, text.size(), false));
  return folder.Finish();
}

Status Regex::Split(std::string_view text, SplitBehavior behavior, bool invert,
                    std::vector<std::string_view>* out) const {
  return Split(text, behavior, invert, [out](std::string_view p) {
    out->push_back(p);
    return Status::Ok();
  });
}

bool Regex::FullMatch(std::string_view text) const {
  ThreadScratch& s = Scratch();
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             PCRE2_ANCHORED | PCRE2_ENDANCHORED, s.md, s.mctx);
  return rc >= 0;
}

std::string EscapeRegex(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

}  // namespace l2l::tok
