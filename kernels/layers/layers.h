// The three layer kinds of a model (embedding, block, head) as the relay sees them: each
// is a function of (its flat fp32 parameter buffer, its input) -> output, and a backward
// that RECOMPUTES its internals from the stashed input (so nothing but layer outputs is
// kept between forward and backward) unless the forward kept a block's intermediates in a
// SavedActivations, from which the backward then runs without recomputing. Views inside the flat buffer come from
// common/model_spec.h's LayerLayout. The functions below dispatch on spec.family to the
// family's kernels (kernels/layers/registry.h; one file per family: gpt2.cc, llama.cc, bert.cc).
//
// Ownership: callers own every buffer (Backend device memory); a LayerWorkspace holds the
// per-micro-batch scratch and is reused across layers and micro-batches.
// Gradient contract: parameter gradients ACCUMULATE (+=) so one buffer sums a layer's
// gradient over all micro-batches; input gradients are OVERWRITTEN.
// Thread-safety: one thread per Backend.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model_spec.h"
#include "common/status.h"
#include "kernels/backend.h"

namespace l2l::layers {

// LoRA adapter dropout for one TRAINING micro-batch (kernels/layers/lora.h; the mask's
// key is documented at common/lora.h LoraDropoutStream). p = 0 (the default) is none:
// evaluation, sampling, KV decoding and full-parameter training leave it so, and then no
// mask work is done at all.
struct LoraDropout {
  double p = 0;             // lora.dropout, in [0, 1)
  uint64_t seed = 0;        // train.seed
  int64_t step = 0;         // the optimizer step the micro-batch belongs to (0-based)
  int64_t micro_batch = 0;  // its index among the step's micro-batches of ALL workers:
                            // data_rank * train.micro_batches + local index
};

// Scratch for one micro-batch of shape (B, T) through any layer of `spec`.
// Sized for the largest need: block internals (ln, qkv, attention probabilities, MLP)
// and the head's logits/probabilities (B,T,V). The family allocates the regions it uses
// (shapes below are GPT-2's; Llama's are in kernels/layers/llama.cc); the rest stay empty.
class LayerWorkspace {
 public:
  // head_rows: rows of the LM head's logits chunk (ws.logits is head_rows x V floats);
  // 0 = HeadChunkRows(spec, B * T), the L2L_HEAD_CHUNK_MB budget.
  static Result<LayerWorkspace> Create(kernels::Backend* backend, const ModelSpec& spec, int64_t B,
                                       int64_t T, int64_t head_rows = 0);
  // Sets the micro-batch shape (for the families' workspace allocators).
  void SetShape(int64_t B, int64_t T) {
    B_ = B;
    T_ = T;
  }
  int64_t B() const { return B_; }
  int64_t T() const { return T_; }
  // The LM head computes its logits, softmax and cross-entropy head_rows() rows at a time
  // (HeadForwardBackward, HeadProbs): no (B*T, V) logits tensor exists when it is < B*T.
  int64_t head_rows() const { return head_rows_; }
  void SetHeadRows(int64_t rows) { head_rows_ = rows; }
  size_t bytes() const;  // device bytes held

  // Named scratch regions (device pointers), valid for the workspace's lifetime.
  // Shapes with N = B*T.
  kernels::DeviceBuffer ln1, ln1_mean, ln1_rstd;   // (N,C) (N) (N)
  kernels::DeviceBuffer qkv;                       // (N,3C)
  kernels::DeviceBuffer att;                       // causal: Backend::CausalAttentionFloats; BERT: MaskedAttentionFloats
  kernels::DeviceBuffer att_scratch;               // causal: ...ScratchFloats; BERT: (B,NH,T,T)
  kernels::DeviceBuffer atty;                      // (N,C)
  kernels::DeviceBuffer resid2;                    // (N,C) input + attention branch
  kernels::DeviceBuffer ln2, ln2_mean, ln2_rstd;   // (N,C) (N) (N)
  kernels::DeviceBuffer fch, fch_gelu;             // (N,F) (N,F)
  kernels::DeviceBuffer logits;                    // (head_rows,V) logits, then probs, then dlogits
  kernels::DeviceBuffer losses;                    // (N)
  kernels::DeviceBuffer g0, g1, g2, g3;            // (N, max(3C,F)) gradient scratch
  kernels::DeviceBuffer rope_cos, rope_sin;        // (T, hs/2) rotary tables (Llama)
  // Mixture of experts (kernels/layers/moe.h; only with spec.num_experts > 0), k = experts
  // per token: router logits / their gradient (N,E); the expert-grouped token rows (N*k
  // int32), their weights and the weights' gradients (N*k); gathered rows, expert output,
  // gradient rows (N,C) each.
  kernels::DeviceBuffer moe_router, moe_idx, moe_w, moe_dw, moe_x, moe_y, moe_g;
  kernels::DeviceBuffer lora_u, lora_t;            // (N, r) LoRA scratch (kernels/layers/lora.h
                                                   // ReserveLoraScratch); empty without LoRA
  kernels::DeviceBuffer lora_x;                    // (N, max adapter in) dropped adapter input;
                                                   // empty unless lora.dropout > 0
  // The LoRA dropout of the block call in progress: BlockForward / BlockBackward set it
  // from SequenceInputs::lora_dropout for the call's duration and reset it to none after,
  // so the adapters (kernels/layers/lora.h) read it without a parameter of their own.
  LoraDropout lora_dropout = {};

 private:
  int64_t B_ = 0, T_ = 0, head_rows_ = 0;
};

// Rows per chunk of the LM head for N = B*T rows: min(N, max(1, budget / (V * 4 bytes)))
// with budget = L2L_HEAD_CHUNK_MB MiB (common/env.h; default 256). A bad value of the
// variable is an error naming it.
Result<int64_t> HeadChunkRows(const ModelSpec& spec, int64_t N);

// Per-micro-batch inputs beside the token ids, read by the families that use them (BERT):
// device pointers to (B,T) int32 arrays, valid during the call. GPT-2 and Llama ignore them.
struct MoeStats;  // moe.h

struct SequenceInputs {
  const int32_t* token_types = nullptr;     // segment ids in [0, type_vocab_size); nullptr: all 0
  const int32_t* attention_mask = nullptr;  // 1 = real token, 0 = padding; nullptr: all real
  // Position of the first token (KV-cache decoding, kernels/layers/kv_decode.h): GPT-2's
  // embedding adds wpe[position_offset + t]. Blocks ignore it (their block_decode takes
  // the position).
  int64_t position_offset = 0;
  // Mixture-of-experts models: the micro-batch's routing statistics (kernels/layers/moe.h),
  // filled by BlockForward and read by BlockBackward (the aux loss's gradient needs every
  // block's counts; MoeStats::touched says which experts got tokens). nullptr: not recorded
  // (evaluation, decoding); a backward with spec.output_router_logits then aborts.
  MoeStats* moe = nullptr;
  // LoRA adapter dropout of a training micro-batch (blocks only); default: none.
  LoraDropout lora_dropout = {};
};

// ---- Embedding (layer 0): tokens -> hidden --------------------------------------
// out (B,T,C) = wte[tokens] (+ wpe[0..T) for GPT-2). tokens (B,T) int32 device memory.
// BERT: out = LayerNorm(word[tokens] + position[t] + token_type[seq.token_types]); it
// needs `ws` (scratch for the sum and the norm's statistics).
void EmbeddingForward(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                      const float* params, const int32_t* tokens, float* out, int64_t B, int64_t T,
                      const SequenceInputs& seq = {}, LayerWorkspace* ws = nullptr);
// dparams (layout.numel) += gradient of the embedding's tensors from dout (B,T,C). BERT
// recomputes its LayerNorm, so it also needs the layer's `params` and `ws`; Gemma 3 needs
// `ws` (scratch for its sqrt(C)-scaled gradient).
void EmbeddingBackward(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                       const int32_t* tokens, const float* dout, float* dparams, int64_t B, int64_t T,
                       const SequenceInputs& seq = {}, const float* params = nullptr,
                       LayerWorkspace* ws = nullptr);

// Whether EmbeddingBackward needs the layer's params (it recomputes from them: BERT); the
// relay fetches layer 0 again for it then.
bool EmbeddingBackwardNeedsParams(const ModelSpec& spec);

// A block's forward intermediates (the workspace regions its backward reads: norm outputs
// and statistics, qkv, attention probabilities and output, the residual after attention,
// MLP pre- and post-activation), kept from BlockForward to BlockBackward for one (block,
// micro-batch). Holding them costs Bytes(ws) of backend memory; the backward then skips
// the recompute and runs the same kernels on the same values, so its gradients are
// bit-identical to the recomputing backward's.
// The buffers are exchanged with the workspace's (no copies): BlockForward(save) leaves
// the intermediates here and fresh buffers in `ws`; BlockBackward(saved) moves them back
// into `ws` for the backward and takes the workspace's buffers in exchange (then empty()).
// Every SavedActivations used with a workspace must come from Create() with that
// workspace. Ownership: owns its buffers (Backend memory). Thread-safety: one thread.
class SavedActivations {
 public:
  // Whether `spec`'s family can keep its intermediates (else BlockBackward always recomputes).
  static bool Supported(const ModelSpec& spec);
  // Backend bytes one SavedActivations of `ws` holds (0 when !Supported).
  static size_t Bytes(const ModelSpec& spec, const LayerWorkspace& ws);
  static Result<SavedActivations> Create(kernels::Backend* backend, const ModelSpec& spec,
                                         const LayerWorkspace& ws);
  size_t bytes() const;
  // True between a BlockForward that saved into it and the BlockBackward that used it.
  bool filled() const { return filled_; }
  // Forgets a kept forward that will not be used (the next BlockForward may save again).
  void Discard() { filled_ = false; }
  // For BlockForward/BlockBackward: swaps the kept regions with ws's and sets filled().
  void Exchange(const ModelSpec& spec, LayerWorkspace& ws, bool filled);

 private:
  std::vector<kernels::DeviceBuffer> bufs_;
  bool filled_ = false;
};

// ---- Transformer block: hidden -> hidden --------------------------------------------
// GPT-2: x1 = x + attn_proj(attention(c_attn(ln_1(x)))); out = x1 + c_proj(gelu(c_fc(ln_2(x1)))).
// Llama: x1 = x + o_proj(gqa(rope(qkv(rms_1(x))))); out = x1 + down(silu(gate(rms_2(x1))) * up(..)).
// Gemma 3: x1 = x + rms_pa(o_proj(gqa(rope(qk_norm(qkv(rms_in(x))))))); out = x1 +
//   rms_pf(down(gelu_tanh(gate(rms_ff(x1))) * up(..))) (kernels/layers/gemma3.cc).
// BERT (post-LN, bidirectional, padded keys masked by seq.attention_mask):
//   x1 = LN_1(x + dense(attention(qkv(x)))); out = LN_2(x1 + out_dense(gelu(inter_dense(x1)))).
// save != nullptr (a SavedActivations of this ws, not filled): the block's intermediates
// are left in *save for BlockBackward.
void BlockForward(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                  const float* params, const float* in, float* out, int64_t B, int64_t T,
                  LayerWorkspace& ws, const SequenceInputs& seq = {},
                  SavedActivations* save = nullptr);
// Recomputes the forward internals from `in` (or, with `saved` filled by this block's
// BlockForward on the same input, takes them from there), then: din (B,T,C) = dL/din
// (overwritten), dparams (layout.numel) += dL/dparams. `saved` is emptied.
void BlockBackward(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                   const float* params, const float* in, const float* dout, float* din,
                   float* dparams, int64_t B, int64_t T, LayerWorkspace& ws,
                   const SequenceInputs& seq = {}, SavedActivations* saved = nullptr);

// ---- Head (last layer): hidden -> loss ----------------------------------------------
// logits = norm(in) @ W^T with W = the embedding table (tied; `wte` points at layer 0's
// EmbeddingTable view) or the head's own lm_head.weight (untied; `wte` ignored). norm is
// ln_f (GPT-2) or the final RMSNorm (Llama); BERT's masked-LM head uses its transform
// (dense + GELU + LayerNorm) as the norm and adds the decoder bias to the logits. BERT's
// classification head (num_labels > 0) instead classifies the pooled first token of each
// sequence against its target at position 0 (the mean is over sequences).
// targets (B,T) int32 device memory.
// The logits exist ws.head_rows() rows at a time (a chunked head): per chunk, the GEMM,
// the softmax cross-entropy and, with din, its backward (bias, dW +=, dnormed rows); the
// result equals the unchunked head up to the order of dW's sum over rows (bit for bit
// when one chunk holds all B*T rows).
// Returns the mean cross-entropy over the B*T tokens (synchronises to read it).
// When din != nullptr also computes the backward of loss * loss_scale:
//   din (B,T,C) overwritten; dparams (head layout.numel) +=; dwte (V,C) += (tied only).
// loss_scale is typically 1/micro_batches so gradients sum to the mini-batch mean.
float HeadForwardBackward(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
                          const float* params, const float* wte, const float* in,
                          const int32_t* targets, float loss_scale, float* din, float* dparams,
                          float* dwte, int64_t B, int64_t T, LayerWorkspace& ws);
// probs (B,T,V) = softmax of the head's logits (for sampling). probs is device memory.
void HeadProbs(kernels::Backend& be, const ModelSpec& spec, const LayerLayout& layout,
               const float* params, const float* wte, const float* in, float* probs, int64_t B,
               int64_t T, LayerWorkspace& ws);

}  // namespace l2l::layers
