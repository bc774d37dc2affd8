// See batches.h.
#include "tests/testing/batches.h"

#include <utility>

namespace l2l::testing {

std::vector<worker::MicroBatch> LcgBatches(const JobConfig& job, uint64_t seed, int32_t target_mul,
                                           int32_t target_add) {
  std::vector<worker::MicroBatch> out;
  uint64_t x = seed;
  const auto V = static_cast<int32_t>(job.model.vocab_size);
  for (int64_t u = 0; u < job.train.micro_batches; ++u) {
    worker::MicroBatch mb;
    mb.B = job.train.micro_batch_size;
    mb.T = job.seq_len();
    for (int64_t i = 0; i < mb.B * mb.T; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const auto a = static_cast<int32_t>((x >> 33) % job.model.vocab_size);
      mb.inputs.push_back(a);
      mb.targets.push_back((a * target_mul + target_add) % V);
    }
    out.push_back(std::move(mb));
  }
  return out;
}

}  // namespace l2l::testing
