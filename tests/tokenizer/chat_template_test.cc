// Tests for tokenizer/chat_template.h: ChatML rendering (worked out by hand from the
// template's definition), a model's Jinja source recognised with its default system
// prompt (literal newlines and Jinja's \n escapes; an expression is not a default), the
// errors naming the unknown name and the formats known, and reading the source from
// tokenizer_config.json. tests/tools/chat_oracle.py compares whole conversations with
// transformers' apply_chat_template.
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/common/temp_dir.h"
#include "tokenizer/chat_template.h"

namespace l2l::tok {
namespace {

const std::vector<ChatMessage> kTwoTurns = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};

TEST_CASE("ChatML renders each message as <|im_start|>role, content, <|im_end|>", "[tokenizer][chat]") {
  Result<ChatTemplate> t = ChatTemplate::ByName("chatml");
  REQUIRE(t.ok());
  CHECK(t->end_of_turn() == "<|im_end|>");
  CHECK(t->Render(kTwoTurns, false) ==
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n");
  CHECK(t->Render({{"user", "Hi"}}, true) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

// The expected strings are what jinja2 (HF's settings: trim_blocks, lstrip_blocks) renders
// from Gemma 3's own chat template (tests/tokenizer/fixtures/gemma3_chat_template.jinja,
// as apply_chat_template does) for these messages, bos_token "<bos>": not worked out here.
TEST_CASE("Gemma's template folds the system message into the first user turn and trims contents",
          "[tokenizer][chat]") {
  Result<ChatTemplate> t = ChatTemplate::ByName("gemma");
  REQUIRE(t.ok());
  CHECK(t->end_of_turn() == "<end_of_turn>");
  CHECK(t->Render({{"system", "Be brief."}, {"user", "  Hi there \n"}, {"assistant", "Hello!"},
                   {"user", "Capital of France?"}},
                  true) ==
        "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n");
  CHECK(t->Render({{"user", "One"}}, false) == "<bos><start_of_turn>user\nOne<end_of_turn>\n");
  std::ifstream jinja(std::string(L2L_SOURCE_DIR) + "/tests/tokenizer/fixtures/gemma3_chat_template.jinja");
  REQUIRE(jinja.good());
  const std::string source((std::istreambuf_iterator<char>(jinja)), std::istreambuf_iterator<char>());
  Result<ChatTemplate> from = ChatTemplate::FromJinja(source);
  REQUIRE(from.ok());
  CHECK(from->name() == "gemma");
}

TEST_CASE("A default system prompt opens a conversation that has no system message", "[tokenizer][chat]") {
  Result<ChatTemplate> t = ChatTemplate::ByName("chatml", "Be kind.");
  REQUIRE(t.ok());
  CHECK(t->Render({{"user", "Hi"}}, true) ==
        "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(t->Render({{"system", "Be brief."}, {"user", "Hi"}}, false) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST_CASE("A model's Jinja template is recognised, its default system prompt read out of it", "[tokenizer][chat]") {
  // SmolLM2's (a literal newline inside the string), Qwen2.5's shape (Jinja's \n escape,
  // the first "<|im_start|>system" inside an expression), and one without a default.
  const std::string smollm2 =
      "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are SmolLM<|im_end|>\n' }}"
      "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}";
  const std::string qwen =
      "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
      "{{- '<|im_start|>system\\nYou are Qwen.\\nBe helpful.<|im_end|>\\n' }}";
  const std::string plain = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'}}";
  Result<ChatTemplate> a = ChatTemplate::FromJinja(smollm2);
  Result<ChatTemplate> b = ChatTemplate::FromJinja(qwen);
  Result<ChatTemplate> c = ChatTemplate::FromJinja(plain);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  CHECK(a->name() == "chatml");
  CHECK(a->default_system() == "You are SmolLM");
  CHECK(b->default_system() == "You are Qwen.\nBe helpful.");
  CHECK(c->default_system().empty());
}

TEST_CASE("Unknown template names and formats are refused, naming the known ones", "[tokenizer][chat]") {
  Result<ChatTemplate> bad = ChatTemplate::ByName("vicuna");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("vicuna") && Catch::Contains("chatml"));
  Result<ChatTemplate> other = ChatTemplate::FromJinja("{{ bos_token }}[INST] {{ message['content'] }} [/INST]");
  REQUIRE_FALSE(other.ok());
  CHECK(other.status().code() == StatusCode::kUnimplemented);
  CHECK_THAT(other.status().message(), Catch::Contains("chatml") && Catch::Contains("[INST]"));
}

TEST_CASE("The chat template source comes from tokenizer_config.json", "[tokenizer][chat]") {
  testing::TempDir dir;
  const std::string config = dir.path() + "/tokenizer_config.json";
  std::ofstream(config) << R"({"chat_template": [{"name": "tool_use", "template": "T"},)"
                        << R"( {"name": "default", "template": "D"}]})";
  Result<std::string> list = LoadChatTemplateSource(dir.path());
  REQUIRE(list.ok());
  CHECK(*list == "D");
  std::ofstream(config) << R"({"chat_template": "S"})";
  Result<std::string> one = LoadChatTemplateSource(dir.path() + "/tokenizer.json");  // beside it
  REQUIRE(one.ok());
  CHECK(*one == "S");
  std::ofstream(config) << R"({"eos_token": "x"})";
  Result<std::string> none = LoadChatTemplateSource(dir.path());
  REQUIRE(none.ok());
  CHECK(none->empty());
  std::ofstream(config) << R"({"chat_template": 3})";
  Result<std::string> bad = LoadChatTemplateSource(dir.path());
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("tokenizer_config.json"));
}

}  // namespace
}  // namespace l2l::tok
