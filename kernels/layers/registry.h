// The kernel half of the model-family registry: each family's layer implementations
// (composed of Backend ops) in one table entry, looked up by ModelFamily. The metadata
// half (layouts, names, init) is common/models/registry.h. layers.h's functions dispatch
// here; one file per family defines its entry (gpt2.cc, llama.cc), registry.cc lists them.
//
// Also the helpers the family files share (views, checks, linear layers, the head's
// cross-entropy). Thread-safety: immutable statics and pure functions of their arguments.
#pragma once

#include <cstdint>

#include "common/model_spec.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"

namespace l2l::layers {

struct FamilyLayers {
  ModelFamily family;
  // Allocates the regions of `ws` the family uses for micro-batches (B, T) and fills any
  // constant tables (B, T already validated against spec).
  Status (*alloc_workspace)(kernels::Backend* be, const ModelSpec& spec, int64_t B, int64_t T,
                            LayerWorkspace* ws);
  void (*embedding_forward)(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                            const float* params, const int32_t* tokens, float* out, int64_t B,
                            int64_t T);
  void (*embedding_backward)(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                             const int32_t* tokens, const float* dout, float* dparams, int64_t B,
                             int64_t T);
  void (*block_forward)(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                        const float* params, const float* in, float* out, int64_t B, int64_t T,
                        LayerWorkspace& ws);
  void (*block_backward)(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                         const float* params, const float* in, const float* dout, float* din,
                         float* dparams, int64_t B, int64_t T, LayerWorkspace& ws);
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
};

// The entry of `family`.
const FamilyLayers& LayersFor(ModelFamily family);
const FamilyLayers& Gpt2Layers();
const FamilyLayers& LlamaLayers();

// ---- helpers shared by the family files ----------------------------------------------------

// Offset (floats) of the view named `suffix`; a missing view is a layout/kind mismatch.
size_t Off(const LayerLayout& layout, const char* suffix);
void CheckKind(const LayerLayout& layout, LayerKind kind, const char* fn);
void CheckFits(const LayerWorkspace& ws, int64_t B, int64_t T, const char* fn);
// Allocates `bytes` into *buf with a message naming the workspace.
Status AllocInto(kernels::Backend* be, kernels::DeviceBuffer* buf, size_t bytes);

}  // namespace l2l::layers
