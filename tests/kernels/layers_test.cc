// The GPT-2 layers (kernels/layers/layers.h) on the CPU backend against a naive
// double-precision model written here: forward outputs compared directly, and every
// gradient (a sample of each parameter tensor and of the inputs) compared with central
// finite differences of the double-precision forward. Tiny model: C=16, NH=2, F=64,
// V=32, T=8 (seq_len 10), B=2. Also checks the gradient contract: parameter gradients
// accumulate, input gradients are overwritten.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"
#include "tests/kernels/kernel_reference.h"
#include "tests/kernels/kernel_test_util.h"

namespace l2l::layers {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;
using namespace kernels::testing;  // NOLINT

constexpr int64_t kB = 2, kT = 8;

ModelSpec TinySpec(bool tied) {
  ModelSpec s;
  s.vocab_size = 32;
  s.seq_len = 10;
  s.d_model = 16;
  s.n_layer = 2;
  s.n_head = 2;
  s.d_ff = 64;
  s.tied_embeddings = tied;
  return s;
}

// Random parameters (never zeros): LayerNorm gains near 1, small biases, weights ~U(+-0.3).
std::vector<float> RandomParams(const LayerLayout& layout, std::mt19937& rng) {
  std::vector<float> p(layout.numel);
  for (const ParamInfo& info : layout.params) {
    const bool gain = info.name.find("ln_") != std::string::npos &&
                      info.name.find("weight") != std::string::npos;
    const auto v = gain ? RandomVec(rng, info.numel, 0.6f, 1.4f)
                        : info.shape.size() == 1 ? RandomVec(rng, info.numel, -0.2f, 0.2f)
                                                 : RandomVec(rng, info.numel, -0.3f, 0.3f);
    std::copy(v.begin(), v.end(), p.begin() + info.offset);
  }
  return p;
}

const double* View(const DVec& p, const LayerLayout& layout, const char* name) {
  const ParamInfo* info = layout.Find(name);
  REQUIRE(info != nullptr);
  return p.data() + info->offset;
}

// ---- double-precision reference layers ---------------------------------------------------

DVec EmbeddingRef(const DVec& p, const LayerLayout& L, const std::vector<int32_t>& tokens,
                  int64_t C) {
  const double* wte = View(p, L, "wte.weight");
  const double* wpe = View(p, L, "wpe.weight");
  DVec out(kB * kT * C);
  for (int64_t n = 0; n < kB * kT; ++n)
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = wte[tokens[n] * C + c] + wpe[(n % kT) * C + c];
  return out;
}

DVec BlockRef(const DVec& p, const LayerLayout& L, const DVec& x, const ModelSpec& s) {
  const int64_t C = s.d_model, F = s.d_ff, N = kB * kT;
  const DVec ln1 = LayerNormRef(x.data(), View(p, L, "ln_1.weight"), View(p, L, "ln_1.bias"), N, C);
  const DVec qkv = LinearRef(ln1.data(), View(p, L, "attn.c_attn.weight"),
                             View(p, L, "attn.c_attn.bias"), N, C, 3 * C);
  const DVec a = AttentionRef(qkv.data(), kB, kT, C, s.n_head);
  DVec x1 = LinearRef(a.data(), View(p, L, "attn.c_proj.weight"), View(p, L, "attn.c_proj.bias"),
                      N, C, C);
  for (int64_t i = 0; i < N * C; ++i) x1[i] += x[i];
  const DVec ln2 = LayerNormRef(x1.data(), View(p, L, "ln_2.weight"), View(p, L, "ln_2.bias"), N, C);
  DVec h = LinearRef(ln2.data(), View(p, L, "mlp.c_fc.weight"), View(p, L, "mlp.c_fc.bias"), N, C, F);
  for (double& v : h) v = GeluRef(v);
  DVec out = LinearRef(h.data(), View(p, L, "mlp.c_proj.weight"), View(p, L, "mlp.c_proj.bias"),
                       N, F, C);
  for (int64_t i = 0; i < N * C; ++i) out[i] += x1[i];
  return out;
}

// Mean cross-entropy of ln_f(x) @ W^T; W (V,C). Optionally the softmax probabilities.
double HeadLossRef(const DVec& p, const LayerLayout& L, const double* W, const DVec& x,
                   const std::vector<int32_t>& targets, const ModelSpec& s, DVec* probs = nullptr) {
  const int64_t C = s.d_model, V = s.vocab_size, N = kB * kT;
  const DVec lnf = LayerNormRef(x.data(), View(p, L, "ln_f.weight"), View(p, L, "ln_f.bias"), N, C);
  DVec logits(N * V);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) {
      double acc = 0.0;
      for (int64_t c = 0; c < C; ++c) acc += lnf[n * C + c] * W[v * C + c];
      logits[n * V + v] = acc;
    }
  double sum = 0.0;
  for (double l : CrossEntropyRef(logits.data(), targets.data(), N, V, probs)) sum += l;
  return sum / double(N);
}

// Sampled gradient check: for up to `per_tensor` elements of every tensor in `layout`
// (or of the whole vector when layout is null) compare got[i] with the finite difference
// of f at x[i].
void CheckGrad(const std::function<double(const DVec&)>& f, const DVec& x,
               const std::vector<float>& got, const LayerLayout* layout, size_t per_tensor,
               double atol, double rtol, const std::string& what) {
  std::vector<std::pair<std::string, std::vector<size_t>>> groups;
  if (layout == nullptr) {
    groups.push_back({what, SampleIndices(x.size(), per_tensor)});
  } else {
    for (const ParamInfo& info : layout->params) {
      std::vector<size_t> idx = SampleIndices(info.numel, per_tensor, uint32_t(info.offset));
      for (size_t& i : idx) i += info.offset;
      groups.push_back({what + " " + info.name, idx});
    }
  }
  for (const auto& [name, idx] : groups) {
    std::vector<float> g;
    DVec fd;
    for (size_t i : idx) {
      g.push_back(got[i]);
      fd.push_back(FiniteDiff(f, x, i));
    }
    ExpectClose(g, fd, atol, rtol, name);
  }
}

struct Fixture {
  std::unique_ptr<Backend> be = kernels::CreateCpuBackend(2);
  ModelSpec spec;
  std::vector<LayerLayout> layouts;
  LayerWorkspace ws;

  explicit Fixture(bool tied) : spec(TinySpec(tied)), layouts(BuildLayout(spec)) {
    auto w = LayerWorkspace::Create(be.get(), spec, kB, kT);
    REQUIRE(w.ok());
    ws = std::move(w).value();
  }
  DeviceBuffer Zeros(size_t n) {
    auto b = DeviceBuffer::Create(be.get(), n * sizeof(float));
    REQUIRE(b.ok());
    be->Zero(b->data(), n * sizeof(float));
    return std::move(b).value();
  }
};

// ---- tests ---------------------------------------------------------------------------------

TEST_CASE("LayerWorkspace allocates every buffer and rejects T beyond seq_len", "[layers]") {
  auto be = kernels::CreateCpuBackend(1);
  const ModelSpec spec = TinySpec(true);
  auto ws = LayerWorkspace::Create(be.get(), spec, kB, kT);
  REQUIRE(ws.ok());
  const size_t N = kB * kT, C = 16, F = 64, V = 32, NH = 2;
  CHECK(ws->logits.bytes() == N * V * sizeof(float));
  // The CPU backend's causal attention stashes one log-sum-exp per (b, head, row) and
  // needs no scratch; a backend that keeps the probabilities gets (B,NH,T,T).
  CHECK(ws->att.bytes() == kB * NH * kT * sizeof(float));
  CHECK(ws->att_scratch.bytes() <= sizeof(float) * 16);
  CHECK(ws->g0.bytes() == N * std::max(3 * C, F) * sizeof(float));
  CHECK(ws->bytes() >= (N * (5 * C + 3 * C + 2 * F + V)) * sizeof(float));
  auto bad = LayerWorkspace::Create(be.get(), spec, kB, spec.seq_len + 1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("seq_len") != std::string::npos);
}

TEST_CASE("Embedding layer matches the reference and its gradient accumulates",
          "[layers][embedding]") {
  Fixture fx(true);
  const LayerLayout& L = fx.layouts[0];
  const int64_t C = fx.spec.d_model, N = kB * kT;
  std::mt19937 rng(11);
  const auto params = RandomParams(L, rng);
  const auto tokens = RandomTokens(rng, N, int32_t(fx.spec.vocab_size));
  const auto R = RandomVec(rng, N * C);
  auto dP = Upload(*fx.be, params), dTok = Upload(*fx.be, tokens), dR = Upload(*fx.be, R);
  auto dOut = fx.Zeros(N * C), dGrad = fx.Zeros(L.numel);
  EmbeddingForward(*fx.be, fx.spec, L, dP.f32(), dTok.i32(), dOut.f32(), kB, kT);
  const DVec pd = ToDouble(params), Rd = ToDouble(R);
  ExpectClose(Download(*fx.be, dOut, N * C), EmbeddingRef(pd, L, tokens, C), 0.0, 1e-7,
              "embedding out");

  EmbeddingBackward(*fx.be, fx.spec, L, dTok.i32(), dR.f32(), dGrad.f32(), kB, kT);
  const auto g1 = Download(*fx.be, dGrad, L.numel);
  CheckGrad([&](const DVec& p) { return Dot(EmbeddingRef(p, L, tokens, C), Rd); }, pd, g1, &L, 40,
            1e-5, 1e-4, "embedding grad");
  EmbeddingBackward(*fx.be, fx.spec, L, dTok.i32(), dR.f32(), dGrad.f32(), kB, kT);
  const auto g2 = Download(*fx.be, dGrad, L.numel);
  // Twice the first gradient, up to fp32 rounding of the repeated-token sums.
  std::vector<double> twice(g1.begin(), g1.end());
  for (double& v : twice) v *= 2.0;
  ExpectClose(g2, twice, 1e-7, 1e-6, "embedding grad after two backwards");
}

TEST_CASE("Block forward matches the reference and its backward the finite differences",
          "[layers][block]") {
  Fixture fx(true);
  const LayerLayout& L = fx.layouts[1];
  const int64_t C = fx.spec.d_model, N = kB * kT;
  std::mt19937 rng(12);
  const auto params = RandomParams(L, rng);
  const auto x = RandomVec(rng, N * C, -1.5f, 1.5f), R = RandomVec(rng, N * C);
  auto dP = Upload(*fx.be, params), dX = Upload(*fx.be, x), dR = Upload(*fx.be, R);
  auto dOut = fx.Zeros(N * C), dGrad = fx.Zeros(L.numel);
  BlockForward(*fx.be, fx.spec, L, dP.f32(), dX.f32(), dOut.f32(), kB, kT, fx.ws);
  const DVec pd = ToDouble(params), xd = ToDouble(x), Rd = ToDouble(R);
  ExpectClose(Download(*fx.be, dOut, N * C), BlockRef(pd, L, xd, fx.spec), 1e-5, 1e-4, "block out");

  // din starts as NaN garbage: it must be overwritten, not accumulated into.
  std::vector<float> nan(N * C, std::numeric_limits<float>::quiet_NaN());
  auto dIn = Upload(*fx.be, nan);
  BlockBackward(*fx.be, fx.spec, L, dP.f32(), dX.f32(), dR.f32(), dIn.f32(), dGrad.f32(), kB, kT,
                fx.ws);
  const auto gp = Download(*fx.be, dGrad, L.numel), gx = Download(*fx.be, dIn, N * C);
  CheckGrad([&](const DVec& p) { return Dot(BlockRef(p, L, xd, fx.spec), Rd); }, pd, gp, &L, 16,
            2e-4, 2e-3, "block dparams");
  CheckGrad([&](const DVec& v) { return Dot(BlockRef(pd, L, v, fx.spec), Rd); }, xd, gx, nullptr,
            120, 2e-4, 2e-3, "block din");

  SECTION("a second backward doubles dparams and rewrites din") {
    BlockBackward(*fx.be, fx.spec, L, dP.f32(), dX.f32(), dR.f32(), dIn.f32(), dGrad.f32(), kB,
                  kT, fx.ws);
    const auto gp2 = Download(*fx.be, dGrad, L.numel);
    std::vector<double> twice(gp.begin(), gp.end());
    for (double& v : twice) v *= 2.0;
    ExpectClose(gp2, twice, 1e-7, 1e-6, "block dparams after two backwards");
    CHECK(Download(*fx.be, dIn, N * C) == gx);
  }
}

TEST_CASE("Head loss, probabilities and gradients match the reference (tied and untied)",
          "[layers][head]") {
  const bool tied = GENERATE(true, false);
  INFO("tied=" << tied);
  Fixture fx(tied);
  const LayerLayout& E = fx.layouts[0];
  const LayerLayout& L = fx.layouts.back();
  const int64_t C = fx.spec.d_model, V = fx.spec.vocab_size, N = kB * kT;
  std::mt19937 rng(tied ? 13 : 14);
  const auto params = RandomParams(L, rng), emb = RandomParams(E, rng);
  const auto x = RandomVec(rng, N * C, -1.5f, 1.5f);
  const auto targets = RandomTokens(rng, N, int32_t(V));
  const float loss_scale = 0.5f;
  auto dP = Upload(*fx.be, params), dE = Upload(*fx.be, emb), dX = Upload(*fx.be, x),
       dT = Upload(*fx.be, targets);
  auto dGrad = fx.Zeros(L.numel), dProbs = fx.Zeros(N * V);
  const float* wte = dE.f32() + E.Find("wte.weight")->offset;
  // dwte canary: random; tied heads add to it, untied heads must leave it alone.
  const auto dwte0 = RandomVec(rng, V * C);
  auto dWte = Upload(*fx.be, dwte0);
  std::vector<float> nan(N * C, std::numeric_limits<float>::quiet_NaN());
  auto dIn = Upload(*fx.be, nan);

  const DVec pd = ToDouble(params), xd = ToDouble(x);
  DVec wd = tied ? DVec(emb.begin() + E.Find("wte.weight")->offset,
                        emb.begin() + E.Find("wte.weight")->offset + V * C)
                 : DVec(View(pd, L, "lm_head.weight"), View(pd, L, "lm_head.weight") + V * C);
  DVec probs;
  const double want_loss = HeadLossRef(pd, L, wd.data(), xd, targets, fx.spec, &probs);

  HeadProbs(*fx.be, fx.spec, L, dP.f32(), wte, dX.f32(), dProbs.f32(), kB, kT, fx.ws);
  ExpectClose(Download(*fx.be, dProbs, N * V), probs, 1e-6, 1e-4, "head probs");
  const float loss_only = HeadForwardBackward(*fx.be, fx.spec, L, dP.f32(), wte, dX.f32(), dT.i32(),
                                              loss_scale, nullptr, nullptr, nullptr, kB, kT, fx.ws);
  CHECK(std::abs(loss_only - want_loss) <= 1e-5 * want_loss);
  const float loss = HeadForwardBackward(*fx.be, fx.spec, L, dP.f32(), wte, dX.f32(), dT.i32(),
                                         loss_scale, dIn.f32(), dGrad.f32(), dWte.f32(), kB, kT,
                                         fx.ws);
  CHECK(loss == loss_only);

  // Gradients are of loss_scale * mean loss.
  const auto gp = Download(*fx.be, dGrad, L.numel), gx = Download(*fx.be, dIn, N * C);
  const auto gw = Download(*fx.be, dWte, V * C);
  auto f_params = [&](const DVec& p) {
    const double* W = tied ? wd.data() : View(p, L, "lm_head.weight");
    return loss_scale * HeadLossRef(p, L, W, xd, targets, fx.spec);
  };
  CheckGrad(f_params, pd, gp, &L, 40, 1e-5, 2e-3, "head dparams");
  CheckGrad([&](const DVec& v) { return loss_scale * HeadLossRef(pd, L, wd.data(), v, targets, fx.spec); },
            xd, gx, nullptr, 120, 1e-5, 2e-3, "head din");
  if (tied) {
    std::vector<float> dw(V * C);
    for (size_t i = 0; i < dw.size(); ++i) dw[i] = gw[i] - dwte0[i];  // the added part
    CheckGrad([&](const DVec& w) { return loss_scale * HeadLossRef(pd, L, w.data(), xd, targets, fx.spec); },
              wd, dw, nullptr, 150, 1e-5, 2e-3, "head dwte");
  } else {
    CHECK(gw == dwte0);
  }

  // Second call: dparams (and dwte) accumulate, din is rewritten.
  HeadForwardBackward(*fx.be, fx.spec, L, dP.f32(), wte, dX.f32(), dT.i32(), loss_scale, dIn.f32(),
                      dGrad.f32(), dWte.f32(), kB, kT, fx.ws);
  const auto gp2 = Download(*fx.be, dGrad, L.numel);
  std::vector<double> twice(gp.begin(), gp.end());
  for (double& v : twice) v *= 2.0;
  ExpectClose(gp2, twice, 1e-7, 1e-6, "head dparams after two backwards");
  CHECK(Download(*fx.be, dIn, N * C) == gx);
}

TEST_CASE("Embedding, blocks and a tied head compose into the model's gradient",
          "[layers][model]") {
  // The relay's composition: forward layer by layer, backward in reverse with each
  // layer's din as the previous layer's dout, and wte's gradient summed from the
  // embedding and the tied head. Checked against finite differences of the whole model.
  Fixture fx(true);
  const ModelSpec& s = fx.spec;
  const int64_t C = s.d_model, N = kB * kT;
  std::mt19937 rng(15);
  std::vector<std::vector<float>> params;
  for (const LayerLayout& L : fx.layouts) params.push_back(RandomParams(L, rng));
  const auto tokens = RandomTokens(rng, N, int32_t(s.vocab_size));
  const auto targets = RandomTokens(rng, N, int32_t(s.vocab_size));
  const size_t nl = fx.layouts.size();

  std::vector<DeviceBuffer> dP, dG, acts;
  for (size_t l = 0; l < nl; ++l) {
    dP.push_back(Upload(*fx.be, params[l]));
    dG.push_back(fx.Zeros(fx.layouts[l].numel));
  }
  for (size_t l = 0; l + 1 < nl; ++l) acts.push_back(fx.Zeros(N * C));  // output of layer l
  auto dTok = Upload(*fx.be, tokens), dTgt = Upload(*fx.be, targets);
  auto d0 = fx.Zeros(N * C), d1 = fx.Zeros(N * C);
  const float* wte = dP[0].f32() + fx.layouts[0].Find("wte.weight")->offset;
  float* dwte = dG[0].f32() + fx.layouts[0].Find("wte.weight")->offset;

  EmbeddingForward(*fx.be, s, fx.layouts[0], dP[0].f32(), dTok.i32(), acts[0].f32(), kB, kT);
  for (size_t l = 1; l + 1 < nl; ++l)
    BlockForward(*fx.be, s, fx.layouts[l], dP[l].f32(), acts[l - 1].f32(), acts[l].f32(), kB, kT, fx.ws);
  const float loss = HeadForwardBackward(*fx.be, s, fx.layouts[nl - 1], dP[nl - 1].f32(), wte,
                                         acts[nl - 2].f32(), dTgt.i32(), 1.0f, d0.f32(),
                                         dG[nl - 1].f32(), dwte, kB, kT, fx.ws);
  for (size_t l = nl - 2; l >= 1; --l) {
    BlockBackward(*fx.be, s, fx.layouts[l], dP[l].f32(), acts[l - 1].f32(), d0.f32(), d1.f32(),
                  dG[l].f32(), kB, kT, fx.ws);
    std::swap(d0, d1);
  }
  EmbeddingBackward(*fx.be, s, fx.layouts[0], dTok.i32(), d0.f32(), dG[0].f32(), kB, kT);

  std::vector<DVec> pd;
  for (const auto& p : params) pd.push_back(ToDouble(p));
  auto model_loss = [&](const std::vector<DVec>& p) {
    DVec h = EmbeddingRef(p[0], fx.layouts[0], tokens, C);
    for (size_t l = 1; l + 1 < nl; ++l) h = BlockRef(p[l], fx.layouts[l], h, s);
    return HeadLossRef(p[nl - 1], fx.layouts[nl - 1], View(p[0], fx.layouts[0], "wte.weight"), h,
                       targets, s);
  };
  CHECK(std::abs(loss - model_loss(pd)) <= 1e-5 * loss);
  for (size_t l = 0; l < nl; ++l) {
    auto f = [&](const DVec& v) {
      std::vector<DVec> p = pd;
      p[l] = v;
      return model_loss(p);
    };
    CheckGrad(f, pd[l], Download(*fx.be, dG[l], fx.layouts[l].numel), &fx.layouts[l], 6, 1e-5,
              3e-3, "model layer " + std::to_string(l));
  }
}

}  // namespace
}  // namespace l2l::layers
