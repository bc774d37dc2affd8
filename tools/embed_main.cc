// l2l-embed: sentence embeddings of an encoder (BERT) model on the CPU: the attention-mask-
// weighted mean of the last hidden state of each row of a rows file (common/formats/rows_file.h;
// make one with l2l-tokenize --task classify, labels 0 when there are none), as
// sentence-transformers' mean pooling computes it (no normalisation).
//   l2l-embed --model PATH --data ROWS --output EMB.f32 [--batch B]
// PATH: a Hugging Face dir (BertModel / BertFor*), an l2l safetensors file or a checkpoint.
// EMB.f32 is raw little-endian float32, rows x d_model, row-major (docs/formats.md). One
// output line; errors are one line naming what is wrong. main() only parses flags, builds
// objects and runs (STYLE.md).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/env.h"
#include "common/file_util.h"
#include "common/formats/rows_file.h"
#include "common/logging.h"
#include "common/models/registry.h"
#include "tools/encoder_eval.h"
#include "tools/inference_model.h"

namespace {

namespace t = l2l::tools;

struct Flags {
  std::string model, data, output;
  int64_t batch = 8;
};

l2l::Status Run(const Flags& f) {
  L2L_ASSIGN_OR_RETURN(t::InferenceModel m, t::LoadInferenceModel(f.model));
  if (!l2l::models::IsEncoder(m.spec)) {
    return l2l::InvalidArgument(f.model + ": a " + std::string(l2l::ToString(m.spec.family)) +
                                " model; l2l-embed needs an encoder (bert)");
  }
  l2l::Result<l2l::ClassifyRows> rows = l2l::ReadClassifyFiles(f.data, m.spec.vocab_size);
  if (!rows.ok()) return rows.status().WithContext("--data");
  if (rows->max_len > m.spec.seq_len) {
    return l2l::InvalidArgument(f.data + ": rows of " + std::to_string(rows->max_len) +
                                " tokens exceed the model's seq_len " + std::to_string(m.spec.seq_len));
  }
  const std::string what = t::DescribeModel(m);
  const int64_t C = m.spec.d_model;
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<l2l::worker::ReferenceTrainer> model, t::CreateInferenceTrainer(&m));
  L2L_ASSIGN_OR_RETURN(std::vector<float> emb, t::MeanPooledEmbeddings(model.get(), *rows, f.batch));
  L2L_RETURN_IF_ERROR(l2l::WriteFileAtomic(f.output, emb.data(), emb.size() * sizeof(float)));
  std::printf("embed: %lld rows x %lld floats (mean pooling) to %s (model %s)\n", static_cast<long long>(rows->rows()),
              static_cast<long long>(C), f.output.c_str(), what.c_str());
  return l2l::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2l-embed: mean-pooled sentence embeddings of a BERT model on rows files (CPU)"};
  Flags f;
  app.add_option("--model", f.model, "Hugging Face dir, l2l safetensors or checkpoint")->required();
  app.add_option("--data", f.data, "rows files (l2l-tokenize --task classify)")->required();
  app.add_option("--output", f.output, "float32 file: rows x d_model")->required();
  app.add_option("--batch", f.batch, "rows per forward pass")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_flag_callback("--help-env", l2l::PrintEnvHelpAndExit, l2l::kHelpEnvDoc);
  CLI11_PARSE(app, argc, argv);
  l2l::InitLogging("warn").IgnoreError();
  if (l2l::Status s = Run(f); !s.ok()) {
    std::fprintf(stderr, "l2l-embed: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
