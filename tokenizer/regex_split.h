// A compiled Unicode regex (PCRE2, 8-bit, UTF | UCP | MATCH_INVALID_UTF, JIT when the
// platform has it) and the HF-style split of a piece of text by it.
//
// Invalid UTF-8 in the subject never matches a character class, so bytes of a broken
// sequence end up in the gaps between matches (and are BPE-encoded byte by byte).
//
// Ownership: Regex owns the compiled pattern; move-only.
// Thread-safety: a Regex is immutable after Compile; Split may run from several threads
// at once (match data and the JIT stack are per thread).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace l2l::tok {

class Regex {
 public:
  // `what` names the pattern's origin in the error (with PCRE2's message and offset).
  static Result<Regex> Compile(const std::string& pattern, const std::string& what);

  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Calls `emit` with the pieces of `text` in order, per `behavior` (HF Split semantics:
  // matches and the gaps between them, `invert` swapping the two; empty pieces dropped).
  // Streams: memory stays constant however long `text` is. A non-OK Status from `emit`
  // stops the split and is returned.
  using Emit = std::function<Status(std::string_view)>;
  Status Split(std::string_view text, SplitBehavior behavior, bool invert, const Emit& emit) const;
  // The same, collected.
  Status Split(std::string_view text, SplitBehavior behavior, bool invert,
               std::vector<std::string_view>* out) const;

  // Whether the pattern matches all of `text`.
  bool FullMatch(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  Regex(std::string pattern, std::unique_ptr<Code> code);
  std::string pattern_;
  std::unique_ptr<Code> code_;
};

// A PCRE2 pattern that matches `literal` exactly.
std::string EscapeRegex(std::string_view literal);

}  // namespace l2l::tok
