// EvalSet: the held-out micro-batches one worker scores for a job's in-job validation
// (`eval: {data, every, tokens}`, common/config.h EvalConfig).
//
// The first eval.tokens tokens of eval.data are cut exactly as l2l-eval cuts its data
// (tools/eval_main.cc): windows of T+1 tokens (T = the job's seq_len) starting at
// multiples of T, in file order, W = (tokens-1)/T of them; B consecutive windows make a
// micro-batch (B = train.micro_batch_size), the last one padded with rows whose targets
// are all kernels::kIgnoreTarget when B does not divide W. A "<data>.mask" loss mask
// beside the file turns the targets whose mask byte is 0 into kIgnoreTarget, as training
// does. Micro-batch j goes to the worker with data rank j % world, so the workers of a
// step score disjoint windows that together are every window; the daemon's average,
// weighted by each worker's scored-target count, is then l2l-eval's loss on the same
// weights. The windows never change with the step, so values compare across steps and
// across a resume.
//
// Ownership: a value (host vectors). Thread-safety: none needed (built once, read-only).
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/data_loader.h"  // MicroBatch

namespace l2l::worker {

struct EvalSet {
  std::vector<MicroBatch> micro_batches;  // this worker's share, each (B, T)
  int64_t windows = 0;                    // W over all workers
  int64_t scored = 0;                     // targets this worker's share scores

  // Reads job.eval (REQUIRES: job.eval.enabled()); rank in [0, world). Errors name
  // eval.data and what is wrong with it (CheckEvalData's checks).
  static Result<EvalSet> Load(const JobConfig& job, int64_t rank, int64_t world);
};

// Targets of `mb` that count in the loss (not kernels::kIgnoreTarget).
int64_t ScoredTargets(const MicroBatch& mb);

}  // namespace l2l::worker
