// KvDecoder and AttendCached (kernels/layers/kv_decode.h).
#include "kernels/layers/kv_decode.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "common/models/registry.h"
#include "kernels/layers/registry.h"

namespace l2l::layers {

using kernels::Backend;
using kernels::DeviceBuffer;

void AttendCached(Backend& be, const float* qkv, int64_t NH, int64_t NKV, int64_t hs, const KvStep& kv, float* out,
                  int64_t window) {
  const int64_t KW = NKV * hs, G = NH / NKV;
  const int64_t lo = window > 0 ? std::max<int64_t>(0, kv.pos - window + 1) : 0, len = kv.pos + 1 - lo;
  be.CopyDeviceToDevice(kv.k + kv.pos * KW, qkv + NH * hs, KW * sizeof(float));
  be.CopyDeviceToDevice(kv.v + kv.pos * KW, qkv + NH * hs + KW, KW * sizeof(float));
  const float* keys = kv.k + lo * KW;
  const float* values = kv.v + lo * KW;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t g = 0; g < NKV; ++g) {  // scores (G, len) = q_g (G, hs) K_g^T; K_g rows KW apart
    be.Gemm(false, true, G, len, hs, scale, qkv + g * G * hs, hs, keys + g * hs, KW, 0.0f, kv.scores + g * G * len,
            len);
  }
  // Row softmax of the (NH, len) scores, in place (the cross-entropy op against targets 0).
  be.CrossEntropyForward(kv.losses, kv.scores, kv.scores, kv.zero_targets, NH, len);
  for (int64_t g = 0; g < NKV; ++g) {  // out_g (G, hs) = P_g (G, len) V_g (len, hs)
    be.Gemm(false, false, G, hs, len, 1.0f, kv.scores + g * G * len, len, values + g * hs, KW, 0.0f, out + g * G * hs,
            hs);
  }
}

KvDecoder::KvDecoder(Backend* be, const ModelSpec& spec, std::vector<const float*> params, int64_t max_len)
    : be_(be), spec_(spec), layouts_(BuildLayout(spec)), params_(std::move(params)), max_len_(max_len) {}

Result<std::unique_ptr<KvDecoder>> KvDecoder::Create(Backend* be, const ModelSpec& spec,
                                                     std::vector<const float*> params, int64_t max_len) {
  L2L_RETURN_IF_ERROR(spec.Validate());
  if (LayersFor(spec.family).block_decode == nullptr) {
    return FailedPrecondition("a " + std::string(ToString(spec.family)) + " model has no KV-cache decoding" +
                              (models::IsEncoder(spec) ? " (not a causal decoder)" : " (not implemented yet)"));
  }
  if (params.size() != static_cast<size_t>(spec.n_layer + 2)) {
    return InvalidArgument("KvDecoder: " + std::to_string(params.size()) + " layers of weights, the model has " +
                           std::to_string(spec.n_layer + 2));
  }
  if (max_len < 0 || max_len > spec.seq_len) {
    return InvalidArgument("KvDecoder: max_len " + std::to_string(max_len) + " outside [0, seq_len=" +
                           std::to_string(spec.seq_len) + "]");
  }
  std::unique_ptr<KvDecoder> d(new KvDecoder(be, spec, std::move(params), max_len > 0 ? max_len : spec.seq_len));
  L2L_RETURN_IF_ERROR(d->Init());
  return d;
}

Status KvDecoder::Init() {
  const int64_t S = max_len_, C = spec_.d_model, NH = spec_.n_head;
  const int64_t KW = spec_.kv_heads() * spec_.head_dim();
  // The head only ever sees one row (the last position), so one row of logits.
  L2L_ASSIGN_OR_RETURN(LayerWorkspace ws, LayerWorkspace::Create(be_, spec_, 1, S, /*head_rows=*/1));
  ws_ = std::make_unique<LayerWorkspace>(std::move(ws));
  auto alloc = [&](DeviceBuffer* b, size_t bytes) -> Status {
    L2L_ASSIGN_OR_RETURN(*b, DeviceBuffer::Create(be_, bytes));
    return Status::Ok();
  };
  k_.resize(static_cast<size_t>(spec_.n_layer));
  v_.resize(static_cast<size_t>(spec_.n_layer));
  for (int64_t l = 0; l < spec_.n_layer; ++l) {
    L2L_RETURN_IF_ERROR(alloc(&k_[l], S * KW * sizeof(float)).WithContext("KV cache"));
    L2L_RETURN_IF_ERROR(alloc(&v_[l], S * KW * sizeof(float)).WithContext("KV cache"));
  }
  L2L_RETURN_IF_ERROR(alloc(&act_a_, S * C * sizeof(float)));
  L2L_RETURN_IF_ERROR(alloc(&act_b_, S * C * sizeof(float)));
  L2L_RETURN_IF_ERROR(alloc(&tokens_dev_, S * sizeof(int32_t)));
  L2L_RETURN_IF_ERROR(alloc(&scores_, NH * S * sizeof(float)));
  L2L_RETURN_IF_ERROR(alloc(&losses_, NH * sizeof(float)));
  L2L_RETURN_IF_ERROR(alloc(&zero_targets_, NH * sizeof(int32_t)));
  L2L_RETURN_IF_ERROR(alloc(&probs_, spec_.vocab_size * sizeof(float)));
  be_->Zero(zero_targets_.data(), NH * sizeof(int32_t));
  return Status::Ok();
}

std::vector<float> KvDecoder::LastProbs(const float* hidden_row) {
  const float* wte = params_[0] + EmbeddingTable(spec_, layouts_[0]).offset;
  HeadProbs(*be_, spec_, layouts_.back(), params_.back(), wte, hidden_row, probs_.f32(), 1, 1, *ws_);
  std::vector<float> p(static_cast<size_t>(spec_.vocab_size));
  be_->CopyToHost(p.data(), probs_.data(), p.size() * sizeof(float));
  return p;
}

void KvDecoder::Prefill(const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()), C = spec_.d_model, NH = spec_.n_head;
  const int64_t hs = spec_.head_dim(), KW = spec_.kv_heads() * hs, W = NH * hs + 2 * KW;
  be_->CopyToDevice(tokens_dev_.data(), tokens.data(), tokens.size() * sizeof(int32_t));
  float* a = act_a_.f32();
  float* b = act_b_.f32();
  EmbeddingForward(*be_, spec_, layouts_[0], params_[0], tokens_dev_.i32(), a, 1, n, {}, ws_.get());
  for (int64_t l = 0; l < spec_.n_layer; ++l) {
    BlockForward(*be_, spec_, layouts_[1 + l], params_[1 + l], a, b, 1, n, *ws_);
    // The block left its (rotated) q|k|v rows in ws.qkv: keep k and v.
    const float* qkv = ws_->qkv.f32();
    for (int64_t r = 0; r < n; ++r) {
      be_->CopyDeviceToDevice(k_[l].f32() + r * KW, qkv + r * W + NH * hs, KW * sizeof(float));
      be_->CopyDeviceToDevice(v_[l].f32() + r * KW, qkv + r * W + NH * hs + KW, KW * sizeof(float));
    }
    std::swap(a, b);
  }
  tokens_ = tokens;
  prefilled_ += n;
  last_ = LastProbs(a + (n - 1) * C);
}

void KvDecoder::Decode(int32_t token) {
  const int64_t pos = static_cast<int64_t>(tokens_.size());
  be_->CopyToDevice(tokens_dev_.data(), &token, sizeof(int32_t));
  float* a = act_a_.f32();
  float* b = act_b_.f32();
  SequenceInputs seq;
  seq.position_offset = pos;
  EmbeddingForward(*be_, spec_, layouts_[0], params_[0], tokens_dev_.i32(), a, 1, 1, seq, ws_.get());
  const FamilyLayers& fam = LayersFor(spec_.family);
  for (int64_t l = 0; l < spec_.n_layer; ++l) {
    const KvStep kv{k_[l].f32(), v_[l].f32(), scores_.f32(), losses_.f32(), zero_targets_.i32(), pos};
    fam.block_decode(*be_, spec_, layouts_[1 + l], params_[1 + l], a, b, *ws_, kv);
    std::swap(a, b);
  }
  tokens_.push_back(token);
  ++decoded_;
  last_ = LastProbs(a);
}

Result<std::vector<float>> KvDecoder::NextProbs(const std::vector<int32_t>& context) {
  const int64_t n = static_cast<int64_t>(context.size());
  if (n < 1 || n > max_len_) {
    return InvalidArgument("decoding context of " + std::to_string(n) + " tokens must be in [1, " +
                           std::to_string(max_len_) + "]");
  }
  for (int32_t t : context) {
    if (t < 0 || t >= spec_.vocab_size) {
      return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(spec_.vocab_size) + ")");
    }
  }
  const size_t have = tokens_.size();
  const bool prefix = have > 0 && have <= context.size() && std::equal(tokens_.begin(), tokens_.end(), context.begin());
  if (!prefix) {
    Prefill(context);
  } else {
    for (size_t i = have; i < context.size(); ++i) Decode(context[i]);
  }
  return last_;
}

}  // namespace l2l::layers
