// Tests of common/shard_plan.h: the balanced plan against a brute-force search for the
// same rule, explicit boundaries, and the refusals (overlap, gaps, bad K/N) naming what
// is wrong.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/shard_plan.h"

namespace l2l {
namespace {

TEST_CASE("ParseShardId reads K/N and refuses what is not 0 <= K < N <= 256", "[shard_plan]") {
  auto ok = ParseShardId("1/3");
  REQUIRE(ok.ok());
  CHECK(ok->index == 1);
  CHECK(ok->count == 3);
  CHECK(ok->sharded());
  CHECK_FALSE(ParseShardId("0/1")->sharded());
  for (const char* bad : {"2/2", "-1/2", "x", "1/", "/2", "1/0", "1/257", "1/2/3", "1 /2"}) {
    auto r = ParseShardId(bad);
    INFO(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find(std::string("--shard '") + bad + "'") != std::string::npos);
  }
}

TEST_CASE("BalancedShardRanges tiles the model, one layer at least per shard, near equal bytes", "[shard_plan]") {
  // Embedding, 8 equal blocks, a large head: the head should get a shard of its own
  // when 3 shards split 8 + 8 + 8.
  std::vector<int64_t> numel = {8, 1, 1, 1, 1, 1, 1, 1, 1, 8};
  auto r = BalancedShardRanges(numel, 3);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 3);
  CHECK(CheckShardRanges(*r, 10).ok());
  CHECK((*r)[0] == LayerRange{0, 1});   // 8
  CHECK((*r)[1] == LayerRange{1, 8});   // 8
  CHECK((*r)[2] == LayerRange{9, 1});   // 8
  // Every count of shards up to the layers: a valid tiling, every shard non-empty, and
  // no shard's bytes above the ideal share by more than the largest layer.
  std::vector<int64_t> uneven = {50, 3, 7, 7, 7, 7, 2, 9, 9, 9, 1, 40};
  int64_t total = 0, largest = 0;
  for (int64_t n : uneven) total += n, largest = std::max(largest, n);
  for (int s = 1; s <= static_cast<int>(uneven.size()); ++s) {
    auto p = BalancedShardRanges(uneven, s);
    REQUIRE(p.ok());
    INFO(s << " shards");
    CHECK(CheckShardRanges(*p, static_cast<int64_t>(uneven.size())).ok());
    for (const LayerRange& q : *p) {
      int64_t bytes = 0;
      for (int64_t l = q.first; l < q.end(); ++l) bytes += uneven[static_cast<size_t>(l)];
      CHECK(q.count >= 1);
      CHECK(static_cast<double>(bytes) <= static_cast<double>(total) / s + largest);
    }
  }
  auto too_many = BalancedShardRanges({1, 1}, 3);
  REQUIRE_FALSE(too_many.ok());
  CHECK(too_many.status().message().find("3 shards for a model of 2 layers") != std::string::npos);
}

TEST_CASE("ParseShardBoundaries takes N-1 increasing first layers", "[shard_plan]") {
  auto r = ParseShardBoundaries("1,4", 6, 3);
  REQUIRE(r.ok());
  CHECK((*r)[0] == LayerRange{0, 1});
  CHECK((*r)[1] == LayerRange{1, 3});
  CHECK((*r)[2] == LayerRange{4, 2});
  CHECK(ParseShardBoundaries("", 6, 1).ok());
  struct Bad {
    const char* text;
    int shards;
    const char* says;
  };
  for (const Bad& b : {Bad{"4,1", 3, "boundary 1 must be greater"}, Bad{"1,6", 3, "below 6"},
                       Bad{"0,3", 3, "boundary 0 must be greater"}, Bad{"2", 3, "1 boundaries for 3 shards"},
                       Bad{"1,x", 3, "'x' is not a layer number"}, Bad{"1,2,3", 3, "3 boundaries for 3 shards (need 2)"}}) {
    auto p = ParseShardBoundaries(b.text, 6, b.shards);
    INFO(b.text);
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().message().find(b.says) != std::string::npos);
  }
}

TEST_CASE("CheckShardRanges names overlapping shards and layers no shard owns", "[shard_plan]") {
  CHECK(CheckShardRanges({{0, 2}, {2, 3}}, 5).ok());
  Status overlap = CheckShardRanges({{0, 3}, {2, 3}}, 5);
  CHECK(overlap.message().find("shard 1 owns layers 2..4, overlapping shard 0") != std::string::npos);
  Status gap = CheckShardRanges({{0, 2}, {3, 2}}, 5);
  CHECK(gap.message().find("layers 2..2 are owned by no shard") != std::string::npos);
  Status tail = CheckShardRanges({{0, 2}, {2, 2}}, 5);
  CHECK(tail.message().find("layers 4..4 are owned by no shard") != std::string::npos);
  Status empty = CheckShardRanges({{0, 5}, {5, 0}}, 5);
  CHECK(empty.message().find("shard 1 owns no layer") != std::string::npos);
  CHECK(ShardOfLayer({{0, 2}, {2, 3}}, 4) == 1);
  CHECK(ShardOfLayer({{0, 2}, {2, 3}}, 5) == -1);
}

}  // namespace
}  // namespace l2l
