// WriteHfTokenizerFromGguf: the tokenizer of a GGUF file written as tokenizer.json +
// tokenizer_config.json encodes every text exactly as the GGUF's own tokenizer does, and
// names its BOS/EOS. (That BpeSpecToTokenizerJson's files encode like Hugging Face
// `tokenizers` is the oracle test tokenizer.hf_oracle's "smollm2-exported" case.)
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/formats/gguf_writer.h"
#include "tokenizer/load.h"

namespace l2l::tok {
namespace {

TEST_CASE("a GGUF tokenizer written as Hugging Face files encodes as the GGUF does", "[tokenizer][gguf]") {
  const auto dir = std::filesystem::temp_directory_path() / ("l2l-hf-from-gguf-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // A tiny byte-level vocabulary: the 256 byte symbols (GPT-2's byte-to-unicode map is
  // what the tokenizer expects), a few merges, and ChatML specials.
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) {
    // GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to 256+.
    static int next = 256;
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    tokens.push_back(s);
  }
  const std::vector<std::string> merges = {"t h", "th e", "Ġ th", "Ġth e", "i s", "Ġ is", "e r"};
  for (const auto& m : merges) tokens.push_back(m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1));
  tokens.push_back("<|im_start|>");
  tokens.push_back("<|im_end|>");
  std::vector<int64_t> types(tokens.size(), 1);
  types[tokens.size() - 2] = 3;
  types[tokens.size() - 1] = 3;
  formats::GgufWriter w;
  w.Set("general.architecture", formats::GgufValue::String("llama"));
  w.Set("tokenizer.ggml.model", formats::GgufValue::String("gpt2"));
  w.Set("tokenizer.ggml.pre", formats::GgufValue::String("smollm"));
  w.Set("tokenizer.ggml.tokens", formats::GgufValue::StringArray(tokens));
  w.Set("tokenizer.ggml.merges", formats::GgufValue::StringArray(merges));
  w.Set("tokenizer.ggml.token_type", formats::GgufValue::IntArray(formats::GgufValueType::kI32, types));
  w.Set("tokenizer.ggml.bos_token_id", formats::GgufValue::U32(static_cast<uint32_t>(tokens.size() - 2)));
  w.Set("tokenizer.ggml.eos_token_id", formats::GgufValue::U32(static_cast<uint32_t>(tokens.size() - 1)));
  w.Set("tokenizer.chat_template", formats::GgufValue::String("{% for m in messages %}{{ m.content }}{% endfor %}"));
  const std::string gguf = (dir / "t.gguf").string();
  const Status written = w.Write(gguf);
  INFO(written.ToString());
  REQUIRE(written.ok());

  const std::string out = (dir / "hf").string();
  const Status s = WriteHfTokenizerFromGguf(gguf, out);
  INFO(s.ToString());
  REQUIRE(s.ok());
  auto from_gguf = LoadTokenizer(gguf);
  auto from_hf = LoadTokenizer(out);
  INFO(from_gguf.status().ToString() << " / " << from_hf.status().ToString());
  REQUIRE(from_gguf.ok());
  REQUIRE(from_hf.ok());
  for (const std::string text : {"the theme is there", "<|im_start|>user\nis the 42 thing<|im_end|>",
                                 "  whitespace\t\truns\n\n and ünïcödé 1234567", ""}) {
    auto a = from_gguf->Encode(text, true);
    auto b = from_hf->Encode(text, true);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CAPTURE(text);
    REQUIRE(*a == *b);
  }
  REQUIRE(from_hf->eos_id() == static_cast<int32_t>(tokens.size() - 1));
  std::ifstream cfg(std::filesystem::path(out) / "tokenizer_config.json");
  const auto config = nlohmann::json::parse(cfg);
  REQUIRE(config.at("eos_token") == "<|im_end|>");
  REQUIRE(config.at("bos_token") == "<|im_start|>");
  REQUIRE(config.contains("chat_template"));
  std::filesystem::remove_all(dir);
}

// A tokenizer.json with the 256 byte symbols, a few merges and two added tokens, in `dir`
// (with a tokenizer_config.json naming eos); `normalize` adds an NFC normalizer.
void WriteHfTokenizerDir(const std::filesystem::path& dir, bool normalize) {
  BpeSpec spec;
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(BytesToByteLevel(std::string(1, static_cast<char>(b))));
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{{"t", "h"}, {"th", "e"}, {"Ġ", "th"}}) {
    spec.merges.emplace_back(a, b);
    spec.tokens.push_back(a + b);
  }
  for (const char* t : {"<|endoftext|>", "<|im_end|>"}) {
    AddedToken a;
    a.id = static_cast<int32_t>(spec.tokens.size());
    a.content = t;
    a.special = true;
    spec.added_tokens.push_back(a);
    spec.tokens.push_back("");
  }
  spec.pre_tokenizer.push_back(PreTokenizerStep::ByteLevel(/*add_prefix_space=*/false, /*use_regex=*/true));
  if (normalize) spec.normalizers.push_back(Normalization::kNFC);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << BpeSpecToTokenizerJson(spec);
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "<|endoftext|>", "pad_token": "<|im_end|>"})";
}

TEST_CASE("An HF tokenizer.json as GGUF metadata loads back and encodes as the tokenizer.json does",
          "[tokenizer][gguf]") {
  const auto dir = std::filesystem::temp_directory_path() / ("l2l-gguf-from-hf-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  WriteHfTokenizerDir(dir / "hf", false);
  auto md = GgufTokenizerMetadataFromHf((dir / "hf").string(), 270);  // 261 ids + 9 the model pads
  INFO(md.status().ToString());
  REQUIRE(md.ok());
  formats::GgufWriter w;
  w.Set("general.architecture", formats::GgufValue::String("llama"));
  std::map<std::string, formats::GgufValue> by_key;
  for (const auto& [k, v] : *md) {
    w.Set(k, v);
    by_key[k] = v;
  }
  CHECK(by_key.at("tokenizer.ggml.pre").str == "gpt-2");
  REQUIRE(by_key.at("tokenizer.ggml.tokens").strings.size() == 270);
  CHECK(by_key.at("tokenizer.ggml.tokens").strings[265] == "[PAD265]");
  CHECK(by_key.at("tokenizer.ggml.token_type").ints[265] == 5);
  CHECK(by_key.at("tokenizer.ggml.token_type").ints[259] == 3);  // <|endoftext|>
  CHECK(by_key.at("tokenizer.ggml.eos_token_id").i == 259);
  CHECK(by_key.at("tokenizer.ggml.padding_token_id").i == 260);
  CHECK(by_key.count("tokenizer.ggml.bos_token_id") == 0);
  const std::string gguf = (dir / "t.gguf").string();
  REQUIRE(w.Write(gguf).ok());
  auto from_gguf = LoadTokenizer(gguf);
  auto from_hf = LoadTokenizer((dir / "hf").string());
  INFO(from_gguf.status().ToString() << " / " << from_hf.status().ToString());
  REQUIRE(from_gguf.ok());
  REQUIRE(from_hf.ok());
  for (const std::string text : {"the theme is there", "the<|endoftext|> th<|im_end|>e 42", "  ünïcödé\n\n x", ""}) {
    CAPTURE(text);
    REQUIRE(*from_gguf->Encode(text, true) == *from_hf->Encode(text, true));
  }
  CHECK(from_gguf->eos_id() == 259);

  // The model's vocabulary must hold every id; a normalizer has no GGUF form; no
  // tokenizer.json means no metadata.
  auto small = GgufTokenizerMetadataFromHf((dir / "hf").string(), 100);
  REQUIRE_FALSE(small.ok());
  CHECK(small.status().message().find("vocab_size is 100") != std::string::npos);
  WriteHfTokenizerDir(dir / "nfc", true);
  auto nfc = GgufTokenizerMetadataFromHf((dir / "nfc").string(), 270);
  REQUIRE_FALSE(nfc.ok());
  CHECK(nfc.status().code() == StatusCode::kUnimplemented);
  CHECK(nfc.status().message().find("normalizer") != std::string::npos);
  std::filesystem::create_directories(dir / "none");
  auto none = GgufTokenizerMetadataFromHf((dir / "none").string(), 270);
  REQUIRE(none.ok());
  CHECK(none->empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace l2l::tok
