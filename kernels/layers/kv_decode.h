// KvDecoder: next-token probabilities of a decoder model with a key/value cache, for
// sampling (l2l-sample, l2l chat). The prompt runs once through the ordinary layers
// (layers::EmbeddingForward / BlockForward, B=1, T=prompt length: the prefill), each
// block's keys and values (rotated, for rotary families) are kept; every later token runs
// alone through the family's block_decode, which attends to the cache. Work per token is
// one row through every GEMM plus attention over the cached positions, instead of the
// whole context again.
//
// Built only from Backend ops (Gemm with strided operands, the cross-entropy op as a row
// softmax, copies), so it runs on every backend (CPU; CUDA, and the CUDA emulator in
// CI). Families: those whose kernels/layers/registry.h entry has block_decode (GPT-2,
// Llama/Qwen2/Qwen3/Mistral/SmolLM/Mixtral, sliding windows included, Gemma 3); an encoder
// (BERT) is refused.
//
// NextProbs(context) keeps the semantics of a full recompute of `context`: when the
// cache holds a prefix of it, only the rest runs; otherwise (the caller's window slid,
// or another context) the cache is rebuilt from `context` by a prefill. Results equal the
// full forward up to fp32 rounding (other GEMM shapes, another attention summation
// order); tests/kernels/kv_decode_test.cc holds the bound.
//
// Memory: 2 x n_layer x max_len x n_kv_heads x head_dim floats of cache, one layer
// workspace for (1, max_len) with one row of head logits, two (max_len, C) activation
// buffers, all on the backend
// (max_len: the longest context asked for, at most seq_len).
// Ownership: borrows the backend and the weights (device pointers, valid for its life).
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/model_spec.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/layers/layers.h"

namespace l2l::layers {

// One block's cache and the position a decode step writes (see registry.h block_decode).
struct KvStep {
  float* k = nullptr;       // (>pos, NKV*hs) keys of positions [0, pos]
  float* v = nullptr;       // (>pos, NKV*hs) values
  float* scores = nullptr;  // (NH, >pos) scratch: scores, then probabilities
  float* losses = nullptr;  // (NH) scratch of the softmax op
  const int32_t* zero_targets = nullptr;  // (NH) zeros
  int64_t pos = 0;          // the new token's position
};

// For block_decode: appends the new row's k and v (in qkv (W) = q | k | v with NH and
// NKV heads of hs) to the cache at kv.pos, then out (NH*hs) = causal attention of q over
// positions [0, kv.pos]: per kv group, scores = q_g K_g^T / sqrt(hs), softmax, P V_g.
// window > 0 (a sliding block): only positions (kv.pos - window, kv.pos].
void AttendCached(kernels::Backend& be, const float* qkv, int64_t NH, int64_t NKV, int64_t hs, const KvStep& kv,
                  float* out, int64_t window = 0);

class KvDecoder {
 public:
  // params: one device pointer per layer (BuildLayout(spec) order), fp32. max_len: the
  // longest context it will be asked for (1..seq_len; 0 = seq_len), which sizes the cache
  // and the workspace.
  static Result<std::unique_ptr<KvDecoder>> Create(kernels::Backend* be, const ModelSpec& spec,
                                                   std::vector<const float*> params, int64_t max_len = 0);
  // Probabilities (V) of the token after `context` (1 <= size <= max_len, ids < V).
  Result<std::vector<float>> NextProbs(const std::vector<int32_t>& context);
  // Positions in the cache, and how many tokens ran through prefill / decode so far.
  int64_t cached() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t prefilled_tokens() const { return prefilled_; }
  int64_t decoded_tokens() const { return decoded_; }

 private:
  KvDecoder(kernels::Backend* be, const ModelSpec& spec, std::vector<const float*> params, int64_t max_len);
  Status Init();
  void Prefill(const std::vector<int32_t>& tokens);
  void Decode(int32_t token);
  std::vector<float> LastProbs(const float* hidden_row);

  kernels::Backend* be_;
  ModelSpec spec_;
  std::vector<LayerLayout> layouts_;
  std::vector<const float*> params_;
  std::unique_ptr<LayerWorkspace> ws_;
  std::vector<kernels::DeviceBuffer> k_, v_;  // per block (seq_len, NKV*hs)
  kernels::DeviceBuffer act_a_, act_b_, tokens_dev_, scores_, losses_, zero_targets_, probs_;
  std::vector<int32_t> tokens_;  // the cached positions' ids
  std::vector<float> last_;      // probabilities after tokens_
  int64_t max_len_ = 0;
  int64_t prefilled_ = 0, decoded_ = 0;
};

}  // namespace l2l::layers
