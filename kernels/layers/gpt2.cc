// The GPT-2 family's layers (embedding with learned positions, pre-LN transformer block
// with GELU MLP, LayerNorm before the head) as compositions of Backend ops. See
// kernels/layers/layers.h for the contracts. Weights use the Hugging Face Conv1D layout,
// W (in, out), so a linear layer is y (N,out) = x (N,in) @ W + b.
#include <algorithm>
#include <vector>

#include "kernels/layers/kv_decode.h"
#include "kernels/layers/lora.h"
#include "kernels/layers/registry.h"

namespace l2l::layers {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;

// Backward of Linear: dW (IC,OC) += x^T @ dy (skipped when dw is null: a frozen LoRA base);
// db (OC) += colsum(dy) (skipped when db is null: the caller fused it); dx (N,IC) = dy @ W^T
// (overwritten; skipped when dx is null). The two GEMMs run back to back: the bf16 GEMM
// modes read dy's bf16 copy once for both (kernels/cuda/bf16_operands.h).
void LinearBackward(Backend& be, float* dx, float* dw, float* db, const float* dy, const float* x,
                    const float* w, int64_t N, int64_t IC, int64_t OC) {
  if (dw != nullptr) be.Gemm(true, false, IC, OC, N, 1.0f, x, IC, dy, OC, 1.0f, dw, OC);
  if (dx != nullptr) be.Gemm(false, true, N, IC, OC, 1.0f, dy, OC, w, OC, 0.0f, dx, IC);
  if (db != nullptr) be.BiasBackward(db, dy, N, OC);
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
// With kv (B = T = 1, KV-cache decoding): the attention is the new row's over the cache.
// With LoRA adapters in `layout`, each targeted linear adds its adapter (kernels/layers/lora.h).
void BlockInternals(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                    const BlockViews& w, const float* in, int64_t B, int64_t T, LayerWorkspace& ws,
                    const KvStep* kv = nullptr) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T;
  be.LayerNormForward(ws.ln1.f32(), ws.ln1_mean.f32(), ws.ln1_rstd.f32(), in, w.ln1_w, w.ln1_b, N,
                      C);
  be.LinearForward(ws.qkv.f32(), ws.ln1.f32(), w.attn_w, false, w.attn_b, N, C, 3 * C, nullptr,
                   nullptr);  // (N,3C)
  LoraForward(be, layout, params, "attn.c_attn.weight", ws.ln1.f32(), C, N, ws.qkv.f32(), 3 * C, 0, ws);
  if (kv == nullptr) {
    be.AttentionForward(ws.atty.f32(), ws.att.f32(), ws.qkv.f32(), B, T, C, spec.n_head);
  } else {
    AttendCached(be, ws.qkv.f32(), spec.n_head, spec.n_head, C / spec.n_head, *kv, ws.atty.f32());
  }
  // x1 = x + attn
  be.LinearForward(ws.resid2.f32(), ws.atty.f32(), w.proj_w, false, w.proj_b, N, C, C, nullptr, in);
  LoraForward(be, layout, params, "attn.c_proj.weight", ws.atty.f32(), C, N, ws.resid2.f32(), C, 0, ws);
  be.LayerNormForward(ws.ln2.f32(), ws.ln2_mean.f32(), ws.ln2_rstd.f32(), ws.resid2.f32(),
                      w.ln2_w, w.ln2_b, N, C);
  // fch (N,F) and fch_gelu = gelu(fch); an adapter on c_fc adds to fch before the GELU.
  if (!HasLora(layout, "mlp.c_fc.weight")) {
    be.LinearForward(ws.fch.f32(), ws.ln2.f32(), w.fc_w, false, w.fc_b, N, C, F, ws.fch_gelu.f32(), nullptr);
  } else {
    be.LinearForward(ws.fch.f32(), ws.ln2.f32(), w.fc_w, false, w.fc_b, N, C, F, nullptr, nullptr);
    LoraForward(be, layout, params, "mlp.c_fc.weight", ws.ln2.f32(), C, N, ws.fch.f32(), F, 0, ws);
    be.GeluForward(ws.fch_gelu.f32(), ws.fch.f32(), N * F);
  }
}

// The activations a block's GEMMs read again later in the call, each written only by its
// producer (LayerNorm, the attention, c_fc's GELU epilogue or GeluForward): held bf16
// copies (registry.h).
HeldBf16Copies HoldCopies(Backend& be, LayerWorkspace& ws, int64_t N, int64_t C, int64_t F) {
  return HeldBf16Copies(be, {{ws.ln1.f32(), N * C}, {ws.atty.f32(), N * C}, {ws.ln2.f32(), N * C},
                             {ws.fch_gelu.f32(), N * F}});
}

Status AllocWorkspace(Backend* backend, const ModelSpec& spec, int64_t B, int64_t T, LayerWorkspace* ws) {
  const size_t f = sizeof(float);
  const size_t N = static_cast<size_t>(B * T), C = spec.d_model, F = spec.d_ff;
  const size_t V = spec.vocab_size;
  const size_t g = N * std::max(3 * C, F) * f;
  // The causal attention's stash and scratch, as this backend needs them.
  const int64_t hs = static_cast<int64_t>(C) / spec.n_head;  // GPT-2's heads split C
  const size_t att_floats = backend->CausalAttentionFloats(B, T, spec.n_head, hs);
  const size_t scratch_floats = std::max<size_t>(1, backend->CausalAttentionScratchFloats(B, T, spec.n_head, hs));
  struct Want {
    DeviceBuffer* buf;
    size_t bytes;
  };
  const std::vector<Want> wants = {
      {&ws->ln1, N * C * f},          {&ws->ln1_mean, N * f},         {&ws->ln1_rstd, N * f},
      {&ws->qkv, N * 3 * C * f},      {&ws->att, att_floats * f},      {&ws->att_scratch, scratch_floats * f},
      {&ws->atty, N * C * f},         {&ws->resid2, N * C * f},       {&ws->ln2, N * C * f},
      {&ws->ln2_mean, N * f},         {&ws->ln2_rstd, N * f},         {&ws->fch, N * F * f},
      {&ws->fch_gelu, N * F * f},     {&ws->logits, static_cast<size_t>(ws->head_rows()) * V * f},       {&ws->losses, N * f},
      {&ws->g0, g},                   {&ws->g1, g},                   {&ws->g2, g},
      {&ws->g3, g}};
  for (const Want& w : wants) L2L_RETURN_IF_ERROR(AllocInto(backend, w.buf, w.bytes));
  return Status::Ok();
}

void FamilyEmbeddingForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                      const int32_t* tokens, float* out, int64_t B, int64_t T, const SequenceInputs& seq,
                      LayerWorkspace*) {
  be.EmbeddingForward(out, tokens, params + Off(layout, "wte.weight"),
                      params + Off(layout, "wpe.weight") + seq.position_offset * spec.d_model, B, T, spec.d_model);
}

void FamilyEmbeddingBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float*,
                       const int32_t* tokens, const float* dout, float* dparams, int64_t B, int64_t T,
                       const SequenceInputs&, LayerWorkspace*) {
  be.EmbeddingBackward(dparams + Off(layout, "wte.weight"), dparams + Off(layout, "wpe.weight"), dout, tokens, B,
                       T, spec.d_model);
}

void FamilyBlockForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                  const float* in, float* out, int64_t B, int64_t T, LayerWorkspace& ws, const SequenceInputs&) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T;
  const BlockViews w = Views(layout, params);
  // Only the LoRA adapters' GEMMs read a forward activation after other ops ran.
  const HeldBf16Copies held = layout.lora_r > 0 ? HoldCopies(be, ws, N, C, F) : HeldBf16Copies(be, {});
  BlockInternals(be, spec, layout, params, w, in, B, T, ws);
  // out = x1 + mlp; `in` is no longer read, so out may alias it.
  be.LinearForward(out, ws.fch_gelu.f32(), w.mproj_w, false, w.mproj_b, N, F, C, nullptr,
                   ws.resid2.f32());
  LoraForward(be, layout, params, "mlp.c_proj.weight", ws.fch_gelu.f32(), F, N, out, C, 0, ws);
}

void FamilyBlockDecode(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                       const float* in, float* out, LayerWorkspace& ws, const KvStep& kv) {
  const BlockViews w = Views(layout, params);
  BlockInternals(be, spec, layout, params, w, in, 1, 1, ws, &kv);
  be.LinearForward(out, ws.fch_gelu.f32(), w.mproj_w, false, w.mproj_b, 1, spec.d_ff, spec.d_model, nullptr,
                   ws.resid2.f32());
  LoraForward(be, layout, params, "mlp.c_proj.weight", ws.fch_gelu.f32(), spec.d_ff, 1, out, spec.d_model, 0, ws);
}

void FamilyBlockBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                   const float* in, const float* dout, float* din, float* dparams, int64_t B, int64_t T,
                   LayerWorkspace& ws, const SequenceInputs&, bool recompute) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T;
  const BlockViews w = Views(layout, params);
  const BlockViews d = Views(layout, dparams);
  const HeldBf16Copies held = HoldCopies(be, ws, N, C, F);  // for the weight-gradient GEMMs
  if (recompute) BlockInternals(be, spec, layout, params, w, in, B, T, ws);
  // A LoRA layout freezes the base: no weight gradients for it (its norms' and biases'
  // land in the unused frozen part of dparams), the adapters' instead.
  const bool frozen = BaseFrozen(layout);

  float* g0 = ws.g0.f32();
  float* g1 = ws.g1.f32();
  float* g2 = ws.g2.f32();
  float* dres = ws.g3.f32();  // (N,C) gradient of the residual stream
  // MLP: out = x1 + c_proj(gelu(c_fc(ln_2(x1)))).
  LinearBackward(be, g0, frozen ? nullptr : d.mproj_w, d.mproj_b, dout, ws.fch_gelu.f32(), w.mproj_w, N, F, C);
  LoraBackward(be, layout, params, dparams, "mlp.c_proj.weight", ws.fch_gelu.f32(), F, dout, C, 0, g0, N, ws);
  be.GeluBackwardBias(g1, d.fc_b, ws.fch.f32(), g0, N, F);                        // dfch (N,F), dfc_b
  LinearBackward(be, g2, frozen ? nullptr : d.fc_w, nullptr, g1, ws.ln2.f32(), w.fc_w, N, C, F);  // dln2 (N,C)
  LoraBackward(be, layout, params, dparams, "mlp.c_fc.weight", ws.ln2.f32(), C, g1, F, 0, g2, N, ws);
  // dx1 (N,C) = dout + the gradient through ln_2, in one pass.
  be.LayerNormBackwardResidual(dres, d.ln2_w, d.ln2_b, dout, g2, ws.resid2.f32(), w.ln2_w,
                               ws.ln2_mean.f32(), ws.ln2_rstd.f32(), N, C);
  // Attention: x1 = x + c_proj(attention(c_attn(ln_1(x)))).
  LinearBackward(be, g0, frozen ? nullptr : d.proj_w, d.proj_b, dres, ws.atty.f32(), w.proj_w, N, C, C);  // datty
  LoraBackward(be, layout, params, dparams, "attn.c_proj.weight", ws.atty.f32(), C, dres, C, 0, g0, N, ws);
  be.Zero(g1, N * 3 * C * sizeof(float));
  be.AttentionBackward(g1, ws.att_scratch.f32(), g0, ws.qkv.f32(), ws.att.f32(), B, T, C,
                       spec.n_head);                                                  // dqkv (N,3C)
  LinearBackward(be, g2, frozen ? nullptr : d.attn_w, d.attn_b, g1, ws.ln1.f32(), w.attn_w, N, C, 3 * C);  // dln1
  LoraBackward(be, layout, params, dparams, "attn.c_attn.weight", ws.ln1.f32(), C, g1, 3 * C, 0, g2, N, ws);
  be.LayerNormBackward(dres, d.ln1_w, d.ln1_b, g2, in, w.ln1_w, ws.ln1_mean.f32(), ws.ln1_rstd.f32(), N, C);
  // din may alias dout or in: both are fully consumed by now.
  be.CopyDeviceToDevice(din, dres, N * C * sizeof(float));
}

// ln_f(in) into ws.ln1 (mean/rstd saved for the backward).
const float* HeadNormForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                             const float* in, int64_t N, LayerWorkspace& ws) {
  be.LayerNormForward(ws.ln1.f32(), ws.ln1_mean.f32(), ws.ln1_rstd.f32(), in, params + Off(layout, "ln_f.weight"),
                      params + Off(layout, "ln_f.bias"), N, spec.d_model);
  return ws.ln1.f32();
}

void HeadNormBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                      const float* in, const float* dnormed, float* din, float* dparams, int64_t N,
                      LayerWorkspace& ws) {
  be.LayerNormBackward(din, dparams + Off(layout, "ln_f.weight"), dparams + Off(layout, "ln_f.bias"), dnormed, in,
                       params + Off(layout, "ln_f.weight"), ws.ln1_mean.f32(), ws.ln1_rstd.f32(), N, spec.d_model);
}

}  // namespace

const FamilyLayers& Gpt2Layers() {
  static const FamilyLayers kLayers{
      .family = ModelFamily::kGpt2,
      .alloc_workspace = &AllocWorkspace,
      .embedding_forward = &FamilyEmbeddingForward,
      .embedding_backward = &FamilyEmbeddingBackward,
      .block_forward = &FamilyBlockForward,
      .block_backward = &FamilyBlockBackward,
      .head_norm_forward = &HeadNormForward,
      .head_norm_backward = &HeadNormBackward,
      .block_saved = {&LayerWorkspace::ln1, &LayerWorkspace::ln1_mean, &LayerWorkspace::ln1_rstd,
                      &LayerWorkspace::qkv, &LayerWorkspace::att, &LayerWorkspace::atty,
                      &LayerWorkspace::resid2, &LayerWorkspace::ln2, &LayerWorkspace::ln2_mean,
                      &LayerWorkspace::ln2_rstd, &LayerWorkspace::fch, &LayerWorkspace::fch_gelu},
      .block_decode = &FamilyBlockDecode,
  };
  return kLayers;
}

}  // namespace l2l::layers
