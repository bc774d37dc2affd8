// Shared by the BERT GPU tests (bert_test.cc, bert_train_test.cc): the small BERT they
// run. Thread-safety: test-only, single-threaded.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>

#include "common/model_spec.h"

namespace l2l::gpu_test {

// A small BERT: V 96, T 32, C 48 in 4 heads, F 96, 2 blocks; num_labels 0 = the masked-LM
// head (tied decoder), > 0 = classification.
inline ModelSpec SmallBert(int64_t num_labels) {
  ModelSpec s;
  s.family = ModelFamily::kBert;
  s.vocab_size = 96;
  s.seq_len = 32;
  s.d_model = 48;
  s.n_layer = 2;
  s.n_head = 4;
  s.d_ff = 96;
  s.type_vocab_size = 2;
  s.layer_norm_eps = 1e-12;
  s.num_labels = num_labels;
  s.tied_embeddings = num_labels == 0;
  INFO(s.Validate().ToString());
  REQUIRE(s.Validate().ok());
  return s;
}

}  // namespace l2l::gpu_test
