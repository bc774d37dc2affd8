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
// Dropout (lora.dropout = p > 0; ws.lora_dropout, set by BlockForward / BlockBackward from
// SequenceInputs::lora_dropout for training micro-batches only): x above is replaced by
// xd = dropout(x) (Backend::CounterDropout: kept elements times 1/(1-p)), written to
// ws.lora_x, an (N, in) scratch per call (ReserveLoraScratch allocates N * max in floats
// when dropout > 0); the base linear keeps reading x. The mask is keyed by
// (train.seed, step, block, micro-batch, weight, element) (common/lora.h
// LoraDropoutStream), so the backward regenerates the forward's mask instead of storing
// it, and the input gradient goes through the same mask: dx += mask/(1-p) * (s * t A)
// (s t A is first written to ws.lora_x). With p = 0 nothing of this runs.
// Thread-safety: one thread per Backend.
#pragma once

#include <cstdint>

#include "common/model_spec.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"

namespace l2l::layers {

// Allocates ws->lora_u and ws->lora_t, (N, r) each, for the adapters of `layouts` (their
// largest lora_r) at the workspace's shape (N = B*T), and with dropout > 0 (the job's
// lora.dropout) ws->lora_x, (N, in) for the largest adapter input width; nothing when no
// layout has adapters.
Status ReserveLoraScratch(kernels::Backend* backend, const std::vector<LayerLayout>& layouts,
                          LayerWorkspace* ws, double dropout);

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
