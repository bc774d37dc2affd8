// ShardedEpsClient: one EPS client per shard, layers routed to their owner. See
// eps_client_sharded.h.
#include "worker/eps_client_sharded.h"

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
    if (r.first_layer != sh.first || r.worker_id != reg.worker_id || r.start_step != reg.start_step) {
      return FailedPrecondition("shard " + std::to_string(k) + " at " + s.address + " registered this worker as " +
                                std::to_string(r.worker_id) + " from layer " + std::to_string(r.first_layer) +
                                " at step " + std::to_string(r.start_step) + "; shard 0 says worker " +
                                std::to_string(reg.worker_id) + ", layer " + std::to_string(sh.first) + ", step " +
                                std::to_string(reg.start_step) + " (the shards run different jobs or states)");
    }
    c->shards_.push_back(std::move(sh));
  }
  c->reg_ = reg;
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
  if (!s.ok() && NeedsRejoin(s)) shard->asked_rejoin.store(true);
  return s;
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

Status ShardedEpsClient::Rejoin() {
  // Only the shards that asked (a shard that lost this worker, or rolled back): the
  // others still have it as an active member and would refuse a second registration.
  std::vector<size_t> asked;
  for (size_t k = 0; k < shards_.size(); ++k) {
    if (shards_[k].client->rejoin_requested() || shards_[k].asked_rejoin.exchange(false)) asked.push_back(k);
  }
  if (asked.empty()) {  // the caller saw a rejoin error before any heartbeat said so
    for (size_t k = 0; k < shards_.size(); ++k) asked.push_back(k);
  }
  for (size_t k : asked) {
    L2L_RETURN_IF_ERROR(shards_[k].client->Rejoin().WithContext("rejoining shard " + std::to_string(k)));
  }
  const WorkerRegistration& first = shards_[asked[0]].client->registration();
  for (size_t k : asked) {
    const int64_t at = shards_[k].client->registration().start_step;
    if (at != first.start_step) {
      return FailedPrecondition("after a rejoin shard " + std::to_string(k) + " restarts this worker at step " +
                                std::to_string(at) + ", shard " + std::to_string(asked[0]) + " at " +
                                std::to_string(first.start_step) +
                                " (the shards rolled back differently: restart the job from its last checkpoint)");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  reg_.start_step = first.start_step;
  reg_.data_position = first.data_position;
  reg_.registration_id = shards_[0].client->registration().registration_id;
  return Status::Ok();
}

bool ShardedEpsClient::rejoin_requested() const {
  for (const Shard& s : shards_) {
    if (s.client->rejoin_requested() || s.asked_rejoin.load()) return true;
  }
  return false;
}

Status ShardedEpsClient::LeaveAfterLastStep(std::chrono::milliseconds wait) {
  // Shard 0 last: it writes the final checkpoint's manifest once every part is in.
  for (size_t k = shards_.size(); k-- > 0;) L2L_RETURN_IF_ERROR(shards_[k].client->LeaveAfterLastStep(wait));
  return Status::Ok();
}

Result<UpdateAssignment> ShardedEpsClient::TakeUpdate(std::chrono::milliseconds) {
  return FailedPrecondition("a sharded job runs every layer update on its shards (no device updates)");
}

}  // namespace l2l::worker
