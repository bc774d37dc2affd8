// Sampler: temperature / top-k / top-p sampling. See worker/sampler.h.
#include "worker/sampler.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "common/formats/tokens_file.h"
#include "common/rng.h"
#include "kernels/layers/kv_decode.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::worker {
double SamplerUniform(uint64_t seed, uint64_t i) {
  return static_cast<double>(SplitMix64(SplitMix64(seed) ^ SplitMix64(i + 0x5851F42D4C957F2Dull)) >> 11) * 0x1.0p-53;
}

int32_t SampleToken(const std::vector<float>& probs, float temperature, int64_t top_k, double u) {
  return SampleToken(probs, temperature, top_k, 1.0f, u);
}

int32_t SampleToken(const std::vector<float>& probs, float temperature, int64_t top_k, float top_p, double u) {
  const int64_t V = static_cast<int64_t>(probs.size());
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  // Most likely first; ties by lower id so the order is total and deterministic.
  auto more_likely = [&](int32_t a, int32_t b) { return probs[a] != probs[b] ? probs[a] > probs[b] : a < b; };
  if (temperature <= 0.0f) return *std::min_element(ids.begin(), ids.end(), more_likely);
  const int64_t k = (top_k <= 0 || top_k >= V) ? V : top_k;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
  ids.resize(static_cast<size_t>(k));
  // p^(1/temperature), relative to the largest, in double.
  const double pmax = std::max(static_cast<double>(probs[ids[0]]), 1e-300);
  std::vector<double> w(ids.size());
  double total = 0.0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const double p = std::max(static_cast<double>(probs[ids[i]]), 0.0);
    w[i] = p > 0.0 ? std::exp(std::log(p / pmax) / temperature) : 0.0;
    total += w[i];
  }
  if (top_p > 0.0f && top_p < 1.0f && total > 0.0) {
    // ids are most likely first: keep the shortest prefix whose share reaches top_p.
    double cum = 0.0, kept = 0.0;
    size_t n = 0;
    while (n < w.size()) {
      cum += w[n];
      kept = cum;
      ++n;
      if (cum / total >= static_cast<double>(top_p)) break;
    }
    w.resize(n);
    total = kept;
  }
  double acc = 0.0;
  const double target = u * total;
  for (size_t i = 0; i < w.size(); ++i) {
    acc += w[i];
    if (target < acc) return ids[i];
  }
  return ids[w.size() - 1];
}

Result<std::vector<int32_t>> Generate(const NextTokenProbs& next, const std::vector<int32_t>& prompt,
                                      const SamplerOptions& opts) {
  if (prompt.empty()) return InvalidArgument("sampling needs a non-empty prompt");
  if (opts.context_len <= 0) return InvalidArgument("sampler context_len must be positive");
  std::vector<int32_t> out = prompt;
  for (int64_t i = 0; i < opts.max_new_tokens; ++i) {
    const size_t n = std::min(out.size(), static_cast<size_t>(opts.context_len));
    std::vector<int32_t> context(out.end() - static_cast<std::ptrdiff_t>(n), out.end());
    L2L_ASSIGN_OR_RETURN(std::vector<float> probs, next(context));
    const int32_t t = SampleToken(probs, opts.temperature, opts.top_k, opts.top_p,
                                  SamplerUniform(opts.seed, static_cast<uint64_t>(i)));
    out.push_back(t);
    if (opts.eos_id >= 0 && t == opts.eos_id) break;
  }
  return out;
}

NextTokenProbs TrainerProbs(ReferenceTrainer* trainer) {
  return [trainer](const std::vector<int32_t>& context) -> Result<std::vector<float>> {
    const int64_t T = trainer->spec().seq_len, V = trainer->spec().vocab_size;
    const int64_t n = static_cast<int64_t>(context.size());
    if (n < 1 || n > T) {
      return InvalidArgument("sampling context of " + std::to_string(n) + " tokens must be in [1, model.seq_len=" +
                             std::to_string(T) + "]");
    }
    std::vector<int32_t> tokens(static_cast<size_t>(T), 0);
    std::copy(context.begin(), context.end(), tokens.begin());
    std::vector<float> probs(static_cast<size_t>(T * V));  // (1,T,V)
    L2L_RETURN_IF_ERROR(trainer->Probs(tokens.data(), 1, T, probs.data()));
    return std::vector<float>(probs.begin() + (n - 1) * V, probs.begin() + n * V);
  };
}

Result<NextTokenProbs> KvCacheProbs(ReferenceTrainer* trainer, int64_t max_len) {
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<layers::KvDecoder> d,
                       layers::KvDecoder::Create(trainer->backend(), trainer->spec(), trainer->device_params(), max_len));
  std::shared_ptr<layers::KvDecoder> dec(std::move(d));
  return NextTokenProbs(
      [dec](const std::vector<int32_t>& context) -> Result<std::vector<float>> { return dec->NextProbs(context); });
}

Result<std::string> SampleText(ReferenceTrainer* trainer, const std::string& prompt,
                               const SamplerOptions& opts) {
  const int64_t vocab = trainer->config().model.vocab_size;
  if (vocab != kByteVocabSize) {
    return InvalidArgument("sampling text needs the byte-level vocabulary of 256; the model has " +
                           std::to_string(vocab));
  }
  const std::vector<uint16_t> p16 = ByteTokenize(prompt.empty() ? std::string("\n") : prompt);
  L2L_ASSIGN_OR_RETURN(std::vector<int32_t> out,
                       Generate(TrainerProbs(trainer), std::vector<int32_t>(p16.begin(), p16.end()), opts));
  return ByteDetokenize(std::vector<uint16_t>(out.begin(), out.end()));
}

}  // namespace l2l::worker
