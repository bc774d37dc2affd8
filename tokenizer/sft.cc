// SFT line formatting and loss masks. See tokenizer/sft.h.
//
// Thread-safety: see the header.
#include "tokenizer/sft.h"

#include <nlohmann/json.hpp>

namespace l2l::tok {
namespace {

using json = nlohmann::json;

// A formatted string built from parts, remembering which byte ranges are targets.
struct Formatter {
  std::string text;
  std::vector<std::pair<size_t, size_t>> target;  // [begin, end) byte ranges
  void Add(std::string_view s, bool is_target) {
    if (is_target && !s.empty()) target.emplace_back(text.size(), text.size() + s.size());
    text += s;
  }
  bool IsTarget(size_t byte) const {
    for (const auto& [b, e] : target) {
      if (byte >= b && byte < e) return true;
    }
    return false;
  }
};

Result<std::string> StringField(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return InvalidArgument(where + ": missing \"" + key + "\"");
  if (!it->is_string()) return InvalidArgument(where + ": \"" + key + "\" is not a string");
  return it->get<std::string>();
}

}  // namespace

Result<SftExample> EncodeSftLine(const Tokenizer* tok, std::string_view line, const std::string& where) {
  const json obj = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return InvalidArgument(where + ": not valid JSON");
  if (!obj.is_object()) return InvalidArgument(where + ": not a JSON object");
  const bool chatml = tok != nullptr && tok->TokenId("<|im_start|>").has_value() && tok->TokenId("<|im_end|>").has_value();
  Formatter f;
  if (obj.contains("messages")) {
    if (obj.contains("prompt") || obj.contains("completion")) {
      return InvalidArgument(where + ": has both \"messages\" and \"prompt\"/\"completion\"");
    }
    const json& msgs = obj.at("messages");
    if (!msgs.is_array() || msgs.empty()) return InvalidArgument(where + ": \"messages\" is not a non-empty array");
    for (size_t i = 0; i < msgs.size(); ++i) {
      const std::string w = where + ": messages[" + std::to_string(i) + "]";
      if (!msgs[i].is_object()) return InvalidArgument(w + " is not an object");
      L2L_ASSIGN_OR_RETURN(std::string role, StringField(msgs[i], "role", w));
      L2L_ASSIGN_OR_RETURN(std::string content, StringField(msgs[i], "content", w));
      const bool assistant = role == "assistant";
      if (chatml) {
        f.Add("<|im_start|>" + role + "\n", false);
        f.Add(content + "<|im_end|>", assistant);
        f.Add("\n", false);
      } else {
        f.Add(content, assistant);
      }
    }
  } else if (obj.contains("prompt") || obj.contains("completion")) {
    L2L_ASSIGN_OR_RETURN(std::string prompt, StringField(obj, "prompt", where));
    L2L_ASSIGN_OR_RETURN(std::string completion, StringField(obj, "completion", where));
    f.Add(prompt, false);
    f.Add(completion, true);
  } else {
    return InvalidArgument(where + ": neither \"messages\" nor \"prompt\"/\"completion\"");
  }

  SftExample ex;
  ex.text = f.text;
  if (tok == nullptr) {
    ex.ids.reserve(f.text.size());
    for (size_t i = 0; i < f.text.size(); ++i) {
      ex.ids.push_back(static_cast<unsigned char>(f.text[i]));
      ex.mask.push_back(f.IsTarget(i) ? 1 : 0);
    }
    return ex;
  }
  L2L_ASSIGN_OR_RETURN(ex.ids, tok->Encode(f.text, /*add_special=*/true));
  // Prompt/completion pairs end with EOS (a target: the model learns to stop).
  const bool add_eos = !obj.contains("messages") && tok->eos_id() >= 0 && tok->suffix_ids().empty();
  const size_t n_prefix = tok->prefix_ids().size();
  const size_t n_suffix = tok->suffix_ids().size();
  ex.mask.assign(ex.ids.size(), 0);
  size_t pos = 0;
  for (size_t i = n_prefix; i + n_suffix < ex.ids.size(); ++i) {
    if (f.IsTarget(pos)) ex.mask[i] = 1;
    pos += tok->TokenBytes(ex.ids[i]).size();
  }
  if (pos != f.text.size()) {
    return Internal(where + ": the tokens' bytes (" + std::to_string(pos) + ") do not spell the " +
                    std::to_string(f.text.size()) + "-byte formatted text (a tokenizer that adds or strips "
                    "whitespace cannot be masked by position)");
  }
  if (add_eos) {
    ex.ids.push_back(tok->eos_id());
    ex.mask.push_back(1);
  }
  return ex;
}

}  // namespace l2l::tok
