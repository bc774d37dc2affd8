// The GPT-2 layers (embedding, pre-LN transformer block, LM head) as compositions of
// Backend ops. See kernels/layers/layers.h for the contracts. Weights use the Hugging
// Face Conv1D layout, W (in, out), so a linear layer is y (N,out) = x (N,in) @ W + b.
#include "kernels/layers/layers.h"

#include <algorithm>
#include <string>
#include <vector>

namespace l2l::layers {

using kernels::Backend;
using kernels::DeviceBuffer;

namespace {

// Offset (floats) of the view named `suffix`; a missing view is a layout/kind mismatch.
size_t Off(const LayerLayout& layout, const char* suffix) {
  const ParamInfo* p = layout.Find(suffix);
  L2L_CHECK(p != nullptr) << "layer " << layout.index << " (" << LayerKindName(layout.kind)
                          << ") has no parameter \"" << suffix << "\"";
  return p->offset;
}

void CheckKind(const LayerLayout& layout, LayerKind kind, const char* fn) {
  L2L_CHECK(layout.kind == kind) << fn << " called with layer " << layout.index << " of kind "
                                 << LayerKindName(layout.kind) << ", expected "
                                 << LayerKindName(kind);
}

void CheckFits(const LayerWorkspace& ws, int64_t B, int64_t T, const char* fn) {
  L2L_CHECK(B > 0 && T > 0 && B <= ws.B() && T <= ws.T())
      << fn << ": micro-batch (B=" << B << ", T=" << T << ") does not fit the workspace (B="
      << ws.B() << ", T=" << ws.T() << ")";
}

// y (N,OC) = x (N,IC) @ W (IC,OC) + b (OC).
void Linear(Backend& be, float* y, const float* x, const float* w, const float* b, int64_t N,
            int64_t IC, int64_t OC) {
  be.Gemm(false, false, N, OC, IC, 1.0f, x, IC, w, OC, 0.0f, y, OC);
  be.AddBias(y, b, N, OC);
}

// Backward of Linear: dW (IC,OC) += x^T @ dy; db (OC) += colsum(dy); dx (N,IC) = dy @ W^T
// (overwritten; skipped when dx is null).
void LinearBackward(Backend& be, float* dx, float* dw, float* db, const float* dy, const float* x,
                    const float* w, int64_t N, int64_t IC, int64_t OC) {
  be.Gemm(true, false, IC, OC, N, 1.0f, x, IC, dy, OC, 1.0f, dw, OC);
  be.BiasBackward(db, dy, N, OC);
  if (dx != nullptr) be.Gemm(false, true, N, IC, OC, 1.0f, dy, OC, w, OC, 0.0f, dx, IC);
}

// Views of a block's flat parameter (or gradient) buffer.
struct BlockViews {
  float *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
  float *ln2_w, *ln2_b, *fc_w, *fc_b, *mproj_w, *mproj_b;
};

BlockViews Views(const LayerLayout& layout, const float* base) {
  float* p = const_cast<float*>(base);
  return BlockViews{p + Off(layout, "ln_1.weight"),        p + Off(layout, "ln_1.bias"),
                    p + Off(layout, "attn.c_attn.weight"), p + Off(layout, "attn.c_attn.bias"),
                    p + Off(layout, "attn.c_proj.weight"), p + Off(layout, "attn.c_proj.bias"),
                    p + Off(layout, "ln_2.weight"),        p + Off(layout, "ln_2.bias"),
                    p + Off(layout, "mlp.c_fc.weight"),    p + Off(layout, "mlp.c_fc.bias"),
                    p + Off(layout, "mlp.c_proj.weight"),  p + Off(layout, "mlp.c_proj.bias")};
}

// Forward internals of a block up to (and including) fch_gelu, into ws.
void BlockInternals(Backend& be, const ModelSpec& spec, const BlockViews& w, const float* in,
                    int64_t B, int64_t T, LayerWorkspace& ws) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T;
  be.LayerNormForward(ws.ln1.f32(), ws.ln1_mean.f32(), ws.ln1_rstd.f32(), in, w.ln1_w, w.ln1_b, N,
                      C);
  Linear(be, ws.qkv.f32(), ws.ln1.f32(), w.attn_w, w.attn_b, N, C, 3 * C);  // (N,3C)
  be.AttentionForward(ws.atty.f32(), ws.att.f32(), ws.qkv.f32(), B, T, C, spec.n_head);
  Linear(be, ws.resid2.f32(), ws.atty.f32(), w.proj_w, w.proj_b, N, C, C);
  be.Add(ws.resid2.f32(), ws.resid2.f32(), in, N * C);  // x1 = x + attn
  be.LayerNormForward(ws.ln2.f32(), ws.ln2_mean.f32(), ws.ln2_rstd.f32(), ws.resid2.f32(),
                      w.ln2_w, w.ln2_b, N, C);
  Linear(be, ws.fch.f32(), ws.ln2.f32(), w.fc_w, w.fc_b, N, C, F);  // (N,F)
  be.GeluForward(ws.fch_gelu.f32(), ws.fch.f32(), N * F);
}

// logits (N,V) in ws.logits from in (N,C): ln_f into ws.ln1, then ln_f(in) @ W^T.
const float* HeadLogits(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                        const float* params, const float* wte, const float* in, int64_t N,
                        LayerWorkspace& ws) {
  const int64_t C = spec.d_model, V = spec.vocab_size;
  const float* w = spec.tied_embeddings ? wte : params + Off(layout, "lm_head.weight");
  L2L_CHECK(w != nullptr) << "head of a tied model needs the embedding's wte";
  be.LayerNormForward(ws.ln1.f32(), ws.ln1_mean.f32(), ws.ln1_rstd.f32(), in,
                      params + Off(layout, "ln_f.weight"), params + Off(layout, "ln_f.bias"), N, C);
  be.Gemm(false, true, N, V, C, 1.0f, ws.ln1.f32(), C, w, C, 0.0f, ws.logits.f32(), V);
  return w;
}

}  // namespace

// ---- LayerWorkspace --------------------------------------------------------------------

Result<LayerWorkspace> LayerWorkspace::Create(Backend* backend, const ModelSpec& spec, int64_t B,
                                              int64_t T) {
  L2L_RETURN_IF_ERROR(spec.Validate());
  if (B <= 0 || T <= 0 || T > spec.seq_len) {
    return InvalidArgument("LayerWorkspace: micro-batch B=" + std::to_string(B) + " T=" +
                           std::to_string(T) + " must be positive with T <= model.seq_len=" +
                           std::to_string(spec.seq_len));
  }
  const size_t f = sizeof(float);
  const size_t N = static_cast<size_t>(B * T), C = spec.d_model, F = spec.d_ff;
  const size_t NH = spec.n_head, V = spec.vocab_size, t = static_cast<size_t>(T);
  const size_t g = N * std::max(3 * C, F) * f;
  LayerWorkspace ws;
  ws.B_ = B;
  ws.T_ = T;
  struct Want {
    DeviceBuffer* buf;
    size_t bytes;
  };
  const std::vector<Want> wants = {
      {&ws.ln1, N * C * f},          {&ws.ln1_mean, N * f},         {&ws.ln1_rstd, N * f},
      {&ws.qkv, N * 3 * C * f},      {&ws.att, B * NH * t * t * f}, {&ws.att_scratch, B * NH * t * t * f},
      {&ws.atty, N * C * f},         {&ws.resid2, N * C * f},       {&ws.ln2, N * C * f},
      {&ws.ln2_mean, N * f},         {&ws.ln2_rstd, N * f},         {&ws.fch, N * F * f},
      {&ws.fch_gelu, N * F * f},     {&ws.logits, N * V * f},       {&ws.losses, N * f},
      {&ws.g0, g},                   {&ws.g1, g},                   {&ws.g2, g},
      {&ws.g3, g}};
  for (const Want& w : wants) {
    auto buf = DeviceBuffer::Create(backend, w.bytes);
    if (!buf.ok()) return buf.status().WithContext("allocating layer workspace");
    *w.buf = std::move(buf).value();
  }
  return ws;
}

size_t LayerWorkspace::bytes() const {
  size_t total = 0;
  for (const DeviceBuffer* b : {&ln1, &ln1_mean, &ln1_rstd, &qkv, &att, &att_scratch, &atty, &resid2,
                                &ln2, &ln2_mean, &ln2_rstd, &fch, &fch_gelu, &logits, &losses, &g0,
                                &g1, &g2, &g3}) {
    total += b->bytes();
  }
  return total;
}

// ---- Embedding -------------------------------------------------------------------------

void EmbeddingForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                      const float* params, const int32_t* tokens, float* out, int64_t B, int64_t T) {
  CheckKind(layout, LayerKind::kEmbedding, "EmbeddingForward");
  L2L_CHECK(T <= spec.seq_len) << "EmbeddingForward: T=" << T << " > model.seq_len=" << spec.seq_len;
  be.EmbeddingForward(out, tokens, params + Off(layout, "wte.weight"),
                      params + Off(layout, "wpe.weight"), B, T, spec.d_model);
}

void EmbeddingBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                       const int32_t* tokens, const float* dout, float* dparams, int64_t B, int64_t T) {
  CheckKind(layout, LayerKind::kEmbedding, "EmbeddingBackward");
  L2L_CHECK(T <= spec.seq_len) << "EmbeddingBackward: T=" << T << " > model.seq_len=" << spec.seq_len;
  be.EmbeddingBackward(dparams + Off(layout, "wte.weight"), dparams + Off(layout, "wpe.weight"),
                       dout, tokens, B, T, spec.d_model);
}

// ---- Block -----------------------------------------------------------------------------

void BlockForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                  const float* params, const float* in, float* out, int64_t B, int64_t T,
                  LayerWorkspace& ws) {
  CheckKind(layout, LayerKind::kBlock, "BlockForward");
  CheckFits(ws, B, T, "BlockForward");
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T;
  const BlockViews w = Views(layout, params);
  BlockInternals(be, spec, w, in, B, T, ws);
  // out = x1 + mlp; `in` is no longer read, so out may alias it.
  Linear(be, out, ws.fch_gelu.f32(), w.mproj_w, w.mproj_b, N, F, C);
  be.Add(out, out, ws.resid2.f32(), N * C);
}

void BlockBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                   const float* params, const float* in, const float* dout, float* din,
                   float* dparams, int64_t B, int64_t T, LayerWorkspace& ws) {
  CheckKind(layout, LayerKind::kBlock, "BlockBackward");
  CheckFits(ws, B, T, "BlockBackward");
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T;
  const BlockViews w = Views(layout, params);
  const BlockViews d = Views(layout, dparams);
  BlockInternals(be, spec, w, in, B, T, ws);

  float* g0 = ws.g0.f32();
  float* g1 = ws.g1.f32();
  float* g2 = ws.g2.f32();
  float* dres = ws.g3.f32();  // (N,C) gradient of the residual stream
  // MLP: out = x1 + c_proj(gelu(c_fc(ln_2(x1)))).
  LinearBackward(be, g0, d.mproj_w, d.mproj_b, dout, ws.fch_gelu.f32(), w.mproj_w, N, F, C);
  be.Zero(g1, N * F * sizeof(float));
  be.GeluBackward(g1, ws.fch.f32(), g0, N * F);                         // dfch (N,F)
  LinearBackward(be, g2, d.fc_w, d.fc_b, g1, ws.ln2.f32(), w.fc_w, N, C, F);  // dln2 (N,C)
  be.CopyDeviceToDevice(dres, dout, N * C * sizeof(float));
  be.LayerNormBackward(dres, d.ln2_w, d.ln2_b, g2, ws.resid2.f32(), w.ln2_w, ws.ln2_mean.f32(),
                       ws.ln2_rstd.f32(), N, C);                          // dx1 (N,C)
  // Attention: x1 = x + c_proj(attention(c_attn(ln_1(x)))).
  LinearBackward(be, g0, d.proj_w, d.proj_b, dres, ws.atty.f32(), w.proj_w, N, C, C);  // datty
  be.Zero(g1, N * 3 * C * sizeof(float));
  be.AttentionBackward(g1, ws.att_scratch.f32(), g0, ws.qkv.f32(), ws.att.f32(), B, T, C,
                       spec.n_head);                                      // dqkv (N,3C)
  LinearBackward(be, g2, d.attn_w, d.attn_b, g1, ws.ln1.f32(), w.attn_w, N, C, 3 * C);  // dln1
  be.LayerNormBackward(dres, d.ln1_w, d.ln1_b, g2, in, w.ln1_w, ws.ln1_mean.f32(),
                       ws.ln1_rstd.f32(), N, C);
  // din may alias dout or in: both are fully consumed by now.
  be.CopyDeviceToDevice(din, dres, N * C * sizeof(float));
}

// ---- Head ------------------------------------------------------------------------------

float HeadForwardBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                          const float* params, const float* wte, const float* in,
                          const int32_t* targets, float loss_scale, float* din, float* dparams,
                          float* dwte, int64_t B, int64_t T, LayerWorkspace& ws) {
  CheckKind(layout, LayerKind::kHead, "HeadForwardBackward");
  CheckFits(ws, B, T, "HeadForwardBackward");
  const int64_t C = spec.d_model, V = spec.vocab_size, N = B * T;
  const float* w = HeadLogits(be, spec, layout, params, wte, in, N, ws);
  float* logits = ws.logits.f32();  // logits, then probs, then dlogits (N,V)
  be.CrossEntropyForward(ws.losses.f32(), logits, logits, targets, N, V);
  std::vector<float> losses(static_cast<size_t>(N));
  be.CopyToHost(losses.data(), ws.losses.data(), losses.size() * sizeof(float));
  double sum = 0.0;
  for (float l : losses) sum += l;
  const float mean_loss = static_cast<float>(sum / static_cast<double>(N));
  if (din == nullptr) return mean_loss;

  L2L_CHECK(dparams != nullptr) << "HeadForwardBackward: din given without dparams";
  float* dw = spec.tied_embeddings ? dwte : dparams + Off(layout, "lm_head.weight");
  L2L_CHECK(dw != nullptr) << "HeadForwardBackward: a tied head needs dwte";
  be.CrossEntropyBackward(logits, logits, targets, loss_scale / static_cast<float>(N), N, V);
  const float* lnf = ws.ln1.f32();
  be.Gemm(true, false, V, C, N, 1.0f, logits, V, lnf, C, 1.0f, dw, C);       // dW (V,C) +=
  float* dlnf = ws.g0.f32();
  be.Gemm(false, false, N, C, V, 1.0f, logits, V, w, C, 0.0f, dlnf, C);      // (N,C)
  float* acc = ws.g1.f32();
  be.Zero(acc, N * C * sizeof(float));
  be.LayerNormBackward(acc, dparams + Off(layout, "ln_f.weight"), dparams + Off(layout, "ln_f.bias"),
                       dlnf, in, params + Off(layout, "ln_f.weight"), ws.ln1_mean.f32(),
                       ws.ln1_rstd.f32(), N, C);
  be.CopyDeviceToDevice(din, acc, N * C * sizeof(float));
  return mean_loss;
}

void HeadProbs(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
               const float* wte, const float* in, float* probs, int64_t B, int64_t T,
               LayerWorkspace& ws) {
  CheckKind(layout, LayerKind::kHead, "HeadProbs");
  CheckFits(ws, B, T, "HeadProbs");
  const int64_t N = B * T, V = spec.vocab_size;
  HeadLogits(be, spec, layout, params, wte, in, N, ws);
  // The backend's softmax is the cross-entropy op; all-zero bits are int32 targets 0,
  // whose losses we ignore.
  int32_t* zero_targets = ws.g3.i32();
  be.Zero(zero_targets, N * sizeof(int32_t));
  be.CrossEntropyForward(ws.losses.f32(), probs, ws.logits.f32(), zero_targets, N, V);
}

}  // namespace l2l::layers
