// DataLoader: deterministic, shardable, resumable micro-batches from a token stream.
// See worker/data_loader.h.
#include "worker/data_loader.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "common/formats/rows_file.h"
#include "common/formats/tokens_file.h"
#include "common/models/registry.h"
#include "common/rng.h"
#include "kernels/backend.h"

namespace l2l::worker {
std::string DataPosition::ToString() const {
  return "epoch=" + std::to_string(epoch) + ",batch=" + std::to_string(batch);
}

Result<DataPosition> DataPosition::Parse(const std::string& s) {
  long long e = -1, b = -1;
  int consumed = 0;
  if (std::sscanf(s.c_str(), "epoch=%lld,batch=%lld%n", &e, &b, &consumed) != 2 ||
      consumed != static_cast<int>(s.size()) || e < 0 || b < 0) {
    return InvalidArgument("data position '" + s + "' is not of the form epoch=E,batch=K with E, K >= 0");
  }
  DataPosition p;
  p.epoch = e;
  p.batch = b;
  return p;
}

Result<DataLoader> DataLoader::Open(const std::string& path, const DataLoaderOptions& opts) {
  L2L_ASSIGN_OR_RETURN(std::vector<uint32_t> raw, ReadTokensFile32(path, opts.vocab_size));
  std::vector<uint8_t> mask;
  const std::string mask_path = LossMaskPath(path);
  if (opts.loss_mask && std::filesystem::exists(mask_path)) {
    L2L_ASSIGN_OR_RETURN(mask, ReadLossMaskFile(mask_path, static_cast<int64_t>(raw.size())));
  }
  return FromTokens(std::vector<int32_t>(raw.begin(), raw.end()), opts, path, std::move(mask));
}

Result<DataLoader> DataLoader::OpenForTask(const std::string& path, const DataLoaderOptions& opts) {
  return opts.task == Task::kLm ? Open(path, opts) : OpenRows(path, opts);
}

Result<DataLoader> DataLoader::OpenRows(const std::string& path, const DataLoaderOptions& opts) {
  const std::string task = ToString(opts.task);
  if (opts.task == Task::kLm) return InvalidArgument(path + ": task lm reads a token stream, not rows");
  Result<ClassifyRows> read = ReadClassifyFiles(path, opts.vocab_size);
  if (!read.ok()) {
    return read.status().WithContext("task " + task + " reads rows files " + path +
                                     "{,.types,.attn,.labels} (l2l-tokenize --task " + task + ")");
  }
  ClassifyRows rows = std::move(*read);
  if (opts.task == Task::kMlm && !(opts.vocab_size > opts.mlm.first_word_id && opts.mlm.mask_id < opts.vocab_size)) {
    return InvalidArgument(path + ": task mlm needs mlm.first_word_id=" + std::to_string(opts.mlm.first_word_id) +
                           " and mlm.mask_id=" + std::to_string(opts.mlm.mask_id) + " below the vocabulary size " +
                           std::to_string(opts.vocab_size));
  }
  if (rows.max_len != opts.T) {
    return InvalidArgument(path + ": rows of L=" + std::to_string(rows.max_len) + " tokens, but the job's seq_len is " +
                           std::to_string(opts.T) + "; set train.seq_len: " + std::to_string(rows.max_len) +
                           " or re-tokenize with --max-len " + std::to_string(opts.T));
  }
  if (opts.task == Task::kClassify) {
    for (size_t i = 0; i < rows.labels.size(); ++i) {
      if (rows.labels[i] >= opts.num_labels) {
        return OutOfRange(path + ".labels: row " + std::to_string(i) + " has label " + std::to_string(rows.labels[i]) +
                          ", outside [0, model.num_labels=" + std::to_string(opts.num_labels) + ")");
      }
    }
  }
  std::vector<int32_t> ids(rows.ids.begin(), rows.ids.end());
  // One "window" of T+1 tokens per row for FromTokens' counting; Next reads rows instead.
  const int64_t n = rows.rows();
  ids.resize(static_cast<size_t>(n * opts.T + 1), 0);
  L2L_ASSIGN_OR_RETURN(DataLoader d, FromTokens(std::move(ids), opts, path));
  d.tokens_.resize(static_cast<size_t>(n * opts.T));
  d.rows_ = true;
  d.types_ = std::move(rows.type_ids);
  d.attn_ = std::move(rows.attention);
  d.labels_ = std::move(rows.labels);
  return d;
}

void MaskMlmRow(const MlmConfig& mlm, int64_t vocab_size, uint64_t seed, int64_t epoch, int64_t row,
                const int32_t* ids, const uint8_t* attn, int64_t T, int32_t* inputs, int32_t* targets) {
  const uint64_t key = SplitMix64(SplitMix64(SplitMix64(seed) ^ 0x6D6C6D5F6D61736Bull) + static_cast<uint64_t>(epoch));
  const uint64_t row_key = SplitMix64(key ^ SplitMix64(static_cast<uint64_t>(row)));
  // A uniform double in [0, 1) from 53 bits.
  auto uniform = [](uint64_t r) { return static_cast<double>(r >> 11) * (1.0 / 9007199254740992.0); };
  const uint64_t words = static_cast<uint64_t>(vocab_size - mlm.first_word_id);
  for (int64_t t = 0; t < T; ++t) {
    inputs[t] = ids[t];
    targets[t] = kernels::kIgnoreTarget;
    if (attn[t] == 0 || ids[t] < mlm.first_word_id) continue;
    const uint64_t base = row_key + 3 * static_cast<uint64_t>(t);
    if (!(uniform(SplitMix64(base)) < mlm.probability)) continue;
    targets[t] = ids[t];
    const double how = uniform(SplitMix64(base + 1));
    if (how < 0.8) {
      inputs[t] = static_cast<int32_t>(mlm.mask_id);
    } else if (how < 0.9) {
      const uint64_t r = SplitMix64(base + 2);
      inputs[t] = static_cast<int32_t>(mlm.first_word_id +
                                       static_cast<int64_t>((static_cast<unsigned __int128>(r) * words) >> 64));
    }
  }
}

double DataLoader::trained_fraction() const {
  if (mask_.empty()) return 1.0;
  int64_t ones = 0;
  for (uint8_t m : mask_) ones += m;
  return static_cast<double>(ones) / static_cast<double>(mask_.size());
}

Result<DataLoader> DataLoader::FromTokens(std::vector<int32_t> tokens, const DataLoaderOptions& opts,
                                          const std::string& origin, std::vector<uint8_t> mask) {
  if (!mask.empty() && mask.size() != tokens.size()) {
    return InvalidArgument(origin + ": loss mask has " + std::to_string(mask.size()) + " entries for " +
                           std::to_string(tokens.size()) + " tokens");
  }
  if (opts.B <= 0 || opts.T <= 0) {
    return InvalidArgument(origin + ": micro-batch shape B=" + std::to_string(opts.B) + " T=" +
                           std::to_string(opts.T) + " must be positive");
  }
  if (opts.world <= 0 || opts.rank < 0 || opts.rank >= opts.world) {
    return InvalidArgument(origin + ": data shard rank=" + std::to_string(opts.rank) + " of world=" +
                           std::to_string(opts.world) + " is invalid (need 0 <= rank < world)");
  }
  if (opts.vocab_size > 0) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= opts.vocab_size) {
        return OutOfRange(origin + ": token " + std::to_string(i) + " has id " + std::to_string(tokens[i]) +
                          ", outside [0, model.vocab_size=" + std::to_string(opts.vocab_size) + ")");
      }
    }
  }
  DataLoader d;
  d.opts_ = opts;
  d.tokens_ = std::move(tokens);
  d.mask_ = std::move(mask);
  const int64_t n = static_cast<int64_t>(d.tokens_.size());
  d.num_windows_ = n > 0 ? (n - 1) / opts.T : 0;
  d.per_rank_ = d.num_windows_ / opts.world;
  d.batches_per_epoch_ = d.per_rank_ / opts.B;
  if (d.batches_per_epoch_ == 0) {
    return InvalidArgument(origin + ": " + std::to_string(n) + " tokens make " + std::to_string(d.num_windows_) +
                           " windows of T+1=" + std::to_string(opts.T + 1) + " tokens; a micro-batch of B=" +
                           std::to_string(opts.B) + " for each of " + std::to_string(opts.world) +
                           " shard(s) needs at least " + std::to_string(opts.B * opts.world * opts.T + 1) +
                           " tokens");
  }
  d.Shuffle(0);
  return d;
}

void DataLoader::Shuffle(int64_t epoch) {
  if (order_epoch_ == epoch) return;
  order_.resize(static_cast<size_t>(num_windows_));
  for (int64_t i = 0; i < num_windows_; ++i) order_[static_cast<size_t>(i)] = i;
  if (opts_.shuffle) {
    // Fisher-Yates driven by a counter-based generator keyed on (seed, epoch): the same
    // on every platform (no std::shuffle / distributions, which are implementation defined).
    const uint64_t key = SplitMix64(SplitMix64(opts_.seed) ^ SplitMix64(0xD1B54A32D192ED03ull + epoch));
    for (int64_t i = num_windows_ - 1; i > 0; --i) {
      const uint64_t r = SplitMix64(key ^ SplitMix64(static_cast<uint64_t>(i)));
      // Multiply-shift maps r uniformly enough onto [0, i] (bias < 2^-40 for our sizes).
      const int64_t j = static_cast<int64_t>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(i + 1)) >> 64);
      std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(j)]);
    }
  }
  order_epoch_ = epoch;
}

MicroBatch DataLoader::Next() {
  if (pos_.batch >= batches_per_epoch_) {
    ++pos_.epoch;
    pos_.batch = 0;
  }
  Shuffle(pos_.epoch);
  const int64_t B = opts_.B, T = opts_.T;
  MicroBatch mb;
  mb.B = B;
  mb.T = T;
  mb.inputs.resize(static_cast<size_t>(B * T));
  mb.targets.resize(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    // This rank's i-th window of the epoch is order_[i * world + rank].
    const int64_t i = pos_.batch * B + b;
    const int64_t window = order_[static_cast<size_t>(i * opts_.world + opts_.rank)];
    if (rows_) {
      FillRow(window, b, &mb);
      continue;
    }
    const int32_t* src = tokens_.data() + window * T;
    std::copy(src, src + T, mb.inputs.begin() + b * T);
    std::copy(src + 1, src + T + 1, mb.targets.begin() + b * T);
    if (!mask_.empty()) {
      const uint8_t* m = mask_.data() + window * T + 1;  // mask of each target token
      for (int64_t t = 0; t < T; ++t) {
        if (m[t] == 0) mb.targets[static_cast<size_t>(b * T + t)] = kernels::kIgnoreTarget;
      }
    }
  }
  ++pos_.batch;
  return mb;
}

void DataLoader::FillRow(int64_t row, int64_t b, MicroBatch* mb) const {
  const int64_t T = opts_.T;
  const size_t at = static_cast<size_t>(row * T), out = static_cast<size_t>(b * T);
  if (mb->token_types.empty()) {
    mb->token_types.resize(mb->inputs.size());
    mb->attention_mask.resize(mb->inputs.size());
  }
  std::copy(types_.begin() + at, types_.begin() + at + T, mb->token_types.begin() + out);
  std::copy(attn_.begin() + at, attn_.begin() + at + T, mb->attention_mask.begin() + out);
  switch (opts_.task) {
    case Task::kClassify:
      std::copy(tokens_.begin() + at, tokens_.begin() + at + T, mb->inputs.begin() + out);
      std::fill(mb->targets.begin() + out, mb->targets.begin() + out + T, kernels::kIgnoreTarget);
      mb->targets[out] = labels_[static_cast<size_t>(row)];
      break;
    case Task::kMlm:
      MaskMlmRow(opts_.mlm, opts_.vocab_size, opts_.seed, pos_.epoch, row, tokens_.data() + at, attn_.data() + at, T,
                 mb->inputs.data() + out, mb->targets.data() + out);
      break;
    case Task::kLm:
      L2L_CHECK(false) << "rows mode with task lm";
      break;
  }
}

std::vector<MicroBatch> DataLoader::NextMany(int64_t m) {
  std::vector<MicroBatch> out;
  out.reserve(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) out.push_back(Next());
  return out;
}

Status DataLoader::Seek(const DataPosition& pos) {
  if (pos.epoch < 0 || pos.batch < 0 || pos.batch > batches_per_epoch_) {
    return OutOfRange("data position " + pos.ToString() + " is outside this shard (" +
                      std::to_string(batches_per_epoch_) + " micro-batches per epoch)");
  }
  pos_ = pos;
  return Status::Ok();
}

Status CheckSequenceInputs(const ModelSpec& spec, const MicroBatch& mb, const std::string& where) {
  const size_t n = static_cast<size_t>(mb.B * mb.T);
  const bool encoder = models::IsEncoder(spec);
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<int32_t>*>{"token_types", &mb.token_types},
                                {"attention_mask", &mb.attention_mask}}) {
    if (v->empty()) continue;
    if (!encoder) {
      return InvalidArgument(where + ": " + name + " given, but model.family=" + ToString(spec.family) +
                             " does not read it (only bert does)");
    }
    if (v->size() != n) {
      return InvalidArgument(where + ": expected " + std::to_string(n) + " " + name + " (B*T), got " +
                             std::to_string(v->size()));
    }
  }
  for (size_t i = 0; i < mb.token_types.size(); ++i) {
    if (mb.token_types[i] < 0 || mb.token_types[i] >= spec.type_vocab_size) {
      return OutOfRange(where + ": token type " + std::to_string(mb.token_types[i]) + " at position " +
                        std::to_string(i) + " is outside [0, model.type_vocab_size=" +
                        std::to_string(spec.type_vocab_size) + ")");
    }
  }
  if (!mb.attention_mask.empty()) {
    for (int64_t b = 0; b < mb.B; ++b) {
      bool any = false;
      for (int64_t t = 0; t < mb.T; ++t) {
        const int32_t m = mb.attention_mask[static_cast<size_t>(b * mb.T + t)];
        if (m != 0 && m != 1) {
          return InvalidArgument(where + ": attention_mask " + std::to_string(m) + " at position " +
                                 std::to_string(b * mb.T + t) + " is neither 0 nor 1");
        }
        any |= m == 1;
      }
      if (!any) return InvalidArgument(where + ": sequence " + std::to_string(b) + " is all padding (attention_mask 0)");
    }
  }
  if (encoder && spec.num_labels > 0) {
    for (int64_t b = 0; b < mb.B; ++b) {
      for (int64_t t = 0; t < mb.T; ++t) {
        const int32_t y = mb.targets[static_cast<size_t>(b * mb.T + t)];
        const bool ok = y == kernels::kIgnoreTarget || (t == 0 && y >= 0 && y < spec.num_labels);
        if (!ok) {
          return OutOfRange(where + ": sequence " + std::to_string(b) + " position " + std::to_string(t) +
                            " has target " + std::to_string(y) + "; a classification model (num_labels=" +
                            std::to_string(spec.num_labels) +
                            ") takes the label at position 0 in [0, num_labels) and -1 elsewhere");
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace l2l::worker
