// ReferenceTrainer: whole-model training in one backend (the oracle). See
// worker/reference/reference_trainer.h.
#include "worker/reference/reference_trainer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "common/adamw.h"
#include "common/formats/model_io.h"
#include "common/formats/lora_export.h"
#include "common/formats/peft_adapter.h"
#include "common/logging.h"
#include "common/lora.h"
#include "common/lora_frozen.h"
#include "common/models/registry.h"
#include "kernels/layers/moe.h"
#include "kernels/layers/lora.h"

namespace l2l::worker {

using kernels::DeviceBuffer;

namespace {

Result<DeviceBuffer> Buffer(kernels::Backend* be, size_t bytes) {
  return DeviceBuffer::Create(be, bytes == 0 ? 64 : bytes);
}

}  // namespace

ReferenceTrainer::~ReferenceTrainer() {
  // Buffers must go before the backend that allocated them.
  kept_.clear();
  ws_.reset();
  acts_.clear();
  d_params_.clear();
  d_grads_.clear();
  d_tokens_ = DeviceBuffer();
  d_targets_ = DeviceBuffer();
  d_types_ = DeviceBuffer();
  d_mask_ = DeviceBuffer();
  d_dact_a_ = DeviceBuffer();
  d_dact_b_ = DeviceBuffer();
}

Result<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(const JobConfig& cfg,
                                                                   const ReferenceTrainerOptions& opts) {
  L2L_RETURN_IF_ERROR(cfg.model.Validate());
  std::vector<std::vector<float>> params;
  for (const LayerLayout& l : BuildLayout(cfg.model)) {
    params.emplace_back(l.numel);
    InitLayerParams(cfg.model, l, cfg.train.seed, params.back().data());
  }
  return Create(cfg, std::move(params), opts);
}

Result<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(const JobConfig& cfg,
                                                                   std::vector<std::vector<float>> params,
                                                                   const ReferenceTrainerOptions& opts) {
  std::unique_ptr<ReferenceTrainer> t(new ReferenceTrainer());
  L2L_RETURN_IF_ERROR(t->Init(cfg, std::move(params), opts));
  return t;
}

Status ReferenceTrainer::Init(const JobConfig& cfg, std::vector<std::vector<float>> params,
                              const ReferenceTrainerOptions& opts) {
  L2L_RETURN_IF_ERROR(cfg.Validate());
  cfg_ = cfg;
  budget_bytes_ = opts.activation_budget_bytes > 0 ? opts.activation_budget_bytes
                                                   : static_cast<size_t>(cfg.train.activation_budget_mb) << 20;
  layouts_ = BuildLoraLayout(cfg.model, cfg.lora);
  if (params.size() != layouts_.size()) {
    return InvalidArgument("initial weights have " + std::to_string(params.size()) + " layers, model has " +
                           std::to_string(layouts_.size()));
  }
  for (size_t l = 0; l < layouts_.size(); ++l) {
    if (cfg.lora.enabled && params[l].size() == BaseNumel(layouts_[l]) && params[l].size() != layouts_[l].numel) {
      // Base weights only: the adapters start as PEFT's (A kaiming-uniform, B = 0).
      params[l].resize(layouts_[l].numel, 0.0f);
      InitLoraAdapters(cfg.lora, layouts_[l], params[l].data());
    }
    if (params[l].size() != layouts_[l].numel) {
      return InvalidArgument("initial weights of layer " + std::to_string(l) + " (" +
                             LayerKindName(layouts_[l].kind) + ") have " + std::to_string(params[l].size()) +
                             " floats, layout needs " + std::to_string(layouts_[l].numel));
    }
    // The frozen base as the daemon holds it (bf16-rounded, block-quantized).
    L2L_RETURN_IF_ERROR(RoundToHeld(layouts_[l], cfg.lora, params[l].data()));
  }
  if (opts.device == "cpu") {
    L2L_ASSIGN_OR_RETURN(backend_, kernels::CreateCpuBackend(kernels::CpuBackendOptions{
                                       .num_threads = opts.num_threads, .gemm = opts.cpu_gemm}));
  } else {
    L2L_ASSIGN_OR_RETURN(backend_, kernels::CreateBackend(opts.device));
  }
  params_ = std::move(params);
  if (cfg.model.moe()) {
    touched_.assign(static_cast<size_t>(cfg.model.n_layer * cfg.model.num_experts), 0);
    expert_steps_.assign(touched_.size(), 0);
  }
  for (const LayerLayout& l : layouts_) {
    // AdamW moments for what trains: the whole layer, or a LoRA layer's trainable span.
    m_.emplace_back(TrainableRange(l).numel, 0.0f);
    v_.emplace_back(TrainableRange(l).numel, 0.0f);
    L2L_ASSIGN_OR_RETURN(DeviceBuffer p, Buffer(backend_.get(), l.numel * sizeof(float)));
    L2L_ASSIGN_OR_RETURN(DeviceBuffer g, Buffer(backend_.get(), l.numel * sizeof(float)));
    backend_->Zero(g.data(), l.numel * sizeof(float));
    d_params_.push_back(std::move(p));
    d_grads_.push_back(std::move(g));
  }
  UploadParams();
  return EnsureWorkspace(cfg.train.micro_batch_size, cfg.seq_len());
}

void ReferenceTrainer::UploadParams() {
  for (size_t l = 0; l < layouts_.size(); ++l) {
    backend_->CopyToDevice(d_params_[l].data(), params_[l].data(), layouts_[l].numel * sizeof(float));
  }
}

Status ReferenceTrainer::EnsureWorkspace(int64_t B, int64_t T) {
  if (ws_ && B == ws_B_ && T == ws_T_) return Status::Ok();
  if (B <= 0 || T <= 0) {
    return InvalidArgument("micro-batch shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
                           " must be positive");
  }
  kept_.clear();
  ws_.reset();
  acts_.clear();
  const size_t n = static_cast<size_t>(B * T);
  const size_t hidden = n * static_cast<size_t>(cfg_.model.d_model) * sizeof(float);
  L2L_ASSIGN_OR_RETURN(layers::LayerWorkspace ws, layers::LayerWorkspace::Create(backend_.get(), cfg_.model, B, T));
  ws_ = std::make_unique<layers::LayerWorkspace>(std::move(ws));
  L2L_RETURN_IF_ERROR(layers::ReserveLoraScratch(backend_.get(), layouts_, ws_.get(), cfg_.lora.dropout));
  L2L_ASSIGN_OR_RETURN(plan_, PlanActivations(*backend_, cfg_.model, *ws_, cfg_.train.recompute, budget_bytes_,
                                              /*micro_batches=*/1));
  for (int64_t i = 0; i < plan_.kept_blocks; ++i) {
    Result<layers::SavedActivations> k = layers::SavedActivations::Create(backend_.get(), cfg_.model, *ws_);
    if (!k.ok()) return k.status().WithContext("reference trainer: " + plan_.Describe(cfg_.model.n_layer, 1));
    kept_.push_back(std::move(k).value());
  }
  if (plan_.mode != RecomputeMode::kAlways) {
    L2L_LOG_INFO("reference trainer: {}", plan_.Describe(cfg_.model.n_layer, 1));
  }
  L2L_ASSIGN_OR_RETURN(d_tokens_, Buffer(backend_.get(), n * sizeof(int32_t)));
  L2L_ASSIGN_OR_RETURN(d_targets_, Buffer(backend_.get(), n * sizeof(int32_t)));
  L2L_ASSIGN_OR_RETURN(d_types_, Buffer(backend_.get(), n * sizeof(int32_t)));
  L2L_ASSIGN_OR_RETURN(d_mask_, Buffer(backend_.get(), n * sizeof(int32_t)));
  L2L_ASSIGN_OR_RETURN(d_dact_a_, Buffer(backend_.get(), hidden));
  L2L_ASSIGN_OR_RETURN(d_dact_b_, Buffer(backend_.get(), hidden));
  for (int64_t i = 0; i <= cfg_.model.n_layer; ++i) {
    L2L_ASSIGN_OR_RETURN(DeviceBuffer a, Buffer(backend_.get(), hidden));
    acts_.push_back(std::move(a));
  }
  ws_B_ = B;
  ws_T_ = T;
  return Status::Ok();
}

Status ReferenceTrainer::CheckBatch(const MicroBatch& mb, size_t index) const {
  const std::string where = "micro-batch " + std::to_string(index);
  if (mb.B <= 0 || mb.T <= 0) {
    return InvalidArgument(where + ": shape B=" + std::to_string(mb.B) + " T=" + std::to_string(mb.T) +
                           " must be positive");
  }
  if (mb.T > cfg_.model.seq_len) {
    return InvalidArgument(where + ": T=" + std::to_string(mb.T) + " exceeds model.seq_len=" +
                           std::to_string(cfg_.model.seq_len));
  }
  const size_t n = static_cast<size_t>(mb.B * mb.T);
  if (mb.inputs.size() != n || mb.targets.size() != n) {
    return InvalidArgument(where + ": expected " + std::to_string(n) + " inputs and targets (B*T), got " +
                           std::to_string(mb.inputs.size()) + " and " + std::to_string(mb.targets.size()));
  }
  const int64_t V = cfg_.model.vocab_size;
  for (size_t i = 0; i < n; ++i) {
    const bool target_ok = mb.targets[i] == kernels::kIgnoreTarget || (mb.targets[i] >= 0 && mb.targets[i] < V);
    if (mb.inputs[i] < 0 || mb.inputs[i] >= V || !target_ok) {
      return OutOfRange(where + ": token at position " + std::to_string(i) + " (input " +
                        std::to_string(mb.inputs[i]) + ", target " + std::to_string(mb.targets[i]) +
                        ") is outside [0, model.vocab_size=" + std::to_string(V) + ")");
    }
  }
  return CheckSequenceInputs(cfg_.model, mb, where);
}

float ReferenceTrainer::RunMicroBatch(const MicroBatch& mb, int64_t index, float loss_scale, bool backward) {
  kernels::Backend& be = *backend_;
  const ModelSpec& spec = cfg_.model;
  const int64_t B = mb.B, T = mb.T, L = spec.n_layer;
  const size_t n = static_cast<size_t>(B * T);
  be.CopyToDevice(d_targets_.data(), mb.targets.data(), n * sizeof(int32_t));
  // Forward: acts_[0] = embedding, acts_[i+1] = block i (acts_[i]).
  layers::SequenceInputs seq = EmbedInputs(mb);
  if (backward && cfg_.lora.enabled && cfg_.lora.dropout > 0) {  // training only
    seq.lora_dropout = {cfg_.lora.dropout, cfg_.train.seed, step_, index};
  }
  layers::MoeStats moe;  // this micro-batch's routing (mixture-of-experts models)
  if (spec.moe()) {
    moe.Reset(spec);
    moe.aux_grad_scale = static_cast<float>(spec.router_aux_loss_coef) * loss_scale;
    seq.moe = &moe;
  }
  // Block layer index l = 1 + i keeps its intermediates (for this backward) when planned.
  auto kept = [&](int64_t i) -> layers::SavedActivations* {
    return backward && plan_.Keeps(1 + i) ? &kept_[static_cast<size_t>(1 + i - plan_.first_kept)] : nullptr;
  };
  // train.stash_dtype bf16 (training only, as the relay's stash): each layer's output is
  // rounded to bf16 where the relay's Stash::Commit rounds it; the backward passes the
  // gradient through the rounding unchanged.
  const bool round = backward && cfg_.train.stash_dtype == DType::kBF16;
  const int64_t act_n = B * T * spec.d_model;
  if (round) be.RoundToBf16(acts_[0].f32(), nullptr, act_n);
  for (int64_t i = 0; i < L; ++i) {
    layers::BlockForward(be, spec, layouts_[1 + i], d_params_[1 + i].f32(), acts_[i].f32(), acts_[i + 1].f32(), B,
                         T, *ws_, seq, kept(i));
    if (round) be.RoundToBf16(acts_[i + 1].f32(), nullptr, act_n);
  }
  const LayerLayout& head = layouts_.back();
  const float* wte = d_params_[0].f32() + EmbeddingTable(spec, layouts_[0]).offset;
  float* dwte = spec.tied_embeddings ? d_grads_[0].f32() + EmbeddingTable(spec, layouts_[0]).offset : nullptr;
  float* dcur = backward ? d_dact_a_.f32() : nullptr;
  float loss =
      layers::HeadForwardBackward(be, spec, head, d_params_.back().f32(), wte, acts_[L].f32(), d_targets_.i32(),
                                  loss_scale, dcur, backward ? d_grads_.back().f32() : nullptr, dwte, B, T, *ws_);
  if (spec.moe() && spec.output_router_logits) {
    // Hugging Face: loss += router_aux_loss_coef * aux (in fp32).
    loss += static_cast<float>(spec.router_aux_loss_coef) * static_cast<float>(layers::MoeAuxLoss(spec, moe));
  }
  if (!backward) return loss;
  for (size_t i = 0; i < touched_.size(); ++i) touched_[i] |= moe.touched[i];

  // Backward: dcur holds dL/d(acts_[i+1]); each block recomputes from acts_[i].
  float* dnext = d_dact_b_.f32();
  for (int64_t i = L - 1; i >= 0; --i) {
    layers::BlockBackward(be, spec, layouts_[1 + i], d_params_[1 + i].f32(), acts_[i].f32(), dcur, dnext,
                          d_grads_[1 + i].f32(), B, T, *ws_, seq, kept(i));
    std::swap(dcur, dnext);
  }
  // A frozen embedding (LoRA without it in modules_to_save) needs no gradient.
  if (TrainableNumel(layouts_[0]) > 0) {
    layers::EmbeddingBackward(be, spec, layouts_[0], d_tokens_.i32(), dcur, d_grads_[0].f32(), B, T, seq,
                              d_params_[0].f32(), ws_.get());
  }
  return loss;
}

Result<float> ReferenceTrainer::ForwardBackward(const std::vector<MicroBatch>& batches, bool backward) {
  if (batches.empty()) return InvalidArgument("a step needs at least one micro-batch, got 0");
  for (size_t u = 0; u < batches.size(); ++u) L2L_RETURN_IF_ERROR(CheckBatch(batches[u], u));
  if (backward) {
    for (size_t l = 0; l < layouts_.size(); ++l) backend_->Zero(d_grads_[l].data(), layouts_[l].numel * sizeof(float));
    std::fill(touched_.begin(), touched_.end(), uint8_t{0});
  }
  const float loss_scale = 1.0f / static_cast<float>(batches.size());
  double loss_sum = 0.0;
  for (size_t u = 0; u < batches.size(); ++u) {
    L2L_RETURN_IF_ERROR(EnsureWorkspace(batches[u].B, batches[u].T));
    loss_sum += RunMicroBatch(batches[u], static_cast<int64_t>(u), loss_scale, backward);
  }
  backend_->Synchronize();
  return static_cast<float>(loss_sum / static_cast<double>(batches.size()));
}

Result<float> ReferenceTrainer::ComputeGradients(const std::vector<MicroBatch>& batches) {
  return ForwardBackward(batches, /*backward=*/true);
}

Result<float> ReferenceTrainer::Evaluate(const std::vector<MicroBatch>& batches) {
  return ForwardBackward(batches, /*backward=*/false);
}

Result<float> ReferenceTrainer::Step(const std::vector<MicroBatch>& batches) {
  L2L_ASSIGN_OR_RETURN(float loss, ForwardBackward(batches, /*backward=*/true));
  if (!std::isfinite(loss)) {
    return InvalidArgument("loss is " + std::to_string(loss) + " at step " + std::to_string(step_) +
                           "; lower optim.lr or enable train.clip");
  }
  ApplyUpdate();
  return loss;
}

std::vector<std::vector<float>> ReferenceTrainer::grads() const {
  std::vector<std::vector<float>> out;
  for (size_t l = 0; l < layouts_.size(); ++l) {
    out.emplace_back(layouts_[l].numel);
    backend_->CopyToHost(out.back().data(), d_grads_[l].data(), layouts_[l].numel * sizeof(float));
  }
  return out;
}

void ReferenceTrainer::ApplyUpdate() {
  const OptimizerConfig& o = cfg_.optim;
  const std::vector<std::vector<float>> g = grads();
  // Clip coefficient per layer: global (torch clip_grad_norm_ over all parameters),
  // per layer (each layer's own norm; what an EPS can do without a global barrier), none.
  std::vector<float> coef(layouts_.size(), 1.0f);
  double total_sq = 0.0;
  std::vector<double> layer_sq(layouts_.size());
  // Norms over the trainable vector (all of a layer but a LoRA job's frozen base), as the
  // EPS sees it: the trainable tensors packed in layout order.
  for (size_t l = 0; l < layouts_.size(); ++l) {
    const size_t n = TrainableNumel(layouts_[l]);
    if (n == layouts_[l].numel) {
      layer_sq[l] = SumSquares(g[l].data(), g[l].size());
    } else {
      std::vector<float> packed(n);
      PackTrainable(layouts_[l], g[l].data(), packed.data());
      layer_sq[l] = SumSquares(packed.data(), n);
    }
    total_sq += layer_sq[l];
  }
  last_norm_ = std::sqrt(total_sq);
  if (cfg_.train.clip == ClipMode::kGlobal) {
    std::fill(coef.begin(), coef.end(), ClipCoefficient(last_norm_, o.grad_clip));
  } else if (cfg_.train.clip == ClipMode::kPerLayer) {
    for (size_t l = 0; l < layouts_.size(); ++l) coef[l] = ClipCoefficient(std::sqrt(layer_sq[l]), o.grad_clip);
  }
  last_clip_ = coef[0];

  const ModelSpec& spec = cfg_.model;
  for (size_t l = 0; l < layouts_.size(); ++l) {
    const AdamWStepArgs args = AdamWStepArgsAt(o, step_, coef[l]);
    // A mixture-of-experts block's experts: one without tokens this step is skipped
    // (torch.optim.AdamW with .grad None: no decay, no moment update, no step count).
    const std::vector<ExpertRange> experts = ExpertRanges(spec, layouts_[l]);
    const int64_t block = layouts_[l].block;
    for (const ParamInfo& p : layouts_[l].params) {
      if (!p.trainable) continue;
      const size_t k = p.offset - TrainableRange(layouts_[l]).offset;  // in m_, v_
      AdamWStepArgs a = WithDecay(args, p.decay);
      for (size_t e = 0; e < experts.size(); ++e) {
        if (p.offset < experts[e].begin || p.offset >= experts[e].end) continue;
        const size_t x = static_cast<size_t>(block * spec.num_experts) + e;
        a.t = touched_[x] ? expert_steps_[x] + 1 : 0;  // 0: no token this step, skipped
      }
      if (a.t == 0) continue;
      AdamWStep(params_[l].data() + p.offset, g[l].data() + p.offset, m_[l].data() + k, v_[l].data() + k, p.numel, a);
    }
    for (size_t e = 0; e < experts.size(); ++e) {
      const size_t x = static_cast<size_t>(block * spec.num_experts) + e;
      if (touched_[x]) ++expert_steps_[x];
    }
  }
  UploadParams();
  ++step_;
}

layers::SequenceInputs ReferenceTrainer::EmbedInputs(const MicroBatch& mb) {
  kernels::Backend& be = *backend_;
  const size_t n = static_cast<size_t>(mb.B * mb.T);
  be.CopyToDevice(d_tokens_.data(), mb.inputs.data(), n * sizeof(int32_t));
  layers::SequenceInputs seq;
  if (!mb.token_types.empty()) {
    be.CopyToDevice(d_types_.data(), mb.token_types.data(), n * sizeof(int32_t));
    seq.token_types = d_types_.i32();
  }
  if (!mb.attention_mask.empty()) {
    be.CopyToDevice(d_mask_.data(), mb.attention_mask.data(), n * sizeof(int32_t));
    seq.attention_mask = d_mask_.i32();
  }
  layers::EmbeddingForward(be, cfg_.model, layouts_[0], d_params_[0].f32(), d_tokens_.i32(), acts_[0].f32(), mb.B, mb.T,
                           seq, ws_.get());
  return seq;
}

Status ReferenceTrainer::ForwardBlocks(const MicroBatch& mb_in) {
  MicroBatch mb = mb_in;
  mb.targets.assign(static_cast<size_t>(mb.B * mb.T), kernels::kIgnoreTarget);
  L2L_RETURN_IF_ERROR(CheckBatch(mb, 0));
  L2L_RETURN_IF_ERROR(EnsureWorkspace(mb.B, mb.T));
  kernels::Backend& be = *backend_;
  const ModelSpec& spec = cfg_.model;
  const int64_t B = mb.B, T = mb.T;
  const layers::SequenceInputs seq = EmbedInputs(mb);
  for (int64_t i = 0; i < spec.n_layer; ++i) {
    layers::BlockForward(be, spec, layouts_[1 + i], d_params_[1 + i].f32(), acts_[i].f32(), acts_[i + 1].f32(), B,
                         T, *ws_, seq);
  }
  return Status::Ok();
}

Status ReferenceTrainer::Hidden(const MicroBatch& mb, float* hidden) {
  L2L_RETURN_IF_ERROR(ForwardBlocks(mb));
  const size_t bytes = static_cast<size_t>(mb.B * mb.T * cfg_.model.d_model) * sizeof(float);
  backend_->CopyToHost(hidden, acts_[cfg_.model.n_layer].data(), bytes);
  backend_->Synchronize();
  return Status::Ok();
}

std::vector<const float*> ReferenceTrainer::device_params() const {
  std::vector<const float*> p;
  for (const kernels::DeviceBuffer& b : d_params_) p.push_back(b.f32());
  return p;
}

Status ReferenceTrainer::Probs(const int32_t* tokens, int64_t B, int64_t T, float* probs) {
  MicroBatch mb;
  mb.B = B;
  mb.T = T;
  mb.inputs.assign(tokens, tokens + B * T);
  return Probs(mb, probs);
}

Status ReferenceTrainer::Probs(const MicroBatch& mb, float* probs) {
  if (models::IsEncoder(cfg_.model) && cfg_.model.num_labels > 0) {
    return InvalidArgument("Probs: a classification model (num_labels=" + std::to_string(cfg_.model.num_labels) +
                           ") has no per-token vocabulary distribution");
  }
  L2L_RETURN_IF_ERROR(ForwardBlocks(mb));
  kernels::Backend& be = *backend_;
  const ModelSpec& spec = cfg_.model;
  const int64_t B = mb.B, T = mb.T;
  const float* wte = d_params_[0].f32() + EmbeddingTable(spec, layouts_[0]).offset;
  const size_t probs_bytes = static_cast<size_t>(B * T * spec.vocab_size) * sizeof(float);
  L2L_ASSIGN_OR_RETURN(DeviceBuffer d_probs, Buffer(backend_.get(), probs_bytes));  // (B,T,V)
  layers::HeadProbs(be, spec, layouts_.back(), d_params_.back().f32(), wte, acts_[spec.n_layer].f32(), d_probs.f32(),
                    B, T, *ws_);
  be.CopyToHost(probs, d_probs.data(), probs_bytes);
  return Status::Ok();
}

Status ReferenceTrainer::SaveSafetensors(const std::string& path) const {
  if (cfg_.lora.enabled) {  // the base (BuildLayout's prefix of every LoRA layer)
    std::vector<std::vector<float>> base;
    for (size_t l = 0; l < layouts_.size(); ++l) {
      base.emplace_back(params_[l].begin(), params_[l].begin() + BaseNumel(layouts_[l]));
    }
    return SaveModel(path, cfg_.model, base, DType::kF32, {{"l2l.step", std::to_string(step_)}});
  }
  return SaveModel(path, cfg_.model, params_, DType::kF32, {{"l2l.step", std::to_string(step_)}});
}

Status ReferenceTrainer::SavePeftAdapter(const std::string& dir) const {
  L2L_ASSIGN_OR_RETURN(formats::LoraAdapter adapter,
                       formats::AdapterFromLayers(cfg_.model, cfg_.lora, [this](int64_t l, float* out) {
                         const std::vector<float>& p = params_[static_cast<size_t>(l)];
                         std::copy(p.begin(), p.end(), out);
                         return Status::Ok();
                       }));
  return formats::WritePeftAdapter(dir, adapter);
}

}  // namespace l2l::worker
