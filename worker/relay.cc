// The layer-to-layer relay: forward layer by layer over all micro-batches, head, backward
// in reverse with recompute, gradients pushed per layer. See relay.h.
#include "worker/relay.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/clock.h"
#include "common/logging.h"
#include "common/lora.h"
#include "kernels/layers/lora.h"
#include "worker/data_loader.h"  // CheckSequenceInputs
#include "worker/eval_set.h"  // ScoredTargets

namespace l2l::worker {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Result<RelayOptions> RelayOptions::FromJob(const JobConfig& job) {
  L2L_RETURN_IF_ERROR(job.Validate());
  RelayOptions o;
  o.stash = job.train.stash;
  o.stash_dtype = job.train.stash_dtype;
  o.lockfree = job.train.mode == TrainMode::kLockfree;
  o.staleness = job.train.staleness;
  o.recompute = job.train.recompute;
  o.activation_budget_bytes = static_cast<size_t>(job.train.activation_budget_mb) << 20;
  return o;
}

Relay::Relay(EpsClient* client, kernels::Backend* backend, const JobConfig& job,
             const RelayOptions& o)
    : client_(client),
      be_(backend),
      job_(job),
      spec_(job.model),
      opt_(o),
      layouts_(BuildLoraLayout(job.model, job.lora)),
      B_(job.train.micro_batch_size),
      T_(job.seq_len()),
      M_(job.train.micro_batches) {}

Relay::~Relay() {
  // The background threads may still reference our buffers after a failed step.
  if (prefetcher_) prefetcher_->Cancel();
  if (pusher_) {
    double ignored = 0;
    pusher_->WaitAll(&ignored).IgnoreError();
  }
  // Nothing copies from or into the shared regions any more: the client forgets the
  // pinner, whose destructor (after the prefetcher's and pusher's) unpins them.
  if (pinner_) client_->SetHostRegionObserver(nullptr);
}

Result<std::unique_ptr<Relay>> Relay::Create(EpsClient* client, kernels::Backend* backend,
                                             const JobConfig& job, const RelayOptions& options) {
  L2L_RETURN_IF_ERROR(job.Validate());
  std::unique_ptr<Relay> r(new Relay(client, backend, job, options));
  L2L_RETURN_IF_ERROR(r->Init());
  return r;
}

Status Relay::Init() {
  const int64_t L = spec_.n_layer, C = spec_.d_model;
  const size_t N = static_cast<size_t>(B_ * T_);
  if (opt_.shared_pinner != nullptr) {
    pin_ = opt_.shared_pinner;  // a device group: pinned once, for every device
  } else if (be_->HasAsyncTransfers()) {
    // Page-lock the transport's shared memory now (SetHostRegionObserver pins the regions
    // mapped already), so the copy queues DMA straight out of / into it.
    pinner_ = std::make_unique<HostRegionPinner>(be_);
    client_->SetHostRegionObserver(pinner_.get());
    pin_ = pinner_.get();
  }
  if (job_.lora.enabled && (opt_.push_group.active() || opt_.fetch_group.active())) {
    return Unimplemented("lora: a LoRA job runs on one device per worker in this build (no --devices group)");
  }
  L2L_ASSIGN_OR_RETURN(layers::LayerWorkspace ws, layers::LayerWorkspace::Create(be_, spec_, B_, T_));
  ws_ = std::make_unique<layers::LayerWorkspace>(std::move(ws));
  L2L_RETURN_IF_ERROR(layers::ReserveLoraScratch(be_, layouts_, ws_.get(), job_.lora.dropout));
  L2L_ASSIGN_OR_RETURN(stash_, Stash::Create(be_, opt_.stash, L + 1, M_, N * static_cast<size_t>(C),
                                                opt_.stash_dtype));
  L2L_ASSIGN_OR_RETURN(plan_, PlanActivations(*be_, spec_, *ws_, opt_.recompute, opt_.activation_budget_bytes, M_));
  for (int64_t i = 0; i < plan_.kept_blocks * M_; ++i) {
    Result<layers::SavedActivations> k = layers::SavedActivations::Create(be_, spec_, *ws_);
    if (!k.ok()) return k.status().WithContext("relay: " + plan_.Describe(L, M_));
    kept_.push_back(std::move(k).value());
  }
  forward_version_.assign(static_cast<size_t>(L + 2), -1);
  L2L_LOG_INFO("relay stash: {}", plan_.Describe(L, M_));

  std::vector<size_t> numel;
  for (const LayerLayout& l : layouts_) numel.push_back(l.numel);
  std::vector<FrozenPlan> frozen;  // a LoRA job: each layer's frozen base (common/lora_frozen.h)
  if (job_.lora.enabled) {
    for (const LayerLayout& l : layouts_) frozen.push_back(PlanFrozenBase(l, job_.lora));
  }
  L2L_ASSIGN_OR_RETURN(prefetcher_, LayerPrefetcher::Create(client_, be_, numel, opt_.ring_slots,
                                                            job_.publish_dtype, pin_, opt_.fetch_group,
                                                            std::move(frozen)));
  const size_t max_numel = *std::max_element(numel.begin(), numel.end());
  // In a device group the gradient buffers hold the padded layer (the reduce-scatter's).
  const int gsize = opt_.push_group.active() ? opt_.push_group.size : 1;
  size_t ring_numel = 0;
  for (size_t l = 1; l < numel.size(); ++l) ring_numel = std::max(ring_numel, GroupPaddedNumel(numel[l], gsize));
  L2L_ASSIGN_OR_RETURN(pusher_, GradientPusher::Create(client_, be_, max_numel, pin_, opt_.push_group));

  L2L_ASSIGN_OR_RETURN(tokens_, kernels::DeviceBuffer::Create(
                                    be_, static_cast<size_t>(M_) * 2 * N * sizeof(int32_t)));
  L2L_ASSIGN_OR_RETURN(dact_buf_, kernels::DeviceBuffer::Create(
                                      be_, static_cast<size_t>(M_ + 1) * N * C * sizeof(float)));
  for (int64_t u = 0; u < M_; ++u) dact_.push_back(dact_buf_.f32() + static_cast<size_t>(u) * N * C);
  spare_ = dact_buf_.f32() + static_cast<size_t>(M_) * N * C;
  L2L_ASSIGN_OR_RETURN(emb_grad_, kernels::DeviceBuffer::Create(be_, GroupPaddedNumel(numel[0], gsize) * sizeof(float)));
  for (auto& g : ring_grad_) {
    L2L_ASSIGN_OR_RETURN(g, kernels::DeviceBuffer::Create(be_, ring_numel * sizeof(float)));
  }
  if (pin_) {
    L2L_LOG_INFO("relay on {}: layers in and gradients out on copy streams (layers copied as "
                 "published, {}{}), stash {} {}{}",
                 be_->name(), DTypeName(job_.publish_dtype),
                 job_.publish_dtype == DType::kF32 ? "" : ", widened to f32 on the device",
                 ToString(opt_.stash), DTypeName(opt_.stash_dtype),
                 stash_->async() ? " (offloaded on its own copy stream)" : "");
  }
  return Status::Ok();
}

layers::SavedActivations* Relay::Kept(int64_t layer, int64_t u) {
  if (!plan_.Keeps(layer)) return nullptr;
  return &kept_[static_cast<size_t>((layer - plan_.first_kept) * M_ + u)];
}

size_t Relay::device_bytes() const {
  size_t kept = 0;
  for (const layers::SavedActivations& k : kept_) kept += k.bytes();
  return kept + ws_->bytes() + stash_->device_bytes() + prefetcher_->device_bytes() + tokens_.bytes() +
         seq_buf_.bytes() + eval_tokens_.bytes() + eval_buf_.bytes() +
         dact_buf_.bytes() + emb_grad_.bytes() + ring_grad_[0].bytes() + ring_grad_[1].bytes();
}

const int32_t* Relay::Inputs(int64_t u) const {
  return tokens_.i32() + static_cast<size_t>(2 * u) * static_cast<size_t>(B_ * T_);
}
const int32_t* Relay::Targets(int64_t u) const {
  return tokens_.i32() + static_cast<size_t>(2 * u + 1) * static_cast<size_t>(B_ * T_);
}

layers::SequenceInputs Relay::SeqInputs(int64_t u) const {
  layers::SequenceInputs seq;
  if (static_cast<size_t>(u) >= seq_present_.size()) return seq;
  // Without token types or a mask seq_buf_ may hold no buffer: no pointer arithmetic on null.
  if (!seq_present_[u].first && !seq_present_[u].second) return seq;
  const int32_t* base = seq_buf_.i32() + static_cast<size_t>(2 * u) * static_cast<size_t>(B_ * T_);
  if (seq_present_[u].first) seq.token_types = base;
  if (seq_present_[u].second) seq.attention_mask = base + static_cast<size_t>(B_ * T_);
  return seq;
}

layers::SequenceInputs Relay::Seq(int64_t u) const {
  layers::SequenceInputs seq = SeqInputs(u);
  if (spec_.moe() && static_cast<size_t>(u) < moe_stats_.size()) seq.moe = &moe_stats_[static_cast<size_t>(u)];
  // LoRA dropout: micro-batch u of this worker is data_rank * M + u of the step's global
  // order (the reference trainer's), so 1 and W workers draw the same masks.
  if (job_.lora.enabled && job_.lora.dropout > 0) {
    seq.lora_dropout = {job_.lora.dropout, job_.train.seed, dropout_step_,
                        int64_t{client_->registration().data_rank} * M_ + u};
  }
  return seq;
}

Status Relay::ValidateBatch(const std::vector<MicroBatch>& mbs, int64_t expected, const char* what) const {
  if (expected >= 0 && static_cast<int64_t>(mbs.size()) != expected) {
    return InvalidArgument("relay step got " + std::to_string(mbs.size()) +
                           " micro-batches, train.micro_batches=" + std::to_string(M_));
  }
  const std::string kind = what;
  const size_t n = static_cast<size_t>(B_ * T_);
  for (size_t u = 0; u < mbs.size(); ++u) {
    if (mbs[u].B != B_ || mbs[u].T != T_) {
      return InvalidArgument(kind + " " + std::to_string(u) + " is (B=" + std::to_string(mbs[u].B) +
                             ", T=" + std::to_string(mbs[u].T) + "), the job wants (B=" +
                             std::to_string(B_) + ", T=" + std::to_string(T_) + ")");
    }
    for (const auto* v : {&mbs[u].inputs, &mbs[u].targets}) {
      const char* name = v == &mbs[u].inputs ? "inputs" : "targets";
      if (v->size() != n) {
        return InvalidArgument(kind + " " + std::to_string(u) + " " + name + " has " +
                               std::to_string(v->size()) + " tokens, expected B*T=" +
                               std::to_string(n));
      }
      for (size_t i = 0; i < n; ++i) {
        const bool ignored = v == &mbs[u].targets && (*v)[i] == kernels::kIgnoreTarget;
        if (!ignored && ((*v)[i] < 0 || (*v)[i] >= spec_.vocab_size)) {
          return OutOfRange(kind + " " + std::to_string(u) + " " + name + "[" +
                            std::to_string(i) + "]=" + std::to_string((*v)[i]) +
                            " is outside the vocabulary [0, " + std::to_string(spec_.vocab_size) + ")");
        }
      }
    }
    L2L_RETURN_IF_ERROR(CheckSequenceInputs(spec_, mbs[u], kind + " " + std::to_string(u)));
  }
  return Status::Ok();
}

Result<StepReport> Relay::RunStep(int64_t step, const std::vector<MicroBatch>& mbs,
                                  const std::vector<MicroBatch>& eval) {
  L2L_RETURN_IF_ERROR(ValidateBatch(mbs, M_, "micro-batch"));
  L2L_RETURN_IF_ERROR(ValidateBatch(eval, -1, "eval micro-batch"));
  times_ = RelayTimes{};
  versions_acquired_in_step_ = 0;
  const auto t0 = Clock::now();
  double loss_sum = 0;
  Status st = UploadEval(eval);
  if (st.ok()) st = RunStepImpl(step, mbs, &loss_sum);
  if (!st.ok()) {
    prefetcher_->Cancel();
    double ignored = 0;
    pusher_->WaitAll(&ignored).IgnoreError();
    pusher_->ClearError();  // the step is redone (after a rejoin) or the worker exits
    ring_ticket_[0] = ring_ticket_[1] = -1;
    return st.WithContext("relay step " + std::to_string(step));
  }
  times_.total = Seconds(t0, Clock::now());
  times_.recompute = std::min(block_forward_s_, times_.backward);
  times_.backward -= times_.recompute;

  StepReport r;
  r.step = step;
  r.loss = loss_sum / static_cast<double>(M_);
  r.tokens = M_ * B_ * T_;
  r.forward_s = times_.forward + times_.head;
  r.backward_s = times_.backward;
  r.recompute_s = times_.recompute;
  r.wait_layer_s = times_.wait_layer;
  r.wait_push_s = times_.wait_push;
  r.compute_s = times_.upload + times_.forward + times_.head + times_.recompute + times_.backward;
  r.wait_first_layer_s = times_.wait_first_layer;
  r.step_s = times_.total;
  for (int64_t j = 0; j < eval_n_; ++j) r.eval_tokens += eval_scored_[j];
  if (r.eval_tokens > 0) r.eval_loss = eval_weighted_ / static_cast<double>(r.eval_tokens);
  return r;
}

Status Relay::UploadEval(const std::vector<MicroBatch>& eval) {
  eval_n_ = static_cast<int64_t>(eval.size());
  eval_weighted_ = 0;
  eval_scored_.clear();
  for (const MicroBatch& mb : eval) eval_scored_.push_back(ScoredTargets(mb));
  if (eval_n_ == 0) return Status::Ok();
  const size_t n = static_cast<size_t>(B_ * T_), C = static_cast<size_t>(spec_.d_model);
  if (eval_n_ > eval_capacity_) {
    eval_act_.clear();
    eval_tokens_ = kernels::DeviceBuffer();
    eval_buf_ = kernels::DeviceBuffer();
    L2L_ASSIGN_OR_RETURN(eval_tokens_, kernels::DeviceBuffer::Create(
                                           be_, static_cast<size_t>(eval_n_) * 2 * n * sizeof(int32_t)));
    L2L_ASSIGN_OR_RETURN(eval_buf_, kernels::DeviceBuffer::Create(
                                        be_, static_cast<size_t>(eval_n_ + 1) * n * C * sizeof(float)));
    eval_capacity_ = eval_n_;
  }
  eval_act_.clear();
  for (int64_t j = 0; j < eval_n_; ++j) eval_act_.push_back(eval_buf_.f32() + static_cast<size_t>(j) * n * C);
  eval_spare_ = eval_buf_.f32() + static_cast<size_t>(eval_n_) * n * C;
  for (int64_t j = 0; j < eval_n_; ++j) {
    int32_t* base = eval_tokens_.i32() + static_cast<size_t>(2 * j) * n;
    be_->CopyToDevice(base, eval[j].inputs.data(), n * sizeof(int32_t));
    be_->CopyToDevice(base + n, eval[j].targets.data(), n * sizeof(int32_t));
  }
  return Status::Ok();
}

Status Relay::RunStepImpl(int64_t step, const std::vector<MicroBatch>& mbs, double* loss_sum) {
  const int64_t L = spec_.n_layer;
  dropout_step_ = step;
  // The order the relay uses layers in: forward 0..L, head, backward L..1 (the
  // embedding's backward needs only tokens; layer 0 stays resident for a tied head).
  std::vector<int64_t> schedule;
  for (int64_t l = 0; l <= L + 1; ++l) schedule.push_back(l);
  for (int64_t l = L; l >= 1; --l) schedule.push_back(l);
  // A family whose embedding backward recomputes from its parameters (BERT's LayerNorm)
  // fetches layer 0 once more at the end.
  if (layers::EmbeddingBackwardNeedsParams(spec_)) schedule.push_back(0);
  const int64_t min_version = opt_.lockfree ? std::max<int64_t>(0, step - opt_.staleness) : step;
  prefetcher_->Begin(std::move(schedule), min_version, opt_.layer_timeout);

  auto t = Clock::now();
  const size_t n = static_cast<size_t>(B_ * T_);
  for (int64_t u = 0; u < M_; ++u) {
    be_->CopyToDevice(const_cast<int32_t*>(Inputs(u)), mbs[u].inputs.data(), n * sizeof(int32_t));
    be_->CopyToDevice(const_cast<int32_t*>(Targets(u)), mbs[u].targets.data(), n * sizeof(int32_t));
  }
  seq_present_.assign(static_cast<size_t>(M_), {false, false});
  for (int64_t u = 0; u < M_; ++u) {
    const MicroBatch& mb = mbs[u];
    if (mb.token_types.empty() && mb.attention_mask.empty()) continue;
    if (seq_buf_.data() == nullptr) {
      L2L_ASSIGN_OR_RETURN(seq_buf_, kernels::DeviceBuffer::Create(be_, static_cast<size_t>(M_) * 2 * n * sizeof(int32_t)));
    }
    int32_t* base = seq_buf_.i32() + static_cast<size_t>(2 * u) * n;
    if (!mb.token_types.empty()) be_->CopyToDevice(base, mb.token_types.data(), n * sizeof(int32_t));
    if (!mb.attention_mask.empty()) be_->CopyToDevice(base + n, mb.attention_mask.data(), n * sizeof(int32_t));
    seq_present_[u] = {!mb.token_types.empty(), !mb.attention_mask.empty()};
  }
  be_->Zero(emb_grad_.data(), emb_grad_.bytes());
  be_->Synchronize();
  times_.upload = Seconds(t, Clock::now());

  ResidentLayer emb;
  L2L_RETURN_IF_ERROR(Forward(step, &emb));
  if (spec_.moe()) {
    // The experts this step's forward routed tokens to, before any block gradient leaves.
    std::vector<uint8_t> touched(static_cast<size_t>(spec_.n_layer * spec_.num_experts), 0);
    for (const layers::MoeStats& s : moe_stats_) {
      for (size_t i = 0; i < touched.size(); ++i) touched[i] |= s.touched[i];
    }
    L2L_RETURN_IF_ERROR(client_->ReportExperts(step, touched));
  }
  L2L_RETURN_IF_ERROR(HeadAndBackward(step, &emb, loss_sum));
  L2L_RETURN_IF_ERROR(pusher_->WaitAll(&times_.wait_push));
  ring_ticket_[0] = ring_ticket_[1] = -1;
  return Status::Ok();
}

Result<ResidentLayer> Relay::NextLayer(int64_t step, int64_t layer) {
  double waited = 0;
  const bool first = versions_acquired_in_step_++ == 0;
  L2L_ASSIGN_OR_RETURN(ResidentLayer r, prefetcher_->Next(&waited));
  times_.wait_layer += waited;
  if (first) times_.wait_first_layer = waited;
  L2L_CHECK(r.layer == layer) << "prefetch schedule returned layer " << r.layer << ", relay expected " << layer;
  const int64_t lag = step - r.version;
  if (!opt_.lockfree && r.version != step) {
    prefetcher_->Release(r);
    return FailedPrecondition("synchronous step " + std::to_string(step) + " got layer " +
                              std::to_string(layer) + " at version " + std::to_string(r.version) +
                              "; it must be exactly " + std::to_string(step));
  }
  if (opt_.lockfree && lag > opt_.staleness) {
    prefetcher_->Release(r);
    return FailedPrecondition("lock-free step " + std::to_string(step) + " got layer " +
                              std::to_string(layer) + " at version " + std::to_string(r.version) +
                              ", older than the staleness bound " + std::to_string(opt_.staleness));
  }
  versions_.max_lag = versions_.acquires == 0 ? lag : std::max(versions_.max_lag, lag);
  versions_.min_lag = versions_.acquires == 0 ? lag : std::min(versions_.min_lag, lag);
  ++versions_.acquires;
  ++versions_.lag_counts[lag];
  return r;
}

Status Relay::Forward(int64_t step, ResidentLayer* emb) {
  const int64_t L = spec_.n_layer;
  L2L_ASSIGN_OR_RETURN(*emb, NextLayer(step, 0));
  if (spec_.moe()) {
    moe_stats_.resize(static_cast<size_t>(M_));
    for (layers::MoeStats& s : moe_stats_) {
      s.Reset(spec_);
      // The relay's head takes loss scale 1 (the EPS divides by the micro-batches).
      s.aux_grad_scale = static_cast<float>(spec_.router_aux_loss_coef);
    }
  }
  auto t = Clock::now();
  for (int64_t u = 0; u < M_; ++u) {
    layers::EmbeddingForward(*be_, spec_, layouts_[0], emb->params, Inputs(u),
                             stash_->OutputBuffer(0, u), B_, T_, Seq(u), ws_.get());  // (B,T,C)
    stash_->Commit(0, u);
  }
  const size_t n = static_cast<size_t>(B_ * T_);
  for (int64_t j = 0; j < eval_n_; ++j) {  // forward-only eval micro-batches: no stash
    layers::EmbeddingForward(*be_, spec_, layouts_[0], emb->params, eval_tokens_.i32() + static_cast<size_t>(2 * j) * n,
                             eval_act_[j], B_, T_, {}, ws_.get());  // (B,T,C)
  }
  be_->Synchronize();
  times_.forward += Seconds(t, Clock::now());
  if (!spec_.tied_embeddings) prefetcher_->Release(*emb);

  block_forward_s_ = 0;
  for (int64_t l = 1; l <= L; ++l) {
    L2L_ASSIGN_OR_RETURN(ResidentLayer p, NextLayer(step, l));
    t = Clock::now();
    for (int64_t u = 0; u < M_; ++u) {
      const float* in = stash_->Load(l - 1, u);  // (B,T,C)
      float* out = stash_->OutputBuffer(l, u);   // (B,T,C)
      layers::SavedActivations* keep = Kept(l, u);
      if (keep != nullptr) keep->Discard();  // left over from a step that failed before its backward
      layers::BlockForward(*be_, spec_, layouts_[l], p.params, in, out, B_, T_, *ws_, Seq(u), keep);
      stash_->Commit(l, u);
    }
    for (int64_t j = 0; j < eval_n_; ++j) {
      layers::BlockForward(*be_, spec_, layouts_[l], p.params, eval_act_[j], eval_spare_, B_, T_, *ws_);
      std::swap(eval_act_[j], eval_spare_);  // eval_act_[j] is now block l's output (B,T,C)
    }
    be_->Synchronize();
    const double s = Seconds(t, Clock::now());
    times_.forward += s;
    if (!plan_.Keeps(l)) block_forward_s_ += s;  // the backward recomputes this much
    forward_version_[static_cast<size_t>(l)] = p.version;
    prefetcher_->Release(p);
  }
  return Status::Ok();
}

Status Relay::Push(int64_t layer, int64_t step, const float* grad, size_t numel, int64_t* ticket) {
  L2L_ASSIGN_OR_RETURN(int64_t tk, pusher_->Submit(layer, step, M_, grad, numel, &times_.wait_push));
  if (ticket) *ticket = tk;
  return Status::Ok();
}

Status Relay::HeadAndBackward(int64_t step, ResidentLayer* emb, double* loss_sum) {
  const int64_t L = spec_.n_layer;
  const LayerLayout& head = layouts_[L + 1];
  const ParamInfo* wte = &EmbeddingTable(spec_, layouts_[0]);  // the table a tied head reads

  // ---- head: loss and input-gradient per micro-batch --------------------------------
  L2L_ASSIGN_OR_RETURN(ResidentLayer h, NextLayer(step, L + 1));
  auto t = Clock::now();
  float* hgrad = ring_grad_[0].f32();  // (head numel)
  be_->Zero(hgrad, head.numel * sizeof(float));
  const float* wte_w = spec_.tied_embeddings ? emb->params + wte->offset : nullptr;  // (V,C)
  float* dwte = spec_.tied_embeddings ? emb_grad_.f32() + wte->offset : nullptr;     // (V,C)
  for (int64_t u = 0; u < M_; ++u) {
    const float* in = stash_->Load(L, u);  // (B,T,C)
    float loss = layers::HeadForwardBackward(*be_, spec_, head, h.params, wte_w, in, Targets(u), 1.0f, dact_[u],
                                             hgrad, dwte, B_, T_, *ws_);
    if (spec_.moe() && spec_.output_router_logits) {  // Hugging Face: loss += coef * aux (fp32)
      loss += static_cast<float>(spec_.router_aux_loss_coef) *
              static_cast<float>(layers::MoeAuxLoss(spec_, moe_stats_[static_cast<size_t>(u)]));
    }
    *loss_sum += loss;
  }
  // Eval micro-batches: loss only (the head averages over the scored targets of each).
  const size_t n = static_cast<size_t>(B_ * T_);
  for (int64_t j = 0; j < eval_n_; ++j) {
    if (eval_scored_[j] == 0) continue;
    const int32_t* targets = eval_tokens_.i32() + static_cast<size_t>(2 * j + 1) * n;  // (B,T)
    const float loss = layers::HeadForwardBackward(*be_, spec_, head, h.params, wte_w, eval_act_[j], targets, 1.0f,
                                                   nullptr, nullptr, nullptr, B_, T_, *ws_);
    eval_weighted_ += static_cast<double>(loss) * static_cast<double>(eval_scored_[j]);
  }
  be_->Synchronize();
  times_.head += Seconds(t, Clock::now());
  prefetcher_->Release(h);
  if (spec_.tied_embeddings) prefetcher_->Release(*emb);
  // What trains of each layer (all of it, or a LoRA job's adapters / saved modules) is
  // one contiguous run of its gradient: that run is pushed (possibly empty).
  const TrainableSpan hs = TrainableRange(head);
  L2L_RETURN_IF_ERROR(Push(L + 1, step, hgrad + hs.offset, hs.numel, &ring_ticket_[0]));

  // ---- blocks in reverse: recompute, accumulate over micro-batches, push once ---------
  int buf = 1;
  for (int64_t l = L; l >= 1; --l) {
    L2L_ASSIGN_OR_RETURN(ResidentLayer p, NextLayer(step, l));
    if (ring_ticket_[buf] >= 0) L2L_RETURN_IF_ERROR(pusher_->Wait(ring_ticket_[buf], &times_.wait_push));
    t = Clock::now();
    float* grad = ring_grad_[buf].f32();  // (layer numel)
    be_->Zero(grad, layouts_[l].numel * sizeof(float));
    for (int64_t u = 0; u < M_; ++u) {
      const float* in = stash_->Load(l - 1, u);  // (B,T,C)
      layers::SavedActivations* kept = Kept(l, u);
      if (kept != nullptr && p.version != forward_version_[static_cast<size_t>(l)]) {
        // Lock-free: the backward got a newer version than the forward; recompute with it
        // so the whole block's gradient is taken at one version, as without kept values.
        kept->Discard();
        kept = nullptr;
      }
      layers::BlockBackward(*be_, spec_, layouts_[l], p.params, in, dact_[u], spare_, grad, B_, T_, *ws_, Seq(u),
                            kept);
      std::swap(dact_[u], spare_);  // dact_[u] is now dL/d(input of block l)
    }
    be_->Synchronize();
    times_.backward += Seconds(t, Clock::now());
    prefetcher_->Release(p);
    const TrainableSpan bs = TrainableRange(layouts_[l]);
    L2L_RETURN_IF_ERROR(Push(l, step, grad + bs.offset, bs.numel, &ring_ticket_[buf]));
    buf ^= 1;
  }

  // ---- embedding ----------------------------------------------------------------------
  const bool needs_params = layers::EmbeddingBackwardNeedsParams(spec_);
  ResidentLayer e;
  if (needs_params) {
    L2L_ASSIGN_OR_RETURN(e, NextLayer(step, 0));
  }
  t = Clock::now();
  const TrainableSpan es = TrainableRange(layouts_[0]);
  for (int64_t u = 0; u < M_ && es.numel > 0; ++u) {  // a frozen embedding needs no gradient
    layers::EmbeddingBackward(*be_, spec_, layouts_[0], Inputs(u), dact_[u], emb_grad_.f32(), B_, T_, Seq(u),
                              needs_params ? e.params : nullptr, ws_.get());
  }
  be_->Synchronize();
  times_.backward += Seconds(t, Clock::now());
  if (needs_params) prefetcher_->Release(e);
  return Push(0, step, emb_grad_.f32() + es.offset, es.numel, nullptr);
}

}  // namespace l2l::worker
