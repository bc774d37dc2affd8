// Tests of eps_server/spill_tier.h and the ParamStore's SSD tier: TierPlan
// placement (budget to the byte, moments before master, even spread, refusals with the
// numbers) against a brute-force reading of the rules; a store with 4096-byte pages
// whose budget puts all moments and part of master on SSD, checked against the source
// data or an in-RAM shadow copy that sees the same operations (round trips, update
// cycles that force eviction and write-behind, 4 threads at once, prefetch hits);
// injected read/write faults, a wrong-size and a truncated spill file.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "eps_server/param_store.h"
#include "eps_server/spill_tier.h"
#include "tests/common/temp_dir.h"

namespace l2l::eps {
namespace {

constexpr size_t kPage = 4096;  // 1024 floats

ModelSpec TierSpec() {
  ModelSpec s;
  s.vocab_size = 64;
  s.seq_len = 16;
  s.d_model = 32;
  s.n_layer = 4;
  s.n_head = 4;
  s.d_ff = 128;
  return s;
}

int64_t PagesOf(size_t numel) { return static_cast<int64_t>((numel * sizeof(float) + kPage - 1) / kPage); }

struct Geo {
  std::vector<int64_t> pages;
  int64_t total = 0;
  int64_t max_pages = 0;
};

Geo GeoOf(const std::vector<LayerLayout>& layouts) {
  Geo g;
  for (const auto& l : layouts) {
    g.pages.push_back(PagesOf(l.numel));
    g.total += g.pages.back();
    g.max_pages = std::max(g.max_pages, g.pages.back());
  }
  return g;
}

// The rules, brute force: k of a kind's pages spilled = page i (numbered across layers)
// when floor((i+1)k/T) > floor(ik/T); v first, then m, then master. Returns the most
// spilled pages of one layer.
int64_t BruteMaxLayerSlots(const Geo& g, int64_t spill) {
  int64_t k[3];
  k[2] = std::min(spill, g.total);
  k[1] = std::min(spill - k[2], g.total);
  k[0] = spill - k[2] - k[1];
  int64_t best = 0, i0 = 0;
  for (int64_t n : g.pages) {
    int64_t c = 0;
    for (int64_t i = i0; i < i0 + n; ++i) {
      for (int kind = 0; kind < 3; ++kind) {
        if ((i + 1) * k[kind] / g.total > i * k[kind] / g.total) ++c;
      }
    }
    best = std::max(best, c);
    i0 += n;
  }
  return best;
}

void CheckPlanShape(const TierPlan& plan, const Geo& g) {
  REQUIRE(plan.slot.size() == g.pages.size());
  std::set<int64_t> seen;
  std::array<int64_t, 3> per_kind{};
  int64_t mls = 0;
  for (size_t l = 0; l < g.pages.size(); ++l) {
    REQUIRE(static_cast<int64_t>(plan.slot[l].size()) == g.pages[l]);
    std::array<int64_t, 3> in_layer{};
    for (const auto& s : plan.slot[l]) {
      for (int kind = 0; kind < 3; ++kind) {
        if (s[kind] < 0) continue;
        CHECK(s[kind] < plan.slots);
        CHECK(seen.insert(s[kind]).second);
        ++per_kind[kind];
        ++in_layer[kind];
      }
    }
    mls = std::max(mls, in_layer[0] + in_layer[1] + in_layer[2]);
    CHECK(plan.layer_spilled(static_cast<int64_t>(l)) == (in_layer[0] + in_layer[1] + in_layer[2] > 0));
    // Even spread: each layer holds its fair share of each kind's spilled pages to
    // within one page: |count - k * pages_l / T| < 1.
    for (int kind = 0; kind < 3; ++kind) {
      INFO("layer " << l << " kind " << kind << " count " << in_layer[kind] << " of k=" << plan.spilled[kind]);
      CHECK(std::llabs(in_layer[kind] * g.total - plan.spilled[kind] * g.pages[l]) < g.total);
    }
  }
  CHECK(static_cast<int64_t>(seen.size()) == plan.slots);
  CHECK(per_kind == plan.spilled);
  CHECK(plan.max_layer_slots == mls);
  CHECK(plan.total == std::array<int64_t, 3>{g.total, g.total, g.total});
  CHECK(plan.ram_pages + plan.slots == 3 * g.total);
  // Moments first (all of v, then m), then master.
  if (plan.spilled[1] > 0) CHECK(plan.spilled[2] == g.total);
  if (plan.spilled[0] > 0) CHECK(plan.spilled[1] == g.total);
  CHECK(plan.pool_buffers >= plan.max_layer_slots);
}

}  // namespace

TEST_CASE("TierPlan spills nothing when the state fits or the budget is unlimited", "[eps][spill_tier]") {
  const auto layouts = BuildLayout(TierSpec());
  const Geo g = GeoOf(layouts);
  const size_t fixed = 12345;
  SpillOptions so;
  so.dir = "/nonexistent";
  for (size_t host : {size_t{0}, 3 * g.total * kPage + fixed, 3 * g.total * kPage + fixed + 99999}) {
    auto plan = TierPlan::Make(layouts, kPage, host, fixed, so);
    REQUIRE(plan.ok());
    CHECK_FALSE(plan->any());
    CHECK(plan->slots == 0);
    CHECK(plan->ram_pages == 3 * g.total);
    CHECK(plan->pool_buffers == 0);
    for (int64_t l = 0; l < static_cast<int64_t>(layouts.size()); ++l) CHECK_FALSE(plan->layer_spilled(l));
  }
}

TEST_CASE("TierPlan respects the budget to the byte, spills moments before master, spreads evenly",
          "[eps][spill_tier]") {
  const auto layouts = BuildLayout(TierSpec());
  const Geo g = GeoOf(layouts);
  const int prefetch = GENERATE(0, 1, 2);
  INFO("prefetch_layers " << prefetch);
  const int64_t fixed = 3 * 4096 + 777;  // not page aligned on purpose
  SpillOptions so;
  so.dir = "/nonexistent";
  so.prefetch_layers = prefetch;
  const int64_t lo = fixed + 3 * g.max_pages * static_cast<int64_t>(kPage);  // smallest that can work
  const int64_t hi = 3 * g.total * static_cast<int64_t>(kPage) + fixed;       // everything fits at hi
  int64_t plans = 0, shrunk = 0, some_master = 0;
  for (int64_t host = lo; host < hi; host += 1365) {  // steps that hit every offset within a page
    INFO("host_bytes " << host);
    auto plan = TierPlan::Make(layouts, kPage, static_cast<size_t>(host), static_cast<size_t>(fixed), so);
    REQUIRE(plan.ok());
    REQUIRE(plan->any());
    CheckPlanShape(*plan, g);
    // The budget, to the byte.
    CHECK((plan->ram_pages + plan->pool_buffers) * static_cast<int64_t>(kPage) + fixed <= host);
    if (plan->slots == 3 * g.total) {
      ++shrunk;  // everything on SSD and the default pool did not fit: the pool shrank
      CHECK(plan->pool_buffers <= (prefetch + 1) * plan->max_layer_slots);
    } else {
      CHECK(plan->pool_buffers == (prefetch + 1) * plan->max_layer_slots);
    }
    if (plan->spilled[0] > 0) ++some_master;
    // Not wasteful: the fewest spilled pages whose default pool fits (brute force over
    // every count, page by page).
    if (plan->slots < 3 * g.total) {
      int64_t best = -1;
      for (int64_t s = 1; s <= 3 * g.total && best < 0; ++s) {
        const int64_t pool = (prefetch + 1) * BruteMaxLayerSlots(g, s);
        if ((3 * g.total - s + pool) * static_cast<int64_t>(kPage) + fixed <= host) best = s;
      }
      CHECK(plan->slots == best);
    }
    ++plans;
  }
  CHECK(plans > 100);
  CHECK(some_master > 0);
  if (prefetch > 0) CHECK(shrunk > 0);
}

TEST_CASE("TierPlan refuses, with the numbers, a budget that cannot hold even one layer's pool",
          "[eps][spill_tier]") {
  const auto layouts = BuildLayout(TierSpec());
  const Geo g = GeoOf(layouts);
  const size_t fixed = 50000;
  SpillOptions so;
  so.dir = "/nonexistent";
  const size_t min_pool_bytes = 3 * g.max_pages * kPage;
  for (size_t host : {fixed + min_pool_bytes - 1, fixed / 2}) {
    auto plan = TierPlan::Make(layouts, kPage, host, fixed, so);
    REQUIRE_FALSE(plan.ok());
    CHECK(plan.status().code() == StatusCode::kResourceExhausted);
    const std::string& msg = plan.status().message();
    INFO(msg);
    CHECK(msg.find(std::to_string(host)) != std::string::npos);
    CHECK(msg.find(std::to_string(fixed)) != std::string::npos);
    CHECK(msg.find(std::to_string(min_pool_bytes)) != std::string::npos);
    CHECK(msg.find(std::to_string(3 * g.total * kPage)) != std::string::npos);
  }
  // One byte more: everything spilled, a pool of exactly the largest layer.
  auto plan = TierPlan::Make(layouts, kPage, fixed + min_pool_bytes, fixed, so);
  REQUIRE(plan.ok());
  CHECK(plan->slots == 3 * g.total);
  CHECK(plan->pool_buffers == 3 * g.max_pages);
  CheckPlanShape(*plan, g);

  // A given pool smaller than a layer's spilled pages is a config error, with numbers.
  SpillOptions tiny = so;
  tiny.pool_bytes = 2 * kPage;
  auto bad = TierPlan::Make(layouts, kPage, 2 * g.total * kPage + 2 * kPage + fixed, fixed, tiny);  // all of v
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(bad.status().message().find("spill.pool_bytes=" + std::to_string(2 * kPage)) != std::string::npos);
  // A given pool counts in the budget as given.
  SpillOptions given = so;
  given.pool_bytes = 40 * kPage;
  auto ok = TierPlan::Make(layouts, kPage, 3 * g.total * kPage + fixed - 1, fixed, given);
  REQUIRE(ok.ok());
  CHECK(ok->pool_buffers == 40);
  CHECK(ok->slots == 41);  // 1 byte short + 40 pool pages
  CHECK((ok->ram_pages + ok->pool_buffers) * kPage + fixed <= 3 * g.total * kPage + fixed - 1);
}

namespace {

// Options whose host_bytes puts exactly `spill` pages on SSD with a pool of the largest
// spilled layer + `pool_extra` pages (learned from a first plan with a large pool).
ParamStoreOptions SpillOpts(const ModelSpec& spec, const std::string& dir, int64_t spill, int64_t pool_extra,
                            int prefetch, const std::string& faults = "") {
  ParamStoreOptions o;
  o.page_bytes = kPage;
  o.publish_dtype = DType::kF32;
  o.spill.dir = dir;
  o.spill.queue_depth = 8;
  o.spill.block_bytes = kPage;
  o.spill.prefetch_layers = prefetch;
  o.spill.faults = faults;
  const auto layouts = BuildLayout(spec);
  const Geo g = GeoOf(layouts);
  const int64_t fixed = static_cast<int64_t>(ParamStore::RequiredHostBytes(spec, o)) - 3 * g.total * kPage;
  SpillOptions big = o.spill;
  big.pool_bytes = 3 * g.max_pages * kPage;
  auto first = TierPlan::Make(layouts, kPage, fixed + (3 * g.total - spill + 3 * g.max_pages) * kPage, fixed, big);
  REQUIRE(first.ok());
  REQUIRE(first->slots == spill);
  const int64_t pool = first->max_layer_slots + pool_extra;
  o.spill.pool_bytes = pool * kPage;
  o.host_bytes = fixed + (3 * g.total - spill + pool) * kPage;
  return o;
}

// All of v and m and a fifth of master's pages on SSD.
int64_t TestSpill(const ModelSpec& spec) {
  const int64_t t = GeoOf(BuildLayout(spec)).total;
  return 2 * t + t / 5;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// The state an in-RAM store would hold: [layer][kind] (numel).
using Shadow = std::vector<std::array<std::vector<float>, 3>>;

Shadow SeedShadow(const ModelSpec& spec, uint64_t seed) {
  const auto layouts = BuildLayout(spec);
  Shadow s(layouts.size());
  for (size_t l = 0; l < layouts.size(); ++l) {
    s[l][0].resize(layouts[l].numel);
    InitLayerParams(spec, layouts[l], seed, s[l][0].data());
    s[l][1].assign(layouts[l].numel, 0.0f);
    s[l][2].assign(layouts[l].numel, 0.0f);
  }
  return s;
}

void CheckEqualsShadow(const ParamStore& ps, const Shadow& shadow) {
  for (int64_t l = 0; l < ps.num_layers(); ++l) {
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<float> got(ps.layout(l).numel);
      REQUIRE(ps.ReadState(l, kind, got.data()).ok());
      INFO("layer " << l << " kind " << kind);
      CHECK(got == shadow[l][kind]);
    }
  }
}

// A lease's update: the same arithmetic on the lease's spans and on the shadow.
void UpdateLayer(const ParamStore::StateLease& lease, std::array<std::vector<float>, 3>& shadow, float a) {
  for (const StateSpan& s : lease.spans()) {
    for (size_t i = 0; i < s.n; ++i) {
      s.master[i] = s.master[i] * 0.5f + a;
      s.m[i] += a * 0.25f;
      s.v[i] = s.v[i] * 2.0f + 1.0f;
      shadow[0][s.begin + i] = shadow[0][s.begin + i] * 0.5f + a;
      shadow[1][s.begin + i] += a * 0.25f;
      shadow[2][s.begin + i] = shadow[2][s.begin + i] * 2.0f + 1.0f;
    }
  }
}

bool LeaseEquals(const ParamStore::StateLease& lease, const std::array<std::vector<float>, 3>& shadow) {
  for (const StateSpan& s : lease.spans()) {
    for (size_t i = 0; i < s.n; ++i) {
      if (s.master[i] != shadow[0][s.begin + i] || s.m[i] != shadow[1][s.begin + i] ||
          s.v[i] != shadow[2][s.begin + i]) {
        return false;
      }
    }
  }
  return true;
}

std::string SpillPath(const std::string& dir, const std::string& job = "default") {
  return dir + "/l2l-" + job + ".spill";
}

}  // namespace

TEST_CASE("A store with spilled state round-trips random data for every layer and kind", "[eps][spill_tier]") {
  testing::TempDir dir;
  const ModelSpec spec = TierSpec();
  const Geo g = GeoOf(BuildLayout(spec));
  const int64_t spill = TestSpill(spec);
  auto store = ParamStore::Create(spec, SpillOpts(spec, dir.path(), spill, 1, 2));
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  auto& ps = **store;
  REQUIRE(ps.tier() != nullptr);
  const TierPlan& plan = ps.tier()->plan();
  CHECK(plan.slots == spill);
  CHECK(plan.spilled[1] + plan.spilled[2] >= 2 * g.total * 7 / 10);  // >= 70% of the moments
  CHECK(plan.spilled[0] > 0);                                         // and some master
  CHECK(ps.ssd_bytes() == static_cast<size_t>(spill) * kPage);
  CHECK(ps.state_bytes() == static_cast<size_t>(3 * g.total - spill) * kPage);  // only resident pages
  CHECK(ps.tier()->path() == SpillPath(dir.path()));
  struct stat st {};
  REQUIRE(stat(SpillPath(dir.path()).c_str(), &st) == 0);
  CHECK(static_cast<int64_t>(st.st_size) == 4096 + spill * static_cast<int64_t>(kPage));
  // Spilled arrays are null in spans().
  int64_t nulls = 0;
  for (int64_t l = 0; l < ps.num_layers(); ++l) {
    for (const StateSpan& s : ps.spans(l)) nulls += (s.master == nullptr) + (s.m == nullptr) + (s.v == nullptr);
  }
  CHECK(nulls == spill);

  // Before any write the state reads as zeros (Create's contract), without file reads.
  {
    std::vector<float> got(ps.layout(1).numel, 1.0f);
    REQUIRE(ps.ReadState(1, 2, got.data()).ok());
    CHECK(std::all_of(got.begin(), got.end(), [](float x) { return x == 0.0f; }));
  }
  Shadow src(ps.num_layers());
  for (int64_t l = 0; l < ps.num_layers(); ++l) {
    for (int kind = 0; kind < 3; ++kind) {
      src[l][kind] = RandomFloats(ps.layout(l).numel, static_cast<uint32_t>(l * 3 + kind + 1));
      REQUIRE(ps.WriteState(l, kind, src[l][kind].data()).ok());
    }
  }
  CheckEqualsShadow(ps, src);
  REQUIRE(ps.tier()->Flush().ok());
  const TierStats ts = ps.tier()->stats();
  CHECK(ts.io.bytes_written > 0);
  CHECK(ts.io.bytes_read > 0);  // the pool holds one layer: the reads came from the file
  CHECK(ts.ssd_bytes == spill * static_cast<int64_t>(kPage));
  CHECK(ts.ram_state_bytes == (3 * g.total - spill) * static_cast<int64_t>(kPage));
  CHECK(ts.pool_bytes == plan.pool_buffers * static_cast<int64_t>(kPage));
  CHECK(ps.health().ok());
}

TEST_CASE("Update leases in reverse layer order with a one-layer pool equal an in-RAM shadow",
          "[eps][spill_tier]") {
  testing::TempDir dir;
  const ModelSpec spec = TierSpec();
  const int64_t spill = TestSpill(spec);
  auto store = ParamStore::Create(spec, SpillOpts(spec, dir.path(), spill, 1, 2));
  REQUIRE(store.ok());
  auto& ps = **store;
  REQUIRE(ps.InitFromSeed(5).ok());
  Shadow shadow = SeedShadow(spec, 5);
  const int kRounds = 4;
  for (int r = 0; r < kRounds; ++r) {
    for (int64_t l = ps.num_layers() - 1; l >= 0; --l) {
      auto lease = ps.Lease(l, LeaseMode::kUpdate);
      INFO(lease.status().ToString());
      REQUIRE(lease.ok());
      for (const StateSpan& s : lease->spans()) REQUIRE((s.master && s.m && s.v));
      CHECK(LeaseEquals(*lease, shadow[l]));
      UpdateLayer(*lease, shadow[l], static_cast<float>(r + 1));
    }
  }
  REQUIRE(ps.tier()->Flush().ok());
  const TierStats ts = ps.tier()->stats();
  // Every lease of a spilled layer wrote all its spilled pages back (the fill, then each
  // round), and nothing else was written.
  CHECK(ts.io.bytes_written == static_cast<uint64_t>((kRounds + 1) * spill) * kPage);
  CHECK(ts.lease_misses > 0);
  CheckEqualsShadow(ps, shadow);
}

TEST_CASE("Four threads leasing random layers finish without deadlock and equal the shadow",
          "[eps][spill_tier][concurrency]") {
  testing::TempDir dir;
  const ModelSpec spec = TierSpec();
  auto store = ParamStore::Create(spec, SpillOpts(spec, dir.path(), TestSpill(spec), 1, 1));
  REQUIRE(store.ok());
  auto& ps = **store;
  REQUIRE(ps.InitFromSeed(9).ok());
  Shadow shadow = SeedShadow(spec, 9);
  // Only spilled layers: a lease excludes other leases of the layer only through the tier.
  std::vector<int64_t> layers;
  for (int64_t l = 0; l < ps.num_layers(); ++l) {
    if (ps.tier()->plan().layer_spilled(l)) layers.push_back(l);
  }
  REQUIRE(layers.size() >= 3);
  std::atomic<int64_t> failures{0}, mismatches{0}, updates{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      for (int i = 0; i < 60; ++i) {
        const int64_t l = layers[rng() % layers.size()];
        const bool update = rng() % 3 != 0;
        auto lease = ps.Lease(l, update ? LeaseMode::kUpdate : LeaseMode::kRead);
        if (!lease.ok()) {
          ++failures;
          continue;
        }
        if (!LeaseEquals(*lease, shadow[l])) ++mismatches;
        if (update) {
          UpdateLayer(*lease, shadow[l], static_cast<float>(t + 1));
          ++updates;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 20.0);
  CHECK(failures.load() == 0);
  CHECK(mismatches.load() == 0);
  CHECK(updates.load() > 0);
  REQUIRE(ps.tier()->Flush().ok());
  CheckEqualsShadow(ps, shadow);
}

TEST_CASE("Leasing layer l prefetches layer l-1", "[eps][spill_tier]") {
  const int prefetch = GENERATE(0, 1);
  INFO("prefetch_layers " << prefetch);
  testing::TempDir dir;
  const ModelSpec spec = TierSpec();
  const ParamStoreOptions base = SpillOpts(spec, dir.path(), TestSpill(spec), 1, prefetch);
  ParamStoreOptions o = base;
  // Room for two layers, so l-1 can be read while l is leased.
  o.spill.pool_bytes = 2 * base.spill.pool_bytes;
  o.host_bytes = base.host_bytes + base.spill.pool_bytes;
  auto store = ParamStore::Create(spec, o);
  REQUIRE(store.ok());
  auto& ps = **store;
  REQUIRE(ps.InitFromSeed(3).ok());  // layers 0..5 in order
  REQUIRE(ps.tier()->Flush().ok());
  // A settled cache without layers 1 and 2, whatever the init's read-aheads did (under
  // load they finish late and may leave layer 2 cached): lease 5 then 4 (the pool holds
  // two layers; with prefetch, 4's lease reads 3 ahead), then wait for every read.
  for (int64_t l : {5, 4}) REQUIRE(ps.Lease(l, LeaseMode::kRead).ok());
  REQUIRE(ps.tier()->Flush().ok());
  const Shadow shadow = SeedShadow(spec, 3);
  REQUIRE(ps.tier()->plan().layer_spilled(1));
  REQUIRE(ps.tier()->plan().layer_spilled(2));
  const TierStats before = ps.tier()->stats();
  {
    auto lease = ps.Lease(2, LeaseMode::kRead);
    REQUIRE(lease.ok());
    CHECK(LeaseEquals(*lease, shadow[2]));
  }
  const TierStats mid = ps.tier()->stats();
  CHECK(mid.lease_misses == before.lease_misses + 1);  // layer 2 came from the file
  {
    auto lease = ps.Lease(1, LeaseMode::kRead);
    REQUIRE(lease.ok());
    CHECK(LeaseEquals(*lease, shadow[1]));
  }
  const TierStats after = ps.tier()->stats();
  if (prefetch >= 1) {
    CHECK(after.lease_hits == mid.lease_hits + 1);
    CHECK(after.lease_misses == mid.lease_misses);
  } else {
    CHECK(after.lease_hits == mid.lease_hits);  // the control: without prefetch it is a miss
    CHECK(after.lease_misses == mid.lease_misses + 1);
  }
}

TEST_CASE("An injected read fault fails that lease, naming the file, other leases go on", "[eps][spill_tier][fault]") {
  testing::TempDir dir;
  const ModelSpec spec = TierSpec();
  auto store = ParamStore::Create(spec, SpillOpts(spec, dir.path(), TestSpill(spec), 1, 0, "read:3:EIO"));
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  auto& ps = **store;
  REQUIRE(ps.InitFromSeed(4).ok());  // overwrite leases: writes only, no reads
  REQUIRE(ps.tier()->Flush().ok());
  const Shadow shadow = SeedShadow(spec, 4);
  const int64_t bad = 1;  // a block: > 3 spilled pages, evicted by the later layers' fill
  auto failed = ps.Lease(bad, LeaseMode::kRead);
  REQUIRE_FALSE(failed.ok());
  INFO(failed.status().ToString());
  CHECK(failed.status().message().find(ps.tier()->path()) != std::string::npos);
  CHECK(failed.status().message().find("read") != std::string::npos);
  CHECK(ps.health().ok());  // a read fault does not poison the tier
  {
    auto other = ps.Lease(2, LeaseMode::kRead);
    INFO(other.status().ToString());
    REQUIRE(other.ok());
    CHECK(LeaseEquals(*other, shadow[2]));
  }
  auto again = ps.Lease(bad, LeaseMode::kRead);  // the fault was one read: it reads now
  INFO(again.status().ToString());
  REQUIRE(again.ok());
  CHECK(LeaseEquals(*again, shadow[bad]));
}

TEST_CASE("An injected write fault makes the tier unhealthy and every later lease fail", "[eps][spill_tier][fault]") {
  testing::TempDir dir;
  const ModelSpec spec = TierSpec();
  auto store = ParamStore::Create(spec, SpillOpts(spec, dir.path(), TestSpill(spec), 1, 0, "write:2:EIO"));
  INFO(store.status().ToString());
  REQUIRE(store.ok());
  auto& ps = **store;
  const auto data = RandomFloats(ps.layout(1).numel, 77);
  REQUIRE(ps.WriteLayer(1, data.data(), data.data(), data.data()).ok());  // the fault is in the write-behind
  const Status flushed = ps.tier()->Flush();
  REQUIRE_FALSE(flushed.ok());
  INFO(flushed.ToString());
  CHECK(flushed.message().find(ps.tier()->path()) != std::string::npos);
  CHECK(flushed.message().find("write") != std::string::npos);
  CHECK(ps.health().code() == flushed.code());
  CHECK(ps.health().message() == flushed.message());
  for (int64_t l : {int64_t{0}, int64_t{1}, int64_t{2}}) {
    auto lease = ps.Lease(l, LeaseMode::kRead);
    REQUIRE_FALSE(lease.ok());
    CHECK(lease.status().message() == flushed.message());
  }
  std::vector<float> out(ps.layout(0).numel);
  CHECK_FALSE(ps.ReadState(0, 0, out.data()).ok());
}

TEST_CASE("A spill file of the wrong size is refused with DATA_LOSS naming it, a right-sized one is reused",
          "[eps][spill_tier][fault]") {
  testing::TempDir dir;
  const ModelSpec spec = TierSpec();
  ParamStoreOptions o = SpillOpts(spec, dir.path(), TestSpill(spec), 1, 0);
  o.spill.job_id = "wrongsize";
  const std::string path = SpillPath(dir.path(), "wrongsize");
  dir.Write("l2l-wrongsize.spill", std::string(12345, 'x'));
  auto store = ParamStore::Create(spec, o);
  REQUIRE_FALSE(store.ok());
  CHECK(store.status().code() == StatusCode::kDataLoss);
  CHECK(store.status().message().find(path) != std::string::npos);
  CHECK(std::filesystem::file_size(path) == 12345);  // not touched
  std::filesystem::remove(path);
  {
    auto first = ParamStore::Create(spec, o);
    REQUIRE(first.ok());
    // A second store on the same file at the same time is refused.
    auto twin = ParamStore::Create(spec, o);
    REQUIRE_FALSE(twin.ok());
    CHECK(twin.status().message().find(path) != std::string::npos);
  }
  // Garbage left in a right-sized file is never read: the state starts at zeros.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const std::string junk(std::filesystem::file_size(path) - 4096, '\x7f');
    f.seekp(4096);
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto reused = ParamStore::Create(spec, o);
  REQUIRE(reused.ok());
  for (int64_t l = 0; l < (*reused)->num_layers(); ++l) {
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<float> got((*reused)->layout(l).numel, 1.0f);
      REQUIRE((*reused)->ReadState(l, kind, got.data()).ok());
      CHECK(std::all_of(got.begin(), got.end(), [](float x) { return x == 0.0f; }));
    }
  }
}

TEST_CASE("A spill file truncated while running fails the next read lease with a short read",
          "[eps][spill_tier][fault]") {
  testing::TempDir dir;
  const ModelSpec spec = TierSpec();
  auto store = ParamStore::Create(spec, SpillOpts(spec, dir.path(), TestSpill(spec), 1, 0));
  REQUIRE(store.ok());
  auto& ps = **store;
  REQUIRE(ps.InitFromSeed(6).ok());
  REQUIRE(ps.tier()->Flush().ok());
  REQUIRE(::truncate(ps.tier()->path().c_str(), 4096) == 0);
  auto lease = ps.Lease(1, LeaseMode::kRead);
  REQUIRE_FALSE(lease.ok());
  INFO(lease.status().ToString());
  CHECK(lease.status().message().find(ps.tier()->path()) != std::string::npos);
  CHECK(lease.status().message().find("short read") != std::string::npos);
}

}  // namespace l2l::eps
