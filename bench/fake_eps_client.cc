// In-process fake EPS for relay tests and benchmarks. See fake_eps_client.h.
#include "bench/fake_eps_client.h"

#include <cmath>
#include <cstring>

#include "common/adamw.h"
#include "common/dtype.h"
#include "common/logging.h"

namespace l2l::worker {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

// One simulated worker's connection: forwards to the FakeEps under its worker id.
class FakeEpsClient : public EpsClient {
 public:
  FakeEpsClient(FakeEps* eps, WorkerRegistration reg) : eps_(eps), reg_(std::move(reg)) {}
  const WorkerRegistration& registration() const override { return reg_; }
  Result<LayerWeights> AcquireLayer(int64_t layer, int64_t min_version,
                                    std::chrono::milliseconds timeout) override {
    return eps_->Acquire(reg_.worker_id, layer, min_version, timeout);
  }
  void ReleaseLayer(int64_t layer) override { eps_->Release(reg_.worker_id, layer); }
  Status PushGradient(int64_t layer, int64_t step, int64_t micro_batches, const float* grad,
                      size_t numel) override {
    return eps_->Push(reg_.worker_id, layer, step, micro_batches, grad, numel);
  }
  Status StepDone(const StepReport& report) override { return eps_->Done(reg_.worker_id, report); }
  Status ReportExperts(int64_t step, const std::vector<uint8_t>& touched) override {
    return eps_->Experts(step, touched);
  }

 private:
  FakeEps* eps_;
  WorkerRegistration reg_;
};

Result<std::unique_ptr<FakeEps>> FakeEps::Create(const JobConfig& job, const FakeEpsOptions& options) {
  L2L_RETURN_IF_ERROR(job.Validate());
  if (options.num_workers <= 0) {
    return InvalidArgument("fake EPS: num_workers=" + std::to_string(options.num_workers) + " must be > 0");
  }
  if (job.publish_dtype == DType::kF16) return Unimplemented("fake EPS publishes f32 or bf16, not f16");
  std::unique_ptr<FakeEps> eps(new FakeEps(job, options));
  std::lock_guard<std::mutex> lk(eps->mu_);
  eps->layers_.resize(eps->layouts_.size());
  eps->expert_steps_.assign(static_cast<size_t>(job.model.n_layer * job.model.num_experts), 0);
  const std::vector<LayerLayout> base = BuildLayout(job.model);
  for (size_t l = 0; l < eps->layouts_.size(); ++l) {
    Layer& layer = eps->layers_[l];
    const size_t n = eps->layouts_[l].numel;
    layer.master.assign(n, 0.0f);
    // The base as BuildLayout lays it out (a prefix of a LoRA layer), then a LoRA job's
    // adapters and its base's rounding: what ReferenceTrainer::Create starts from.
    InitLayerParams(job.model, base[l], job.train.seed, layer.master.data());
    if (job.lora.enabled) InitLoraAdapters(job.lora, eps->layouts_[l], layer.master.data());
    L2L_RETURN_IF_ERROR(RoundToHeld(eps->layouts_[l], job.lora, layer.master.data()));
    layer.plan = PlanFrozenBase(eps->layouts_[l], job.lora);
    if (layer.plan.bytes > 0) {
      auto record = std::make_shared<std::vector<uint8_t>>(layer.plan.bytes);
      L2L_RETURN_IF_ERROR(EncodeFrozen(layer.plan, layer.master.data(), record->data()));
      layer.record = std::move(record);
    }
    // Optimizer state only for what trains (a LoRA job: adapters and saved modules).
    const size_t t = TrainableRange(eps->layouts_[l]).numel;
    layer.m.assign(t, 0.0f);
    layer.v.assign(t, 0.0f);
    eps->Publish(&layer);
  }
  return eps;
}

FakeEps::~FakeEps() = default;

Result<std::unique_ptr<EpsClient>> FakeEps::Connect(int32_t worker_id) {
  if (worker_id < 0 || worker_id >= opt_.num_workers) {
    return InvalidArgument("fake EPS: worker id " + std::to_string(worker_id) + " outside [0, " +
                           std::to_string(opt_.num_workers) + ")");
  }
  WorkerRegistration reg;
  reg.worker_id = worker_id;
  reg.num_workers = opt_.num_workers;
  reg.job = job_;
  reg.data_rank = worker_id;
  reg.data_world = opt_.num_workers;
  reg.transport = Transport::kGrpc;  // in-process: no shared segments, like gRPC
  return std::unique_ptr<EpsClient>(new FakeEpsClient(this, std::move(reg)));
}

void FakeEps::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

void FakeEps::Publish(Layer* layer) const {
  // As the daemon publishes: a LoRA layer's frozen record once, then its trainable span.
  const bool split = layer->plan.bytes > 0;
  const size_t off = split ? layer->plan.trainable.offset : 0;
  const size_t n = split ? layer->plan.trainable.numel : layer->master.size();
  auto bytes = std::make_shared<std::vector<uint8_t>>(n * DTypeSize(job_.publish_dtype));
  if (n == 0) {  // a LoRA layer with nothing to train: no bytes (and no null memcpy)
  } else if (job_.publish_dtype == DType::kF32) {
    std::memcpy(bytes->data(), layer->master.data() + off, n * sizeof(float));
  } else {
    ConvertFromFloat(layer->master.data() + off, job_.publish_dtype, bytes->data(), n);
  }
  layer->published = std::move(bytes);
}

bool FakeEps::Complete(int64_t step, int64_t layer) const {
  auto it = pending_.find({step, layer});
  return it != pending_.end() && static_cast<int32_t>(it->second.pushed.size()) == opt_.num_workers;
}

bool FakeEps::TryApply(int64_t step, int64_t layer) {
  if (job_.train.clip == ClipMode::kGlobal) {
    std::vector<int64_t> all;
    for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) {
      if (layers_[l].version != step || !Complete(step, l)) return false;
      all.push_back(l);
    }
    Apply(step, all);
    return true;
  }
  if (layers_[layer].version != step || !Complete(step, layer)) return false;
  Apply(step, {layer});
  return true;
}

void FakeEps::Apply(int64_t step, const std::vector<int64_t>& which) {
  const auto t0 = Clock::now();
  const OptimizerConfig& o = job_.optim;
  double global_sq = 0;
  for (int64_t l : which) {
    const Pending& p = pending_.at({step, l});
    const double scale = 1.0 / static_cast<double>(p.micro_batches);
    global_sq += SumSquares(p.sum.data(), p.sum.size()) * scale * scale;
  }
  for (int64_t l : which) {
    Pending& p = pending_.at({step, l});
    Layer& layer = layers_[l];
    const double scale = 1.0 / static_cast<double>(p.micro_batches);
    float coef = 1.0f;
    if (job_.train.clip == ClipMode::kGlobal) {
      coef = ClipCoefficient(std::sqrt(global_sq), o.grad_clip);
    } else if (job_.train.clip == ClipMode::kPerLayer) {
      coef = ClipCoefficient(std::sqrt(SumSquares(p.sum.data(), p.sum.size())) * scale, o.grad_clip);
    }
    const float grad_scale = static_cast<float>(scale) * coef;
    layer.prev_master = layer.master;
    const AdamWStepArgs args = AdamWStepArgsAt(o, step, grad_scale);
    const std::vector<ExpertRange> experts = ExpertRanges(job_.model, layouts_[l]);
    const int64_t E = job_.model.num_experts, block = layouts_[l].block;
    const std::vector<uint8_t>* touched = nullptr;
    if (!experts.empty()) {
      auto it = touched_.find(step);
      L2L_CHECK(it != touched_.end()) << "fake EPS: block " << block << "'s gradient of step " << step
                                      << " came before any ReportExperts of the step";
      touched = &it->second;
    }
    const size_t base = TrainableRange(layouts_[l]).offset;  // p.sum, m, v cover the trainable span
    for (const ParamInfo& info : layouts_[l].params) {
      if (!info.trainable) continue;
      const size_t k = info.offset - base;
      AdamWStepArgs a = WithDecay(args, info.decay);
      for (size_t e = 0; e < experts.size(); ++e) {
        if (info.offset < experts[e].begin || info.offset >= experts[e].end) continue;
        const size_t x = static_cast<size_t>(block * E) + e;
        a.t = (*touched)[x] ? expert_steps_[x] + 1 : 0;  // 0: no token this step, skipped
      }
      if (a.t == 0) continue;
      AdamWStep(layer.master.data() + info.offset, p.sum.data() + k, layer.m.data() + k, layer.v.data() + k,
                info.numel, a);
    }
    for (size_t e = 0; e < experts.size(); ++e) {
      const size_t x = static_cast<size_t>(block * E) + e;
      if ((*touched)[x]) ++expert_steps_[x];
    }
    layer.last_grad.resize(p.sum.size());
    for (size_t i = 0; i < p.sum.size(); ++i) layer.last_grad[i] = static_cast<float>(p.sum[i] * scale);
    layer.version = step + 1;
    Publish(&layer);
    pending_.erase({step, l});
  }
  optimizer_s_ += std::chrono::duration<double>(Clock::now() - t0).count();
  cv_.notify_all();
}

void FakeEps::ApplyReady() {
  bool progress = true;
  while (progress) {  // in step order per layer
    progress = false;
    for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) {
      if (TryApply(layers_[l].version, l)) progress = true;
    }
  }
}

void FakeEps::Flush() {
  std::lock_guard<std::mutex> lk(mu_);
  ApplyReady();
}

Result<LayerWeights> FakeEps::Acquire(int32_t worker, int64_t layer, int64_t min_version,
                                      std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) {
    return NotFound("fake EPS: no layer " + std::to_string(layer));
  }
  if (held_.count({worker, layer})) {
    return FailedPrecondition("fake EPS: worker " + std::to_string(worker) + " already holds layer " +
                              std::to_string(layer));
  }
  int held = 0;
  for (const auto& [key, copy] : held_) held += key.first == worker ? 1 : 0;
  if (held >= kMaxAcquired) {
    return ResourceExhausted("fake EPS: worker " + std::to_string(worker) + " holds " +
                             std::to_string(held) + " layers, the limit is kMaxAcquired");
  }
  const auto deadline = Clock::now() + timeout;
  while (layers_[layer].version < min_version) {
    if (stopped_) return Aborted("fake EPS stopped");
    if (opt_.lazy_updates && TryApply(layers_[layer].version, layer)) continue;
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout &&
        layers_[layer].version < min_version) {
      return Status(StatusCode::kDeadlineExceeded,
                    "fake EPS: layer " + std::to_string(layer) + " version " +
                        std::to_string(layers_[layer].version) + " < " + std::to_string(min_version) +
                        " after " + std::to_string(timeout.count()) + " ms");
    }
  }
  if (stopped_) return Aborted("fake EPS stopped");
  const Layer& l = layers_[layer];
  held_[{worker, layer}] = l.published;
  acquires_.push_back(AcquireRecord{worker, layer, min_version, l.version});
  LayerWeights w;
  w.data = l.published->data();
  w.dtype = job_.publish_dtype;
  w.numel = l.plan.bytes > 0 ? l.plan.trainable.numel : l.master.size();
  w.version = l.version;
  if (l.record) {
    w.frozen = l.record->data();
    w.frozen_bytes = l.record->size();
  }
  return w;
}

void FakeEps::Release(int32_t worker, int64_t layer) {
  std::lock_guard<std::mutex> lk(mu_);
  held_.erase({worker, layer});
}

Status FakeEps::Push(int32_t worker, int64_t layer, int64_t step, int64_t micro_batches,
                     const float* grad, size_t numel) {
  std::lock_guard<std::mutex> lk(mu_);
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size())) {
    return NotFound("fake EPS: gradient for unknown layer " + std::to_string(layer));
  }
  const size_t want = TrainableRange(layouts_[layer]).numel;
  if (numel != want) {
    return InvalidArgument("fake EPS: gradient of layer " + std::to_string(layer) + " has " +
                           std::to_string(numel) + " floats, expected " + std::to_string(want));
  }
  if (micro_batches <= 0) return InvalidArgument("fake EPS: micro_batches must be > 0");
  if (step < layers_[layer].version) {
    return FailedPrecondition("fake EPS: step " + std::to_string(step) + " of layer " +
                              std::to_string(layer) + " was already applied (version " +
                              std::to_string(layers_[layer].version) + ")");
  }
  Pending& p = pending_[{step, layer}];
  if (!p.pushed.insert(worker).second) {
    return AlreadyExists("fake EPS: worker " + std::to_string(worker) + " pushed layer " +
                         std::to_string(layer) + " step " + std::to_string(step) + " twice");
  }
  if (p.sum.empty()) p.sum.assign(numel, 0.0f);
  for (size_t i = 0; i < numel; ++i) p.sum[i] += grad[i];
  p.micro_batches += micro_batches;
  if (!opt_.lazy_updates) ApplyReady();
  cv_.notify_all();
  return Status::Ok();
}

Status FakeEps::Done(int32_t worker, const StepReport& report) {
  std::lock_guard<std::mutex> lk(mu_);
  reports_[worker].push_back(report);
  return Status::Ok();
}

std::vector<float> FakeEps::Master(int64_t layer) const {
  std::lock_guard<std::mutex> lk(mu_);
  return layers_.at(layer).master;
}

int64_t FakeEps::Version(int64_t layer) const {
  std::lock_guard<std::mutex> lk(mu_);
  return layers_.at(layer).version;
}

std::vector<float> FakeEps::LastGradient(int64_t layer) const {
  std::lock_guard<std::mutex> lk(mu_);
  return layers_.at(layer).last_grad;
}

Status FakeEps::Experts(int64_t step, const std::vector<uint8_t>& touched) {
  std::lock_guard<std::mutex> lk(mu_);
  if (job_.model.num_experts == 0 || touched.size() != expert_steps_.size()) {
    return InvalidArgument("fake EPS: ReportExperts with " + std::to_string(touched.size()) + " entries, the job has " +
                           std::to_string(expert_steps_.size()) + " experts");
  }
  std::vector<uint8_t>& t = touched_[step];
  t.resize(touched.size(), 0);
  for (size_t i = 0; i < t.size(); ++i) t[i] |= touched[i] ? 1 : 0;
  return Status::Ok();
}

std::vector<int64_t> FakeEps::expert_steps() const {
  std::lock_guard<std::mutex> lk(mu_);
  return expert_steps_;
}

std::vector<float> FakeEps::WeightsBeforeLastUpdate(int64_t layer) const {
  std::lock_guard<std::mutex> lk(mu_);
  return layers_.at(layer).prev_master;
}

std::vector<FakeEps::AcquireRecord> FakeEps::acquires() const {
  std::lock_guard<std::mutex> lk(mu_);
  return acquires_;
}

std::vector<StepReport> FakeEps::reports(int32_t worker) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = reports_.find(worker);
  return it == reports_.end() ? std::vector<StepReport>{} : it->second;
}

double FakeEps::optimizer_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return optimizer_s_;
}

}  // namespace l2l::worker
