// libFuzzer target: the GGUF reader (common/formats/gguf.cc) and what an import reads
// from it: every key through the typed getters, every tensor dequantized to fp32 (up to
// 1 Mi elements), the model config (ConfigFromGguf) and the tokenizer vocabulary
// (tokenizer/load.cc GgufVocabFromReader, Tokenizer::FromGguf).
//
// Thread-safety: libFuzzer's single input thread.
#include <cstdint>
#include <string>

#include "common/formats/gguf.h"
#include "common/formats/model_config.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/load.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  l2l::fuzz::QuietLogs();
  const std::string path = l2l::fuzz::WriteScratchFile("model.gguf", data, size);
  auto r = l2l::formats::GgufReader::Open(path);
  if (!r.ok()) return 0;
  for (const std::string& k : r->keys()) {
    (void)r->Get(k);
    (void)r->GetString(k);
    (void)r->GetUInt(k);
    (void)r->GetInt(k);
    (void)r->GetFloat(k);
    (void)r->GetBool(k);
    (void)r->GetStringArray(k);
    (void)r->GetIntArray(k);
    (void)r->GetFloatArray(k);
  }
  for (const l2l::formats::GgufTensorInfo& t : r->tensors()) {
    (void)r->Find(t.name);
    (void)r->Raw(t);
    if (t.numel() <= (int64_t{1} << 20)) (void)r->ReadF32(t.name);
  }
  (void)l2l::formats::ConfigFromGguf(*r);
  auto vocab = l2l::tok::GgufVocabFromReader(*r);
  if (vocab.ok() && vocab->tokens.size() <= 4096) {
    auto tok = l2l::tok::Tokenizer::FromGguf(*vocab, path);
    if (tok.ok()) {
      auto ids = tok->Encode("Hello world, 123 !");
      if (ids.ok()) (void)tok->Decode(*ids);
    }
  }
  return 0;
}
