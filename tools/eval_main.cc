// l2l-eval: loss and perplexity of a model on a tokens file, on the CPU backend.
//   l2l-eval --model PATH | --checkpoint DIR --data TOKENS [--tokens N] [--context T] [--batch B]
//            [--adapter DIR]
// PATH is a Hugging Face dir, a GGUF file or an l2l safetensors file (a checkpoint also
// works there); DIR a checkpoint directory or root. The first N tokens of the file (all
// by default) are cut into in-order, non-overlapping windows of T+1 tokens starting at
// multiples of T (as the data loader cuts them; a stream shorter than T+1 is one window
// of all its tokens); each window's T targets are scored given the tokens before them
// within the window. The loss is the mean cross-entropy over every scored target (a
// "<TOKENS>.mask" loss mask, when present, leaves out targets whose mask byte is 0);
// perplexity = exp(loss). One output line; errors are one line naming what is wrong.
// --adapter DIR merges a PEFT LoRA adapter directory into the weights first (fp32,
// W += (alpha / r) B A; tools/inference_model.h ApplyAdapter).
//
// Encoder (BERT) models read classification rows instead (common/formats/rows_file.h: TOKENS,
// TOKENS.types, TOKENS.attn, TOKENS.labels; l2l-tokenize --task classify | mlm):
//   num_labels > 0: "eval: task classify loss L accuracy A [precision P recall R f1 F]
//                   majority M rows N ..." (F1 of the positive class 1 for two classes);
//   num_labels 0:   the rows masked as a job's first epoch masks them (--seed, --mask-id,
//                   --first-word-id as the job's train.seed and mlm: keys), "eval: task mlm
//                   loss L accuracy A masked N ..." over the masked positions.
// --rows N evaluates the first N rows; --logits FILE writes a classifier's logits (float32,
// rows x num_labels). A headless BertModel directory (a sentence encoder) gets the head of
// --num-labels N with --init-seed S, the head a job with model.num_labels N and train.seed
// S starts from (the untrained baseline of a fine-tune).
// main() only parses flags, builds objects and runs (STYLE.md).
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "common/env.h"
#include "common/file_util.h"
#include "common/formats/rows_file.h"
#include "common/formats/tokens_file.h"
#include "common/logging.h"
#include "common/models/registry.h"
#include "kernels/backend.h"
#include "tools/encoder_eval.h"
#include "tools/inference_model.h"
#include "worker/reference/reference_trainer.h"

namespace {

namespace t = l2l::tools;
namespace w = l2l::worker;

struct Flags {
  std::string model, checkpoint, data, adapter;
  int64_t tokens = 0, context = 0, batch = 4, rows = 0;
  uint64_t seed = 1234;
  l2l::MlmConfig mlm;
  std::string logits;           // classification: write the logits here
  l2l::PretrainedOptions head;  // a headless base model: the head to build
};

// Encoder models: classification or masked-LM metrics on rows files.
l2l::Status RunEncoder(const Flags& f, t::InferenceModel m) {
  l2l::Result<l2l::ClassifyRows> read = l2l::ReadClassifyFiles(f.data, m.spec.vocab_size);
  if (!read.ok()) return read.status().WithContext("--data (rows files of l2l-tokenize --task classify | mlm)");
  l2l::ClassifyRows rows = std::move(*read);
  if (rows.max_len > m.spec.seq_len) {
    return l2l::InvalidArgument(f.data + ": rows of " + std::to_string(rows.max_len) + " tokens exceed the model's seq_len " +
                                std::to_string(m.spec.seq_len));
  }
  if (f.rows > 0 && rows.rows() > f.rows) {
    const size_t n = static_cast<size_t>(f.rows * rows.max_len);
    rows.ids.resize(n);
    rows.type_ids.resize(n);
    rows.attention.resize(n);
    rows.labels.resize(static_cast<size_t>(f.rows));
  }
  const std::string what = t::DescribeModel(m);
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<w::ReferenceTrainer> model, t::CreateInferenceTrainer(&m));
  if (model->spec().num_labels > 0) {
    l2l::Result<t::ClassifyEval> r = t::EvaluateClassify(model.get(), rows, f.batch);
    if (!r.ok()) return r.status().WithContext(f.data);
    std::string f1;
    if (model->spec().num_labels == 2) {
      char buf[128];
      std::snprintf(buf, sizeof(buf), " precision %.6f recall %.6f f1 %.6f", r->precision, r->recall, r->f1);
      f1 = buf;
    }
    if (!f.logits.empty()) {
      L2L_RETURN_IF_ERROR(l2l::WriteFileAtomic(f.logits, r->logits.data(), r->logits.size() * sizeof(float)));
    }
    std::printf("eval: task classify loss %.6f accuracy %.6f%s majority %.6f rows %lld (model %s, data %s, %lld classes)\n",
                r->loss, r->accuracy, f1.c_str(), r->majority, static_cast<long long>(r->rows), what.c_str(),
                f.data.c_str(), static_cast<long long>(model->spec().num_labels));
    return l2l::Status::Ok();
  }
  l2l::Result<t::MlmEval> r = t::EvaluateMlm(model.get(), rows, f.mlm, f.seed, f.batch);
  if (!r.ok()) return r.status().WithContext(f.data);
  std::printf("eval: task mlm loss %.6f accuracy %.6f masked %lld rows %lld (model %s, data %s)\n", r->loss, r->accuracy,
              static_cast<long long>(r->masked), static_cast<long long>(rows.rows()), what.c_str(), f.data.c_str());
  return l2l::Status::Ok();
}

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
      f.model.empty() ? t::LoadCheckpointModel(f.checkpoint) : t::LoadInferenceModel(f.model, f.head);
  if (!loaded.ok()) return loaded.status();
  t::InferenceModel m = std::move(*loaded);
  if (!f.adapter.empty()) L2L_RETURN_IF_ERROR(t::ApplyAdapter(&m, f.adapter));
  if (l2l::models::IsEncoder(m.spec)) return RunEncoder(f, std::move(m));
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
  CLI::App app{"l2l-eval: loss and perplexity of a model on a tokens file; classification / MLM metrics of a BERT model on rows (CPU)"};
  Flags f;
  auto* mo = app.add_option("--model", f.model, "Hugging Face dir, GGUF file, l2l safetensors or checkpoint");
  auto* co = app.add_option("--checkpoint", f.checkpoint, "checkpoint directory or checkpoint root");
  mo->excludes(co);
  app.add_option("--data", f.data, "tokens file (l2l-tokenize; TOKENS.mask is honoured), or rows files for a BERT model")
      ->required();
  app.add_option("--adapter", f.adapter, "PEFT LoRA adapter directory merged into the model's weights");
  app.add_option("--tokens", f.tokens, "evaluate the first N tokens (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--context", f.context, "window length T (default min(seq_len, 1024))")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", f.batch, "windows (rows) per forward pass")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--rows", f.rows, "encoder models: evaluate the first N rows (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--logits", f.logits, "classification: write the logits (float32, rows x num_labels) to this file");
  app.add_option("--num-labels", f.head.num_labels,
                 "a headless BertModel: build this head (0 masked LM, N classes), as a job's model.num_labels");
  app.add_option("--init-seed", f.head.init_seed, "a headless BertModel: seed of the new head (the job's train.seed)")
      ->capture_default_str();
  app.add_option("--seed", f.seed, "masked LM: the job's train.seed (masking of epoch 0)")->capture_default_str();
  app.add_option("--mask-id", f.mlm.mask_id, "masked LM: the [MASK] id (mlm.mask_id)")->capture_default_str();
  app.add_option("--first-word-id", f.mlm.first_word_id, "masked LM: ids below are never masked (mlm.first_word_id)")
      ->capture_default_str();
  app.add_flag_callback("--help-env", l2l::PrintEnvHelpAndExit, l2l::kHelpEnvDoc);
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
