// DeviceGroup: several GPUs of one host as one EPS worker. See device_group.h.
#include "worker/device_group.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "common/logging.h"

namespace l2l::worker {

// The acquisitions the ranks share and the gradient shards they hand in. A rank's k-th
// AcquireLayer meets the other ranks' k-th: the first to arrive acquires from the EPS,
// the others wait for it and get the same view (so every device gathers the same
// version), and the view is released to the EPS when the last rank releases it. A
// layer's gradient for a step is assembled from the n shards in one buffer (a claimed
// EPS gradient slot on the shm transport: each device DMAs its shard straight into it)
// and handed over once.
// Thread-safety: every method is thread-safe (one mutex); the EPS client's calls are
// made outside it.
class DeviceGroup::Shared final : public GradientShardSink {
 public:
  Shared(EpsClient* client, int n) : client_(client), n_(n), next_(static_cast<size_t>(n), 0), held_(n) {}

  Result<LayerWeights> Acquire(int rank, int64_t layer, int64_t min_version, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t k = next_[static_cast<size_t>(rank)]++;
    auto [it, inserted] = entries_.try_emplace(k);
    Entry& e = it->second;
    if (inserted) {
      e.layer = layer;
      lk.unlock();
      Result<LayerWeights> r = client_->AcquireLayer(layer, min_version, timeout);
      lk.lock();
      e.pending = false;
      if (r.ok()) {
        e.weights = *r;
        e.acquired = true;
        ++acquires_;
      } else {
        e.status = r.status();
      }
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return !e.pending; });
    }
    ++e.seen;
    if (e.layer != layer) {
      return Internal("device group: rank " + std::to_string(rank) + " fetches layer " + std::to_string(layer) +
                      " as its fetch #" + std::to_string(k) + " but another rank fetched layer " +
                      std::to_string(e.layer) + " (the devices' schedules differ)");
    }
    if (!e.acquired) {
      acquire_failed_ = true;
      Status st = e.status;
      if (e.seen == n_) entries_.erase(it);
      return st;
    }
    held_[static_cast<size_t>(rank)][layer] = k;
    return e.weights;
  }

  void Release(int rank, int64_t layer) {
    bool last = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto& held = held_[static_cast<size_t>(rank)];
      auto h = held.find(layer);
      if (h == held.end()) {
        L2L_LOG_WARN("device group: rank {} releases layer {} it does not hold", rank, layer);
        return;
      }
      auto it = entries_.find(h->second);
      held.erase(h);
      if (it != entries_.end() && ++it->second.released == n_) {
        last = true;
        entries_.erase(it);
      }
    }
    if (last) client_->ReleaseLayer(layer);
  }

  Result<float*> ShardBuffer(int64_t layer, int64_t step, size_t numel) override {
    std::unique_lock<std::mutex> lk(mu_);
    Pending& p = pending_[{step, layer}];
    if (!p.claiming && p.buffer == nullptr) {
      // The first rank here gets the buffer: an EPS gradient slot, or host memory (also
      // once the step failed: the shards are then dropped).
      p.claiming = true;
      p.numel = numel;
      const bool claim = client_->HasGradientSlots() && failed_.ok();
      lk.unlock();
      Result<GradientSlot> slot = claim ? client_->ClaimGradientSlot(layer, numel) : Result<GradientSlot>(GradientSlot{});
      lk.lock();
      Pending& q = pending_[{step, layer}];
      q.claiming = false;
      if (!slot.ok()) {
        Fail(slot.status());
        q.host.resize(numel);
        q.buffer = q.host.data();
      } else if (slot->data != nullptr) {
        q.slot = *slot;
        q.buffer = static_cast<float*>(slot->data);
      } else {
        q.host.resize(numel);
        q.buffer = q.host.data();
      }
      cv_.notify_all();
    }
    cv_.wait(lk, [&] { return !pending_[{step, layer}].claiming; });
    Pending& q = pending_[{step, layer}];
    if (q.numel != numel) {
      return Internal("device group: layer " + std::to_string(layer) + "'s shards disagree on its size (" +
                      std::to_string(numel) + " vs " + std::to_string(q.numel) + ")");
    }
    return q.buffer;
  }

  Status ShardDone(int64_t layer, int64_t step, int64_t micro_batches, bool ok) override {
    Pending p;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = pending_.find({step, layer});
      if (it == pending_.end()) return Internal("device group: ShardDone without ShardBuffer");
      Pending& q = it->second;
      q.micro_batches += micro_batches;
      q.failed = q.failed || !ok;
      if (++q.shards < n_) return Status::Ok();
      p = std::move(q);
      pending_.erase(it);
      // A missing shard (a device failed: its relay reports that) or a failed step: drop.
      if (p.failed || !failed_.ok()) {
        if (p.slot.data != nullptr) client_->AbandonGradientSlot(p.slot);
        return Status::Ok();
      }
      ++pushes_;
    }
    Status st = p.slot.data != nullptr ? client_->PublishGradientSlot(p.slot, layer, step, p.micro_batches, p.numel)
                                       : client_->PushGradient(layer, step, p.micro_batches, p.buffer, p.numel);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lk(mu_);
      Fail(st.WithContext("pushing the gradient of layer " + std::to_string(layer) + " for step " +
                          std::to_string(step)));
    }
    return Status::Ok();
  }

  // The first EPS error of a push this step (ok: none). The devices do not see it (each
  // finishes the step, so none waits in a collective for a peer that gave up); RunStep
  // returns it.
  Status failure() const {
    std::lock_guard<std::mutex> lk(mu_);
    return failed_;
  }

  // After a failed step (every rank's thread has returned): releases what the EPS still
  // lends, forgets partial gradients, restarts the fetch counters.
  void Reset() {
    std::vector<int64_t> release;
    std::vector<GradientSlot> abandon;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& [k, e] : entries_)
        if (e.acquired) release.push_back(e.layer);
      entries_.clear();
      for (auto& h : held_) h.clear();
      std::fill(next_.begin(), next_.end(), 0);
      for (auto& [key, p] : pending_)
        if (p.slot.data != nullptr) abandon.push_back(p.slot);
      pending_.clear();
      failed_ = Status::Ok();
      acquire_failed_ = false;
    }
    for (int64_t layer : release) client_->ReleaseLayer(layer);
    for (const GradientSlot& slot : abandon) client_->AbandonGradientSlot(slot);
  }

  // Whether an acquisition failed this step (every device then stops at the same fetch).
  bool acquire_failed() const {
    std::lock_guard<std::mutex> lk(mu_);
    return acquire_failed_;
  }

  int64_t acquires() const {
    std::lock_guard<std::mutex> lk(mu_);
    return acquires_;
  }
  int64_t pushes() const {
    std::lock_guard<std::mutex> lk(mu_);
    return pushes_;
  }

 private:
  void Fail(const Status& st) {  // REQUIRES: mu_ held
    if (failed_.ok()) failed_ = st;
  }
  struct Entry {
    int64_t layer = -1;
    bool pending = true, acquired = false;
    LayerWeights weights;
    Status status;
    int seen = 0, released = 0;
  };
  struct Pending {                 // one (step, layer) gradient being assembled
    bool claiming = false;         // the first rank is claiming the buffer
    float* buffer = nullptr;       // slot.data or host.data(): numel floats
    GradientSlot slot;             // the EPS's slot (data null: none)
    std::vector<float> host;       // the buffer when the transport has no slots
    size_t numel = 0;
    int shards = 0;                // ranks done
    bool failed = false;           // a rank's shard is missing
    int64_t micro_batches = 0;     // summed over the ranks
  };
  EpsClient* const client_;
  const int n_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> entries_;                          // GUARDED_BY(mu_) by fetch index
  std::vector<uint64_t> next_;                                 // GUARDED_BY(mu_) per rank
  std::vector<std::map<int64_t, uint64_t>> held_;              // GUARDED_BY(mu_) per rank: layer -> index
  std::map<std::pair<int64_t, int64_t>, Pending> pending_;     // GUARDED_BY(mu_) (step, layer)
  int64_t acquires_ = 0, pushes_ = 0;                          // GUARDED_BY(mu_)
  Status failed_;                                              // GUARDED_BY(mu_) see failure()
  bool acquire_failed_ = false;                                // GUARDED_BY(mu_)
};

namespace {

// The EpsClient one rank's relay sees: acquisitions shared through the group; gradients
// leave only as shards (the pusher's GradientShardSink), never through PushGradient.
class RankClient final : public EpsClient {
 public:
  RankClient(DeviceGroup::Shared* shared, EpsClient* client, int rank)
      : shared_(shared), client_(client), rank_(rank) {}
  const WorkerRegistration& registration() const override { return client_->registration(); }
  Result<LayerWeights> AcquireLayer(int64_t layer, int64_t min_version, std::chrono::milliseconds timeout) override {
    return shared_->Acquire(rank_, layer, min_version, timeout);
  }
  void ReleaseLayer(int64_t layer) override { shared_->Release(rank_, layer); }
  Status PushGradient(int64_t layer, int64_t, int64_t, const float*, size_t) override {
    return FailedPrecondition("device group rank " + std::to_string(rank_) + ": layer " + std::to_string(layer) +
                              "'s gradient must leave as a reduce-scattered shard, not a whole push");
  }
  Status StepDone(const StepReport&) override {
    return FailedPrecondition("device group: the group reports its steps, not a rank");
  }
  // Each rank reports its own routing (the EPS ORs reports; every rank reports before the
  // group's reduce-scattered pushes, which need every rank's backward).
  Status ReportExperts(int64_t step, const std::vector<uint8_t>& touched) override {
    return client_->ReportExperts(step, touched);
  }
  bool rejoin_requested() const override { return client_->rejoin_requested(); }

 private:
  DeviceGroup::Shared* shared_;
  EpsClient* client_;
  const int rank_;
};

}  // namespace

Result<std::unique_ptr<DeviceGroup>> DeviceGroup::Create(EpsClient* client, std::vector<kernels::Backend*> backends,
                                                         const JobConfig& job, const RelayOptions& options) {
  const int n = static_cast<int>(backends.size());
  if (n < 2) return InvalidArgument("a device group needs at least 2 devices (one device: --device cuda:N)");
  const int64_t M = job.train.micro_batches;
  if (M < n) {
    return InvalidArgument("a group of " + std::to_string(n) + " devices needs train.micro_batches >= " +
                           std::to_string(n) + " (each device runs at least one), got " + std::to_string(M));
  }
  std::unique_ptr<DeviceGroup> g(new DeviceGroup());
  g->client_ = client;
  g->backends_ = backends;
  int64_t start = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t m = M / n + (r < M % n ? 1 : 0);
    g->counts_.push_back(m);
    g->starts_.push_back(start);
    start += m;
  }
  L2L_ASSIGN_OR_RETURN(g->gather_, kernels::CreateDeviceCollectives(backends));
  L2L_ASSIGN_OR_RETURN(g->scatter_, kernels::CreateDeviceCollectives(backends));
  // The EPS's shared segments, page-locked once (portable: every device DMAs from them).
  g->pinner_ = std::make_unique<HostRegionPinner>(backends[0]);
  client->SetHostRegionObserver(g->pinner_.get());
  g->shared_ = std::make_unique<Shared>(client, n);
  for (int r = 0; r < n; ++r) {
    g->rank_clients_.push_back(std::make_unique<RankClient>(g->shared_.get(), client, r));
    JobConfig jr = job;
    jr.train.micro_batches = g->counts_[static_cast<size_t>(r)];
    RelayOptions o = options;
    o.fetch_group = GroupRank{r, n, g->gather_[static_cast<size_t>(r)].get(), nullptr};
    o.push_group = GroupRank{r, n, g->scatter_[static_cast<size_t>(r)].get(), g->shared_.get()};
    o.shared_pinner = g->pinner_.get();
    Result<std::unique_ptr<Relay>> relay = Relay::Create(g->rank_clients_.back().get(), backends[static_cast<size_t>(r)], jr, o);
    if (!relay.ok()) return relay.status().WithContext("device group: " + backends[static_cast<size_t>(r)]->name());
    g->relays_.push_back(std::move(relay).value());
  }
  L2L_LOG_INFO("device group of {} devices: each fetches 1/{} of every layer, all-gathers the rest, runs {} of the "
               "{} micro-batches (device 0), reduce-scatters the gradient and pushes 1/{}",
               n, n, g->counts_[0], M, n);
  return g;
}

DeviceGroup::~DeviceGroup() {
  relays_.clear();  // their threads stop first
  if (client_ != nullptr && pinner_) client_->SetHostRegionObserver(nullptr);
}

Result<StepReport> DeviceGroup::RunStep(int64_t step, const std::vector<MicroBatch>& mbs,
                                        const std::vector<MicroBatch>& eval) {
  if (!aborted_.ok()) return aborted_;
  const size_t n = relays_.size();
  const int64_t M = starts_.back() + counts_.back();
  if (static_cast<int64_t>(mbs.size()) != M) {
    return InvalidArgument("device group step " + std::to_string(step) + ": got " + std::to_string(mbs.size()) +
                           " micro-batches, train.micro_batches=" + std::to_string(M));
  }
  // Bad input is refused before any device starts (a device refusing its share alone
  // would leave the others waiting in a collective).
  L2L_RETURN_IF_ERROR(relays_[0]->ValidateBatch(mbs, M, "micro-batch"));
  L2L_RETURN_IF_ERROR(relays_[0]->ValidateBatch(eval, -1, "eval micro-batch"));
  std::vector<Result<StepReport>> results(n, Result<StepReport>(Internal("not run")));
  std::vector<std::thread> threads;
  static const std::vector<MicroBatch> kNone;
  std::atomic<bool> abort_sent{false};
  for (size_t r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::vector<MicroBatch> mine(mbs.begin() + starts_[r], mbs.begin() + starts_[r] + counts_[r]);
      results[r] = relays_[r]->RunStep(step, mine, r == 0 ? eval : kNone);
      // A device that failed on its own (not at an acquisition every device shares)
      // leaves its peers waiting in their next collective: abort the communicators so
      // those fail too. The group is then unusable (the worker exits).
      if (!results[r].ok() && !shared_->acquire_failed() && !abort_sent.exchange(true)) {
        L2L_LOG_ERROR("device group: {} failed mid-step ({}); aborting the group's communicators",
                      backends_[r]->name(), results[r].status().message());
        for (auto& c : gather_) c->Abort();
        for (auto& c : scatter_) c->Abort();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (abort_sent.load()) {
    for (size_t r = 0; r < n; ++r) {
      if (!results[r].ok()) {
        aborted_ = FailedPrecondition("device group aborted at step " + std::to_string(step) + " after " +
                                      backends_[r]->name() + " failed: " + results[r].status().message() +
                                      " (restart the worker)");
        return results[r].status().WithContext("device group, " + backends_[r]->name() +
                                               " (the group was aborted)");
      }
    }
  }
  // An EPS error of a push first (the devices finished the step around it): it is the
  // one a rejoin answers.
  if (Status st = shared_->failure(); !st.ok()) {
    shared_->Reset();
    return st.WithContext("device group step " + std::to_string(step));
  }
  for (size_t r = 0; r < n; ++r) {
    if (!results[r].ok()) {
      shared_->Reset();
      return results[r].status().WithContext("device group, " + backends_[r]->name());
    }
  }
  StepReport out = *results[0];
  double weighted = 0;
  out.tokens = 0;
  for (size_t r = 0; r < n; ++r) {
    weighted += results[r]->loss * static_cast<double>(counts_[r]);
    out.tokens += results[r]->tokens;
  }
  out.loss = weighted / static_cast<double>(M);
  return out;
}

size_t DeviceGroup::device_bytes() const {
  size_t b = 0;
  for (const auto& r : relays_) b += r->device_bytes();
  return b;
}

size_t DeviceGroup::stash_host_bytes() const {
  size_t b = 0;
  for (const auto& r : relays_) b += r->stash_host_bytes();
  return b;
}

Result<std::unique_ptr<StepRunner>> CreateStepRunner(EpsClient* client, std::vector<kernels::Backend*> backends,
                                                     const JobConfig& job, const RelayOptions& options) {
  L2L_CHECK(!backends.empty()) << "CreateStepRunner needs a backend";
  if (backends.size() == 1) {
    L2L_ASSIGN_OR_RETURN(std::unique_ptr<Relay> relay, Relay::Create(client, backends[0], job, options));
    return std::unique_ptr<StepRunner>(std::move(relay));
  }
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<DeviceGroup> group, DeviceGroup::Create(client, std::move(backends), job, options));
  return std::unique_ptr<StepRunner>(std::move(group));
}

int64_t DeviceGroup::eps_acquires() const { return shared_->acquires(); }
int64_t DeviceGroup::eps_pushes() const { return shared_->pushes(); }

}  // namespace l2l::worker
