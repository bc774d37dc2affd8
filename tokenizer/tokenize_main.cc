// l2l-tokenize: turns a text file (or SFT JSONL) into a tokens file (docs/formats.md),
// with the byte-level tokenizer (one token per byte, vocabulary 256; the default) or a
// model's tokenizer (--tokenizer: a model directory holding tokenizer.json, the
// tokenizer.json file, or a GGUF file's tokenizer.ggml.* metadata; byte-level or
// SentencePiece-style BPE, or WordPiece), optionally splitting off the last fraction as a
// validation file.
//
//   l2l-tokenize INPUT OUTPUT.bin [--tokenizer PATH] [--jsonl]
//                [--val-fraction 0.1 --val-output VAL.bin]
//
// With a WordPiece (BERT) tokenizer.json, plain text is encoded line by line: every
// non-blank line becomes [CLS] LINE [SEP] and the lines are concatenated (MLM input).
//
// --task classify (encoder models) reads JSONL {"text","label"} or
// {"text_a","text_b","label"} lines with a WordPiece --tokenizer and writes fixed-length
// rows of --max-len L tokens: OUTPUT (ids), OUTPUT.types, OUTPUT.attn and OUTPUT.labels
// (tokenizer/classify.h, docs/formats.md); --val-fraction splits off the last rows.
//
//   l2l-tokenize DATA.jsonl OUTPUT.bin --task classify --tokenizer MODEL_DIR --max-len 128
//
// --task mlm (masked-LM rows) reads plain text: every non-blank line becomes one row
// [CLS] LINE [SEP] (truncated to --max-len, padded), written as classification rows with
// label 0 (the masked-LM task ignores labels).
//
// --jsonl reads {"prompt","completion"} / {"messages":[...]} lines (tokenizer/sft.h) and
// writes the loss mask beside each tokens file (OUTPUT.bin.mask). Vocabularies above
// 65,536 ids give version-2 (uint32) tokens files. Exit status 0 on success; 1 with a
// message on stderr for bad arguments, unreadable or bad input (naming the file and line)
// or a failed write. Outputs are written atomically.
#include <cstdio>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/formats/tokens_file.h"
#include "common/status.h"
#include "tokenizer/classify.h"
#include "tokenizer/load.h"
#include "tokenizer/sft.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/wordpiece.h"

namespace {

struct Options {
  std::string input, output, val_output, tokenizer, task = "lm";
  double val_fraction = 0.0;
  int64_t max_len = 0;
  bool jsonl = false;
};

l2l::Result<std::optional<l2l::tok::Tokenizer>> LoadTokenizer(const std::string& path) {
  if (path.empty()) return std::optional<l2l::tok::Tokenizer>();
  L2L_ASSIGN_OR_RETURN(l2l::tok::Tokenizer tok, l2l::tok::LoadTokenizer(path));
  return std::optional<l2l::tok::Tokenizer>(std::move(tok));
}

// The input's bytes. The input is mapped, not read whole: it is data of any size (the
// tokens written take up to 4x its bytes), not a config under L2L_MAX_FILE_BYTES.
std::string_view AsText(const l2l::MappedFile& f) { return {reinterpret_cast<const char*>(f.data()), f.size()}; }

// Calls fn(line, "file:N") for every non-blank line of `text`.
template <typename Fn>
l2l::Status ForEachLine(std::string_view text, const std::string& file, Fn fn) {
  size_t line_no = 0, begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line(text.data() + begin, end - begin);
    ++line_no;
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    L2L_RETURN_IF_ERROR(fn(line, file + ":" + std::to_string(line_no)));
  }
  return l2l::Status::Ok();
}

l2l::Status RunClassify(const Options& o) {
  if (o.jsonl) return l2l::InvalidArgument("--task " + o.task + " takes no --jsonl (classify reads JSONL, mlm plain text)");
  if (o.tokenizer.empty()) return l2l::InvalidArgument("--task " + o.task + " needs --tokenizer (a WordPiece tokenizer.json or its model directory)");
  if (o.max_len < 3 || o.max_len > (int64_t{1} << 20)) {
    return l2l::InvalidArgument("--task " + o.task + " needs --max-len L in [3, 2^20] (got " + std::to_string(o.max_len) + ")");
  }
  L2L_ASSIGN_OR_RETURN(std::string type, l2l::tok::TokenizerJsonModelType(o.tokenizer));
  if (type != "WordPiece") {
    return l2l::InvalidArgument(o.tokenizer + ": model.type \"" + type + "\"; --task " + o.task + " needs a WordPiece (BERT) tokenizer");
  }
  L2L_ASSIGN_OR_RETURN(l2l::tok::WordPieceTokenizer tok, l2l::tok::WordPieceTokenizer::FromTokenizerJson(o.tokenizer));
  L2L_ASSIGN_OR_RETURN(const l2l::MappedFile input, l2l::MappedFile::Open(o.input));
  const std::string_view text = AsText(input);
  l2l::tok::ClassifyRows rows;
  rows.max_len = o.max_len;
  const bool mlm = o.task == "mlm";
  L2L_RETURN_IF_ERROR(ForEachLine(text, o.input, [&](std::string_view line, const std::string& where) {
    if (!mlm) return l2l::tok::AppendClassifyLine(tok, line, where, &rows);
    const nlohmann::json j = {{"text", std::string(line)}, {"label", 0}};
    return l2l::tok::AppendClassifyLine(tok, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), where,
                                        &rows);
  }));
  if (rows.rows() == 0) return l2l::InvalidArgument(o.input + " has no examples: nothing to tokenize");
  const int64_t n_val = static_cast<int64_t>(static_cast<double>(rows.rows()) * o.val_fraction);
  if (o.val_fraction > 0.0 && (n_val == 0 || n_val == rows.rows())) {
    return l2l::InvalidArgument(o.input + " (" + std::to_string(rows.rows()) + " examples) is too small to split off " +
                                std::to_string(o.val_fraction) + " for validation");
  }
  const int64_t n_train = rows.rows() - n_val;
  auto write = [&](const std::string& path, int64_t first, int64_t n) -> l2l::Status {
    L2L_RETURN_IF_ERROR(l2l::tok::WriteClassifyFiles(path, rows, first, n, tok.vocab_size()));
    std::printf("l2l-tokenize: wrote %lld rows of %lld tokens (%lld classes) to %s{,.types,.attn,.labels}\n",
                static_cast<long long>(n), static_cast<long long>(rows.max_len),
                static_cast<long long>(rows.num_classes), path.c_str());
    return l2l::Status::Ok();
  };
  L2L_RETURN_IF_ERROR(write(o.output, 0, n_train));
  if (n_val > 0) L2L_RETURN_IF_ERROR(write(o.val_output, n_train, n_val));
  return l2l::Status::Ok();
}

l2l::Status Run(const Options& o) {
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    return l2l::InvalidArgument("--val-fraction " + std::to_string(o.val_fraction) + " must be in [0, 1)");
  }
  if (o.val_fraction > 0.0 && o.val_output.empty()) return l2l::InvalidArgument("--val-fraction needs --val-output VAL.bin");
  if (o.val_fraction == 0.0 && !o.val_output.empty()) return l2l::InvalidArgument("--val-output needs --val-fraction > 0");
  if (o.task == "classify" || o.task == "mlm") return RunClassify(o);
  if (o.task != "lm") return l2l::InvalidArgument("--task \"" + o.task + "\" is not lm, classify or mlm");
  if (o.max_len != 0) return l2l::InvalidArgument("--max-len is for --task classify");
  // A WordPiece (BERT) tokenizer.json gives a stream of [CLS] LINE [SEP] sequences.
  std::optional<l2l::tok::WordPieceTokenizer> wp;
  if (!o.tokenizer.empty() && !l2l::tok::IsGgufFile(o.tokenizer)) {
    auto type = l2l::tok::TokenizerJsonModelType(o.tokenizer);
    if (type.ok() && *type == "WordPiece") {
      if (o.jsonl) return l2l::InvalidArgument("--jsonl (SFT) needs a BPE tokenizer; " + o.tokenizer + " is WordPiece");
      L2L_ASSIGN_OR_RETURN(l2l::tok::WordPieceTokenizer w, l2l::tok::WordPieceTokenizer::FromTokenizerJson(o.tokenizer));
      wp.emplace(std::move(w));
    }
  }
  L2L_ASSIGN_OR_RETURN(std::optional<l2l::tok::Tokenizer> tok,
                       wp.has_value() ? l2l::Result<std::optional<l2l::tok::Tokenizer>>(std::nullopt) : LoadTokenizer(o.tokenizer));
  const int64_t vocab = wp.has_value() ? wp->vocab_size() : tok.has_value() ? tok->vocab_size() : l2l::kByteVocabSize;
  L2L_ASSIGN_OR_RETURN(const l2l::MappedFile input, l2l::MappedFile::Open(o.input));
  const std::string_view text = AsText(input);
  if (text.empty()) return l2l::InvalidArgument(o.input + " is empty: nothing to tokenize");

  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;
  if (o.jsonl) {
    size_t line_no = 0, begin = 0;
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string_view::npos) end = text.size();
      const std::string_view line(text.data() + begin, end - begin);
      ++line_no;
      begin = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      L2L_ASSIGN_OR_RETURN(l2l::tok::SftExample ex,
                           l2l::tok::EncodeSftLine(tok.has_value() ? &*tok : nullptr, line,
                                                   o.input + ":" + std::to_string(line_no)));
      tokens.insert(tokens.end(), ex.ids.begin(), ex.ids.end());
      mask.insert(mask.end(), ex.mask.begin(), ex.mask.end());
    }
    if (tokens.empty()) return l2l::InvalidArgument(o.input + " has no examples: nothing to tokenize");
  } else if (wp.has_value()) {
    L2L_RETURN_IF_ERROR(ForEachLine(text, o.input, [&](std::string_view line, const std::string& where) -> l2l::Status {
      auto e = wp->Encode(line, /*add_special=*/true);
      if (!e.ok()) return e.status().WithContext(where);
      tokens.insert(tokens.end(), e->ids.begin(), e->ids.end());
      return l2l::Status::Ok();
    }));
    if (tokens.empty()) return l2l::InvalidArgument(o.input + " has no non-blank lines: nothing to tokenize");
  } else if (tok.has_value()) {
    L2L_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok->Encode(text, /*add_special=*/true));
    tokens.assign(ids.begin(), ids.end());
  } else {
    tokens.assign(reinterpret_cast<const unsigned char*>(text.data()),
                  reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  }
  // The validation split is the tail, so neither file cuts the other's documents apart
  // more than once.
  const size_t n_val = static_cast<size_t>(static_cast<double>(tokens.size()) * o.val_fraction);
  if (o.val_fraction > 0.0 && (n_val == 0 || n_val == tokens.size())) {
    return l2l::InvalidArgument(o.input + " (" + std::to_string(tokens.size()) + " tokens) is too small to split off " +
                                std::to_string(o.val_fraction) + " for validation");
  }
  const std::span<const uint32_t> all(tokens);
  const size_t n_train = tokens.size() - n_val;
  auto write = [&](const std::string& path, size_t first, size_t n) -> l2l::Status {
    L2L_RETURN_IF_ERROR(l2l::WriteTokensFileForVocab(path, all.subspan(first, n), vocab));
    std::printf("l2l-tokenize: wrote %zu tokens to %s\n", n, path.c_str());
    if (o.jsonl) {
      const std::string mpath = l2l::LossMaskPath(path);
      L2L_RETURN_IF_ERROR(l2l::WriteLossMaskFile(mpath, std::span<const uint8_t>(mask).subspan(first, n)));
      std::printf("l2l-tokenize: wrote the loss mask to %s\n", mpath.c_str());
    }
    return l2l::Status::Ok();
  };
  L2L_RETURN_IF_ERROR(write(o.output, 0, n_train));
  if (n_val > 0) L2L_RETURN_IF_ERROR(write(o.val_output, n_train, n_val));
  return l2l::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tokenizer: text file or SFT JSONL -> tokens file(s) (byte level unless --tokenizer)"};
  Options o;
  app.add_option("INPUT", o.input, "text file (or JSONL with --jsonl) to tokenize")->required();
  app.add_option("OUTPUT", o.output, "tokens file to write (training split)")->required();
  app.add_option("--tokenizer", o.tokenizer, "model directory with tokenizer.json, or a tokenizer.json file");
  app.add_flag("--jsonl", o.jsonl, "INPUT is JSONL of {prompt,completion} or {messages}; also write OUTPUT.mask");
  app.add_option("--task", o.task, "lm (default: a token stream), classify (JSONL {text|text_a,text_b, label} -> fixed-length rows) or mlm (text lines -> rows)");
  app.add_option("--max-len", o.max_len, "--task classify | mlm: tokens per row ([CLS]/[SEP] included; padded with [PAD])");
  app.add_option("--val-fraction", o.val_fraction, "fraction of the tokens (classify: of the rows), their tail, written to --val-output");
  app.add_option("--val-output", o.val_output, "tokens file for the validation split");
  CLI11_PARSE(app, argc, argv);
  const l2l::Status st = Run(o);
  if (!st.ok()) {
    std::fprintf(stderr, "l2l-tokenize: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
