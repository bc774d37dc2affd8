// Eager reduce -> AdamW -> cast -> publish, per layer, on a TBB flow graph. See
// update_pipeline.h.
#include "eps_server/update_pipeline.h"

#include <oneapi/tbb/flow_graph.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <deque>

#include "common/adamw.h"
#include "common/fault_point.h"
#include "common/logging.h"
#include "common/parallel_for.h"
#include "common/tsan_annotate.h"
#include "kernels/cpu/adamw_simd.h"

namespace l2l::eps {

namespace {
enum class TaskKind { kNorm, kUpdate };
struct Task {
  int64_t layer;
  TaskKind kind;
  float coef;  // clip coefficient for kUpdate; < 0: compute per layer
};

// TSan only: the graph's hand-off from Put to a body (a spawn inside libtbb; see
// common/tsan_annotate.h). Acquired before the body reads anything, even its own capture
// (the node's copy of the lambda, written by the constructing thread), so the address is
// a global, shared by every pipeline (so under TSan two pipelines' hand-offs order each
// other too, which TBB does not promise; no effect outside TSan builds).
char graph_handoff;  // released again when a body ends (the destructor's join)
}  // namespace

struct UpdatePipeline::Impl {
  tbb::flow::graph graph;
  std::unique_ptr<tbb::flow::function_node<tbb::flow::continue_msg>> node;
  // The tasks behind the node's messages, one per Put. The message carries nothing: a
  // Task copied into it would live in TBB's task memory, written by the sender and read
  // by the thread running the body, ordered only by a spawn inside libtbb (Debian's is
  // uninstrumented: ThreadSanitizer reports the read as a race). This mutex orders them.
  std::mutex mu;
  std::deque<Task> queued GUARDED_BY(mu);

  void Put(const Task& t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queued.push_back(t);
    }
    TsanHappensBefore(&graph_handoff);
    node->try_put(tbb::flow::continue_msg());
  }
  Task Take() {
    std::lock_guard<std::mutex> lock(mu);
    const Task t = queued.front();  // never empty: one message per queued task
    queued.pop_front();
    return t;
  }
};

namespace {
// Which layers get an undo copy under `budget` (see update_pipeline.h): every layer
// needs 4 B/param (its reduced gradient, when deferred); an undo copy costs 8 more (12
// with global clip, where an undo layer's reduced gradient is held too until the last
// norm). The layers whose gradients come first in backward (the last index down) are
// upgraded while the rest of the budget allows.
std::vector<bool> UndoPlan(const std::vector<size_t>& numel, size_t budget, bool global_clip) {
  const size_t upgrade = global_clip ? 12 : 8;
  std::vector<bool> undo(numel.size(), true);
  if (budget == SIZE_MAX) return undo;
  size_t all4 = 0;
  for (size_t n : numel) all4 += 4 * n;
  size_t extra = budget > all4 ? budget - all4 : 0;
  for (size_t i = numel.size(); i-- > 0;) {
    undo[i] = upgrade * numel[i] <= extra;
    if (undo[i]) extra -= upgrade * numel[i];
  }
  return undo;
}
}  // namespace

size_t UpdatePipeline::GuardBytes(const std::vector<size_t>& layer_numel, size_t budget, bool global_clip,
                                  int64_t* undo_layers) {
  const std::vector<bool> undo = UndoPlan(layer_numel, budget, global_clip);
  size_t bytes = 0;
  int64_t n = 0;
  for (size_t l = 0; l < undo.size(); ++l) {
    bytes += (undo[l] ? (global_clip ? 16 : 12) : 4) * layer_numel[l];
    n += undo[l] ? 1 : 0;
  }
  if (undo_layers != nullptr) *undo_layers = n;
  return bytes;
}

size_t UpdatePipeline::MinGuardBytes(const std::vector<size_t>& layer_numel) {
  size_t bytes = 0;
  for (size_t n : layer_numel) bytes += 4 * n;
  return bytes;
}

UpdatePipeline::UpdatePipeline(ParamStore* store, const JobConfig& job, int num_workers,
                               int64_t start_step, size_t undo_budget_bytes)
    : store_(store), job_(job), impl_(std::make_unique<Impl>()) {
  for (int i = 0; i < num_workers; ++i) members_[i] = Range{0, INT64_MAX};
  layers_.resize(store->num_layers());
  for (auto& l : layers_) l.step = start_step;
  expert_steps_.assign(static_cast<size_t>(job.model.n_layer * job.model.num_experts), 0);
  {
    std::vector<size_t> numel;
    for (int64_t l = 0; l < store->num_layers(); ++l) numel.push_back(store->layout(l).numel);
    const std::vector<bool> undo = UndoPlan(numel, undo_budget_bytes, global_clip());
    for (size_t l = 0; l < undo.size(); ++l) layers_[l].deferred = !undo[l];
  }
  completed_step_ = start_step;
  stats_.completed_step = start_step;
  last_complete_ = std::chrono::steady_clock::now();
  impl_->node = std::make_unique<tbb::flow::function_node<tbb::flow::continue_msg>>(
      impl_->graph, tbb::flow::unlimited, [this](const tbb::flow::continue_msg&) {
        TsanHappensAfter(&graph_handoff);
        constructed_.load(std::memory_order_acquire);
        const Task t = impl_->Take();
        if (t.kind == TaskKind::kUpdate) {
          RunUpdate(t.layer, t.coef);
          TsanHappensBefore(&graph_handoff);
          return tbb::flow::continue_msg();
        }
        // Global clip: reduce the workers' gradients into one buffer (summed in worker-id
        // order, exactly as AdamWUpdate sums them, so the result is bit-identical) and
        // take its norm; the workers' buffers (shm slots) are released right away, since
        // the step's updates must wait for the last layer's norm and a worker with fewer
        // gradient slots than layers would otherwise never get a free slot.
        std::vector<const float*> grads;
        int64_t mb = 0;
        {
          std::lock_guard<std::mutex> lock(mu_);
          for (auto& [w, g] : layers_[t.layer].arrived) {
            grads.push_back(g.data);
            mb += g.micro_batches;
          }
        }
        const float scale = 1.0f / static_cast<float>(mb);
        std::vector<float> reduced(store_->layout(t.layer).numel);  // (numel)
        double n2 = 0;
        for (const StateSpan& s : store_->spans(t.layer)) {
          float* dst = reduced.data() + s.begin;
          std::memcpy(dst, grads[0] + s.begin, s.n * sizeof(float));
          for (size_t w = 1; w < grads.size(); ++w) {
            const float* src = grads[w] + s.begin;
            for (size_t i = 0; i < s.n; ++i) dst[i] = dst[i] + src[i];
          }
          const float* one = dst;
          n2 += kernels::ReducedSumSquares(&one, 1, s.n, scale);
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          LayerState& ls = layers_[t.layer];
          for (auto& [w, g] : ls.arrived) {  // entries stay: they still catch duplicates
            if (g.release) g.release();
            g.release = nullptr;
            g.data = nullptr;
          }
          ls.reduced = std::move(reduced);
          ls.reduced_mb = mb;
          ls.norm2 = n2;
          ls.nonfinite = !std::isfinite(n2);  // NaN or Inf anywhere in the reduced gradient
          --running_;
          if (global_clip()) {
            if (++norms_in_step_ == static_cast<int64_t>(layers_.size())) LaunchAllGlobalLocked();
          } else {
            MaybeCommitLocked();  // a deferred layer (bounded undo): checked, waits for the verdict
          }
          cv_.notify_all();
        }
        NotifySkips();
        TsanHappensBefore(&graph_handoff);
        return tbb::flow::continue_msg();
      });
  constructed_.store(true, std::memory_order_release);
}

UpdatePipeline::~UpdatePipeline() {
  impl_->graph.wait_for_all();
  TsanHappensAfter(&graph_handoff);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& l : layers_) {
    for (auto& [w, g] : l.arrived) {
      if (g.release) g.release();
    }
    l.arrived.clear();
    for (auto& [st, at] : l.ahead) {
      for (auto& [w, g] : at) {
        if (g.release) g.release();
      }
    }
    l.ahead.clear();
  }
}

Status UpdatePipeline::Submit(int64_t layer, int64_t step, GradientRef ref) {
  auto reject = [&](Status s) {
    if (ref.release) ref.release();
    return s;
  };
  if (layer < 0 || layer >= store_->num_layers()) {
    return reject(NotFound("gradient for layer " + std::to_string(layer) + ": the model has layers 0.." +
                           std::to_string(store_->num_layers() - 1)));
  }
  const size_t numel = store_->layout(layer).numel;
  if (ref.numel != numel) {
    return reject(InvalidArgument("gradient for layer " + std::to_string(layer) + " has " +
                                  std::to_string(ref.numel) + " floats, the layer has " +
                                  std::to_string(numel)));
  }
  if (ref.micro_batches < 1) {
    return reject(InvalidArgument("gradient for layer " + std::to_string(layer) + ": micro_batches=" +
                                  std::to_string(ref.micro_batches) + " must be >= 1"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) return reject(failure_);
  LayerState& ls = layers_[layer];
  if (!IsMemberLocked(ref.worker_id, step)) {
    return reject(NotFound("worker " + std::to_string(ref.worker_id) + " is not a member of step " +
                           std::to_string(step)));
  }
  // Lock-free mode: a worker may be up to `staleness` steps ahead of this layer's
  // update; its gradient waits for the layer's step (in step order, never mixed in).
  const int64_t ahead_limit = job_.train.mode == TrainMode::kLockfree ? std::max<int64_t>(1, job_.train.staleness) : 0;
  if (step > ls.step && step - ls.step <= ahead_limit) {
    auto& at = ls.ahead[step];
    if (at.count(ref.worker_id) != 0) {
      return reject(AlreadyExists("worker " + std::to_string(ref.worker_id) + " already pushed layer " +
                                  std::to_string(layer) + " step " + std::to_string(step)));
    }
    const int32_t w = ref.worker_id;
    at.emplace(w, std::move(ref));
    return Status::Ok();
  }
  if (step != ls.step) {
    return reject(FailedPrecondition("gradient for layer " + std::to_string(layer) + " step " +
                                     std::to_string(step) + ": the layer expects step " +
                                     std::to_string(ls.step)));
  }
  if (ls.arrived.count(ref.worker_id) != 0) {
    return reject(AlreadyExists("worker " + std::to_string(ref.worker_id) + " already pushed layer " +
                                std::to_string(layer) + " step " + std::to_string(step)));
  }
  const int32_t w = ref.worker_id;
  ls.arrived.emplace(w, std::move(ref));
  last_arrival_ = std::chrono::steady_clock::now();
  MaybeScheduleLocked(layer);
  return Status::Ok();
}

void UpdatePipeline::MaybeScheduleLocked(int64_t layer) {
  LayerState& ls = layers_[layer];
  if (ls.scheduled || !AnyMemberLocked(ls.step)) return;
  for (const auto& [w, r] : members_) {
    if (r.first <= ls.step && ls.step <= r.last && ls.arrived.count(w) == 0) return;
  }
  ls.scheduled = true;
  const bool per_layer = job_.train.clip == ClipMode::kPerLayer && job_.optim.grad_clip > 0;
  if (global_clip() || ls.deferred) {
    // Global clip: reduce + norm first. Deferred (bounded undo): reduce + check, and the
    // update waits for the step's verdict (MaybeCommitLocked launches it).
    if (!global_clip()) ls.coef = per_layer ? -1.0f : 1.0f;
    ++running_;
    impl_->Put(Task{layer, TaskKind::kNorm, 0.0f});
  } else {
    LaunchLocked(layer, per_layer ? -1.0f : 1.0f);
  }
}

void UpdatePipeline::LaunchLocked(int64_t layer, float coef) {
  if (gate_closed_) {
    deferred_.emplace_back(layer, coef);
    return;
  }
  ++running_;
  impl_->Put(Task{layer, TaskKind::kUpdate, coef});
}

void UpdatePipeline::set_offload(std::vector<bool> on_device, OffloadedUpdater* updater) {
  L2L_CHECK(static_cast<int64_t>(on_device.size()) == store_->num_layers())
      << "offload mask has " << on_device.size() << " entries for " << store_->num_layers() << " layers";
  std::lock_guard<std::mutex> lock(mu_);
  offload_ = std::move(on_device);
  offloader_ = updater;
}

Status CpuOffloadedUpdater::Update(int64_t /*layer*/, const AdamWStepArgs& a,
                                   const std::vector<DecayRange>& ranges, float* p, float* m, float* v,
                                   const float* grad_sum, size_t numel) {
  for (const DecayRange& r : ranges) {
    if (r.begin > r.end || r.end > numel) return Internal("offloaded update: range outside the layer");
    AdamWStep(p + r.begin, grad_sum + r.begin, m + r.begin, v + r.begin, r.end - r.begin, WithDecay(a, r.decay));
  }
  return Status::Ok();
}

// The offloaded path of RunUpdate: copy the leased state out (and into the undo copy),
// sum the workers' gradients in worker order as AdamWUpdate does, let the updater run
// AdamW, check finiteness as the fused pass does, copy back and cast the published copy.
Status UpdatePipeline::RunOffloaded(OffloadedUpdater* updater, int64_t layer, const AdamWStepArgs& a,
                                    const std::vector<StateSpan>& spans, const std::vector<const float*>& grads,
                                    float* undo, char* out, std::atomic<bool>* nonfinite) {
  const LayerLayout& layout = store_->layout(layer);
  const size_t numel = layout.numel;
  std::vector<float> p(numel), m(numel), v(numel), g(numel);
  for (const StateSpan& s : spans) {
    std::memcpy(p.data() + s.begin, s.master, s.n * sizeof(float));
    std::memcpy(m.data() + s.begin, s.m, s.n * sizeof(float));
    std::memcpy(v.data() + s.begin, s.v, s.n * sizeof(float));
  }
  if (undo != nullptr) {  // null: a deferred layer, updated after the step's verdict
    std::memcpy(undo, p.data(), numel * sizeof(float));
    std::memcpy(undo + numel, m.data(), numel * sizeof(float));
    std::memcpy(undo + 2 * numel, v.data(), numel * sizeof(float));
  }
  bool finite = true;
  for (size_t i = 0; i < numel; ++i) {
    float gs = grads[0][i];
    for (size_t w = 1; w < grads.size(); ++w) gs = gs + grads[w][i];
    g[i] = gs;
    finite = finite && std::isfinite(gs * a.grad_scale);
  }
  std::vector<DecayRange> ranges;
  for (const ParamInfo& pi : layout.params) ranges.push_back({pi.offset, pi.offset + pi.numel, pi.decay});
  L2L_RETURN_IF_ERROR(updater->Update(layer, a, ranges, p.data(), m.data(), v.data(), g.data(), numel));
  for (const StateSpan& s : spans) {
    std::memcpy(s.master, p.data() + s.begin, s.n * sizeof(float));
    std::memcpy(s.m, m.data() + s.begin, s.n * sizeof(float));
    std::memcpy(s.v, v.data() + s.begin, s.n * sizeof(float));
  }
  const DType dt = store_->publish_dtype();
  if (dt == DType::kBF16) {
    uint16_t* o = reinterpret_cast<uint16_t*>(out);
    for (size_t i = 0; i < numel; ++i) o[i] = FloatToBf16(p[i]);
  } else {
    std::memcpy(out, p.data(), numel * sizeof(float));
  }
  if (!finite) nonfinite->store(true, std::memory_order_relaxed);
  return Status::Ok();
}

void UpdatePipeline::RunUpdate(int64_t layer, float coef) {
  const auto t0 = std::chrono::steady_clock::now();
  const float coef_in = coef;
  std::vector<const float*> grads;
  int64_t mb = 0;
  int64_t step = 0;
  float* undo = nullptr;
  OffloadedUpdater* updater = nullptr;  // this layer's update runs through it (set_offload)
  const size_t numel = store_->layout(layer).numel;
  // Mixture-of-experts block: each expert's AdamW step count this step, 0 = no token
  // anywhere (skipped: its master/m/v stay, its published copy is the old weights).
  const std::vector<ExpertRange> experts = ExpertRanges(job_.model, store_->layout(layer));
  std::vector<int64_t> expert_t(experts.size(), 0);
  bool missing_report = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (offloader_ != nullptr && offload_[static_cast<size_t>(layer)]) updater = offloader_;
    LayerState& ls = layers_[layer];
    step = ls.step;
    if (!ls.reduced.empty()) {  // global clip: reduced by the norm task
      grads.push_back(ls.reduced.data());
      mb = ls.reduced_mb;
    } else {
      for (auto& [w, g] : ls.arrived) {
        grads.push_back(g.data);
        mb += g.micro_batches;
      }
    }
    // Allocated on the layer's first update and kept: no page faults per step. A
    // deferred layer (bounded undo) has none: it runs after the step's verdict.
    if (!ls.deferred && !ls.undo) ls.undo.reset(new float[3 * numel]);
    undo = ls.undo.get();
    if (!experts.empty()) {
      const auto t = experts_touched_.find(step);
      if (t == experts_touched_.end()) {
        missing_report = true;
      } else {
        const int64_t E = job_.model.num_experts, block = store_->layout(layer).block;
        for (int64_t e = 0; e < E; ++e) {
          const size_t k = static_cast<size_t>(block * E + e);
          expert_t[static_cast<size_t>(e)] = t->second[k] ? expert_steps_[k] + 1 : 0;
        }
      }
      updater = nullptr;  // per-expert step counts: the fused pass only
    }
  }
  if (missing_report) {
    FailUpdate(FailedPrecondition("update of mixture-of-experts block layer " + std::to_string(layer) + " step " +
                                  std::to_string(step) + ": no worker reported the step's experts (ReportExperts)"));
    return;
  }
  const int ng = static_cast<int>(grads.size());
  const float inv_mb = 1.0f / static_cast<float>(mb);
  // The layer's state: RAM pages, or the SSD tier's staging buffers (reads of spilled
  // pages are waited for here; written back behind when the lease ends).
  auto lease = store_->Lease(layer, LeaseMode::kUpdate);
  if (!lease.ok()) {
    FailUpdate(lease.status().WithContext("update of layer " + std::to_string(layer) + " step " +
                                                 std::to_string(step)));
    return;
  }
  const auto& spans = lease->spans();
  auto offset = [&](const StateSpan& s) {
    std::vector<const float*> off(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) off[i] = grads[i] + s.begin;
    return off;
  };
  if (coef < 0) {  // per-layer clip
    double n2 = 0;
    for (const StateSpan& s : spans) n2 += kernels::ReducedSumSquares(offset(s).data(), ng, s.n, inv_mb);
    coef = ClipCoefficient(std::sqrt(n2), job_.optim.grad_clip);
  }
  // The step's arguments, weight_decay included (WithDecay drops it per tensor).
  const AdamWStepArgs a = AdamWStepArgsAt(job_.optim, step, inv_mb * coef);
  const LayerLayout& layout = store_->layout(layer);
  const DType dt = store_->publish_dtype();
  char* out = static_cast<char*>(store_->BeginPublish(layer));
  // Work items: (span, tensor) intersections, so weight decay follows ParamInfo::decay.
  // t: the AdamW step count (a.t), 0 = an expert without tokens (copied, not updated).
  struct Item { const StateSpan* s; size_t lo, hi; bool decay; int64_t t; };
  std::vector<Item> items;
  for (const StateSpan& s : spans) {
    for (const ParamInfo& p : layout.params) {
      const size_t lo = std::max(s.begin, p.offset), hi = std::min(s.begin + s.n, p.offset + p.numel);
      int64_t t = a.t;
      for (size_t e = 0; e < experts.size(); ++e) {
        if (p.offset >= experts[e].begin && p.offset < experts[e].end) t = expert_t[e];
      }
      if (lo < hi) items.push_back({&s, lo, hi, p.decay, t});
    }
  }
  std::atomic<bool> nonfinite{false};
  if (updater != nullptr) {
    Status st = RunOffloaded(updater, layer, a, spans, grads, undo, out, &nonfinite);
    if (!st.ok()) {
      lease->Release();
      FailUpdate(st.WithContext("offloaded update of layer " + std::to_string(layer) + " step " +
                                std::to_string(step)));
      return;
    }
  } else {
  ParallelForIndex(size_t{0}, items.size(), [&](size_t i) {
    const Item& it = items[i];
    const size_t k = it.lo - it.s->begin;  // offset inside the span
    const size_t n = it.hi - it.lo;
    // Undo copy of the range, taken just before the pass that overwrites it (cache-hot).
    if (undo != nullptr) {
      std::memcpy(undo + it.lo, it.s->master + k, n * sizeof(float));
      std::memcpy(undo + numel + it.lo, it.s->m + k, n * sizeof(float));
      std::memcpy(undo + 2 * numel + it.lo, it.s->v + k, n * sizeof(float));
    }
    if (it.t == 0) {  // an expert without tokens: publish its weights unchanged
      char* o = out + it.lo * DTypeSize(dt);
      if (dt == DType::kBF16) {
        FloatToBf16(it.s->master + k, reinterpret_cast<uint16_t*>(o), n);
      } else {
        std::memcpy(o, it.s->master + k, n * sizeof(float));
      }
      return;
    }
    std::vector<const float*> g(grads.size());
    for (size_t w = 0; w < grads.size(); ++w) g[w] = grads[w] + it.lo;
    AdamWStepArgs ai = WithDecay(a, it.decay);
    ai.t = it.t;
    if (!kernels::AdamWUpdate(ai, it.s->master + k, it.s->m + k, it.s->v + k, g.data(),
                              ng, n, dt, out + it.lo * DTypeSize(dt))) {
      nonfinite.store(true, std::memory_order_relaxed);
    }
  });
  }
  lease->Release();  // starts the write-behind of spilled pages
  FaultPoint("eps.update");  // tests: die with the layer applied, the step not committed
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Applied, not published: the step commits (or is skipped) once every layer applied it
  // and its losses are in (MaybeCommitLocked). Under mu_: a worker that sees version
  // step+1 and pushes its step+1 gradient at once must find the layer collecting step+1.
  {
    std::lock_guard<std::mutex> lock(mu_);
    LayerState& ls = layers_[layer];
    // The workers' buffers (shm slots) go back now; the entries stay until the commit
    // to catch duplicates. The undo copy, not the gradients, serves a rollback.
    for (auto& [w, g] : ls.arrived) {
      if (g.release) g.release();
      g.release = nullptr;
      g.data = nullptr;
    }
    ls.applied = true;
    last_applied_ = std::chrono::steady_clock::now();
    ls.nonfinite = ls.nonfinite || nonfinite.load();
    ls.coef = coef_in;
    ls.pending_out = out;
    ls.busy_s = secs;
    --running_;
    MaybeCommitLocked();
    cv_.notify_all();
  }
  NotifySkips();
}

void UpdatePipeline::MaybeCommitLocked() {
  if (layers_.empty() || !failure_.ok()) return;
  const int64_t step = layers_[0].step;
  for (const LayerState& l : layers_) {
    if (l.step != step || !(l.applied || DeferredReadyLocked(l))) return;
  }
  std::string reason;
  if (coordinator_ != nullptr) {
    // A shard: this daemon's verdict is one of the shards'; the job's (shard 0's) decides.
    if (const auto v = global_verdict_.find(step); v != global_verdict_.end()) {
      reason = v->second;
      return CommitOrSkipLocked(step, reason);
    }
  }
  if (gate_on_losses_) {
    const auto it = losses_.find(step);
    for (const auto& [w, r] : members_) {
      if (r.first > step || step > r.last) continue;
      if (it == losses_.end() || it->second.count(w) == 0) return;  // a loss is still due
    }
    if (it != losses_.end()) {
      for (const auto& [w, loss] : it->second) {
        if (!std::isfinite(loss) && reason.empty()) {
          reason = "worker " + std::to_string(w) + " reported loss " + std::to_string(loss);
        }
      }
    }
  }
  for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()) && reason.empty(); ++l) {
    if (layers_[l].nonfinite) reason = "non-finite gradient in layer " + std::to_string(store_->model_layer(l));
  }
  if (coordinator_ != nullptr) {
    if (verdict_posted_ != step) {
      verdict_posted_ = step;
      coordinator_->PostVerdict(step, reason);  // answered by SetGlobalVerdict
    }
    return;
  }
  CommitOrSkipLocked(step, reason);
}

void UpdatePipeline::SetGlobalVerdict(int64_t step, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (layers_.empty() || step < layers_[0].step) return;  // a step already done (a resent answer)
    global_verdict_[step] = reason;
    MaybeCommitLocked();
    cv_.notify_all();
  }
  NotifySkips();
}

void UpdatePipeline::SetGlobalNorm2(int64_t step, double total) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (layers_.empty() || step < layers_[0].step) return;
    global_norm2_[step] = total;
    if (global_clip() && norms_in_step_ == static_cast<int64_t>(layers_.size()) && layers_[0].step == step) {
      LaunchAllGlobalLocked();
    }
    cv_.notify_all();
  }
  NotifySkips();
}

void UpdatePipeline::set_coordinator(StepCoordinator* c) {
  std::lock_guard<std::mutex> lock(mu_);
  coordinator_ = c;
}

void UpdatePipeline::CommitOrSkipLocked(int64_t step, const std::string& reason) {
  if (reason.empty()) {
    // Bounded undo: the verdict is commit, so the deferred layers' updates run now, all
    // at once and past the gate's queue (a Freeze waits for them: a started commit always
    // ends, and no deferred layer is ever applied without its step committing). A closed
    // gate holds them until Release (which calls this again).
    bool launched = false;
    for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) {
      LayerState& ls = layers_[l];
      if (!DeferredReadyLocked(ls)) continue;
      if (gate_closed_) return;
      ls.deferred_launched = true;
      launched = true;
      ++running_;
      impl_->Put(Task{l, TaskKind::kUpdate, ls.coef});
    }
    if (launched) return;  // the last of them commits (RunUpdate -> here, all applied)
    for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) store_->EndPublish(l, step + 1);
    stats_.consecutive_skips = 0;
    if (const auto t = experts_touched_.find(step); t != experts_touched_.end()) {
      for (size_t k = 0; k < expert_steps_.size(); ++k) expert_steps_[k] += t->second[k] ? 1 : 0;
    }
  } else {
    for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) {
      // A deferred layer was never touched: its old weights are published as t+1.
      Status s = layers_[l].applied ? RestoreLayerLocked(l, step + 1) : store_->PublishMaster(l, step + 1);
      if (!s.ok()) {
        // The state of layer l is not what it was: nothing more may move.
        L2L_LOG_ERROR("update pipeline failed: {}", s.ToString());
        if (failure_.ok()) failure_ = s;
        cv_.notify_all();
        return;
      }
    }
    ++stats_.skipped_steps;
    ++stats_.consecutive_skips;
    stats_.last_skip_reason = reason;
    SkipEvent e;
    e.step = step;
    e.reason = reason;
    e.consecutive = stats_.consecutive_skips;
    e.total = stats_.skipped_steps;
    const int64_t k = job_.train.skip_pause_after;
    if (k > 0 && stats_.consecutive_skips >= k && !stats_.skip_paused) {
      // One hold: the gate closes as this step completes (FinishUpdateLocked).
      stats_.skip_paused = true;
      ++holds_;
      e.paused = true;
    }
    skip_events_.push_back(e);
  }
  for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) {
    LayerState& ls = layers_[l];
    ls.applied = false;
    ls.nonfinite = false;
    ls.deferred_launched = false;
    ls.pending_out = nullptr;
    FinishUpdateLocked(l, ls.busy_s);
    ls.busy_s = 0;  // a deferred layer of a skipped step ran nothing
  }
  losses_.erase(losses_.begin(), losses_.upper_bound(step));
  experts_touched_.erase(experts_touched_.begin(), experts_touched_.upper_bound(step));
  global_verdict_.erase(global_verdict_.begin(), global_verdict_.upper_bound(step));
  global_norm2_.erase(global_norm2_.begin(), global_norm2_.upper_bound(step));
}

Status UpdatePipeline::RestoreLayerLocked(int64_t l, int64_t version) {
  LayerState& ls = layers_[l];
  const size_t numel = store_->layout(l).numel;
  auto lease = store_->Lease(l, LeaseMode::kUpdate);
  if (!lease.ok()) {
    return lease.status().WithContext("restoring layer " + std::to_string(l) + " after a skipped step");
  }
  const DType dt = store_->publish_dtype();
  const float* undo = ls.undo.get();
  if (undo == nullptr) {  // a deferred layer applied by a commit that then failed
    return Internal("layer " + std::to_string(l) + " has no undo copy (its update ran after the step's verdict)");
  }
  for (const StateSpan& s : lease->spans()) {
    std::memcpy(s.master, undo + s.begin, s.n * sizeof(float));
    std::memcpy(s.m, undo + numel + s.begin, s.n * sizeof(float));
    std::memcpy(s.v, undo + 2 * numel + s.begin, s.n * sizeof(float));
    if (dt == DType::kBF16) {
      FloatToBf16(s.master, static_cast<uint16_t*>(ls.pending_out) + s.begin, s.n);
    } else {
      std::memcpy(static_cast<float*>(ls.pending_out) + s.begin, s.master, s.n * sizeof(float));
    }
  }
  lease->Release();
  store_->EndPublish(l, version);
  return Status::Ok();
}

void UpdatePipeline::UndoAppliedLocked() {
  for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) {
    LayerState& ls = layers_[l];
    if (!ls.applied) continue;
    // Republishes the version readers already have (same bytes) to end the begun publish.
    if (Status s = RestoreLayerLocked(l, ls.step); !s.ok()) {
      L2L_LOG_ERROR("update pipeline failed: {}", s.ToString());
      if (failure_.ok()) failure_ = s;
      continue;
    }
    ls.applied = false;
    ls.nonfinite = false;
    ls.pending_out = nullptr;
    ls.scheduled = false;
  }
}

void UpdatePipeline::NotifySkips() {
  std::vector<SkipEvent> events;
  std::function<void(const SkipEvent&)> cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(skip_events_);
    cb = on_skip_;
  }
  for (const SkipEvent& e : events) {
    L2L_LOG_WARN("step {} skipped, state unchanged: {} ({} in a row, {} in all){}", e.step, e.reason,
                 e.consecutive, e.total,
                 e.paused ? "; training paused (training.skip_pause_after reached): fix the data or "
                            "the learning rate, then resume"
                          : "");
    if (cb) cb(e);
  }
}

void UpdatePipeline::set_gate_on_losses(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  gate_on_losses_ = on;
}

void UpdatePipeline::ReportLoss(int32_t worker_id, int64_t step, double loss) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!layers_.empty() && step < layers_[0].step) return;  // that step is decided
    losses_[step][worker_id] = loss;
    MaybeCommitLocked();
    cv_.notify_all();
  }
  NotifySkips();
}

void UpdatePipeline::set_on_skip(std::function<void(const SkipEvent&)> f) {
  std::lock_guard<std::mutex> lock(mu_);
  on_skip_ = std::move(f);
}

void UpdatePipeline::ClearSkipPause() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stats_.skip_paused) return;
    stats_.skip_paused = false;
    stats_.consecutive_skips = 0;
  }
  Release();
}

void UpdatePipeline::FailUpdate(Status s) {
  std::function<void(const Status&)> cb;
  {
    std::lock_guard<std::mutex> lock(mu_);
    L2L_LOG_ERROR("update pipeline failed: {}", s.ToString());
    if (failure_.ok()) {
      failure_ = s;
      cb = on_failure_;
    }
    // The layer stays scheduled (nothing re-schedules it) and its gradients stay held:
    // no state moves after a fault.
    --running_;
    cv_.notify_all();
  }
  if (cb) cb(s);
}

Status UpdatePipeline::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void UpdatePipeline::set_on_failure(std::function<void(const Status&)> f) {
  std::lock_guard<std::mutex> lock(mu_);
  on_failure_ = std::move(f);
}

void UpdatePipeline::FinishUpdateLocked(int64_t layer, double seconds) {
  LayerState& ls = layers_[layer];
  for (auto& [w, g] : ls.arrived) {
    if (g.release) g.release();
  }
  ls.arrived.clear();
  std::vector<float>().swap(ls.reduced);
  ls.scheduled = false;
  ls.norm2 = -1;
  ++ls.step;
  busy_s_ += seconds;
  // Lock-free mode: gradients that arrived ahead for the new step join now.
  if (auto it = ls.ahead.find(ls.step); it != ls.ahead.end()) {
    ls.arrived = std::move(it->second);
    ls.ahead.erase(it);
  }
  // A step is complete when every layer has applied it (layers may run ahead in
  // lock-free mode, so count layers past completed_step_ rather than updates).
  int64_t min_step = INT64_MAX, past = 0;
  for (const auto& l : layers_) min_step = std::min(min_step, l.step);
  if (min_step == completed_step_) {
    for (const auto& l : layers_) past += l.step > completed_step_ ? 1 : 0;
    layers_done_in_step_ = past;
  }
  while (completed_step_ < min_step) {
    const auto now = std::chrono::steady_clock::now();
    ++completed_step_;
    layers_done_in_step_ = 0;
    for (const auto& l : layers_) layers_done_in_step_ += l.step > completed_step_ ? 1 : 0;
    stats_.completed_step = completed_step_;
    stats_.last_step_busy_s = busy_s_;
    stats_.last_step_exposed_s = std::chrono::duration<double>(now - last_arrival_).count();
    stats_.last_step_wall_s = std::chrono::duration<double>(now - last_complete_).count();
    StepUpdateTimes& ut = update_times_[completed_step_];
    ut.busy_s = busy_s_;
    ut.lag_s = stats_.last_step_exposed_s;
    ut.commit_wait_s = std::max(0.0, std::chrono::duration<double>(now - last_applied_).count());
    update_times_.erase(update_times_.begin(), update_times_.lower_bound(completed_step_ - kUpdateHistory + 1));
    last_complete_ = now;
    busy_s_ = 0;
    for (auto at = hold_at_.begin(); at != hold_at_.end();) {
      if (*at == completed_step_) {
        at = hold_at_.erase(at);
        ++holds_;
      } else {
        ++at;
      }
    }
    if (holds_ > 0) gate_closed_ = true;
  }
  if (!ls.arrived.empty()) MaybeScheduleLocked(layer);
  cv_.notify_all();
}

void UpdatePipeline::SetMember(int32_t id, int64_t first, int64_t last) {
  std::lock_guard<std::mutex> lock(mu_);
  members_[id] = Range{first, last};
  for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) MaybeScheduleLocked(l);
  MaybeCommitLocked();
}

void UpdatePipeline::RemoveMember(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  members_.erase(id);
  for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) MaybeScheduleLocked(l);
  MaybeCommitLocked();
}

bool UpdatePipeline::IsMemberLocked(int32_t id, int64_t step) const {
  auto it = members_.find(id);
  return it != members_.end() && it->second.first <= step && step <= it->second.last;
}

bool UpdatePipeline::AnyMemberLocked(int64_t step) const {
  for (const auto& [w, r] : members_) {
    if (r.first <= step && step <= r.last) return true;
  }
  return false;
}

bool UpdatePipeline::DropWorker(int32_t worker_id, int64_t min_step) {
  std::lock_guard<std::mutex> lock(mu_);
  L2L_CHECK(running_ == 0) << "DropWorker while updates run (freeze the pipeline first)";
  if (worker_id >= 0) {
    // A layer already reduced (global clip) mixes this worker's gradient into the sum.
    for (const auto& l : layers_) {
      if (l.step >= min_step && !l.reduced.empty() && l.arrived.count(worker_id) != 0) return false;
    }
  }
  // Nothing runs, so every scheduled layer sits in deferred_ (or waits for the global
  // norms): un-schedule all, then re-check which layers are complete. Layers already
  // reduced (global clip) keep their sum and norm.
  deferred_.clear();
  norms_in_step_ = 0;
  for (auto& l : layers_) {
    const bool touch = l.step >= min_step;
    if (l.applied) {
      // Applied, waiting for the step's commit: its gradients are consumed already.
      // (REQUIRES: not touched; ResetToStep undoes applied layers before dropping all.)
      L2L_CHECK(!touch) << "DropWorker on a layer applied ahead of its step's commit";
      if (!l.reduced.empty()) ++norms_in_step_;
      continue;
    }
    if (touch && worker_id < 0) std::vector<float>().swap(l.reduced);
    if (!l.reduced.empty()) {
      l.scheduled = true;
      ++norms_in_step_;
    } else {
      l.scheduled = false;
      l.norm2 = -1;
    }
    for (auto& [st, at] : l.ahead) {
      for (auto it = at.begin(); it != at.end();) {
        if (st < min_step || (worker_id >= 0 && it->first != worker_id)) {
          ++it;
          continue;
        }
        if (it->second.release) it->second.release();
        it = at.erase(it);
      }
    }
    if (!touch) continue;
    for (auto it = l.arrived.begin(); it != l.arrived.end();) {
      if (worker_id >= 0 && it->first != worker_id) {
        ++it;
        continue;
      }
      if (it->second.release) it->second.release();
      it = l.arrived.erase(it);
    }
  }
  if (global_clip() && norms_in_step_ == static_cast<int64_t>(layers_.size())) {
    LaunchAllGlobalLocked();
  } else {
    for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) MaybeScheduleLocked(l);
  }
  return true;
}

void UpdatePipeline::LaunchAllGlobalLocked() {
  double total = 0;
  if (coordinator_ != nullptr) {
    // A shard: the norm is over every shard's layers, summed by shard 0 in model layer
    // order (the same sum, term for term, as one daemon's loop below).
    const int64_t step = layers_[0].step;
    const auto it = global_norm2_.find(step);
    if (it == global_norm2_.end()) {
      if (norms_posted_ != step) {
        norms_posted_ = step;
        std::vector<double> norm2;
        for (const auto& l : layers_) norm2.push_back(l.norm2);
        coordinator_->PostNorms(step, std::move(norm2));  // answered by SetGlobalNorm2
      }
      return;  // norms_in_step_ stays complete until the answer
    }
    total = it->second;
  } else {
    for (auto& l : layers_) total += l.norm2;  // layer order: deterministic
  }
  const float coef = ClipCoefficient(std::sqrt(total), job_.optim.grad_clip);
  norms_in_step_ = 0;
  for (int64_t l = 0; l < static_cast<int64_t>(layers_.size()); ++l) {
    LayerState& ls = layers_[l];
    if (ls.applied) continue;
    if (ls.deferred) {
      ls.coef = coef;  // launched by the step's verdict (MaybeCommitLocked)
    } else {
      LaunchLocked(l, coef);
    }
  }
  MaybeCommitLocked();  // every layer deferred: the verdict may be in already
}

Status UpdatePipeline::ReportExperts(int32_t worker_id, int64_t step, const std::vector<uint8_t>& touched) {
  const size_t n = static_cast<size_t>(job_.model.n_layer * job_.model.num_experts);
  if (n == 0 || touched.size() != n) {
    return InvalidArgument("ReportExperts from worker " + std::to_string(worker_id) + ": " +
                           std::to_string(touched.size()) + " entries, the job has " + std::to_string(n) +
                           " experts (model.n_layer x model.num_experts)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!layers_.empty() && step < layers_[0].step) {
    return FailedPrecondition("ReportExperts(step " + std::to_string(step) + ") from worker " +
                              std::to_string(worker_id) + ": the EPS is at step " + std::to_string(layers_[0].step));
  }
  std::vector<uint8_t>& t = experts_touched_[step];
  t.resize(n, 0);
  for (size_t i = 0; i < n; ++i) t[i] |= touched[i] != 0 ? 1 : 0;
  return Status::Ok();
}

std::vector<int64_t> UpdatePipeline::expert_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expert_steps_;
}

Status UpdatePipeline::set_expert_steps(std::vector<int64_t> steps) {
  std::lock_guard<std::mutex> lock(mu_);
  if (steps.size() != expert_steps_.size()) {
    return InvalidArgument("expert step counts: " + std::to_string(steps.size()) + " entries, the job has " +
                           std::to_string(expert_steps_.size()) + " experts");
  }
  expert_steps_ = std::move(steps);
  return Status::Ok();
}

void UpdatePipeline::ResetToStep(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    UndoAppliedLocked();  // layers applied ahead of the abandoned step's commit
  }
  DropWorker(-1);
  std::lock_guard<std::mutex> lock(mu_);
  experts_touched_.erase(experts_touched_.lower_bound(step), experts_touched_.end());  // redone: reported again
  for (auto& l : layers_) {
    l.step = step;
    l.nonfinite = false;
    l.deferred_launched = false;
  }
  losses_.clear();
  global_verdict_.clear();
  global_norm2_.clear();
  verdict_posted_ = norms_posted_ = -1;
  completed_step_ = step;
  stats_.completed_step = step;
  layers_done_in_step_ = 0;
  cv_.notify_all();
}

std::vector<int32_t> UpdatePipeline::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> ids;
  for (const auto& [w, r] : members_) {
    if (r.last >= completed_step_) ids.push_back(w);
  }
  return ids;
}

bool UpdatePipeline::HoldAt(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (completed_step_ > step || (completed_step_ == step && (layers_done_in_step_ > 0 || running_ > 0))) {
    return false;
  }
  if (completed_step_ == step) {  // already at that boundary, nothing started: close now
    ++holds_;
    gate_closed_ = true;
    return true;
  }
  hold_at_.push_back(step);
  return true;
}

bool UpdatePipeline::WaitHeld(int64_t step, std::chrono::milliseconds timeout) {
  UniqueLock lock(mu_);
  return cv_.wait_for(lock.native(), timeout, [&]() REQUIRES(mu_) {
    return completed_step_ >= step && gate_closed_ && running_ == 0 &&
           std::find(hold_at_.begin(), hold_at_.end(), step) == hold_at_.end();
  });
}

void UpdatePipeline::CancelHoldAt(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto at = std::find(hold_at_.begin(), hold_at_.end(), step);
    if (at != hold_at_.end()) {
      hold_at_.erase(at);
      return;
    }
  }
  Release();
}

UpdatePipeline::Frozen UpdatePipeline::Freeze() {
  UniqueLock lock(mu_);
  ++holds_;
  gate_closed_ = true;
  cv_.wait(lock.native(), [&]() REQUIRES(mu_) { return running_ == 0; });
  Frozen f;
  f.step = completed_step_;
  f.applied = layers_done_in_step_ > 0;
  // A layer whose update of this step is queued (held by the gate) or reduced (global
  // clip) will complete the step with the current members: a worker joining now must
  // start at the next step, or it would wait for a version that is already past.
  bool any_scheduled = false;
  for (const LayerState& l : layers_) any_scheduled = any_scheduled || l.scheduled;
  f.at_boundary = layers_done_in_step_ == 0 && !any_scheduled;
  return f;
}

bool UpdatePipeline::WaitForStep(int64_t step, std::chrono::milliseconds timeout) {
  UniqueLock lock(mu_);
  return cv_.wait_for(lock.native(), timeout, [&]() REQUIRES(mu_) { return completed_step_ >= step || !failure_.ok(); }) &&
         completed_step_ >= step;
}

int64_t UpdatePipeline::Hold() {
  UniqueLock lock(mu_);
  ++holds_;
  // No update of the next step has started: close now. Otherwise the step's last
  // update closes the gate (FinishUpdateLocked).
  bool applied = false;
  for (const LayerState& l : layers_) applied = applied || l.applied;
  if (layers_done_in_step_ == 0 && running_ == 0 && !applied) gate_closed_ = true;
  // A failed pipeline never reaches a boundary: return at once (callers check failure()).
  cv_.wait(lock.native(), [&]() REQUIRES(mu_) { return (gate_closed_ && running_ == 0) || (!failure_.ok() && running_ == 0); });
  return completed_step_;
}

void UpdatePipeline::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  if (holds_ == 0) return;
  if (--holds_ > 0) return;
  gate_closed_ = false;
  auto deferred = std::move(deferred_);
  deferred_.clear();
  for (auto& [layer, coef] : deferred) LaunchLocked(layer, coef);
  MaybeCommitLocked();  // bounded undo: a commit the gate held launches its deferred layers
}

PipelineStats UpdatePipeline::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::optional<StepUpdateTimes> UpdatePipeline::UpdateTimesFor(int64_t version) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = update_times_.find(version);
  if (it == update_times_.end()) return std::nullopt;
  return it->second;
}

}  // namespace l2l::eps
