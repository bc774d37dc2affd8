// Shared by the BERT GPU tests (bert_test.cc, bert_train_test.cc): the small BERT they
// run. Thread-safety: test-only, single-threaded.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>

#include "common/model_spec.h"
#include "tests/testing/jobs.h"

namespace l2l::gpu_test {

// A small BERT: V 96, T 32, C 48 in 4 heads, F 96, 2 blocks; num_labels 0 = the masked-LM
// head (tied decoder), > 0 = classification.
inline ModelSpec SmallBert(int64_t num_labels) {
  ModelSpec s = testing::BertModel({96, 32, 48, 2, 4, 96}, num_labels);
  INFO(s.Validate().ToString());
  REQUIRE(s.Validate().ok());
  return s;
}

}  // namespace l2l::gpu_test
