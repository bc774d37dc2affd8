// ShardHub (shard 0) and ShardLink (the other shards): see shards.h.
#include "eps_server/shards.h"

#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <iterator>
#include <random>

#include "common/fault_point.h"
#include "common/logging.h"
#include "common/rng.h"
#include "proto/client_channel.h"
#include "proto/shard.grpc.pb.h"

namespace l2l::eps {
namespace {

namespace shard = ::l2l::shard::v1;

std::string RangeText(const LayerRange& r) {
  return "layers " + std::to_string(r.first) + ".." + std::to_string(r.end() - 1);
}

uint64_t NewInstance() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v;
}

Status EpochOver(int64_t epoch, int64_t now) {
  return Aborted("recovery epoch " + std::to_string(epoch) + " is over (shard 0 is in epoch " + std::to_string(now) +
                 "): every shard rolls back");
}

}  // namespace

// ---- ShardPeers: the epoch this shard's state is in ----------------------------------------

void ShardPeers::BeginRollback() {
  std::lock_guard<std::mutex> deliver(deliver_mu_);  // an answer being handed over finishes first
  std::lock_guard<std::mutex> lock(epoch_mu_);
  rolling_back_ = true;
}

void ShardPeers::EndRollback(int64_t epoch) {
  std::lock_guard<std::mutex> lock(epoch_mu_);
  rolling_back_ = false;
  applied_epoch_ = std::max(applied_epoch_, epoch);
}

int64_t ShardPeers::epoch() const {
  std::lock_guard<std::mutex> lock(epoch_mu_);
  return applied_epoch_;
}

void ShardPeers::Deliver(int64_t epoch, const std::function<void()>& f) {
  std::lock_guard<std::mutex> deliver(deliver_mu_);
  {
    std::lock_guard<std::mutex> lock(epoch_mu_);
    if (rolling_back_ || epoch != applied_epoch_) return;
  }
  f();
}

bool ShardPeers::PostingEpoch(int64_t* epoch) const {
  std::lock_guard<std::mutex> lock(epoch_mu_);
  *epoch = applied_epoch_;
  return !rolling_back_;
}

std::string JobHash(const JobConfig& job) {
  const std::string yaml = JobConfigToYaml(job);
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx",
                static_cast<unsigned long long>(Fnv1a64(yaml.data(), yaml.size())));
  return text;
}

// ---- ShardHub ---------------------------------------------------------------------------

ShardHub::ShardHub(ShardId id)
    : id_(id),
      joined_(static_cast<size_t>(id.count)),
      instance_(NewInstance()),
      last_watch_(static_cast<size_t>(id.count), std::chrono::steady_clock::now()),
      silent_(static_cast<size_t>(id.count), false) {
  dispatcher_ = std::thread([this] { DispatchLoop(); });
}

ShardHub::~ShardHub() { Stop(); }

void ShardHub::set_self_address(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  self_address_ = address;
  if (joined_[0]) joined_[0]->address = address;
}

Status ShardHub::Start(const JobConfig& job, const std::vector<LayerRange>& plan, int64_t start_step,
                       UpdatePipeline* pipeline) {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return FailedPrecondition("shard 0 already has a job");
  started_ = true;
  job_hash_ = JobHash(job);
  plan_ = plan;
  start_step_ = start_step;
  restore_point_ = epoch_step_ = start_step;
  pipeline_ = pipeline;
  JoinInfo self;
  self.shard = 0;
  self.shards = id_.count;
  self.layers = plan[0];
  self.address = self_address_;
  self.job_hash = job_hash_;
  self.start_step = start_step;
  joined_[0] = self;
  // Shards that joined before the job existed here were refused (no job yet): they retry.
  cv_.notify_all();
  return Status::Ok();
}

Result<ShardPeers::Epoch> ShardHub::Join(const JoinInfo& j) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return Aborted("shard 0 is stopping");
  if (!started_) return Unavailable("shard 0 has no job yet");
  const std::string who = "shard " + std::to_string(j.shard) + " (" + j.address + ")";
  if (j.shards != id_.count) {
    return InvalidArgument(who + " is started as one of " + std::to_string(j.shards) + " shards, shard 0 as one of " +
                           std::to_string(id_.count) + ": give every shard the same --shard K/N");
  }
  if (j.shard <= 0 || j.shard >= id_.count) {
    return InvalidArgument(who + ": shard index must be 1.." + std::to_string(id_.count - 1));
  }
  if (j.job_hash != job_hash_) {
    return InvalidArgument(who + " runs another job (config hash " + j.job_hash + ", shard 0's " + job_hash_ +
                           "): give every shard the same --job file or --resume checkpoint");
  }
  const auto& prev = joined_[static_cast<size_t>(j.shard)];
  // A shard that ran under a previous shard 0 (this one restarted): its state is ahead;
  // it rolls back to this shard's restore point in an epoch past every one it saw.
  const bool running = j.running && !(prev && prev->instance == j.instance);
  const bool restarted = !running && prev && prev->instance != j.instance;
  if (restarted && j.start_step != restore_point_) {
    return InvalidArgument(who + " restarted at step " + std::to_string(j.start_step) +
                           ", but the job's last complete checkpoint is step " + std::to_string(restore_point_) +
                           ": restart it with --resume <the job's checkpoint root> (every shard rolls back there)");
  }
  if (!prev && !running && j.start_step != start_step_) {
    return InvalidArgument(who + " starts at step " + std::to_string(j.start_step) + ", shard 0 at step " +
                           std::to_string(start_step_) + ": resume every shard from the same checkpoint");
  }
  const LayerRange& want = plan_[static_cast<size_t>(j.shard)];
  if (!(j.layers == want)) {
    // The shards' plans differ (another --shard-layers): say how the two overlap or leave gaps.
    std::vector<LayerRange> theirs = plan_;
    theirs[static_cast<size_t>(j.shard)] = j.layers;
    const Status gap = CheckShardRanges(theirs, plan_.back().end());
    return InvalidArgument(who + " owns " + RangeText(j.layers) + ", shard 0's plan gives it " + RangeText(want) +
                           (gap.ok() ? std::string() : " (" + gap.message() + ")") +
                           ": give every shard the same --shard-layers");
  }
  joined_[static_cast<size_t>(j.shard)] = j;
  last_watch_[static_cast<size_t>(j.shard)] = std::chrono::steady_clock::now();
  silent_[static_cast<size_t>(j.shard)] = false;
  if (running) {
    L2L_LOG_WARN("shard {} of {} ({}) joins this restarted shard 0 with its job running (recovery epoch {})",
                 j.shard, id_.count, j.address, j.epoch);
    running_epoch_ = std::max(running_epoch_, j.epoch);
    awaiting_running_ = true;
  }
  if (awaiting_running_) {
    // One epoch for them all, once every shard is back: each shard's join starting its
    // own would roll the others back again while workers rejoin.
    std::string missing;
    for (int k = 1; k < id_.count; ++k) {
      if (!joined_[static_cast<size_t>(k)]) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
    }
    if (!missing.empty()) {
      return Unavailable("shard 0 restarted: waiting for shard(s) " + missing + " to join again; then every shard "
                         "rolls back to step " + std::to_string(restore_point_));
    }
    awaiting_running_ = false;
    epoch_ = std::max(epoch_, running_epoch_);
    L2L_LOG_WARN("every shard joined this restarted shard 0: every shard rolls back to step {} and every worker "
                 "rejoins",
                 restore_point_);
    BeginEpochLocked("shard 0 restarted");
  } else if (restarted) {
    L2L_LOG_WARN("shard {} of {} restarted ({}, resumed at step {}): every shard rolls back to step {} and every "
                 "worker rejoins",
                 j.shard, id_.count, j.address, j.start_step, restore_point_);
    BeginEpochLocked("shard " + std::to_string(j.shard) + " restarted");
  } else {
    L2L_LOG_INFO("shard {} of {} joined from {} ({})", j.shard, id_.count, j.address, RangeText(j.layers));
  }
  cv_.notify_all();
  return Epoch{epoch_, epoch_step_, epoch_reason_};
}

void ShardHub::BeginEpochLocked(const std::string& reason) {
  ++epoch_;
  epoch_step_ = restore_point_;
  epoch_reason_ = reason;
  facts_.clear();
  parts_.clear();
  if (on_rollback_) {
    const Epoch e{epoch_, epoch_step_, reason};
    answers_.push_back([this, e] { on_rollback_(e); });
  }
  cv_.notify_all();
}

bool ShardHub::accepts_workers() const {
  const int64_t applied = epoch();
  std::lock_guard<std::mutex> lock(mu_);
  return applied >= epoch_;
}

void ShardHub::SetRestorePoint(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  restore_point_ = step;
}

void ShardHub::RequestRollback(const std::string& why) {
  const int64_t seen = epoch();
  std::lock_guard<std::mutex> lock(mu_);
  if (!stopped_) RollbackLocked(0, seen, why);
}

Status ShardHub::ShardRollback(int shard, uint64_t instance, int64_t epoch, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return Aborted("shard 0 is stopping");
  if (!started_) return FailedPrecondition("shard 0 has no job yet");
  if (shard <= 0 || shard >= id_.count || !joined_[static_cast<size_t>(shard)] ||
      joined_[static_cast<size_t>(shard)]->instance != instance) {
    return FailedPrecondition("a rollback request from shard " + std::to_string(shard) +
                              ", which has not joined as this process");
  }
  RollbackLocked(shard, epoch, why);
  return Status::Ok();
}

void ShardHub::RollbackLocked(int shard, int64_t epoch, const std::string& why) {
  if (epoch < epoch_) return;  // the rollback it asks for began already
  L2L_LOG_WARN("shard {}: {}: every shard rolls back to step {}", shard, why, restore_point_);
  BeginEpochLocked("shard " + std::to_string(shard) + ": " + why);
}

Result<ShardPeers::Epoch> ShardHub::Watch(int shard, uint64_t instance, int64_t epoch,
                                          std::chrono::milliseconds wait) {
  UniqueLock lock(mu_);
  if (!started_) return FailedPrecondition("shard 0 has no job yet");
  if (shard <= 0 || shard >= id_.count || !joined_[static_cast<size_t>(shard)]) {
    return FailedPrecondition("shard " + std::to_string(shard) + " has not joined");
  }
  if (joined_[static_cast<size_t>(shard)]->instance != instance) {
    return FailedPrecondition("shard " + std::to_string(shard) + " joined as another process");
  }
  auto alive = [&]() REQUIRES(mu_) {
    const auto now = std::chrono::steady_clock::now();
    if (silent_[static_cast<size_t>(shard)]) {
      const auto gap = now - last_watch_[static_cast<size_t>(shard)];
      L2L_LOG_INFO("shard {} watches shard 0 again (after {} s)", shard,
                   std::chrono::duration_cast<std::chrono::seconds>(gap).count());
      silent_[static_cast<size_t>(shard)] = false;
    }
    last_watch_[static_cast<size_t>(shard)] = now;
  };
  alive();
  cv_.wait_for(lock.native(), wait, [&]() REQUIRES(mu_) { return stopped_ || epoch_ > epoch; });
  alive();
  if (stopped_) return Aborted("shard 0 is stopping");
  return Epoch{epoch_, epoch_step_, epoch_reason_};
}

Result<std::vector<ShardEndpoint>> ShardHub::Endpoints() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ShardEndpoint> out;
  std::string missing;
  for (int k = 0; k < id_.count; ++k) {
    const auto& j = joined_[static_cast<size_t>(k)];
    if (!j || j->address.empty()) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      continue;
    }
    out.push_back({k, j->address, j->layers});
  }
  if (!missing.empty()) {
    return Unavailable("the job's shards have not all joined shard 0 yet (missing: " + missing + " of " +
                       std::to_string(id_.count) + ")");
  }
  return out;
}

Status ShardHub::PostLocked(int shard, int64_t step, Kind kind, const std::vector<double>& norm2,
                            const std::string& reason) {
  if (shard < 0 || shard >= id_.count) return InvalidArgument("shard " + std::to_string(shard) + " out of range");
  if (kind == Kind::kNorms && static_cast<int64_t>(norm2.size()) != plan_[static_cast<size_t>(shard)].count) {
    return InvalidArgument("shard " + std::to_string(shard) + " sent " + std::to_string(norm2.size()) +
                           " gradient norms, it owns " + std::to_string(plan_[static_cast<size_t>(shard)].count) +
                           " layers");
  }
  Entry& e = facts_[{static_cast<int>(kind), step}];
  if (e.have.empty()) {
    e.have.assign(static_cast<size_t>(id_.count), false);
    e.norm2.resize(static_cast<size_t>(id_.count));
    e.reason.resize(static_cast<size_t>(id_.count));
  }
  if (e.have[static_cast<size_t>(shard)]) return Status::Ok();  // a repeated post
  e.have[static_cast<size_t>(shard)] = true;
  e.norm2[static_cast<size_t>(shard)] = norm2;
  e.reason[static_cast<size_t>(shard)] = reason;
  if (++e.count < id_.count) return Status::Ok();
  // Every shard's fact is in: the job's decision. Shard k's layers precede shard k+1's.
  e.decision.ready = true;
  double total = 0;
  for (const auto& n : e.norm2) {
    for (double v : n) total += v;  // model layer order, as one daemon sums
  }
  e.decision.total_norm2 = total;
  for (const auto& r : e.reason) {
    if (!r.empty()) {
      e.decision.skip_reason = r;
      break;
    }
  }
  // This shard's own pipeline hears it from the dispatcher (it may be the caller now).
  UpdatePipeline* p = pipeline_;
  const Decision d = e.decision;
  const int64_t ep = epoch_;
  if (kind == Kind::kNorms) {
    answers_.push_back([this, ep, p, step, d] { Deliver(ep, [&] { p->SetGlobalNorm2(step, d.total_norm2); }); });
  } else {
    answers_.push_back([this, ep, p, step, d] { Deliver(ep, [&] { p->SetGlobalVerdict(step, d.skip_reason); }); });
  }
  // Old steps' facts of this kind are no longer asked for.
  for (auto it = facts_.begin(); it != facts_.end();) {
    it = (it->first.first == static_cast<int>(kind) && it->first.second < step - 8) ? facts_.erase(it) : std::next(it);
  }
  cv_.notify_all();
  return Status::Ok();
}

void ShardHub::PostNorms(int64_t step, std::vector<double> norm2) {
  int64_t e = 0;
  if (!PostingEpoch(&e)) return;  // the state being rolled back
  std::lock_guard<std::mutex> lock(mu_);
  if (e != epoch_) return;
  if (Status s = PostLocked(0, step, Kind::kNorms, norm2, ""); !s.ok()) {
    L2L_LOG_ERROR("shard 0's own gradient norms: {}", s.ToString());
  }
}

void ShardHub::PostVerdict(int64_t step, const std::string& skip_reason) {
  int64_t e = 0;
  if (!PostingEpoch(&e)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (e != epoch_) return;
  if (Status s = PostLocked(0, step, Kind::kVerdict, {}, skip_reason); !s.ok()) {
    L2L_LOG_ERROR("shard 0's own verdict: {}", s.ToString());
  }
}

Result<ShardHub::Decision> ShardHub::Facts(int shard, int64_t epoch, int64_t step, Kind kind,
                                           const std::vector<double>& norm2, const std::string& skip_reason,
                                           std::chrono::milliseconds wait) {
  UniqueLock lock(mu_);
  if (!started_) return FailedPrecondition("shard 0 has no job yet");
  if (shard <= 0 || shard >= id_.count || !joined_[static_cast<size_t>(shard)]) {
    return FailedPrecondition("shard " + std::to_string(shard) + " has not joined");
  }
  if (epoch != epoch_) return EpochOver(epoch, epoch_);
  L2L_RETURN_IF_ERROR(PostLocked(shard, step, kind, norm2, skip_reason));
  const auto key = std::make_pair(static_cast<int>(kind), step);
  cv_.wait_for(lock.native(), wait, [&]() REQUIRES(mu_) {
    const auto it = facts_.find(key);
    return stopped_ || epoch_ != epoch || it == facts_.end() || it->second.decision.ready;
  });
  if (stopped_) return Aborted("shard 0 is stopping");
  if (epoch != epoch_) return EpochOver(epoch, epoch_);
  const auto it = facts_.find(key);
  if (it == facts_.end()) return FailedPrecondition("step " + std::to_string(step) + " is long done");
  return it->second.decision;
}

Status ShardHub::SubmitPart(const CheckpointPart& part, int64_t epoch, std::chrono::milliseconds) {
  std::lock_guard<std::mutex> lock(mu_);
  // A part written before a rollback holds state the shards abandoned: never assembled.
  if (epoch != epoch_) return EpochOver(epoch, epoch_);
  if (part.shard < 0 || part.shard >= id_.count) {
    return InvalidArgument("checkpoint part from shard " + std::to_string(part.shard) + ": out of range");
  }
  auto& v = parts_[part.step];
  v.resize(static_cast<size_t>(id_.count));
  v[static_cast<size_t>(part.shard)] = part;
  // Parts of steps far behind will never be assembled (a checkpoint that failed).
  while (parts_.size() > 8) parts_.erase(parts_.begin());
  cv_.notify_all();
  return Status::Ok();
}

Result<std::vector<CheckpointPart>> ShardHub::WaitParts(int64_t step, int64_t epoch,
                                                        std::chrono::milliseconds timeout) {
  UniqueLock lock(mu_);
  auto complete = [&]() REQUIRES(mu_) {
    if (epoch != epoch_) return false;
    const auto it = parts_.find(step);
    if (it == parts_.end() || it->second.size() != static_cast<size_t>(id_.count)) return false;
    for (const auto& p : it->second) {
      if (!p) return false;
    }
    return true;
  };
  auto done = [&]() REQUIRES(mu_) { return stopped_ || epoch != epoch_ || complete(); };
  if (!complete() && !cv_.wait_for(lock.native(), std::chrono::seconds(5), done)) {
    L2L_LOG_INFO("checkpoint of step {}: waiting (up to {} s) for every shard's part", step,
                 std::chrono::duration_cast<std::chrono::seconds>(timeout).count());
  }
  cv_.wait_for(lock.native(), timeout, done);
  if (epoch != epoch_) return EpochOver(epoch, epoch_);
  if (!complete()) {
    std::string missing;
    const auto it = parts_.find(step);
    for (int k = 0; k < id_.count; ++k) {
      if (it == parts_.end() || it->second.size() <= static_cast<size_t>(k) || !it->second[static_cast<size_t>(k)]) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      }
    }
    if (stopped_) return Aborted("shard 0 stopped while waiting for checkpoint parts of step " + std::to_string(step));
    return Status(StatusCode::kDeadlineExceeded, "checkpoint of step " + std::to_string(step) +
                                                     ": no part from shard(s) " + missing + " within " +
                                                     std::to_string(timeout.count()) + " ms");
  }
  std::vector<CheckpointPart> out;
  for (auto& p : parts_[step]) out.push_back(*p);
  parts_.erase(step);
  return out;
}

void ShardHub::ShardFailed(int shard, const std::string& why) {
  L2L_LOG_ERROR("shard {} failed: {}", shard, why);
  if (on_shard_failed_) {
    on_shard_failed_(Aborted("shard " + std::to_string(shard) + " of " + std::to_string(id_.count) +
                             " failed, so the job stops: " + why));
  }
}

void ShardHub::DispatchLoop() {
  UniqueLock lock(mu_);
  for (;;) {
    cv_.wait_for(lock.native(), std::chrono::seconds(1), [&]() REQUIRES(mu_) { return stopped_ || !answers_.empty(); });
    if (stopped_) return;
    // A shard that stopped watching is down or cut off: the job cannot complete a step
    // without it, and waits for it (restarted, it joins again and every shard rolls back).
    const auto now = std::chrono::steady_clock::now();
    for (int k = 1; k < id_.count && started_; ++k) {
      const auto kk = static_cast<size_t>(k);
      if (joined_[kk] && !silent_[kk] && now - last_watch_[kk] > kWatchTimeout) {
        silent_[kk] = true;
        L2L_LOG_WARN("shard {} ({}) has not watched shard 0 for {} s: it is down or cut off; the job waits for it "
                     "(restarted with --resume <checkpoint root>, it rejoins and every shard rolls back to step {})",
                     k, joined_[kk]->address, kWatchTimeout.count(), restore_point_);
      }
    }
    if (answers_.empty()) continue;
    std::function<void()> f = std::move(answers_.front());
    answers_.pop_front();
    lock.unlock();
    f();
    lock.lock();
  }
}

void ShardHub::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }
  if (dispatcher_.joinable()) dispatcher_.join();
}

// ---- ShardLink --------------------------------------------------------------------------

struct ShardLink::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<shard::Shards::Stub> stub;
};

namespace {

Status FromGrpcStatus(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE: return Unavailable(what + ": " + s.error_message());
    case grpc::StatusCode::DEADLINE_EXCEEDED: return Status(StatusCode::kDeadlineExceeded, what + ": " + s.error_message());
    case grpc::StatusCode::INVALID_ARGUMENT: return InvalidArgument(what + ": " + s.error_message());
    case grpc::StatusCode::FAILED_PRECONDITION: return FailedPrecondition(what + ": " + s.error_message());
    case grpc::StatusCode::ABORTED: return Aborted(what + ": " + s.error_message());
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return PermissionDenied(what + ": " + s.error_message() +
                              " (give every shard the same --token-file and TLS material)");
    default: return Internal(what + ": " + s.error_message());
  }
}

bool Retryable(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

}  // namespace

ShardLink::ShardLink(const ShardLinkOptions& opts)
    : opts_(opts), impl_(std::make_unique<Impl>()), instance_(NewInstance()) {}

Result<std::unique_ptr<ShardLink>> ShardLink::Create(const ShardLinkOptions& opts) {
  if (opts.coordinator.empty()) {
    return InvalidArgument("shard " + std::to_string(opts.id.index) + " of " + std::to_string(opts.id.count) +
                           " needs --coordinator HOST:PORT (shard 0's address)");
  }
  std::unique_ptr<ShardLink> link(new ShardLink(opts));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  // Shard 0 restarted on its address is found within a second (gRPC's default backoff
  // grows to 2 minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  link->impl_->channel = MakeEpsChannel(opts.coordinator, opts.tls_ca_pem, opts.token, args, opts.tls_server_name,
                                        opts.tls_cert_pem, opts.tls_key_pem);
  link->impl_->stub = shard::Shards::NewStub(link->impl_->channel);
  return link;
}

ShardLink::~ShardLink() { Stop(); }

Status ShardLink::Start(const JobConfig& job, const std::vector<LayerRange>& plan, int64_t start_step,
                        UpdatePipeline* pipeline) {
  std::lock_guard<std::mutex> lock(mu_);
  job_hash_ = JobHash(job);
  range_ = plan[static_cast<size_t>(opts_.id.index)];
  start_step_ = start_step;
  pipeline_ = pipeline;
  if (!sender_.joinable()) sender_ = std::thread([this] { SendLoop(); });
  return Status::Ok();
}

void ShardLink::RequestRollback(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  rollback_requests_.push_back(why);
  cv_.notify_all();
}

Status ShardLink::Join(const std::string& advertise) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    advertise_ = advertise;
  }
  Result<ShardPeers::Epoch> e = JoinShard0(/*running=*/false, opts_.join_timeout);
  if (!e.ok()) return e.status();
  // A restarted shard's state is already the epoch's (resumed from its step).
  EndRollback(e->epoch);
  joined_.store(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!watcher_.joinable() && !stopped_) watcher_ = std::thread([this] { WatchLoop(); });
  }
  L2L_LOG_INFO("shard {} of {} joined shard 0 at {} as {} (recovery epoch {})", opts_.id.index, opts_.id.count,
               opts_.coordinator, advertise, e->epoch);
  return Status::Ok();
}

Result<ShardPeers::Epoch> ShardLink::JoinShard0(bool running, std::chrono::milliseconds timeout) {
  shard::JoinRequest req;
  {
    std::lock_guard<std::mutex> lock(mu_);
    req.set_shard(opts_.id.index);
    req.set_shards(opts_.id.count);
    req.set_first_layer(range_.first);
    req.set_num_layers(range_.count);
    req.set_address(advertise_);
    req.set_job_hash(job_hash_);
    req.set_start_step(start_step_);
    req.set_instance(instance_);
  }
  req.set_running(running);
  req.set_epoch(epoch());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Status last;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    shard::JoinReply rep;
    last = FromGrpcStatus(impl_->stub->Join(&ctx, req, &rep), "joining shard 0 at " + opts_.coordinator);
    if (last.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      coordinator_ = rep.coordinator();
      return ShardPeers::Epoch{rep.epoch(), rep.rollback_step(), "shard 0 restarted"};
    }
    if (!Retryable(last) || std::chrono::steady_clock::now() >= deadline) break;
    {
      UniqueLock lock(mu_);
      if (cv_.wait_for(lock.native(), std::chrono::milliseconds(200), [&]() REQUIRES(mu_) { return stopped_; })) {
        return Aborted("stopping");
      }
    }
  }
  return Retryable(last) ? Unavailable(last.message() + " (for " + std::to_string(timeout.count()) +
                                       " ms; is shard 0 running?)")
                         : last;
}

Result<std::vector<ShardEndpoint>> ShardLink::Endpoints() const {
  return FailedPrecondition("this daemon is shard " + std::to_string(opts_.id.index) + " of " +
                            std::to_string(opts_.id.count) + ": workers register with shard 0 at " + opts_.coordinator);
}

Status ShardLink::SubmitPart(const CheckpointPart& part, int64_t epoch, std::chrono::milliseconds timeout) {
  shard::StepFactsRequest req;
  req.set_shard(opts_.id.index);
  req.set_instance(instance_);
  req.set_epoch(epoch);
  req.set_step(part.step);
  req.set_kind(shard::FACT_CHECKPOINT);
  req.set_part_dir(part.dir);
  for (size_t i = 0; i < part.files.size(); ++i) {
    auto* f = req.add_files();
    f->set_layer(part.model_layers[i]);
    f->set_file(part.files[i].file);
    f->set_numel(part.files[i].numel);
    f->set_bytes(part.files[i].bytes);
    f->set_crc32(part.files[i].crc32);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    shard::StepFactsReply rep;
    Status s = FromGrpcStatus(impl_->stub->StepFacts(&ctx, req, &rep),
                              "checkpoint part of step " + std::to_string(part.step) + " to shard 0");
    if (s.ok() || !Retryable(s) || std::chrono::steady_clock::now() >= deadline) return s;
    UniqueLock lock(mu_);
    if (cv_.wait_for(lock.native(), std::chrono::milliseconds(200), [&]() REQUIRES(mu_) { return stopped_; })) {
      return Aborted("stopping");
    }
  }
}

Result<std::vector<CheckpointPart>> ShardLink::WaitParts(int64_t, int64_t, std::chrono::milliseconds) {
  return Unimplemented("only shard 0 assembles checkpoints");
}

void ShardLink::ReportFailure(const Status& s) {
  shard::StepFactsRequest req;
  req.set_shard(opts_.id.index);
  req.set_instance(instance_);
  req.set_kind(shard::FACT_FAILED);
  req.set_skip_reason(s.ToString());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  shard::StepFactsReply rep;
  const Status r = FromGrpcStatus(impl_->stub->StepFacts(&ctx, req, &rep), "telling shard 0 this shard failed");
  if (!r.ok()) L2L_LOG_WARN("{}", r.ToString());
}

void ShardLink::PostNorms(int64_t step, std::vector<double> norm2) {
  int64_t e = 0;
  if (!PostingEpoch(&e)) return;  // the state being rolled back
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(Fact{e, step, static_cast<int>(ShardHub::Kind::kNorms), std::move(norm2), ""});
  cv_.notify_all();
}

void ShardLink::PostVerdict(int64_t step, const std::string& skip_reason) {
  int64_t e = 0;
  if (!PostingEpoch(&e)) return;
  std::lock_guard<std::mutex> lock(mu_);
  queue_.push_back(Fact{e, step, static_cast<int>(ShardHub::Kind::kVerdict), {}, skip_reason});
  cv_.notify_all();
}

void ShardLink::SendLoop() {
  UniqueLock lock(mu_);
  for (;;) {
    cv_.wait(lock.native(), [&]() REQUIRES(mu_) { return stopped_ || !queue_.empty(); });
    if (stopped_) return;
    const Fact f = queue_.front();
    queue_.pop_front();
    UpdatePipeline* pipeline = pipeline_;
    lock.unlock();
    shard::StepFactsRequest req;
    req.set_shard(opts_.id.index);
    req.set_instance(instance_);
    req.set_epoch(f.epoch);
    req.set_step(f.step);
    req.set_kind(f.kind == static_cast<int>(ShardHub::Kind::kNorms) ? shard::FACT_NORMS : shard::FACT_VERDICT);
    for (double v : f.norm2) req.add_norm2(v);
    req.set_skip_reason(f.reason);
    req.set_wait_ms(2000);
    // Long polls until every shard's fact is in, or the fact's epoch is over (a rollback:
    // the fact is dropped). Shard 0 unreachable: keep trying (the pipeline waits, as it
    // waits for a slow worker; the watch gives up on shard 0 after lost_after).
    int failures = 0;
    while (epoch() == f.epoch) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(15));
      shard::StepFactsReply rep;
      const Status s = FromGrpcStatus(impl_->stub->StepFacts(&ctx, req, &rep),
                                      "step " + std::to_string(f.step) + " facts to shard 0 at " + opts_.coordinator);
      if (s.ok() && rep.ready()) {
        Deliver(f.epoch, [&] {
          if (f.kind == static_cast<int>(ShardHub::Kind::kNorms)) {
            pipeline->SetGlobalNorm2(f.step, rep.total_norm2());
          } else {
            pipeline->SetGlobalVerdict(f.step, rep.skip_reason());
          }
        });
        break;
      }
      if (s.code() == StatusCode::kAborted) break;  // its epoch is over (or shard 0 stops)
      if (!s.ok()) {
        if (++failures == 1 || failures % 20 == 0) L2L_LOG_WARN("{} (retrying)", s.ToString());
        if (s.code() == StatusCode::kInvalidArgument) {
          L2L_LOG_ERROR("shard 0 refused this shard's step facts: {}", s.ToString());
        }
      }
      UniqueLock wait_lock(mu_);
      if (stopped_) return;
      if (!s.ok()) {
        cv_.wait_for(wait_lock.native(), std::chrono::milliseconds(200), [&]() REQUIRES(mu_) { return stopped_; });
      }
      if (stopped_) return;
    }
    lock.lock();
  }
}

void ShardLink::WatchLoop() {
  auto unreachable_since = std::chrono::steady_clock::time_point::max();
  int failures = 0;
  auto lost = [&](const Status& why) {
    L2L_LOG_ERROR("this shard stops: {}", why.ToString());
    if (opts_.on_coordinator_lost) opts_.on_coordinator_lost(why);
  };
  for (;;) {
    std::vector<std::string> requests;
    uint64_t coordinator = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      requests.swap(rollback_requests_);
      coordinator = coordinator_;
    }
    // A worker lost mid-step here: shard 0 begins a new epoch (unless one began since).
    for (const std::string& why : requests) {
      shard::StepFactsRequest req;
      req.set_shard(opts_.id.index);
      req.set_instance(instance_);
      req.set_epoch(epoch());
      req.set_kind(shard::FACT_ROLLBACK);
      req.set_skip_reason(why);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      shard::StepFactsReply rep;
      const Status s = FromGrpcStatus(impl_->stub->StepFacts(&ctx, req, &rep), "asking shard 0 for a rollback");
      if (!s.ok()) {
        L2L_LOG_WARN("{} (retrying)", s.ToString());
        std::lock_guard<std::mutex> lock(mu_);
        rollback_requests_.push_back(why);
      }
    }
    shard::WatchRequest req;
    req.set_shard(opts_.id.index);
    req.set_instance(instance_);
    req.set_epoch(epoch());
    req.set_wait_ms(1000);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    shard::WatchReply rep;
    const Status s = FromGrpcStatus(impl_->stub->Watch(&ctx, req, &rep), "watching shard 0 at " + opts_.coordinator);
    if (s.ok()) {
      if (failures > 0) {
        L2L_LOG_INFO("shard 0 at {} answers again (after {} failed watches)", opts_.coordinator, failures);
      }
      failures = 0;
      unreachable_since = std::chrono::steady_clock::time_point::max();
      if (rep.coordinator() != coordinator) {
        if (!RejoinRestartedShard0()) return;
        continue;
      }
      if (rep.epoch() > epoch()) {
        L2L_LOG_WARN("shard 0 began recovery epoch {} ({}): rolling back to step {}", rep.epoch(), rep.reason(),
                     rep.rollback_step());
        FaultPoint("eps.epoch");  // tests: L2L_DELAY_AT makes this shard late to roll back
        if (on_rollback_) on_rollback_(Epoch{rep.epoch(), rep.rollback_step(), rep.reason()});
      }
      continue;
    }
    if (s.code() == StatusCode::kFailedPrecondition) {
      // Shard 0 does not know this process: it restarted.
      if (!RejoinRestartedShard0()) return;
      continue;
    }
    if (++failures == 1 || failures % 20 == 0) L2L_LOG_WARN("{} (retrying)", s.ToString());
    const auto now = std::chrono::steady_clock::now();
    if (unreachable_since == std::chrono::steady_clock::time_point::max()) unreachable_since = now;
    if (now - unreachable_since >= opts_.lost_after) {
      return lost(Unavailable(s.message() + " for " + std::to_string(opts_.lost_after.count()) +
                              " ms: the job's coordinator (shard 0) is gone; restart every shard with --resume "
                              "<checkpoint root>"));
    }
    UniqueLock lock(mu_);
    cv_.wait_for(lock.native(), std::chrono::milliseconds(500), [&]() REQUIRES(mu_) { return stopped_; });
  }
}

bool ShardLink::RejoinRestartedShard0() {
  L2L_LOG_WARN("shard 0 at {} restarted (another process answers): joining it again; this shard rolls back to the "
               "step it resumed from",
               opts_.coordinator);
  Result<ShardPeers::Epoch> e = JoinShard0(/*running=*/true, opts_.lost_after);
  if (!e.ok()) {
    L2L_LOG_ERROR("this shard stops: {}", e.status().ToString());
    if (opts_.on_coordinator_lost) {
      opts_.on_coordinator_lost(e.status().WithContext("joining the restarted shard 0: restart every shard with "
                                                       "--resume <checkpoint root>"));
    }
    return false;
  }
  L2L_LOG_WARN("joined the restarted shard 0: recovery epoch {}, rolling back to step {}", e->epoch, e->step);
  if (on_rollback_) on_rollback_(*e);
  return true;
}

void ShardLink::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }
  if (sender_.joinable()) sender_.join();
  if (watcher_.joinable()) watcher_.join();
}

}  // namespace l2l::eps
