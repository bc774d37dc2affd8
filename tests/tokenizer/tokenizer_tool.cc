// l2l_tokenizer_tool: the C++ side of the tokenizer oracle tests and benchmark. Builds a
// Tokenizer from a tokenizer.json or from GGUF-style metadata dumped to JSON (the arrays
// of tokenizer.ggml.*, through Tokenizer::FromGguf, the integrator's entry point),
// encodes a JSON list of documents and writes the ids; checks Decode round-trips.
//
//   l2l_tokenizer_tool wordpiece --json TOKENIZER.json --docs DOCS.json --out OUT.json
//       [--no-special]   (WordPieceTokenizer; DOCS.json: strings, or [a, b] pairs;
//       OUT.json: {"ids":[[..]], "types":[[..]], "decoded":[..], "seconds": S}, decoded
//       = Decode(ids, skip_special=true))
//   l2l_tokenizer_tool export-gguf --gguf-meta META.json --out TOKENIZER.json
//       (BpeSpecToTokenizerJson of the GGUF spec, for HF to load)
//   l2l_tokenizer_tool export-hf --gguf FILE.gguf --out DIR
//       (WriteHfTokenizerFromGguf: DIR/tokenizer.json + tokenizer_config.json)
//   l2l_tokenizer_tool encode (--json TOKENIZER.json | --gguf-meta META.json | --load PATH)
//       --docs DOCS.json --out IDS.json [--no-special] [--no-roundtrip]
//       [--roundtrip-skip TEXT]... [--repeat N]
//
// --load: tok::LoadTokenizer(PATH) (a model dir, tokenizer.json or GGUF file).
// META.json: {"tokens":[..], "merges":[..], "token_type":[..], "pre":"smollm",
//             "bos":1, "eos":2, "add_bos":false|null, "add_eos":null}
// Prints "decode mismatches: K" (K > 0 exits 1, naming the first document) and
// "encode seconds: S tokens: N" (the fastest of --repeat runs, cache warm after the first).
#include <chrono>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "tokenizer/load.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/wordpiece.h"

namespace {

using json = nlohmann::json;

l2l::Result<l2l::tok::GgufVocab> ReadGgufMeta(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(std::string text, l2l::ReadFileToString(path));
  const json j = json::parse(text);
  l2l::tok::GgufVocab v;
  v.tokens = j.at("tokens").get<std::vector<std::string>>();
  v.merges = j.at("merges").get<std::vector<std::string>>();
  if (j.contains("token_type")) v.token_types = j.at("token_type").get<std::vector<int32_t>>();
  v.pre = j.value("pre", "");
  v.bos_id = j.value("bos", int64_t{-1});
  v.eos_id = j.value("eos", int64_t{-1});
  if (j.contains("add_bos") && !j.at("add_bos").is_null()) v.add_bos = j.at("add_bos").get<bool>();
  if (j.contains("add_eos") && !j.at("add_eos").is_null()) v.add_eos = j.at("add_eos").get<bool>();
  return v;
}

l2l::Result<l2l::tok::Tokenizer> FromGgufMeta(const std::string& path) {
  L2L_ASSIGN_OR_RETURN(l2l::tok::GgufVocab v, ReadGgufMeta(path));
  return l2l::tok::Tokenizer::FromGguf(v, path);
}

int ExportGguf(const std::string& meta_path, const std::string& out_path) {
  auto v = ReadGgufMeta(meta_path);
  auto spec = v.ok() ? l2l::tok::Tokenizer::SpecFromGguf(*v, meta_path) : l2l::Result<l2l::tok::BpeSpec>(v.status());
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 1;
  }
  const std::string s = l2l::tok::BpeSpecToTokenizerJson(*spec);
  const l2l::Status st = l2l::WriteFileAtomic(out_path, s.data(), s.size());
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

int RunWordPiece(int argc, char** argv) {
  std::string json_path, docs_path, out_path;
  bool add_special = true;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--json") json_path = next();
    else if (a == "--docs") docs_path = next();
    else if (a == "--out") out_path = next();
    else if (a == "--no-special") add_special = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto tok = l2l::tok::WordPieceTokenizer::FromTokenizerJson(json_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  auto docs_text = l2l::ReadFileToString(docs_path);
  if (!docs_text.ok()) {
    std::fprintf(stderr, "%s\n", docs_text.status().ToString().c_str());
    return 1;
  }
  const json docs = json::parse(*docs_text);
  json ids = json::array(), types = json::array(), decoded = json::array();
  double seconds = 0;
  size_t n_tokens = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    const auto t0 = std::chrono::steady_clock::now();
    auto e = docs[d].is_string()
                 ? tok->Encode(docs[d].get<std::string>(), add_special)
                 : tok->EncodePair(docs[d].at(0).get<std::string>(), docs[d].at(1).get<std::string>(), add_special);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!e.ok()) {
      std::fprintf(stderr, "document %zu: %s\n", d, e.status().ToString().c_str());
      return 1;
    }
    auto text = tok->Decode(e->ids, /*skip_special=*/true);
    if (!text.ok()) {
      std::fprintf(stderr, "document %zu: %s\n", d, text.status().ToString().c_str());
      return 1;
    }
    n_tokens += e->ids.size();
    ids.push_back(e->ids);
    types.push_back(e->type_ids);
    decoded.push_back(*text);
  }
  std::printf("encode seconds: %.6f tokens: %zu\n", seconds, n_tokens);
  const std::string s = json{{"ids", ids}, {"types", types}, {"decoded", decoded}, {"seconds", seconds}}.dump();
  const l2l::Status st = l2l::WriteFileAtomic(out_path, s.data(), s.size());
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

int Run(int argc, char** argv) {
  std::string json_path, meta_path, load_path, docs_path, out_path;
  bool add_special = true;
  bool roundtrip = true;  // false for a tokenizer that adds a prefix space
  std::vector<std::string> roundtrip_skip;  // documents holding these (stripping tokens) skip it
  int repeat = 1;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--json") json_path = next();
    else if (a == "--gguf-meta") meta_path = next();
    else if (a == "--load") load_path = next();
    else if (a == "--docs") docs_path = next();
    else if (a == "--out") out_path = next();
    else if (a == "--no-special") add_special = false;
    else if (a == "--no-roundtrip") roundtrip = false;
    else if (a == "--roundtrip-skip") roundtrip_skip.push_back(next());
    else if (a == "--repeat") repeat = std::stoi(next());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto tok = !json_path.empty()   ? l2l::tok::Tokenizer::FromTokenizerJson(json_path)
             : !load_path.empty() ? l2l::tok::LoadTokenizer(load_path)
                                  : FromGgufMeta(meta_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  auto docs_text = l2l::ReadFileToString(docs_path);
  if (!docs_text.ok()) {
    std::fprintf(stderr, "%s\n", docs_text.status().ToString().c_str());
    return 1;
  }
  const auto docs = json::parse(*docs_text).get<std::vector<std::string>>();
  std::vector<std::vector<int32_t>> ids(docs.size());
  double best = 1e30;
  size_t n_tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    n_tokens = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t d = 0; d < docs.size(); ++d) {
      auto e = tok->Encode(docs[d], add_special);
      if (!e.ok()) {
        std::fprintf(stderr, "document %zu: %s\n", d, e.status().ToString().c_str());
        return 1;
      }
      ids[d] = std::move(e).value();
      n_tokens += ids[d].size();
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("encode seconds: %.6f tokens: %zu\n", best, n_tokens);
  size_t mismatches = 0;
  for (size_t d = 0; roundtrip && d < docs.size(); ++d) {
    bool skip = false;
    for (const std::string& k : roundtrip_skip) skip |= docs[d].find(k) != std::string::npos;
    if (skip) continue;
    auto plain = tok->Encode(docs[d], /*add_special=*/false);
    auto back = plain.ok() ? tok->Decode(*plain) : l2l::Result<std::string>(plain.status());
    if (!back.ok() || *back != docs[d]) {
      if (mismatches == 0) {
        std::fprintf(stderr, "decode(encode(doc %zu)) differs from the document (%zu bytes)%s\n", d, docs[d].size(),
                     back.ok() ? "" : (": " + back.status().ToString()).c_str());
      }
      ++mismatches;
    }
  }
  std::printf("decode mismatches: %zu\n", mismatches);
  if (!out_path.empty()) {
    const std::string s = json(ids).dump();
    const l2l::Status st = l2l::WriteFileAtomic(out_path, s.data(), s.size());
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 6 && std::string(argv[1]) == "export-gguf" && std::string(argv[2]) == "--gguf-meta" &&
      std::string(argv[4]) == "--out") {
    try {
      return ExportGguf(argv[3], argv[5]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  if (argc == 6 && std::string(argv[1]) == "export-hf" && std::string(argv[2]) == "--gguf" &&
      std::string(argv[4]) == "--out") {
    const l2l::Status st = l2l::tok::WriteHfTokenizerFromGguf(argv[3], argv[5]);
    if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return st.ok() ? 0 : 1;
  }
  if (argc >= 2 && std::string(argv[1]) == "wordpiece") {
    try {
      return RunWordPiece(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 1;
    }
  }
  if (argc < 2 || std::string(argv[1]) != "encode") {
    std::fprintf(stderr, "usage: %s encode (--json F | --gguf-meta F) --docs DOCS.json --out IDS.json\n", argv[0]);
    return 2;
  }
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
