// Tests of sharded state in one process (eps_server/shards.h, the pipeline's
// StepCoordinator, checkpoint parts): the same gradients through one full store and
// pipeline, and through two shard stores whose pipelines decide the global clip and each
// step's verdict through a ShardHub, give the same master, m and v bit for bit (global
// clip active; a NaN in one shard's layer skips the step on both); shard parts assemble
// into an ordinary checkpoint that loads into one full store, and a missing part leaves
// `latest` alone. The gRPC side (ShardLink, l2l-eps --shard) is
// tests/integration/shards_test.py's.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "eps_server/checkpoint.h"
#include "eps_server/param_store.h"
#include "eps_server/shards.h"
#include "eps_server/update_pipeline.h"
#include "tests/common/temp_dir.h"
#include "tests/eps/grads_util.h"
#include "tests/testing/jobs.h"

namespace l2l::eps {
namespace {

JobConfig Job() {
  JobConfig j = testing::GptJob({64, 16, 32, 3, 4, 128},
                                {.clip = ClipMode::kGlobal, .lr = 1e-2f, .warmup_steps = 2, .total_steps = 10,
                                 .grad_clip = 0.05f /* small enough that clipping is active */});
  j.publish_dtype = DType::kF32;
  return j;
}

std::unique_ptr<ParamStore> Store(const JobConfig& job, LayerRange range) {
  ParamStoreOptions o;
  o.page_bytes = 4096;
  o.publish_dtype = DType::kF32;
  o.layers = range;
  auto s = ParamStore::Create(job.model, o);
  REQUIRE(s.ok());
  REQUIRE((*s)->InitFromSeed(11).ok());
  for (int64_t l = 0; l < (*s)->num_layers(); ++l) REQUIRE((*s)->PublishMaster(l, 0).ok());
  return std::move(s).value();
}

// Shard 1's side without gRPC: what ShardLink does, on a thread of its own, straight to
// the hub (its long polls are ShardHub::Facts calls).
class LocalLink : public StepCoordinator {
 public:
  LocalLink(ShardHub* hub, UpdatePipeline** pipe) : hub_(hub), pipe_(pipe) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~LocalLink() override { Stop(); }
  // Ends the thread (waits for a delivery in progress): call it before the pipeline it
  // delivers to is destroyed.
  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void PostNorms(int64_t step, std::vector<double> norm2) override { Push({step, 0, std::move(norm2), ""}); }
  void PostVerdict(int64_t step, const std::string& r) override { Push({step, 1, {}, r}); }
  int errors() const { return errors_.load(); }

 private:
  struct Fact {
    int64_t step;
    int kind;
    std::vector<double> norm2;
    std::string reason;
  };
  void Push(Fact f) {
    std::lock_guard<std::mutex> l(mu_);
    q_.push_back(std::move(f));
    cv_.notify_all();
  }
  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !q_.empty(); });
      if (stop_) return;
      Fact f = q_.front();
      q_.pop_front();
      l.unlock();
      for (;;) {
        const auto kind = f.kind == 0 ? ShardHub::Kind::kNorms : ShardHub::Kind::kVerdict;
        auto d = hub_->Facts(1, /*epoch=*/0, f.step, kind, f.norm2, f.reason, std::chrono::milliseconds(50));
        if (!d.ok()) {  // Catch2 is not thread-safe: the test thread checks errors()
          errors_.fetch_add(1);
          return;
        }
        if (d->ready) {
          if (f.kind == 0) {
            (*pipe_)->SetGlobalNorm2(f.step, d->total_norm2);
          } else {
            (*pipe_)->SetGlobalVerdict(f.step, d->skip_reason);
          }
          break;
        }
        std::lock_guard<std::mutex> s(mu_);
        if (stop_) return;
      }
      l.lock();
    }
  }
  ShardHub* hub_;
  UpdatePipeline** pipe_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Fact> q_;
  bool stop_ = false;
  std::atomic<int> errors_{0};
  std::thread thread_;
};

// master, m, v of every model layer after `steps` steps of `g`; nan_layer >= 0 puts a NaN
// into worker 0's gradient of that model layer at step 1.
using State = std::vector<std::vector<float>>;  // [model layer * 3 + which]

State ReadStates(const std::vector<ParamStore*>& stores) {
  State out;
  for (ParamStore* s : stores) {
    for (int64_t l = 0; l < s->num_layers(); ++l) {
      for (int which = 0; which < 3; ++which) {
        std::vector<float> v(s->layout(l).numel);
        REQUIRE(s->ReadState(l, which, v.data()).ok());
        out.push_back(std::move(v));
      }
    }
  }
  return out;
}

void Push(UpdatePipeline* p, int64_t local, int64_t step, int w, const std::vector<float>& g, bool nan) {
  GradientRef r;
  r.worker_id = w;
  auto copy = std::make_shared<std::vector<float>>(g);
  if (nan) (*copy)[3] = std::numeric_limits<float>::quiet_NaN();
  r.data = copy->data();
  r.numel = copy->size();
  r.micro_batches = 2;
  r.release = [copy] {};
  REQUIRE(p->Submit(local, step, std::move(r)).ok());
}

State RunSingle(const JobConfig& job, const Grads& g, int64_t nan_layer) {
  auto store = Store(job, {0, -1});
  {
    UpdatePipeline pipe(store.get(), job, 2, 0);
    for (size_t step = 0; step < g.size(); ++step) {
      for (int64_t l = store->num_layers() - 1; l >= 0; --l) {
        for (int w = 0; w < 2; ++w) Push(&pipe, l, static_cast<int64_t>(step), w, g[step][w][l], step == 1 && w == 0 && l == nan_layer);
      }
      REQUIRE(pipe.WaitForStep(static_cast<int64_t>(step) + 1, std::chrono::seconds(30)));
    }
    CHECK(pipe.stats().skipped_steps == (nan_layer >= 0 ? 1 : 0));
  }
  return ReadStates({store.get()});
}

State RunSharded(const JobConfig& job, const Grads& g, int64_t nan_layer, const std::vector<LayerRange>& plan,
                 const std::string& ckpt_root = "") {
  auto s0 = Store(job, plan[0]);
  auto s1 = Store(job, plan[1]);
  ShardHub hub(ShardId{0, 2});
  UpdatePipeline* p1_ptr = nullptr;
  LocalLink link(&hub, &p1_ptr);
  {
    UpdatePipeline p0(s0.get(), job, 2, 0);
    UpdatePipeline p1(s1.get(), job, 2, 0);
    p1_ptr = &p1;
    p0.set_coordinator(&hub);
    p1.set_coordinator(&link);
    REQUIRE(hub.Start(job, plan, 0, &p0).ok());
    ShardHub::JoinInfo j{1, 2, plan[1], "127.0.0.1:1", JobHash(job), 0, 7};
    REQUIRE(hub.Join(j).ok());
    const int64_t L = plan[1].end();
    for (size_t step = 0; step < g.size(); ++step) {
      for (int64_t l = L - 1; l >= 0; --l) {
        const bool first = l < plan[1].first;
        UpdatePipeline* p = first ? &p0 : &p1;
        const int64_t local = first ? l : l - plan[1].first;
        for (int w = 0; w < 2; ++w) Push(p, local, static_cast<int64_t>(step), w, g[step][w][l], step == 1 && w == 0 && l == nan_layer);
      }
      REQUIRE(p0.WaitForStep(static_cast<int64_t>(step) + 1, std::chrono::seconds(30)));
      REQUIRE(p1.WaitForStep(static_cast<int64_t>(step) + 1, std::chrono::seconds(30)));
    }
    CHECK(p0.stats().skipped_steps == (nan_layer >= 0 ? 1 : 0));
    CHECK(p1.stats().skipped_steps == (nan_layer >= 0 ? 1 : 0));
    hub.Stop();  // no answer reaches the pipelines after this
    link.Stop();  // nor one already on its way (p1 is destroyed next)
  }
  CHECK(link.errors() == 0);
  if (!ckpt_root.empty()) {
    // Each shard's part, then shard 0 assembles them (as EpsCore does at a boundary).
    auto a = WriteCheckpointPart(*s0, 0, static_cast<int64_t>(g.size()), ckpt_root);
    auto b = WriteCheckpointPart(*s1, 1, static_cast<int64_t>(g.size()), ckpt_root);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CheckpointMeta meta;
    meta.step = static_cast<int64_t>(g.size());
    meta.job = job;
    meta.expected_workers = 2;
    // A part missing: nothing is installed, `latest` is untouched.
    auto missing = AssembleCheckpoint(meta, {*a}, ckpt_root, true);
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.status().message().find("no shard's part holds layer " + std::to_string(plan[1].first)) !=
          std::string::npos);
    CHECK_FALSE(std::filesystem::exists(ckpt_root + "/latest"));
    CHECK_FALSE(std::filesystem::exists(ckpt_root + "/" + CheckpointDirName(meta.step)));
    // Listed twice: refused too.
    CHECK_FALSE(AssembleCheckpoint(meta, {*a, *a, *b}, ckpt_root, true).ok());
    REQUIRE(AssembleCheckpoint(meta, {*a, *b}, ckpt_root, true).ok());
    CHECK_FALSE(std::filesystem::exists(ckpt_root + "/" + a->dir));  // the parts are gone
    CHECK_FALSE(std::filesystem::exists(ckpt_root + "/" + b->dir));
  }
  return ReadStates({s0.get(), s1.get()});
}

TEST_CASE("Two shards coordinated by a ShardHub equal one pipeline bit for bit (global clip, NaN guard)",
          "[shards]") {
  const JobConfig job = Job();
  auto full = Store(job, {0, -1});
  const Grads g = MakeGrads(*full, 4, 2, 5);
  const int64_t L = full->num_layers();  // 5: embedding, 3 blocks, head
  for (const std::vector<LayerRange>& plan :
       {std::vector<LayerRange>{{0, 2}, {2, L - 2}}, std::vector<LayerRange>{{0, L - 1}, {L - 1, 1}}}) {
    for (int64_t nan_layer : {int64_t{-1}, plan[1].first, int64_t{0}}) {
      INFO("shard 1 from layer " << plan[1].first << ", NaN in layer " << nan_layer);
      const State want = RunSingle(job, g, nan_layer);
      const State got = RunSharded(job, g, nan_layer, plan);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        INFO("model layer " << i / 3 << " array " << i % 3);
        CHECK(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)) == 0);
      }
    }
  }
  // The clip was active (else the coordination of the norm would go untested): a run
  // whose norm the hub summed wrongly would differ; here, the clip coefficient of step 0.
  double total = 0;
  for (int64_t l = 0; l < L; ++l) {
    std::vector<float> s = g[0][0][l];
    for (size_t i = 0; i < s.size(); ++i) s[i] = (s[i] + g[0][1][l][i]) * 0.25f;
    for (float x : s) total += static_cast<double>(x) * x;
  }
  CHECK(ClipCoefficient(std::sqrt(total), job.optim.grad_clip) < 0.5f);
}

TEST_CASE("Shard checkpoint parts assemble into an ordinary checkpoint that one daemon loads", "[shards]") {
  const JobConfig job = Job();
  auto full = Store(job, {0, -1});
  const Grads g = MakeGrads(*full, 2, 2, 9);
  const int64_t L = full->num_layers();
  testing::TempDir dir("l2l_shards");
  const std::string root = dir.path() + "/ckpt";
  const State sharded = RunSharded(job, g, -1, {{0, 3}, {3, L - 3}}, root);
  auto resolved = ResolveCheckpointDir(root);
  REQUIRE(resolved.ok());
  auto m = ReadCheckpointManifest(*resolved);
  REQUIRE(m.ok());
  CHECK(m->meta.step == 2);
  ParamStoreOptions o;
  o.page_bytes = 4096;
  o.publish_dtype = DType::kF32;
  auto one = ParamStore::Create(job.model, o);
  REQUIRE(one.ok());
  REQUIRE(LoadCheckpointState(*m, one->get()).ok());
  const State loaded = ReadStates({one->get()});
  REQUIRE(loaded.size() == sharded.size());
  for (size_t i = 0; i < loaded.size(); ++i) CHECK(loaded[i] == sharded[i]);
  // A shard resumes its own layers from it (model-layer files, local indices).
  o.layers = {3, L - 3};
  auto shard1 = ParamStore::Create(job.model, o);
  REQUIRE(shard1.ok());
  REQUIRE(LoadCheckpointState(*m, shard1->get()).ok());
  const State part = ReadStates({shard1->get()});
  for (size_t i = 0; i < part.size(); ++i) CHECK(part[i] == sharded[9 + i]);
}

TEST_CASE("ShardHub refuses a shard with another plan, job, start step or shard count", "[shards]") {
  const JobConfig job = Job();
  ShardHub hub(ShardId{0, 2});
  const std::vector<LayerRange> plan = {{0, 2}, {2, 3}};
  ShardHub::JoinInfo j{1, 2, plan[1], "127.0.0.1:5", JobHash(job), 0, 1};
  CHECK(hub.Join(j).status().code() == StatusCode::kUnavailable);  // no job yet: the shard retries
  REQUIRE(hub.Start(job, plan, 0, nullptr).ok());
  auto not_yet = hub.Endpoints();
  REQUIRE_FALSE(not_yet.ok());
  CHECK(not_yet.status().message().find("1 of 2)") != std::string::npos);
  auto refused = [&](ShardHub::JoinInfo bad, const std::string& says) {
    Status s = hub.Join(bad).status();
    INFO(s.ToString());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find(says) != std::string::npos);
  };
  ShardHub::JoinInfo bad = j;
  bad.shards = 3;
  refused(bad, "one of 3 shards, shard 0 as one of 2");
  bad = j;
  bad.layers = {3, 2};
  refused(bad, "layers 2..2 are owned by no shard");
  bad = j;
  bad.layers = {1, 4};
  refused(bad, "overlapping shard 0");
  bad = j;
  bad.job_hash = "0000000000000000";
  refused(bad, "runs another job");
  bad = j;
  bad.start_step = 4;
  refused(bad, "starts at step 4, shard 0 at step 0");
  REQUIRE(hub.Join(j).ok());
  hub.set_self_address("127.0.0.1:4");
  auto ep = hub.Endpoints();
  REQUIRE(ep.ok());
  REQUIRE(ep->size() == 2);
  CHECK((*ep)[1].address == "127.0.0.1:5");
  CHECK((*ep)[0].address == "127.0.0.1:4");
  hub.Stop();
}

}  // namespace
TEST_CASE("Recovery epochs: a restarted shard or a lost worker rolls every shard back, and the old epoch's facts "
          "and checkpoint parts are refused", "[shards]") {
  const JobConfig job = Job();
  ShardHub hub(ShardId{0, 2});
  const std::vector<LayerRange> plan = {{0, 2}, {2, 3}};
  // What l2l-eps's core does on a new epoch (from the hub's thread): roll back, then
  // enter the epoch. Recorded for the test thread (no Catch2 calls off it).
  std::mutex mu;
  std::condition_variable cv;
  std::vector<ShardPeers::Epoch> seen;
  hub.set_on_rollback([&](const ShardPeers::Epoch& e) {
    hub.BeginRollback();
    hub.EndRollback(e.epoch);
    std::lock_guard<std::mutex> l(mu);
    seen.push_back(e);
    cv.notify_all();
  });
  auto wait_epoch = [&](size_t n) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(10), [&] { return seen.size() >= n; });
  };
  REQUIRE(hub.Start(job, plan, 0, nullptr).ok());
  ShardHub::JoinInfo j{1, 2, plan[1], "127.0.0.1:5", JobHash(job), 0, 7};
  auto first = hub.Join(j);
  REQUIRE(first.ok());
  CHECK(first->epoch == 0);
  hub.SetRestorePoint(4);  // shard 0 assembled step 4's checkpoint

  // The same shard restarted (another instance) must resume at the restore point.
  ShardHub::JoinInfo again = j;
  again.instance = 8;
  again.start_step = 2;
  auto early = hub.Join(again);
  REQUIRE_FALSE(early.ok());
  CHECK(early.status().message().find("last complete checkpoint is step 4") != std::string::npos);
  again.start_step = 4;
  auto rejoined = hub.Join(again);
  REQUIRE(rejoined.ok());
  CHECK(rejoined->epoch == 1);
  CHECK(rejoined->step == 4);
  REQUIRE(wait_epoch(1));
  CHECK(seen[0].epoch == 1);
  CHECK(seen[0].step == 4);
  CHECK(seen[0].reason.find("shard 1 restarted") != std::string::npos);
  CHECK(hub.epoch() == 1);  // shard 0 rolled back (the callback entered the epoch)

  // The old epoch's facts and parts are refused; the old process cannot watch.
  auto stale = hub.Facts(1, 0, 5, ShardHub::Kind::kVerdict, {}, "", std::chrono::milliseconds(10));
  CHECK(stale.status().code() == StatusCode::kAborted);
  CheckpointPart part;
  part.shard = 1;
  part.step = 6;
  CHECK(hub.SubmitPart(part, 0, std::chrono::milliseconds(0)).code() == StatusCode::kAborted);
  CHECK(hub.Watch(1, 7, 0, std::chrono::milliseconds(10)).status().code() == StatusCode::kFailedPrecondition);
  // A watch behind the epoch returns at once with it; one in it waits out its time.
  const auto t0 = std::chrono::steady_clock::now();
  auto w = hub.Watch(1, 8, 0, std::chrono::seconds(5));
  REQUIRE(w.ok());
  CHECK(w->epoch == 1);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4));
  auto w2 = hub.Watch(1, 8, 1, std::chrono::milliseconds(50));
  REQUIRE(w2.ok());
  CHECK(w2->epoch == 1);

  // A part of epoch 1 is recorded; a rollback request of an older epoch is a no-op; one
  // of the current epoch begins the next, which aborts a wait for parts and a fact's wait.
  REQUIRE(hub.SubmitPart(part, 1, std::chrono::milliseconds(0)).ok());
  CHECK(hub.ShardRollback(1, 8, 0, "worker 0 lost (already handled)").ok());
  // Only a shard that joined, as the process that joined, may ask.
  CHECK(hub.ShardRollback(1, 7, 1, "from the old process").code() == StatusCode::kFailedPrecondition);
  CHECK(hub.ShardRollback(5, 8, 1, "no such shard").code() == StatusCode::kFailedPrecondition);
  CHECK(hub.ShardRollback(0, 8, 1, "shard 0 is the hub").code() == StatusCode::kFailedPrecondition);
  CHECK(hub.epoch() == 1);
  auto parts = std::async(std::launch::async, [&] { return hub.WaitParts(6, 1, std::chrono::seconds(20)); });
  auto fact = std::async(std::launch::async, [&] {
    return hub.Facts(1, 1, 6, ShardHub::Kind::kVerdict, {}, "", std::chrono::seconds(20));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(hub.ShardRollback(1, 8, 1, "worker 0 lost mid-step 6").ok());
  REQUIRE(parts.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  REQUIRE(fact.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(parts.get().status().code() == StatusCode::kAborted);
  CHECK(fact.get().status().code() == StatusCode::kAborted);
  REQUIRE(wait_epoch(2));
  CHECK(seen[1].epoch == 2);
  CHECK(seen[1].step == 4);
  CHECK(seen[1].reason.find("worker 0 lost mid-step 6") != std::string::npos);
  // Shard 0's own request (its applied epoch is current) begins epoch 3.
  hub.RequestRollback("worker 1 lost");
  REQUIRE(wait_epoch(3));
  CHECK(seen[2].epoch == 3);
  hub.Stop();
}

}  // namespace l2l::eps
