// The encoder family's per-micro-batch inputs through the reference trainer: absent token
// types equal explicit type 0 and an absent attention mask equals an all-ones one; padding
// changes the loss of the real tokens (the mask reaches every block); bad token types,
// masks and classification labels, and either array given to a decoder, are refused with
// messages naming them.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "common/config.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::worker {
namespace {

JobConfig BertJob(int64_t num_labels) {
  JobConfig job;
  job.model.family = ModelFamily::kBert;
  job.model.vocab_size = 40;
  job.model.seq_len = 12;
  job.model.d_model = 16;
  job.model.n_layer = 2;
  job.model.n_head = 2;
  job.model.d_ff = 24;
  job.model.num_labels = num_labels;
  job.model.tied_embeddings = num_labels == 0;
  job.train.micro_batch_size = 2;
  job.train.seq_len = 10;
  return job;
}

MicroBatch Batch(const JobConfig& job) {
  MicroBatch mb;
  mb.B = 2;
  mb.T = 10;
  for (int i = 0; i < 20; ++i) {
    mb.inputs.push_back((i * 7 + 3) % 40);
    const bool label_pos = i % 10 == 0;
    mb.targets.push_back(job.model.num_labels > 0 ? (label_pos ? (i / 10) % 2 : -1) : (i % 3 == 0 ? (i * 5) % 40 : -1));
  }
  return mb;
}

struct Result2 {
  float loss;
  std::vector<std::vector<float>> grads;
};

Result2 Run(const JobConfig& job, const MicroBatch& mb) {
  auto t = ReferenceTrainer::Create(job);
  REQUIRE(t.ok());
  auto loss = (*t)->ComputeGradients({mb});
  INFO(loss.status().ToString());
  REQUIRE(loss.ok());
  return {*loss, (*t)->grads()};
}

void RequireClose(const Result2& a, const Result2& b) {
  CHECK(a.loss == Approx(b.loss).epsilon(1e-6));
  REQUIRE(a.grads.size() == b.grads.size());
  for (size_t l = 0; l < a.grads.size(); ++l) {
    for (size_t i = 0; i < a.grads[l].size(); ++i) {
      if (std::abs(a.grads[l][i] - b.grads[l][i]) > 1e-6f + 1e-5f * std::abs(b.grads[l][i])) {
        FAIL("layer " << l << " gradient [" << i << "] " << a.grads[l][i] << " vs " << b.grads[l][i]);
      }
    }
  }
}

TEST_CASE("Absent token types and mask equal type 0 and all-ones - padding changes the loss",
          "[worker][reference][bert]") {
  for (int64_t labels : {0, 2}) {
    INFO("num_labels=" << labels);
    const JobConfig job = BertJob(labels);
    const MicroBatch plain = Batch(job);
    MicroBatch explicit_ = plain;
    explicit_.token_types.assign(20, 0);
    explicit_.attention_mask.assign(20, 1);
    const Result2 a = Run(job, plain);
    RequireClose(Run(job, explicit_), a);
    // Padding the tail of sequence 1 (no targets there) still changes what its real
    // tokens see.
    MicroBatch padded = plain;
    padded.attention_mask.assign(20, 1);
    for (int i = 16; i < 20; ++i) {
      padded.attention_mask[i] = 0;
      padded.targets[i] = -1;
    }
    MicroBatch same_targets = plain;
    same_targets.targets = padded.targets;
    CHECK(Run(job, padded).loss != Run(job, same_targets).loss);  // small init: a small change
    // Token types reach the embedding.
    MicroBatch typed = plain;
    typed.token_types.assign(20, 0);
    for (int i = 5; i < 10; ++i) typed.token_types[i] = 1;
    CHECK(Run(job, typed).loss != a.loss);
  }
}

TEST_CASE("Bad encoder inputs are refused with what and where", "[worker][reference][bert]") {
  const JobConfig job = BertJob(0);
  auto t = ReferenceTrainer::Create(job);
  REQUIRE(t.ok());
  auto expect = [&](const MicroBatch& mb, std::initializer_list<std::string> needles) {
    auto r = (*t)->ComputeGradients({mb});
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message());
    for (const std::string& n : needles) CHECK(r.status().message().find(n) != std::string::npos);
  };
  MicroBatch mb = Batch(job);
  mb.token_types.assign(20, 0);
  mb.token_types[13] = 2;
  expect(mb, {"token type 2", "position 13", "type_vocab_size=2"});
  mb = Batch(job);
  mb.attention_mask.assign(19, 1);
  expect(mb, {"attention_mask", "20"});
  mb.attention_mask.assign(20, 1);
  mb.attention_mask[4] = 2;
  expect(mb, {"attention_mask 2", "position 4"});
  mb.attention_mask.assign(20, 1);
  for (int i = 10; i < 20; ++i) mb.attention_mask[i] = 0;
  expect(mb, {"sequence 1", "all padding"});

  const JobConfig cls = BertJob(2);
  auto tc = ReferenceTrainer::Create(cls);
  REQUIRE(tc.ok());
  MicroBatch bad = Batch(cls);
  bad.targets[3] = 1;
  auto r = (*tc)->ComputeGradients({bad});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("position 3") != std::string::npos);
  bad = Batch(cls);
  bad.targets[10] = 2;
  r = (*tc)->ComputeGradients({bad});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("num_labels=2") != std::string::npos);

  JobConfig gpt;
  gpt.model.vocab_size = 40;
  gpt.model.seq_len = 12;
  gpt.train.seq_len = 10;
  auto tg = ReferenceTrainer::Create(gpt);
  REQUIRE(tg.ok());
  MicroBatch g = Batch(job);
  g.attention_mask.assign(20, 1);
  r = (*tg)->ComputeGradients({g});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("only bert") != std::string::npos);
}

}  // namespace
}  // namespace l2l::worker
