// LoRA adapters inside a block's linears (common/lora.h has the layout): for a targeted
// linear with input x (N, in) and output y, y += s * (x A^T) B^T with A (r, in), B (out, r),
// s = layout.lora_scale; the backward adds dA, dB and the adapters' share of dx. Built
// from Backend::Gemm only, so every backend (CPU, CUDA, the emulator) runs it.
// The family kernels (gpt2.cc, llama.cc) call these beside each base linear; a layout
// without adapters (lora_r == 0) makes every call a no-op, so nothing changes for
// full-parameter training.
//
// Math per call (u, t: (N, r) workspace scratch):
//   forward   u = x A^T;  y[:, col:col+out] += s * u B^T
//   backward  u = x A^T (recomputed);  t = dy[:, col:col+out] B
//             dB += s * dy^T u;  dA += s * t^T x;  dx += s * t A
// Dropout is not applied here (lora.dropout > 0 is refused in this build).
// Thread-safety: one thread per Backend.
#pragma once

#include <cstdint>

#include "common/model_spec.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"

namespace l2l::layers {

// Allocates ws->lora_u and ws->lora_t for the adapters of `layouts` (their largest
// lora_r) at the workspace's shape; nothing when no layout has adapters.
Status ReserveLoraScratch(kernels::Backend* backend, const std::vector<LayerLayout>& layouts,
                          LayerWorkspace* ws);

// Whether the block's base tensors are frozen (the layout carries adapters): the family's
// backward then skips their weight gradients.
inline bool BaseFrozen(const LayerLayout& layout) { return layout.lora_r > 0; }

// Whether the block weight `weight` carries an adapter.
bool HasLora(const LayerLayout& layout, const char* weight);

// y (N, ldy) columns [col, col + out) += s * (x A^T) B^T for the adapter of the block
// weight `weight` ("self_attn.q_proj.weight"); nothing when it has none.
// x (N, in) with leading dimension ldx.
void LoraForward(kernels::Backend& be, const LayerLayout& layout, const float* params, const char* weight,
                 const float* x, int64_t ldx, int64_t N, float* y, int64_t ldy, int64_t col, LayerWorkspace& ws);

// The backward of LoraForward for dy (N, ldy) (its columns [col, col + out)): dA, dB in
// dparams +=; dx (N, in, leading dimension ldx) += the adapter's input gradient (dx may
// be nullptr). Nothing when the weight has no adapter.
void LoraBackward(kernels::Backend& be, const LayerLayout& layout, const float* params, float* dparams,
                  const char* weight, const float* x, int64_t ldx, const float* dy, int64_t ldy, int64_t col,
                  float* dx, int64_t N, LayerWorkspace& ws);

}  // namespace l2l::layers
