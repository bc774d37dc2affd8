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
  // A chat turn: its body is a target when the message is the assistant's.
  void Add(const ChatTurn& turn, bool assistant) {
    Add(turn.open, false);
    Add(turn.body, assistant);
    Add(turn.close, false);
  }
  bool IsTarget(size_t byte) const {
    for (const auto& [b, e] : target) {
      if (byte >= b && byte < e) return true;
    }
    return false;
  }
};

}  // namespace

std::string_view JinjaTrim(std::string_view s) {
  auto ws_len_at = [&](size_t i) -> size_t {  // length of a whitespace character at i, or 0
    const auto c = static_cast<unsigned char>(s[i]);
    if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
    auto is = [&](std::string_view u) { return s.compare(i, u.size(), u) == 0 ? u.size() : 0; };
    for (std::string_view u : {"\xC2\x85", "\xC2\xA0", "\xE1\x9A\x80", "\xE2\x80\xA8", "\xE2\x80\xA9", "\xE2\x80\xAF",
                               "\xE2\x81\x9F", "\xE3\x80\x80"}) {
      if (size_t n = is(u)) return n;
    }
    if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
        static_cast<unsigned char>(s[i + 2]) >= 0x80 && static_cast<unsigned char>(s[i + 2]) <= 0x8A) {
      return 3;  // U+2000-U+200A
    }
    return 0;
  };
  size_t b = 0;
  while (b < s.size()) {
    const size_t n = ws_len_at(b);
    if (n == 0) break;
    b += n;
  }
  size_t e = s.size();
  while (e > b) {
    size_t k = e - 1;  // back up to a character start
    while (k > b && (static_cast<unsigned char>(s[k]) >> 6) == 0x2 && e - k < 3) --k;
    const size_t n = ws_len_at(k);
    if (n == 0 || k + n != e) break;
    e = k;
  }
  return s.substr(b, e - b);
}

ChatTurn ChatMlTurn(std::string_view role, std::string_view content) {
  return {"<|im_start|>" + std::string(role) + "\n", std::string(content) + "<|im_end|>", "\n"};
}

ChatTurn GemmaTurn(std::string_view role, std::string_view content, std::string_view prefix) {
  return {"<start_of_turn>" + (role == "assistant" ? std::string("model") : std::string(role)) + "\n" +
              std::string(prefix),
          std::string(JinjaTrim(content)) + "<end_of_turn>", "\n"};
}

namespace {

Result<std::string> StringField(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return InvalidArgument(where + ": missing \"" + key + "\"");
  if (!it->is_string()) return InvalidArgument(where + ": \"" + key + "\" is not a string");
  return it->get<std::string>();
}

}  // namespace

ChatFormat ChatFormatOf(const Tokenizer* tok) {
  if (tok == nullptr) return ChatFormat::kPlain;
  if (tok->TokenId("<|im_start|>").has_value() && tok->TokenId("<|im_end|>").has_value()) return ChatFormat::kChatMl;
  if (tok->TokenId("<start_of_turn>").has_value() && tok->TokenId("<end_of_turn>").has_value()) return ChatFormat::kGemma;
  return ChatFormat::kPlain;
}

Result<SftExample> EncodeSftLine(const Tokenizer* tok, std::string_view line, const std::string& where) {
  const json obj = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return InvalidArgument(where + ": not valid JSON");
  if (!obj.is_object()) return InvalidArgument(where + ": not a JSON object");
  const ChatFormat format = ChatFormatOf(tok);
  Formatter f;
  if (obj.contains("messages")) {
    if (obj.contains("prompt") || obj.contains("completion")) {
      return InvalidArgument(where + ": has both \"messages\" and \"prompt\"/\"completion\"");
    }
    const json& msgs = obj.at("messages");
    if (!msgs.is_array() || msgs.empty()) return InvalidArgument(where + ": \"messages\" is not a non-empty array");
    // Gemma: a leading system message is folded into the first user turn.
    std::string gemma_prefix;
    size_t first = 0;
    if (format == ChatFormat::kGemma) {
      if (tok->prefix_ids().empty() && tok->TokenId("<bos>").has_value()) f.Add("<bos>", false);
      if (msgs[0].is_object() && msgs[0].value("role", json()) == "system") {
        L2L_ASSIGN_OR_RETURN(std::string content, StringField(msgs[0], "content", where + ": messages[0]"));
        gemma_prefix = content + "\n\n";
        first = 1;
      }
    }
    for (size_t i = first; i < msgs.size(); ++i) {
      const std::string w = where + ": messages[" + std::to_string(i) + "]";
      if (!msgs[i].is_object()) return InvalidArgument(w + " is not an object");
      L2L_ASSIGN_OR_RETURN(std::string role, StringField(msgs[i], "role", w));
      L2L_ASSIGN_OR_RETURN(std::string content, StringField(msgs[i], "content", w));
      const bool assistant = role == "assistant";
      if (format == ChatFormat::kGemma) {
        // Gemma 3's chat template: roles alternate user / assistant ("model"), content trimmed.
        if ((role == "user") != ((i - first) % 2 == 0)) {
          return InvalidArgument(w + ": role \"" + role + "\": the Gemma chat template needs the roles to alternate "
                                 "user/assistant/user/... (after an optional leading system message)");
        }
        f.Add(GemmaTurn(role, content, i == first ? gemma_prefix : ""), assistant);
      } else if (format == ChatFormat::kChatMl) {
        f.Add(ChatMlTurn(role, content), assistant);
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
  const bool spm = tok->model() == BpeModel::kSentencePiece;
  for (size_t i = n_prefix; i + n_suffix < ex.ids.size() && pos <= f.text.size(); ++i) {
    if (f.IsTarget(pos)) ex.mask[i] = 1;
    const std::string& bytes = tok->TokenBytes(ex.ids[i]);
    size_t n = bytes.size();
    // A SentencePiece "▁" prefix (Llama 2: before the text and after each added token)
    // is a space the text does not have: a token that does not spell the text here but
    // does without its first space holds it.
    if (spm && n > 0 && bytes[0] == ' ' && f.text.compare(pos, n, bytes) != 0 &&
        f.text.compare(pos, n - 1, bytes, 1, n - 1) == 0) {
      --n;
    }
    pos += n;
  }
  if (pos != f.text.size()) {
    return Internal(where + ": the tokens' bytes (" + std::to_string(pos) + ") do not spell the " +
                    std::to_string(f.text.size()) + "-byte formatted text (a tokenizer that adds or strips "
                    "whitespace, or gives an unknown token such as <unk> for characters it cannot spell, cannot be "
                    "masked by position)");
  }
  if (add_eos) {
    ex.ids.push_back(tok->eos_id());
    ex.mask.push_back(1);
  }
  return ex;
}

}  // namespace l2l::tok
