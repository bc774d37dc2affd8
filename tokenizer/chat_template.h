// ChatTemplate: a conversation (role, content messages) as the text a chat model was
// trained on, as Hugging Face's apply_chat_template renders the model's own Jinja template
// (GGUF `tokenizer.chat_template`, or tokenizer_config.json's `chat_template`). No Jinja
// engine: each known template family is a format looked up by name ("chatml", ...), and a
// model's Jinja source is recognised by its markers, its default system prompt (a literal
// inside the source, as SmolLM2's and Qwen2.5's have) read out of it.
//
// Formats (a new family is one entry in chat_template.cc's table):
//   chatml: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message; the generation prompt is
//           "<|im_start|>assistant\n"; the turn ends at <|im_end|>. With a default system
//           prompt, a conversation whose first message is not a system one starts with
//           "<|im_start|>system\nDEFAULT<|im_end|>\n" (SmolLM2, Qwen2.5).
//   gemma:  Gemma 3's: "<bos>", "<start_of_turn>ROLE\n" + trimmed content + "<end_of_turn>\n"
//           (assistant written "model"; a system message folded into the first user turn
//           with "\n\n"); the generation prompt is "<start_of_turn>model\n"; the turn ends
//           at <end_of_turn>. The same text `l2l-tokenize --jsonl` trains on (tokenizer/sft.h).
//
// The rendered text is encoded with add_special = false (as apply_chat_template does:
// a template that wants BOS writes it).
//
// Thread-safety: values; free functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace l2l::tok {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

class ChatTemplate {
 public:
  // A format by name (ChatTemplateNames()); `default_system` as above ("" none).
  static Result<ChatTemplate> ByName(std::string_view name, std::string default_system = "");
  // The format a model's Jinja template is, with its default system prompt;
  // Unimplemented, naming the formats known, when none matches.
  static Result<ChatTemplate> FromJinja(std::string_view jinja);

  // The conversation as text; add_generation_prompt appends the assistant turn's opening.
  std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  const std::string& name() const { return name_; }
  const std::string& default_system() const { return default_system_; }
  // The token text that ends a turn (the model stops there): "<|im_end|>" for chatml.
  const std::string& end_of_turn() const { return end_of_turn_; }

 private:
  ChatTemplate() = default;
  std::string name_, default_system_, end_of_turn_;
};

// The names ByName knows, in table order.
std::vector<std::string> ChatTemplateNames();

// The Jinja chat template of a model: a GGUF file's tokenizer.chat_template, or (a model
// directory, or a tokenizer.json beside one) tokenizer_config.json's chat_template (a
// string, or the entry named "default" of a list). "" when the model has none.
Result<std::string> LoadChatTemplateSource(const std::string& path);

}  // namespace l2l::tok
