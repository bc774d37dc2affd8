// Sampling with a KV cache (worker/sampler.h KvCacheProbs) gives the same tokens as
// sampling with a full recompute of the context per token (TrainerProbs, what l2l-sample
// did before), greedy and with temperature/top-k/top-p, for GPT-2 and Llama (GQA), over
// 3 x seq_len new tokens so the sampler's window slides past seq_len (then the cache is
// prefilled again). The distributions differ only in fp32 rounding (tests/kernels/
// kv_decode_test.cc bounds them); identical ids are what users see.
#include <catch2/catch.hpp>

#include <vector>

#include "tests/testing/jobs.h"
#include "worker/reference/reference_trainer.h"
#include "worker/sampler.h"

namespace l2l::worker {
namespace {

JobConfig Job(ModelFamily family) {
  JobConfig job = testing::GptJob(testing::kTinyGpt, {.seed = 17});
  if (family == ModelFamily::kLlama) {
    job.model = testing::LlamaModel({96, 16, 32, 3, 4, 2, 64});
    job.model.qkv_bias = true;
  }
  REQUIRE(job.Validate().ok());
  return job;
}

TEST_CASE("KV-cache sampling gives the same tokens as recomputing the context", "[sampler][decode]") {
  for (ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    INFO("family " << ToString(family));
    auto trainer = ReferenceTrainer::Create(Job(family));
    REQUIRE(trainer.ok());
    for (float temperature : {0.0f, 0.9f}) {
      INFO("temperature " << temperature);
      SamplerOptions so;
      so.max_new_tokens = 48;  // 3 x seq_len: the window slides
      so.temperature = temperature;
      so.top_k = 20;
      so.top_p = 0.95f;
      so.seed = 5;
      so.context_len = (*trainer)->spec().seq_len;
      const std::vector<int32_t> prompt = {5, 9, 2};
      auto full = Generate(TrainerProbs(trainer->get()), prompt, so);
      auto kv = KvCacheProbs(trainer->get());
      REQUIRE(full.ok());
      REQUIRE(kv.ok());
      auto cached = Generate(*kv, prompt, so);
      REQUIRE(cached.ok());
      CHECK(*cached == *full);
      CHECK(cached->size() == prompt.size() + 48);
    }
  }
}

TEST_CASE("KV-cache sampling refuses an encoder", "[sampler][decode]") {
  JobConfig job = testing::GptJob(testing::kTinyGpt);
  job.model = testing::BertModel({96, 16, 32, 2, 4, 64}, 0);
  REQUIRE(job.Validate().ok());
  auto trainer = ReferenceTrainer::Create(job);
  REQUIRE(trainer.ok());
  auto kv = KvCacheProbs(trainer->get());
  REQUIRE_FALSE(kv.ok());
  CHECK(kv.status().code() == StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace l2l::worker
