// Supervised fine-tuning data: one JSONL line ({"prompt","completion"} or
// {"messages":[{"role","content"}...]}) -> token ids and a loss mask (1 = a training
// target). Messages use the ChatML template ("<|im_start|>ROLE\nCONTENT<|im_end|>\n") when
// the tokenizer has <|im_start|> and <|im_end|>; Gemma 3's ("<bos><start_of_turn>user\n
// PROMPT<end_of_turn>\n<start_of_turn>model\nRESPONSE<end_of_turn>\n", content trimmed, a
// leading system message folded into the first user turn, roles alternating) when it has
// <start_of_turn> and <end_of_turn>; plain concatenation otherwise; see docs/formats.md for
// the exact rules.
//
// The formatted string is encoded in one piece (so ids equal the tokenizer's encoding of
// that string), and each token's mask comes from the span holding its first byte: the
// tokens are aligned to the string by their decoded bytes.
//
// Thread-safety: free functions; the Tokenizer is used through const methods.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

namespace l2l::tok {

struct SftExample {
  std::string text;            // the formatted string that was encoded
  std::vector<int32_t> ids;    // its tokens (BOS first when the tokenizer adds one)
  std::vector<uint8_t> mask;   // per token: 1 = trained on (completion / assistant), 0 = context
};

// The chat template messages get with `tokenizer` (nullptr: the byte-level tokenizer).
enum class ChatFormat { kPlain, kChatMl, kGemma };

// Jinja's `trim` (Python's str.strip()): whitespace off both ends. Python's whitespace:
// \t-\r, \x1c-\x1f, space, U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F,
// U+205F, U+3000. Gemma's chat template trims every message's content.
std::string_view JinjaTrim(std::string_view s);
ChatFormat ChatFormatOf(const Tokenizer* tokenizer);

// One message as a chat template lays it out, open + body + close: body is what an
// assistant message trains on (EncodeSftLine's mask), open and close are context. The one
// layout both EncodeSftLine and ChatTemplate::Render (tokenizer/chat_template.h) write.
struct ChatTurn {
  std::string open, body, close;
};
// ChatML: "<|im_start|>ROLE\n" | CONTENT + "<|im_end|>" | "\n".
ChatTurn ChatMlTurn(std::string_view role, std::string_view content);
// Gemma 3: "<start_of_turn>ROLE\n" (assistant written "model") + `prefix` (a folded system
// message's text + "\n\n" on the first user turn, else "") | JinjaTrim(CONTENT) +
// "<end_of_turn>" | "\n".
ChatTurn GemmaTurn(std::string_view role, std::string_view content, std::string_view prefix);

// One JSONL line. `tokenizer` == nullptr means the byte-level tokenizer (ids = bytes, plain
// concatenation). `where` ("data.jsonl:12") prefixes every error.
Result<SftExample> EncodeSftLine(const Tokenizer* tokenizer, std::string_view line, const std::string& where);

}  // namespace l2l::tok
