// The mixture-of-experts MLP (Mixtral's sparse MoE block). See kernels/layers/moe.h.
#include "kernels/layers/moe.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"
#include "kernels/layers/registry.h"

namespace l2l::layers {
namespace {

using kernels::Backend;

// The host side of one block's routing for N rows.
struct Routing {
  std::vector<float> probs;     // (N, E) softmax of the router logits, fp32
  std::vector<int32_t> sel;     // (N, k) chosen experts, largest probability first
  std::vector<float> weight;    // (N, k) their (renormalised) weights
  std::vector<int64_t> start;   // (E+1) expert e's rows are [start[e], start[e+1]) of idx
  std::vector<int32_t> idx;     // (N*k) token rows, grouped by expert, torch.where order
  std::vector<float> w;         // (N*k) the weight of each idx entry
  std::vector<int32_t> slot;    // (N*k) the top-k slot of each idx entry
};

// Softmax, top-k and renormalisation of logits (N, E), as MixtralSparseMoeBlock.forward:
// F.softmax(dtype=float), torch.topk, routing_weights /= sum.
Routing Route(const ModelSpec& spec, const std::vector<float>& logits, int64_t N) {
  const int64_t E = spec.num_experts, k = spec.experts_per_token;
  Routing r;
  r.probs.resize(static_cast<size_t>(N * E));
  r.sel.resize(static_cast<size_t>(N * k));
  r.weight.resize(static_cast<size_t>(N * k));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits.data() + n * E;
    float* p = r.probs.data() + n * E;
    float mx = x[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, x[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      p[e] = std::exp(x[e] - mx);
      sum += p[e];
    }
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float ksum = 0.0f;
    for (int64_t j = 0; j < k; ++j) ksum += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      r.sel[n * k + j] = order[j];
      r.weight[n * k + j] = spec.norm_topk_prob ? p[order[j]] / ksum : p[order[j]];
    }
  }
  // Per expert: slot-major, then token (torch.where over expert_mask[e] of shape (k, N)).
  r.start.assign(static_cast<size_t>(E + 1), 0);
  for (int32_t s : r.sel) ++r.start[s + 1];
  for (int64_t e = 0; e < E; ++e) r.start[e + 1] += r.start[e];
  std::vector<int64_t> fill(r.start.begin(), r.start.end() - 1);
  r.idx.resize(static_cast<size_t>(N * k));
  r.w.resize(static_cast<size_t>(N * k));
  r.slot.resize(static_cast<size_t>(N * k));
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t n = 0; n < N; ++n) {
      const int32_t e = r.sel[n * k + j];
      const int64_t at = fill[e]++;
      r.idx[at] = static_cast<int32_t>(n);
      r.w[at] = r.weight[n * k + j];
      r.slot[at] = static_cast<int32_t>(j);
    }
  }
  return r;
}

// Router logits of x on the backend, then the routing on the host; uploads idx and w.
Routing RouteOnHost(Backend& be, const ModelSpec& spec, const MoeWeights& w, const float* x, int64_t N,
                    LayerWorkspace& ws) {
  const int64_t E = spec.num_experts, C = spec.d_model;
  be.Gemm(false, true, N, E, C, 1.0f, x, C, w.router, C, 0.0f, ws.moe_router.f32(), E);
  std::vector<float> logits(static_cast<size_t>(N * E));
  be.CopyToHost(logits.data(), ws.moe_router.f32(), logits.size() * sizeof(float));
  be.Synchronize();
  Routing r = Route(spec, logits, N);
  be.CopyToDevice(ws.moe_idx.data(), r.idx.data(), r.idx.size() * sizeof(int32_t));
  be.CopyToDevice(ws.moe_w.data(), r.w.data(), r.w.size() * sizeof(float));
  return r;
}

// Expert e's forward for its n rows (already gathered into ws.moe_x): h = swiglu(x W13^T)
// into ws.fch_gelu (pre-activation in ws.fch), y = h W2^T into ws.moe_y.
void ExpertForward(Backend& be, const ModelSpec& spec, const MoeWeights& w, int64_t e, int64_t n,
                   LayerWorkspace& ws) {
  const int64_t C = spec.d_model, F = spec.d_ff;
  be.Gemm(false, true, n, 2 * F, C, 1.0f, ws.moe_x.f32(), C, w.gate_up[e], C, 0.0f, ws.fch.f32(), 2 * F);
  be.SwiGLUForward(ws.fch_gelu.f32(), ws.fch.f32(), n, F);
  be.Gemm(false, true, n, C, F, 1.0f, ws.fch_gelu.f32(), F, w.down[e], F, 0.0f, ws.moe_y.f32(), C);
}

}  // namespace

void MoeStats::Reset(const ModelSpec& spec) {
  counts.assign(static_cast<size_t>(spec.num_experts), 0);
  prob_sums.assign(static_cast<size_t>(spec.num_experts), 0.0);
  rows = 0;
  touched.assign(static_cast<size_t>(spec.n_layer * spec.num_experts), 0);
  aux_grad_scale = 0.0f;
}

double MoeAuxLoss(const ModelSpec& spec, const MoeStats& s) {
  if (s.rows == 0 || s.counts.empty()) return 0.0;
  const double R = double(s.rows);
  double sum = 0.0;
  for (size_t e = 0; e < s.counts.size(); ++e) sum += (double(s.counts[e]) / R) * (s.prob_sums[e] / R);
  return double(spec.num_experts) * sum;
}

Status AllocMoeWorkspace(Backend* be, const ModelSpec& spec, int64_t N, LayerWorkspace* ws) {
  const size_t n = static_cast<size_t>(N), f = sizeof(float);
  const size_t E = static_cast<size_t>(spec.num_experts), k = static_cast<size_t>(spec.experts_per_token);
  const size_t C = static_cast<size_t>(spec.d_model);
  L2L_RETURN_IF_ERROR(AllocInto(be, &ws->moe_router, n * E * f));
  L2L_RETURN_IF_ERROR(AllocInto(be, &ws->moe_idx, n * k * sizeof(int32_t)));
  L2L_RETURN_IF_ERROR(AllocInto(be, &ws->moe_w, n * k * f));
  L2L_RETURN_IF_ERROR(AllocInto(be, &ws->moe_dw, n * k * f));
  for (kernels::DeviceBuffer* b : {&ws->moe_x, &ws->moe_y, &ws->moe_g}) L2L_RETURN_IF_ERROR(AllocInto(be, b, n * C * f));
  return Status::Ok();
}

void MoeForward(Backend& be, const ModelSpec& spec, const MoeWeights& w, const float* x, float* y, int64_t N,
                LayerWorkspace& ws, MoeStats* stats, int64_t block) {
  const int64_t E = spec.num_experts, C = spec.d_model;
  const Routing r = RouteOnHost(be, spec, w, x, N, ws);
  be.Zero(y, static_cast<size_t>(N * C) * sizeof(float));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = r.start[e + 1] - r.start[e];
    if (n == 0) continue;  // Hugging Face runs only the experts that got tokens
    const int32_t* idx = ws.moe_idx.i32() + r.start[e];
    be.GatherRows(ws.moe_x.f32(), x, idx, nullptr, n, C);
    ExpertForward(be, spec, w, e, n, ws);
    be.ScatterAddRows(y, ws.moe_y.f32(), idx, ws.moe_w.f32() + r.start[e], n, C);
  }
  if (stats != nullptr) {
    L2L_CHECK(stats->counts.size() == size_t(E) && block >= 0 && block < spec.n_layer)
        << "MoeForward: MoeStats not Reset for this spec (block " << block << ")";
    for (int64_t e = 0; e < E; ++e) {
      stats->counts[e] += r.start[e + 1] - r.start[e];
      if (r.start[e + 1] > r.start[e]) stats->touched[block * E + e] = 1;
    }
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t e = 0; e < E; ++e) stats->prob_sums[e] += r.probs[n * E + e];
    }
    stats->rows += N;
  }
}

void MoeBackward(Backend& be, const ModelSpec& spec, const MoeWeights& w, const MoeWeights& dw, const float* x,
                 const float* dy, float* dx, int64_t N, LayerWorkspace& ws, const MoeStats* stats) {
  const int64_t E = spec.num_experts, k = spec.experts_per_token, C = spec.d_model, F = spec.d_ff;
  const Routing r = RouteOnHost(be, spec, w, x, N, ws);
  float* dh = ws.g0.f32();
  float* dfch = ws.g1.f32();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = r.start[e + 1] - r.start[e];
    if (n == 0) continue;
    const int32_t* idx = ws.moe_idx.i32() + r.start[e];
    be.GatherRows(ws.moe_x.f32(), x, idx, nullptr, n, C);
    ExpertForward(be, spec, w, e, n, ws);
    // d(weight) of each row: dy[token] . expert output.
    be.GatherRows(ws.moe_g.f32(), dy, idx, nullptr, n, C);
    be.RowDot(ws.moe_dw.f32() + r.start[e], ws.moe_g.f32(), ws.moe_y.f32(), n, C);
    // d(expert output) = weight * dy[token] (into moe_y: the output is no longer needed).
    be.GatherRows(ws.moe_y.f32(), dy, idx, ws.moe_w.f32() + r.start[e], n, C);
    be.Gemm(true, false, C, F, n, 1.0f, ws.moe_y.f32(), C, ws.fch_gelu.f32(), F, 1.0f, dw.down[e], F);  // dW2 +=
    be.Gemm(false, false, n, F, C, 1.0f, ws.moe_y.f32(), C, w.down[e], F, 0.0f, dh, F);
    be.Zero(dfch, static_cast<size_t>(n * 2 * F) * sizeof(float));
    be.SwiGLUBackward(dfch, dh, ws.fch.f32(), n, F);
    be.Gemm(true, false, 2 * F, C, n, 1.0f, dfch, 2 * F, ws.moe_x.f32(), C, 1.0f, dw.gate_up[e], C);  // dW13 +=
    be.Gemm(false, false, n, C, 2 * F, 1.0f, dfch, 2 * F, w.gate_up[e], C, 0.0f, ws.moe_g.f32(), C);
    be.ScatterAddRows(dx, ws.moe_g.f32(), idx, nullptr, n, C);
  }
  // The router: d(weights) -> d(probabilities) -> d(logits), on the host.
  std::vector<float> dwt(static_cast<size_t>(N * k));
  be.CopyToHost(dwt.data(), ws.moe_dw.f32(), dwt.size() * sizeof(float));
  be.Synchronize();
  std::vector<double> dweight(static_cast<size_t>(N * k));  // (N, k) by token and slot
  for (size_t i = 0; i < r.idx.size(); ++i) dweight[size_t(r.idx[i]) * k + r.slot[i]] = dwt[i];
  std::vector<double> aux(static_cast<size_t>(E), 0.0);
  if (spec.output_router_logits) {
    L2L_CHECK(stats != nullptr && stats->rows > 0 && stats->counts.size() == size_t(E))
        << "MoeBackward: the aux loss needs the micro-batch's MoeStats from the forward (SequenceInputs::moe)";
    const double R = double(stats->rows);
    for (int64_t e = 0; e < E; ++e) aux[e] = double(stats->aux_grad_scale) * double(E) * double(stats->counts[e]) / (R * R);
  }
  std::vector<float> dlogits(static_cast<size_t>(N * E));
  std::vector<double> dp(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const float* p = r.probs.data() + n * E;
    for (int64_t e = 0; e < E; ++e) dp[e] = aux[e];
    const double* dwn = dweight.data() + n * k;
    if (spec.norm_topk_prob) {
      double ksum = 0.0, dot = 0.0;
      for (int64_t j = 0; j < k; ++j) ksum += p[r.sel[n * k + j]];
      for (int64_t j = 0; j < k; ++j) dot += dwn[j] * double(p[r.sel[n * k + j]]) / ksum;
      for (int64_t j = 0; j < k; ++j) dp[r.sel[n * k + j]] += (dwn[j] - dot) / ksum;
    } else {
      for (int64_t j = 0; j < k; ++j) dp[r.sel[n * k + j]] += dwn[j];
    }
    double pg = 0.0;
    for (int64_t e = 0; e < E; ++e) pg += double(p[e]) * dp[e];
    for (int64_t e = 0; e < E; ++e) dlogits[n * E + e] = static_cast<float>(double(p[e]) * (dp[e] - pg));
  }
  be.CopyToDevice(ws.moe_router.f32(), dlogits.data(), dlogits.size() * sizeof(float));
  be.Gemm(true, false, E, C, N, 1.0f, ws.moe_router.f32(), E, x, C, 1.0f, dw.router, C);  // dW_router (E,C) +=
  be.Gemm(false, false, N, C, E, 1.0f, ws.moe_router.f32(), E, w.router, C, 1.0f, dx, C);  // dx +=
}

}  // namespace l2l::layers
