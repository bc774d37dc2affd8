// Tests for the DataLoader's rows tasks (worker/data_loader.h): classify fills token types,
// attention mask and the label at position 0; shards are disjoint and a resume replays the
// same rows; mlm masks only word tokens, about 15% of them with the 80/10/10 split, the
// same positions on every rank and after a resume; bad rows files are refused by name.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/formats/rows_file.h"
#include "kernels/backend.h"
#include "tests/common/temp_dir.h"
#include "worker/data_loader.h"

namespace l2l::worker {
namespace {

using testing::TempDir;

constexpr int64_t kL = 16, kVocab = 2000;

// Row r: [CLS]=101, words 1000 + (r * 7 + t) % 900 for t in [1, len), [SEP]=102, then [PAD]=0;
// len = 6 + r % 9; the second half of the real tokens has type 1; label r % 3.
ClassifyRows MakeRows(int64_t n) {
  ClassifyRows rows;
  rows.max_len = kL;
  rows.num_classes = 3;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t len = 6 + r % 9;
    for (int64_t t = 0; t < kL; ++t) {
      uint32_t id = 0;
      if (t == 0) id = 101;
      else if (t == len - 1) id = 102;
      else if (t < len - 1) id = static_cast<uint32_t>(1000 + (r * 7 + t) % 900);
      rows.ids.push_back(id);
      rows.type_ids.push_back(t < len && t >= len / 2 ? 1 : 0);
      rows.attention.push_back(t < len ? 1 : 0);
    }
    rows.labels.push_back(static_cast<int32_t>(r % 3));
  }
  return rows;
}

std::string WriteRows(const TempDir& dir, const ClassifyRows& rows) {
  const std::string path = dir.File("rows.bin");
  REQUIRE(WriteClassifyFiles(path, rows, 0, rows.rows(), kVocab).ok());
  return path;
}

DataLoaderOptions Opts(Task task) {
  DataLoaderOptions o;
  o.B = 4;
  o.T = kL;
  o.seed = 77;
  o.vocab_size = kVocab;
  o.task = task;
  o.num_labels = 3;
  return o;
}

DataLoader OpenOk(const std::string& path, const DataLoaderOptions& o) {
  Result<DataLoader> d = DataLoader::OpenForTask(path, o);
  INFO(d.status().ToString());
  REQUIRE(d.ok());
  return std::move(d).value();
}

// The row a classify sequence came from: its ids are unique per row.
int64_t RowOf(const ClassifyRows& rows, const MicroBatch& mb, int64_t b) {
  for (int64_t r = 0; r < rows.rows(); ++r) {
    bool same = true;
    for (int64_t t = 0; t < kL && same; ++t) {
      same = rows.ids[static_cast<size_t>(r * kL + t)] == static_cast<uint32_t>(mb.inputs[static_cast<size_t>(b * kL + t)]);
    }
    if (same && rows.labels[static_cast<size_t>(r)] == mb.targets[static_cast<size_t>(b * kL)]) return r;
  }
  return -1;
}

TEST_CASE("task classify yields rows with types, attention and the label at position 0", "[data_loader][task]") {
  TempDir dir;
  const ClassifyRows rows = MakeRows(40);
  DataLoader d = OpenOk(WriteRows(dir, rows), Opts(Task::kClassify));
  CHECK(d.num_windows() == 40);
  CHECK(d.batches_per_epoch() == 10);
  std::set<int64_t> seen;
  for (int64_t k = 0; k < d.batches_per_epoch(); ++k) {
    const MicroBatch mb = d.Next();
    REQUIRE(mb.token_types.size() == static_cast<size_t>(4 * kL));
    REQUIRE(mb.attention_mask.size() == static_cast<size_t>(4 * kL));
    for (int64_t b = 0; b < 4; ++b) {
      const int64_t r = RowOf(rows, mb, b);
      REQUIRE(r >= 0);
      seen.insert(r);
      for (int64_t t = 0; t < kL; ++t) {
        const size_t i = static_cast<size_t>(b * kL + t), j = static_cast<size_t>(r * kL + t);
        CHECK(mb.token_types[i] == rows.type_ids[j]);
        CHECK(mb.attention_mask[i] == rows.attention[j]);
        if (t > 0) CHECK(mb.targets[i] == kernels::kIgnoreTarget);
      }
    }
  }
  CHECK(seen.size() == 40);  // each row once per epoch
}

TEST_CASE("task classify shards are disjoint and a resume replays the same rows", "[data_loader][task]") {
  TempDir dir;
  const ClassifyRows rows = MakeRows(48);
  const std::string path = WriteRows(dir, rows);
  std::set<int64_t> all;
  for (int64_t rank = 0; rank < 3; ++rank) {
    DataLoaderOptions o = Opts(Task::kClassify);
    o.rank = rank;
    o.world = 3;
    DataLoader d = OpenOk(path, o);
    for (int64_t k = 0; k < d.batches_per_epoch(); ++k) {
      const MicroBatch mb = d.Next();
      for (int64_t b = 0; b < 4; ++b) CHECK(all.insert(RowOf(rows, mb, b)).second);
    }
  }
  CHECK(all.size() == 48);

  DataLoader a = OpenOk(path, Opts(Task::kClassify));
  a.NextMany(13);  // into the second epoch
  const DataPosition pos = a.position();
  const MicroBatch want = a.Next();
  DataLoader b = OpenOk(path, Opts(Task::kClassify));
  REQUIRE(b.Seek(pos).ok());
  const MicroBatch got = b.Next();
  CHECK(got.inputs == want.inputs);
  CHECK(got.targets == want.targets);
  CHECK(got.token_types == want.token_types);
}

TEST_CASE("task mlm masks word tokens only, about 15% with 80/10/10, the same everywhere", "[data_loader][task]") {
  MlmConfig mlm;  // BERT's ids: [MASK] 103, words from 999
  const ClassifyRows rows = MakeRows(2000);
  int64_t candidates = 0, chosen = 0, masked = 0, random = 0, kept = 0;
  std::vector<int32_t> in(kL), tg(kL), in2(kL), tg2(kL);
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const int32_t* ids = reinterpret_cast<const int32_t*>(rows.ids.data()) + r * kL;
    const uint8_t* attn = rows.attention.data() + r * kL;
    MaskMlmRow(mlm, kVocab, 77, 0, r, ids, attn, kL, in.data(), tg.data());
    MaskMlmRow(mlm, kVocab, 77, 0, r, ids, attn, kL, in2.data(), tg2.data());
    CHECK(in == in2);  // a pure function of (seed, epoch, row)
    CHECK(tg == tg2);
    for (int64_t t = 0; t < kL; ++t) {
      const bool word = attn[t] == 1 && ids[t] >= 999;
      candidates += word;
      if (tg[static_cast<size_t>(t)] == kernels::kIgnoreTarget) {
        CHECK(in[static_cast<size_t>(t)] == ids[t]);
        continue;
      }
      REQUIRE(word);  // never [CLS], [SEP] or [PAD]
      CHECK(tg[static_cast<size_t>(t)] == ids[t]);
      ++chosen;
      const int32_t x = in[static_cast<size_t>(t)];
      if (x == 103) ++masked;
      else if (x == ids[t]) ++kept;
      else {
        ++random;
        CHECK(x >= 999);
        CHECK(x < kVocab);
      }
    }
  }
  const double p = static_cast<double>(chosen) / static_cast<double>(candidates);
  INFO("candidates " << candidates << " chosen " << chosen << " mask " << masked << " random " << random << " kept " << kept);
  CHECK(p > 0.14);
  CHECK(p < 0.16);
  CHECK(static_cast<double>(masked) / chosen == Approx(0.8).margin(0.03));
  CHECK(static_cast<double>(random) / chosen == Approx(0.1).margin(0.02));
  CHECK(static_cast<double>(kept) / chosen == Approx(0.1).margin(0.02));
  // Another epoch masks the row afresh.
  const int32_t* ids = reinterpret_cast<const int32_t*>(rows.ids.data());
  int64_t differ = 0;
  for (int64_t r = 0; r < 50; ++r) {
    MaskMlmRow(mlm, kVocab, 77, 0, r, ids + r * kL, rows.attention.data() + r * kL, kL, in.data(), tg.data());
    MaskMlmRow(mlm, kVocab, 77, 1, r, ids + r * kL, rows.attention.data() + r * kL, kL, in2.data(), tg2.data());
    differ += tg != tg2;
  }
  CHECK(differ > 10);
}

TEST_CASE("task mlm batches agree across world sizes and a resume", "[data_loader][task]") {
  TempDir dir;
  const ClassifyRows rows = MakeRows(32);
  const std::string path = WriteRows(dir, rows);
  // The masking of a row depends on the row and epoch only: one rank of one and rank 1
  // of two see the same row masked the same way.
  auto masked_rows = [&](int64_t world, int64_t rank) {
    DataLoaderOptions o = Opts(Task::kMlm);
    o.world = world;
    o.rank = rank;
    DataLoader d = OpenOk(path, o);
    std::map<std::vector<int32_t>, std::vector<int32_t>> by_targets;  // targets+ids -> inputs
    for (int64_t k = 0; k < d.batches_per_epoch(); ++k) {
      const MicroBatch mb = d.Next();
      for (int64_t b = 0; b < mb.B; ++b) {
        std::vector<int32_t> key(mb.attention_mask.begin() + b * kL, mb.attention_mask.begin() + (b + 1) * kL);
        key.insert(key.end(), mb.targets.begin() + b * kL, mb.targets.begin() + (b + 1) * kL);
        // the unmasked ids identify the row: reconstruct them from inputs and targets
        for (int64_t t = 0; t < kL; ++t) {
          const int32_t y = mb.targets[static_cast<size_t>(b * kL + t)];
          key.push_back(y == kernels::kIgnoreTarget ? mb.inputs[static_cast<size_t>(b * kL + t)] : y);
        }
        by_targets[key] = std::vector<int32_t>(mb.inputs.begin() + b * kL, mb.inputs.begin() + (b + 1) * kL);
      }
    }
    return by_targets;
  };
  const auto one = masked_rows(1, 0);
  const auto r1 = masked_rows(2, 1);
  REQUIRE(r1.size() == 16);
  for (const auto& [key, inputs] : r1) {
    auto it = one.find(key);
    REQUIRE(it != one.end());
    CHECK(it->second == inputs);
  }

  DataLoader a = OpenOk(path, Opts(Task::kMlm));
  a.NextMany(11);
  const DataPosition pos = a.position();
  const MicroBatch want = a.Next();
  DataLoader b = OpenOk(path, Opts(Task::kMlm));
  REQUIRE(b.Seek(pos).ok());
  const MicroBatch got = b.Next();
  CHECK(got.inputs == want.inputs);
  CHECK(got.targets == want.targets);
}

TEST_CASE("Rows files that do not fit the job are refused by name", "[data_loader][task][errors]") {
  TempDir dir;
  const std::string path = WriteRows(dir, MakeRows(12));
  DataLoaderOptions o = Opts(Task::kClassify);
  o.T = 8;
  Result<DataLoader> d = DataLoader::OpenForTask(path, o);
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("L=16") != std::string::npos);
  CHECK(d.status().message().find("train.seq_len") != std::string::npos);

  o = Opts(Task::kClassify);
  o.num_labels = 2;
  d = DataLoader::OpenForTask(path, o);
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("rows.bin.labels") != std::string::npos);
  CHECK(d.status().message().find("num_labels=2") != std::string::npos);

  d = DataLoader::OpenForTask(dir.File("missing.bin"), Opts(Task::kClassify));
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("missing.bin") != std::string::npos);
  CHECK(d.status().message().find("l2l-tokenize --task classify") != std::string::npos);
}

}  // namespace
}  // namespace l2l::worker
