// l2l-tokenize: turns a text file into llm.c tokens files with the byte-level tokenizer
// (one token per byte, vocabulary 256), optionally splitting off the last fraction of
// the text as a validation file.
//
//   l2l-tokenize INPUT.txt OUTPUT.bin [--val-fraction 0.1 --val-output VAL.bin]
//
// Exit status 0 on success; 1 with a message on stderr for bad arguments, unreadable
// input, empty input or a failed write. Outputs are written atomically.
#include <cstdio>
#include <span>
#include <string>

#include <CLI/CLI.hpp>

#include "common/file_util.h"
#include "common/status.h"
#include "common/tokens_file.h"

namespace {

l2l::Status Run(const std::string& input, const std::string& output, double val_fraction,
                const std::string& val_output) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    return l2l::InvalidArgument("--val-fraction " + std::to_string(val_fraction) + " must be in [0, 1)");
  }
  if (val_fraction > 0.0 && val_output.empty()) {
    return l2l::InvalidArgument("--val-fraction needs --val-output VAL.bin");
  }
  if (val_fraction == 0.0 && !val_output.empty()) {
    return l2l::InvalidArgument("--val-output needs --val-fraction > 0");
  }
  L2L_ASSIGN_OR_RETURN(std::string text, l2l::ReadFileToString(input));
  if (text.empty()) return l2l::InvalidArgument(input + " is empty: nothing to tokenize");
  const std::vector<uint16_t> tokens = l2l::ByteTokenize(text);
  // The validation split is the tail of the text, so neither file cuts the other's
  // documents apart more than once.
  const size_t n_val = static_cast<size_t>(static_cast<double>(tokens.size()) * val_fraction);
  if (val_fraction > 0.0 && (n_val == 0 || n_val == tokens.size())) {
    return l2l::InvalidArgument(input + " (" + std::to_string(tokens.size()) + " bytes) is too small to split off " +
                                std::to_string(val_fraction) + " for validation");
  }
  const std::span<const uint16_t> all(tokens);
  const std::span<const uint16_t> train = all.first(tokens.size() - n_val);
  L2L_RETURN_IF_ERROR(l2l::WriteTokensFile(output, train));
  std::printf("l2l-tokenize: wrote %zu tokens to %s\n", train.size(), output.c_str());
  if (n_val > 0) {
    L2L_RETURN_IF_ERROR(l2l::WriteTokensFile(val_output, all.last(n_val)));
    std::printf("l2l-tokenize: wrote %zu tokens to %s\n", n_val, val_output.c_str());
  }
  return l2l::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Byte-level tokenizer: text file -> llm.c tokens file(s) (vocabulary 256)"};
  std::string input, output, val_output;
  double val_fraction = 0.0;
  app.add_option("INPUT", input, "text file to tokenize")->required();
  app.add_option("OUTPUT", output, "tokens file to write (training split)")->required();
  app.add_option("--val-fraction", val_fraction, "fraction of the text (its tail) written to --val-output");
  app.add_option("--val-output", val_output, "tokens file for the validation split");
  CLI11_PARSE(app, argc, argv);
  const l2l::Status st = Run(input, output, val_fraction, val_output);
  if (!st.ok()) {
    std::fprintf(stderr, "l2l-tokenize: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
