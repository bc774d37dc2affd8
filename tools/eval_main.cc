// l2l-eval: loss and perplexity of a model on a tokens file, on the CPU backend.
//   l2l-eval --model PATH | --checkpoint DIR --data TOKENS [--tokens N] [--context T] [--batch B]
// PATH is a Hugging Face dir, a GGUF file or an l2l safetensors file (a checkpoint also
// works there); DIR a checkpoint directory or root. The first N tokens of the file (all
// by default) are cut into in-order, non-overlapping windows of T+1 tokens starting at
// multiples of T (as the data loader cuts them; a stream shorter than T+1 is one window
// of all its tokens); each window's T targets are scored given the tokens before them
// within the window. The loss is the mean cross-entropy over every scored target (a
// "<TOKENS>.mask" loss mask, when present, leaves out targets whose mask byte is 0);
// perplexity = exp(loss). One output line; errors are one line naming what is wrong.
// main() only parses flags, builds objects and runs (STYLE.md).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "common/logging.h"
#include "common/tokens_file.h"
#include "kernels/backend.h"
#include "tools/inference_model.h"
#include "worker/reference_trainer.h"

namespace {

namespace t = l2l::tools;
namespace w = l2l::worker;

struct Flags {
  std::string model, checkpoint, data;
  int64_t tokens = 0, context = 0, batch = 4;
};

struct EvalResult {
  double loss = 0.0;
  int64_t scored = 0;   // targets that count
  int64_t windows = 0, T = 0;
};

l2l::Result<EvalResult> Evaluate(w::ReferenceTrainer* model, const std::vector<uint32_t>& toks,
                                 const std::vector<uint8_t>& mask, int64_t T, int64_t B) {
  const int64_t n = static_cast<int64_t>(toks.size());
  EvalResult r;
  r.T = T;
  r.windows = (n - 1) / T;
  double weighted = 0.0;
  for (int64_t w0 = 0; w0 < r.windows; w0 += B) {
    w::MicroBatch mb;
    mb.B = std::min(B, r.windows - w0);
    mb.T = T;
    int64_t count = 0;
    for (int64_t b = 0; b < mb.B; ++b) {
      const int64_t start = (w0 + b) * T;
      for (int64_t j = 0; j < T; ++j) {
        mb.inputs.push_back(static_cast<int32_t>(toks[start + j]));
        const bool keep = mask.empty() || mask[start + j + 1] != 0;
        mb.targets.push_back(keep ? static_cast<int32_t>(toks[start + j + 1]) : l2l::kernels::kIgnoreTarget);
        count += keep ? 1 : 0;
      }
    }
    if (count == 0) continue;
    // The head averages over the trained targets of the micro-batch: weight by their count.
    L2L_ASSIGN_OR_RETURN(float loss, model->Evaluate({mb}));
    weighted += static_cast<double>(loss) * static_cast<double>(count);
    r.scored += count;
  }
  if (r.scored == 0) return l2l::InvalidArgument("no target is trained on (the loss mask is all zero)");
  r.loss = weighted / static_cast<double>(r.scored);
  return r;
}

l2l::Status Run(const Flags& f) {
  const std::string src = f.model.empty() ? f.checkpoint : f.model;
  l2l::Result<t::InferenceModel> loaded =
      f.model.empty() ? t::LoadCheckpointModel(f.checkpoint) : t::LoadInferenceModel(f.model);
  if (!loaded.ok()) return loaded.status();
  t::InferenceModel m = std::move(*loaded);
  const int64_t seq_len = m.spec.seq_len, V = m.spec.vocab_size;
  if (f.context > seq_len) {
    return l2l::InvalidArgument("--context " + std::to_string(f.context) + " exceeds the model's seq_len " +
                                std::to_string(seq_len) + " (" + t::DescribeModel(m) + ")");
  }
  l2l::Result<std::vector<uint32_t>> read = l2l::ReadTokensFile32(f.data, V);
  if (!read.ok()) return read.status().WithContext("--data");
  std::vector<uint32_t> toks = std::move(*read);
  std::vector<uint8_t> mask;
  const std::string mask_path = l2l::LossMaskPath(f.data);
  if (std::filesystem::exists(mask_path)) {
    L2L_ASSIGN_OR_RETURN(mask, l2l::ReadLossMaskFile(mask_path, static_cast<int64_t>(toks.size())));
  }
  if (f.tokens > 0 && static_cast<int64_t>(toks.size()) > f.tokens) {
    toks.resize(static_cast<size_t>(f.tokens));
    if (!mask.empty()) mask.resize(toks.size());
  }
  const int64_t n = static_cast<int64_t>(toks.size());
  if (n < 2) return l2l::InvalidArgument(f.data + ": " + std::to_string(n) + " tokens; evaluation needs at least 2");
  int64_t T = f.context > 0 ? f.context : std::min<int64_t>(seq_len, 1024);
  T = std::min(T, n - 1);
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<w::ReferenceTrainer> model, t::CreateInferenceTrainer(&m));
  l2l::Result<EvalResult> r = Evaluate(model.get(), toks, mask, T, f.batch);
  if (!r.ok()) return r.status().WithContext(f.data);
  std::printf("eval: loss %.6f perplexity %.4f tokens %lld (model %s, data %s, %lld windows of %lld%s)\n", r->loss,
              std::exp(r->loss), static_cast<long long>(r->scored), t::DescribeModel(m).c_str(), f.data.c_str(),
              static_cast<long long>(r->windows), static_cast<long long>(r->T + 1), mask.empty() ? "" : ", masked");
  return l2l::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2l-eval: loss and perplexity of a model on a tokens file (CPU)"};
  Flags f;
  auto* mo = app.add_option("--model", f.model, "Hugging Face dir, GGUF file, l2l safetensors or checkpoint");
  auto* co = app.add_option("--checkpoint", f.checkpoint, "checkpoint directory or checkpoint root");
  mo->excludes(co);
  app.add_option("--data", f.data, "tokens file (l2l-tokenize); TOKENS.mask is honoured")->required();
  app.add_option("--tokens", f.tokens, "evaluate the first N tokens (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--context", f.context, "window length T (default min(seq_len, 1024))")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", f.batch, "windows per forward pass")->capture_default_str()->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  l2l::InitLogging("warn").IgnoreError();
  l2l::Status s = f.model.empty() && f.checkpoint.empty()
                      ? l2l::InvalidArgument("one of --model or --checkpoint is required")
                      : Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "l2l-eval: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
