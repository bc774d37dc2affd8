// Tests for worker/data_loader (windows and shifted targets, deterministic shuffles,
// disjoint shards, resumable positions, errors, reading a real tokens file) and
// worker/sampler (top-k / temperature / greedy choice, determinism).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "common/formats/tokens_file.h"
#include "worker/data_loader.h"
#include "worker/sampler.h"

namespace l2l::worker {
namespace {

// tokens[i] = i % 251: every window's content tells where it starts.
std::vector<int32_t> Ramp(int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(i % 251);
  return t;
}

DataLoader Make(int64_t n, DataLoaderOptions o) {
  auto d = DataLoader::FromTokens(Ramp(n), o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  return std::move(d).value();
}

TEST_CASE("DataLoader yields windows with targets shifted by one, each window once per epoch", "[data_loader]") {
  DataLoaderOptions o;
  o.B = 3;
  o.T = 8;
  o.seed = 5;
  const int64_t n = 8 * 30 + 1;  // exactly 30 windows
  DataLoader d = Make(n, o);
  CHECK(d.num_windows() == 30);
  CHECK(d.batches_per_epoch() == 10);
  std::set<int32_t> starts;
  std::vector<int32_t> order;
  for (int k = 0; k < 10; ++k) {
    const MicroBatch mb = d.Next();
    REQUIRE(mb.B == 3);
    REQUIRE(mb.T == 8);
    for (int b = 0; b < 3; ++b) {
      const int32_t s = mb.inputs[b * 8];
      CHECK(s % 8 == 0);  // windows start at multiples of T (n < 251: no wrap)
      for (int t = 0; t < 8; ++t) {
        CHECK(mb.inputs[b * 8 + t] == s + t);
        CHECK(mb.targets[b * 8 + t] == s + t + 1);
      }
      starts.insert(s);
      order.push_back(s);
    }
  }
  CHECK(starts.size() == 30);  // a permutation of all windows
  bool sorted = std::is_sorted(order.begin(), order.end());
  CHECK_FALSE(sorted);  // shuffled
  // Next epoch: the same windows in a different order.
  std::vector<int32_t> order2;
  for (int k = 0; k < 10; ++k) {
    const MicroBatch mb = d.Next();
    for (int b = 0; b < 3; ++b) order2.push_back(mb.inputs[b * 8]);
  }
  CHECK(d.position() == DataPosition{1, 10});
  CHECK(std::set<int32_t>(order2.begin(), order2.end()) == starts);
  CHECK(order2 != order);
  // Same seed, same order; another seed, another order.
  DataLoader again = Make(n, o);
  CHECK(again.Next().inputs == Make(n, o).Next().inputs);
  o.seed = 6;
  std::vector<int32_t> other;
  DataLoader d6 = Make(n, o);
  for (int k = 0; k < 10; ++k) other.push_back(d6.Next().inputs[0]);
  std::vector<int32_t> first;
  for (size_t k = 0; k < 30; k += 3) first.push_back(order[k]);
  CHECK(other != first);
  o.shuffle = false;
  DataLoader plain = Make(n, o);
  CHECK(plain.Next().inputs[0] == 0);
  CHECK(plain.Next().inputs[0] == 24);
}

TEST_CASE("DataLoader shards are disjoint and equal-sized", "[data_loader]") {
  DataLoaderOptions o;
  o.B = 2;
  o.T = 4;
  o.seed = 9;
  o.world = 3;
  const int64_t n = 4 * 31 + 1;  // 31 windows: 10 per shard, 1 left out
  std::map<int32_t, int> seen;
  for (int64_t r = 0; r < 3; ++r) {
    o.rank = r;
    DataLoader d = Make(n, o);
    CHECK(d.batches_per_epoch() == 5);
    for (int k = 0; k < 5; ++k) {
      const MicroBatch mb = d.Next();
      for (int b = 0; b < 2; ++b) ++seen[mb.inputs[b * 4]];
    }
  }
  CHECK(seen.size() == 30);
  for (const auto& [start, count] : seen) CHECK(count == 1);
}

TEST_CASE("DataLoader resumes exactly from a saved position", "[data_loader]") {
  DataLoaderOptions o;
  o.B = 2;
  o.T = 5;
  o.seed = 3;
  DataLoader a = Make(5 * 20 + 1, o);
  for (int k = 0; k < 13; ++k) a.Next();  // crosses into epoch 1
  const std::string saved = a.position().ToString();
  CHECK(saved == "epoch=1,batch=3");
  auto pos = DataPosition::Parse(saved);
  REQUIRE(pos.ok());
  DataLoader b = Make(5 * 20 + 1, o);
  REQUIRE(b.Seek(*pos).ok());
  for (int k = 0; k < 12; ++k) CHECK(a.Next().inputs == b.Next().inputs);
  CHECK_FALSE(DataPosition::Parse("epoch=1").ok());
  CHECK_FALSE(DataPosition::Parse("epoch=-1,batch=0").ok());
  CHECK_FALSE(DataPosition::Parse("epoch=1,batch=2x").ok());
  CHECK(b.Seek({0, 11}).code() == StatusCode::kOutOfRange);
}

TEST_CASE("DataLoader errors name the problem", "[data_loader]") {
  DataLoaderOptions o;
  o.B = 4;
  o.T = 16;
  auto small = DataLoader::FromTokens(Ramp(40), o, "tiny.bin");
  REQUIRE_FALSE(small.ok());
  CHECK(small.status().message().find("tiny.bin") != std::string::npos);
  CHECK(small.status().message().find("at least 65 tokens") != std::string::npos);
  o.vocab_size = 100;
  auto vocab = DataLoader::FromTokens(Ramp(1000), o, "v.bin");
  REQUIRE_FALSE(vocab.ok());
  CHECK(vocab.status().message().find("token 100 has id 100") != std::string::npos);
  o.vocab_size = 0;
  o.rank = 2;
  o.world = 2;
  auto shard = DataLoader::FromTokens(Ramp(1000), o);
  REQUIRE_FALSE(shard.ok());
  CHECK(shard.status().message().find("rank=2 of world=2") != std::string::npos);
  auto missing = DataLoader::Open("/nonexistent/l2l/x.bin", DataLoaderOptions{});
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("/nonexistent/l2l/x.bin") != std::string::npos);
}

TEST_CASE("DataLoader reads an llm.c tokens file", "[data_loader]") {
  const auto path = std::filesystem::temp_directory_path() / ("l2l_dl_" + std::to_string(::getpid()) + ".bin");
  std::vector<uint16_t> toks;
  for (int i = 0; i < 401; ++i) toks.push_back(static_cast<uint16_t>((i * 7) % 256));
  REQUIRE(WriteTokensFile(path.string(), toks).ok());
  DataLoaderOptions o;
  o.B = 2;
  o.T = 10;
  o.vocab_size = 256;
  o.shuffle = false;
  auto d = DataLoader::Open(path.string(), o);
  std::filesystem::remove(path);
  REQUIRE(d.ok());
  CHECK(d->num_windows() == 40);
  const MicroBatch mb = d->Next();
  for (int i = 0; i < 20; ++i) {
    const int k = (i / 10) * 10 + i % 10;  // window b starts at b*T
    CHECK(mb.inputs[i] == toks[k]);
    CHECK(mb.targets[i] == toks[k + 1]);
  }
}

TEST_CASE("SampleToken honours greedy, top-k and temperature", "[sampler]") {
  const std::vector<float> p = {0.1f, 0.4f, 0.2f, 0.3f};
  for (double u : {0.0, 0.3, 0.99}) {
    CHECK(SampleToken(p, 0.0f, 0, u) == 1);   // greedy
    CHECK(SampleToken(p, 1.0f, 1, u) == 1);   // top-1
    const int32_t t2 = SampleToken(p, 1.0f, 2, u);
    CHECK((t2 == 1 || t2 == 3));              // top-2 = {1, 3}
  }
  // Temperature 1, no cut: empirical frequencies match p (20000 draws; 5 sigma ~ 0.015).
  std::vector<int> count(4, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[SampleToken(p, 1.0f, 0, SamplerUniform(77, i))];
  for (int k = 0; k < 4; ++k) CHECK(std::abs(count[k] / double(n) - p[k]) < 0.015);
  // Temperature 0.5 squares the probabilities: 0.01, 0.16, 0.04, 0.09 over 0.30.
  std::fill(count.begin(), count.end(), 0);
  for (int i = 0; i < n; ++i) ++count[SampleToken(p, 0.5f, 0, SamplerUniform(78, i))];
  const double sq[4] = {0.01 / 0.3, 0.16 / 0.3, 0.04 / 0.3, 0.09 / 0.3};
  for (int k = 0; k < 4; ++k) CHECK(std::abs(count[k] / double(n) - sq[k]) < 0.015);
}

TEST_CASE("Generate is deterministic from the seed and feeds at most context_len tokens", "[sampler]") {
  int64_t longest = 0;
  NextTokenProbs next = [&](const std::vector<int32_t>& ctx) -> Result<std::vector<float>> {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(ctx.size()));
    std::vector<float> p(5, 0.1f);
    p[(ctx.back() + 1) % 5] = 0.6f;
    return p;
  };
  SamplerOptions o;
  o.max_new_tokens = 30;
  o.context_len = 8;
  o.seed = 4;
  auto a = Generate(next, {1, 2}, o);
  auto b = Generate(next, {1, 2}, o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->size() == 32);
  CHECK(*a == *b);
  CHECK(longest == 8);
  o.seed = 5;
  CHECK(*Generate(next, {1, 2}, o) != *a);
  CHECK_FALSE(Generate(next, {}, o).ok());
}

}  // namespace
}  // namespace l2l::worker
