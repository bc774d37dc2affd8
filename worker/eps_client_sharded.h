// ShardedEpsClient: the EpsClient of a worker in a sharded job (common/shard_plan.h):
// one client per l2l-eps shard (shm to a shard on this host, gRPC otherwise, as each
// shard's registration says), and every layer routed to the shard that owns it under
// that shard's local index. The relay sees one EPS with the whole model.
//
// Registration: shard 0 first (it gives the worker id and names the shards), then every
// other shard with that id (ClientOptions::shard_worker_id).
//
// Recovery: a worker lost mid-step on any shard, or a shard restarted, rolls every shard
// back to the job's last complete checkpoint (eps_server/shards.h), and then every shard
// asks every worker to rejoin. A shard that cannot be reached (its process died) makes
// rejoin_requested() true as well. Rejoin waits (up to ClientOptions::shard_wait,
// logging what it waits for every 10 s) until every shard has asked, re-registering with
// a down shard as soon as it answers again, then re-registers with all of them; the
// worker restarts at the step they agree on, at shard 0's data position. StepDone goes
// to every shard (each gates its commits on the losses and keeps the data positions);
// LeaveAfterLastStep leaves shard 0 first (it lets go only once the final checkpoint is
// assembled from every shard's part), then the others: once shard 0 let go, a shard that
// is down, restarted or rolling back is not waited for (the end is durable). A sharded
// job updates on its shards: TakeUpdate is refused (the interleaved optimizer is off).
//
// Ownership: owns the per-shard clients. Thread-safety: as EpsClient.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "worker/eps_client.h"

namespace l2l::worker {

class ShardedEpsClient : public EpsClient {
 public:
  // shard0: the client registered with shard 0, whose registration names the shards.
  // Connects to the others; errors name the shard and its address.
  static Result<std::unique_ptr<EpsClient>> Create(std::unique_ptr<EpsClient> shard0, const ClientOptions& options);

  const WorkerRegistration& registration() const override { return reg_; }
  Result<LayerWeights> AcquireLayer(int64_t layer, int64_t min_version, std::chrono::milliseconds timeout) override;
  void ReleaseLayer(int64_t layer) override;
  Status PushGradient(int64_t layer, int64_t step, int64_t micro_batches, const float* grad, size_t numel) override;
  Status StepDone(const StepReport& report) override;
  void SetHostRegionObserver(HostRegionObserver* observer) override;
  bool HasGradientSlots() const override;
  Result<GradientSlot> ClaimGradientSlot(int64_t layer, size_t numel) override;
  Status PublishGradientSlot(const GradientSlot& slot, int64_t layer, int64_t step, int64_t micro_batches,
                             size_t numel) override;
  void AbandonGradientSlot(const GradientSlot& slot) override;
  Status Rejoin() override;
  bool rejoin_requested() const override;
  Status LeaveAfterLastStep(std::chrono::milliseconds wait) override;
  Result<UpdateAssignment> TakeUpdate(std::chrono::milliseconds wait) override;

 private:
  struct Shard {
    std::unique_ptr<EpsClient> client;
    int64_t first = 0, count = 0;
    std::string address;
    std::atomic<bool> asked_rejoin{false};  // a call's error asked for a rejoin
    std::atomic<bool> down{false};          // a call found it unreachable
    Shard() = default;
    Shard(Shard&& o) noexcept
        : client(std::move(o.client)), first(o.first), count(o.count), address(std::move(o.address)) {}
  };
  ShardedEpsClient() = default;
  // The owner of model layer `layer` (nullptr: out of range) and its local index.
  Shard* Owner(int64_t layer, int64_t* local);
  // A shard's call failed asking this worker to rejoin (before its heartbeat said so), or
  // found the shard unreachable: Rejoin must re-register there. Returns s.
  Status Note(Shard* shard, Status s);
  // Whether shard k asked for a rejoin (or is down).
  bool Asked(const Shard& s) const;
  // Re-registers with the shards that ask (fresh: already registered in this round)
  // until every registration is in the same recovery epoch; then the start steps must
  // agree. Waits up to shard_wait_.
  Status Converge(std::vector<bool> fresh);
  std::vector<Shard> shards_;
  std::chrono::milliseconds shard_wait_{600000};
  // Shard 0's registration; a rejoin updates start_step and data_position from the
  // shards that asked for it.
  WorkerRegistration reg_;
  std::mutex mu_;
  std::map<const void*, size_t> slot_shard_;  // GUARDED_BY(mu_): claimed slot -> shard
};

}  // namespace l2l::worker
