// ShardedEpsClient: one EPS client per shard, layers routed to their owner. See
// eps_client_sharded.h.
#include "worker/eps_client_sharded.h"

#include <thread>

#include "common/fault_point.h"
#include "common/logging.h"

namespace l2l::worker {

Result<std::unique_ptr<EpsClient>> ConnectEpsOne(const std::string& address, const ClientOptions& options);

Result<std::unique_ptr<EpsClient>> ShardedEpsClient::Create(std::unique_ptr<EpsClient> shard0,
                                                            const ClientOptions& options) {
  const WorkerRegistration reg = shard0->registration();
  std::unique_ptr<ShardedEpsClient> c(new ShardedEpsClient());
  int64_t next = 0;
  for (size_t k = 0; k < reg.shards.size(); ++k) {
    const ShardEndpoint& s = reg.shards[k];
    if (s.index != static_cast<int>(k) || s.layers.first != next || s.layers.count < 1) {
      return InvalidArgument("shard 0's map of the job's shards is malformed at shard " + std::to_string(k) +
                             " (index " + std::to_string(s.index) + ", layers from " + std::to_string(s.layers.first) +
                             "; expected layer " + std::to_string(next) + ")");
    }
    next += s.layers.count;
    Shard sh;
    sh.first = s.layers.first;
    sh.count = s.layers.count;
    sh.address = s.address;
    if (k == 0) {
      sh.client = std::move(shard0);
    } else {
      ClientOptions o = options;
      o.shard_worker_id = reg.worker_id;
      o.optimizer = OptimizerOffer{};  // the shards run every update
      Result<std::unique_ptr<EpsClient>> one = ConnectEpsOne(s.address, o);
      if (!one.ok()) {
        return one.status().WithContext("shard " + std::to_string(k) + " of " + std::to_string(reg.shards.size()) +
                                        " at " + s.address);
      }
      sh.client = std::move(one).value();
    }
    const WorkerRegistration& r = sh.client->registration();
    if (r.first_layer != sh.first || r.worker_id != reg.worker_id) {
      return FailedPrecondition("shard " + std::to_string(k) + " at " + s.address + " registered this worker as " +
                                std::to_string(r.worker_id) + " from layer " + std::to_string(r.first_layer) +
                                "; shard 0 says worker " + std::to_string(reg.worker_id) + ", layer " +
                                std::to_string(sh.first) + " (the shards run different jobs)");
    }
    c->shards_.push_back(std::move(sh));
  }
  c->reg_ = reg;
  c->shard_wait_ = options.shard_wait;
  // A rollback under way while this worker registered (a shard still in an older
  // recovery epoch): converge as a rejoin does, every shard registered once already.
  bool same = true;
  for (const Shard& s : c->shards_) {
    const WorkerRegistration& r = s.client->registration();
    same &= r.recovery_epoch == reg.recovery_epoch && r.start_step == reg.start_step;
  }
  if (!same) L2L_RETURN_IF_ERROR(c->Converge(std::vector<bool>(c->shards_.size(), true)));
  L2L_LOG_INFO("sharded job: {} shards, worker {}", c->shards_.size(), reg.worker_id);
  return std::unique_ptr<EpsClient>(std::move(c));
}

ShardedEpsClient::Shard* ShardedEpsClient::Owner(int64_t layer, int64_t* local) {
  for (Shard& s : shards_) {
    if (layer >= s.first && layer < s.first + s.count) {
      *local = layer - s.first;
      return &s;
    }
  }
  return nullptr;
}

namespace {
Status NoOwner(int64_t layer) { return NotFound("layer " + std::to_string(layer) + " is owned by no shard"); }
}  // namespace

Status ShardedEpsClient::Note(Shard* shard, Status s) {
  // NOT_FOUND: the shard does not know this worker (it restarted; the layer itself was
  // routed to its owner, so it exists there), as a heartbeat's NOT_FOUND says too.
  if (!s.ok() && (NeedsRejoin(s) || s.code() == StatusCode::kNotFound)) shard->asked_rejoin.store(true);
  if (s.code() == StatusCode::kUnavailable && !shard->down.exchange(true)) {
    L2L_LOG_WARN("shard {} at {} is unreachable ({}): waiting for it to come back", shard - shards_.data(),
                 shard->address, s.message());
  }
  return s;
}

bool ShardedEpsClient::Asked(const Shard& s) const {
  return s.down.load() || s.asked_rejoin.load() || s.client->rejoin_requested();
}

Result<LayerWeights> ShardedEpsClient::AcquireLayer(int64_t layer, int64_t min_version,
                                                    std::chrono::milliseconds timeout) {
  int64_t local = 0;
  Shard* s = Owner(layer, &local);
  if (s == nullptr) return NoOwner(layer);
  Result<LayerWeights> r = s->client->AcquireLayer(local, min_version, timeout);
  if (!r.ok()) return Note(s, r.status());
  return r;
}

void ShardedEpsClient::ReleaseLayer(int64_t layer) {
  int64_t local = 0;
  if (Shard* s = Owner(layer, &local); s != nullptr) s->client->ReleaseLayer(local);
}

Status ShardedEpsClient::PushGradient(int64_t layer, int64_t step, int64_t micro_batches, const float* grad,
                                      size_t numel) {
  int64_t local = 0;
  Shard* s = Owner(layer, &local);
  if (s == nullptr) return NoOwner(layer);
  return Note(s, s->client->PushGradient(local, step, micro_batches, grad, numel));
}

Status ShardedEpsClient::StepDone(const StepReport& report) {
  Status first;
  for (Shard& s : shards_) {
    Status st = Note(&s, s.client->StepDone(report));
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

void ShardedEpsClient::SetHostRegionObserver(HostRegionObserver* observer) {
  for (Shard& s : shards_) s.client->SetHostRegionObserver(observer);
}

bool ShardedEpsClient::HasGradientSlots() const {
  for (const Shard& s : shards_) {
    if (!s.client->HasGradientSlots()) return false;
  }
  return true;
}

Result<GradientSlot> ShardedEpsClient::ClaimGradientSlot(int64_t layer, size_t numel) {
  int64_t local = 0;
  Shard* s = Owner(layer, &local);
  if (s == nullptr) return NoOwner(layer);
  Result<GradientSlot> claimed = s->client->ClaimGradientSlot(local, numel);
  if (!claimed.ok()) return Note(s, claimed.status());
  GradientSlot slot = *claimed;
  std::lock_guard<std::mutex> lock(mu_);
  slot_shard_[slot.data] = static_cast<size_t>(s - shards_.data());
  return slot;
}

Status ShardedEpsClient::PublishGradientSlot(const GradientSlot& slot, int64_t layer, int64_t step,
                                             int64_t micro_batches, size_t numel) {
  int64_t local = 0;
  Shard* s = Owner(layer, &local);
  if (s == nullptr) return NoOwner(layer);
  {
    std::lock_guard<std::mutex> lock(mu_);
    slot_shard_.erase(slot.data);
  }
  return Note(s, s->client->PublishGradientSlot(slot, local, step, micro_batches, numel));
}

void ShardedEpsClient::AbandonGradientSlot(const GradientSlot& slot) {
  size_t k = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = slot_shard_.find(slot.data);
    if (it == slot_shard_.end()) return;
    k = it->second;
    slot_shard_.erase(it);
  }
  shards_[k].client->AbandonGradientSlot(slot);
}

Status ShardedEpsClient::Rejoin() { return Converge(std::vector<bool>(shards_.size(), false)); }

Status ShardedEpsClient::Converge(std::vector<bool> fresh) {
  // Re-registers with every shard that asks (or is down, once it answers again) until
  // the registrations agree on the recovery epoch: a shard behind the others has yet to
  // roll back, and asks once it has (it still holds this worker as an active member and
  // would refuse a second registration before).
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + shard_wait_;
  auto since = [&] { return std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count(); };
  auto next_note = start + std::chrono::seconds(10);
  const size_t n = shards_.size();
  for (;;) {
    int64_t newest = 0;
    for (size_t k = 0; k < n; ++k) newest = std::max(newest, shards_[k].client->registration().recovery_epoch);
    std::string waiting;
    auto wait_for = [&](size_t k, const std::string& why) {
      waiting += (waiting.empty() ? "" : ", ") + std::to_string(k) + " at " + shards_[k].address + " (" + why + ")";
    };
    for (size_t k = 0; k < n; ++k) {
      Shard& s = shards_[k];
      const bool behind = s.client->registration().recovery_epoch < newest;
      if (!Asked(s) || (fresh[k] && !behind)) continue;
      s.asked_rejoin.store(false);  // an ask arriving from here on is a new one
      Status st = s.client->Rejoin();
      if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded) {
        // Down, or (UNAVAILABLE from the shard itself) still holding this worker as active
        // because its rollback is yet to come: asked again on the next pass either way.
        s.down.store(true);
        s.asked_rejoin.store(true);
        wait_for(k, "down or still rolling back");
        continue;
      }
      L2L_RETURN_IF_ERROR(st.WithContext("rejoining shard " + std::to_string(k) + " at " + s.address));
      s.down.store(false);
      fresh[k] = true;
      newest = std::max(newest, s.client->registration().recovery_epoch);
    }
    if (waiting.empty()) {
      bool any = false;
      for (size_t k = 0; k < n; ++k) any |= fresh[k];
      if (!any) waiting = "any shard to ask for the rejoin";
      for (size_t k = 0; k < n && any; ++k) {
        const int64_t e = shards_[k].client->registration().recovery_epoch;
        if (e < newest) wait_for(k, "in recovery epoch " + std::to_string(e) + " of " + std::to_string(newest) +
                                        ": to roll back");
      }
      // A shard this pass did not re-register with whose registration starts elsewhere
      // than a re-registered one's restarted unnoticed: a restarted shard 0 begins at
      // recovery epoch 0 again, and this worker's only call to it while it was down may
      // have been a heartbeat (which does not mark it down). Register with it again too.
      int64_t fresh_start = -1;
      for (size_t k = 0; k < n && waiting.empty(); ++k) {
        if (fresh[k]) fresh_start = shards_[k].client->registration().start_step;
      }
      bool restarted = false;
      for (size_t k = 0; k < n && fresh_start >= 0; ++k) {
        const int64_t s = shards_[k].client->registration().start_step;
        if (fresh[k] || s == fresh_start) continue;
        L2L_LOG_WARN("shard {} at {} still has this worker at step {}, a re-registered shard at step {}: registering "
                     "with it again (it restarted)",
                     k, shards_[k].address, s, fresh_start);
        shards_[k].asked_rejoin.store(true);
        restarted = true;
      }
      if (restarted) continue;  // ask it now
      if (waiting.empty()) break;  // every registration in the newest epoch, at one start step
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      return Status(StatusCode::kDeadlineExceeded, "rejoining a sharded job: after " + std::to_string(since()) +
                                                       " s still waiting for shard(s) " + waiting +
                                                       " (l2l-worker --shard-wait-ms)");
    }
    if (now >= next_note) {
      next_note = now + std::chrono::seconds(10);
      L2L_LOG_WARN("rejoining: waiting {} s for shard(s) {} (the worker gives up after {} s)", since(), waiting,
                   std::chrono::duration_cast<std::chrono::seconds>(shard_wait_).count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const WorkerRegistration& r0 = shards_[0].client->registration();
  for (size_t k = 1; k < n; ++k) {
    const WorkerRegistration& r = shards_[k].client->registration();
    if (r.start_step != r0.start_step) {
      return FailedPrecondition("in recovery epoch " + std::to_string(r0.recovery_epoch) + " shard " +
                                std::to_string(k) + " restarts this worker at step " + std::to_string(r.start_step) +
                                ", shard 0 at step " + std::to_string(r0.start_step) +
                                " (the shards' states differ: restart the job from its last checkpoint)");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  reg_.start_step = r0.start_step;
  reg_.data_position = r0.data_position;  // shard 0 keeps every position back to its last checkpoint
  reg_.registration_id = r0.registration_id;
  reg_.recovery_epoch = r0.recovery_epoch;
  return Status::Ok();
}

bool ShardedEpsClient::rejoin_requested() const {
  for (const Shard& s : shards_) {
    if (Asked(s)) return true;
  }
  return false;
}

Status ShardedEpsClient::LeaveAfterLastStep(std::chrono::milliseconds wait) {
  // Shard 0 first: it lets the worker go only once the final checkpoint is assembled
  // (every shard's part on disk). Leaving another shard before could strand this worker
  // there as "left" if a shard died before its part was in (every shard then rolls back
  // and needs the worker again).
  L2L_RETURN_IF_ERROR(Note(&shards_[0], shards_[0].client->LeaveAfterLastStep(wait)));
  FaultPoint("worker.leave");  // tests: L2L_DELAY_AT makes a shard's loss land here
  // From here the job's end is durable: a shard that dies now restarts from the final
  // checkpoint, and nothing will be redone. Leaving the others is a courtesy (each would
  // declare this worker gone after its heartbeat timeout anyway): a shard that is down,
  // restarted (it does not know this registration) or rolling back is not waited for.
  for (size_t k = 1; k < shards_.size(); ++k) {
    const Shard& s = shards_[k];
    if (Status st = s.client->LeaveAfterLastStep(wait); !st.ok()) {
      L2L_LOG_WARN("shard {} at {}: not left ({}); the job's last step is on disk already (shard 0 let this "
                   "worker go once every shard's part of the final checkpoint was written), so this worker is done",
                   k, s.address, st.ToString());
    }
  }
  return Status::Ok();
}

Result<UpdateAssignment> ShardedEpsClient::TakeUpdate(std::chrono::milliseconds) {
  return FailedPrecondition("a sharded job runs every layer update on its shards (no device updates)");
}

}  // namespace l2l::worker
