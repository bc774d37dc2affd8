// ChatTemplate (tokenizer/chat_template.h).
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/formats/gguf.h"
#include "tokenizer/load.h"
#include "tokenizer/sft.h"

namespace l2l::tok {
namespace {

using json = nlohmann::json;

struct Format {
  const char* name;
  const char* end_of_turn;
  // The markers a model's Jinja source holds when it is this format (all of them).
  std::vector<const char*> markers;
  // The marker that opens the default system prompt's literal in the source
  // ("<|im_start|>system" then a newline); nullptr when the format has none.
  const char* system_opening;
  std::string (*render)(const std::string& default_system, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt);
};

std::string RenderChatMl(const std::string& default_system, const std::vector<ChatMessage>& messages,
                         bool add_generation_prompt) {
  std::string out;
  if (!default_system.empty() && (messages.empty() || messages[0].role != "system")) {
    out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    const ChatTurn t = ChatMlTurn(m.role, m.content);
    out += t.open + t.body + t.close;
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// Gemma 3's template: "<bos>", then per message "<start_of_turn>ROLE\n" + trimmed content +
// "<end_of_turn>\n" with assistant written "model"; a leading system message's content +
// "\n\n" goes before the first user turn's content; the generation prompt is
// "<start_of_turn>model\n". (Roles must alternate in HF's template; l2l chat only makes
// alternating conversations.)
std::string RenderGemma(const std::string& default_system, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt) {
  std::string out = "<bos>", prefix;
  size_t first = 0;
  if (!messages.empty() && messages[0].role == "system") {
    prefix = messages[0].content + "\n\n";
    first = 1;
  } else if (!default_system.empty()) {
    prefix = default_system + "\n\n";
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatTurn t = GemmaTurn(messages[i].role, messages[i].content, i == first ? prefix : "");
    out += t.open + t.body + t.close;
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

const std::vector<Format>& Formats() {
  static const std::vector<Format> formats = {
      {"chatml", "<|im_end|>", {"<|im_start|>", "<|im_end|>"}, "<|im_start|>system", RenderChatMl},
      {"gemma", "<end_of_turn>", {"<start_of_turn>", "<end_of_turn>"}, nullptr, RenderGemma},
  };
  return formats;
}

// The default system prompt written as a literal in a Jinja source: the text after
// `opening` and a newline (a real one, or the escape \n) up to end_of_turn, when it holds
// no Jinja or quoting (then it is a literal, not an expression); "" otherwise.
std::string DefaultSystem(std::string_view jinja, const char* opening, const char* end_of_turn) {
  if (opening == nullptr) return "";
  for (size_t at = jinja.find(opening); at != std::string_view::npos; at = jinja.find(opening, at + 1)) {
    size_t p = at + std::string_view(opening).size();
    if (jinja.compare(p, 1, "\n") == 0) {
      p += 1;
    } else if (jinja.compare(p, 2, "\\n") == 0) {
      p += 2;
    } else {
      continue;
    }
    const size_t end = jinja.find(end_of_turn, p);
    if (end == std::string_view::npos) continue;
    std::string_view text = jinja.substr(p, end - p);
    if (text.empty() || text.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += text[i];
      }
    }
    return out;
  }
  return "";
}

}  // namespace

std::vector<std::string> ChatTemplateNames() {
  std::vector<std::string> names;
  for (const Format& f : Formats()) names.push_back(f.name);
  return names;
}

Result<ChatTemplate> ChatTemplate::ByName(std::string_view name, std::string default_system) {
  for (const Format& f : Formats()) {
    if (name != f.name) continue;
    ChatTemplate t;
    t.name_ = f.name;
    t.end_of_turn_ = f.end_of_turn;
    t.default_system_ = std::move(default_system);
    return t;
  }
  std::string known;
  for (const std::string& n : ChatTemplateNames()) known += (known.empty() ? "" : ", ") + n;
  return InvalidArgument("unknown chat template '" + std::string(name) + "' (known: " + known + ")");
}

Result<ChatTemplate> ChatTemplate::FromJinja(std::string_view jinja) {
  for (const Format& f : Formats()) {
    bool all = true;
    for (const char* m : f.markers) all = all && jinja.find(m) != std::string_view::npos;
    if (all) return ByName(f.name, DefaultSystem(jinja, f.system_opening, f.end_of_turn));
  }
  std::string known;
  for (const std::string& n : ChatTemplateNames()) known += (known.empty() ? "" : ", ") + n;
  return Status(StatusCode::kUnimplemented,
                "the model's chat template is none of the formats l2l renders (" + known + "); its first 120 bytes: " +
                    std::string(jinja.substr(0, 120)));
}

std::string ChatTemplate::Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  for (const Format& f : Formats()) {
    if (name_ == f.name) return f.render(default_system_, messages, add_generation_prompt);
  }
  return "";  // unreachable: a ChatTemplate is made only by ByName
}

Result<std::string> LoadChatTemplateSource(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (IsGgufFile(path)) {
    L2L_ASSIGN_OR_RETURN(formats::GgufReader gguf, formats::GgufReader::Open(path));
    if (gguf.Get("tokenizer.chat_template") == nullptr) return std::string();
    return gguf.GetString("tokenizer.chat_template");
  }
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  const std::string config_path = (dir / "tokenizer_config.json").string();
  if (!fs::exists(config_path, ec)) return std::string();
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  const json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) return InvalidArgument(config_path + ": not a JSON object");
  if (!config.contains("chat_template")) return std::string();
  const json& t = config.at("chat_template");
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const json& e : t) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e.at("template").is_string()) {
        return e.at("template").get<std::string>();
      }
    }
    return std::string();
  }
  return InvalidArgument(config_path + ": chat_template must be a string or a list of {name, template}");
}

}  // namespace l2l::tok
