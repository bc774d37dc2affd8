// ModelSpec validation, parameter counting, per-layer layouts with Hugging Face GPT-2
// tensor names, and deterministic GPT-2 initialisation. See common/model_spec.h.
//
// Initialisation uses a counter-based generator (splitmix64 of (seed, layer, element))
// and Box-Muller, never std::normal_distribution (whose output is implementation
// defined), so every process and every platform produces the same bytes for a layer.
//
// Thread-safety: pure functions.
#include "common/model_spec.h"

#include <cmath>
#include <limits>
#include <sstream>

namespace l2l {
namespace {

Status Bad(const std::string& msg) { return InvalidArgument(msg); }

std::string Field(const char* name, int64_t v) {
  std::ostringstream os;
  os << "model." << name << "=" << v;
  return os.str();
}

// Appends one named tensor to the layout.
void Add(LayerLayout* layout, std::string name, std::vector<int64_t> shape, bool decay) {
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

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in (0, 1], from the top 53 bits.
double Uniform01(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

// Fills out[0..n) with N(0, std) drawn from stream `key`; element i depends only on
// (key, i), so the result does not depend on how the buffer is split or ordered.
void FillNormal(uint64_t key, float std, float* out, size_t n) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (size_t i = 0; i < n; i += 2) {
    const uint64_t pair = i / 2;
    const double u1 = Uniform01(SplitMix64(key ^ SplitMix64(2 * pair)));
    const double u2 = Uniform01(SplitMix64(key ^ SplitMix64(2 * pair + 1)));
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * r * std::cos(kTwoPi * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(std * r * std::sin(kTwoPi * u2));
  }
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Status ModelSpec::Validate() const {
  if (vocab_size <= 0) return Bad(Field("vocab_size", vocab_size) + " must be positive");
  if (vocab_size > (int64_t{1} << 31)) return Bad(Field("vocab_size", vocab_size) + " must be < 2^31");
  if (seq_len <= 0) return Bad(Field("seq_len", seq_len) + " must be positive");
  if (d_model <= 0) return Bad(Field("d_model", d_model) + " must be positive");
  if (n_layer <= 0) return Bad(Field("n_layer", n_layer) + " must be positive");
  if (n_head <= 0) return Bad(Field("n_head", n_head) + " must be positive");
  if (d_ff <= 0) return Bad(Field("d_ff", d_ff) + " must be positive");
  if (d_model % n_head != 0) {
    return Bad(Field("n_head", n_head) + " does not divide " + Field("d_model", d_model));
  }
  // Every per-layer flat buffer must be addressable; keep total well inside int64.
  const double total = static_cast<double>(vocab_size) * d_model * 2 + static_cast<double>(seq_len) * d_model +
                       static_cast<double>(n_layer) * (12.0 * d_model * d_model + 2.0 * d_model * d_ff);
  if (total > 1e15) {
    return Bad("model is too large (" + std::to_string(total) + " parameters); check model.d_model / n_layer");
  }
  return Status::Ok();
}

int64_t ModelSpec::NumParams() const {
  const int64_t C = d_model, F = d_ff;
  const int64_t embedding = vocab_size * C + seq_len * C;
  const int64_t block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * F + F) + (F * C + C);
  const int64_t head = 2 * C + (tied_embeddings ? 0 : vocab_size * C);
  return embedding + n_layer * block + head;
}

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kEmbedding:
      return "embedding";
    case LayerKind::kBlock:
      return "block";
    case LayerKind::kHead:
      return "head";
  }
  return "unknown";
}

const ParamInfo* LayerLayout::Find(const std::string& suffix) const {
  for (const ParamInfo& p : params) {
    if (p.name == suffix) return &p;
  }
  // Block tensors also answer to the name after their "h.N." prefix
  // ("attn.c_proj.weight"; a bare "c_proj.weight" is ambiguous and matches nothing).
  for (const ParamInfo& p : params) {
    if (p.name.rfind("h.", 0) != 0) continue;
    const size_t dot = p.name.find('.', 2);
    if (dot == std::string::npos) continue;
    if (p.name.compare(dot + 1, std::string::npos, suffix) == 0) return &p;
  }
  return nullptr;
}

std::vector<LayerLayout> BuildLayout(const ModelSpec& spec) {
  const int64_t V = spec.vocab_size, T = spec.seq_len, C = spec.d_model, F = spec.d_ff;
  std::vector<LayerLayout> layers;
  layers.reserve(static_cast<size_t>(spec.NumLayers()));

  LayerLayout emb;
  emb.kind = LayerKind::kEmbedding;
  emb.index = 0;
  Add(&emb, "wte.weight", {V, C}, true);
  Add(&emb, "wpe.weight", {T, C}, true);
  layers.push_back(std::move(emb));

  for (int64_t i = 0; i < spec.n_layer; ++i) {
    LayerLayout b;
    b.kind = LayerKind::kBlock;
    b.index = i + 1;
    b.block = i;
    const std::string h = "h." + std::to_string(i) + ".";
    Add(&b, h + "ln_1.weight", {C}, false);
    Add(&b, h + "ln_1.bias", {C}, false);
    Add(&b, h + "attn.c_attn.weight", {C, 3 * C}, true);
    Add(&b, h + "attn.c_attn.bias", {3 * C}, false);
    Add(&b, h + "attn.c_proj.weight", {C, C}, true);
    Add(&b, h + "attn.c_proj.bias", {C}, false);
    Add(&b, h + "ln_2.weight", {C}, false);
    Add(&b, h + "ln_2.bias", {C}, false);
    Add(&b, h + "mlp.c_fc.weight", {C, F}, true);
    Add(&b, h + "mlp.c_fc.bias", {F}, false);
    Add(&b, h + "mlp.c_proj.weight", {F, C}, true);
    Add(&b, h + "mlp.c_proj.bias", {C}, false);
    layers.push_back(std::move(b));
  }

  LayerLayout head;
  head.kind = LayerKind::kHead;
  head.index = spec.n_layer + 1;
  Add(&head, "ln_f.weight", {C}, false);
  Add(&head, "ln_f.bias", {C}, false);
  if (!spec.tied_embeddings) Add(&head, "lm_head.weight", {V, C}, true);
  layers.push_back(std::move(head));
  return layers;
}

void InitLayerParams(const ModelSpec& spec, const LayerLayout& layout, uint64_t seed, float* out) {
  const float kStd = 0.02f;
  const float proj_std = kStd / static_cast<float>(std::sqrt(2.0 * static_cast<double>(spec.n_layer)));
  const uint64_t layer_key = SplitMix64(SplitMix64(seed) ^ (0xA5A5A5A5ull + static_cast<uint64_t>(layout.index)));
  for (size_t k = 0; k < layout.params.size(); ++k) {
    const ParamInfo& p = layout.params[k];
    float* dst = out + p.offset;
    const bool is_ln_weight = EndsWith(p.name, "ln_1.weight") || EndsWith(p.name, "ln_2.weight") ||
                              p.name == "ln_f.weight";
    if (is_ln_weight) {
      for (size_t i = 0; i < p.numel; ++i) dst[i] = 1.0f;
    } else if (p.shape.size() == 1) {  // biases
      for (size_t i = 0; i < p.numel; ++i) dst[i] = 0.0f;
    } else {
      const bool residual_proj = EndsWith(p.name, "c_proj.weight");
      const uint64_t key = SplitMix64(layer_key + 0x1000193ull * (k + 1));
      FillNormal(key, residual_proj ? proj_std : kStd, dst, p.numel);
    }
  }
}

}  // namespace l2l
