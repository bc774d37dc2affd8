// Sharded state (docs/operations.md "Running on a cluster"): a job's layers split over N
// l2l-eps daemons ("shards"), each owning one contiguous range of layers. Every shard
// computes the same plan from the model's layer sizes, so nothing but (K, N) needs to be
// configured; an explicit plan (--shard-layers) may place the embedding or the head on
// a shard of their own. Shard 0 checks at join that the shards' ranges tile the model.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace l2l {

inline constexpr int kMaxShards = 256;

// Layers [first, first + count) of the model.
struct LayerRange {
  int64_t first = 0;
  int64_t count = 0;
  int64_t end() const { return first + count; }
  bool operator==(const LayerRange&) const = default;
};

// One shard of a sharded job as the others see it: where it listens and the model
// layers it owns (shard 0's registration and status list every shard this way).
struct ShardEndpoint {
  int index = 0;
  std::string address;  // host:port, as the shard advertised it
  LayerRange layers;
};

// This daemon's place in a sharded job. count 1 = not sharded (the whole model).
struct ShardId {
  int index = 0;
  int count = 1;
  bool sharded() const { return count > 1; }
};

// "K/N" (0 <= K < N <= kMaxShards). Errors name the text and what is expected.
Result<ShardId> ParseShardId(const std::string& text);

// Contiguous ranges balanced by bytes: shard k ends at the first layer boundary where
// the running parameter count reaches (k+1)/N of the total, every shard keeping at least
// one layer. INVALID_ARGUMENT when N exceeds the number of layers.
Result<std::vector<LayerRange>> BalancedShardRanges(const std::vector<int64_t>& layer_numel, int shards);

// An explicit plan: N-1 boundaries "b1,b2,...", strictly increasing in (0, layers), shard k
// owning [b_k, b_{k+1}) with b_0 = 0 and b_N = layers. Errors name the text.
Result<std::vector<LayerRange>> ParseShardBoundaries(const std::string& text, int64_t layers, int shards);

// Checks that `ranges` (one per shard, indexed by shard) tile [0, layers): each
// non-empty, shard k+1 starting where shard k ends. Errors name the shards that overlap
// or the layers no shard owns.
Status CheckShardRanges(const std::vector<LayerRange>& ranges, int64_t layers);

// The shard owning `layer` (-1: none).
int ShardOfLayer(const std::vector<LayerRange>& ranges, int64_t layer);

}  // namespace l2l
