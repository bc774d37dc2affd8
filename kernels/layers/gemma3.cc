// The Gemma 3 family's layers as compositions of Backend ops (see kernels/layers/layers.h
// for the contracts, common/models/gemma3.cc for the layout):
//   embedding   h = wte[tokens] * sqrt(C)            (the normaliser rounded to fp32, as HF)
//   block       x1  = x + rms_pa(o_proj(attn(rope(qk_norm(qkv(rms_in(x)))))))
//               out = x1 + rms_pf(down(gelu_tanh(gate(rms_ff(x1))) * up(rms_ff(x1))))
//   head norm   rms_final(x)
// where every RMSNorm multiplies by (1 + w): the (1 + w) vectors are formed on the device
// (Add with a vector of ones) before each use, so the gradient of w is that of (1 + w).
// q is scaled by sqrt(hs / query_pre_attn_scalar) after its norm, so that the attention's
// 1/sqrt(hs) gives query_pre_attn_scalar^-1/2. Sliding blocks (spec.SlidingBlock) use the
// windowed attention and the local rotary tables (rope_local_theta, no scaling); global
// blocks rope_theta with rope_scaling.
//
// Workspace regions (N = B*T, hs = head_dim(), W = (NH + 2*NKV)*hs, A = NH*hs):
//   ln1 (N,C), ln1_rstd (N)        rms_in(x); also the head's final norm
//   qkv                            (N,W) rotated q|k|v, then q_raw (N*NH,hs), k_raw
//                                  (N*NKV,hs) (the heads before their norms), q_rstd
//                                  (N*NH), k_rstd (N*NKV)
//   att, att_scratch               the causal attention's stash and scratch
//   atty (N,A)                     attention output
//   ln1_mean                       o_out (N,C) = o_proj(atty), then its rstd (N)
//   resid2 (N,C)                   x1
//   ln2 (N,C), ln2_rstd (N)        rms_ff(x1)
//   fch (N,2F), fch_gelu (N,F)     gate|up, gelu_tanh(gate)*up
//   ln2_mean                       m_out (N,C) = down(fch_gelu), then its rstd (N)
//   logits, losses                 the head's
//   g0..g3 (N, max(W, 2F, C))      gradient scratch
//   rope_cos, rope_sin             global tables (T,hs/2), local tables (T,hs/2); then
//                                  rope_cos: ones (max(C,hs)); rope_sin: the (1 + w)
//                                  vectors of the current layer (4C + 2hs)
// KV-cache decoding (block_decode, kernels/layers/kv_decode.h): the same internals for one
// row at position kv.pos (its rotary rows from the block's tables), attending over the
// cache (a sliding block only over its last sliding_window positions).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/layers/kv_decode.h"
#include "kernels/layers/registry.h"
#include "kernels/layers/rope.h"

namespace l2l::layers {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;

int64_t QkvWidth(const ModelSpec& s) { return (s.n_head + 2 * s.kv_heads()) * s.head_dim(); }

size_t QkvFloats(const ModelSpec& s, size_t N) {
  const size_t heads = static_cast<size_t>(s.n_head + s.kv_heads());
  return N * QkvWidth(s) + N * heads * (s.head_dim() + 1);
}

Status AllocWorkspace(Backend* backend, const ModelSpec& spec, int64_t B, int64_t T, LayerWorkspace* ws) {
  const size_t f = sizeof(float);
  const size_t N = static_cast<size_t>(B * T), C = spec.d_model, F = spec.d_ff, hs = spec.head_dim();
  const size_t V = spec.vocab_size, t = static_cast<size_t>(T), half = hs / 2;
  const size_t W = static_cast<size_t>(QkvWidth(spec)), A = spec.n_head * hs;
  const size_t g = N * std::max({W, 2 * F, C}) * f;
  const size_t att_floats = backend->CausalAttentionFloats(B, T, spec.n_head, static_cast<int64_t>(hs));
  const size_t scratch_floats = std::max<size_t>(1, backend->CausalAttentionScratchFloats(B, T, spec.n_head, static_cast<int64_t>(hs)));
  const size_t ones = std::max(C, hs), w1 = 4 * C + 2 * hs;
  struct Want {
    DeviceBuffer* buf;
    size_t bytes;
  };
  const std::vector<Want> wants = {
      {&ws->ln1, N * C * f},           {&ws->ln1_rstd, N * f},          {&ws->qkv, QkvFloats(spec, N) * f},
      {&ws->att, att_floats * f},      {&ws->att_scratch, scratch_floats * f},
      {&ws->atty, N * A * f},          {&ws->ln1_mean, (N * C + N) * f}, {&ws->resid2, N * C * f},
      {&ws->ln2, N * C * f},           {&ws->ln2_rstd, N * f},          {&ws->fch, N * 2 * F * f},
      {&ws->fch_gelu, N * F * f},      {&ws->ln2_mean, (N * C + N) * f},
      {&ws->logits, static_cast<size_t>(ws->head_rows()) * V * f},     {&ws->losses, N * f},
      {&ws->g0, g},                    {&ws->g1, g},                    {&ws->g2, g},
      {&ws->g3, g},                    {&ws->rope_cos, (2 * t * half + ones) * f},
      {&ws->rope_sin, (2 * t * half + w1) * f}};
  for (const Want& w : wants) L2L_RETURN_IF_ERROR(AllocInto(backend, w.buf, w.bytes));
  std::vector<float> cos(2 * t * half + ones, 1.0f), sin(2 * t * half, 0.0f);
  const std::vector<double> global = RopeInverseFrequencies(hs, spec.rope_theta, spec.rope_scaling);
  const std::vector<double> local = RopeInverseFrequencies(hs, spec.rope_local_theta, RopeScaling{});
  for (size_t p = 0; p < t; ++p) {
    for (size_t i = 0; i < half; ++i) {
      cos[p * half + i] = static_cast<float>(std::cos(double(p) * global[i]));
      sin[p * half + i] = static_cast<float>(std::sin(double(p) * global[i]));
      cos[(t + p) * half + i] = static_cast<float>(std::cos(double(p) * local[i]));
      sin[(t + p) * half + i] = static_cast<float>(std::sin(double(p) * local[i]));
    }
  }
  backend->CopyToDevice(ws->rope_cos.data(), cos.data(), cos.size() * f);
  backend->CopyToDevice(ws->rope_sin.data(), sin.data(), sin.size() * f);
  backend->Synchronize();
  return Status::Ok();
}

// The ones vector and the (1 + w) scratch past the rotary tables (see the header).
const float* OnesOf(const ModelSpec& spec, const LayerWorkspace& ws) {
  return ws.rope_cos.f32() + 2 * ws.T() * (spec.head_dim() / 2);
}
float* PlusOneScratch(const ModelSpec& spec, const LayerWorkspace& ws) {
  return ws.rope_sin.f32() + 2 * ws.T() * (spec.head_dim() / 2);
}

// Views of a block's flat parameter (or gradient) buffer.
struct BlockViews {
  float *in_norm, *qkv_w, *q_norm, *k_norm, *o_w, *post_attn, *pre_ff, *post_ff, *gate_up_w, *down_w;
};

BlockViews Views(const LayerLayout& layout, const float* base) {
  float* p = const_cast<float*>(base);
  return BlockViews{p + Off(layout, "input_layernorm.weight"),
                    p + Off(layout, "self_attn.q_proj.weight"),  // q|k|v adjacent (W,C)
                    p + Off(layout, "self_attn.q_norm.weight"),
                    p + Off(layout, "self_attn.k_norm.weight"),
                    p + Off(layout, "self_attn.o_proj.weight"),
                    p + Off(layout, "post_attention_layernorm.weight"),
                    p + Off(layout, "pre_feedforward_layernorm.weight"),
                    p + Off(layout, "post_feedforward_layernorm.weight"),
                    p + Off(layout, "mlp.gate_proj.weight"),  // gate|up adjacent (2F,C)
                    p + Off(layout, "mlp.down_proj.weight")};
}

// The (1 + w) vectors of a block's six norms, formed in ws (same order as the fields).
struct PlusOne {
  const float *in_norm, *post_attn, *pre_ff, *post_ff, *q_norm, *k_norm;
};

PlusOne FormPlusOne(Backend& be, const ModelSpec& spec, const BlockViews& w, LayerWorkspace& ws) {
  const int64_t C = spec.d_model, hs = spec.head_dim();
  const float* ones = OnesOf(spec, ws);
  float* s = PlusOneScratch(spec, ws);
  be.Add(s, w.in_norm, ones, C);
  be.Add(s + C, w.post_attn, ones, C);
  be.Add(s + 2 * C, w.pre_ff, ones, C);
  be.Add(s + 3 * C, w.post_ff, ones, C);
  be.Add(s + 4 * C, w.q_norm, ones, hs);
  be.Add(s + 4 * C + hs, w.k_norm, ones, hs);
  return PlusOne{s, s + C, s + 2 * C, s + 3 * C, s + 4 * C, s + 4 * C + hs};
}

// sqrt(hs / query_pre_attn_scalar): q's factor so that the attention's 1/sqrt(hs) scale
// becomes query_pre_attn_scalar^-1/2 (1 when the scalar is the head size).
float QueryScale(const ModelSpec& s) {
  const double hs = double(s.head_dim());
  return static_cast<float>(std::sqrt(hs) / std::sqrt(s.query_pre_attn_scalar));
}

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

// Forward internals (everything the backward reads), ending with post_ff (N,C) =
// rms_pf(m_out) (its rstd kept in ws.ln2_mean): the block's output less x1.
// With kv (B = T = 1, KV-cache decoding): the row is rotated for position kv->pos and
// attends over the cache.
void BlockInternals(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const BlockViews& w,
                    const PlusOne& p1, const float* in, int64_t B, int64_t T, LayerWorkspace& ws, float* post_ff,
                    const KvStep* kv = nullptr) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T, W = QkvWidth(spec);
  const int64_t NH = spec.n_head, NKV = spec.kv_heads(), hs = spec.head_dim(), A = NH * hs;
  const float eps = static_cast<float>(spec.rms_norm_eps);
  const bool sliding = spec.SlidingBlock(layout.block);
  be.RMSNormForward(ws.ln1.f32(), ws.ln1_rstd.f32(), in, p1.in_norm, N, C, eps);
  float* qkv = ws.qkv.f32();
  be.Gemm(false, true, N, W, C, 1.0f, ws.ln1.f32(), C, w.qkv_w, C, 0.0f, qkv, W);
  // q and k head norms (and q's scale), through contiguous copies of the heads.
  const QkRaw r = RawHeads(spec, ws, N);
  float* normed = ws.g0.f32();
  const float qs = QueryScale(spec);
  be.Copy2D(r.q, A, qkv, W, N, A);
  be.Copy2D(r.k, NKV * hs, qkv + A, W, N, NKV * hs);
  be.RMSNormForward(normed, r.q_rstd, r.q, p1.q_norm, N * NH, hs, eps);
  if (qs != 1.0f) be.Scale(normed, qs, N * A);
  be.Copy2D(qkv, W, normed, A, N, A);
  be.RMSNormForward(normed, r.k_rstd, r.k, p1.k_norm, N * NKV, hs, eps);
  be.Copy2D(qkv + A, W, normed, NKV * hs, N, NKV * hs);
  const int64_t table = (sliding ? ws.T() * (hs / 2) : 0) + (kv != nullptr ? kv->pos * (hs / 2) : 0);
  be.RopeForward(qkv, ws.rope_cos.f32() + table, ws.rope_sin.f32() + table, B, T, W, NH + NKV, hs);
  if (kv != nullptr) {
    AttendCached(be, qkv, NH, NKV, hs, *kv, ws.atty.f32(), sliding ? spec.sliding_window : 0);
  } else if (sliding) {
    be.AttentionForwardGqaWindow(ws.atty.f32(), ws.att.f32(), qkv, B, T, NH, NKV, hs, spec.sliding_window);
  } else {
    be.AttentionForwardGqa(ws.atty.f32(), ws.att.f32(), qkv, B, T, NH, NKV, hs);
  }
  float* o_out = ws.ln1_mean.f32();
  be.Gemm(false, true, N, C, A, 1.0f, ws.atty.f32(), A, w.o_w, A, 0.0f, o_out, C);
  // x1 = x + rms_pa(o_out)
  be.RMSNormForward(ws.resid2.f32(), o_out + N * C, o_out, p1.post_attn, N, C, eps);
  be.Add(ws.resid2.f32(), in, ws.resid2.f32(), N * C);
  be.RMSNormForward(ws.ln2.f32(), ws.ln2_rstd.f32(), ws.resid2.f32(), p1.pre_ff, N, C, eps);
  be.Gemm(false, true, N, 2 * F, C, 1.0f, ws.ln2.f32(), C, w.gate_up_w, C, 0.0f, ws.fch.f32(), 2 * F);
  be.GegluForward(ws.fch_gelu.f32(), ws.fch.f32(), N, F);
  float* m_out = ws.ln2_mean.f32();
  be.Gemm(false, true, N, C, F, 1.0f, ws.fch_gelu.f32(), F, w.down_w, F, 0.0f, m_out, C);
  be.RMSNormForward(post_ff, m_out + N * C, m_out, p1.post_ff, N, C, eps);
}

// The activations a block's GEMMs read again later in the call, each written only by its
// producer (RMSNorm, the attention, GeGLU): held bf16 copies (registry.h).
HeldBf16Copies HoldCopies(Backend& be, const ModelSpec& spec, LayerWorkspace& ws, int64_t N) {
  const int64_t C = spec.d_model, F = spec.d_ff, A = spec.n_head * spec.head_dim();
  return HeldBf16Copies(be, {{ws.ln1.f32(), N * C}, {ws.atty.f32(), N * A}, {ws.ln2.f32(), N * C},
                             {ws.fch_gelu.f32(), N * F}});
}

void GemmaEmbeddingForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                      const int32_t* tokens, float* out, int64_t B, int64_t T, const SequenceInputs&,
                      LayerWorkspace*) {
  const int64_t C = spec.d_model;
  be.TokenEmbeddingForward(out, tokens, params + Off(layout, "embed_tokens.weight"), B * T, C);
  be.Scale(out, static_cast<float>(std::sqrt(double(C))), B * T * C);
}

void GemmaEmbeddingBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float*,
                       const int32_t* tokens, const float* dout, float* dparams, int64_t B, int64_t T,
                       const SequenceInputs&, LayerWorkspace* ws) {
  L2L_CHECK(ws != nullptr) << "gemma3 EmbeddingBackward needs the layer workspace (scratch for the scaled gradient)";
  const int64_t C = spec.d_model, N = B * T;
  float* scaled = ws->g0.f32();
  be.CopyDeviceToDevice(scaled, dout, static_cast<size_t>(N * C) * sizeof(float));
  be.Scale(scaled, static_cast<float>(std::sqrt(double(C))), N * C);
  be.TokenEmbeddingBackward(dparams + Off(layout, "embed_tokens.weight"), scaled, tokens, N, C);
}

void GemmaBlockForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                  const float* in, float* out, int64_t B, int64_t T, LayerWorkspace& ws, const SequenceInputs&) {
  const int64_t C = spec.d_model, N = B * T;
  const BlockViews w = Views(layout, params);
  const PlusOne p1 = FormPlusOne(be, spec, w, ws);
  // out = x1 + rms_pf(m_out); `in` is no longer read once out is written, so out may alias it.
  BlockInternals(be, spec, layout, w, p1, in, B, T, ws, out);
  be.Add(out, ws.resid2.f32(), out, N * C);
}

void GemmaBlockDecode(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                      const float* in, float* out, LayerWorkspace& ws, const KvStep& kv) {
  const BlockViews w = Views(layout, params);
  const PlusOne p1 = FormPlusOne(be, spec, w, ws);
  BlockInternals(be, spec, layout, w, p1, in, 1, 1, ws, out, &kv);
  be.Add(out, ws.resid2.f32(), out, spec.d_model);
}

void GemmaBlockBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                   const float* in, const float* dout, float* din, float* dparams, int64_t B, int64_t T,
                   LayerWorkspace& ws, const SequenceInputs&, bool recompute) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T, W = QkvWidth(spec);
  const int64_t NH = spec.n_head, NKV = spec.kv_heads(), hs = spec.head_dim(), A = NH * hs;
  const bool sliding = spec.SlidingBlock(layout.block);
  const BlockViews w = Views(layout, params);
  const BlockViews d = Views(layout, dparams);
  const PlusOne p1 = FormPlusOne(be, spec, w, ws);
  float* g0 = ws.g0.f32();
  float* g1 = ws.g1.f32();
  const HeldBf16Copies held = HoldCopies(be, spec, ws, N);  // for the weight-gradient GEMMs
  if (recompute) BlockInternals(be, spec, layout, w, p1, in, B, T, ws, g1);  // g1: the unused post_ff
  const size_t NC = static_cast<size_t>(N * C) * sizeof(float);
  float* g2 = ws.g2.f32();
  float* dres = ws.g3.f32();  // (N,C) gradient of the residual stream
  const float* m_out = ws.ln2_mean.f32();
  const float* o_out = ws.ln1_mean.f32();
  // MLP: out = x1 + rms_pf(down(geglu(gate_up(rms_ff(x1))))).
  be.Zero(g0, NC);
  be.RMSNormBackward(g0, d.post_ff, dout, m_out, p1.post_ff, m_out + N * C, N, C);          // dm_out (N,C)
  be.Gemm(true, false, C, F, N, 1.0f, g0, C, ws.fch_gelu.f32(), F, 1.0f, d.down_w, F);       // dW_down (C,F) +=
  be.Gemm(false, false, N, F, C, 1.0f, g0, C, w.down_w, F, 0.0f, g1, F);                     // dh (N,F)
  be.Zero(g2, static_cast<size_t>(N * 2 * F) * sizeof(float));
  be.GegluBackward(g2, g1, ws.fch.f32(), N, F);                                              // dgate|dup (N,2F)
  be.Gemm(true, false, 2 * F, C, N, 1.0f, g2, 2 * F, ws.ln2.f32(), C, 1.0f, d.gate_up_w, C);  // (2F,C) +=
  be.Gemm(false, false, N, C, 2 * F, 1.0f, g2, 2 * F, w.gate_up_w, C, 0.0f, g1, C);          // dln2 (N,C)
  // dx1 = dout + the gradient through pre_ff, in one pass.
  be.RMSNormBackwardResidual(dres, d.pre_ff, dout, g1, ws.resid2.f32(), p1.pre_ff, ws.ln2_rstd.f32(), N, C);
  // Attention: x1 = x + rms_pa(o_proj(attn(...))).
  be.Zero(g0, NC);
  be.RMSNormBackward(g0, d.post_attn, dres, o_out, p1.post_attn, o_out + N * C, N, C);  // do_out (N,C)
  be.Gemm(true, false, C, A, N, 1.0f, g0, C, ws.atty.f32(), A, 1.0f, d.o_w, A);          // dW_o (C,A) +=
  be.Gemm(false, false, N, A, C, 1.0f, g0, C, w.o_w, A, 0.0f, g2, A);                    // datty (N,A)
  be.Zero(g1, static_cast<size_t>(N * W) * sizeof(float));
  if (sliding) {
    be.AttentionBackwardGqaWindow(g1, ws.att_scratch.f32(), g2, ws.qkv.f32(), ws.att.f32(), B, T, NH, NKV, hs,
                                  spec.sliding_window);
  } else {
    be.AttentionBackwardGqa(g1, ws.att_scratch.f32(), g2, ws.qkv.f32(), ws.att.f32(), B, T, NH, NKV, hs);
  }
  const int64_t table = sliding ? ws.T() * (hs / 2) : 0;
  // dqkv's copy, written by RoPE's backward, held through the q/k norms' backward (whose
  // Copy2D back into dqkv keeps it fresh) for the qkv layer's two GEMMs.
  const HeldBf16Copies held_dqkv(be, {{g1, N * W}});
  be.RopeBackward(g1, ws.rope_cos.f32() + table, ws.rope_sin.f32() + table, B, T, W, NH + NKV, hs);
  // Back through the q (and its scale) and k head norms.
  const QkRaw r = RawHeads(spec, ws, N);
  const float qs = QueryScale(spec);
  struct Part {
    int64_t col, heads;
    const float *raw, *rstd, *weight;
    float* dweight;
    float scale;
  };
  for (const Part& p : {Part{0, NH, r.q, r.q_rstd, p1.q_norm, d.q_norm, qs},
                        Part{A, NKV, r.k, r.k_rstd, p1.k_norm, d.k_norm, 1.0f}}) {
    const int64_t width = p.heads * hs;
    be.Copy2D(g0, width, g1 + p.col, W, N, width);
    if (p.scale != 1.0f) be.Scale(g0, p.scale, N * width);
    be.Zero(g2, static_cast<size_t>(N * width) * sizeof(float));
    be.RMSNormBackward(g2, p.dweight, g0, p.raw, p.weight, p.rstd, N * p.heads, hs);
    be.Copy2D(g1 + p.col, W, g2, width, N, width);
  }
  be.Gemm(true, false, W, C, N, 1.0f, g1, W, ws.ln1.f32(), C, 1.0f, d.qkv_w, C);  // dW_qkv (W,C) +=
  be.Gemm(false, false, N, C, W, 1.0f, g1, W, w.qkv_w, C, 0.0f, g2, C);           // dln1 (N,C)
  be.RMSNormBackward(dres, d.in_norm, g2, in, p1.in_norm, ws.ln1_rstd.f32(), N, C);
  // din may alias dout or in: both are fully consumed by now.
  be.CopyDeviceToDevice(din, dres, NC);
}

// The final norm rms(x) * (1 + w) into ws.ln1 (rstd saved for the backward).
const float* HeadNormForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                             const float* in, int64_t N, LayerWorkspace& ws) {
  float* w1 = PlusOneScratch(spec, ws);
  be.Add(w1, params + Off(layout, "norm.weight"), OnesOf(spec, ws), spec.d_model);
  be.RMSNormForward(ws.ln1.f32(), ws.ln1_rstd.f32(), in, w1, N, spec.d_model, static_cast<float>(spec.rms_norm_eps));
  return ws.ln1.f32();
}

void HeadNormBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                      const float* in, const float* dnormed, float* din, float* dparams, int64_t N,
                      LayerWorkspace& ws) {
  float* w1 = PlusOneScratch(spec, ws);
  be.Add(w1, params + Off(layout, "norm.weight"), OnesOf(spec, ws), spec.d_model);
  be.RMSNormBackward(din, dparams + Off(layout, "norm.weight"), dnormed, in, w1, ws.ln1_rstd.f32(), N, spec.d_model);
}

}  // namespace

const FamilyLayers& Gemma3Layers() {
  static const FamilyLayers kLayers{
      .family = ModelFamily::kGemma3,
      .alloc_workspace = &AllocWorkspace,
      .embedding_forward = &GemmaEmbeddingForward,
      .embedding_backward = &GemmaEmbeddingBackward,
      .block_forward = &GemmaBlockForward,
      .block_backward = &GemmaBlockBackward,
      .head_norm_forward = &HeadNormForward,
      .head_norm_backward = &HeadNormBackward,
      .block_saved = {&LayerWorkspace::ln1, &LayerWorkspace::ln1_rstd, &LayerWorkspace::qkv,
                      &LayerWorkspace::att, &LayerWorkspace::atty, &LayerWorkspace::ln1_mean,
                      &LayerWorkspace::resid2, &LayerWorkspace::ln2, &LayerWorkspace::ln2_rstd,
                      &LayerWorkspace::fch, &LayerWorkspace::fch_gelu, &LayerWorkspace::ln2_mean},
      .block_decode = &GemmaBlockDecode,
  };
  return kLayers;
}

}  // namespace l2l::layers
