// EpsCore: job, workers, shm gradient consumers, the data-path calls. Loss handling,
// rollback, checkpoints, export and shutdown live in eps_core_recovery.cc. See
// eps_core.h.
#include "eps_server/eps_core.h"


#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/adamw.h"
#include "common/logging.h"
#include "common/lora.h"
#include "common/lora_frozen.h"
#include "common/parallel_for.h"
#include "common/path_policy.h"
#include "eps_server/checkpoint.h"
#include "eps_server/eps_core_internal.h"
#include "eps_server/host_budget.h"
#include "eps_server/optimizer_split.h"

namespace l2l::eps {
namespace {

// Refuses a state with a NaN or Inf anywhere (master, m or v): such a value would make
// every later update of its layer non-finite. Names the layer, array and element.
Status CheckFinite(const ParamStore& store, const std::string& origin) {
  static const char* const kArrays[] = {"master weights", "AdamW m", "AdamW v"};
  std::vector<float> buf;
  for (int64_t l = 0; l < store.num_layers(); ++l) {
    const LayerLayout& layout = store.layout(l);
    buf.resize(layout.numel);
    for (int which = 0; which < 3; ++which) {
      L2L_RETURN_IF_ERROR(store.ReadState(l, which, buf.data()));
      for (size_t i = 0; i < buf.size(); ++i) {
        if (std::isfinite(buf[i])) continue;
        std::string tensor = "?";
        for (const ParamInfo& p : layout.params) {
          if (p.offset <= i && i < p.offset + p.numel) tensor = p.name + "[" + std::to_string(i - p.offset) + "]";
        }
        return InvalidArgument("initial state from " + origin + " is not finite: layer " + std::to_string(l) + " " +
                               kArrays[which] + " " + tensor + " = " + std::to_string(buf[i]) +
                               "; refusing to train from it (fix or re-export the weights)");
      }
    }
  }
  return Status::Ok();
}

// Registration::data_roots: the job's own (a confined job), else the state dir and the
// directories of the job's data files (a job from a checkpoint or from code).
std::vector<std::string> WorkerDataRoots(const JobConfig& job, const JobStart& start, const std::string& state_dir) {
  if (!start.data_roots.empty()) return start.data_roots;
  std::vector<std::string> dirs = {state_dir.empty() ? "." : state_dir};
  for (const auto& [key, path] : JobDataPaths(job)) dirs.push_back(std::filesystem::path(path).parent_path().string());
  return CanonicalRoots(dirs);
}

}  // namespace

EpsCore::EpsCore(CoreOptions opts) : opts_(std::move(opts)) {}

EpsCore::~EpsCore() {
  Stop();
  // A job paused by the operator stays frozen while the pipeline is torn down.
  operator_hold_.KeepForever();
}

bool EpsCore::has_job() const {
  std::lock_guard<std::mutex> lock(mu_);
  return has_job_;
}

Status EpsCore::CreateJob(const JobConfig& job, const std::vector<std::vector<float>>* initial,
                          int64_t start_step) {
  JobStart start;
  if (initial != nullptr) start = FromBuffers(*initial);
  start.step = start_step;
  return CreateJob(job, start);
}

// The interleaved optimizer's split for this job: the setting, the measured and reported
// rates, the choice (optimizer_split.h); the pipeline routes the chosen layers through
// the worker updater while a worker takes updates, else the fused pass keeps them.
void EpsCore::ApplyOptimizerSplit(const std::string& why) {
  const JobConfig job = this->job();
  std::vector<int64_t> layer_params;
  for (int64_t l = 0; l < store_->num_layers(); ++l) {
    layer_params.push_back(static_cast<int64_t>(store_->layout(l).numel));
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  OptimizerRates rates;
  rates.cpu_update_params_per_s = cpu_update_rate_;
  rates.cpu_cast_params_per_s = kInf;  // fused into the update
  rates.h2d_bytes_per_s = rates.d2h_bytes_per_s = kInf;
  // Any taker may get any task: plan with the slowest one (a link of 0 = none: free).
  std::string takers;
  for (const auto& [id, o] : offers_) {
    const double g = o.update_params_per_s;
    rates.gpu_update_params_per_s = takers.empty() ? g : std::min(rates.gpu_update_params_per_s, g);
    if (o.h2d_bytes_per_s > 0) rates.h2d_bytes_per_s = std::min(rates.h2d_bytes_per_s, o.h2d_bytes_per_s);
    if (o.d2h_bytes_per_s > 0) rates.d2h_bytes_per_s = std::min(rates.d2h_bytes_per_s, o.d2h_bytes_per_s);
    char buf[256];
    std::snprintf(buf, sizeof(buf), "%sworker %d on %s: AdamW %.3g params/s, h2d %.3g B/s, d2h %.3g B/s",
                  takers.empty() ? "" : "; ", id, o.device.c_str(), g, o.h2d_bytes_per_s, o.d2h_bytes_per_s);
    takers += buf;
  }
  // What the model calls the links is, here, the whole path of a layer's state: the
  // daemon copies p, m, v and the summed gradient (16 B/param) into the worker's exchange
  // segment on one thread, the worker moves them to its device; the updated p, m, v
  // (12 B/param) come back the same way. The model charges 12 B/param each way at the
  // link's rate, so fold the extra bytes and the daemon's copies into the bandwidths.
  if (copy_bytes_per_s_ > 0 && !offers_.empty()) {
    rates.h2d_bytes_per_s = 12.0 / (16.0 / copy_bytes_per_s_ + 16.0 / rates.h2d_bytes_per_s);
    rates.d2h_bytes_per_s = 12.0 / (12.0 / copy_bytes_per_s_ + 12.0 / rates.d2h_bytes_per_s);
  }
  Result<OptimizerSplit> split = ChooseOptimizerSplit(job.optim, layer_params, rates, {});
  if (!split.ok()) {
    L2L_LOG_WARN("optimizer split ({}): {}; the daemon updates every layer", why, split.status().ToString());
    pipeline_->set_offload(std::vector<bool>(layer_params.size(), false), nullptr);
    return;
  }
  std::string layers;
  for (size_t l = 0; l < split->on_gpu.size(); ++l) {
    if (split->on_gpu[l]) layers += (layers.empty() ? "" : ",") + std::to_string(l);
  }
  L2L_LOG_INFO("optimizer ({}): {}; {}", why, split->description,
               takers.empty() ? std::string("no worker takes updates") : "takers: " + takers);
  if (layers.empty()) {
    pipeline_->set_offload(split->on_gpu, nullptr);
  } else if (offers_.empty()) {
    // The warning path: the layers are chosen but no worker can run them (yet).
    pipeline_->set_offload(split->on_gpu, nullptr);
    L2L_LOG_WARN("optim.gpu_fraction={}: no worker takes updates (none registered offering its device over the shm "
                 "transport); the daemon updates layers [{}] itself until one does",
                 ToString(job.optim.gpu_fraction), layers);
  } else {
    pipeline_->set_offload(split->on_gpu, updater_.get());
    L2L_LOG_INFO("optimizer: layers [{}] are updated on the workers' devices ({} taker(s)); the daemon updates the rest",
                 layers, offers_.size());
  }
}

Status EpsCore::CreateJob(const JobConfig& job, const JobStart& start) {
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (has_job_) return FailedPrecondition("the daemon already runs job '" + opts_.job_id + "'");
    if (stopped_) return Aborted("the daemon is stopping");
  }
  L2L_RETURN_IF_ERROR(job.Validate());
  L2L_RETURN_IF_ERROR(CheckEvalData(job));
  if (start.step < 0) return InvalidArgument("start step " + std::to_string(start.step) + " must be >= 0");
  const std::string prefix = "l2l-" + opts_.job_id + "-";
  auto removed = RemoveJobSegments(opts_.job_id);
  if (removed.ok() && *removed > 0) {
    L2L_LOG_WARN("removed {} stale shared-memory segment(s) /{}* left by an earlier run", *removed, prefix);
  }
  // A daemon killed while writing a checkpoint leaves its temporary directory behind
  // (as big as a checkpoint); the completed checkpoints and `latest` are untouched.
  if (auto stale = RemoveStaleCheckpointTemps(checkpoint_root()); !stale.ok()) {
    L2L_LOG_WARN("{}", stale.status().ToString());
  } else if (*stale > 0) {
    L2L_LOG_WARN("removed {} partial checkpoint(s) left in {} by a daemon killed while writing them", *stale,
                 checkpoint_root());
  }
  // A shard holds its layers only (common/shard_plan.h): the same plan on every shard.
  LayerRange own{0, -1};
  std::vector<LayerRange> plan;
  if (opts_.shard.sharded()) {
    if (opts_.shards == nullptr) return Internal("a sharded daemon needs its shard link");
    if (job.lora.enabled || job.model.num_experts > 0 || job.train.mode != TrainMode::kSync) {
      return Unimplemented(std::string("this job cannot be sharded yet: ") +
                           (job.lora.enabled          ? "a LoRA job (its state is small: run one l2l-eps)"
                            : job.model.num_experts > 0 ? "a mixture-of-experts model (per-expert step counts)"
                                                        : "train.mode lockfree (shards agree on each step's commit)"));
    }
    std::vector<int64_t> numel;
    for (const LayerLayout& l : BuildLayout(job.model)) numel.push_back(static_cast<int64_t>(l.numel));
    if (opts_.shard_layers.empty()) {
      L2L_ASSIGN_OR_RETURN(plan, BalancedShardRanges(numel, opts_.shard.count));
    } else {
      L2L_ASSIGN_OR_RETURN(plan, ParseShardBoundaries(opts_.shard_layers, static_cast<int64_t>(numel.size()),
                                                      opts_.shard.count));
    }
    L2L_RETURN_IF_ERROR(CheckShardRanges(plan, static_cast<int64_t>(numel.size())));
    own = plan[static_cast<size_t>(opts_.shard.index)];
    L2L_LOG_INFO("shard {} of {}: model layers {}..{} of {}", opts_.shard.index, opts_.shard.count, own.first,
                 own.end() - 1, numel.size());
  }
  // Every host buffer that grows with the model, against host_bytes, guard_bytes, RAM
  // and the spill dir's free space, before anything is allocated (host_budget.h).
  HostBudgetInputs bi;
  size_t largest = 0;
  int64_t model_layer = -1;
  for (const LayerLayout& l : BuildLoraLayout(job.model, job.lora)) {  // what trains; a LoRA base frozen
    ++model_layer;
    if (own.count >= 0 && (model_layer < own.first || model_layer >= own.end())) continue;  // another shard's
    bi.layer_numel.push_back(TrainableNumel(l));
    largest = std::max(largest, TrainableNumel(l) * sizeof(float));
    bi.frozen_bytes += RoundUpTo(PlanFrozenBase(l, job.lora).bytes, kShmAlign);
  }
  // A LoRA job's trainable vectors are small (a SmolLM2 block's r=16 adapters: 0.65 MB):
  // pages of memory.page_bytes (4 MiB) would be mostly empty and the budget would count
  // them whole (6.4x the state written, measured). Its pages are halved while they still
  // hold the largest vector (and stay a multiple of the spill tier's block and of 4096).
  size_t page_bytes = opts_.page_bytes;
  const size_t block = opts_.spill.dir.empty() ? kShmAlign : std::max(opts_.spill.block_bytes, kShmAlign);
  while (job.lora.enabled && page_bytes / 2 >= largest && page_bytes / 2 >= block && (page_bytes / 2) % block == 0) {
    page_bytes /= 2;
  }
  if (page_bytes != opts_.page_bytes) {
    L2L_LOG_INFO("LoRA job: state pages of {} bytes (memory.page_bytes {}; the largest trainable vector is {} bytes)",
                 page_bytes, opts_.page_bytes, largest);
  }
  bi.page_bytes = page_bytes;
  bi.publish_dtype = job.publish_dtype;
  bi.host_bytes = opts_.host_bytes;
  bi.guard_bytes = opts_.guard_bytes;
  bi.workers = opts_.expected_workers;
  bi.grad_slots = std::clamp(opts_.grad_slots, 1, kMaxGradSlots);
  bi.shm = opts_.transport != Transport::kGrpc;
  bi.global_clip = job.train.clip == ClipMode::kGlobal && job.optim.grad_clip > 0;
  bi.spill = !opts_.spill.dir.empty();
  if (bi.spill) {
    // A spill file left by the previous run of this job is reused: its space counts.
    std::error_code ec;
    const auto old = std::filesystem::file_size(opts_.spill.dir + "/l2l-" + opts_.job_id + ".spill", ec);
    bi.disk_free_bytes = FreeDiskBytes(opts_.spill.dir) + (ec ? 0 : old);
  }
  bi.ram_bytes = PhysicalMemoryBytes();
  L2L_ASSIGN_OR_RETURN(const HostBudget budget, PlanHostBudget(bi));
  L2L_LOG_INFO("{}", budget.Describe());
  ParamStoreOptions po;
  po.page_bytes = page_bytes;
  po.host_bytes = static_cast<size_t>(budget.store_host_bytes);
  po.publish_dtype = job.publish_dtype;
  po.lora = job.lora;
  po.spill = opts_.spill;
  po.spill.job_id = opts_.job_id;
  po.layers = own;
  if (opts_.transport != Transport::kGrpc) po.shm_name = "/" + prefix + "w";
  L2L_ASSIGN_OR_RETURN(auto store, ParamStore::Create(job.model, po));
  if (start.load) {
    L2L_RETURN_IF_ERROR(start.load(store.get()));
  } else {
    // The guard's memory is not in use before the first update: init borrows it (its
    // budget, capped at 8 GiB) for layer buffers, to initialise layers in parallel.
    L2L_RETURN_IF_ERROR(store->InitFromSeed(job.train.seed, std::min<uint64_t>(budget.guard_bytes, uint64_t{8} << 30)));
  }
  // Loaded state (safetensors, checkpoint, buffers) is checked; the seed's init is finite.
  if (start.load) L2L_RETURN_IF_ERROR(CheckFinite(*store, start.description));
  {
    // One writer per layer: the layers publish in parallel (the bf16 cast of 7.6 G
    // params is seconds on one core).
    std::vector<Status> published(static_cast<size_t>(store->num_layers()));
    ParallelForIndex(int64_t{0}, store->num_layers(), [&](int64_t l) {
      published[static_cast<size_t>(l)] = store->PublishMaster(l, start.step);
    });
    for (const Status& s : published) L2L_RETURN_IF_ERROR(s);
  }
  auto pipeline = std::make_unique<UpdatePipeline>(store.get(), job, opts_.expected_workers, start.step,
                                                   budget.pipeline_undo_budget);
  pipeline->set_on_failure([this](const Status& s) { OnPipelineFailure(s); });
  pipeline->set_gate_on_losses(true);
  if (!start.expert_steps.empty()) L2L_RETURN_IF_ERROR(pipeline->set_expert_steps(start.expert_steps));
  if (opts_.on_skip) pipeline->set_on_skip(opts_.on_skip);
  if (opts_.shard.sharded()) {
    pipeline->set_coordinator(opts_.shards);
    opts_.shards->set_on_rollback([this](const ShardPeers::Epoch& e) { RollbackToEpoch(e); });
    L2L_RETURN_IF_ERROR(opts_.shards->Start(job, plan, start.step, pipeline.get()));
    shard_plan_ = plan;
  }
  job_steps_ = job.train.steps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    store_ = std::move(store);
    pipeline_ = std::move(pipeline);
    job_ = job;
    start_ = start;
    data_roots_ = WorkerDataRoots(job, start, opts_.state_dir);
    restore_dir_ = start.checkpoint_dir;
    restore_step_ = start.step;
    last_checkpoint_ = start.checkpoint_dir;
    has_job_ = true;
    step_start_ = std::chrono::steady_clock::now();
  }
  L2L_LOG_INFO("job '{}': {} parameters in {} layers, {} worker(s), publish {}, start step {} from {}",
               opts_.job_id, job.model.NumParams(), store_->num_layers(), opts_.expected_workers,
               DTypeName(job.publish_dtype), start.step, start.description);
  {
    WorkerUpdaterOptions uo;
    uo.job_id = opts_.job_id;
    uo.max_layer_numel = store_->max_layer_numel();
    uo.deadline = opts_.update_deadline;
    updater_ = std::make_unique<WorkerUpdater>(uo);
  }
  {
    // Measured at this job's size (beyond the caches for real models, cheap for tiny ones).
    const size_t params = static_cast<size_t>(job.model.NumParams());
    cpu_update_rate_ = MeasureCpuUpdateRate(std::clamp<size_t>(params, size_t{1} << 16, size_t{1} << 23));
    copy_bytes_per_s_ = MeasureCopyBytesPerSecond(
        std::clamp<size_t>(16 * store_->max_layer_numel(), size_t{1} << 20, size_t{64} << 20));
  }
  ApplyOptimizerSplit("job start");
  if (opts_.heartbeat_timeout_ms > 0) liveness_ = std::thread([this] { LivenessLoop(); });
  if (checkpoint_every() > 0) checkpointer_ = std::thread([this] { CheckpointLoop(); });
  return Status::Ok();
}

Status EpsCore::CheckWorker(int32_t worker_id) const {
  if (!has_job_) return FailedPrecondition("the daemon has no job yet (CreateJob first)");
  if (worker_id < 0 || worker_id >= static_cast<int32_t>(workers_.size())) {
    return NotFound("worker id " + std::to_string(worker_id) + " is not registered (" +
                    std::to_string(workers_.size()) + " workers registered); call Register first");
  }
  const Worker& w = *workers_[worker_id];
  const std::string id = std::to_string(worker_id);
  if (w.info.state == WorkerState::kActive) return Status::Ok();
  if (w.info.state == WorkerState::kRejoin) {
    return RejoinRequired(RejoinReason::kStepAbandoned, "worker " + id + ": " + w.rejoin_message + "; " +
                                                            kRejoinHint + " (previous_worker_id=" + id + ")");
  }
  if (w.info.state == WorkerState::kLost) {
    return RejoinRequired(RejoinReason::kDeclaredLost,
                          "worker " + id + " was declared lost (no heartbeat for " +
                              std::to_string(opts_.heartbeat_timeout_ms) + " ms); " + kRejoinHint +
                              " (previous_worker_id=" + id + ")");
  }
  return FailedPrecondition("worker " + id + " is " + ToString(w.info.state));
}

std::string EpsCore::PositionAt(int32_t id, int64_t step) const {
  const auto& pos = workers_[id]->position;
  auto it = pos.upper_bound(step);
  if (it == pos.begin()) return "";
  return std::prev(it)->second;
}

Status EpsCore::CreateShmWorker(int32_t id, Registration* r) {
  auto w = std::make_unique<ShmWorker>();
  w->id = id;
  const size_t L = static_cast<size_t>(store_->num_layers());
  const size_t slot_bytes = RoundUpTo(store_->max_layer_numel() * sizeof(float), kShmAlign);
  const int slots = std::clamp(opts_.grad_slots, 1, kMaxGradSlots);
  const size_t bytes = GradHeaderBytes(L) + slots * slot_bytes;
  // A fresh name per registration: a lost worker's old mapping may still be alive.
  r->gradient_segment = "/l2l-" + opts_.job_id + "-g" + std::to_string(id) +
                        (shm_generation_ > 0 ? "r" + std::to_string(shm_generation_) : "");
  ++shm_generation_;
  L2L_ASSIGN_OR_RETURN(w->seg, ShmSegment::Create(r->gradient_segment, bytes));
  auto* h = new (w->seg.data()) GradSegmentHeader();
  h->magic = kGradMagic;
  h->layout_version = kShmLayoutVersion;
  h->num_slots = static_cast<uint32_t>(slots);
  h->slot_bytes = slot_bytes;
  h->num_layers = static_cast<uint32_t>(L);
  h->worker_id = id;
  std::atomic<int64_t>* pins = GradPins(w->seg.data());
  for (size_t l = 0; l < L; ++l) new (&pins[l]) std::atomic<int64_t>(-1);
  for (int s = 0; s < slots; ++s) {
    h->slots[s].data_offset = GradHeaderBytes(L) + s * slot_bytes;
    w->slot_offset.push_back(h->slots[s].data_offset);
  }
  r->weight_segment = store_->shm_name();
  store_->AddPinSource(id, pins, &h->pin_seq);
  ShmWorker* raw = w.get();
  w->consumer = std::thread([this, raw] { ConsumeLoop(raw); });
  std::lock_guard<std::mutex> lock(mu_);
  shm_workers_.push_back(std::move(w));
  return Status::Ok();
}

void EpsCore::TakeOverDeadLocalWorkers() {
  std::vector<std::pair<int32_t, pid_t>> dead;  // (worker id, its gone pid), read under mu_
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Even where a free id exists (a worker that left): a dead worker's unfinished step
    // is what a newcomer must take over, and Register prefers a lost id to a left one.
    if (!has_job_ || static_cast<int32_t>(workers_.size()) < opts_.expected_workers) return;
    for (const auto& w : workers_) {
      if ((w->info.state == WorkerState::kActive || w->info.state == WorkerState::kRejoin) && ProcessGone(w->local_pid)) {
        dead.emplace_back(w->info.id, w->local_pid);
      }
    }
  }
  for (const auto& [id, pid] : dead) {
    L2L_LOG_WARN("worker {}'s process (pid {}) on this host is gone: declared lost now, not after the heartbeat "
                 "timeout",
                 id, pid);
    HandleLoss(id, WorkerState::kLost);
  }
}

Result<Registration> EpsCore::Register(const RegisterInfo& info) {
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  const Transport want = info.transport;
  const bool same_host = !info.boot_id.empty() && info.boot_id == BootId() && info.hostname == HostName();
  const bool shm_possible = same_host && opts_.transport != Transport::kGrpc;
  if (want == Transport::kShm && !shm_possible) {
    return FailedPrecondition(std::string("transport shm requested but ") +
                              (same_host ? "the daemon is configured for grpc only"
                                         : "the worker is not on the daemon's host (boot id/hostname differ)"));
  }
  // Sharded jobs: workers join shard 0 first (it gives the id and the shards' map),
  // then every other shard with that id.
  std::vector<ShardEndpoint> shard_map;
  const bool other_shard = opts_.shard.sharded() && opts_.shard.index > 0;
  if (opts_.shard.sharded()) {
    if (!has_job()) return FailedPrecondition("the daemon has no job yet (CreateJob first)");
    if (other_shard) {
      if (info.shard_worker_id < 0) {
        return opts_.shards->Endpoints().status();  // FAILED_PRECONDITION naming shard 0
      }
      if (info.shard_worker_id >= opts_.expected_workers) {
        return InvalidArgument("shard_worker_id " + std::to_string(info.shard_worker_id) + ": the job has " +
                               std::to_string(opts_.expected_workers) + " workers");
      }
    } else {
      L2L_ASSIGN_OR_RETURN(shard_map, opts_.shards->Endpoints());  // UNAVAILABLE until all joined
    }
    if (!opts_.shards->accepts_workers()) {
      return Unavailable("shard " + std::to_string(opts_.shard.index) +
                         (other_shard ? " has not joined shard 0 yet" : " is rolling back") + "; retry");
    }
  }
  if (info.previous_worker_id < 0 && !other_shard) TakeOverDeadLocalWorkers();
  int32_t id = -1;
  bool rejoin = false;
  UpdatePipeline::FreezeGuard rejoin_gate;  // a rejoin freezes updates until the worker is in
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!has_job_) return FailedPrecondition("the daemon has no job yet (CreateJob first)");
    if (stopped_) return Aborted("the daemon is stopping");
    const int32_t n = static_cast<int32_t>(workers_.size());
    if (other_shard) {
      // The id shard 0 gave: a worker registers here in any order, so a later id waits
      // (UNAVAILABLE: the worker retries) until the ids below it are in.
      const int32_t want = info.shard_worker_id;
      if (want > n) {
        return Unavailable("worker " + std::to_string(want) + " registers with shard " +
                           std::to_string(opts_.shard.index) + " after workers " + std::to_string(n) + ".." +
                           std::to_string(want - 1) + ": waiting for them");
      }
      if (want < n && workers_[want]->info.state == WorkerState::kActive) {
        // Shard 0 gave this id again, so it declared the worker's last process lost (or
        // asked it to rejoin): the rollback that frees the id here is on its way. UNAVAILABLE:
        // the worker retries (ABORTED would tell it the daemon is stopping).
        L2L_LOG_INFO("worker {} registers again while still active on this shard: its rollback is on the way (the "
                     "worker retries)", want);
        return Unavailable("worker " + std::to_string(want) + " is still active on shard " +
                           std::to_string(opts_.shard.index) + " (its rollback is yet to come); retry");
      }
      id = want;
      rejoin = want < n;
    } else if (info.previous_worker_id >= 0 && info.previous_worker_id >= n && opts_.shard.sharded() &&
               info.previous_worker_id < opts_.expected_workers) {
      // A restarted shard 0: the job's workers come back under their ids (they waited
      // for it), in order, as they register with the other shards.
      const int32_t want = info.previous_worker_id;
      if (want > n) {
        return Unavailable("worker " + std::to_string(want) + " registers again after workers " + std::to_string(n) +
                           ".." + std::to_string(want - 1) + ": waiting for them");
      }
      id = want;
    } else if (info.previous_worker_id >= 0) {
      if (info.previous_worker_id >= n) {
        return NotFound("previous_worker_id " + std::to_string(info.previous_worker_id) + " was never registered (" +
                        std::to_string(n) + " workers registered)");
      }
      if (workers_[info.previous_worker_id]->info.state == WorkerState::kActive) {
        const std::string what = "worker " + std::to_string(info.previous_worker_id) + " is active";
        // Sharded: a rejoin asked by another shard arrives before this one rolled back.
        if (opts_.shard.sharded()) return Unavailable(what + " here until the rollback; retry");
        return FailedPrecondition(what + "; a second process cannot take its id");
      }
      id = info.previous_worker_id;
      rejoin = true;
    } else if (n < opts_.expected_workers) {
      id = n;
    } else {
      for (WorkerState st : {WorkerState::kLost, WorkerState::kLeft}) {
        for (int32_t i = 0; i < n && id < 0; ++i) {
          if (workers_[i]->info.state == st) id = i;
        }
      }
      if (id < 0) {
        return ResourceExhausted("the job already has its " + std::to_string(opts_.expected_workers) +
                                 " worker(s), none of them lost or left");
      }
      rejoin = true;
    }
  }
  Registration r;
  r.worker_id = id;
  r.job = job();
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.data_roots = data_roots_;
  }
  r.data_world = opts_.expected_workers;
  r.transport = (want != Transport::kGrpc && shm_possible) ? Transport::kShm : Transport::kGrpc;
  for (int64_t l = 0; l < store_->num_layers(); ++l) r.layer_numel.push_back(store_->layout(l).numel);
  r.first_layer = store_->first_layer();
  r.shards = std::move(shard_map);
  // Read under recovery_mu_ (held here): no rollback runs between it and start_step.
  if (opts_.shard.sharded()) r.recovery_epoch = opts_.shards->epoch();
  if (rejoin) {
    L2L_ASSIGN_OR_RETURN(r.start_step, PrepareRejoin(id, &rejoin_gate));
  } else {
    r.start_step = pipeline_->stats().completed_step;
  }
  if (r.transport == Transport::kShm) {
    L2L_RETURN_IF_ERROR(CreateShmWorker(id, &r));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!rejoin) {
      auto w = std::make_unique<Worker>();
      w->next_step = r.start_step;
      // The store's epoch now (a sharded shard may have rolled back before any worker
      // came: its epoch is past 0), so its waits do not take this worker for a stale one.
      w->epoch = store_->epoch();
      if (id < static_cast<int32_t>(start_.data_positions.size())) {
        w->position[r.start_step] = start_.data_positions[id];
      }
      workers_.push_back(std::move(w));
    }
    Worker& w = *workers_[id];
    w.info.id = id;
    w.info.name = info.name.empty() ? info.hostname + ":" + std::to_string(info.pid) : info.name;
    w.info.transport = r.transport;
    w.info.state = WorkerState::kActive;
    w.info.step = r.start_step;
    w.info.last_seen = std::chrono::steady_clock::now();
    // A pid that is not visible here (another pid namespace) cannot be watched.
    w.local_pid = same_host && !ProcessGone(info.pid) ? info.pid : 0;
    w.next_step = r.start_step;
    r.data_position = PositionAt(id, r.start_step);
    do {
      w.registration = registration_rng_();
    } while (w.registration == 0);
    r.registration_id = w.registration;
  }
  if (rejoin) {
    rejoin_gate.Reset();
    UpdatePausedLocked();
  }
  // Interleaved optimizer: a worker offering its device over shm takes layer updates.
  const bool had_offer = offers_.count(id) > 0;
  if (info.optimizer.takes_updates && opts_.shard.sharded()) {
    L2L_LOG_WARN("worker {} offers its device for updates: not used by a sharded job (each shard updates its layers)",
                 id);
  } else if (info.optimizer.takes_updates && r.transport == Transport::kShm) {
    Result<std::string> seg = updater_->AddWorker(id, info.optimizer);
    if (seg.ok()) {
      offers_[id] = info.optimizer;
      ApplyOptimizerSplit("worker " + std::to_string(id) + " offers " + info.optimizer.device);
    } else {
      L2L_LOG_WARN("worker {} offers its device for updates, but its exchange segment failed: {}", id,
                   seg.status().ToString());
    }
  } else {
    if (info.optimizer.takes_updates) {
      L2L_LOG_WARN("worker {} offers its device for updates over the grpc transport: not used (the update exchange "
                   "needs shared memory: same host, transport shm)",
                   id);
    }
    updater_->RemoveWorker(id, "worker " + std::to_string(id) + " registered again without offering its device");
    if (had_offer) {
      offers_.erase(id);
      ApplyOptimizerSplit("worker " + std::to_string(id) + " withdrew its device");
    }
  }
  r.num_workers = static_cast<int32_t>(pipeline_->workers().size());
  if (r.num_workers == 0) r.num_workers = 1;
  L2L_LOG_INFO("worker {} '{}' {} ({}), starts at step {}", id, info.name, rejoin ? "rejoined" : "registered",
               ToString(r.transport), r.start_step);
  return r;
}

void EpsCore::ConsumeLoop(ShmWorker* w) {
  auto* h = static_cast<GradSegmentHeader*>(w->seg.data());
  char* base = static_cast<char*>(w->seg.data());
  while (!stopped_.load() && !w->stop.load()) {
    const uint32_t seen = h->ready_seq.load(std::memory_order_acquire);
    bool any = false;
    for (uint32_t s = 0; s < h->num_slots; ++s) {
      GradSlotHeader& slot = h->slots[s];
      if (slot.state.load(std::memory_order_acquire) != kSlotReady) continue;
      any = true;
      slot.state.store(kSlotHeld, std::memory_order_relaxed);
      const int64_t layer = slot.layer, step = slot.step, numel = slot.numel;
      // The slot is freed exactly once, after any error about it was recorded: by the
      // pipeline's release (after the update) or below when Submit already released it.
      auto free_slot = [h, &slot] {
        slot.state.store(kSlotFree, std::memory_order_release);
        h->free_seq.fetch_add(1, std::memory_order_release);
        FutexWake(&h->free_seq);
      };
      auto phase = std::make_shared<std::atomic<int>>(0);  // 0 in Submit, 1 after, 2 released
      GradientRef ref;
      ref.worker_id = w->id;
      ref.micro_batches = slot.micro_batches;
      ref.release = [phase, free_slot] {
        if (phase->exchange(2) == 1) free_slot();
      };
      Status st;
      {
        std::lock_guard<std::mutex> lock(mu_);
        st = CheckWorker(w->id);
      }
      if (!st.ok()) {
        ref.release();
      } else if (numel < 0 || static_cast<uint64_t>(numel) * sizeof(float) > h->slot_bytes) {
        st = InvalidArgument("gradient slot " + std::to_string(s) + " claims " + std::to_string(numel) +
                             " floats, more than the slot's " + std::to_string(h->slot_bytes / 4));
        ref.release();
      } else {
        ref.data = reinterpret_cast<const float*>(base + w->slot_offset[s]);
        ref.numel = static_cast<size_t>(numel);
        st = pipeline_->Submit(layer, step, std::move(ref));
      }
      if (!st.ok()) {
        L2L_LOG_WARN("worker {} shm gradient rejected: {}", w->id, st.ToString());
        if (h->error_code.load() == 0) {
          std::snprintf(h->error_message, sizeof(h->error_message), "%s", st.message().c_str());
          h->error_rejoin = static_cast<uint32_t>(st.rejoin_reason());
          h->error_code.store(static_cast<uint32_t>(st.code()), std::memory_order_release);
        }
      }
      if (phase->exchange(1) == 2) free_slot();
    }
    if (!any) FutexWait(&h->ready_seq, seen, std::chrono::milliseconds(200));
  }
}

Status EpsCore::Heartbeat(int32_t worker_id, int64_t step, bool* stop, bool* paused, bool* rejoin) {
  std::lock_guard<std::mutex> lock(mu_);
  *stop = stopped_.load();
  if (paused != nullptr) *paused = paused_.load() || (pipeline_ && pipeline_->stats().skip_paused);
  if (rejoin != nullptr) *rejoin = false;
  Status s = CheckWorker(worker_id);
  // CheckWorker fails for an unknown id too: index workers_ only for a registered one.
  const bool known = has_job_ && worker_id >= 0 && worker_id < static_cast<int32_t>(workers_.size());
  if (!s.ok() && known && workers_[worker_id]->info.state == WorkerState::kRejoin) {
    // Alive, but must re-register: keep it from being declared lost meanwhile.
    workers_[worker_id]->info.last_seen = std::chrono::steady_clock::now();
    if (rejoin != nullptr) *rejoin = true;
    return Status::Ok();
  }
  if (!s.ok() && rejoin != nullptr && s.rejoin_reason() != RejoinReason::kNone) *rejoin = true;
  L2L_RETURN_IF_ERROR(s);
  workers_[worker_id]->info.last_seen = std::chrono::steady_clock::now();
  workers_[worker_id]->info.step = step;
  return Status::Ok();
}

Result<ParamStore::ReadPin> EpsCore::PinLayer(int32_t worker_id, int64_t layer, int64_t min_version,
                                              std::chrono::milliseconds timeout, DType* dtype) {
  int64_t epoch = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
    epoch = workers_[worker_id]->epoch;
  }
  if (min_version < 0) return InvalidArgument("min_version=" + std::to_string(min_version) + " must be >= 0");
  *dtype = store_->publish_dtype();
  return store_->Acquire(layer, min_version, timeout, epoch);
}

Status EpsCore::ValidateGradient(int32_t worker_id, int64_t layer, int64_t micro_batches, int64_t numel) const {
  std::lock_guard<std::mutex> lock(mu_);
  L2L_RETURN_IF_ERROR(CheckWorker(worker_id));  // no job, unknown or inactive worker
  const int64_t L = store_->num_layers();
  if (layer < 0 || layer >= L) {
    return NotFound("layer " + std::to_string(layer) + " does not exist (the model has layers 0.." +
                    std::to_string(L - 1) + ")");
  }
  const int64_t want = static_cast<int64_t>(store_->layout(layer).numel);
  if (numel != want) {
    return InvalidArgument("numel=" + std::to_string(numel) + " but layer " + std::to_string(layer) + " has " +
                           std::to_string(want) + " parameters");
  }
  if (micro_batches < 1) {
    return InvalidArgument("micro_batches=" + std::to_string(micro_batches) + " must be >= 1");
  }
  return Status::Ok();
}

Status EpsCore::CheckActive(int32_t worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckWorker(worker_id);
}

Status EpsCore::SubmitGradient(int32_t worker_id, int64_t layer, int64_t step, int64_t micro_batches,
                               std::vector<float> grad) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
  }
  auto owned = std::make_shared<std::vector<float>>(std::move(grad));
  GradientRef ref;
  ref.worker_id = worker_id;
  ref.data = owned->data();
  ref.numel = owned->size();
  ref.micro_batches = micro_batches;
  ref.release = [owned]() mutable { owned.reset(); };
  return pipeline_->Submit(layer, step, std::move(ref));
}

Status EpsCore::ReportExperts(int32_t worker_id, int64_t step, const std::vector<uint8_t>& touched) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
  }
  return pipeline_->ReportExperts(worker_id, step, touched);
}

Status EpsCore::StepDone(int32_t worker_id, int64_t step, double loss, int64_t tokens,
                         const std::string& data_position, bool* stop, const StepTimes& times,
                         const StepEval& eval) {
  std::lock_guard<std::mutex> lock(mu_);
  L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
  Worker& w = *workers_[worker_id];
  if (step != w.next_step) {
    return FailedPrecondition("StepDone(step " + std::to_string(step) + ") from worker " + std::to_string(worker_id) +
                              ": its next step is " + std::to_string(w.next_step));
  }
  if (!std::isfinite(loss)) {
    L2L_LOG_WARN("worker {} reported a non-finite loss ({}) for step {}: the step will be skipped", worker_id, loss,
                 step);
  }
  pipeline_->ReportLoss(worker_id, step, loss);
  w.next_step = step + 1;
  w.position[step + 1] = data_position;
  w.info.step = step + 1;
  w.info.last_loss = loss;
  w.info.last_seen = std::chrono::steady_clock::now();
  StepReports& r = step_reports_[step];
  ++r.reports;
  r.loss_sum += loss;
  r.tokens += tokens;
  r.times.forward_s += times.forward_s;
  r.times.backward_s += times.backward_s;
  r.times.recompute_s += times.recompute_s;
  r.times.wait_layer_s += times.wait_layer_s;
  r.times.wait_push_s += times.wait_push_s;
  if (times.compute_s) {
    auto add = [](std::optional<double>* sum, const std::optional<double>& v) { *sum = sum->value_or(0) + v.value_or(0); };
    add(&r.times.compute_s, times.compute_s);
    add(&r.times.wait_first_layer_s, times.wait_first_layer_s);
    add(&r.times.worker_step_s, times.worker_step_s);
    add(&r.times.between_s, times.between_s);
    ++r.timeline_reports;
  }
  if (eval.tokens > 0) {
    r.val_loss_sum += eval.loss * static_cast<double>(eval.tokens);
    r.val_tokens += eval.tokens;
  }
  SummarizeStepsLocked();
  cv_.notify_all();
  *stop = stopped_.load() || step + 1 >= job_.train.steps;
  return Status::Ok();
}

int EpsCore::MembersOfLocked(int64_t step) const {
  int n = 0;
  for (int32_t id = 0; id < opts_.expected_workers; ++id) {
    if (id >= static_cast<int32_t>(workers_.size())) {
      ++n;  // not registered yet: the pipeline waits for it
      continue;
    }
    const Worker& w = *workers_[id];
    if (w.member_first <= step && step <= w.member_last) ++n;
  }
  return n;
}

void EpsCore::SummarizeStepsLocked() {
  int64_t last = -1;
  for (const auto& [step, r] : step_reports_) {
    if (r.reports >= MembersOfLocked(step)) last = step;
  }
  if (last < 0) return;
  // The time since the last summary, split evenly over the steps summarized now (more
  // than one only when an older step was still open).
  const auto now = std::chrono::steady_clock::now();
  int64_t batch = 0;
  for (auto it = step_reports_.begin(); it != step_reports_.end() && it->first <= last; ++it) ++batch;
  const double secs = std::chrono::duration<double>(now - step_start_).count() / static_cast<double>(batch);
  step_start_ = now;
  for (auto it = step_reports_.begin(); it != step_reports_.end() && it->first <= last;
       it = step_reports_.erase(it)) {
    const int64_t step = it->first;
    const StepReports& r = it->second;
    const double n = static_cast<double>(r.reports);
    last_loss_ = r.loss_sum / n;
    tokens_per_s_ = secs > 0 ? static_cast<double>(r.tokens) / secs : 0;
    L2L_LOG_INFO("step {} loss {:.4f} {:.0f} tokens/s", step, last_loss_, tokens_per_s_);
    if (r.val_tokens > 0) {
      val_loss_ = r.val_loss_sum / static_cast<double>(r.val_tokens);
      val_step_ = step + 1;
      L2L_LOG_INFO("step {} val_loss {:.4f} val_ppl {:.3f} ({} tokens)", step + 1, val_loss_, std::exp(val_loss_),
                   r.val_tokens);
    }
    if (!opts_.on_step) continue;
    StepSummary sum;
    sum.step = step + 1;
    sum.workers = r.reports;
    sum.loss = last_loss_;
    sum.tokens_per_s = tokens_per_s_;
    sum.wall_s = secs;
    sum.lr = LearningRate(job_.optim, step);
    sum.times.forward_s = r.times.forward_s / n;
    sum.times.backward_s = r.times.backward_s / n;
    sum.times.recompute_s = r.times.recompute_s / n;
    sum.times.wait_layer_s = r.times.wait_layer_s / n;
    sum.times.wait_push_s = r.times.wait_push_s / n;
    if (r.timeline_reports > 0) {
      const double k = static_cast<double>(r.timeline_reports);
      sum.times.compute_s = *r.times.compute_s / k;
      sum.times.wait_first_layer_s = *r.times.wait_first_layer_s / k;
      sum.times.worker_step_s = *r.times.worker_step_s / k;
      sum.times.between_s = *r.times.between_s / k;
    }
    sum.update = pipeline_->UpdateTimesFor(step);
    if (r.val_tokens > 0) sum.val_loss = val_loss_, sum.val_tokens = r.val_tokens;
    opts_.on_step(sum);
  }
}

Status EpsCore::Deregister(int32_t worker_id, uint64_t registration_id, std::chrono::milliseconds wait_final) {
  if (wait_final.count() < 0 || wait_final > std::chrono::milliseconds(600000)) {
    return InvalidArgument("wait_final_ms " + std::to_string(wait_final.count()) + " is outside 0..600000");
  }
  int64_t steps = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
    if (registration_id != workers_[worker_id]->registration) {
      return FailedPrecondition("Deregister of worker " + std::to_string(worker_id) + " names registration " +
                                std::to_string(registration_id) +
                                ", not the worker's current one: a stale client (of an earlier daemon on this "
                                "address, or of a registration a replacement took over); nothing changed");
    }
    steps = job_.train.steps;
  }
  if (wait_final.count() > 0) {
    // Layer 0's last version is published a moment before the pipeline counts the step
    // committed: wait briefly for that (bounded, so a premature ask cannot park an rpc
    // thread), else the worker asks again.
    if (!pipeline_->WaitForStep(steps, std::min(wait_final, std::chrono::milliseconds(200)))) {
      return Status(StatusCode::kDeadlineExceeded,
                    "worker " + std::to_string(worker_id) + " asked to leave after the last step, but " +
                        std::to_string(pipeline_->stats().completed_step) + " of " + std::to_string(steps) +
                        " steps have committed; ask again");
    }
    std::unique_lock<std::mutex> lock(mu_);
    // A rollback meanwhile (a sharded job's recovery) asks the worker to redo steps.
    auto rejoin = [&]() REQUIRES(mu_) { return workers_[worker_id]->info.state != WorkerState::kActive; };
    const bool ready = cv_.wait_for(lock, wait_final, [&] {
      ASSERT_HELD(mu_);
      return checkpoint_every() <= 0 || restore_step_ >= steps || final_checkpoint_failed_ || stopped_.load() ||
             !fatal_.ok() || rejoin();
    });
    const Status still = [&] {
      ASSERT_HELD(mu_);
      return ready && rejoin() ? CheckWorker(worker_id) : Status::Ok();
    }();
    if (!still.ok()) return still;
    if (!ready) {
      const int64_t newest = [&] {
        ASSERT_HELD(mu_);
        return restore_step_;
      }();
      return Status(StatusCode::kDeadlineExceeded, "the checkpoint of the last step (" + std::to_string(steps) +
                                                       ") is not written yet (newest: " + std::to_string(newest) +
                                                       "); ask again");
    }
  }
  std::lock_guard<std::mutex> rlock(recovery_mu_);
  HandleLoss(worker_id, WorkerState::kLeft);
  return Status::Ok();
}

void EpsCore::Stop() {
  if (stopped_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(bg_mu_);
    bg_cv_.notify_all();
  }
  if (liveness_.joinable()) liveness_.join();
  if (checkpointer_.joinable()) checkpointer_.join();
  if (store_) store_->Stop();
  if (updater_) updater_->Stop();  // waiting offloaded updates fall back to the CPU
  std::vector<std::unique_ptr<ShmWorker>> shm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shm = std::move(shm_workers_);
    for (auto& r : retired_) shm.push_back(std::move(r));
    retired_.clear();
  }
  for (auto& w : shm) w->CloseAndJoin();
  // The pipeline releases slots into the segments: destroy it while they still exist.
  pipeline_.reset();
  updater_.reset();
  for (auto& w : shm) {
    if (store_) store_->RemovePinSource(w->id);
  }
  shm.clear();   // unlinks the gradient segments
  store_.reset();  // unlinks the weight segment
}

void EpsCore::OnPipelineFailure(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_.ok()) return;
    fatal_ = s;
  }
  L2L_LOG_ERROR("the job failed and stops without a final checkpoint (the last good one stays): {}",
                s.ToString());
  if (store_) store_->Stop(/*failed=*/true);  // workers waiting for layers get FAILED_PRECONDITION
  // The other shards cannot complete a step without this one: shard 0 stops the job too.
  if (opts_.shard.sharded() && opts_.shard.index > 0 && opts_.shards != nullptr) opts_.shards->ReportFailure(s);
  cv_.notify_all();
  if (opts_.on_fatal) opts_.on_fatal(s);
}

CoreStatus EpsCore::GetStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  CoreStatus s;
  s.job_id = opts_.job_id;
  s.shard = opts_.shard;
  if (opts_.shard.sharded() && opts_.shard.index == 0 && has_job_) {
    if (auto e = opts_.shards->Endpoints(); e.ok()) s.shard_map = *e;
  }
  if (has_job_ && store_) s.first_layer = store_->first_layer();
  for (const auto& w : workers_) s.workers.push_back(w->info);
  s.last_checkpoint = last_checkpoint_;
  if (has_job_ && store_ && pipeline_) {
    s.total_steps = job_.train.steps;
    s.num_params = job_.model.NumParams();
    for (int64_t l = 0; l < store_->num_layers(); ++l) s.layer_version.push_back(store_->published_version(l));
    s.pipeline = pipeline_->stats();
    s.step = s.pipeline.completed_step;
    s.state_bytes = store_->state_bytes();
    s.shm_bytes = store_->weight_segment_bytes();
    s.members = static_cast<int32_t>(pipeline_->workers().size());
    if (const SpillTier* t = store_->tier(); t != nullptr) {
      s.spill = true;
      s.tier = t->stats();
    }
    if (job_.train.mode == TrainMode::kLockfree) {
      s.staleness_bound = job_.train.staleness;
      int64_t newest = s.step;
      for (const auto& w : workers_) {
        if (w->info.state == WorkerState::kActive) newest = std::max(newest, w->info.step);
      }
      for (int64_t v : s.layer_version) s.max_version_lag = std::max(s.max_version_lag, newest - v);
    }
  }
  if (!fatal_.ok()) {
    s.state = "failed";
    s.error = fatal_.ToString();
  } else if (stopped_) {
    s.state = "stopping";
  } else if (!has_job_) {
    s.state = "idle";
  } else if (paused_.load() || s.pipeline.skip_paused) {
    s.state = "paused";
    if (s.pipeline.skip_paused) {
      s.pause_reason = std::to_string(s.pipeline.consecutive_skips) + " steps in a row skipped (last: " +
                       s.pipeline.last_skip_reason + "); fix the cause, then resume";
    } else {
      bool lost = false;
      for (const auto& w : workers_) lost = lost || w->info.state == WorkerState::kLost || w->info.state == WorkerState::kLeft;
      s.pause_reason = lost ? "paused: a lost worker must rejoin (or resume to go on without it)" : "paused";
    }
  } else if (s.step >= s.total_steps) {
    s.state = "finished";
  } else if (static_cast<int32_t>(workers_.size()) < opts_.expected_workers) {
    s.state = "waiting_workers";
  } else {
    s.state = "running";
  }
  s.host_budget = opts_.host_bytes;
  s.last_loss = last_loss_;
  s.tokens_per_s = tokens_per_s_;
  s.val_loss = val_loss_;
  s.val_step = val_step_;
  return s;
}

}  // namespace l2l::eps

namespace l2l::eps {

Result<UpdateTask> EpsCore::TakeUpdate(int32_t worker_id, std::chrono::milliseconds wait) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    L2L_RETURN_IF_ERROR(CheckWorker(worker_id));
  }
  if (stopped_) return Aborted("the daemon is stopping");
  return updater_->Take(worker_id, wait);
}

Status EpsCore::UpdateDone(int32_t worker_id, uint64_t task_id, int64_t layer, int64_t numel,
                           const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!has_job_) return FailedPrecondition("the daemon has no job yet (CreateJob first)");
  }
  return updater_->Done(worker_id, task_id, layer, numel, error);
}

WorkerUpdater::Stats EpsCore::offload_stats() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!has_job_) return {};
  }
  return updater_ ? updater_->stats() : WorkerUpdater::Stats{};
}

}  // namespace l2l::eps
