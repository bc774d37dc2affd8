// Helpers the family files share: appending named tensors to a layout and the
// deterministic normal fill every family's initialisation uses.
//
// Initialisation uses a counter-based generator (splitmix64 of (seed, layer, element))
// and Box-Muller, never std::normal_distribution (whose output is implementation
// defined), so every process and every platform produces the same bytes for a layer.
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_util.h"
#include "common/model_spec.h"
#include "common/rng.h"

namespace l2l::models {

// Appends one named tensor to the layout.
inline void AddParam(LayerLayout* layout, std::string name, std::vector<int64_t> shape, bool decay) {
  ParamInfo p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.numel = 1;
  for (int64_t d : p.shape) p.numel *= static_cast<size_t>(d);
  p.offset = layout->numel;
  p.decay = decay;
  layout->numel += p.numel;
  layout->params.push_back(std::move(p));
}

// Uniform in (0, 1], from the top 53 bits.
inline double Uniform01(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

// Elements [begin, end) of FillNormal's tensor of n = `end` or more elements (begin
// even: elements come in Box-Muller pairs).
inline void FillNormalRange(uint64_t key, float std, float* out, size_t begin, size_t end) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (size_t i = begin; i < end; i += 2) {
    const uint64_t pair = i / 2;
    const double u1 = Uniform01(SplitMix64(key ^ SplitMix64(2 * pair)));
    const double u2 = Uniform01(SplitMix64(key ^ SplitMix64(2 * pair + 1)));
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * r * std::cos(kTwoPi * u2));
    if (i + 1 < end) out[i + 1] = static_cast<float>(std * r * std::sin(kTwoPi * u2));
  }
}

// Fills out[0..n) with N(0, std) drawn from stream `key`; element i depends only on
// (key, i), so the result does not depend on how the buffer is split or ordered. Large
// tensors (>= 8 Mi elements: a 7B model's embedding is 545 M, ~30 s on one core) are
// filled by several threads in even-sized chunks; the bytes are the same.
inline void FillNormal(uint64_t key, float std, float* out, size_t n) {
  constexpr size_t kChunk = size_t{1} << 22;
  const size_t hw = std::thread::hardware_concurrency();
  if (n < 2 * kChunk || hw < 2) {
    FillNormalRange(key, std, out, 0, n);
    return;
  }
  const size_t parts = std::min(hw, n / kChunk);
  const size_t per = (n / parts + 1) & ~size_t{1};  // even, so chunks start on a pair
  std::vector<std::thread> threads;
  for (size_t b = 0; b < n; b += per) threads.emplace_back(FillNormalRange, key, std, out, b, std::min(n, b + per));
  for (std::thread& t : threads) t.join();
}

// The key of layer `index`'s stream under `seed`.
inline uint64_t LayerKey(uint64_t seed, int64_t index) {
  return SplitMix64(SplitMix64(seed) ^ (0xA5A5A5A5ull + static_cast<uint64_t>(index)));
}

// The key of the k-th tensor of a layer.
inline uint64_t TensorKey(uint64_t layer_key, size_t k) { return SplitMix64(layer_key + 0x1000193ull * (k + 1)); }

inline bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

inline std::string Field(const char* name, int64_t v) { return std::string("model.") + name + "=" + std::to_string(v); }

// The BERT-only fields must keep their defaults in the other families.
inline Status RequireNoBertFields(const ModelSpec& s) {
  const ModelSpec d;
  if (s.type_vocab_size != d.type_vocab_size) return InvalidArgument(Field("type_vocab_size", s.type_vocab_size) + " needs model.family=bert");
  if (s.num_labels != d.num_labels) return InvalidArgument(Field("num_labels", s.num_labels) + " needs model.family=bert");
  if (s.layer_norm_eps != d.layer_norm_eps) {
    return InvalidArgument("model.layer_norm_eps=" + std::to_string(s.layer_norm_eps) + " needs model.family=bert");
  }
  return Status::Ok();
}

// The fields of the Llama-family attention variants (head size, q/k norms, sliding
// windows) must keep their defaults in the families without them (GPT-2, BERT).
inline Status RequireNoAttentionVariantFields(const ModelSpec& s, const char* family) {
  const ModelSpec d;
  const std::string needs = std::string(" needs model.family=llama or gemma3 (") + family + " has none)";
  if (s.head_size != d.head_size) return InvalidArgument(Field("head_size", s.head_size) + needs);
  if (s.qk_norm) return InvalidArgument("model.qk_norm=true" + needs);
  if (s.sliding_window != d.sliding_window) return InvalidArgument(Field("sliding_window", s.sliding_window) + needs);
  if (s.max_window_layers != d.max_window_layers) {
    return InvalidArgument(Field("max_window_layers", s.max_window_layers) + needs);
  }
  if (s.sliding_window_pattern != d.sliding_window_pattern) {
    return InvalidArgument(Field("sliding_window_pattern", s.sliding_window_pattern) + needs);
  }
  return Status::Ok();
}

// The Gemma-3-only fields must keep their defaults in the other families.
inline Status RequireNoGemma3Fields(const ModelSpec& s) {
  const ModelSpec d;
  if (s.rope_local_theta != d.rope_local_theta) {
    return InvalidArgument("model.rope_local_theta=" + std::to_string(s.rope_local_theta) + " needs model.family=gemma3");
  }
  if (s.query_pre_attn_scalar != d.query_pre_attn_scalar) {
    return InvalidArgument("model.query_pre_attn_scalar=" + std::to_string(s.query_pre_attn_scalar) +
                           " needs model.family=gemma3");
  }
  return Status::Ok();
}

// The shared checks of the attention variant fields (Llama, Gemma 3).
inline Status ValidateAttentionVariant(const ModelSpec& s) {
  if (s.sliding_window < 0) return InvalidArgument(Field("sliding_window", s.sliding_window) + " must be >= 0 (0: none)");
  if (s.max_window_layers < 0) return InvalidArgument(Field("max_window_layers", s.max_window_layers) + " must be >= 0");
  if (s.sliding_window_pattern < 0) {
    return InvalidArgument(Field("sliding_window_pattern", s.sliding_window_pattern) + " must be >= 0 (0: every block)");
  }
  return Status::Ok();
}

// Reads config[key] into *out when present (`required`: absent is an error); the error
// names the file and the key.
template <typename T>
Status HfField(const nlohmann::json& config, const std::string& origin, const char* key, T* out,
               bool required) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) {
    return required ? InvalidArgument(origin + ": config.json lacks \"" + std::string(key) + "\"") : Status::Ok();
  }
  const std::string what = origin + ": config.json \"" + std::string(key) + "\"";
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // A float (4096.0, 1e300) or an integer outside T is refused (common/json_util.h).
    if (!it->is_number_integer()) return InvalidArgument(what + "=" + JsonSnippet(*it) + ": not an integer");
    L2L_ASSIGN_OR_RETURN(*out, JsonInt<T>(*it, what));
  } else {
    try {
      if constexpr (std::is_same_v<T, bool>) {
        if (!it->is_boolean()) throw std::runtime_error("not a boolean");
      } else if constexpr (std::is_floating_point_v<T>) {
        if (!it->is_number()) throw std::runtime_error("not a number");
      }
      *out = it->get<T>();
    } catch (const std::exception& e) {
      return InvalidArgument(what + "=" + JsonSnippet(*it) + ": " + e.what());
    }
  }
  return Status::Ok();
}

}  // namespace l2l::models
