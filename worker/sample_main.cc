// l2l-sample: generates text from a model exported as safetensors (l2lctl export or
// l2l-train-ref), on the CPU backend, with the byte-level tokenizer.
//   l2l-sample MODEL.safetensors [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]
// main() only parses flags, builds objects and runs (STYLE.md).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "common/config.h"
#include "common/logging.h"
#include "common/model_io.h"
#include "common/tokens_file.h"
#include "worker/reference_trainer.h"
#include "worker/sampler.h"

namespace {

namespace w = l2l::worker;

struct Flags {
  std::string model, prompt = "The ";
  int64_t tokens = 200, top_k = 40;
  float temperature = 0.8f;
  uint64_t seed = 1;
};

l2l::Status Run(const Flags& f) {
  L2L_ASSIGN_OR_RETURN(l2l::LoadedModel m, l2l::LoadModel(f.model));
  l2l::JobConfig cfg;
  cfg.model = m.spec;
  cfg.train.micro_batch_size = 1;
  cfg.train.micro_batches = 1;
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<w::ReferenceTrainer> model,
                       w::ReferenceTrainer::Create(cfg, std::move(m.layers)));
  w::SamplerOptions so;
  so.max_new_tokens = f.tokens;
  so.temperature = f.temperature;
  so.top_k = f.top_k;
  so.seed = f.seed;
  so.context_len = cfg.model.seq_len;
  l2l::Result<std::string> text = w::SampleText(model.get(), f.prompt, so);
  if (!text.ok()) return text.status().WithContext(f.model);
  std::printf("---- sample (temperature %.2f, top-k %lld) ----\n%s\n---- end of sample ----\n", so.temperature,
              static_cast<long long>(so.top_k), text->c_str());
  return l2l::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2l-sample: generate text from an exported l2l model (byte-level vocabulary)"};
  Flags f;
  app.add_option("model", f.model, "model.safetensors (l2lctl export / l2l-train-ref)")->required();
  app.add_option("--prompt", f.prompt, "text the sample starts from")->capture_default_str();
  app.add_option("--tokens", f.tokens, "tokens to generate")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--temperature", f.temperature, "<= 0: greedy")->capture_default_str();
  app.add_option("--top-k", f.top_k, "<= 0: no cut")->capture_default_str();
  app.add_option("--seed", f.seed, "sampling seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  l2l::InitLogging("warn").IgnoreError();
  l2l::Status s = Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "l2l-sample: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
