// The layer functions of layers.h: checks, then the family's kernels from the registry
// (kernels/layers/registry.h). The head's logits and cross-entropy are the same for every
// family (only the final norm differs), so they live here.
#include "kernels/layers/layers.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/env.h"
#include "kernels/layers/registry.h"

namespace l2l::layers {

using kernels::Backend;
using kernels::DeviceBuffer;

// ---- shared helpers (registry.h) ---------------------------------------------------------

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

Status AllocInto(Backend* be, DeviceBuffer* buf, size_t bytes) {
  auto b = DeviceBuffer::Create(be, bytes);
  if (!b.ok()) return b.status().WithContext("allocating layer workspace");
  *buf = std::move(b).value();
  return Status::Ok();
}

// ---- LayerWorkspace --------------------------------------------------------------------

Result<int64_t> HeadChunkRows(const ModelSpec& spec, int64_t N) {
  L2L_ASSIGN_OR_RETURN(int64_t mib, EnvInt(EnvVar::kHeadChunkMb));
  if (mib < 1 || mib > (int64_t{1} << 30)) {
    return InvalidArgument("environment L2L_HEAD_CHUNK_MB=" + std::to_string(mib) + ": expected MiB in [1, 2^30]");
  }
  const int64_t row_bytes = std::max<int64_t>(1, spec.vocab_size) * static_cast<int64_t>(sizeof(float));
  return std::clamp<int64_t>((mib << 20) / row_bytes, 1, std::max<int64_t>(N, 1));
}

Result<LayerWorkspace> LayerWorkspace::Create(Backend* backend, const ModelSpec& spec, int64_t B,
                                              int64_t T, int64_t head_rows) {
  L2L_RETURN_IF_ERROR(spec.Validate());
  if (B <= 0 || T <= 0 || T > spec.seq_len) {
    return InvalidArgument("LayerWorkspace: micro-batch B=" + std::to_string(B) + " T=" +
                           std::to_string(T) + " must be positive with T <= model.seq_len=" +
                           std::to_string(spec.seq_len));
  }
  if (head_rows < 0) return InvalidArgument("LayerWorkspace: head_rows " + std::to_string(head_rows) + " < 0");
  if (head_rows == 0) {
    L2L_ASSIGN_OR_RETURN(head_rows, HeadChunkRows(spec, B * T));
  }
  LayerWorkspace ws;
  ws.SetShape(B, T);
  ws.SetHeadRows(std::min(head_rows, B * T));
  L2L_RETURN_IF_ERROR(LayersFor(spec.family).alloc_workspace(backend, spec, B, T, &ws));
  return ws;
}

size_t LayerWorkspace::bytes() const {
  size_t total = 0;
  for (const DeviceBuffer* b : {&ln1, &ln1_mean, &ln1_rstd, &qkv, &att, &att_scratch, &atty, &resid2,
                                &ln2, &ln2_mean, &ln2_rstd, &fch, &fch_gelu, &logits, &losses, &g0,
                                &g1, &g2, &g3, &rope_cos, &rope_sin, &moe_router, &moe_idx, &moe_w,
                                &moe_dw, &moe_x, &moe_y, &moe_g, &lora_u, &lora_t, &lora_x}) {
    total += b->bytes();
  }
  return total;
}

// ---- Embedding and blocks: the family's kernels --------------------------------------------

void EmbeddingForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                      const float* params, const int32_t* tokens, float* out, int64_t B, int64_t T,
                      const SequenceInputs& seq, LayerWorkspace* ws) {
  CheckKind(layout, LayerKind::kEmbedding, "EmbeddingForward");
  L2L_CHECK(seq.position_offset >= 0 && seq.position_offset + T <= spec.seq_len)
      << "EmbeddingForward: positions [" << seq.position_offset << ", " << seq.position_offset + T
      << ") beyond model.seq_len=" << spec.seq_len;
  if (ws != nullptr) CheckFits(*ws, B, T, "EmbeddingForward");
  LayersFor(spec.family).embedding_forward(be, spec, layout, params, tokens, out, B, T, seq, ws);
}

void EmbeddingBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                       const int32_t* tokens, const float* dout, float* dparams, int64_t B, int64_t T,
                       const SequenceInputs& seq, const float* params, LayerWorkspace* ws) {
  CheckKind(layout, LayerKind::kEmbedding, "EmbeddingBackward");
  L2L_CHECK(T <= spec.seq_len) << "EmbeddingBackward: T=" << T << " > model.seq_len=" << spec.seq_len;
  if (ws != nullptr) CheckFits(*ws, B, T, "EmbeddingBackward");
  LayersFor(spec.family).embedding_backward(be, spec, layout, params, tokens, dout, dparams, B, T, seq, ws);
}

bool EmbeddingBackwardNeedsParams(const ModelSpec& spec) {
  return LayersFor(spec.family).embedding_backward_needs_params;
}

namespace {
// Holds ws.lora_dropout at the call's value for a block call's duration (see layers.h).
class DropoutScope {
 public:
  DropoutScope(LayerWorkspace& ws, const LoraDropout& d) : ws_(ws) { ws_.lora_dropout = d; }
  ~DropoutScope() { ws_.lora_dropout = {}; }
  DropoutScope(const DropoutScope&) = delete;
  DropoutScope& operator=(const DropoutScope&) = delete;

 private:
  LayerWorkspace& ws_;
};
}  // namespace

void BlockForward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                  const float* params, const float* in, float* out, int64_t B, int64_t T,
                  LayerWorkspace& ws, const SequenceInputs& seq, SavedActivations* save) {
  CheckKind(layout, LayerKind::kBlock, "BlockForward");
  CheckFits(ws, B, T, "BlockForward");
  const DropoutScope dropout(ws, seq.lora_dropout);
  LayersFor(spec.family).block_forward(be, spec, layout, params, in, out, B, T, ws, seq);
  if (save != nullptr) {
    L2L_CHECK(!save->filled()) << "BlockForward: layer " << layout.index
                               << ": SavedActivations still holds an unused forward";
    save->Exchange(spec, ws, /*filled=*/true);
  }
}

void BlockBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                   const float* params, const float* in, const float* dout, float* din,
                   float* dparams, int64_t B, int64_t T, LayerWorkspace& ws, const SequenceInputs& seq,
                   SavedActivations* saved) {
  CheckKind(layout, LayerKind::kBlock, "BlockBackward");
  CheckFits(ws, B, T, "BlockBackward");
  const DropoutScope dropout(ws, seq.lora_dropout);
  if (saved != nullptr) {
    L2L_CHECK(saved->filled()) << "BlockBackward: layer " << layout.index
                               << ": SavedActivations holds no forward (BlockForward without save?)";
    saved->Exchange(spec, ws, /*filled=*/false);
  }
  LayersFor(spec.family).block_backward(be, spec, layout, params, in, dout, din, dparams, B, T, ws, seq,
                                        /*recompute=*/saved == nullptr);
}

// ---- SavedActivations ----------------------------------------------------------------------

bool SavedActivations::Supported(const ModelSpec& spec) { return !LayersFor(spec.family).block_saved.empty(); }

size_t SavedActivations::Bytes(const ModelSpec& spec, const LayerWorkspace& ws) {
  size_t total = 0;
  for (DeviceBuffer LayerWorkspace::*r : LayersFor(spec.family).block_saved) total += (ws.*r).bytes();
  return total;
}

Result<SavedActivations> SavedActivations::Create(Backend* backend, const ModelSpec& spec,
                                                  const LayerWorkspace& ws) {
  if (!Supported(spec)) {
    return InvalidArgument(std::string("SavedActivations: model.family=") + ToString(spec.family) +
                           " always recomputes its blocks");
  }
  SavedActivations s;
  for (DeviceBuffer LayerWorkspace::*r : LayersFor(spec.family).block_saved) {
    auto b = DeviceBuffer::Create(backend, (ws.*r).bytes());
    if (!b.ok()) return b.status().WithContext("allocating kept block activations");
    s.bufs_.push_back(std::move(b).value());
  }
  return s;
}

size_t SavedActivations::bytes() const {
  size_t total = 0;
  for (const DeviceBuffer& b : bufs_) total += b.bytes();
  return total;
}

void SavedActivations::Exchange(const ModelSpec& spec, LayerWorkspace& ws, bool filled) {
  const auto& regions = LayersFor(spec.family).block_saved;
  L2L_CHECK(regions.size() == bufs_.size()) << "SavedActivations made for another model family";
  for (size_t i = 0; i < regions.size(); ++i) {
    DeviceBuffer& w = ws.*regions[i];
    L2L_CHECK(w.bytes() == bufs_[i].bytes()) << "SavedActivations made for another workspace";
    std::swap(w, bufs_[i]);
  }
  filled_ = filled;
}

// ---- Head ------------------------------------------------------------------------------

namespace {

// The head's matrix (V,C): the embedding table (tied) or lm_head.weight.
const float* HeadMatrix(const ModelSpec& spec, const LayerLayout& layout, const float* params,
                        const float* wte) {
  const float* w = spec.tied_embeddings ? wte : params + Off(layout, "lm_head.weight");
  L2L_CHECK(w != nullptr) << "head of a tied model needs the embedding's table";
  return w;
}

// ws.logits (n,V) = normed[r0, r0+n) @ W^T (+ the family's logits bias): one chunk.
void ChunkLogits(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                 const float* w, const float* normed, int64_t r0, int64_t n, LayerWorkspace& ws) {
  const int64_t C = spec.d_model, V = spec.vocab_size;
  const FamilyLayers& fam = LayersFor(spec.family);
  be.Gemm(false, true, n, V, C, 1.0f, normed + r0 * C, C, w, C, 0.0f, ws.logits.f32(), V);
  if (fam.head_logits_bias != nullptr) be.AddBias(ws.logits.f32(), params + Off(layout, fam.head_logits_bias), n, V);
}

}  // namespace

float HeadForwardBackward(Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                          const float* params, const float* wte, const float* in,
                          const int32_t* targets, float loss_scale, float* din, float* dparams,
                          float* dwte, int64_t B, int64_t T, LayerWorkspace& ws) {
  CheckKind(layout, LayerKind::kHead, "HeadForwardBackward");
  CheckFits(ws, B, T, "HeadForwardBackward");
  const FamilyLayers& fam = LayersFor(spec.family);
  if (fam.own_head != nullptr && fam.own_head(spec)) {
    return fam.head_forward_backward(be, spec, layout, params, wte, in, targets, loss_scale, din, dparams, dwte, B,
                                     T, ws);
  }
  const int64_t C = spec.d_model, V = spec.vocab_size, N = B * T, R = ws.head_rows();
  L2L_CHECK(R >= 1) << "HeadForwardBackward: workspace without head rows";
  const float* w = HeadMatrix(spec, layout, params, wte);
  const float* normed = fam.head_norm_forward(be, spec, layout, params, in, N, ws);  // (N,C), a region of ws
  float* logits = ws.logits.f32();  // one chunk (<= R rows): logits, then probs (or dlogits)
  // Loss-masked positions (kIgnoreTarget) add nothing: the mean is over the trained
  // targets of this micro-batch (all N without a mask), and a micro-batch with none
  // contributes loss 0 and no gradient.
  std::vector<int32_t> host_targets(static_cast<size_t>(N));
  be.CopyToHost(host_targets.data(), targets, host_targets.size() * sizeof(int32_t));
  int64_t trained = 0;
  for (int32_t t : host_targets) trained += t != kernels::kIgnoreTarget;
  float* dw = nullptr;
  float* dnormed = nullptr;
  float* dbias = nullptr;
  if (din != nullptr) {
    L2L_CHECK(dparams != nullptr) << "HeadForwardBackward: din given without dparams";
    dw = spec.tied_embeddings ? dwte : dparams + Off(layout, "lm_head.weight");
    L2L_CHECK(dw != nullptr) << "HeadForwardBackward: a tied head needs dwte";
    dnormed = ws.g0.f32();  // (N,C)
    if (fam.head_logits_bias != nullptr) dbias = dparams + Off(layout, fam.head_logits_bias);
  }
  const float scale = loss_scale / static_cast<float>(std::max<int64_t>(trained, 1));
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t n = std::min(R, N - r0);
    ChunkLogits(be, spec, layout, params, w, normed, r0, n, ws);
    if (din == nullptr) {
      be.CrossEntropyForward(ws.losses.f32() + r0, logits, logits, targets + r0, n, V);
      continue;
    }
    be.CrossEntropyForwardBackward(ws.losses.f32() + r0, logits, logits, targets + r0, scale, n, V);
    if (dbias != nullptr) be.BiasBackward(dbias, logits, n, V);
    be.Gemm(true, false, V, C, n, 1.0f, logits, V, normed + r0 * C, C, 1.0f, dw, C);           // dW (V,C) +=
    be.Gemm(false, false, n, C, V, 1.0f, logits, V, w, C, 0.0f, dnormed + r0 * C, C);          // (n,C)
  }
  std::vector<float> losses(static_cast<size_t>(N));
  be.CopyToHost(losses.data(), ws.losses.data(), losses.size() * sizeof(float));
  double sum = 0.0;
  for (float l : losses) sum += l;
  const float mean_loss = trained > 0 ? static_cast<float>(sum / static_cast<double>(trained)) : 0.0f;
  if (din == nullptr) return mean_loss;

  float* acc = ws.g1.f32();
  be.Zero(acc, N * C * sizeof(float));
  LayersFor(spec.family).head_norm_backward(be, spec, layout, params, in, dnormed, acc, dparams, N, ws);
  be.CopyDeviceToDevice(din, acc, N * C * sizeof(float));
  return mean_loss;
}

void HeadProbs(Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
               const float* wte, const float* in, float* probs, int64_t B, int64_t T,
               LayerWorkspace& ws) {
  CheckKind(layout, LayerKind::kHead, "HeadProbs");
  CheckFits(ws, B, T, "HeadProbs");
  const FamilyLayers& fam = LayersFor(spec.family);
  L2L_CHECK(fam.own_head == nullptr || !fam.own_head(spec))
      << "HeadProbs: the " << ToString(spec.family) << " model's head (num_labels=" << spec.num_labels
      << ") is not a language-model head";
  const int64_t N = B * T, V = spec.vocab_size, R = ws.head_rows();
  L2L_CHECK(R >= 1) << "HeadProbs: workspace without head rows";
  const float* w = HeadMatrix(spec, layout, params, wte);
  const float* normed = fam.head_norm_forward(be, spec, layout, params, in, N, ws);
  // The backend's softmax is the cross-entropy op; all-zero bits are int32 targets 0,
  // whose losses we ignore.
  int32_t* zero_targets = ws.g3.i32();
  be.Zero(zero_targets, N * sizeof(int32_t));
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t n = std::min(R, N - r0);
    ChunkLogits(be, spec, layout, params, w, normed, r0, n, ws);
    be.CrossEntropyForward(ws.losses.f32() + r0, probs + r0 * V, ws.logits.f32(), zero_targets, n, V);
  }
}

}  // namespace l2l::layers
