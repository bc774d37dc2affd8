// The kernel half of the model-family registry: each family's layer implementations
// (composed of Backend ops) in one table entry, looked up by ModelFamily. The metadata
// half (layouts, names, init) is common/models/registry.h. layers.h's functions dispatch
// here; one file per family defines its entry (gpt2.cc, llama.cc, bert.cc, gemma3.cc), registry.cc lists them.
//
// Also the helpers the family files share (views, checks, linear layers, the head's
// cross-entropy). Thread-safety: immutable statics and pure functions of their arguments.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"

namespace l2l::layers {

struct KvStep;  // kv_decode.h

struct FamilyLayers {
  ModelFamily family;
  // Allocates the regions of `ws` the family uses for micro-batches (B, T) and fills any
  // constant tables (B, T already validated against spec).
  Status (*alloc_workspace)(kernels::Backend* be, const ModelSpec& spec, int64_t B, int64_t T,
                            LayerWorkspace* ws);
  // `seq` and `ws` as layers.h's EmbeddingForward/EmbeddingBackward pass them (params and
  // ws may be null for the families that do not read them).
  void (*embedding_forward)(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                            const float* params, const int32_t* tokens, float* out, int64_t B,
                            int64_t T, const SequenceInputs& seq, LayerWorkspace* ws);
  void (*embedding_backward)(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                             const float* params, const int32_t* tokens, const float* dout,
                             float* dparams, int64_t B, int64_t T, const SequenceInputs& seq,
                             LayerWorkspace* ws);
  void (*block_forward)(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                        const float* params, const float* in, float* out, int64_t B, int64_t T,
                        LayerWorkspace& ws, const SequenceInputs& seq);
  void (*block_backward)(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                         const float* params, const float* in, const float* dout, float* din,
                         float* dparams, int64_t B, int64_t T, LayerWorkspace& ws,
                         const SequenceInputs& seq, bool recompute);
  // normed (N,C) = the final norm of in (N,C), written into ws (its own region).
  const float* (*head_norm_forward)(kernels::Backend& be, const ModelSpec& spec,
                                    const LayerLayout& layout, const float* params,
                                    const float* in, int64_t N, LayerWorkspace& ws);
  // din (N,C) += d(norm)/d(in) applied to dnormed; dparams (head) += the norm's gradient.
  // Uses what head_norm_forward saved in ws.
  void (*head_norm_backward)(kernels::Backend& be, const ModelSpec& spec,
                             const LayerLayout& layout, const float* params, const float* in,
                             const float* dnormed, float* din, float* dparams, int64_t N,
                             LayerWorkspace& ws);
  // embedding_backward reads `params` (and so the relay must hold layer 0 for it).
  bool embedding_backward_needs_params = false;
  // Optional (nullptr: none): the head's vector (V) added to every logits row (BERT's
  // decoder bias, "cls.predictions.bias"); its gradient is the column sum of dlogits.
  const char* head_logits_bias = nullptr;
  // Optional (nullptr: never): whether `spec`'s head is the family's own
  // head_forward_backward instead of the shared norm -> logits -> cross-entropy head.
  bool (*own_head)(const ModelSpec& spec) = nullptr;
  // The whole of HeadForwardBackward for a head that is not a language-model head (BERT's
  // sequence classification), same contract; used when own_head(spec). HeadProbs refuses
  // such a spec.
  float (*head_forward_backward)(kernels::Backend& be, const ModelSpec& spec,
                                 const LayerLayout& layout, const float* params, const float* wte,
                                 const float* in, const int32_t* targets, float loss_scale,
                                 float* din, float* dparams, float* dwte, int64_t B, int64_t T,
                                 LayerWorkspace& ws) = nullptr;
  // The workspace regions block_forward leaves filled and block_backward reads when called
  // with recompute=false (what it would otherwise recompute from the input). Empty: the
  // family always recomputes (SavedActivations unsupported).
  std::vector<kernels::DeviceBuffer LayerWorkspace::*> block_saved;
  // Optional (nullptr: no KV-cache decoding): block_forward for ONE new token at position
  // kv.pos (B = T = 1): in, out (1,C); appends its k and v to kv's cache and attends over
  // positions [0, kv.pos] (AttendCached, kv_decode.h). The family's ws.qkv after
  // block_forward must hold the (rotated) q|k|v rows, NH then NKV then NKV heads of hs:
  // KvDecoder's prefill copies k and v from there.
  void (*block_decode)(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout, const float* params,
                       const float* in, float* out, LayerWorkspace& ws, const KvStep& kv) = nullptr;
};

// The entry of `family`.
const FamilyLayers& LayersFor(ModelFamily family);
const FamilyLayers& Gpt2Layers();
const FamilyLayers& LlamaLayers();
const FamilyLayers& BertLayers();
const FamilyLayers& Gemma3Layers();

// ---- helpers shared by the family files ----------------------------------------------------

// Offset (floats) of the view named `suffix`; a missing view is a layout/kind mismatch.
size_t Off(const LayerLayout& layout, const char* suffix);
void CheckKind(const LayerLayout& layout, LayerKind kind, const char* fn);
void CheckFits(const LayerWorkspace& ws, int64_t B, int64_t T, const char* fn);
// Allocates `bytes` into *buf with a message naming the workspace.
Status AllocInto(kernels::Backend* be, kernels::DeviceBuffer* buf, size_t bytes);

// For one block call (the backward with its recompute; the forward with LoRA adapters,
// whose GEMMs read the layers' inputs again): the bf16 copies of the
// activations its weight-gradient GEMMs read again after the rest of the backward ran
// (norm outputs, the attention output, the MLP activation), held from their producer to
// the end of the call (Backend::HoldBf16Copy; a no-op but on CUDA's bf16 GEMM mode). Hold
// only a workspace region that, within the call, nothing but its producer op (a norm, the
// attention, the activation; or a GEMM, a Copy2D, a copy-queue transfer) writes:
// tests/gpu/held_copies_test.cc (each family's block with reuse on and off, equal bit for
// bit) is what catches a region written otherwise.
class HeldBf16Copies {
 public:
  struct Region {
    const float* f32;
    int64_t n;
  };
  HeldBf16Copies(kernels::Backend& be, std::vector<Region> regions) : be_(be), regions_(std::move(regions)) {
    for (const Region& r : regions_) be_.HoldBf16Copy(r.f32, r.n);
  }
  ~HeldBf16Copies() {
    for (const Region& r : regions_) be_.ReleaseBf16Copy(r.f32);
  }
  HeldBf16Copies(const HeldBf16Copies&) = delete;
  HeldBf16Copies& operator=(const HeldBf16Copies&) = delete;

 private:
  kernels::Backend& be_;
  std::vector<Region> regions_;
};

}  // namespace l2l::layers
