// Batch makers for tests: deterministic micro-batches without a tokens file.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "worker/data_loader.h"

namespace l2l::testing {

// job.train.micro_batches micro-batches of (micro_batch_size, seq_len()) tokens drawn
// from a 64-bit LCG started at `seed`; each target is (input * target_mul + target_add)
// mod V, a mapping the model can learn, so losses fall.
std::vector<worker::MicroBatch> LcgBatches(const JobConfig& job, uint64_t seed, int32_t target_mul,
                                           int32_t target_add);

}  // namespace l2l::testing
