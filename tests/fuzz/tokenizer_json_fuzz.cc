// libFuzzer target: the tokenizer.json loaders (tokenizer/tokenizer_json.cc byte-level
// BPE, tokenizer/wordpiece.cc WordPiece); a tokenizer that loads also encodes and
// decodes a short mixed-script text.
//
// Thread-safety: libFuzzer's single input thread.
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/wordpiece.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  l2l::fuzz::QuietLogs();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kSample = "Hello world, 123 ! caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 <|im_end|>";
  auto bpe = l2l::tok::Tokenizer::FromTokenizerJsonText(text, "tokenizer.json");
  if (bpe.ok()) {
    auto ids = bpe->Encode(kSample);
    if (ids.ok()) (void)bpe->Decode(*ids);
  }
  auto wp = l2l::tok::WordPieceTokenizer::FromTokenizerJsonText(text, "tokenizer.json");
  if (wp.ok()) (void)wp->Encode(kSample);
  return 0;
}
