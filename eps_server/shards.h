// The l2l-eps shards of a sharded job talking to each other (common/shard_plan.h;
// proto/shard.proto). Shard 0 holds a ShardHub: the shards' endpoints, and per step the
// facts each shard posts (its layers' squared gradient norms, its verdict, its
// checkpoint part) until every shard's is in, then the job's decision: the global
// clip's total (summed over the shards' layers in model layer order, the same terms in
// the same order as one daemon's sum, so the clip is bit-identical), and the verdict
// (commit, or the first shard's reason to skip). Every other shard holds a ShardLink:
// it joins shard 0 over gRPC and posts its facts there as long polls. Both are the
// shard's UpdatePipeline's StepCoordinator and hand the decisions back to it
// (SetGlobalNorm2 / SetGlobalVerdict) from their own thread, never from the caller's
// (the pipeline posts under its lock).
//
// Checkpoints: each shard writes its part (eps_server/checkpoint.h WriteCheckpointPart)
// and posts it; shard 0 waits for every part of the step and assembles the checkpoint,
// so it exists only once every shard's layers are on disk.
//
// Recovery (proto/shard.proto): shard 0 keeps a recovery epoch. It begins a new one when
// a shard's process restarted (a Join from a new instance, resumed from the job's last
// complete checkpoint) or a shard lost a worker mid-step (RequestRollback): every shard
// then rolls back to that checkpoint's step (the core's rollback callback, between
// BeginRollback and EndRollback) and every worker rejoins every shard. Facts and
// answers carry their epoch; those of an older one are dropped, so nothing decided
// before a rollback reaches a pipeline after it. Shards other than 0 watch shard 0 (a
// long poll that is also their liveness: shard 0 logs a shard that stopped watching).
// A restarted shard 0 (resumed from the last complete checkpoint on the same address):
// the other shards' watches find another process answering; they join it again as
// running shards, and it begins an epoch past theirs (every shard rolls back to its
// step); the workers register with it again under their ids.

// Thread-safety: every method is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/shard_plan.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "eps_server/checkpoint.h"
#include "eps_server/update_pipeline.h"

namespace l2l::eps {

// The job's identity between shards: FNV-1a 64 of JobConfigToYaml(job), 16 hex digits.
std::string JobHash(const JobConfig& job);

// What CreateJob and the core need from the other shards, whichever side this is.
class ShardPeers : public StepCoordinator {
 public:
  // The job exists here: its plan (every shard's range, by index), this shard's start
  // step and the pipeline to answer. Called once, by EpsCore::CreateJob.
  virtual Status Start(const JobConfig& job, const std::vector<LayerRange>& plan, int64_t start_step,
                       UpdatePipeline* pipeline) = 0;
  // Every shard, once all have joined (shard 0); UNAVAILABLE naming the missing ones
  // before. Other shards: FAILED_PRECONDITION (workers register with shard 0).
  virtual Result<std::vector<ShardEndpoint>> Endpoints() const = 0;
  // This shard wrote its checkpoint part from its state in recovery epoch `epoch`: the
  // hub records it, a link sends it to shard 0 (retrying up to `timeout`). ABORTED: the
  // epoch is over (the part is never assembled).
  virtual Status SubmitPart(const CheckpointPart& part, int64_t epoch, std::chrono::milliseconds timeout) = 0;
  // Shard 0: every shard's part of `step` in `epoch` (waits up to `timeout`;
  // DEADLINE_EXCEEDED names the shards whose part is missing; ABORTED: the epoch ended).
  // Others: UNIMPLEMENTED.
  virtual Result<std::vector<CheckpointPart>> WaitParts(int64_t step, int64_t epoch,
                                                        std::chrono::milliseconds timeout) = 0;
  // Wakes every wait (ABORTED) and joins the threads; no answer reaches the pipeline after.
  virtual void Stop() = 0;
  // This shard's job failed (it stops): a link tells shard 0 (one try, bounded), which
  // then stops the job too, so its workers are not left waiting for a step that cannot
  // complete. The hub: nothing (the other shards lose their coordinator).
  virtual void ReportFailure(const Status& s) {}

  // Recovery epochs. `on_rollback` (set before Start) rolls this shard back to
  // epoch.step and returns when done; it is called from the peers' own thread.
  struct Epoch {
    int64_t epoch = 0;
    int64_t step = 0;    // the job's last complete checkpoint (or its start)
    std::string reason;  // why shard 0 began it
  };
  void set_on_rollback(std::function<void(const Epoch&)> f) { on_rollback_ = std::move(f); }
  // This shard lost a worker mid-step: every shard must roll back (shard 0 begins a new
  // epoch). Returns at once; the rollback arrives through on_rollback.
  virtual void RequestRollback(const std::string& why) = 0;
  // The core's rollback brackets its reset with these: facts posted and answers arriving
  // between them are dropped (they belong to the state being discarded); EndRollback
  // enters `epoch`. BeginRollback waits for an answer being delivered to finish.
  void BeginRollback();
  void EndRollback(int64_t epoch);
  int64_t epoch() const;
  // Shard 0: the step every shard rolls back to (the job's last complete checkpoint,
  // the start step before the first one). The core keeps it current.
  virtual void SetRestorePoint(int64_t step) {}
  // Whether workers may register now (else they retry: UNAVAILABLE): not before this
  // shard joined shard 0 (it learns the recovery epoch then), nor on shard 0 while its
  // own rollback into the epoch it began is still to run (a registration must carry the
  // epoch of the state it starts from).
  virtual bool accepts_workers() const { return true; }

 protected:
  // Delivers an answer of `epoch` to the pipeline unless a rollback is under way or the
  // epoch is over (under deliver_mu_, which BeginRollback takes).
  void Deliver(int64_t epoch, const std::function<void()>& f);
  // Whether a fact of this shard's pipeline posted now belongs to the current epoch (not
  // to a state being rolled back); its epoch.
  bool PostingEpoch(int64_t* epoch) const;
  std::function<void(const Epoch&)> on_rollback_;

 private:
  mutable std::mutex epoch_mu_;
  int64_t applied_epoch_ GUARDED_BY(epoch_mu_) = 0;  // the epoch this shard's state is in
  bool rolling_back_ GUARDED_BY(epoch_mu_) = false;
  std::mutex deliver_mu_;  // held while an answer is handed to the pipeline
};

// Shard 0's side.
class ShardHub : public ShardPeers {
 public:
  // self_address: where workers reach shard 0 (set once the server listens).
  explicit ShardHub(ShardId id);
  ~ShardHub() override;
  void set_self_address(const std::string& address);

  Status Start(const JobConfig& job, const std::vector<LayerRange>& plan, int64_t start_step,
               UpdatePipeline* pipeline) override;
  Result<std::vector<ShardEndpoint>> Endpoints() const override;
  Status SubmitPart(const CheckpointPart& part, int64_t epoch, std::chrono::milliseconds timeout) override;
  Result<std::vector<CheckpointPart>> WaitParts(int64_t step, int64_t epoch,
                                                std::chrono::milliseconds timeout) override;
  void Stop() override;
  void PostNorms(int64_t step, std::vector<double> norm2) override;
  void PostVerdict(int64_t step, const std::string& skip_reason) override;
  void RequestRollback(const std::string& why) override;
  void SetRestorePoint(int64_t step) override;
  bool accepts_workers() const override;

  // From the Shards service (grpc_server.cc).
  struct JoinInfo {
    int shard = 0, shards = 0;
    LayerRange layers;
    std::string address, job_hash;
    int64_t start_step = 0;
    uint64_t instance = 0;
    bool running = false;  // its job ran under a previous shard 0 (JoinRequest.running)
    int64_t epoch = 0;     // running: the epoch its state is in
  };
  // A restarted shard (another instance) begins a new epoch: its start step must be the
  // restore point. The reply: the epoch it starts in.
  Result<Epoch> Join(const JoinInfo& j);
  uint64_t instance() const { return instance_; }
  struct Decision {
    bool ready = false;
    double total_norm2 = 0;
    std::string skip_reason;
  };
  enum class Kind { kNorms = 0, kVerdict = 1 };
  // Records shard `shard`'s fact of `step` in `epoch` (kNorms: norm2, one per layer it
  // owns; kVerdict: skip_reason) and waits up to `wait` for every shard's. ABORTED: the
  // epoch is over (before or during the wait).
  Result<Decision> Facts(int shard, int64_t epoch, int64_t step, Kind kind, const std::vector<double>& norm2,
                         const std::string& skip_reason, std::chrono::milliseconds wait);
  // Shard `shard` (instance) watches: returns at once if the epoch is past `epoch`, else
  // after `wait` (or when one begins). Records the shard as alive.
  Result<Epoch> Watch(int shard, uint64_t instance, int64_t epoch, std::chrono::milliseconds wait);
  // Shard `shard` (the process that joined as `instance`) lost a worker mid-step in
  // `epoch`: a new epoch unless one began since. FAILED_PRECONDITION: no such shard joined.
  Status ShardRollback(int shard, uint64_t instance, int64_t epoch, const std::string& why);
  // How long a shard may go without watching before shard 0 logs it as gone.
  static constexpr std::chrono::seconds kWatchTimeout{15};
  // Another shard's job failed (FACT_FAILED): calls the callback set here (l2l-eps: fail
  // this shard's job too). Set before the server starts.
  void set_on_shard_failed(std::function<void(const Status&)> f) { on_shard_failed_ = std::move(f); }
  void ShardFailed(int shard, const std::string& why);

 private:
  struct Entry {
    std::vector<bool> have;
    std::vector<std::vector<double>> norm2;
    std::vector<std::string> reason;
    int count = 0;
    Decision decision;
  };
  Status PostLocked(int shard, int64_t step, Kind kind, const std::vector<double>& norm2,
                    const std::string& reason) REQUIRES(mu_);
  // Every shard rolls back to restore_point_: clears the facts and parts, wakes every
  // wait, and queues this shard's own rollback.
  void BeginEpochLocked(const std::string& reason) REQUIRES(mu_);
  // Shard `shard` asks for a rollback seen from `epoch` (RequestRollback, ShardRollback).
  void RollbackLocked(int shard, int64_t epoch, const std::string& why) REQUIRES(mu_);
  void DispatchLoop();

  const ShardId id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ GUARDED_BY(mu_) = false;
  std::string self_address_ GUARDED_BY(mu_);
  bool started_ GUARDED_BY(mu_) = false;
  std::string job_hash_ GUARDED_BY(mu_);
  std::vector<LayerRange> plan_ GUARDED_BY(mu_);
  int64_t start_step_ GUARDED_BY(mu_) = 0;
  UpdatePipeline* pipeline_ GUARDED_BY(mu_) = nullptr;
  std::vector<std::optional<JoinInfo>> joined_ GUARDED_BY(mu_);  // by shard; [0] = this one
  std::map<std::pair<int, int64_t>, Entry> facts_ GUARDED_BY(mu_);  // (kind, step)
  std::map<int64_t, std::vector<std::optional<CheckpointPart>>> parts_ GUARDED_BY(mu_);
  // Decisions for this shard's own pipeline (and its rollbacks), handed over by dispatcher_.
  std::deque<std::function<void()>> answers_ GUARDED_BY(mu_);
  const uint64_t instance_;
  int64_t epoch_ GUARDED_BY(mu_) = 0;
  // A restarted shard 0: running shards joining again; the newest epoch they were in.
  bool awaiting_running_ GUARDED_BY(mu_) = false;
  int64_t running_epoch_ GUARDED_BY(mu_) = 0;
  int64_t restore_point_ GUARDED_BY(mu_) = 0;
  int64_t epoch_step_ GUARDED_BY(mu_) = 0;
  std::string epoch_reason_ GUARDED_BY(mu_);
  // Shards 1..N-1: when each last watched, and whether its silence was logged.
  std::vector<std::chrono::steady_clock::time_point> last_watch_ GUARDED_BY(mu_);
  std::vector<bool> silent_ GUARDED_BY(mu_);
  std::thread dispatcher_;
  std::function<void(const Status&)> on_shard_failed_;
};

// The other shards' side: a gRPC client of shard 0.
struct ShardLinkOptions {
  ShardId id;
  std::string coordinator;  // shard 0's host:port
  std::string advertise;    // this shard's address for workers (host:port)
  // Shard 0's security, as a worker's (proto/client_channel.h).
  std::string token, tls_ca_pem, tls_server_name, tls_cert_pem, tls_key_pem;
  std::chrono::milliseconds join_timeout{120000};  // shard 0 may start later
  // Called once (from the link's thread) when shard 0 stayed unreachable this long (its
  // watch failing), or answered as another process (it restarted): the job cannot go on
  // without its coordinator (l2l-eps stops, exit 1; every shard resumes from the last
  // complete checkpoint).
  std::chrono::milliseconds lost_after{120000};
  std::function<void(const Status&)> on_coordinator_lost;
};

class ShardLink : public ShardPeers {
 public:
  static Result<std::unique_ptr<ShardLink>> Create(const ShardLinkOptions& opts);
  ~ShardLink() override;
  Status Start(const JobConfig& job, const std::vector<LayerRange>& plan, int64_t start_step,
               UpdatePipeline* pipeline) override;
  // Joins shard 0 (retrying until join_timeout): after Start, once this shard listens.
  Status Join(const std::string& advertise);
  Result<std::vector<ShardEndpoint>> Endpoints() const override;
  Status SubmitPart(const CheckpointPart& part, int64_t epoch, std::chrono::milliseconds timeout) override;
  Result<std::vector<CheckpointPart>> WaitParts(int64_t step, int64_t epoch,
                                                std::chrono::milliseconds timeout) override;
  void Stop() override;
  void PostNorms(int64_t step, std::vector<double> norm2) override;
  void PostVerdict(int64_t step, const std::string& skip_reason) override;
  void ReportFailure(const Status& s) override;
  void RequestRollback(const std::string& why) override;
  bool accepts_workers() const override { return joined_.load(); }

  struct Impl;

 private:
  explicit ShardLink(const ShardLinkOptions& opts);
  void SendLoop();
  // Watches shard 0 (liveness both ways, new epochs) and sends rollback requests.
  void WatchLoop();
  // Joins shard 0 (retrying for up to `timeout`); running: this shard's job ran under a
  // previous shard 0. The epoch the reply puts it in.
  Result<ShardPeers::Epoch> JoinShard0(bool running, std::chrono::milliseconds timeout);
  // Shard 0 restarted: join it again and roll back as it says; false: gave up (the
  // coordinator-lost callback ran).
  bool RejoinRestartedShard0();
  struct Fact {
    int64_t epoch = 0;
    int64_t step = 0;
    int kind = 0;  // ShardHub::Kind
    std::vector<double> norm2;
    std::string reason;
  };
  const ShardLinkOptions opts_;
  std::unique_ptr<Impl> impl_;
  const uint64_t instance_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ GUARDED_BY(mu_) = false;
  std::string job_hash_ GUARDED_BY(mu_);
  LayerRange range_ GUARDED_BY(mu_);
  int64_t start_step_ GUARDED_BY(mu_) = 0;
  UpdatePipeline* pipeline_ GUARDED_BY(mu_) = nullptr;
  std::deque<Fact> queue_ GUARDED_BY(mu_);
  std::vector<std::string> rollback_requests_ GUARDED_BY(mu_);
  uint64_t coordinator_ GUARDED_BY(mu_) = 0;  // shard 0's instance (Join)
  std::string advertise_ GUARDED_BY(mu_);      // this shard's address for workers
  std::atomic<bool> joined_{false};
  std::thread sender_, watcher_;
};

}  // namespace l2l::eps
