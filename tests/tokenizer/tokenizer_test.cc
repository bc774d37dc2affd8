// Tests for tokenizer/: BPE merge order, ignore_merges, added tokens (lstrip, rstrip,
// leftmost-longest), bytes outside UTF-8, long whitespace runs, the GGUF constructor's
// pre-name rules and errors, tokenizer.json errors, and SFT line formatting. Expected ids
// are worked out by hand from the tiny vocabularies below (the HF oracle in hf_oracle.py
// covers real tokenizers).
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "tokenizer/sft.h"
#include "tokenizer/tokenizer.h"

namespace l2l::tok {
namespace {

using Ids = std::vector<int32_t>;

void ExpectError(const Status& s, StatusCode code, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.ToString());
  CHECK(s.code() == code);
  for (const std::string& n : needles) CHECK(s.message().find(n) != std::string::npos);
}

// Ids 0..255: the byte tokens (id = byte value); 256 "ab", 257 "abc", 258 " a", 259 "bc",
// 260 "ca". Merge ranks: (a,b) 0, (ab,c) 1, (' ',a) 2, (b,c) 3.
BpeSpec TinySpec() {
  BpeSpec s;
  for (int b = 0; b < 256; ++b) s.tokens.push_back(BytesToByteLevel(std::string(1, static_cast<char>(b))));
  for (const char* t : {"ab", "abc", "Ġa", "bc", "ca"}) s.tokens.push_back(t);
  s.merges = {{"a", "b"}, {"ab", "c"}, {"Ġ", "a"}, {"b", "c"}};
  s.pre_tokenizer = {PreTokenizerStep::ByteLevel(false, true)};
  return s;
}

Ids Enc(const Tokenizer& t, std::string_view text) {
  auto r = t.Encode(text, /*add_special=*/true);
  REQUIRE(r.ok());
  return *r;
}

}  // namespace

TEST_CASE("The byte-level alphabet is GPT-2's bytes_to_unicode", "[tokenizer]") {
  CHECK(ByteToUnicode(' ') == 0x120);   // 'Ġ'
  CHECK(ByteToUnicode('\n') == 0x10A);  // 'Ċ'
  CHECK(ByteToUnicode('a') == 'a');
  CHECK(ByteToUnicode(0xAD) == 0x143);  // the one gap in the Latin-1 printable range
  CHECK(*ByteLevelToBytes("ĠhelloĊ") == " hello\n");
  CHECK_FALSE(ByteLevelToBytes("a b").has_value());  // a raw space is outside the alphabet
}

TEST_CASE("BPE applies merges lowest rank first, leftmost first", "[tokenizer]") {
  auto t = Tokenizer::Create(TinySpec(), "tiny");
  REQUIRE(t.ok());
  CHECK(Enc(*t, "abc") == Ids{257});           // (a,b) then (ab,c)
  CHECK(Enc(*t, " abc") == Ids{32, 257});      // (a,b) beats (' ',a); then (ab,c)
  CHECK(Enc(*t, "ab bc") == Ids{256, 32, 259});
  CHECK(Enc(*t, "ca") == Ids{'c', 'a'});       // "ca" has no merge
  CHECK(*t->Decode(Ids{32, 257}) == " abc");
  CHECK(t->vocab_size() == 261);
  // ignore_merges: a word that is a token is that token.
  BpeSpec s = TinySpec();
  s.ignore_merges = true;
  auto ti = Tokenizer::Create(s, "tiny");
  REQUIRE(ti.ok());
  CHECK(Enc(*ti, "ca") == Ids{260});
}

TEST_CASE("Bytes that are not UTF-8 and long whitespace runs encode and decode back exactly", "[tokenizer]") {
  auto t = Tokenizer::Create(TinySpec(), "tiny");
  REQUIRE(t.ok());
  const std::string bad = "a\xff\xfe b\xc3";
  const Ids ids = Enc(*t, bad);
  CHECK(ids == Ids{'a', 0xff, 0xfe, ' ', 'b', 0xc3});
  CHECK(*t->Decode(ids) == bad);
  const std::string ws = std::string(200000, ' ') + "\t\n" + std::string(50000, '\n') + "x";
  const Ids wids = Enc(*t, ws);
  CHECK(wids.size() == ws.size());
  CHECK(*t->Decode(wids) == ws);
  ExpectError(t->Decode(Ids{1, 261}).status(), StatusCode::kOutOfRange, {"token 1 is 261"});
  ExpectError(t->Decode(Ids{-1}).status(), StatusCode::kOutOfRange, {"token 0 is -1"});
}

TEST_CASE("Encode from several threads at once gives the single-thread ids", "[tokenizer][threads]") {
  BpeSpec s = TinySpec();
  s.pre_tokenizer = {PreTokenizerStep::Split(R"(\p{N})"), PreTokenizerStep::ByteLevel(false, true)};
  auto t = Tokenizer::Create(s, "tiny");
  REQUIRE(t.ok());
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("abc " + std::to_string(i * 7919) + " bcab\tca ab" + std::string(i % 5, ' '));
  std::vector<Ids> want;
  for (const std::string& x : texts) want.push_back(*t->Encode(x));
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 20; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) bad[k] += *t->Encode(texts[i]) != want[i];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(bad == std::vector<int>{0, 0, 0, 0});
}

TEST_CASE("Added tokens match leftmost-longest before pre-tokenization, with lstrip and rstrip", "[tokenizer]") {
  BpeSpec s = TinySpec();
  s.added_tokens = {{300, "<x>", true}, {301, "<x>y", true}, {302, "<l>", true, /*lstrip=*/true},
                    {303, "<r>", true, false, /*rstrip=*/true}};
  s.prefix_ids = {300};
  auto t = Tokenizer::Create(s, "tiny");
  REQUIRE(t.ok());
  CHECK(t->vocab_size() == 304);
  CHECK(*t->Encode("a<x>b", false) == Ids{'a', 300, 'b'});
  CHECK(*t->Encode("<x>yb", false) == Ids{301, 'b'});
  CHECK(*t->Encode("a \t <l>b", false) == Ids{'a', 302, 'b'});
  CHECK(*t->Encode("a<r> \n b", false) == Ids{'a', 303, 'b'});
  CHECK(*t->Encode("<x", false) == Ids{'<', 'x'});
  CHECK(Enc(*t, "ab") == Ids{300, 256});  // the post-processor's prefix
  CHECK(*t->Decode(Ids{300, 'a'}) == "<x>a");
  CHECK(t->TokenId("<x>y") == 301);
  CHECK(t->TokenId("abc") == 257);
  CHECK(t->IsAddedToken(302));
  CHECK_FALSE(t->IsAddedToken(257));
}

TEST_CASE("Bad specs are refused naming what is wrong", "[tokenizer][errors]") {
  BpeSpec s = TinySpec();
  s.merges.push_back({"c", "a"});
  s.merges.push_back({"q", "zz"});
  ExpectError(Tokenizer::Create(s, "spec").status(), StatusCode::kInvalidArgument, {"spec", "merge 5", "\"zz\""});
  s = TinySpec();
  s.pre_tokenizer = {PreTokenizerStep::Split("(unclosed")};
  ExpectError(Tokenizer::Create(s, "spec").status(), StatusCode::kInvalidArgument, {"(unclosed", "does not compile"});
  s.pre_tokenizer = {PreTokenizerStep::Split(R"(\p{N})")};
  ExpectError(Tokenizer::Create(s, "spec").status(), StatusCode::kInvalidArgument, {"no ByteLevel"});
  s = TinySpec();
  s.tokens[5] = s.tokens[6];
  ExpectError(Tokenizer::Create(s, "spec").status(), StatusCode::kInvalidArgument, {"appears twice"});
}

TEST_CASE("GGUF vocabularies take llama.cpp's split rules from tokenizer.ggml.pre", "[tokenizer][gguf]") {
  GgufVocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(BytesToByteLevel(std::string(1, static_cast<char>(b))));
  v.tokens.push_back("12");         // 256
  v.tokens.push_back("<|im_end|>"); // 257, control
  v.merges = {"1 2"};
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[257] = 3;
  v.bos_id = 257;
  v.eos_id = 257;

  v.pre = "gpt-2";
  auto gpt2 = Tokenizer::FromGguf(v);
  REQUIRE(gpt2.ok());
  CHECK(Enc(*gpt2, "12<|im_end|>") == Ids{256, 257});
  v.pre = "smollm";  // every digit its own word first
  auto smol = Tokenizer::FromGguf(v);
  REQUIRE(smol.ok());
  CHECK(Enc(*smol, "12<|im_end|>") == Ids{'1', '2', 257});
  CHECK(smol->prefix_ids().empty());
  v.pre = "llama-bpe";  // adds BOS unless the file says otherwise
  auto llama = Tokenizer::FromGguf(v);
  REQUIRE(llama.ok());
  CHECK(Enc(*llama, "12") == Ids{257, 256});
  // Exported as tokenizer.json, the same tokenizer comes back (BOS template included).
  auto spec = Tokenizer::SpecFromGguf(v);
  REQUIRE(spec.ok());
  auto back = Tokenizer::FromTokenizerJsonText(BpeSpecToTokenizerJson(*spec), "exported");
  REQUIRE(back.ok());
  CHECK(Enc(*back, "12 <|im_end|>12") == Enc(*llama, "12 <|im_end|>12"));
  CHECK(back->prefix_ids().size() == 1);
  v.add_bos = false;
  CHECK(Enc(*Tokenizer::FromGguf(v), "12") == Ids{256});
  v.pre = "qwen2";  // one digit per word
  CHECK(Enc(*Tokenizer::FromGguf(v), "12") == Ids{'1', '2'});

  v.pre = "deepseek-coder";
  ExpectError(Tokenizer::FromGguf(v, "m.gguf").status(), StatusCode::kUnimplemented, {"m.gguf", "deepseek-coder"});
  v.pre = "gpt-2";
  GgufVocab w = v;
  w.token_types.pop_back();
  ExpectError(Tokenizer::FromGguf(w, "m.gguf").status(), StatusCode::kInvalidArgument, {"token_type has 257", "258"});
  w = v;
  w.merges = {"12"};
  ExpectError(Tokenizer::FromGguf(w, "m.gguf").status(), StatusCode::kInvalidArgument, {"merges[0]", "\"12\""});
  w = v;
  w.model = "bert";
  ExpectError(Tokenizer::FromGguf(w, "m.gguf").status(), StatusCode::kUnimplemented, {"\"bert\"", "gpt2", "llama"});
  w.model = "llama";  // SentencePiece: merges by score, so scores are required (tokenizer/spm_test.cc)
  ExpectError(Tokenizer::FromGguf(w, "m.gguf").status(), StatusCode::kInvalidArgument, {"m.gguf", "tokenizer.ggml.scores"});
  w = v;
  w.bos_id = 999;
  ExpectError(Tokenizer::FromGguf(w, "m.gguf").status(), StatusCode::kInvalidArgument, {"bos_token_id 999"});
}

TEST_CASE("tokenizer.json features we do not implement are refused, not approximated", "[tokenizer][errors]") {
  const std::string base = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}, "normalizer": NORM,
      "decoder": DEC})";
  auto make = [&](const std::string& norm, const std::string& dec) {
    std::string j = base;
    j.replace(j.find("NORM"), 4, norm);
    j.replace(j.find("DEC"), 3, dec);
    return Tokenizer::FromTokenizerJsonText(j, "tok.json");
  };
  auto ok = make("null", R"({"type": "ByteLevel"})");
  REQUIRE(ok.ok());
  CHECK(*ok->Encode("ab") == Ids{2});
  ExpectError(make(R"({"type": "Lowercase"})", "null").status(), StatusCode::kUnimplemented, {"tok.json", "Lowercase"});
  ExpectError(make("null", R"({"type": "WordPiece"})").status(), StatusCode::kUnimplemented, {"decoder", "WordPiece"});
  ExpectError(Tokenizer::FromTokenizerJsonText("{", "x.json").status(), StatusCode::kInvalidArgument, {"x.json", "not a JSON"});
  ExpectError(Tokenizer::FromTokenizerJsonText(R"({"model": {"type": "Unigram"}})", "u.json").status(),
              StatusCode::kUnimplemented, {"Unigram"});
  ExpectError(Tokenizer::FromTokenizerJsonText(R"({"model": {"type": "BPE", "vocab": {}, "merges": [1]}})", "m.json").status(),
              StatusCode::kInvalidArgument, {"merges[0]"});
  ExpectError(Tokenizer::FromTokenizerJson("/nonexistent/dir/tokenizer.json").status(), StatusCode::kNotFound, {"/nonexistent"});
  // Token ids must be integers in range: a float (the fuzzer's 5.5e108 overflowed the
  // conversion), a negative or a huge id names the entry.
  for (const char* id : {"5.5e108", "1.5", "-1", "4294967296", "\"7\""}) {
    const std::string j = std::string(R"({"model": {"type": "BPE", "vocab": {"a": )") + id + R"(}, "merges": []}})";
    INFO(j);
    ExpectError(Tokenizer::FromTokenizerJsonText(j, "v.json").status(), StatusCode::kInvalidArgument,
                {"v.json", "model.vocab[\"a\"]"});
  }
  ExpectError(Tokenizer::FromTokenizerJsonText(
                  R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 1e300, "content": "x"}]})",
                  "t.json")
                  .status(),
              StatusCode::kInvalidArgument, {"t.json", "added_tokens[0].id"});
}

TEST_CASE("tokenizer.json ids are bounded by the file's entries: a huge id is refused, not allocated",
          "[tokenizer][json]") {
  // A vocab of n entries and m added tokens has ids below n + m. Before, one vocab id of
  // 2^31 - 2 in a 60-byte file resized a 2^31-entry table (std::bad_alloc, SIGABRT).
  auto load = [](const std::string& vocab, const std::string& rest = "") {
    return Tokenizer::FromTokenizerJsonText(R"({"model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": []})" + rest + "}",
                                            "b.json")
        .status();
  };
  ExpectError(load(R"({"a": 2147483646})"), StatusCode::kInvalidArgument,
              {"b.json", "model.vocab[\"a\"] = 2147483646", "out of range", "0 to 0"});
  ExpectError(load(R"({"a": 0, "b": 2})"), StatusCode::kInvalidArgument, {"model.vocab[\"b\"] = 2", "0 to 1"});
  // An added token's id counts: 2 vocab entries + 1 added token reach id 2, not 3.
  const std::string added2 = R"(, "added_tokens": [{"id": 2, "content": "<x>", "special": true}])";
  const std::string added3 = R"(, "added_tokens": [{"id": 3, "content": "<x>", "special": true}])";
  ExpectError(load(R"({"a": 0, "b": 1})", added3), StatusCode::kInvalidArgument, {"added_tokens[0].id = 3", "0 to 2"});
  ExpectError(load(R"({"a": 0, "b": 1})", R"(, "added_tokens": [{"id": 2.0, "content": "<x>"}])"),
              StatusCode::kInvalidArgument, {"added_tokens[0].id = 2.0", "not an integer"});
  // The post-processor's ids are bounded and checked as integers too.
  ExpectError(load(R"({"a": 0})", R"(, "post_processor": {"type": "BertProcessing", "cls": ["a", 1e300], "sep": ["a", 0]})"),
              StatusCode::kInvalidArgument, {"post_processor.cls[1]", "not an integer"});
  ExpectError(load(R"({"a": 0})", R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "s"}}, {"Sequence": {"id": "A"}}], "special_tokens": {"s": {"ids": [4294967295]}}})"),
              StatusCode::kInvalidArgument, {"special_tokens[\"s\"].ids[0] = 4294967295", "out of range"});
  // In bounds, the same shapes load (the check refuses nothing a dense file has).
  auto ok = Tokenizer::FromTokenizerJsonText(
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []})" + added2 +
          R"(, "pre_tokenizer": {"type": "ByteLevel"}})",
      "ok.json");
  INFO((ok.ok() ? std::string() : ok.status().ToString()));
  REQUIRE(ok.ok());
  CHECK(*ok->Encode("ab<x>", false) == Ids{0, 1, 2});
}

TEST_CASE("SFT lines give ids and a mask over the completion, and bad lines name where they are", "[tokenizer][sft]") {
  auto ex = EncodeSftLine(nullptr, R"({"prompt": "ab", "completion": "c"})", "f.jsonl:1");
  REQUIRE(ex.ok());
  CHECK(ex->ids == Ids{'a', 'b', 'c'});
  CHECK(ex->mask == std::vector<uint8_t>{0, 0, 1});
  auto m = EncodeSftLine(nullptr, R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ok"}]})",
                         "f.jsonl:2");
  REQUIRE(m.ok());
  CHECK(m->text == "qok");
  CHECK(m->mask == std::vector<uint8_t>{0, 1, 1});
  ExpectError(EncodeSftLine(nullptr, "{", "f.jsonl:3").status(), StatusCode::kInvalidArgument, {"f.jsonl:3", "JSON"});
  ExpectError(EncodeSftLine(nullptr, R"({"messages": [{"content": "x"}]})", "f.jsonl:4").status(),
              StatusCode::kInvalidArgument, {"f.jsonl:4", "messages[0]", "role"});
  ExpectError(EncodeSftLine(nullptr, R"({"text": "x"})", "f.jsonl:5").status(), StatusCode::kInvalidArgument,
              {"f.jsonl:5", "neither"});
  ExpectError(EncodeSftLine(nullptr, R"({"prompt": 3, "completion": "x"})", "f.jsonl:6").status(),
              StatusCode::kInvalidArgument, {"f.jsonl:6", "prompt", "not a string"});
}

}  // namespace l2l::tok
