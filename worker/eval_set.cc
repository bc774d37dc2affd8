// The held-out windows of in-job validation. See worker/eval_set.h.
#include "worker/eval_set.h"

#include <filesystem>
#include <string>

#include "common/formats/tokens_file.h"
#include "kernels/backend.h"  // kIgnoreTarget

namespace l2l::worker {

int64_t ScoredTargets(const MicroBatch& mb) {
  int64_t n = 0;
  for (int32_t t : mb.targets) n += t == kernels::kIgnoreTarget ? 0 : 1;
  return n;
}

Result<EvalSet> EvalSet::Load(const JobConfig& job, int64_t rank, int64_t world) {
  L2L_CHECK(job.eval.enabled()) << "EvalSet::Load without an eval section";
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgument("eval: data rank " + std::to_string(rank) + " of " + std::to_string(world));
  }
  L2L_RETURN_IF_ERROR(CheckEvalData(job));
  const std::string& path = job.eval.data_path;
  L2L_ASSIGN_OR_RETURN(TokensFile file, TokensFile::Open(path));
  std::vector<uint8_t> mask;
  const std::string mask_path = LossMaskPath(path);
  std::error_code ec;
  if (std::filesystem::exists(mask_path, ec)) {
    L2L_ASSIGN_OR_RETURN(mask, ReadLossMaskFile(mask_path, static_cast<int64_t>(file.size())));
  }
  const int64_t B = job.train.micro_batch_size, T = job.seq_len();
  EvalSet s;
  s.windows = job.eval.windows(T);
  const int64_t groups = job.eval.micro_batches(B, T);
  for (int64_t j = rank; j < groups; j += world) {
    MicroBatch mb;
    mb.B = B;
    mb.T = T;
    mb.inputs.assign(static_cast<size_t>(B * T), 0);
    mb.targets.assign(static_cast<size_t>(B * T), kernels::kIgnoreTarget);
    for (int64_t b = 0; b < B && j * B + b < s.windows; ++b) {
      const int64_t start = (j * B + b) * T;
      for (int64_t k = 0; k < T; ++k) {
        const size_t i = static_cast<size_t>(b * T + k);
        const size_t at = static_cast<size_t>(start + k);
        mb.inputs[i] = static_cast<int32_t>(file.token(at));
        if (mask.empty() || mask[at + 1] != 0) mb.targets[i] = static_cast<int32_t>(file.token(at + 1));
      }
    }
    s.scored += ScoredTargets(mb);
    s.micro_batches.push_back(std::move(mb));
  }
  return s;
}

}  // namespace l2l::worker
