// Loading a model's tokenizer from whatever holds it. See tokenizer/load.h.
#include "tokenizer/load.h"

#include <filesystem>
#include <fstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/file_util.h"

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

}  // namespace l2l::tok
