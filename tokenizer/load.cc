// Loading a model's tokenizer from whatever holds it. See tokenizer/load.h.
#include "tokenizer/load.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/json_util.h"

namespace l2l::tok {

Result<GgufVocab> GgufVocabFromReader(const formats::GgufReader& gguf) {
  const std::string& file = gguf.path();
  GgufVocab v;
  auto model = gguf.GetString("tokenizer.ggml.model");
  if (!model.ok()) return InvalidArgument(file + ": no tokenizer in its metadata (tokenizer.ggml.model: " + model.status().message() + ")");
  v.model = *model;
  L2L_ASSIGN_OR_RETURN(v.tokens, gguf.GetStringArray("tokenizer.ggml.tokens"));
  if (gguf.Get("tokenizer.ggml.merges") != nullptr) {
    L2L_ASSIGN_OR_RETURN(v.merges, gguf.GetStringArray("tokenizer.ggml.merges"));
  }
  if (gguf.Get("tokenizer.ggml.token_type") != nullptr) {
    L2L_ASSIGN_OR_RETURN(std::vector<int64_t> types, gguf.GetIntArray("tokenizer.ggml.token_type"));
    v.token_types.assign(types.begin(), types.end());
  }
  if (gguf.Get("tokenizer.ggml.pre") != nullptr) {
    L2L_ASSIGN_OR_RETURN(v.pre, gguf.GetString("tokenizer.ggml.pre"));
  }
  if (gguf.Get("tokenizer.ggml.bos_token_id") != nullptr) {
    L2L_ASSIGN_OR_RETURN(uint64_t id, gguf.GetUInt("tokenizer.ggml.bos_token_id"));
    v.bos_id = static_cast<int64_t>(id);
  }
  if (gguf.Get("tokenizer.ggml.eos_token_id") != nullptr) {
    L2L_ASSIGN_OR_RETURN(uint64_t id, gguf.GetUInt("tokenizer.ggml.eos_token_id"));
    v.eos_id = static_cast<int64_t>(id);
  }
  if (gguf.Get("tokenizer.ggml.add_bos_token") != nullptr) {
    L2L_ASSIGN_OR_RETURN(bool b, gguf.GetBool("tokenizer.ggml.add_bos_token"));
    v.add_bos = b;
  }
  if (gguf.Get("tokenizer.ggml.add_eos_token") != nullptr) {
    L2L_ASSIGN_OR_RETURN(bool b, gguf.GetBool("tokenizer.ggml.add_eos_token"));
    v.add_eos = b;
  }
  if (gguf.Get("tokenizer.ggml.add_space_prefix") != nullptr) {
    L2L_ASSIGN_OR_RETURN(bool b, gguf.GetBool("tokenizer.ggml.add_space_prefix"));
    v.add_space_prefix = b;
  }
  if (gguf.Get("tokenizer.ggml.unknown_token_id") != nullptr) {
    L2L_ASSIGN_OR_RETURN(uint64_t id, gguf.GetUInt("tokenizer.ggml.unknown_token_id"));
    v.unk_id = static_cast<int64_t>(id);
  }
  if (gguf.Get("tokenizer.ggml.scores") != nullptr) {
    L2L_ASSIGN_OR_RETURN(std::vector<double> scores, gguf.GetFloatArray("tokenizer.ggml.scores"));
    v.scores.assign(scores.begin(), scores.end());
  }
  return v;
}

bool IsGgufFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  return f && f.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

Result<Tokenizer> LoadTokenizer(const std::string& path) {
  if (IsGgufFile(path)) {
    L2L_ASSIGN_OR_RETURN(formats::GgufReader gguf, formats::GgufReader::Open(path));
    L2L_ASSIGN_OR_RETURN(GgufVocab v, GgufVocabFromReader(gguf));
    return Tokenizer::FromGguf(v, path);
  }
  return Tokenizer::FromTokenizerJson(path);
}

Status WriteHfTokenizerFromGguf(const std::string& gguf_path, const std::string& dir) {
  L2L_ASSIGN_OR_RETURN(formats::GgufReader gguf, formats::GgufReader::Open(gguf_path));
  L2L_ASSIGN_OR_RETURN(GgufVocab v, GgufVocabFromReader(gguf));
  L2L_ASSIGN_OR_RETURN(BpeSpec spec, Tokenizer::SpecFromGguf(v, gguf_path));
  nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"}, {"clean_up_tokenization_spaces", false}};
  auto token = [&](int64_t id) { return id >= 0 && id < static_cast<int64_t>(v.tokens.size()) ? v.tokens[id] : ""; };
  if (!token(v.bos_id).empty()) config["bos_token"] = token(v.bos_id);
  if (!token(v.eos_id).empty()) config["eos_token"] = token(v.eos_id);
  if (gguf.Get("tokenizer.chat_template") != nullptr) {
    L2L_ASSIGN_OR_RETURN(std::string tmpl, gguf.GetString("tokenizer.chat_template"));
    config["chat_template"] = tmpl;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return InvalidArgument(dir + ": cannot create: " + ec.message());
  const std::string json_path = (std::filesystem::path(dir) / "tokenizer.json").string();
  const std::string config_path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  const std::string tokenizer_json = BpeSpecToTokenizerJson(spec);
  L2L_RETURN_IF_ERROR(WriteFileAtomic(json_path, tokenizer_json.data(), tokenizer_json.size()));
  const std::string config_json = config.dump(2) + "\n";
  return WriteFileAtomic(config_path, config_json.data(), config_json.size());
}

namespace {

using json = nlohmann::json;

bool IsSplit(const PreTokenizerStep& s, std::string_view regex) {
  return s.kind == PreTokenizerStep::Kind::kSplit && s.regex == regex && s.behavior == SplitBehavior::kIsolated &&
         !s.invert;
}
bool IsByteLevel(const PreTokenizerStep& s, bool use_regex) {
  return s.kind == PreTokenizerStep::Kind::kByteLevel && !s.add_prefix_space && s.use_regex == use_regex;
}

// The llama.cpp tokenizer.ggml.pre name whose split rules equal `steps` (as tokenizer.json
// writes them for GPT-2, Llama-3, Qwen2 and SmolLM), or "" when none does.
std::string GgufPreName(const std::vector<PreTokenizerStep>& steps) {
  if (steps.size() == 1 && IsByteLevel(steps[0], true)) return "gpt-2";
  if (steps.size() != 2 || !IsByteLevel(steps[1], steps[0].regex == R"(\p{N})")) return "";
  if (IsSplit(steps[0], kLlama3Regex)) return "llama-bpe";
  if (IsSplit(steps[0], kQwen2Regex)) return "qwen2";
  if (IsSplit(steps[0], R"(\p{N})")) return "smollm";  // Digits(individual_digits) + ByteLevel
  return "";
}

// A JSON file of the model directory as an object; null when the file does not exist.
Result<json> ReadJsonObject(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return json();
  L2L_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(path + ": not a JSON object");
  return j;
}

}  // namespace

Result<GgufMetadata> GgufTokenizerMetadataFromHf(const std::string& dir, int64_t vocab_size) {
  using formats::GgufValue;
  namespace fs = std::filesystem;
  const std::string json_path = (fs::path(dir) / "tokenizer.json").string();
  std::error_code ec;
  if (!fs::exists(json_path, ec)) return GgufMetadata{};
  L2L_ASSIGN_OR_RETURN(BpeSpec spec, Tokenizer::SpecFromTokenizerJson(dir));
  const std::string what = json_path + " as GGUF tokenizer metadata";
  if (spec.model == BpeModel::kSentencePiece) {
    return Unimplemented(what + ": a SentencePiece-style (byte_fallback) tokenizer.json has merges but no scores; "
                         "its GGUF form (tokenizer.ggml.model \"llama\", merged by score) is not written");
  }
  if (!spec.normalizers.empty()) return Unimplemented(what + ": llama.cpp's gpt2 tokenizer has no normalizer");
  const std::string pre = GgufPreName(spec.pre_tokenizer);
  if (pre.empty()) {
    return Unimplemented(what + ": the pre-tokenizer is none of llama.cpp's gpt-2, llama-bpe, qwen2 or smollm");
  }
  L2L_ASSIGN_OR_RETURN(GgufPreRules rules, PreRulesForGgufPre(pre));
  if (rules.ignore_merges != spec.ignore_merges) {
    return Unimplemented(what + ": model.ignore_merges is " + (spec.ignore_merges ? "true" : "false") +
                         " but llama.cpp's \"" + pre + "\" tokenizer has it " + (rules.ignore_merges ? "on" : "off"));
  }
  // id -> token text and type, as llama.cpp's convert_hf_to_gguf.py lays them out.
  std::vector<std::string> tokens = spec.tokens;
  std::vector<int64_t> types(tokens.size(), 1);
  for (const AddedToken& t : spec.added_tokens) {
    if (static_cast<size_t>(t.id) >= tokens.size()) tokens.resize(static_cast<size_t>(t.id) + 1), types.resize(tokens.size(), 1);
    tokens[t.id] = t.content;
    types[t.id] = t.special ? 3 : 4;
  }
  if (static_cast<int64_t>(tokens.size()) > vocab_size) {
    return InvalidArgument(what + ": the tokenizer has " + std::to_string(tokens.size()) +
                           " ids but the model's vocab_size is " + std::to_string(vocab_size));
  }
  tokens.resize(static_cast<size_t>(vocab_size));
  types.resize(static_cast<size_t>(vocab_size), 5);
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id].empty()) tokens[id] = "[PAD" + std::to_string(id) + "]", types[id] = 5;
  }
  std::vector<std::string> merges;
  merges.reserve(spec.merges.size());
  for (const auto& [a, b] : spec.merges) merges.push_back(a + " " + b);

  L2L_ASSIGN_OR_RETURN(json config, ReadJsonObject((fs::path(dir) / "config.json").string()));
  L2L_ASSIGN_OR_RETURN(json tconfig, ReadJsonObject((fs::path(dir) / "tokenizer_config.json").string()));
  // config.json's id for `key` (an int, or the first of a list); -1 when absent or null.
  const std::string config_path = (fs::path(dir) / "config.json").string();
  auto config_id = [&](const char* key) -> Result<int64_t> {
    if (!config.is_object() || !config.contains(key) || config.at(key).is_null()) return -1;
    const json& v = config.at(key);
    const std::string where = config_path + ": " + key;
    if (v.is_array()) return v.empty() ? -1 : JsonToInt(v[0], 0, std::numeric_limits<int64_t>::max(), where + "[0]");
    return JsonToInt(v, 0, std::numeric_limits<int64_t>::max(), where);
  };
  // tokenizer_config.json's pad_token as an id; -1 when absent.
  auto pad_from_tconfig = [&]() -> int64_t {
    if (!tconfig.is_object() || !tconfig.contains("pad_token")) return -1;
    const json& v = tconfig.at("pad_token");
    const std::string content = v.is_string() ? v.get<std::string>()
                                : v.is_object() && v.contains("content") && v.at("content").is_string()
                                    ? v.at("content").get<std::string>()
                                    : std::string();
    for (size_t id = 0; !content.empty() && id < tokens.size(); ++id) {
      if (tokens[id] == content) return static_cast<int64_t>(id);
    }
    return -1;
  };
  L2L_ASSIGN_OR_RETURN(const int64_t config_bos, config_id("bos_token_id"));
  L2L_ASSIGN_OR_RETURN(const int64_t config_eos, config_id("eos_token_id"));
  L2L_ASSIGN_OR_RETURN(const int64_t config_pad, config_id("pad_token_id"));
  const int64_t bos = spec.bos_id >= 0 ? spec.bos_id : config_bos;
  const int64_t eos = spec.eos_id >= 0 ? spec.eos_id : config_eos;
  const int64_t pad = pad_from_tconfig() >= 0 ? pad_from_tconfig() : config_pad;
  const bool add_bos = spec.prefix_ids.size() == 1 && spec.prefix_ids[0] == bos;
  const bool add_eos = spec.suffix_ids.size() == 1 && spec.suffix_ids[0] == eos;
  if ((!spec.prefix_ids.empty() && !add_bos) || (!spec.suffix_ids.empty() && !add_eos)) {
    return Unimplemented(what + ": the post-processor adds ids other than BOS before / EOS after the text");
  }

  GgufMetadata md;
  md.emplace_back("tokenizer.ggml.model", GgufValue::String("gpt2"));
  md.emplace_back("tokenizer.ggml.pre", GgufValue::String(pre));
  md.emplace_back("tokenizer.ggml.tokens", GgufValue::StringArray(std::move(tokens)));
  md.emplace_back("tokenizer.ggml.token_type", GgufValue::IntArray(formats::GgufValueType::kI32, std::move(types)));
  md.emplace_back("tokenizer.ggml.merges", GgufValue::StringArray(std::move(merges)));
  auto id = [&](const char* key, int64_t v) {
    if (v >= 0 && v < vocab_size) md.emplace_back(key, GgufValue::U32(static_cast<uint32_t>(v)));
  };
  id("tokenizer.ggml.bos_token_id", bos);
  id("tokenizer.ggml.eos_token_id", eos);
  id("tokenizer.ggml.padding_token_id", pad);
  md.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::Bool(add_bos));
  md.emplace_back("tokenizer.ggml.add_eos_token", GgufValue::Bool(add_eos));
  if (tconfig.is_object() && tconfig.contains("chat_template")) {
    const json& t = tconfig.at("chat_template");
    if (t.is_string()) {
      md.emplace_back("tokenizer.chat_template", GgufValue::String(t.get<std::string>()));
    } else if (t.is_array()) {
      // Named templates, as llama.cpp's converter stores them: "default" as the template,
      // the others as tokenizer.chat_template.<name>.
      for (const json& e : t) {
        if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e.at("name").is_string() ||
            !e.at("template").is_string()) {
          return InvalidArgument(dir + "/tokenizer_config.json: chat_template entries must be {name, template}");
        }
        const std::string name = e.at("name").get<std::string>();
        md.emplace_back(name == "default" ? "tokenizer.chat_template" : "tokenizer.chat_template." + name,
                        GgufValue::String(e.at("template").get<std::string>()));
      }
    }
  }
  return md;
}

}  // namespace l2l::tok
