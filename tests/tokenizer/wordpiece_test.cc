// Tests for tokenizer/wordpiece.h and tokenizer/classify.h on a tiny hand-made vocabulary:
// BertNormalizer steps, punctuation split, greedy longest-match with "##", [UNK] for
// uncoverable and over-long words, added tokens in raw text, pair token types, decode, the
// errors naming unsupported tokenizer.json fields, and classification rows (padding,
// LongestFirst truncation, file round trip, file:line errors). Expected ids are worked out
// by hand; wordpiece_oracle.py compares real tokenizers with HF `tokenizers`.
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/common/temp_dir.h"
#include "tokenizer/classify.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/wordpiece.h"

namespace l2l::tok {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

// [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, un 5, ##aff 6, ##able 7, a 8, ##b 9,
// cafe 10, "," 11, 中 12, hello 13.
json TinyJson() {
  json vocab = json::object();
  const char* toks[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "a", "##b",
                        "cafe", ",", "\xe4\xb8\xad", "hello"};
  for (int i = 0; i < 14; ++i) vocab[toks[i]] = i;
  json added = json::array();
  for (int i = 0; i < 5; ++i) {
    added.push_back({{"id", i}, {"content", toks[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true}, {"strip_accents", nullptr},
        {"lowercase", true}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"post_processor", {{"type", "BertProcessing"}, {"sep", {"[SEP]", 3}}, {"cls", {"[CLS]", 2}}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
      {"model",
       {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"},
        {"max_input_chars_per_word", 100}, {"vocab", vocab}}},
  };
}

WordPieceTokenizer Make(const json& j) {
  auto t = WordPieceTokenizer::FromTokenizerJsonText(j.dump(), "tiny");
  INFO((t.ok() ? "" : t.status().ToString()));
  REQUIRE(t.ok());
  return std::move(t).value();
}

void ExpectError(const Status& s, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(s.ok());
  INFO("message: " << s.ToString());
  for (const std::string& n : needles) CHECK(s.message().find(n) != std::string::npos);
}

TEST_CASE("WordPiece: normalizer, punctuation, greedy pieces, [UNK]", "[wordpiece]") {
  const WordPieceTokenizer tok = Make(TinyJson());
  CHECK(tok.vocab_size() == 14);
  // Lowercase, accent stripped (É -> e), "," split off, CJK spaced, "x" uncoverable.
  auto e = tok.Encode("UnAffable, CAF\xc3\x89\xe4\xb8\xadx", false);
  REQUIRE(e.ok());
  CHECK(e->ids == Ids{5, 6, 7, 11, 10, 12, 1});
  CHECK(e->type_ids == Ids(7, 0));
  // A word that is covered only partly is one [UNK] (not "a" + [UNK]).
  CHECK(tok.Encode("abx", false)->ids == Ids{1});
  // Control and format characters are dropped (so "a\x01\u200bb" is "ab"); tabs and
  // newlines split words.
  CHECK(tok.Encode("a\x01\xe2\x80\x8b" "b\ta\nhello", false)->ids == Ids{8, 9, 8, 13});
  // Added tokens are matched in the raw text, also inside a word; a lowercased one is not.
  CHECK(tok.Encode("a[SEP]a [MASK]", false)->ids == Ids{8, 3, 8, 4});
  CHECK(tok.Encode("[sep]", false)->ids == Ids{1, 1, 1});
  CHECK(tok.Encode("", true)->ids == Ids{2, 3});
  CHECK_FALSE(tok.Encode("\xff", false).ok());
}

TEST_CASE("WordPiece: max_input_chars_per_word, cased normalizer", "[wordpiece]") {
  json j = TinyJson();
  j["model"]["max_input_chars_per_word"] = 5;
  j["normalizer"]["lowercase"] = false;  // strip_accents null follows lowercase: kept
  const WordPieceTokenizer tok = Make(j);
  CHECK(tok.Encode("unaffable hello unaff", false)->ids == Ids{1, 13, 5, 6});
  CHECK(tok.Encode("Hello caf\xc3\xa9", false)->ids == Ids{1, 1});
}

TEST_CASE("WordPiece: pairs, token types, decode", "[wordpiece]") {
  const WordPieceTokenizer tok = Make(TinyJson());
  auto e = tok.EncodePair("a", "ab", true);
  REQUIRE(e.ok());
  CHECK(e->ids == Ids{2, 8, 3, 8, 9, 3});
  CHECK(e->type_ids == Ids{0, 0, 0, 1, 1, 1});
  CHECK(tok.num_special_tokens(false) == 2);
  CHECK(tok.num_special_tokens(true) == 3);
  CHECK(tok.cls_id() == 2);
  CHECK(tok.sep_id() == 3);
  CHECK(tok.pad_id() == 0);
  CHECK(tok.mask_id() == 4);
  const Ids ids{2, 5, 6, 7, 11, 10, 8, 9, 3};
  CHECK(*tok.Decode(ids) == "unaffable, cafe ab");
  CHECK(*tok.Decode(ids, /*skip_special=*/false) == "[CLS] unaffable, cafe ab [SEP]");
  ExpectError(tok.Decode(Ids{2, 99}).status(), {"index 1"});
}

TEST_CASE("WordPiece: unsupported tokenizer.json fields are errors naming the field", "[wordpiece]") {
  auto err = [](json j) { return WordPieceTokenizer::FromTokenizerJsonText(j.dump(), "tiny").status(); };
  json j = TinyJson();
  j["normalizer"] = {{"type", "Lowercase"}};
  ExpectError(err(j), {"normalizer.type", "Lowercase"});
  j = TinyJson();
  j["normalizer"]["foo"] = true;
  ExpectError(err(j), {"normalizer.foo"});
  j = TinyJson();
  j["model"]["dropout"] = 0.1;
  ExpectError(err(j), {"model.dropout"});
  j = TinyJson();
  j["model"]["unk_token"] = "<unk>";
  ExpectError(err(j), {"model.unk_token", "<unk>"});
  j = TinyJson();
  j["added_tokens"][4]["lstrip"] = true;
  ExpectError(err(j), {"added_tokens[4].lstrip"});
  j = TinyJson();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  ExpectError(err(j), {"pre_tokenizer", "Whitespace"});
  j = TinyJson();
  j["decoder"] = {{"type", "ByteLevel"}};
  ExpectError(err(j), {"decoder.type", "ByteLevel"});
  j = TinyJson();
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  ExpectError(err(j), {"post_processor.type", "RobertaProcessing"});
  j = TinyJson();
  j["model"]["type"] = "BPE";
  ExpectError(err(j), {"model.type", "BPE"});
  // The BPE Tokenizer points a WordPiece tokenizer.json at this class.
  ExpectError(Tokenizer::FromTokenizerJsonText(TinyJson().dump(), "tiny").status(), {"WordPieceTokenizer"});
}

TEST_CASE("WordPiece: ids and numbers are checked integers, ids below the file's entry count", "[wordpiece]") {
  // TinyJson has 14 vocab entries and 5 added tokens: ids run from 0 to 18. Before, a vocab
  // id of 2^31 - 2 resized a 2^31-entry table and a float id was converted unchecked.
  auto err = [](json j) { return WordPieceTokenizer::FromTokenizerJsonText(j.dump(), "tiny").status(); };
  json j = TinyJson();
  j["model"]["vocab"]["hello"] = 2147483646;
  ExpectError(err(j), {"tiny: model.vocab[\"hello\"] = 2147483646", "out of range", "0 to 18"});
  j = TinyJson();
  j["model"]["vocab"]["hello"] = 19;
  ExpectError(err(j), {"model.vocab[\"hello\"] = 19", "0 to 18"});
  j = TinyJson();
  j["model"]["vocab"]["hello"] = 13.5;
  ExpectError(err(j), {"model.vocab[\"hello\"] = 13.5", "not an integer"});
  j = TinyJson();
  j["model"]["vocab"]["hello"] = -1;
  ExpectError(err(j), {"model.vocab[\"hello\"] = -1", "out of range"});
  j = TinyJson();
  j["added_tokens"][2]["id"] = 2147483646;
  ExpectError(err(j), {"added_tokens[2].id = 2147483646", "out of range"});
  j = TinyJson();
  j["added_tokens"][2]["id"] = 1e300;
  ExpectError(err(j), {"added_tokens[2].id", "not an integer"});
  j = TinyJson();
  j["post_processor"]["cls"][1] = 2.5;
  ExpectError(err(j), {"post_processor.cls[1] = 2.5", "not an integer"});
  j = TinyJson();
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0.5}}],
      "pair": [], "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]}}})");
  ExpectError(err(j), {"post_processor.single[1].Sequence.type_id = 0.5", "not an integer"});
  j["post_processor"]["single"][1]["Sequence"]["type_id"] = 0;
  j["post_processor"]["special_tokens"]["[CLS]"]["ids"] = {4294967296};
  ExpectError(err(j), {"special_tokens[\"[CLS]\"].ids[0] = 4294967296", "out of range"});
  j = TinyJson();
  j["model"]["max_input_chars_per_word"] = 1e30;
  ExpectError(err(j), {"model.max_input_chars_per_word", "not an integer"});
}

TEST_CASE("Classify rows: padding, LongestFirst truncation, files round trip, errors", "[wordpiece]") {
  const WordPieceTokenizer tok = Make(TinyJson());
  ClassifyRows rows;
  rows.max_len = 6;
  REQUIRE(AppendClassifyLine(tok, R"({"text": "a b", "label": 2})", "d:1", &rows).ok());
  // Room 3 for "a a a a a" (5) and "a" (1): the longer part gets what the shorter leaves.
  REQUIRE(AppendClassifyLine(tok, R"({"text_a": "a a a a a", "text_b": "a", "label": 0, "idx": 7})", "d:2", &rows).ok());
  // Room 3 for 4 + 4: halves, the odd token to B on a tie.
  REQUIRE(AppendClassifyLine(tok, R"({"text_a": "un un un un", "text_b": "a a a a", "label": 1})", "d:3", &rows).ok());
  // A single text keeps its first L-2 tokens.
  REQUIRE(AppendClassifyLine(tok, R"({"text": "hello a un a un", "label": 0})", "d:4", &rows).ok());
  CHECK(rows.ids == std::vector<uint32_t>{2, 8, 1, 3, 0, 0, /**/ 2, 8, 8, 3, 8, 3, /**/ 2, 5, 3, 8, 8, 3,
                                          /**/ 2, 13, 8, 5, 8, 3});
  CHECK(rows.type_ids == std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0});
  CHECK(rows.attention == std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  CHECK(rows.labels == std::vector<int32_t>{2, 0, 1, 0});
  CHECK(rows.num_classes == 3);

  testing::TempDir dir;
  const std::string path = dir.File("rows.bin");
  REQUIRE(WriteClassifyFiles(path, rows, 1, 3, tok.vocab_size()).ok());
  auto back = ReadClassifyFiles(path, tok.vocab_size());
  REQUIRE(back.ok());
  CHECK(back->max_len == 6);
  CHECK(back->num_classes == 3);
  CHECK(back->labels == std::vector<int32_t>{0, 1, 0});
  CHECK(back->ids == std::vector<uint32_t>(rows.ids.begin() + 6, rows.ids.end()));
  CHECK(back->type_ids == std::vector<uint8_t>(rows.type_ids.begin() + 6, rows.type_ids.end()));
  CHECK(back->attention == std::vector<uint8_t>(rows.attention.begin() + 6, rows.attention.end()));
  ExpectError(ReadClassifyFiles(path, 5).status(), {"rows.bin"});  // ids >= 5 present

  ExpectError(AppendClassifyLine(tok, R"({"text": "a"})", "d.jsonl:9", &rows), {"d.jsonl:9", "label"});
  ExpectError(AppendClassifyLine(tok, R"({"text": "a", "label": 1.5})", "d.jsonl:9", &rows), {"d.jsonl:9", "label"});
  ExpectError(AppendClassifyLine(tok, R"({"text_a": "a", "label": 1})", "d.jsonl:9", &rows), {"d.jsonl:9", "text_b"});
  ExpectError(AppendClassifyLine(tok, R"([1])", "d.jsonl:9", &rows), {"d.jsonl:9", "JSON object"});
  ClassifyRows tiny;
  tiny.max_len = 2;
  ExpectError(AppendClassifyLine(tok, R"({"text_a": "a", "text_b": "a", "label": 1})", "d.jsonl:3", &tiny),
              {"d.jsonl:3", "--max-len"});
}

}  // namespace
}  // namespace l2l::tok
