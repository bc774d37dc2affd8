// The shard plan: which layers each l2l-eps shard owns (see shard_plan.h).
#include "common/shard_plan.h"

#include <charconv>

namespace l2l {
namespace {

bool ParseInt(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

Result<ShardId> ParseShardId(const std::string& text) {
  const size_t slash = text.find('/');
  int64_t k = -1, n = -1;
  if (slash == std::string::npos || !ParseInt(std::string_view(text).substr(0, slash), &k) ||
      !ParseInt(std::string_view(text).substr(slash + 1), &n)) {
    return InvalidArgument("--shard '" + text + "': expected K/N, e.g. 0/2 (shard K of N, 0-based)");
  }
  if (n < 1 || n > kMaxShards || k < 0 || k >= n) {
    return InvalidArgument("--shard '" + text + "': need 0 <= K < N <= " + std::to_string(kMaxShards));
  }
  return ShardId{static_cast<int>(k), static_cast<int>(n)};
}

Result<std::vector<LayerRange>> BalancedShardRanges(const std::vector<int64_t>& layer_numel, int shards) {
  const int64_t layers = static_cast<int64_t>(layer_numel.size());
  if (shards < 1 || shards > layers) {
    return InvalidArgument(std::to_string(shards) + " shards for a model of " + std::to_string(layers) +
                           " layers: every shard must own at least one layer");
  }
  long double total = 0;
  for (int64_t n : layer_numel) total += static_cast<long double>(n);
  std::vector<LayerRange> ranges;
  int64_t next = 0;
  long double running = 0;
  for (int k = 0; k < shards; ++k) {
    LayerRange r{next, 0};
    const long double target = total * static_cast<long double>(k + 1) / shards;
    const int64_t must_leave = shards - k - 1;  // one layer for each shard after this one
    while (next < layers - must_leave && (r.count == 0 || k == shards - 1 || running < target)) {
      // Stop before a layer when stopping leaves the running sum nearer the target.
      if (r.count > 0 && k < shards - 1) {
        const long double with = running + static_cast<long double>(layer_numel[next]);
        if (with > target && with - target > target - running) break;
      }
      running += static_cast<long double>(layer_numel[next]);
      ++next;
      ++r.count;
    }
    ranges.push_back(r);
  }
  return ranges;
}

Result<std::vector<LayerRange>> ParseShardBoundaries(const std::string& text, int64_t layers, int shards) {
  std::vector<int64_t> b{0};
  size_t pos = 0;
  while (pos <= text.size() && shards > 1) {
    const size_t comma = text.find(',', pos);
    const std::string_view part =
        std::string_view(text).substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    int64_t v = 0;
    if (!ParseInt(part, &v)) {
      return InvalidArgument("--shard-layers '" + text + "': '" + std::string(part) +
                             "' is not a layer number (expected N-1 comma-separated boundaries, e.g. 1,12)");
    }
    if (v <= b.back() || v >= layers) {
      return InvalidArgument("--shard-layers '" + text + "': boundary " + std::to_string(v) +
                             " must be greater than the previous one and below " + std::to_string(layers) +
                             " (the model's layer count)");
    }
    b.push_back(v);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (static_cast<int>(b.size()) != shards) {
    return InvalidArgument("--shard-layers '" + text + "': " + std::to_string(b.size() - 1) + " boundaries for " +
                           std::to_string(shards) + " shards (need " + std::to_string(shards - 1) + ")");
  }
  b.push_back(layers);
  std::vector<LayerRange> ranges;
  for (int k = 0; k < shards; ++k) ranges.push_back({b[k], b[k + 1] - b[k]});
  return ranges;
}

Status CheckShardRanges(const std::vector<LayerRange>& ranges, int64_t layers) {
  int64_t next = 0;
  for (size_t k = 0; k < ranges.size(); ++k) {
    const LayerRange& r = ranges[k];
    const std::string what = "shard " + std::to_string(k) + " owns layers " + std::to_string(r.first) + ".." +
                             std::to_string(r.end() - 1);
    if (r.count < 1) return InvalidArgument("shard " + std::to_string(k) + " owns no layer");
    if (r.first < next) {
      return InvalidArgument(what + ", overlapping shard " + std::to_string(k - 1) + " (which ends at layer " +
                             std::to_string(next - 1) + ")");
    }
    if (r.first > next) {
      return InvalidArgument(what + ": layers " + std::to_string(next) + ".." + std::to_string(r.first - 1) +
                             " are owned by no shard");
    }
    next = r.end();
  }
  if (next > layers) {
    return InvalidArgument("the shards own layers up to " + std::to_string(next - 1) + ", the model has " +
                           std::to_string(layers));
  }
  if (next < layers) {
    return InvalidArgument("layers " + std::to_string(next) + ".." + std::to_string(layers - 1) +
                           " are owned by no shard");
  }
  return Status::Ok();
}

int ShardOfLayer(const std::vector<LayerRange>& ranges, int64_t layer) {
  for (size_t k = 0; k < ranges.size(); ++k) {
    if (layer >= ranges[k].first && layer < ranges[k].end()) return static_cast<int>(k);
  }
  return -1;
}

}  // namespace l2l
