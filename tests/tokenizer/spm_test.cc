// Tests for SentencePiece-style BPE (tokenizer/spm.h through Tokenizer): merges by score
// (GGUF "llama") and by merge rank (tokenizer.json with byte_fallback), the "▁" prefix,
// byte fallback and the unknown token, control tokens in text, decoding, the Gemma chat
// template of SFT lines, and the errors for bad metadata. Expected ids are worked out by
// hand from the tiny vocabularies below (tests/tokenizer/spm_oracle.py covers the real
// Gemma 3 vocabulary and Llama-2-style tokenizer.json files against HF and sentencepiece).
#include <chrono>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tokenizer/sft.h"
#include "tokenizer/tokenizer.h"

namespace l2l::tok {
namespace {

using Ids = std::vector<int32_t>;

Ids Enc(const Tokenizer& t, std::string_view text, bool add_special = false) {
  auto r = t.Encode(text, add_special);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

void ExpectError(const Status& s, StatusCode code, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.ToString());
  CHECK(s.code() == code);
  for (const std::string& n : needles) CHECK(s.message().find(n) != std::string::npos);
}

// 0 <unk> (unknown), 1 <s>, 2 </s> (control), 3-5 <0x0A> <0xC3> <0xA9> (byte), then normal
// pieces with scores: 6 "▁" -1, 7 "a" -2, 8 "b" -3, 9 "c" -4, 10 "ab" -5, 11 "bc" -6,
// 12 "▁ab" -7, 13 "<0x41>" (a normal piece spelled like a byte token) -8; 14 "  " user defined.
GgufVocab TinySpm() {
  GgufVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "<0xA9>", "\xE2\x96\x81", "a", "b", "c", "ab", "bc",
              "\xE2\x96\x81" "ab", "<0x41>", "  "};
  v.scores = {0, 0, 0, 0, 0, 0, -1, -2, -3, -4, -5, -6, -7, -8, 0};
  v.token_types = {2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1, 1, 4};
  v.bos_id = 1;
  v.eos_id = 2;
  v.unk_id = 0;
  v.add_space_prefix = false;
  return v;
}

TEST_CASE("SentencePiece BPE from GGUF merges by score, falls back to bytes, matches control tokens", "[tokenizer][spm]") {
  auto t = Tokenizer::FromGguf(TinySpm(), "tiny.gguf");
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  CHECK(t->model() == BpeModel::kSentencePiece);
  CHECK(Enc(*t, "abc") == Ids{10, 9});             // "ab" (-5) beats "bc" (-6)
  CHECK(Enc(*t, "ab c") == Ids{10, 6, 9});         // "ab▁c": no "▁c", "b▁"
  CHECK(Enc(*t, " ab") == Ids{12});                // "▁ab": "ab" first, then "▁"+"ab"
  CHECK(Enc(*t, "\xC3\xA9\n") == Ids{4, 5, 3});    // é and \n have no piece: their bytes
  CHECK(Enc(*t, "zz") == Ids{0, 0});               // no piece, no byte tokens: <unk> each (not fused)
  CHECK(Enc(*t, "a</s>b") == Ids{7, 2, 8});        // control tokens are matched in the text
  CHECK(Enc(*t, "a  b") == Ids{7, 14, 8});         // user-defined "  " before spaces become "▁"
  CHECK(Enc(*t, "A") == Ids{0});                   // "<0x41>" is a piece's text, not the byte 'A'
  CHECK(Enc(*t, "ab", /*add_special=*/true) == Ids{1, 10});  // add_bos default for "llama": true
  CHECK(Enc(*t, "") == Ids{});
  CHECK(*t->Decode(Ids{1, 12, 6, 9, 4, 5, 3}) == "<s> ab c\xC3\xA9\n");
  CHECK(t->TokenBytes(12) == " ab");
  CHECK(t->TokenId(" ab") == 12);

  // Scores decide, not the order of the pieces: with "bc" above "ab", "abc" is a + bc.
  GgufVocab v = TinySpm();
  v.scores[11] = -4.5f;
  CHECK(Enc(*Tokenizer::FromGguf(v, "v"), "abc") == Ids{7, 11});

  // add_space_prefix (absent: true, as llama.cpp): "▁" before the text and after every
  // added token; Decode strips the first.
  v = TinySpm();
  v.add_space_prefix.reset();
  auto p = Tokenizer::FromGguf(v, "p");
  REQUIRE(p.ok());
  CHECK(Enc(*p, "ab") == Ids{12});
  CHECK(Enc(*p, "ab</s>ab") == Ids{12, 2, 12});
  CHECK(*p->Decode(Ids{12, 6, 9}) == "ab c");
  v.add_bos = false;
  CHECK(Enc(*Tokenizer::FromGguf(v, "p"), "ab", true) == Ids{12});
}

TEST_CASE("SentencePiece BPE is not quadratic in the length of a piece", "[tokenizer][spm]") {
  auto t = Tokenizer::FromGguf(TinySpm(), "tiny.gguf");
  REQUIRE(t.ok());
  std::string text;
  for (int i = 0; i < 200000; ++i) text += "abc ";  // 800 KB, one piece (no pre-tokenizer)
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = Enc(*t, text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // "abc▁abc▁...abc▁": ab c, then ▁ab c per repeat ("ab" before "▁ab"), and the last ▁.
  REQUIRE(ids.size() == 400001);
  CHECK(ids[0] == 10);
  CHECK(ids[1] == 9);
  CHECK(ids[2] == 12);
  CHECK(ids[3] == 9);
  CHECK(ids.back() == 6);
  CHECK(s < 20.0);  // O(n log n): well under a second; quadratic would take hours
}

TEST_CASE("Bad SentencePiece GGUF metadata is refused naming the file and key", "[tokenizer][spm][errors]") {
  GgufVocab v = TinySpm();
  v.scores.clear();
  ExpectError(Tokenizer::FromGguf(v, "m.gguf").status(), StatusCode::kInvalidArgument, {"m.gguf", "tokenizer.ggml.scores"});
  v = TinySpm();
  v.scores.pop_back();
  ExpectError(Tokenizer::FromGguf(v, "m.gguf").status(), StatusCode::kInvalidArgument,
              {"m.gguf", "tokenizer.ggml.scores has 14", "tokenizer.ggml.tokens 15"});
  v = TinySpm();
  v.token_types.pop_back();
  ExpectError(Tokenizer::FromGguf(v, "m.gguf").status(), StatusCode::kInvalidArgument, {"m.gguf", "token_type has 14"});
  v = TinySpm();
  v.token_types[7] = 9;
  ExpectError(Tokenizer::FromGguf(v, "m.gguf").status(), StatusCode::kInvalidArgument, {"m.gguf", "token_type[7] is 9"});
  v = TinySpm();
  v.token_types[7] = 6;
  ExpectError(Tokenizer::FromGguf(v, "m.gguf").status(), StatusCode::kInvalidArgument, {"m.gguf", "tokens[7]", "byte"});
  v = TinySpm();
  v.unk_id = 99;
  ExpectError(Tokenizer::FromGguf(v, "m.gguf").status(), StatusCode::kInvalidArgument, {"m.gguf", "unknown_token_id 99"});
  auto spec = Tokenizer::SpecFromGguf(TinySpm(), "t");  // a BpeSpec made by hand is checked as well
  REQUIRE(spec.ok());
  spec->token_types.pop_back();
  ExpectError(Tokenizer::Create(*spec, "spec").status(), StatusCode::kInvalidArgument, {"spec", "14 token types for 15 tokens"});
  spec->token_types.push_back(4);
  spec->scores.pop_back();
  ExpectError(Tokenizer::Create(*spec, "spec").status(), StatusCode::kInvalidArgument, {"spec", "14 scores for 15 tokens"});
  v = TinySpm();
  v.tokens[8] = "";
  v.token_types[8] = 3;
  ExpectError(Tokenizer::FromGguf(v, "m.gguf").status(), StatusCode::kInvalidArgument, {"m.gguf", "tokens[8] is empty"});
}

// A Llama-2-style tokenizer.json: byte_fallback, merges, unk, Prepend + Replace normalizer.
std::string Llama2Json(const std::string& normalizer, const std::string& pre, const std::string& decoder) {
  return R"({"added_tokens": [{"id": 0, "content": "<unk>", "special": true, "normalized": false},
      {"id": 1, "content": "<s>", "special": true, "normalized": false}],
    "normalizer": )" + normalizer + R"(, "pre_tokenizer": )" + pre + R"(,
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": )" + decoder + R"(,
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
      "vocab": {"<unk>": 0, "<s>": 1, "<0xC3>": 2, "<0xA9>": 3, "▁": 4, "a": 5, "b": 6, "ab": 7, "▁ab": 8, "ba": 9},
      "merges": ["a b", "▁ ab", "b a"]}})";
}

TEST_CASE("SentencePiece BPE from tokenizer.json merges by rank with byte fallback and fused unk", "[tokenizer][spm]") {
  const std::string dec =
      R"({"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
          {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})";
  const std::string legacy = R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})";
  auto t = Tokenizer::FromTokenizerJsonText(Llama2Json(legacy, "null", dec), "l2.json");
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  CHECK(Enc(*t, "ab", true) == Ids{1, 8});      // ▁ab: (a,b) rank 0, then (▁,ab)
  CHECK(Enc(*t, "aba") == Ids{8, 5});           // (a,b) at 0 beats (b,a) at 1: ▁ab a
  CHECK(Enc(*t, "\xC3\xA9") == Ids{4, 2, 3});   // é: byte fallback
  CHECK(Enc(*t, "xy\xC3\xA9z") == Ids{4, 2, 3, 0});  // x, y fused into one <unk>, written after é (as tokenizers)
  CHECK(Enc(*t, "a<s>a") == Ids{4, 5, 1, 4, 5});     // Prepend runs on the text after an added token too
  CHECK(*t->Decode(Ids{1, 8, 4, 5, 2, 3}) == "<s> ab a\xC3\xA9");
  CHECK(*t->Decode(Ids{8, 4, 5}) == "ab a");     // Strip: one leading space

  // Metaspace prepend_scheme "first": "▁" only at the start, not after added tokens.
  auto m = Tokenizer::FromTokenizerJsonText(
      Llama2Json("null", R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})", dec), "m.json");
  INFO(m.status().ToString());
  REQUIRE(m.ok());
  CHECK(Enc(*m, "a<s>a") == Ids{4, 5, 1, 5});
  CHECK(Enc(*m, " ab") == Ids{8});  // already starts with "▁": no second one

  // What we do not implement is refused, naming the field.
  ExpectError(Tokenizer::FromTokenizerJsonText(Llama2Json(R"({"type": "Lowercase"})", "null", dec), "x.json").status(),
              StatusCode::kUnimplemented, {"x.json", "normalizer", "Lowercase"});
  ExpectError(Tokenizer::FromTokenizerJsonText(Llama2Json("null", "null", R"({"type": "WordPiece"})"), "x.json").status(),
              StatusCode::kUnimplemented, {"x.json", "decoder", "WordPiece"});
  ExpectError(Tokenizer::FromTokenizerJsonText(
                  Llama2Json("null", R"({"type": "ByteLevel", "add_prefix_space": false})", dec), "x.json").status(),
              StatusCode::kUnimplemented, {"x.json", "pre_tokenizer", "ByteLevel"});
}

TEST_CASE("A SentencePiece GGUF vocabulary exported as tokenizer.json encodes the same", "[tokenizer][spm]") {
  GgufVocab v = TinySpm();
  v.add_space_prefix = true;
  auto spec = Tokenizer::SpecFromGguf(v, "tiny");
  REQUIRE(spec.ok());
  auto back = Tokenizer::FromTokenizerJsonText(BpeSpecToTokenizerJson(*spec), "exported");
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  auto gguf = Tokenizer::FromGguf(v, "tiny");
  REQUIRE(gguf.ok());
  for (const char* text : {"abc ab", "ab</s>ab  c", "\xC3\xA9 b a\n", "zz ba"}) {
    CAPTURE(text);
    CHECK(Enc(*back, text, true) == Enc(*gguf, text, true));
    CHECK(*back->Decode(Enc(*gguf, text)) == *gguf->Decode(Enc(*gguf, text)));
  }
}

TEST_CASE("SFT messages with a Gemma tokenizer use Gemma's chat template and mask the model turns", "[tokenizer][spm][sft]") {
  GgufVocab v = TinySpm();
  v.tokens.push_back("<start_of_turn>");  // 15
  v.tokens.push_back("<end_of_turn>");    // 16
  v.tokens.push_back("\n");               // 17, user defined as in Gemma's vocabulary
  v.tokens.push_back("user");             // 18, user defined here to keep the ids short
  v.tokens.push_back("model");            // 19
  v.scores.insert(v.scores.end(), {0, 0, 0, 0, 0});
  v.token_types.insert(v.token_types.end(), {3, 3, 4, 4, 4});
  auto t = Tokenizer::FromGguf(v, "gemma-like");
  REQUIRE(t.ok());
  CHECK(ChatFormatOf(&*t) == ChatFormat::kGemma);
  auto ex = EncodeSftLine(&*t, R"({"messages": [{"role": "system", "content": "b"}, {"role": "user", "content": " a "},
      {"role": "assistant", "content": "ab\n"}]})", "d.jsonl:1");
  INFO(ex.status().ToString());
  REQUIRE(ex.ok());
  // <bos> (prefix) <start_of_turn>user\n b\n\n a <end_of_turn>\n <start_of_turn>model\n ab <end_of_turn> \n
  CHECK(ex->text == "<start_of_turn>user\nb\n\na<end_of_turn>\n<start_of_turn>model\nab<end_of_turn>\n");
  CHECK(ex->ids == Ids{1, 15, 18, 17, 8, 17, 17, 7, 16, 17, 15, 19, 17, 10, 16, 17});
  CHECK(ex->mask == std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0});
  ExpectError(EncodeSftLine(&*t, R"({"messages": [{"role": "assistant", "content": "a"}]})", "d.jsonl:2").status(),
              StatusCode::kInvalidArgument, {"d.jsonl:2", "messages[0]", "alternate"});
}

TEST_CASE("SFT masks line up with a SentencePiece tokenizer that adds a space prefix", "[tokenizer][spm][sft]") {
  GgufVocab v = TinySpm();
  v.add_space_prefix = true;
  auto t = Tokenizer::FromGguf(v, "llama2-like");
  REQUIRE(t.ok());
  auto ex = EncodeSftLine(&*t, R"({"prompt": "ab ", "completion": "ab</s>b"})", "d.jsonl:1");
  INFO(ex.status().ToString());
  REQUIRE(ex.ok());
  // <s> | "▁ab▁ab" -> ▁ab ▁ab | </s> | "▁b" -> ▁ b | EOS
  CHECK(ex->ids == Ids{1, 12, 12, 2, 6, 8, 2});
  // Targets: the completion's bytes start at "ab" after "ab " (the second ▁ab holds the
  // prompt's space as its first byte, so it is a prompt token), then </s>, ▁ (prefix), b, EOS.
  CHECK(ex->mask == std::vector<uint8_t>{0, 0, 0, 1, 1, 1, 1});
}

}  // namespace
}  // namespace l2l::tok
