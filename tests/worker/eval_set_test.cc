// worker/eval_set.h: the eval windows are l2l-eval's (windows of T+1 starting at
// multiples of T over the first eval.tokens tokens), the last micro-batch is padded with
// ignored rows, a loss mask ignores its targets, and the shares of n workers are disjoint
// and together hold every window once.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/formats/tokens_file.h"
#include "kernels/backend.h"
#include "tests/common/temp_dir.h"
#include "worker/eval_set.h"

namespace l2l::worker {
namespace {

JobConfig EvalJob(const std::string& path, int64_t tokens) {
  JobConfig job;
  job.model.vocab_size = 1000;
  job.model.seq_len = 8;
  job.model.d_model = 16;
  job.model.n_layer = 1;
  job.model.n_head = 2;
  job.model.d_ff = 32;
  job.train.micro_batch_size = 2;
  job.train.micro_batches = 1;
  job.eval.data_path = path;
  job.eval.every = 1;
  job.eval.tokens = tokens;
  return job;
}

}  // namespace

TEST_CASE("EvalSet cuts l2l-eval's windows, pads the last micro-batch and splits them over workers",
          "[worker][eval]") {
  testing::TempDir dir;
  std::vector<uint16_t> toks(200);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i);  // id = position
  const std::string path = dir.File("val.bin");
  REQUIRE(WriteTokensFile(path, toks).ok());
  std::vector<uint8_t> mask(toks.size(), 1);
  mask[9] = 0;  // the target of window 1's first input (position 8)
  REQUIRE(WriteLossMaskFile(LossMaskPath(path), mask).ok());
  // 5*8+1 = 41 tokens: 5 windows of 9, micro-batches {0,1} {2,3} {4, padding}.
  const JobConfig job = EvalJob(path, 41);
  REQUIRE(job.Validate().ok());

  auto one = EvalSet::Load(job, 0, 1);
  INFO(one.status().ToString());
  REQUIRE(one.ok());
  CHECK(one->windows == 5);
  REQUIRE(one->micro_batches.size() == 3);
  CHECK(one->scored == 5 * 8 - 1);
  for (size_t j = 0; j < 3; ++j) {
    const MicroBatch& mb = one->micro_batches[j];
    REQUIRE(mb.B == 2);
    REQUIRE(mb.T == 8);
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t w = static_cast<int64_t>(j) * 2 + b;
      for (int64_t k = 0; k < 8; ++k) {
        const size_t i = static_cast<size_t>(b * 8 + k);
        if (w >= 5) {  // padding row: nothing scored
          CHECK(mb.targets[i] == kernels::kIgnoreTarget);
          continue;
        }
        CHECK(mb.inputs[i] == w * 8 + k);
        const int32_t want = (w * 8 + k + 1 == 9) ? kernels::kIgnoreTarget : static_cast<int32_t>(w * 8 + k + 1);
        CHECK(mb.targets[i] == want);
      }
    }
  }

  // Two workers: micro-batch j to rank j % 2; together every window exactly once.
  auto r0 = EvalSet::Load(job, 0, 2), r1 = EvalSet::Load(job, 1, 2);
  REQUIRE(r0.ok());
  REQUIRE(r1.ok());
  REQUIRE(r0->micro_batches.size() == 2);
  REQUIRE(r1->micro_batches.size() == 1);
  CHECK(r0->micro_batches[0].inputs == one->micro_batches[0].inputs);
  CHECK(r1->micro_batches[0].inputs == one->micro_batches[1].inputs);
  CHECK(r0->micro_batches[1].targets == one->micro_batches[2].targets);
  CHECK(r0->scored + r1->scored == one->scored);

  // Four workers: the fourth gets no micro-batch (there are three).
  auto r3 = EvalSet::Load(job, 3, 4);
  REQUIRE(r3.ok());
  CHECK(r3->micro_batches.empty());
  CHECK(r3->scored == 0);
}

TEST_CASE("EvalSet refuses a file the job cannot score, naming eval.data", "[worker][eval]") {
  testing::TempDir dir;
  std::vector<uint16_t> toks(50, 7);
  toks[20] = 1000;  // outside vocab_size 1000
  const std::string path = dir.File("val.bin");
  REQUIRE(WriteTokensFile(path, toks).ok());
  auto bad = EvalSet::Load(EvalJob(path, 41), 0, 1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("eval.data=" + path) != std::string::npos);
  CHECK(bad.status().message().find("token 20 is id 1000") != std::string::npos);
  auto missing = EvalSet::Load(EvalJob(dir.File("gone.bin"), 41), 0, 1);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find("no such file") != std::string::npos);
  CHECK_FALSE(EvalSet::Load(EvalJob(path, 17), 2, 2).ok());  // rank outside [0, world)
}

}  // namespace l2l::worker
