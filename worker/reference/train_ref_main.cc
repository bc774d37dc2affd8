// l2l-train-ref: trains a model with the single-process reference trainer (the oracle the
// relay is checked against), printing progress, evaluating on the validation split,
// saving Hugging Face GPT-2 safetensors (a LoRA job: a PEFT adapter directory, OUT/adapter)
// and printing a generated sample.
//
//   l2l-train-ref --config configs/quickstart.yaml [--steps N] [--set key=value]...
//                 [--out DIR] [--device cpu|cuda|cuda:N] [--threads N] [--prompt TEXT]
//                 [--sample-tokens N]
//
// --device picks the backend the trainer computes on (default cpu; cuda = cuda:0): the
// GPU conformance run trains with the same oracle on the CUDA backend. The backend is
// created before any data is read, so a build without CUDA or a host without a usable
// GPU fails at once, saying which.
//
// Exit status 0 on success; 1 with a message on stderr for a bad config, an unusable
// --device, missing or bad data, or a failed write.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/config.h"
#include "common/formats/tokens_file.h"
#include "common/status.h"
#include "worker/data_loader.h"
#include "worker/reference/reference_trainer.h"
#include "worker/sampler.h"

namespace {

using l2l::Result;
using l2l::Status;
namespace w = l2l::worker;

struct Flags {
  std::string config;
  int64_t steps = -1;
  std::vector<std::string> sets;
  std::string out = "out/train-ref";
  std::string device = "cpu";
  int threads = 0;
  std::string prompt = "The ";
  int64_t sample_tokens = 300;
  int64_t val_batches = 8;
};

Result<float> ValLoss(w::ReferenceTrainer* t, w::DataLoader* val, int64_t n) {
  n = std::min(n, val->batches_per_epoch());
  L2L_RETURN_IF_ERROR(val->Seek({}));
  return t->Evaluate(val->NextMany(n));
}

Status Run(const Flags& f) {
  L2L_ASSIGN_OR_RETURN(l2l::JobConfig cfg, l2l::LoadJobConfig(f.config));
  for (const std::string& s : f.sets) L2L_RETURN_IF_ERROR(l2l::ApplyOverride(&cfg, s).WithContext("--set " + s));
  if (f.steps >= 0) cfg.train.steps = f.steps;
  L2L_RETURN_IF_ERROR(cfg.Validate().WithContext(f.config));
  if (cfg.data.train_path.empty()) {
    return l2l::InvalidArgument(f.config + ": data.train_path is empty; point it at an llm.c tokens file "
                                "(make one with l2l-tokenize)");
  }
  const int64_t B = cfg.train.micro_batch_size, T = cfg.seq_len(), M = cfg.train.micro_batches;

  // The backend first: an unusable --device fails before any data is read.
  w::ReferenceTrainerOptions topt;
  topt.num_threads = f.threads;
  topt.device = f.device == "cuda" ? "cuda:0" : f.device;
  Result<std::unique_ptr<w::ReferenceTrainer>> created = w::ReferenceTrainer::Create(cfg, topt);
  if (!created.ok()) return created.status().WithContext("--device " + f.device);
  std::unique_ptr<w::ReferenceTrainer> trainer = std::move(created).value();

  w::DataLoaderOptions dopt;
  dopt.B = B;
  dopt.T = T;
  dopt.seed = cfg.train.seed;
  dopt.vocab_size = cfg.model.vocab_size;
  dopt.task = cfg.effective_task();
  dopt.num_labels = cfg.model.num_labels;
  dopt.mlm = cfg.mlm;
  L2L_ASSIGN_OR_RETURN(w::DataLoader train, w::DataLoader::OpenForTask(cfg.data.train_path, dopt));
  std::optional<w::DataLoader> val;
  if (!cfg.data.val_path.empty()) {
    dopt.shuffle = false;
    L2L_ASSIGN_OR_RETURN(val, w::DataLoader::OpenForTask(cfg.data.val_path, dopt));
  }

  std::printf("l2l-train-ref: model %lld params (V=%lld T=%lld C=%lld L=%lld H=%lld F=%lld, %s), backend %s\n",
              static_cast<long long>(cfg.model.NumParams()), static_cast<long long>(cfg.model.vocab_size),
              static_cast<long long>(cfg.model.seq_len), static_cast<long long>(cfg.model.d_model),
              static_cast<long long>(cfg.model.n_layer), static_cast<long long>(cfg.model.n_head),
              static_cast<long long>(cfg.model.d_ff), cfg.model.tied_embeddings ? "tied" : "untied",
              trainer->backend()->name().c_str());
  std::printf("l2l-train-ref: data %s: %lld tokens, %lld micro-batches of %lldx%lld per epoch; %lld steps of %lld\n",
              cfg.data.train_path.c_str(), static_cast<long long>(train.num_tokens()),
              static_cast<long long>(train.batches_per_epoch()), static_cast<long long>(B),
              static_cast<long long>(T), static_cast<long long>(cfg.train.steps), static_cast<long long>(M));
  if (val) {
    L2L_ASSIGN_OR_RETURN(float v0, ValLoss(trainer.get(), &*val, f.val_batches));
    std::printf("step 0/%lld | val loss %.4f\n", static_cast<long long>(cfg.train.steps), v0);
  }
  std::fflush(stdout);

  using Clock = std::chrono::steady_clock;
  const int64_t log_every = std::max<int64_t>(1, cfg.train.log_every);
  const double tokens_per_step = static_cast<double>(B * T * M);
  double window_s = 0, total_s = 0, loss_sum = 0;
  int64_t window_steps = 0;
  for (int64_t s = 0; s < cfg.train.steps; ++s) {
    const std::vector<w::MicroBatch> batches = train.NextMany(M);
    const float lr = l2l::LearningRate(cfg.optim, trainer->step());
    const auto t0 = Clock::now();
    L2L_ASSIGN_OR_RETURN(float loss, trainer->Step(batches));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    window_s += dt;
    total_s += dt;
    loss_sum += loss;
    ++window_steps;
    if ((s + 1) % log_every == 0 || s + 1 == cfg.train.steps) {
      // loss: mean over the steps since the last line; tok/s: over the same steps.
      std::printf("step %lld/%lld | loss %.4f | lr %.3e | tok/s %.0f\n", static_cast<long long>(s + 1),
                  static_cast<long long>(cfg.train.steps), loss_sum / window_steps, lr,
                  tokens_per_step * window_steps / window_s);
      std::fflush(stdout);
      window_s = loss_sum = 0;
      window_steps = 0;
    }
  }
  if (cfg.train.steps > 0) {
    std::printf("l2l-train-ref: %lld steps in %.1f s (%.0f tok/s)\n", static_cast<long long>(cfg.train.steps),
                total_s, tokens_per_step * cfg.train.steps / total_s);
  }
  if (val) {
    L2L_ASSIGN_OR_RETURN(float v1, ValLoss(trainer.get(), &*val, f.val_batches));
    std::printf("step %lld/%lld | val loss %.4f\n", static_cast<long long>(cfg.train.steps),
                static_cast<long long>(cfg.train.steps), v1);
  }

  std::error_code ec;
  std::filesystem::create_directories(f.out, ec);
  if (ec) return l2l::ErrnoError("mkdir -p", f.out, ec.value());
  if (cfg.lora.enabled) {
    // A LoRA job: the trained adapters as a PEFT adapter directory (the base is unchanged).
    const std::string adapter_dir = (std::filesystem::path(f.out) / "adapter").string();
    L2L_RETURN_IF_ERROR(trainer->SavePeftAdapter(adapter_dir));
    std::printf("l2l-train-ref: saved the LoRA adapter (PEFT) in %s\n", adapter_dir.c_str());
  } else {
    const std::string model_path = (std::filesystem::path(f.out) / "model.safetensors").string();
    L2L_RETURN_IF_ERROR(trainer->SaveSafetensors(model_path));
    std::printf("l2l-train-ref: saved %s\n", model_path.c_str());
  }

  if (f.sample_tokens > 0) {
    if (cfg.model.vocab_size != l2l::kByteVocabSize) {
      std::printf("l2l-train-ref: no sample (vocab_size %lld is not the byte-level 256)\n",
                  static_cast<long long>(cfg.model.vocab_size));
      return Status::Ok();
    }
    w::SamplerOptions so;
    so.max_new_tokens = f.sample_tokens;
    so.seed = cfg.train.seed;
    so.context_len = cfg.model.seq_len;
    L2L_ASSIGN_OR_RETURN(std::string text, w::SampleText(trainer.get(), f.prompt, so));
    std::printf("---- sample (temperature %.2f, top-k %lld) ----\n%s\n---- end of sample ----\n", so.temperature,
                static_cast<long long>(so.top_k), text.c_str());
  }
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Reference trainer: the whole model in one process (the oracle for the relay)"};
  Flags f;
  app.add_option("--config", f.config, "job config YAML (e.g. configs/quickstart.yaml)")->required();
  app.add_option("--steps", f.steps, "optimizer steps (overrides train.steps)");
  app.add_option("--set", f.sets, "override a config field, e.g. --set optim.lr=1e-3 (repeatable)");
  app.add_option("--out", f.out, "output directory for model.safetensors")->capture_default_str();
  app.add_option("--device", f.device, "backend: cpu, cuda (= cuda:0) or cuda:N")->capture_default_str();
  app.add_option("--threads", f.threads, "CPU threads (0: all cores)")->capture_default_str();
  app.add_option("--prompt", f.prompt, "text the sample starts from")->capture_default_str();
  app.add_option("--sample-tokens", f.sample_tokens, "tokens to generate at the end (0: none)")->capture_default_str();
  app.add_option("--val-batches", f.val_batches, "validation micro-batches to evaluate")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  // oneDNN's OpenMP threads spin between the many small GEMMs of a layer and starve the
  // TBB threads of the other ops on a small machine (measured ~3x slower on 2 busy
  // cores); passive waiting unless the user chose otherwise.
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);
  const Status st = Run(f);
  if (!st.ok()) {
    std::fprintf(stderr, "l2l-train-ref: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
