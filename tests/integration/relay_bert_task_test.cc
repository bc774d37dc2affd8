// The real l2l-eps + l2l-worker processes on BERT rows tasks: task classify (rows with
// padding, token types, a label per row) and task mlm (the same rows masked by the worker's
// data loader) train exactly like the reference trainer fed by the same loader, with one
// worker and with two (each reading its own shard), so the workers' data path (rows files,
// sharding, masking seeded by seed/epoch/row) is the one the oracle uses.
#include <catch2/catch.hpp>

#include "common/formats/rows_file.h"
#include "tests/integration/relay_util.h"

namespace l2l::itest {
namespace {

using namespace relay;  // tests/integration/relay_util.h

// 48 rows of T tokens: [CLS]=2 words [SEP]=3 then [PAD]=0, lengths 5..T, pairs on odd rows.
ClassifyRows BertRows(int64_t T, int64_t vocab) {
  ClassifyRows rows;
  rows.max_len = T;
  rows.num_classes = 3;
  uint64_t x = 99;
  for (int64_t r = 0; r < 48; ++r) {
    const int64_t len = 5 + r % (T - 4);
    for (int64_t t = 0; t < T; ++t) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      uint32_t id = 0;
      if (t == 0) id = 2;
      else if (t == len - 1) id = 3;
      else if (t < len - 1) id = static_cast<uint32_t>(5 + (x >> 33) % static_cast<uint64_t>(vocab - 5));
      rows.ids.push_back(id);
      rows.type_ids.push_back(r % 2 == 1 && t < len && t >= len / 2 ? 1 : 0);
      rows.attention.push_back(t < len ? 1 : 0);
    }
    rows.labels.push_back(static_cast<int32_t>((r * 7) % 3));
  }
  return rows;
}

TEST_CASE("l2l-eps + l2l-worker train BERT classify and mlm rows like the reference trainer",
          "[integration][relay][bert]") {
  const Task task = GENERATE(Task::kClassify, Task::kMlm);
  const int workers = GENERATE(1, 2);
  INFO("task " << ToString(task) << ", " << workers << " worker(s)");
  Run r = Prepare(std::string("bert-") + ToString(task));
  JobConfig& job = r.job;
  job.model.family = ModelFamily::kBert;
  job.model.n_layer = 2;
  job.model.num_labels = task == Task::kClassify ? 3 : 0;
  job.model.tied_embeddings = task == Task::kMlm;
  job.task = task;
  job.mlm.mask_id = 4;
  job.mlm.first_word_id = 5;
  job.mlm.probability = 0.3;
  job.train.micro_batch_size = 4;
  job.train.micro_batches = 2;
  job.data.train_path = r.dir->File("rows.bin");
  REQUIRE(WriteClassifyFiles(job.data.train_path, BertRows(job.seq_len(), job.model.vocab_size), 0, 48,
                             job.model.vocab_size).ok());
  REQUIRE(job.Validate().ok());
  DaemonOptions o;
  o.workers = workers;
  auto eps = EpsDaemon::Start(job, o, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  const std::vector<std::string> logs = RunWorkers(**eps, *r.dir, workers);
  for (const std::string& log : logs) REQUIRE(ParseProgress(log).size() == static_cast<size_t>(job.train.steps));
  RequireClose(job, Exported(**eps, job.model), Reference(job, workers));
  REQUIRE((*eps)->Shutdown().ok());
  CHECK((*eps)->ShmSegments().empty());
}

}  // namespace
}  // namespace l2l::itest
