// l2l-sample: generates text from a model on the CPU backend.
//   l2l-sample MODEL [--tokenizer PATH] [--prompt TEXT | --prompt-ids I,J,...] [--tokens N]
//              [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ignore-eos] [--ids]
//              [--adapter DIR]
// MODEL is a Hugging Face dir, a GGUF file, a checkpoint directory or root, or an l2l
// safetensors file (tools/inference_model.h). Text is encoded and decoded with the model's
// tokenizer: --tokenizer when given, else the model path itself (HF dir, GGUF) or the
// checkpoint job's imported_from; a model without one uses the byte-level tokenizer when
// its vocabulary is 256 and otherwise needs --prompt-ids (the sample is then ids only).
// --adapter DIR merges a PEFT LoRA adapter directory into the weights first (fp32;
// tools/inference_model.h ApplyAdapter); the tokenizer stays the model's.
// Generation stops at the tokenizer's EOS id (unless --ignore-eos). --temperature 0 is
// greedy. --ids also prints the prompt and generated token ids, one line each.
// Decoders sample with a key/value cache (kernels/layers/kv_decode.h: the prompt once, then
// one token per step); --no-kv-cache recomputes the whole context for every token. The
// speed (new tokens/s) goes to stderr.
// main() only parses flags, builds objects and runs (STYLE.md).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <sstream>

#include "common/env.h"
#include "common/formats/tokens_file.h"
#include "common/logging.h"
#include "tokenizer/load.h"
#include "tools/inference_model.h"
#include "worker/reference/reference_trainer.h"
#include "worker/sampler.h"

namespace {

namespace t = l2l::tools;
namespace w = l2l::worker;

struct Flags {
  std::string model, tokenizer, prompt = "The ", prompt_ids, adapter;
  int64_t tokens = 200, top_k = 40;
  float temperature = 0.8f, top_p = 1.0f;
  uint64_t seed = 1;
  bool ignore_eos = false, ids = false, no_kv_cache = false;
};

// Next-token probabilities at the context's length rounded up to a multiple of 32 (at
// most seq_len): causal attention makes the right padding invisible to the context, and
// the few distinct shapes keep the trainer's workspace from being rebuilt every token.
w::NextTokenProbs BucketedProbs(w::ReferenceTrainer* model) {
  return [model](const std::vector<int32_t>& context) -> l2l::Result<std::vector<float>> {
    const int64_t seq_len = model->spec().seq_len, V = model->spec().vocab_size;
    const int64_t n = static_cast<int64_t>(context.size());
    if (n < 1 || n > seq_len) {
      return l2l::InvalidArgument("sampling context of " + std::to_string(n) + " tokens must be in [1, seq_len=" +
                                  std::to_string(seq_len) + "]");
    }
    const int64_t T = std::min(seq_len, (n + 31) / 32 * 32);
    std::vector<int32_t> tokens(static_cast<size_t>(T), 0);
    std::copy(context.begin(), context.end(), tokens.begin());
    std::vector<float> probs(static_cast<size_t>(T * V));
    L2L_RETURN_IF_ERROR(model->Probs(tokens.data(), 1, T, probs.data()));
    return std::vector<float>(probs.begin() + (n - 1) * V, probs.begin() + n * V);
  };
}

l2l::Result<std::vector<int32_t>> ParseIds(const std::string& s, int64_t V) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v >= V) {
      return l2l::InvalidArgument("--prompt-ids: '" + item + "' is not a token id in [0, " + std::to_string(V) + ")");
    }
    out.push_back(static_cast<int32_t>(v));
  }
  if (out.empty()) return l2l::InvalidArgument("--prompt-ids: no ids");
  return out;
}

std::string JoinIds(const std::vector<int32_t>& ids, size_t from) {
  std::string s;
  for (size_t i = from; i < ids.size(); ++i) s += (i > from ? " " : "") + std::to_string(ids[i]);
  return s;
}

l2l::Status Run(const Flags& f) {
  L2L_ASSIGN_OR_RETURN(t::InferenceModel m, t::LoadInferenceModel(f.model));
  if (!f.adapter.empty()) L2L_RETURN_IF_ERROR(t::ApplyAdapter(&m, f.adapter));
  const int64_t V = m.spec.vocab_size;
  const std::string tok_path = !f.tokenizer.empty() ? f.tokenizer : m.tokenizer_path;
  std::optional<l2l::tok::Tokenizer> tok;
  if (!tok_path.empty()) {
    l2l::Result<l2l::tok::Tokenizer> r = l2l::tok::LoadTokenizer(tok_path);
    // A model path without tokenizer files is fine when ids are given or bytes will do;
    // an explicit --tokenizer must load.
    if (r.ok()) {
      tok.emplace(std::move(*r));
    } else if (!f.tokenizer.empty() || (f.prompt_ids.empty() && V != l2l::kByteVocabSize)) {
      return r.status().WithContext("tokenizer");
    }
  }
  if (tok && tok->vocab_size() > V) {
    return l2l::InvalidArgument("tokenizer " + tok_path + " has " + std::to_string(tok->vocab_size()) +
                                " ids, more than the model's vocabulary " + std::to_string(V));
  }
  const bool bytes = !tok && V == l2l::kByteVocabSize;
  std::vector<int32_t> prompt;
  if (!f.prompt_ids.empty()) {
    L2L_ASSIGN_OR_RETURN(prompt, ParseIds(f.prompt_ids, V));
  } else if (tok) {
    L2L_ASSIGN_OR_RETURN(prompt, tok->Encode(f.prompt.empty() ? std::string("\n") : f.prompt));
  } else if (bytes) {
    for (uint16_t b : l2l::ByteTokenize(f.prompt.empty() ? std::string("\n") : f.prompt)) prompt.push_back(b);
  } else {
    return l2l::InvalidArgument(t::DescribeModel(m) + " has a vocabulary of " + std::to_string(V) +
                                " and no tokenizer; pass --tokenizer PATH or --prompt-ids");
  }
  if (prompt.empty()) return l2l::InvalidArgument("the prompt encodes to no tokens");
  const std::string desc = t::DescribeModel(m);
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<w::ReferenceTrainer> model, t::CreateInferenceTrainer(&m));
  w::SamplerOptions so;
  so.max_new_tokens = f.tokens;
  so.temperature = f.temperature;
  so.top_k = f.top_k;
  so.top_p = f.top_p;
  so.seed = f.seed;
  so.context_len = model->spec().seq_len;
  so.eos_id = (tok && !f.ignore_eos) ? tok->eos_id() : -1;
  // With a KV cache (the default for decoders): the prompt once, then one token per step.
  w::NextTokenProbs next;
  if (f.no_kv_cache) {
    next = BucketedProbs(model.get());
  } else {
    const int64_t longest = std::min<int64_t>(so.context_len, static_cast<int64_t>(prompt.size()) + f.tokens);
    L2L_ASSIGN_OR_RETURN(next, w::KvCacheProbs(model.get(), longest));
  }
  const auto t0 = std::chrono::steady_clock::now();
  l2l::Result<std::vector<int32_t>> out = w::Generate(next, prompt, so);
  if (!out.ok()) return out.status().WithContext(desc);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t generated = out->size() - prompt.size();
  std::optional<std::string> text;
  if (tok) {
    L2L_ASSIGN_OR_RETURN(std::string s, tok->Decode(*out));
    text = std::move(s);
  } else if (bytes) {
    L2L_ASSIGN_OR_RETURN(std::string s, l2l::ByteDetokenize(std::vector<uint16_t>(out->begin(), out->end())));
    text = std::move(s);
  }
  std::printf("---- sample (%s; temperature %.2f, top-k %lld, top-p %.2f) ----\n", desc.c_str(), so.temperature,
              static_cast<long long>(so.top_k), so.top_p);
  if (text) std::printf("%s\n", text->c_str());
  std::printf("---- end of sample (%zu new tokens%s) ----\n", generated,
              (so.eos_id >= 0 && out->back() == so.eos_id && out->size() > prompt.size()) ? ", stopped at EOS" : "");
  // Speed on stderr: the prompt's tokens plus the generated ones, over the generation's time.
  std::fprintf(stderr, "l2l-sample: %zu prompt + %zu new tokens in %.2f s: %.1f new tokens/s (%s)\n", prompt.size(),
               generated, secs, secs > 0 ? static_cast<double>(generated) / secs : 0.0,
               f.no_kv_cache ? "full recompute per token" : "KV cache");
  if (f.ids || !text) {
    std::printf("prompt ids: %s\n", JoinIds(prompt, 0).c_str());
    std::printf("ids: %s\n", JoinIds(*out, prompt.size()).c_str());
  }
  return l2l::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"l2l-sample: generate text from a model (HF dir, GGUF, checkpoint or l2l safetensors) on the CPU"};
  Flags f;
  app.add_option("model", f.model, "Hugging Face dir, GGUF file, checkpoint dir/root or l2l safetensors")
      ->required();
  app.add_option("--adapter", f.adapter, "PEFT LoRA adapter directory merged into the model's weights");
  app.add_option("--tokenizer", f.tokenizer, "model dir, tokenizer.json or GGUF (default: the model's own)");
  auto* po = app.add_option("--prompt", f.prompt, "text the sample starts from")->capture_default_str();
  app.add_option("--prompt-ids", f.prompt_ids, "comma-separated token ids the sample starts from")->excludes(po);
  app.add_option("--tokens", f.tokens, "most tokens to generate")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--temperature", f.temperature, "<= 0: greedy")->capture_default_str();
  app.add_option("--top-k", f.top_k, "<= 0: no cut")->capture_default_str();
  app.add_option("--top-p", f.top_p, "nucleus mass in (0, 1); >= 1: no cut")->capture_default_str();
  app.add_option("--seed", f.seed, "sampling seed")->capture_default_str();
  app.add_flag("--ignore-eos", f.ignore_eos, "do not stop at the tokenizer's EOS token");
  app.add_flag("--ids", f.ids, "also print the prompt and generated token ids");
  app.add_flag("--no-kv-cache", f.no_kv_cache,
               "recompute the whole context for every token (the old path; for comparison)");
  app.add_flag_callback("--help-env", l2l::PrintEnvHelpAndExit, l2l::kHelpEnvDoc);
  CLI11_PARSE(app, argc, argv);
  l2l::InitLogging("warn").IgnoreError();
  l2l::Status s = Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "l2l-sample: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
