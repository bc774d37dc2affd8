// The Llama family's layers (token embedding, pre-RMSNorm block with rotary embeddings,
// grouped-query attention and a SwiGLU MLP, final RMSNorm before the head) as
// compositions of Backend ops. See kernels/layers/layers.h for the contracts and
// common/models/llama.cc for the layout. Weights keep nn.Linear's (out, in) layout, so a
// linear layer is y (N,out) = x (N,in) @ W^T; q|k|v and gate|up are adjacent in the flat
// buffer and run as one product each.
//
// Workspace regions (N = B*T, W = (NH + 2*NKV)*hs, hs = head_dim(): C/NH unless head_size
// is set, A = NH*hs the attention output width):
//   ln1 (N,C) rms_1(x)        ln1_rstd (N)       qkv (N,W) rotated q|k|v; with qk_norm
//     followed by q_raw (N*NH, hs), k_raw (N*NKV, hs) (the heads before their norms) and
//     q_rstd (N*NH), k_rstd (N*NKV), so that they are kept with qkv
//   (sliding blocks: Backend::AttentionForwardGqaWindow with spec.WindowOf(block))
//   att, att_scratch (Backend::CausalAttention[Scratch]Floats)  atty (N,A) attention output
//   resid2 (N,C) x1           ln2 (N,C) rms_2(x1)  ln2_rstd (N)
//   fch (N,2F) gate|up        fch_gelu (N,F) silu(gate)*up
//   logits (N,V), losses (N)  g0..g3 (N, max(W, 2F)) gradient scratch
//   rope_cos, rope_sin (T, hs/2) the rotary tables of positions 0..T-1
// A mixture-of-experts spec (num_experts > 0) replaces the MLP by kernels/layers/moe.h's
// (fch, fch_gelu hold one expert's rows at a time; its moe_* regions beside).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/layers/kv_decode.h"
#include "kernels/layers/moe.h"
#include "kernels/layers/lora.h"
#include "kernels/layers/registry.h"
#include "kernels/layers/rope.h"

namespace l2l::layers {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;

int64_t QkvWidth(const ModelSpec& s) { return (s.n_head + 2 * s.kv_heads()) * s.head_dim(); }

// Floats of ws.qkv: the packed rows, and with qk_norm the raw heads and their rstd.
size_t QkvFloats(const ModelSpec& s, size_t N) {
  const size_t heads = static_cast<size_t>(s.n_head + s.kv_heads());
  return N * QkvWidth(s) + (s.qk_norm ? N * heads * (s.head_dim() + 1) : 0);
}

Status AllocWorkspace(Backend* backend, const ModelSpec& spec, int64_t B, int64_t T, LayerWorkspace* ws) {
  const size_t f = sizeof(float);
  const size_t N = static_cast<size_t>(B * T), C = spec.d_model, F = spec.d_ff;
  const size_t V = spec.vocab_size, t = static_cast<size_t>(T);
  const size_t W = static_cast<size_t>(QkvWidth(spec)), half = static_cast<size_t>(spec.head_dim() / 2);
  const size_t A = static_cast<size_t>(spec.n_head * spec.head_dim());  // = C unless head_size is set
  const size_t g = N * std::max({W, 2 * F, C}) * f;
  // The causal attention's stash and scratch, as this backend needs them.
  const size_t att_floats = backend->CausalAttentionFloats(B, T, spec.n_head, spec.head_dim());
  const size_t scratch_floats = std::max<size_t>(1, backend->CausalAttentionScratchFloats(B, T, spec.n_head, spec.head_dim()));
  struct Want {
    DeviceBuffer* buf;
    size_t bytes;
  };
  const std::vector<Want> wants = {
      {&ws->ln1, N * C * f},     {&ws->ln1_rstd, N * f},        {&ws->qkv, QkvFloats(spec, N) * f},
      {&ws->att, att_floats * f}, {&ws->att_scratch, scratch_floats * f},
      {&ws->atty, N * A * f},    {&ws->resid2, N * C * f},      {&ws->ln2, N * C * f},
      {&ws->ln2_rstd, N * f},    {&ws->fch, N * 2 * F * f},     {&ws->fch_gelu, N * F * f},
      {&ws->logits, static_cast<size_t>(ws->head_rows()) * V * f},  {&ws->losses, N * f},          {&ws->g0, g},
      {&ws->g1, g},              {&ws->g2, g},                  {&ws->g3, g},
      {&ws->rope_cos, t * half * f}, {&ws->rope_sin, t * half * f}};
  for (const Want& w : wants) L2L_RETURN_IF_ERROR(AllocInto(backend, w.buf, w.bytes));
  if (spec.moe()) L2L_RETURN_IF_ERROR(AllocMoeWorkspace(backend, spec, B * T, ws));
  const std::vector<double> inv = RopeInverseFrequencies(spec.head_dim(), spec.rope_theta, spec.rope_scaling);
  std::vector<float> cos(t * half), sin(t * half);
  for (size_t p = 0; p < t; ++p) {
    for (size_t i = 0; i < half; ++i) {
      const double angle = double(p) * inv[i];
      cos[p * half + i] = static_cast<float>(std::cos(angle));
      sin[p * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  backend->CopyToDevice(ws->rope_cos.data(), cos.data(), cos.size() * f);
  backend->CopyToDevice(ws->rope_sin.data(), sin.data(), sin.size() * f);
  backend->Synchronize();
  return Status::Ok();
}

// Views of a block's flat parameter (or gradient) buffer.
struct BlockViews {
  float *ln1, *qkv_w, *qkv_b, *q_norm, *k_norm, *o_w, *ln2, *gate_up_w, *down_w;
  MoeWeights moe;  // num_experts > 0 (gate_up_w, down_w null then)
};

BlockViews Views(const ModelSpec& spec, const LayerLayout& layout, const float* base) {
  float* p = const_cast<float*>(base);
  BlockViews v{p + Off(layout, "input_layernorm.weight"),
               p + Off(layout, "self_attn.q_proj.weight"),  // q|k|v weights adjacent (W,C)
               spec.qkv_bias ? p + Off(layout, "self_attn.q_proj.bias") : nullptr,
               spec.qk_norm ? p + Off(layout, "self_attn.q_norm.weight") : nullptr,
               spec.qk_norm ? p + Off(layout, "self_attn.k_norm.weight") : nullptr,
               p + Off(layout, "self_attn.o_proj.weight"),
               p + Off(layout, "post_attention_layernorm.weight"),
               nullptr,
               nullptr,
               {}};
  if (!spec.moe()) {
    v.gate_up_w = p + Off(layout, "mlp.gate_proj.weight");  // gate|up adjacent (2F,C)
    v.down_w = p + Off(layout, "mlp.down_proj.weight");
    return v;
  }
  const MoeNames n = MoeTensorNames(spec);  // Mixtral's or Qwen3-MoE's
  v.moe.router = p + Off(layout, (std::string(n.prefix) + "gate.weight").c_str());
  // Experts are contiguous (common/models/llama.cc): gate|up (2F,C) adjacent, then down (C,F).
  const size_t first = Off(layout, (std::string(n.prefix) + "experts.0." + n.gate + ".weight").c_str());
  const size_t stride = size_t(3 * spec.d_ff * spec.d_model), down = size_t(2 * spec.d_ff * spec.d_model);
  for (int64_t e = 0; e < spec.num_experts; ++e) {
    v.moe.gate_up.push_back(p + first + size_t(e) * stride);
    v.moe.down.push_back(p + first + size_t(e) * stride + down);
  }
  return v;
}

// Pointers into ws.qkv past the packed rows (qk_norm only; see the header comment).
struct QkRaw {
  float *q, *k, *q_rstd, *k_rstd;
};
QkRaw RawHeads(const ModelSpec& s, LayerWorkspace& ws, int64_t N) {
  const int64_t NH = s.n_head, NKV = s.kv_heads(), hs = s.head_dim();
  float* q = ws.qkv.f32() + N * QkvWidth(s);
  float* k = q + N * NH * hs;
  float* q_rstd = k + N * NKV * hs;
  return QkRaw{q, k, q_rstd, q_rstd + N * NH};
}

// RMSNorm of every q and k head of qkv (N,W) in place (Qwen3), the raw heads and their
// rstd kept in ws.qkv for the backward. ws.g0 is scratch.
void QkNormForward(Backend& be, const ModelSpec& spec, const BlockViews& w, int64_t N, LayerWorkspace& ws) {
  const int64_t NH = spec.n_head, NKV = spec.kv_heads(), hs = spec.head_dim(), W = QkvWidth(spec);
  const float eps = static_cast<float>(spec.rms_norm_eps);
  const QkRaw r = RawHeads(spec, ws, N);
  float* qkv = ws.qkv.f32();
  float* normed = ws.g0.f32();
  be.Copy2D(r.q, NH * hs, qkv, W, N, NH * hs);
  be.Copy2D(r.k, NKV * hs, qkv + NH * hs, W, N, NKV * hs);
  be.RMSNormForward(normed, r.q_rstd, r.q, w.q_norm, N * NH, hs, eps);
  be.Copy2D(qkv, W, normed, NH * hs, N, NH * hs);
  be.RMSNormForward(normed, r.k_rstd, r.k, w.k_norm, N * NKV, hs, eps);
  be.Copy2D(qkv + NH * hs, W, normed, NKV * hs, N, NKV * hs);
}

// dqkv (N,W): the q and k heads' gradients taken back through their norms, in place;
// dparams' q_norm / k_norm +=. ws.g0 and ws.g2 are scratch.
void QkNormBackward(Backend& be, const ModelSpec& spec, const BlockViews& w, const BlockViews& d, float* dqkv,
                    int64_t N, LayerWorkspace& ws) {
  const int64_t NH = spec.n_head, NKV = spec.kv_heads(), hs = spec.head_dim(), W = QkvWidth(spec);
  const QkRaw r = RawHeads(spec, ws, N);
  float* dnormed = ws.g0.f32();
  float* draw = ws.g2.f32();
  struct Part {
    int64_t col, heads;
    const float *raw, *rstd, *weight;
    float* dweight;
  };
  for (const Part& p : {Part{0, NH, r.q, r.q_rstd, w.q_norm, d.q_norm}, Part{NH * hs, NKV, r.k, r.k_rstd, w.k_norm, d.k_norm}}) {
    const int64_t width = p.heads * hs;
    be.Copy2D(dnormed, width, dqkv + p.col, W, N, width);
    be.Zero(draw, static_cast<size_t>(N * width) * sizeof(float));
    be.RMSNormBackward(draw, p.dweight, dnormed, p.raw, p.weight, p.rstd, N * p.heads, hs);
    be.Copy2D(dqkv + p.col, W, draw, width, N, width);
  }
}

// Forward internals of a block up to (and including) fch_gelu, into ws.
// With kv (B = T = 1, KV-cache decoding): the row is rotated for position kv->pos and
// attends over the cache.
// window: the block's sliding window (spec.WindowOf), 0 none.
// With LoRA adapters in `layout`, each targeted linear adds its adapter (kernels/layers/lora.h).
void BlockInternals(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                    const BlockViews& w, const float* in, int64_t B, int64_t T, LayerWorkspace& ws,
                    int64_t window, const KvStep* kv = nullptr) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T, W = QkvWidth(spec);
  const int64_t NH = spec.n_head, NKV = spec.kv_heads(), hs = spec.head_dim(), A = NH * hs;
  const float eps = static_cast<float>(spec.rms_norm_eps);
  be.RMSNormForward(ws.ln1.f32(), ws.ln1_rstd.f32(), in, w.ln1, N, C, eps);
  be.Gemm(false, true, N, W, C, 1.0f, ws.ln1.f32(), C, w.qkv_w, C, 0.0f, ws.qkv.f32(), W);
  if (w.qkv_b != nullptr) be.AddBias(ws.qkv.f32(), w.qkv_b, N, W);
  const int64_t q = NH * hs, kvw = NKV * hs;
  LoraForward(be, layout, params, "self_attn.q_proj.weight", ws.ln1.f32(), C, N, ws.qkv.f32(), W, 0, ws);
  LoraForward(be, layout, params, "self_attn.k_proj.weight", ws.ln1.f32(), C, N, ws.qkv.f32(), W, q, ws);
  LoraForward(be, layout, params, "self_attn.v_proj.weight", ws.ln1.f32(), C, N, ws.qkv.f32(), W, q + kvw, ws);
  if (spec.qk_norm) QkNormForward(be, spec, w, N, ws);
  const int64_t rope_row = kv != nullptr ? kv->pos * (hs / 2) : 0;  // the tables' row for position 0 of qkv
  be.RopeForward(ws.qkv.f32(), ws.rope_cos.f32() + rope_row, ws.rope_sin.f32() + rope_row, B, T, W, NH + NKV, hs);
  if (kv == nullptr && window > 0) {
    be.AttentionForwardGqaWindow(ws.atty.f32(), ws.att.f32(), ws.qkv.f32(), B, T, NH, NKV, hs, window);
  } else if (kv == nullptr) {
    be.AttentionForwardGqa(ws.atty.f32(), ws.att.f32(), ws.qkv.f32(), B, T, NH, NKV, hs);
  } else {
    AttendCached(be, ws.qkv.f32(), NH, NKV, hs, *kv, ws.atty.f32(), window);
  }
  // x1 = x + attn
  be.LinearForward(ws.resid2.f32(), ws.atty.f32(), w.o_w, true, nullptr, N, A, C, nullptr, in);
  LoraForward(be, layout, params, "self_attn.o_proj.weight", ws.atty.f32(), A, N, ws.resid2.f32(), C, 0, ws);
  be.RMSNormForward(ws.ln2.f32(), ws.ln2_rstd.f32(), ws.resid2.f32(), w.ln2, N, C, eps);
  if (spec.moe()) return;  // the MoE MLP runs from ln2 (MoeOut)
  be.Gemm(false, true, N, 2 * F, C, 1.0f, ws.ln2.f32(), C, w.gate_up_w, C, 0.0f, ws.fch.f32(), 2 * F);
  LoraForward(be, layout, params, "mlp.gate_proj.weight", ws.ln2.f32(), C, N, ws.fch.f32(), 2 * F, 0, ws);
  LoraForward(be, layout, params, "mlp.up_proj.weight", ws.ln2.f32(), C, N, ws.fch.f32(), 2 * F, F, ws);
  be.SwiGLUForward(ws.fch_gelu.f32(), ws.fch.f32(), N, F);
}

// The activations a block's GEMMs read again later in the call, each written only by its
// producer (RMSNorm, the attention, SwiGLU): held bf16 copies (registry.h). With experts
// not the MLP activation: ws.fch_gelu is each expert's (moe.cc); ln2, which the router's
// and the experts' gathers only read, is.
HeldBf16Copies HoldCopies(Backend& be, const ModelSpec& spec, LayerWorkspace& ws, int64_t N) {
  const int64_t C = spec.d_model, F = spec.d_ff, A = spec.n_head * spec.head_dim();
  if (spec.moe()) {
    return HeldBf16Copies(be, {{ws.ln1.f32(), N * C}, {ws.atty.f32(), N * A}, {ws.ln2.f32(), N * C}});
  }
  return HeldBf16Copies(be, {{ws.ln1.f32(), N * C}, {ws.atty.f32(), N * A}, {ws.ln2.f32(), N * C},
                             {ws.fch_gelu.f32(), N * F}});
}

void FamilyEmbeddingForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                      const int32_t* tokens, float* out, int64_t B, int64_t T, const SequenceInputs&,
                      LayerWorkspace*) {
  be.TokenEmbeddingForward(out, tokens, params + Off(layout, "embed_tokens.weight"), B * T, spec.d_model);
}

void FamilyEmbeddingBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float*,
                       const int32_t* tokens, const float* dout, float* dparams, int64_t B, int64_t T,
                       const SequenceInputs&, LayerWorkspace*) {
  be.TokenEmbeddingBackward(dparams + Off(layout, "embed_tokens.weight"), dout, tokens, B * T, spec.d_model);
}

// out (N,C) = x1 + moe(ln2) for a mixture-of-experts block (after BlockInternals).
void MoeOut(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const BlockViews& w, float* out,
            int64_t N, LayerWorkspace& ws, MoeStats* stats) {
  MoeForward(be, spec, w.moe, ws.ln2.f32(), ws.g3.f32(), N, ws, stats, layout.block);
  be.Add(out, ws.resid2.f32(), ws.g3.f32(), N * spec.d_model);  // HF: residual + moe output
}

void FamilyBlockForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                  const float* in, float* out, int64_t B, int64_t T, LayerWorkspace& ws, const SequenceInputs& seq) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T;
  const BlockViews w = Views(spec, layout, params);
  // Only the LoRA adapters' GEMMs read a forward activation after other ops ran.
  const HeldBf16Copies held = layout.lora_r > 0 ? HoldCopies(be, spec, ws, N) : HeldBf16Copies(be, {});
  BlockInternals(be, spec, layout, params, w, in, B, T, ws, spec.WindowOf(layout.block));
  if (spec.moe()) {
    MoeOut(be, spec, layout, w, out, N, ws, seq.moe);
    return;
  }
  // out = x1 + down(h); `in` is no longer read, so out may alias it.
  be.LinearForward(out, ws.fch_gelu.f32(), w.down_w, true, nullptr, N, F, C, nullptr, ws.resid2.f32());
  LoraForward(be, layout, params, "mlp.down_proj.weight", ws.fch_gelu.f32(), F, N, out, C, 0, ws);
}

void FamilyBlockDecode(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                       const float* in, float* out, LayerWorkspace& ws, const KvStep& kv) {
  const BlockViews w = Views(spec, layout, params);
  BlockInternals(be, spec, layout, params, w, in, 1, 1, ws, spec.WindowOf(layout.block), &kv);
  if (spec.moe()) {
    MoeOut(be, spec, layout, w, out, 1, ws, nullptr);
    return;
  }
  be.LinearForward(out, ws.fch_gelu.f32(), w.down_w, true, nullptr, 1, spec.d_ff, spec.d_model, nullptr,
                   ws.resid2.f32());
  LoraForward(be, layout, params, "mlp.down_proj.weight", ws.fch_gelu.f32(), spec.d_ff, 1, out, spec.d_model, 0,
              ws);
}

void FamilyBlockBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                   const float* in, const float* dout, float* din, float* dparams, int64_t B, int64_t T,
                   LayerWorkspace& ws, const SequenceInputs& seq, bool recompute) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T, W = QkvWidth(spec);
  const int64_t NH = spec.n_head, NKV = spec.kv_heads(), hs = spec.head_dim(), A = NH * hs;
  const int64_t window = spec.WindowOf(layout.block);
  const BlockViews w = Views(spec, layout, params);
  const BlockViews d = Views(spec, layout, dparams);
  const HeldBf16Copies held = HoldCopies(be, spec, ws, N);  // for the weight-gradient GEMMs
  if (recompute) BlockInternals(be, spec, layout, params, w, in, B, T, ws, window);
  // A LoRA layout freezes the base: no weight gradients for it (its norms' and biases'
  // land in the unused frozen part of dparams), the adapters' instead.
  const bool frozen = BaseFrozen(layout);
  const int64_t q = NH * hs, kvw = NKV * hs;

  float* g0 = ws.g0.f32();
  float* g1 = ws.g1.f32();
  float* g2 = ws.g2.f32();
  float* dres = ws.g3.f32();  // (N,C) gradient of the residual stream
  if (spec.moe()) {
    // MLP: out = x1 + moe(rms_2(x1)); dln2 (N,C) from the experts and the router.
    be.Zero(g2, N * C * sizeof(float));
    MoeBackward(be, spec, w.moe, d.moe, ws.ln2.f32(), dout, g2, N, ws, seq.moe);
  } else {
    // MLP: out = x1 + down(silu(gate(rms_2(x1))) * up(rms_2(x1))).
    if (!frozen) be.Gemm(true, false, C, F, N, 1.0f, dout, C, ws.fch_gelu.f32(), F, 1.0f, d.down_w, F);  // dW_down +=
    be.Gemm(false, false, N, F, C, 1.0f, dout, C, w.down_w, F, 0.0f, g0, F);                // dh (N,F)
    LoraBackward(be, layout, params, dparams, "mlp.down_proj.weight", ws.fch_gelu.f32(), F, dout, C, 0, g0, N, ws);
    be.SwiGLUBackwardInto(g1, g0, ws.fch.f32(), N, F);                                      // dgate|dup (N,2F)
    if (!frozen) be.Gemm(true, false, 2 * F, C, N, 1.0f, g1, 2 * F, ws.ln2.f32(), C, 1.0f, d.gate_up_w, C);  // (2F,C) +=
    be.Gemm(false, false, N, C, 2 * F, 1.0f, g1, 2 * F, w.gate_up_w, C, 0.0f, g2, C);         // dln2 (N,C)
    LoraBackward(be, layout, params, dparams, "mlp.gate_proj.weight", ws.ln2.f32(), C, g1, 2 * F, 0, g2, N, ws);
    LoraBackward(be, layout, params, dparams, "mlp.up_proj.weight", ws.ln2.f32(), C, g1, 2 * F, F, g2, N, ws);
  }
  // dx1 = dout + the gradient through ln2, in one pass.
  be.RMSNormBackwardResidual(dres, d.ln2, dout, g2, ws.resid2.f32(), w.ln2, ws.ln2_rstd.f32(), N, C);
  // Attention: x1 = x + o_proj(gqa(rope(qkv(rms_1(x))))).
  if (!frozen) be.Gemm(true, false, C, A, N, 1.0f, dres, C, ws.atty.f32(), A, 1.0f, d.o_w, A);  // dW_o (C,A) +=
  be.Gemm(false, false, N, A, C, 1.0f, dres, C, w.o_w, A, 0.0f, g0, A);           // datty (N,A)
  LoraBackward(be, layout, params, dparams, "self_attn.o_proj.weight", ws.atty.f32(), A, dres, C, 0, g0, N, ws);
  be.Zero(g1, N * W * sizeof(float));
  if (window > 0) {
    be.AttentionBackwardGqaWindow(g1, ws.att_scratch.f32(), g0, ws.qkv.f32(), ws.att.f32(), B, T, NH, NKV, hs,
                                  window);
  } else {
    be.AttentionBackwardGqa(g1, ws.att_scratch.f32(), g0, ws.qkv.f32(), ws.att.f32(), B, T, NH, NKV, hs);
  }
  // dqkv's copy, written by RoPE's backward, held through the q/k norms' backward (whose
  // Copy2D back into dqkv keeps it fresh) for the qkv layer's two GEMMs and the adapters'
  // (without either, those two GEMMs follow RoPE and read it fresh anyway).
  const HeldBf16Copies held_dqkv(be, spec.qk_norm || layout.lora_r > 0
                                         ? std::vector<HeldBf16Copies::Region>{{g1, N * W}}
                                         : std::vector<HeldBf16Copies::Region>{});
  be.RopeBackward(g1, ws.rope_cos.f32(), ws.rope_sin.f32(), B, T, W, NH + NKV, hs);  // dqkv before rotation
  if (spec.qk_norm) QkNormBackward(be, spec, w, d, g1, N, ws);
  if (!frozen) be.Gemm(true, false, W, C, N, 1.0f, g1, W, ws.ln1.f32(), C, 1.0f, d.qkv_w, C);  // dW_qkv (W,C) +=
  be.Gemm(false, false, N, C, W, 1.0f, g1, W, w.qkv_w, C, 0.0f, g2, C);           // dln1 (N,C)
  // After the GEMMs: they read dqkv's bf16 copy from RopeBackward while it is fresh.
  if (d.qkv_b != nullptr) be.BiasBackward(d.qkv_b, g1, N, W);
  LoraBackward(be, layout, params, dparams, "self_attn.q_proj.weight", ws.ln1.f32(), C, g1, W, 0, g2, N, ws);
  LoraBackward(be, layout, params, dparams, "self_attn.k_proj.weight", ws.ln1.f32(), C, g1, W, q, g2, N, ws);
  LoraBackward(be, layout, params, dparams, "self_attn.v_proj.weight", ws.ln1.f32(), C, g1, W, q + kvw, g2, N, ws);
  be.RMSNormBackward(dres, d.ln1, g2, in, w.ln1, ws.ln1_rstd.f32(), N, C);
  // din may alias dout or in: both are fully consumed by now.
  be.CopyDeviceToDevice(din, dres, N * C * sizeof(float));
}

// The final RMSNorm of in into ws.ln1 (rstd saved for the backward).
const float* HeadNormForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                             const float* in, int64_t N, LayerWorkspace& ws) {
  be.RMSNormForward(ws.ln1.f32(), ws.ln1_rstd.f32(), in, params + Off(layout, "norm.weight"), N, spec.d_model,
                    static_cast<float>(spec.rms_norm_eps));
  return ws.ln1.f32();
}

void HeadNormBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                      const float* in, const float* dnormed, float* din, float* dparams, int64_t N,
                      LayerWorkspace& ws) {
  be.RMSNormBackward(din, dparams + Off(layout, "norm.weight"), dnormed, in, params + Off(layout, "norm.weight"),
                     ws.ln1_rstd.f32(), N, spec.d_model);
}

}  // namespace

const FamilyLayers& LlamaLayers() {
  static const FamilyLayers kLayers{
      .family = ModelFamily::kLlama,
      .alloc_workspace = &AllocWorkspace,
      .embedding_forward = &FamilyEmbeddingForward,
      .embedding_backward = &FamilyEmbeddingBackward,
      .block_forward = &FamilyBlockForward,
      .block_backward = &FamilyBlockBackward,
      .head_norm_forward = &HeadNormForward,
      .head_norm_backward = &HeadNormBackward,
      .block_saved = {&LayerWorkspace::ln1, &LayerWorkspace::ln1_rstd, &LayerWorkspace::qkv,
                      &LayerWorkspace::att, &LayerWorkspace::atty, &LayerWorkspace::resid2,
                      &LayerWorkspace::ln2, &LayerWorkspace::ln2_rstd, &LayerWorkspace::fch,
                      &LayerWorkspace::fch_gelu},
      .block_decode = &FamilyBlockDecode,
  };
  return kLayers;
}

}  // namespace l2l::layers
