// The BERT family's layers as compositions of Backend ops (see kernels/layers/layers.h for
// the contracts): the embedding (word + learned position + token type, then LayerNorm),
// the post-LN encoder block with bidirectional attention masked by the padding mask and an
// erf-GELU MLP, and two heads: masked LM (transform = dense + GELU + LayerNorm as the
// shared head's "norm", decoder tied to the word embeddings plus a bias) and sequence
// classification (pooler dense + tanh on each sequence's first token, then a linear
// classifier; its own head function). Weights use nn.Linear's layout, W (out, in), so a
// linear layer is y (N,out) = x (N,in) @ W^T + b. Every LayerNorm uses model.layer_norm_eps.
// Thread-safety: one thread per Backend, as every layer function.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/layers/registry.h"

namespace l2l::layers {
namespace {

using kernels::Backend;
using kernels::DeviceBuffer;

float Eps(const ModelSpec& spec) { return static_cast<float>(spec.layer_norm_eps); }

// y (N,OC) = x (N,IC) @ W^T + b, W (OC,IC); x has row stride ldx (>= IC).
void Linear(Backend& be, float* y, const float* x, const float* w, const float* b, int64_t N, int64_t IC,
            int64_t OC, int64_t ldx = 0) {
  be.Gemm(false, true, N, OC, IC, 1.0f, x, ldx > 0 ? ldx : IC, w, IC, 0.0f, y, OC);
  be.AddBias(y, b, N, OC);
}

// Backward of Linear: dW (OC,IC) += dy^T @ x; db (OC) += colsum(dy); dx (N,IC) = dy @ W
// (overwritten, row stride ldx; skipped when dx is null). The GEMMs back to back, as
// gpt2.cc's LinearBackward.
void LinearBackward(Backend& be, float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                    int64_t N, int64_t IC, int64_t OC, int64_t ldx = 0) {
  const int64_t ld = ldx > 0 ? ldx : IC;
  be.Gemm(true, false, OC, IC, N, 1.0f, dy, OC, x, ld, 1.0f, dw, IC);
  if (dx != nullptr) be.Gemm(false, false, N, IC, OC, 1.0f, dy, OC, w, IC, 0.0f, dx, ld);
  be.BiasBackward(db, dy, N, OC);
}

struct BlockViews {
  float *qkv_w, *qkv_b, *ao_w, *ao_b, *ln1_w, *ln1_b, *fi_w, *fi_b, *fo_w, *fo_b, *ln2_w, *ln2_b;
};

BlockViews Views(const LayerLayout& layout, const float* base) {
  float* p = const_cast<float*>(base);
  const std::string h = "encoder.layer." + std::to_string(layout.block) + ".";
  auto at = [&](const char* name) { return p + Off(layout, (h + name).c_str()); };
  return BlockViews{at("attention.self.query.weight"),     at("attention.self.query.bias"),
                    at("attention.output.dense.weight"),   at("attention.output.dense.bias"),
                    at("attention.output.LayerNorm.weight"), at("attention.output.LayerNorm.bias"),
                    at("intermediate.dense.weight"),       at("intermediate.dense.bias"),
                    at("output.dense.weight"),             at("output.dense.bias"),
                    at("output.LayerNorm.weight"),         at("output.LayerNorm.bias")};
}

// Forward internals of a block into ws, up to the second LayerNorm's input (ws.ln2):
//   qkv, att/atty, resid2 = x + attn, ln1 = LN_1(resid2) (= x1), fch, fch_gelu,
//   ln2 = x1 + out_dense(fch_gelu).
void BlockInternals(Backend& be, const ModelSpec& spec, const BlockViews& w, const float* in, int64_t B, int64_t T,
                    LayerWorkspace& ws, const SequenceInputs& seq) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T;
  Linear(be, ws.qkv.f32(), in, w.qkv_w, w.qkv_b, N, C, 3 * C);
  be.AttentionForwardMasked(ws.atty.f32(), ws.att.f32(), ws.qkv.f32(), seq.attention_mask, B, T, C, spec.n_head);
  Linear(be, ws.resid2.f32(), ws.atty.f32(), w.ao_w, w.ao_b, N, C, C);
  be.Add(ws.resid2.f32(), ws.resid2.f32(), in, N * C);
  be.LayerNormForwardEps(ws.ln1.f32(), ws.ln1_mean.f32(), ws.ln1_rstd.f32(), ws.resid2.f32(), w.ln1_w, w.ln1_b, N, C,
                         Eps(spec));
  Linear(be, ws.fch.f32(), ws.ln1.f32(), w.fi_w, w.fi_b, N, C, F);
  be.GeluErfForward(ws.fch_gelu.f32(), ws.fch.f32(), N * F);
  Linear(be, ws.ln2.f32(), ws.fch_gelu.f32(), w.fo_w, w.fo_b, N, F, C);
  be.Add(ws.ln2.f32(), ws.ln2.f32(), ws.ln1.f32(), N * C);
}

// The activations a block's GEMMs read again later in the call, each written only by its
// producer (the attention, LayerNorm 1, the erf GELU): held bf16 copies (registry.h). Not
// ws.ln2: the output dense's GEMM writes it and an Add then adds x1 in place.
HeldBf16Copies HoldCopies(Backend& be, const ModelSpec& spec, LayerWorkspace& ws, int64_t N) {
  const int64_t C = spec.d_model, F = spec.d_ff;
  return HeldBf16Copies(be, {{ws.atty.f32(), N * C}, {ws.ln1.f32(), N * C}, {ws.fch_gelu.f32(), N * F}});
}

Status AllocWorkspace(Backend* backend, const ModelSpec& spec, int64_t B, int64_t T, LayerWorkspace* ws) {
  const size_t f = sizeof(float);
  const size_t N = static_cast<size_t>(B * T), C = spec.d_model, F = spec.d_ff;
  const size_t V = spec.vocab_size;
  const size_t g = N * std::max(3 * C, F) * f;
  // The masked attention's stash and scratch, as this backend needs them.
  const size_t att_floats = backend->MaskedAttentionFloats(B, T, spec.n_head, spec.d_model / spec.n_head);
  const size_t scratch_floats =
      std::max<size_t>(1, backend->MaskedAttentionScratchFloats(B, T, spec.n_head, spec.d_model / spec.n_head));
  const size_t logits = std::max(static_cast<size_t>(ws->head_rows()) * V, static_cast<size_t>(B) * static_cast<size_t>(spec.num_labels)) * f;
  struct Want {
    DeviceBuffer* buf;
    size_t bytes;
  };
  const std::vector<Want> wants = {
      {&ws->ln1, N * C * f},          {&ws->ln1_mean, N * f},         {&ws->ln1_rstd, N * f},
      {&ws->qkv, N * 3 * C * f},      {&ws->att, att_floats * f},      {&ws->att_scratch, scratch_floats * f},
      {&ws->atty, N * C * f},         {&ws->resid2, N * C * f},       {&ws->ln2, N * C * f},
      {&ws->ln2_mean, N * f},         {&ws->ln2_rstd, N * f},         {&ws->fch, N * F * f},
      {&ws->fch_gelu, N * F * f},     {&ws->logits, logits},          {&ws->losses, N * f},
      {&ws->g0, g},                   {&ws->g1, g},                   {&ws->g2, g},
      {&ws->g3, g}};
  for (const Want& w : wants) L2L_RETURN_IF_ERROR(AllocInto(backend, w.buf, w.bytes));
  return Status::Ok();
}

// ws.resid2 (N,C) = word[tokens] + position[t] + token_type[types] (row 0 without types).
void EmbeddingSum(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                  const int32_t* tokens, int64_t B, int64_t T, const SequenceInputs& seq, LayerWorkspace& ws) {
  const int64_t C = spec.d_model, N = B * T;
  float* sum = ws.resid2.f32();
  be.EmbeddingForward(sum, tokens, params + Off(layout, "embeddings.word_embeddings.weight"),
                      params + Off(layout, "embeddings.position_embeddings.weight"), B, T, C);
  const float* types = params + Off(layout, "embeddings.token_type_embeddings.weight");
  if (seq.token_types != nullptr) {
    be.TokenEmbeddingForward(ws.atty.f32(), seq.token_types, types, N, C);
    be.Add(sum, sum, ws.atty.f32(), N * C);
  } else {
    be.AddBias(sum, types, N, C);
  }
}

LayerWorkspace& NeedWs(LayerWorkspace* ws, const char* fn) {
  L2L_CHECK(ws != nullptr) << fn << ": the BERT embedding needs the layer workspace (pass ws)";
  return *ws;
}

void FamilyEmbeddingForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                            const int32_t* tokens, float* out, int64_t B, int64_t T, const SequenceInputs& seq,
                            LayerWorkspace* wsp) {
  LayerWorkspace& ws = NeedWs(wsp, "EmbeddingForward");
  EmbeddingSum(be, spec, layout, params, tokens, B, T, seq, ws);
  be.LayerNormForwardEps(out, ws.ln1_mean.f32(), ws.ln1_rstd.f32(), ws.resid2.f32(),
                         params + Off(layout, "embeddings.LayerNorm.weight"),
                         params + Off(layout, "embeddings.LayerNorm.bias"), B * T, spec.d_model, Eps(spec));
}

void FamilyEmbeddingBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                             const int32_t* tokens, const float* dout, float* dparams, int64_t B, int64_t T,
                             const SequenceInputs& seq, LayerWorkspace* wsp) {
  LayerWorkspace& ws = NeedWs(wsp, "EmbeddingBackward");
  L2L_CHECK(params != nullptr) << "EmbeddingBackward: the BERT embedding needs its parameters (it recomputes its LayerNorm)";
  const int64_t C = spec.d_model, N = B * T;
  EmbeddingSum(be, spec, layout, params, tokens, B, T, seq, ws);
  be.LayerNormForwardEps(ws.ln1.f32(), ws.ln1_mean.f32(), ws.ln1_rstd.f32(), ws.resid2.f32(),
                         params + Off(layout, "embeddings.LayerNorm.weight"),
                         params + Off(layout, "embeddings.LayerNorm.bias"), N, C, Eps(spec));
  float* dsum = ws.g0.f32();
  be.Zero(dsum, N * C * sizeof(float));
  be.LayerNormBackward(dsum, dparams + Off(layout, "embeddings.LayerNorm.weight"),
                       dparams + Off(layout, "embeddings.LayerNorm.bias"), dout, ws.resid2.f32(),
                       params + Off(layout, "embeddings.LayerNorm.weight"), ws.ln1_mean.f32(), ws.ln1_rstd.f32(), N, C);
  be.EmbeddingBackward(dparams + Off(layout, "embeddings.word_embeddings.weight"),
                       dparams + Off(layout, "embeddings.position_embeddings.weight"), dsum, tokens, B, T, C);
  float* dtypes = dparams + Off(layout, "embeddings.token_type_embeddings.weight");
  if (seq.token_types != nullptr) {
    be.TokenEmbeddingBackward(dtypes, dsum, seq.token_types, N, C);
  } else {
    be.BiasBackward(dtypes, dsum, N, C);
  }
}

void FamilyBlockForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                        const float* in, float* out, int64_t B, int64_t T, LayerWorkspace& ws,
                        const SequenceInputs& seq) {
  const BlockViews w = Views(layout, params);
  BlockInternals(be, spec, w, in, B, T, ws, seq);
  // `in` is no longer read, so out may alias it.
  be.LayerNormForwardEps(out, ws.ln2_mean.f32(), ws.ln2_rstd.f32(), ws.ln2.f32(), w.ln2_w, w.ln2_b, B * T,
                         spec.d_model, Eps(spec));
}

void FamilyBlockBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                         const float* in, const float* dout, float* din, float* dparams, int64_t B, int64_t T,
                         LayerWorkspace& ws, const SequenceInputs& seq, bool recompute) {
  const int64_t C = spec.d_model, F = spec.d_ff, N = B * T;
  const BlockViews w = Views(layout, params);
  const BlockViews d = Views(layout, dparams);
  const HeldBf16Copies held = HoldCopies(be, spec, ws, N);  // for the weight-gradient GEMMs
  if (recompute) {
    BlockInternals(be, spec, w, in, B, T, ws, seq);
    // The second LayerNorm's statistics (the forward's output itself is not needed).
    be.LayerNormForwardEps(ws.g2.f32(), ws.ln2_mean.f32(), ws.ln2_rstd.f32(),
                           ws.ln2.f32(), w.ln2_w, w.ln2_b, N, C, Eps(spec));
  }
  float* g0 = ws.g0.f32();
  float* g1 = ws.g1.f32();
  float* g2 = ws.g2.f32();
  float* g3 = ws.g3.f32();
  // out = LN_2(r2), r2 = x1 + fo(gelu(fi(x1))).
  be.Zero(g3, N * C * sizeof(float));
  be.LayerNormBackward(g3, d.ln2_w, d.ln2_b, dout, ws.ln2.f32(), w.ln2_w, ws.ln2_mean.f32(), ws.ln2_rstd.f32(), N,
                       C);                                                               // dr2 (N,C)
  LinearBackward(be, g0, d.fo_w, d.fo_b, g3, ws.fch_gelu.f32(), w.fo_w, N, F, C);      // dgelu (N,F)
  be.Zero(g1, N * F * sizeof(float));
  be.GeluErfBackward(g1, ws.fch.f32(), g0, N * F);                                     // dfch (N,F)
  LinearBackward(be, g2, d.fi_w, d.fi_b, g1, ws.ln1.f32(), w.fi_w, N, C, F);           // dx1 via MLP
  be.Add(g2, g2, g3, N * C);                                                           // dx1 (N,C)
  // x1 = LN_1(r1), r1 = x + ao(attention(qkv(x))).
  be.Zero(g0, N * C * sizeof(float));
  be.LayerNormBackward(g0, d.ln1_w, d.ln1_b, g2, ws.resid2.f32(), w.ln1_w, ws.ln1_mean.f32(), ws.ln1_rstd.f32(), N,
                       C);                                                               // dr1 (N,C)
  LinearBackward(be, g2, d.ao_w, d.ao_b, g0, ws.atty.f32(), w.ao_w, N, C, C);          // datty
  be.Zero(g1, N * 3 * C * sizeof(float));
  be.AttentionBackwardMasked(g1, ws.att_scratch.f32(), g2, ws.qkv.f32(), ws.att.f32(), B, T, C, spec.n_head);
  LinearBackward(be, g2, d.qkv_w, d.qkv_b, g1, in, w.qkv_w, N, C, 3 * C);              // dx via attention
  // din may alias dout or in: both are fully consumed by now.
  be.Add(din, g2, g0, N * C);
}

// ---- masked-LM head: transform = LayerNorm(gelu(dense(in))) ----------------------------

const float* HeadNormForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                             const float* in, int64_t N, LayerWorkspace& ws) {
  const int64_t C = spec.d_model;
  Linear(be, ws.resid2.f32(), in, params + Off(layout, "cls.predictions.transform.dense.weight"),
         params + Off(layout, "cls.predictions.transform.dense.bias"), N, C, C);
  be.GeluErfForward(ws.atty.f32(), ws.resid2.f32(), N * C);
  be.LayerNormForwardEps(ws.ln1.f32(), ws.ln1_mean.f32(), ws.ln1_rstd.f32(), ws.atty.f32(),
                         params + Off(layout, "cls.predictions.transform.LayerNorm.weight"),
                         params + Off(layout, "cls.predictions.transform.LayerNorm.bias"), N, C, Eps(spec));
  return ws.ln1.f32();
}

void HeadNormBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                      const float* in, const float* dnormed, float* din, float* dparams, int64_t N,
                      LayerWorkspace& ws) {
  const int64_t C = spec.d_model;
  float* dg = ws.g2.f32();
  float* dh = ws.g3.f32();
  be.Zero(dg, N * C * sizeof(float));
  be.LayerNormBackward(dg, dparams + Off(layout, "cls.predictions.transform.LayerNorm.weight"),
                       dparams + Off(layout, "cls.predictions.transform.LayerNorm.bias"), dnormed, ws.atty.f32(),
                       params + Off(layout, "cls.predictions.transform.LayerNorm.weight"), ws.ln1_mean.f32(),
                       ws.ln1_rstd.f32(), N, C);
  be.Zero(dh, N * C * sizeof(float));
  be.GeluErfBackward(dh, ws.resid2.f32(), dg, N * C);
  const float* w = params + Off(layout, "cls.predictions.transform.dense.weight");
  be.Gemm(true, false, C, C, N, 1.0f, dh, C, in, C, 1.0f, dparams + Off(layout, "cls.predictions.transform.dense.weight"), C);
  be.BiasBackward(dparams + Off(layout, "cls.predictions.transform.dense.bias"), dh, N, C);
  be.Gemm(false, false, N, C, C, 1.0f, dh, C, w, C, 1.0f, din, C);  // din += dh @ W
}

// ---- sequence-classification head ------------------------------------------------------

float ClassifyForwardBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                              const float*, const float* in, const int32_t* targets, float loss_scale, float* din,
                              float* dparams, float*, int64_t B, int64_t T, LayerWorkspace& ws) {
  const int64_t C = spec.d_model, NL = spec.num_labels, N = B * T;
  const float* wp = params + Off(layout, "pooler.dense.weight");
  const float* wc = params + Off(layout, "classifier.weight");
  float* pooled = ws.atty.f32();  // (B,C)
  // The first token of each sequence: rows b*T of in, i.e. row stride T*C.
  Linear(be, ws.resid2.f32(), in, wp, params + Off(layout, "pooler.dense.bias"), B, C, C, T * C);
  be.TanhForward(pooled, ws.resid2.f32(), B * C);
  float* logits = ws.logits.f32();  // (B,NL): logits, then probs, then dlogits
  Linear(be, logits, pooled, wc, params + Off(layout, "classifier.bias"), B, C, NL);

  std::vector<int32_t> host_targets(static_cast<size_t>(N));
  be.CopyToHost(host_targets.data(), targets, host_targets.size() * sizeof(int32_t));
  std::vector<int32_t> labels(static_cast<size_t>(B));
  int64_t trained = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t l = host_targets[static_cast<size_t>(b * T)];
    L2L_CHECK(l == kernels::kIgnoreTarget || (l >= 0 && l < NL))
        << "classification head: sequence " << b << " has label " << l << ", outside [0, num_labels=" << NL << ")";
    labels[static_cast<size_t>(b)] = l;
    trained += l != kernels::kIgnoreTarget;
  }
  int32_t* d_labels = ws.g3.i32();
  be.CopyToDevice(d_labels, labels.data(), labels.size() * sizeof(int32_t));
  be.CrossEntropyForward(ws.losses.f32(), logits, logits, d_labels, B, NL);
  std::vector<float> losses(static_cast<size_t>(B));
  be.CopyToHost(losses.data(), ws.losses.data(), losses.size() * sizeof(float));
  double sum = 0.0;
  for (float l : losses) sum += l;
  const float mean_loss = trained > 0 ? static_cast<float>(sum / static_cast<double>(trained)) : 0.0f;
  if (din == nullptr) return mean_loss;

  L2L_CHECK(dparams != nullptr) << "HeadForwardBackward: din given without dparams";
  be.CrossEntropyBackward(logits, logits, d_labels, loss_scale / static_cast<float>(std::max<int64_t>(trained, 1)),
                          B, NL);
  float* dpooled = ws.g0.f32();
  LinearBackward(be, dpooled, dparams + Off(layout, "classifier.weight"), dparams + Off(layout, "classifier.bias"),
                 logits, pooled, wc, B, C, NL);
  float* dpre = ws.g1.f32();
  be.Zero(dpre, B * C * sizeof(float));
  be.TanhBackward(dpre, pooled, dpooled, B * C);
  float* dx = ws.g2.f32();
  be.Zero(dx, N * C * sizeof(float));
  LinearBackward(be, dx, dparams + Off(layout, "pooler.dense.weight"), dparams + Off(layout, "pooler.dense.bias"),
                 dpre, in, wp, B, C, C, T * C);  // only the first token's rows of dx
  be.CopyDeviceToDevice(din, dx, N * C * sizeof(float));
  return mean_loss;
}

bool OwnHead(const ModelSpec& spec) { return spec.num_labels > 0; }

}  // namespace

const FamilyLayers& BertLayers() {
  static const FamilyLayers kLayers{
      .family = ModelFamily::kBert,
      .alloc_workspace = &AllocWorkspace,
      .embedding_forward = &FamilyEmbeddingForward,
      .embedding_backward = &FamilyEmbeddingBackward,
      .block_forward = &FamilyBlockForward,
      .block_backward = &FamilyBlockBackward,
      .head_norm_forward = &HeadNormForward,
      .head_norm_backward = &HeadNormBackward,
      .embedding_backward_needs_params = true,
      .head_logits_bias = "cls.predictions.bias",
      .own_head = &OwnHead,
      .head_forward_backward = &ClassifyForwardBackward,
      .block_saved = {&LayerWorkspace::qkv, &LayerWorkspace::att, &LayerWorkspace::atty,
                      &LayerWorkspace::resid2, &LayerWorkspace::ln1, &LayerWorkspace::ln1_mean,
                      &LayerWorkspace::ln1_rstd, &LayerWorkspace::fch, &LayerWorkspace::fch_gelu,
                      &LayerWorkspace::ln2, &LayerWorkspace::ln2_mean, &LayerWorkspace::ln2_rstd},
  };
  return kLayers;
}

}  // namespace l2l::layers
