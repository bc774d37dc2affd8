// Sampler: autoregressive text generation from a model's next-token probabilities, with
// temperature, top-k and top-p (nucleus), stopping at an end-of-sequence id, deterministic from a seed (counter-based RNG, no std::
// distributions). Independent of where the model runs: it asks a NextTokenProbs
// callback, so the reference trainer and the relay can both drive it.
//
// Thread-safety: pure functions; the callback is called from the caller's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/status.h"

namespace l2l::worker {

class ReferenceTrainer;

// Probabilities (V) of the token that follows `context` (1 <= context.size() <= the
// model's seq_len).
using NextTokenProbs = std::function<Result<std::vector<float>>(const std::vector<int32_t>& context)>;

struct SamplerOptions {
  int64_t max_new_tokens = 200;
  float temperature = 0.8f;  // <= 0: greedy (argmax)
  int64_t top_k = 40;        // <= 0 or >= V: no top-k cut
  float top_p = 1.0f;        // <= 0 or >= 1: no top-p cut
  int32_t eos_id = -1;       // >= 0: generation stops after this token (which is kept)
  uint64_t seed = 1;
  int64_t context_len = 64;  // the model's seq_len: only the last context_len tokens are fed
};

// Picks a token from `probs` (V): restricted to the top_k most likely (ties broken by
// lower id), reweighted by temperature (p^(1/temperature), i.e. softmax(logits/temperature)),
// using uniform draw u in [0,1). Exposed for tests.
int32_t SampleToken(const std::vector<float>& probs, float temperature, int64_t top_k, double u);
// The same, then (as Hugging Face's TopPLogitsWarper, after temperature and top-k) kept to
// the smallest set of most likely tokens whose renormalised probability reaches top_p
// (at least one token).
int32_t SampleToken(const std::vector<float>& probs, float temperature, int64_t top_k, float top_p, double u);

// Uniform in [0,1) for draw `i` of stream `seed`.
double SamplerUniform(uint64_t seed, uint64_t i);

// prompt followed by max_new_tokens generated tokens, or fewer when opts.eos_id is
// generated (the EOS id is the last token returned). prompt must be non-empty.
Result<std::vector<int32_t>> Generate(const NextTokenProbs& next, const std::vector<int32_t>& prompt,
                                      const SamplerOptions& opts);

// NextTokenProbs over a ReferenceTrainer's current weights. The context is right-padded
// to seq_len (causal attention makes the padding invisible to earlier positions), so
// every call runs one fixed (1, seq_len) shape.
NextTokenProbs TrainerProbs(ReferenceTrainer* trainer);
// NextTokenProbs over a trainer's current weights with a key/value cache
// (kernels/layers/kv_decode.h): the first context is prefilled, each later call that
// extends the previous context by one token runs that token alone; any other context
// (the window slid past seq_len) is prefilled again. Same distributions as TrainerProbs
// up to fp32 rounding. FailedPrecondition for a family without decoding (BERT). The
// callback shares its cache among copies; the trainer must outlive it and not Step.
// max_len (0 = seq_len): the longest context it will see (prompt + new tokens, capped
// at seq_len), which sizes the cache.
Result<NextTokenProbs> KvCacheProbs(ReferenceTrainer* trainer, int64_t max_len = 0);

// Byte-level text generation from a trainer's weights: tokenizes `prompt` (a newline when
// empty), generates, decodes. InvalidArgument unless the model's vocabulary is the
// byte-level 256.
Result<std::string> SampleText(ReferenceTrainer* trainer, const std::string& prompt,
                               const SamplerOptions& opts);

}  // namespace l2l::worker
