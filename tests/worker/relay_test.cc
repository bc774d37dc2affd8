// Relay tests against the in-process FakeEps: the layer-to-layer relay (forward layer by
// layer over all micro-batches, recomputing backward, per-layer gradient pushes, tied
// wte) must train exactly like ordinary mini-batch training (worker/reference/reference_trainer.h)
// on the same data, initialisation and micro-batching; in lock-free mode it must never
// compute with a layer older than the staleness bound.
//
// Tolerances ("equal" in fp32; the relay and the reference sum micro-batch gradients in a
// different order and scale the loss at a different point, so they are not bit-identical):
//  * gradients (what the EPS reduces, vs the reference's mini-batch gradient), per tensor:
//      |relay - ref| <= 1e-5 * max|ref|        (measured: <= 1e-6)
//    This is the check that sees a wrongly scaled gradient, which AdamW's normalisation
//    would hide from the weights.
//  * weights after K steps, elementwise |relay - ref| <= kAtol + kRtol |ref| and per
//    tensor ||relay - ref|| <= kRtol ||ref|| + kAtol sqrt(n),  kRtol = 1e-5, kAtol = 5e-6
//    Weights are ~0.02 and one AdamW step moves a weight by up to lr = 3e-3, so a lost or
//    doubled micro-batch is far outside. kAtol covers AdamW amplifying rounding noise:
//    a weight moves by ~lr whatever the size of its gradient g, so its error is about
//    lr * noise(g) / (|g| + eps); the test job uses optim.eps = 1e-6 (not 1e-8) so that
//    gradients at the noise floor (~1e-9) stay far below eps (measured: <= 1.5e-6).
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/fake_eps_client.h"
#include "common/dtype.h"
#include "common/lora.h"
#include "kernels/backend.h"
#include "tests/testing/jobs.h"
#include "worker/data_loader.h"
#include "worker/micro_batch_auto.h"
#include "worker/reference/reference_trainer.h"
#include "worker/relay.h"

namespace l2l::worker {
namespace {

constexpr double kRtol = 1e-5;
constexpr double kAtol = 5e-6;

JobConfig TinyJob() {
  return testing::GptJob(testing::kTinyGpt,
                         {.micro_batch_size = 2, .micro_batches = 3, .seq_len = 16, .seed = 77,
                          .clip = l2l::ClipMode::kGlobal, .lr = 3e-3f, .warmup_steps = 2, .total_steps = 10,
                          .eps = 1e-6f /* see the file comment */, .weight_decay = 0.1f, .grad_clip = 1.0f});
}

// TinyJob as a Llama-family model: grouped-query attention (4 query heads on 2 key/value
// heads), RoPE with llama3 scaling, RMSNorm, SwiGLU.
JobConfig TinyLlamaJob() {
  JobConfig job = TinyJob();
  job.model.family = ModelFamily::kLlama;
  job.model.n_kv_heads = 2;
  job.model.d_ff = 80;
  job.model.rope_theta = 1000.0;
  job.model.rope_scaling = {RopeScalingType::kLlama3, 4.0, 1.0, 4.0, 16};
  return job;
}

// TinyJob as a BERT masked-LM model (bidirectional, post-LN, tied decoder, 2 token types).
JobConfig TinyBertJob() {
  JobConfig job = TinyJob();
  job.model.family = ModelFamily::kBert;
  job.model.layer_norm_eps = 1e-12;
  return job;
}

// For a BERT job, turns the loader's micro-batches into padded masked-LM batches, as a pure
// function of their tokens (so the relay and the reference trainer see the same): sequence
// b keeps T - (first token % 4) real tokens, the second half of them of token type 1; a real
// token whose id is divisible by 3 becomes token 0 ("[MASK]") with its id as the target;
// every other target is -1. A classification model (num_labels > 0) instead takes the label
// (first token % num_labels) at position 0 and -1 elsewhere. Other families' batches pass
// unchanged.
std::vector<MicroBatch> Encode(const JobConfig& job, std::vector<MicroBatch> mbs) {
  if (job.model.family != ModelFamily::kBert) return mbs;
  for (MicroBatch& mb : mbs) {
    mb.token_types.assign(mb.inputs.size(), 0);
    mb.attention_mask.assign(mb.inputs.size(), 0);
    for (int64_t b = 0; b < mb.B; ++b) {
      const int64_t real = mb.T - mb.inputs[static_cast<size_t>(b * mb.T)] % 4;
      for (int64_t t = 0; t < mb.T; ++t) {
        const size_t i = static_cast<size_t>(b * mb.T + t);
        mb.attention_mask[i] = t < real ? 1 : 0;
        mb.token_types[i] = t >= real / 2 ? 1 : 0;
        if (job.model.num_labels > 0) {
          mb.targets[i] = t == 0 ? mb.inputs[i] % static_cast<int32_t>(job.model.num_labels) : -1;
          continue;
        }
        const bool masked = t < real && mb.inputs[i] % 3 == 0;
        mb.targets[i] = masked ? mb.inputs[i] : -1;
        if (masked) mb.inputs[i] = 0;
      }
    }
  }
  return mbs;
}

// A token stream with some structure (so gradients are not pure noise): a noisy walk.
std::vector<int32_t> MakeTokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  int64_t cur = 0;
  for (auto& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t r = static_cast<int64_t>((x >> 33) % 7);
    cur = (r < 5) ? (cur + r + 1) % vocab : static_cast<int64_t>((x >> 20) % vocab);
    v = static_cast<int32_t>(cur);
  }
  return t;
}

DataLoader MakeLoader(const JobConfig& job, int64_t rank, int64_t world) {
  DataLoaderOptions o;
  o.B = job.train.micro_batch_size;
  o.T = job.seq_len();
  o.seed = job.train.seed;
  o.rank = rank;
  o.world = world;
  o.vocab_size = job.model.vocab_size;
  auto l = DataLoader::FromTokens(MakeTokens(6000, job.model.vocab_size, 5), o, "<test tokens>");
  REQUIRE(l.ok());
  return std::move(l).value();
}

struct RelayRun {
  std::vector<std::vector<float>> params;       // per layer, from the EPS after the run
  std::vector<std::vector<float>> last_grads;   // per layer, the last reduced gradient
  std::vector<std::vector<float>> last_from;    // per layer, the weights it was computed at
  std::vector<std::vector<double>> losses;      // [worker][step]
  std::vector<VersionStats> versions;           // per worker
  std::vector<FakeEps::AcquireRecord> acquires;
  std::vector<size_t> device_bytes;             // per worker
  std::vector<Status> status;                   // per worker
  std::vector<int64_t> kept_blocks;             // per worker: blocks keeping intermediates
  std::vector<double> recompute_s;              // per worker: the last step's recompute time
  std::vector<int64_t> expert_steps;            // mixture of experts: the EPS's per-expert steps
};

// Trains `steps` steps with `workers` relays (one thread and one 1-thread CPU backend
// each) against one FakeEps. Worker w reads data shard w of `workers`.
// budget_bytes > 0 overrides the job's activation budget.
RelayRun RunRelays(const JobConfig& job, int workers, int steps, FakeEpsOptions eps_opts = {},
                   size_t budget_bytes = 0) {
  eps_opts.num_workers = workers;
  auto eps = FakeEps::Create(job, eps_opts);
  REQUIRE(eps.ok());
  RelayRun run;
  run.losses.resize(workers);
  run.versions.resize(workers);
  run.device_bytes.resize(workers);
  run.status.resize(workers);
  run.kept_blocks.resize(workers);
  run.recompute_s.resize(workers);
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      auto client = (*eps)->Connect(w);
      if (!client.ok()) {
        run.status[w] = client.status();
        return;
      }
      auto backend = kernels::CreateCpuBackend(1);
      const WorkerRegistration& reg = (*client)->registration();
      auto opts = RelayOptions::FromJob(reg.job);
      if (!opts.ok()) {
        run.status[w] = opts.status();
        return;
      }
      if (budget_bytes > 0) opts->activation_budget_bytes = budget_bytes;
      auto relay = Relay::Create(client->get(), backend.get(), reg.job, *opts);
      if (!relay.ok()) {
        run.status[w] = relay.status();
        return;
      }
      DataLoader loader = MakeLoader(reg.job, reg.data_rank, reg.data_world);
      for (int s = 0; s < steps; ++s) {
        auto report = (*relay)->RunStep(s, Encode(reg.job, loader.NextMany(reg.job.train.micro_batches)));
        if (!report.ok()) {
          run.status[w] = report.status();
          (*eps)->Stop();  // unblock the other workers
          return;
        }
        run.losses[w].push_back(report->loss);
        report->data_position = loader.position().ToString();
        Status st = (*client)->StepDone(*report);
        if (!st.ok()) {
          run.status[w] = st;
          return;
        }
      }
      run.versions[w] = (*relay)->versions();
      run.device_bytes[w] = (*relay)->device_bytes();
      run.kept_blocks[w] = (*relay)->activation_plan().kept_blocks;
      run.recompute_s[w] = (*relay)->last_times().recompute;
    });
  }
  for (auto& t : threads) t.join();
  (*eps)->Flush();
  for (int64_t l = 0; l < job.model.NumLayers(); ++l) {
    run.params.push_back((*eps)->Master(l));
    run.last_grads.push_back((*eps)->LastGradient(l));
    run.last_from.push_back((*eps)->WeightsBeforeLastUpdate(l));
  }
  run.acquires = (*eps)->acquires();
  run.expert_steps = (*eps)->expert_steps();
  return run;
}

struct RefRun {
  std::vector<std::vector<float>> params;
  std::vector<double> losses;
  int64_t kept_blocks = 0;  // blocks keeping their intermediates
  std::vector<int64_t> expert_steps;  // mixture of experts: per-expert AdamW steps
};

// The oracle: one ReferenceTrainer fed, each step, the union of the `shards` shards'
// next micro_batches micro-batches (what `shards` relay workers see together).
RefRun RunReference(const JobConfig& job, int shards, int steps, size_t budget_bytes = 0) {
  ReferenceTrainerOptions o;
  o.num_threads = 1;
  o.activation_budget_bytes = budget_bytes;
  auto ref = ReferenceTrainer::Create(job, o);
  REQUIRE(ref.ok());
  std::vector<DataLoader> loaders;
  for (int r = 0; r < shards; ++r) loaders.push_back(MakeLoader(job, r, shards));
  RefRun run;
  for (int s = 0; s < steps; ++s) {
    std::vector<MicroBatch> batches;
    for (auto& l : loaders) {
      for (auto& mb : Encode(job, l.NextMany(job.train.micro_batches))) batches.push_back(std::move(mb));
    }
    auto loss = (*ref)->Step(batches);
    REQUIRE(loss.ok());
    run.losses.push_back(*loss);
  }
  run.params = (*ref)->params();
  run.kept_blocks = (*ref)->activation_plan().kept_blocks;
  run.expert_steps = (*ref)->expert_steps();
  return run;
}

// Checks weights (or gradients) per tensor against the oracle:
//   elementwise |got - ref| <= kAtol + kRtol |ref|,
//   per tensor  ||got - ref|| <= kRtol ||ref|| + kAtol sqrt(numel).
// Returns the worst elementwise ratio (<= 1 passes) and, in *norm_ratio, the worst
// per-tensor ratio (<= 1 passes).
double WorstRatio(const JobConfig& job, const std::vector<std::vector<float>>& got,
                  const std::vector<std::vector<float>>& ref, double* max_abs, double* norm_ratio,
                  double atol = kAtol) {
  REQUIRE(got.size() == ref.size());
  const auto layouts = BuildLoraLayout(job.model, job.lora);  // BuildLayout without LoRA
  double worst = 0;
  *max_abs = 0;
  *norm_ratio = 0;
  for (size_t l = 0; l < ref.size(); ++l) {
    REQUIRE(got[l].size() == ref[l].size());
    for (const ParamInfo& p : layouts[l].params) {
      double d2 = 0, r2 = 0;
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        const double d = std::fabs(static_cast<double>(got[l][i]) - ref[l][i]);
        d2 += d * d;
        r2 += static_cast<double>(ref[l][i]) * ref[l][i];
        *max_abs = std::max(*max_abs, d);
        const double r = d / (atol + kRtol * std::fabs(ref[l][i]));
        if (r > 1 && std::getenv("L2L_RELAY_DEBUG")) {
          std::fprintf(stderr, "%s[%zu]: got %.9g ref %.9g ratio %.3g\n", p.name.c_str(), i - p.offset,
                       got[l][i], ref[l][i], r);
        }
        worst = std::max(worst, r);
      }
      *norm_ratio = std::max(*norm_ratio, std::sqrt(d2) / (kRtol * std::sqrt(r2) +
                                                           atol * std::sqrt(static_cast<double>(p.numel))));
    }
  }
  return worst;
}

// How far the weights moved from their initial values (guards against a vacuous pass).
double MaxChangeFromInit(const JobConfig& job, const std::vector<std::vector<float>>& params) {
  const auto layouts = BuildLayout(job.model);
  double m = 0;
  for (size_t l = 0; l < layouts.size(); ++l) {
    std::vector<float> init(layouts[l].numel);
    InitLayerParams(job.model, layouts[l], job.train.seed, init.data());
    for (size_t i = 0; i < init.size(); ++i) m = std::max(m, std::fabs(double(params[l][i]) - init[i]));
  }
  return m;
}

void RequireAllOk(const RelayRun& run) {
  for (size_t w = 0; w < run.status.size(); ++w) {
    INFO("worker " << w << ": " << run.status[w].ToString());
    REQUIRE(run.status[w].ok());
  }
}

void RequireMatches(const JobConfig& job, const RelayRun& relay, const RefRun& ref) {
  double max_abs = 0, norm_ratio = 0;
  const double ratio = WorstRatio(job, relay.params, ref.params, &max_abs, &norm_ratio);
  INFO("worst |relay-ref| / (atol + rtol|ref|) = " << ratio << ", max |relay-ref| = " << max_abs
       << ", worst per-tensor ||relay-ref|| / (rtol ||ref||) = " << norm_ratio);
  CHECK(ratio <= 1.0);
  CHECK(norm_ratio <= 1.0);
  CHECK(MaxChangeFromInit(job, ref.params) > 1e-3);  // training really moved the weights
}

}  // namespace

TEST_CASE("Relay with one worker trains exactly like the reference trainer", "[worker][relay]") {
  JobConfig job = TinyJob();
  SECTION("tied embeddings, global clipping") {}
  SECTION("untied embeddings, per-layer clipping") {
    job.model.tied_embeddings = false;
    job.train.clip = l2l::ClipMode::kPerLayer;
  }
  SECTION("no clipping, one micro-batch") {
    job.train.clip = l2l::ClipMode::kNone;
    job.train.micro_batches = 1;
  }
  const int steps = 4;
  RelayRun relay = RunRelays(job, 1, steps);
  RequireAllOk(relay);
  RefRun ref = RunReference(job, 1, steps);
  RequireMatches(job, relay, ref);
  for (int s = 0; s < steps; ++s) {
    CHECK(relay.losses[0][s] == Approx(ref.losses[s]).epsilon(1e-5));
  }
  // Synchronous mode: every layer was used at exactly the step's version.
  CHECK(relay.versions[0].max_lag == 0);
  CHECK(relay.versions[0].min_lag == 0);
  // Per step: L+2 layers forward + L blocks again in backward.
  CHECK(relay.versions[0].acquires == steps * (2 * job.model.n_layer + 2));
}

TEST_CASE("Relay trains a Llama-family model exactly like the reference trainer",
          "[worker][relay][llama]") {
  JobConfig job = TinyLlamaJob();
  const int workers = GENERATE(1, 2);
  SECTION("tied embeddings, global clipping") {}
  SECTION("untied embeddings, q/k/v biases, per-layer clipping") {
    job.model.tied_embeddings = false;
    job.model.qkv_bias = true;
    job.train.clip = ClipMode::kPerLayer;
  }
  INFO(workers << " worker(s)");
  const int steps = 3;
  RelayRun relay = RunRelays(job, workers, steps);
  RequireAllOk(relay);
  RefRun ref = RunReference(job, workers, steps);
  RequireMatches(job, relay, ref);
  for (int s = 0; s < steps; ++s) {
    double mean = 0;
    for (int w = 0; w < workers; ++w) mean += relay.losses[w][s] / workers;
    CHECK(mean == Approx(ref.losses[s]).epsilon(1e-5));
  }
}

TEST_CASE("Relay trains a mixture-of-experts model exactly like the reference trainer, skipping idle experts",
          "[worker][relay][moe]") {
  // 16 experts, top-1, few tokens a step: most experts get no token in a given step (the
  // EPS and the reference skip them, torch.optim.AdamW's .grad None), and which ones
  // varies from step to step (each expert keeps its own AdamW step count).
  JobConfig job = TinyLlamaJob();
  job.model.num_experts = 16;
  job.model.experts_per_token = 1;
  job.model.d_ff = 16;
  job.train.micro_batch_size = 1;
  job.train.micro_batches = 2;
  job.train.seq_len = 4;
  const int workers = GENERATE(1, 2);
  SECTION("with the auxiliary loss, global clipping") {
    job.model.output_router_logits = true;
    job.model.router_aux_loss_coef = 0.05;
  }
  SECTION("without it, no clipping") { job.train.clip = ClipMode::kNone; }
  REQUIRE(job.Validate().ok());
  INFO(workers << " worker(s)");
  const int steps = 4;
  RelayRun relay = RunRelays(job, workers, steps);
  RequireAllOk(relay);
  RefRun ref = RunReference(job, workers, steps);
  RequireMatches(job, relay, ref);
  for (int s = 0; s < steps; ++s) {
    double mean = 0;
    for (int w = 0; w < workers; ++w) mean += relay.losses[w][s] / workers;
    CHECK(mean == Approx(ref.losses[s]).epsilon(1e-5));
  }
  CHECK(relay.expert_steps == ref.expert_steps);
  int64_t never = 0, some = 0;  // experts updated in no step, in some but not all steps
  for (int64_t n : ref.expert_steps) {
    never += n == 0 ? 1 : 0;
    some += n > 0 && n < steps ? 1 : 0;
  }
  INFO("experts never updated: " << never << ", updated in some steps: " << some);
  CHECK(some > 0);
  // An expert that never got a token is exactly its initial weights (no weight decay).
  if (never > 0) {
    const std::vector<LayerLayout> layouts = BuildLayout(job.model);
    for (int64_t b = 0; b < job.model.n_layer; ++b) {
      const LayerLayout& L = layouts[static_cast<size_t>(1 + b)];
      std::vector<float> init(L.numel);
      InitLayerParams(job.model, L, job.train.seed, init.data());
      const std::vector<ExpertRange> ranges = ExpertRanges(job.model, L);
      for (int64_t e = 0; e < job.model.num_experts; ++e) {
        if (ref.expert_steps[static_cast<size_t>(b * job.model.num_experts + e)] != 0) continue;
        const ExpertRange& r = ranges[static_cast<size_t>(e)];
        CHECK(std::equal(init.begin() + r.begin, init.begin() + r.end, relay.params[1 + b].begin() + r.begin));
      }
    }
  }
}

TEST_CASE("Relay trains a padded BERT model exactly like the reference trainer", "[worker][relay][bert]") {
  JobConfig job = TinyBertJob();
  const int workers = GENERATE(1, 2);
  SECTION("masked-LM head (tied decoder)") {}
  SECTION("sequence-classification head (pooler, 3 labels)") {
    job.model.num_labels = 3;
    job.model.tied_embeddings = false;
  }
  INFO(workers << " worker(s)");
  const int steps = 3;
  RelayRun relay = RunRelays(job, workers, steps);
  RequireAllOk(relay);
  RefRun ref = RunReference(job, workers, steps);
  RequireMatches(job, relay, ref);
  for (int s = 0; s < steps; ++s) {
    double mean = 0;
    for (int w = 0; w < workers; ++w) mean += relay.losses[w][s] / workers;
    CHECK(mean == Approx(ref.losses[s]).epsilon(1e-5));
  }
  // Layer 0 is fetched once more per step for the embedding's backward (its LayerNorm).
  CHECK(relay.versions[0].acquires == steps * (2 * job.model.n_layer + 3));
}

TEST_CASE("Relay pushes the reference trainer's mini-batch gradient", "[worker][relay]") {
  JobConfig job = GENERATE(TinyJob(), TinyLlamaJob(), TinyBertJob());
  const int workers = GENERATE(1, 2);
  const int steps = GENERATE(1, 3);  // the gradient of step 0 and of step 2
  INFO(workers << " worker(s), gradient of step " << steps - 1);
  RelayRun relay = RunRelays(job, workers, steps);
  RequireAllOk(relay);

  // The oracle computes the gradient of the last step's batches at the weights the relay
  // used for that step (so earlier steps' rounding does not enter the comparison).
  ReferenceTrainerOptions o;
  o.num_threads = 1;
  auto ref = ReferenceTrainer::Create(job, relay.last_from, o);
  REQUIRE(ref.ok());
  std::vector<DataLoader> loaders;
  for (int r = 0; r < workers; ++r) loaders.push_back(MakeLoader(job, r, workers));
  for (int s = 0; s < steps; ++s) {
    std::vector<MicroBatch> batches;
    for (auto& l : loaders) {
      for (auto& mb : Encode(job, l.NextMany(job.train.micro_batches))) batches.push_back(std::move(mb));
    }
    if (s + 1 == steps) REQUIRE((*ref)->ComputeGradients(batches).ok());
  }
  const std::vector<std::vector<float>> want = (*ref)->grads();
  const auto layouts = BuildLayout(job.model);
  double worst = 0;
  for (size_t l = 0; l < layouts.size(); ++l) {
    const std::vector<float>& got = relay.last_grads[l];
    REQUIRE(got.size() == want[l].size());
    for (const ParamInfo& p : layouts[l].params) {
      double max_ref = 0, max_diff = 0;
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        max_ref = std::max(max_ref, static_cast<double>(std::fabs(want[l][i])));
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(got[i] - want[l][i])));
      }
      INFO(p.name << ": max|ref| " << max_ref << ", max|relay-ref| " << max_diff);
      const std::string suffix = "attention.self.key.bias";
      if (p.name.size() > suffix.size() && p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        // BERT's key bias shifts every score of a query equally, which the softmax
        // ignores: its exact gradient is 0 and both sides hold roundoff. Compare it at the
        // scale of the layer's whole gradient.
        double layer_max = 0;
        for (float g : want[l]) layer_max = std::max(layer_max, static_cast<double>(std::fabs(g)));
        CHECK(max_diff <= 1e-5 * layer_max);
        continue;
      }
      CHECK(max_ref > 0);
      CHECK(max_diff <= 1e-5 * max_ref);
      worst = std::max(worst, max_diff / max_ref);
    }
  }
  WARN("gradient max|relay-ref| / max|ref| over tensors: " << worst);
}

TEST_CASE("Two relay workers with M micro-batches equal one with 2M", "[worker][relay]") {
  JobConfig job = TinyJob();
  const int steps = 3;
  RelayRun two = RunRelays(job, 2, steps);
  RequireAllOk(two);
  RefRun ref = RunReference(job, 2, steps);  // one trainer, the 2M micro-batches of both shards
  RequireMatches(job, two, ref);
  for (int s = 0; s < steps; ++s) {
    CHECK((two.losses[0][s] + two.losses[1][s]) / 2 == Approx(ref.losses[s]).epsilon(1e-5));
  }

  // One relay worker with 2M micro-batches per step on the same union of data: feed it
  // shard-ordered batches through a FakeEps with one worker.
  JobConfig job2m = job;
  job2m.train.micro_batches = 2 * job.train.micro_batches;
  auto eps = FakeEps::Create(job2m, {});
  REQUIRE(eps.ok());
  auto client = (*eps)->Connect(0);
  REQUIRE(client.ok());
  auto backend = kernels::CreateCpuBackend(1);
  auto opts = RelayOptions::FromJob(job2m);
  REQUIRE(opts.ok());
  auto relay = Relay::Create(client->get(), backend.get(), job2m, *opts);
  REQUIRE(relay.ok());
  DataLoader l0 = MakeLoader(job, 0, 2), l1 = MakeLoader(job, 1, 2);
  for (int s = 0; s < steps; ++s) {
    std::vector<MicroBatch> batches = l0.NextMany(job.train.micro_batches);
    for (auto& mb : l1.NextMany(job.train.micro_batches)) batches.push_back(std::move(mb));
    auto report = (*relay)->RunStep(s, batches);
    INFO(report.status().ToString());
    REQUIRE(report.ok());
  }
  std::vector<std::vector<float>> one;
  for (int64_t l = 0; l < job.model.NumLayers(); ++l) one.push_back((*eps)->Master(l));
  double max_abs = 0, norm_ratio = 0;
  const double ratio = WorstRatio(job, one, two.params, &max_abs, &norm_ratio);
  INFO("1 worker x 2M vs 2 workers x M: worst ratio " << ratio << ", max abs " << max_abs
       << ", norm ratio " << norm_ratio);
  CHECK(ratio <= 1.0);
  CHECK(norm_ratio <= 1.0);
}

TEST_CASE("Relay with the stash in host memory gives the same bits as the device stash",
          "[worker][relay][stash]") {
  JobConfig job = TinyJob();
  const int steps = 3;
  RelayRun device = RunRelays(job, 1, steps);
  RequireAllOk(device);
  job.train.stash = l2l::StashPlacement::kHost;
  RelayRun host = RunRelays(job, 1, steps);
  RequireAllOk(host);
  for (size_t l = 0; l < device.params.size(); ++l) {
    INFO("layer " << l);
    CHECK(host.params[l] == device.params[l]);
  }
  RefRun ref = RunReference(job, 1, steps);
  RequireMatches(job, host, ref);
  // The host stash keeps only two (B,T,C) staging tensors on the device.
  const size_t stash_bytes = static_cast<size_t>(job.model.n_layer + 1) * job.train.micro_batches *
                             job.train.micro_batch_size * job.seq_len() * job.model.d_model * sizeof(float);
  const size_t staging = 2 * static_cast<size_t>(job.train.micro_batch_size * job.seq_len() *
                                                 job.model.d_model) * sizeof(float);
  CHECK(device.device_bytes[0] - host.device_bytes[0] == stash_bytes - staging);
}

TEST_CASE("Lock-free relay never uses a layer older than the staleness bound",
          "[worker][relay][lockfree]") {
  JobConfig job = TinyJob();
  job.train.mode = l2l::TrainMode::kLockfree;
  const int steps = 5;
  FakeEpsOptions lazy;
  lazy.lazy_updates = true;  // the EPS publishes a version only when forced to

  SECTION("staleness 0 is synchronous training") {
    job.train.staleness = 0;
    RelayRun run = RunRelays(job, 1, steps, lazy);
    RequireAllOk(run);
    CHECK(run.versions[0].max_lag == 0);
    RefRun ref = RunReference(job, 1, steps);
    RequireMatches(job, run, ref);
  }
  SECTION("staleness s: versions in [t-s, t], the oldest allowed one is used") {
    const int s = GENERATE(1, 2);
    job.train.staleness = s;
    for (int workers : {1, 2}) {
      RelayRun run = RunRelays(job, workers, steps, lazy);
      RequireAllOk(run);
      for (int w = 0; w < workers; ++w) {
        INFO("s=" << s << " workers=" << workers << " worker " << w);
        CHECK(run.versions[w].max_lag == s);   // the lazy EPS forces the stalest version
        CHECK(run.versions[w].min_lag >= 0);
      }
      // Every acquire asked for max(0, t-s) and got a version at least that.
      int64_t checked = 0;
      for (const auto& a : run.acquires) {
        CHECK(a.version >= a.min_version);
        ++checked;
      }
      CHECK(checked == int64_t{workers} * steps * (2 * job.model.n_layer + 2));
      // Stale gradients still train: the weights moved and stayed finite.
      CHECK(MaxChangeFromInit(job, run.params) > 1e-3);
      for (const auto& p : run.params) {
        for (float x : p) REQUIRE(std::isfinite(x));
      }
    }
  }
}

TEST_CASE("Relay converts a bf16-published model to fp32 before computing", "[worker][relay]") {
  JobConfig job = TinyJob();
  job.publish_dtype = DType::kBF16;
  auto eps = FakeEps::Create(job, {});
  REQUIRE(eps.ok());
  auto client = (*eps)->Connect(0);
  REQUIRE(client.ok());
  auto backend = kernels::CreateCpuBackend(1);
  auto relay = Relay::Create(client->get(), backend.get(), job, *RelayOptions::FromJob(job));
  REQUIRE(relay.ok());
  DataLoader loader = MakeLoader(job, 0, 1);
  std::vector<MicroBatch> batches = loader.NextMany(job.train.micro_batches);
  auto report = (*relay)->RunStep(0, batches);
  REQUIRE(report.ok());

  // Oracle: the reference trainer evaluating the bf16-rounded initial weights.
  std::vector<std::vector<float>> rounded;
  for (const LayerLayout& layout : BuildLayout(job.model)) {
    std::vector<float> p(layout.numel);
    InitLayerParams(job.model, layout, job.train.seed, p.data());
    for (float& x : p) x = Bf16ToFloat(FloatToBf16(x));
    rounded.push_back(std::move(p));
  }
  ReferenceTrainerOptions o;
  o.num_threads = 1;
  auto ref = ReferenceTrainer::Create(job, std::move(rounded), o);
  REQUIRE(ref.ok());
  auto loss = (*ref)->Evaluate(batches);
  REQUIRE(loss.ok());
  CHECK(report->loss == Approx(*loss).epsilon(1e-5));
  // ... and not the unrounded fp32 weights' loss (the conversion really happened).
  auto fp32 = ReferenceTrainer::Create(job, o);
  REQUIRE(fp32.ok());
  auto loss32 = (*fp32)->Evaluate(batches);
  REQUIRE(loss32.ok());
  CHECK(std::fabs(report->loss - *loss32) > 1e-6);
}

TEST_CASE("Relay rejects bad batches and reports a stopped EPS", "[worker][relay]") {
  JobConfig job = TinyJob();
  auto eps = FakeEps::Create(job, {});
  REQUIRE(eps.ok());
  auto client = (*eps)->Connect(0);
  REQUIRE(client.ok());
  auto backend = kernels::CreateCpuBackend(1);
  auto relay = Relay::Create(client->get(), backend.get(), job, *RelayOptions::FromJob(job));
  REQUIRE(relay.ok());
  DataLoader loader = MakeLoader(job, 0, 1);

  std::vector<MicroBatch> few = loader.NextMany(job.train.micro_batches - 1);
  auto r1 = (*relay)->RunStep(0, few);
  REQUIRE_FALSE(r1.ok());
  CHECK(r1.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(r1.status().message(), Catch::Contains("micro_batches"));

  std::vector<MicroBatch> bad = loader.NextMany(job.train.micro_batches);
  bad[1].targets[5] = static_cast<int32_t>(job.model.vocab_size);
  auto r2 = (*relay)->RunStep(0, bad);
  REQUIRE_FALSE(r2.ok());
  CHECK(r2.status().code() == StatusCode::kOutOfRange);
  CHECK_THAT(r2.status().message(), Catch::Contains("micro-batch 1 targets[5]"));

  // A good step still runs after rejected input.
  REQUIRE((*relay)->RunStep(0, loader.NextMany(job.train.micro_batches)).ok());

  // Step 2 needs version 2 of layer 0, which never comes (step 1 never ran): the acquire
  // blocks until Stop() aborts it.
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (*eps)->Stop();
  });
  auto r3 = (*relay)->RunStep(2, loader.NextMany(job.train.micro_batches));
  stopper.join();
  REQUIRE_FALSE(r3.ok());
  CHECK(r3.status().code() == StatusCode::kAborted);
  CHECK_THAT(r3.status().message(), Catch::Contains("fetching layer 0"));

  auto bad_opts = RelayOptions::FromJob([&] {
    JobConfig j = job;
    j.train.staleness = -1;
    return j;
  }());
  REQUIRE_FALSE(bad_opts.ok());
  CHECK_THAT(bad_opts.status().message(), Catch::Contains("train.staleness=-1"));
}

// A client whose first push is refused with a rejoin request (as after another worker's
// loss); everything else goes to a FakeEps client.
class RefuseFirstPush : public EpsClient {
 public:
  explicit RefuseFirstPush(std::unique_ptr<EpsClient> inner) : inner_(std::move(inner)) {}
  const WorkerRegistration& registration() const override { return inner_->registration(); }
  Result<LayerWeights> AcquireLayer(int64_t layer, int64_t min_version, std::chrono::milliseconds timeout) override {
    return inner_->AcquireLayer(layer, min_version, timeout);
  }
  void ReleaseLayer(int64_t layer) override { inner_->ReleaseLayer(layer); }
  Status PushGradient(int64_t layer, int64_t step, int64_t micro_batches, const float* grad, size_t numel) override {
    if (!refused_.exchange(true)) return RejoinRequired(RejoinReason::kStepAbandoned, "step abandoned (test)");
    ++pushes_;
    return inner_->PushGradient(layer, step, micro_batches, grad, numel);
  }
  Status StepDone(const StepReport& report) override { return inner_->StepDone(report); }
  int pushes() const { return pushes_.load(); }

 private:
  std::unique_ptr<EpsClient> inner_;
  std::atomic<bool> refused_{false};
  std::atomic<int> pushes_{0};
};

TEST_CASE("A step redone after a refused push pushes every gradient again", "[worker][relay]") {
  JobConfig job = TinyJob();
  auto eps = FakeEps::Create(job, {});
  REQUIRE(eps.ok());
  auto inner = (*eps)->Connect(0);
  REQUIRE(inner.ok());
  RefuseFirstPush client(std::move(inner).value());
  auto backend = kernels::CreateCpuBackend(1);
  auto relay = Relay::Create(&client, backend.get(), job, *RelayOptions::FromJob(job));
  REQUIRE(relay.ok());
  DataLoader loader = MakeLoader(job, 0, 1);
  const auto batches = loader.NextMany(job.train.micro_batches);
  auto failed = (*relay)->RunStep(0, batches);
  REQUIRE_FALSE(failed.ok());
  CHECK(NeedsRejoin(failed.status()));
  // The redo pushes all of its gradients and the step completes.
  const int before = client.pushes();
  auto redo = (*relay)->RunStep(0, batches);
  INFO(redo.status().ToString());
  REQUIRE(redo.ok());
  CHECK(client.pushes() - before == static_cast<int>(job.model.NumLayers()));
  (*eps)->Flush();
  CHECK((*eps)->Version(0) == 1);
}

namespace {

// Bytes of one block's kept intermediates for one micro-batch of `job`.
size_t KeptBytesPerBlock(const JobConfig& job) {
  auto be = kernels::CreateCpuBackend(1);
  auto ws = layers::LayerWorkspace::Create(be.get(), job.model, job.train.micro_batch_size, job.seq_len());
  REQUIRE(ws.ok());
  return layers::SavedActivations::Bytes(job.model, *ws);
}

TEST_CASE("A bf16 stash rounds every layer boundary as the reference trainer does, in half the bytes",
          "[worker][relay][stash]") {
  const int which = GENERATE(0, 1, 2);
  JobConfig job = which == 0 ? TinyJob() : which == 1 ? TinyLlamaJob() : TinyBertJob();
  INFO("family " << ToString(job.model.family));
  const int steps = GENERATE(1, 3);
  CAPTURE(steps);
  RelayRun f32 = RunRelays(job, 1, steps);
  RequireAllOk(f32);
  job.train.stash_dtype = DType::kBF16;
  RelayRun device = RunRelays(job, 1, steps);
  RequireAllOk(device);
  RefRun ref = RunReference(job, 1, steps);
  // Step 1 runs the same forward on both sides (the same initial weights, the same ops,
  // so the same rounded activations): RequireMatches' fp32 bounds hold as they are. From
  // step 2 the weights differ in their last bits (the EPS and the reference sum the
  // micro-batch gradients in different orders, as in fp32 mode), and an activation within
  // those bits of a bf16 rounding boundary rounds the other way: it moves by a whole bf16
  // unit (2^-8 relative), and that element's gradients with it. The elementwise bound
  // cannot hold there (gpt2, 3 steps: 3.5x), so multi-step runs check the per-tensor
  // norm bound, which such isolated flips do not move (0.07 of it) and which the
  // difference between rounding and not rounding exceeds (checked below).
  double max_abs = 0, norm_ratio = 0, f32_norm_ratio = 0;
  const double ratio = WorstRatio(job, device.params, ref.params, &max_abs, &norm_ratio);
  INFO("worst elementwise ratio " << ratio << ", per-tensor " << norm_ratio << ", max |relay-ref| " << max_abs);
  if (steps == 1) {
    RequireMatches(job, device, ref);
  } else {
    CHECK(norm_ratio <= 1.0);
    CHECK(MaxChangeFromInit(job, ref.params) > 1e-3);
  }
  for (int s = 0; s < steps; ++s) CHECK(device.losses[0][s] == Approx(ref.losses[s]).epsilon(1e-5));
  // The rounding is real: the fp32-stash run is farther from this oracle than the bound
  // checked above (so a relay or a reference that skipped it would fail).
  const double f32_ratio = WorstRatio(job, f32.params, ref.params, &max_abs, &f32_norm_ratio);
  INFO("fp32 stash vs the bf16 oracle: elementwise " << f32_ratio << ", per-tensor " << f32_norm_ratio);
  CHECK((steps == 1 ? f32_ratio : f32_norm_ratio) > 1.0);
  // The host placement stores the same bf16 bits: the same training, bit for bit.
  job.train.stash = l2l::StashPlacement::kHost;
  RelayRun host = RunRelays(job, 1, steps);
  RequireAllOk(host);
  for (size_t l = 0; l < device.params.size(); ++l) {
    INFO("layer " << l);
    CHECK(host.params[l] == device.params[l]);
  }
  // Device placement: the stash is half the fp32 one, plus a (B,T,C) fp32 staging tensor
  // each way (Load widens into one, the layer writes the other).
  const size_t tensor = static_cast<size_t>(job.train.micro_batch_size * job.seq_len() * job.model.d_model);
  const size_t f32_stash = static_cast<size_t>(job.model.n_layer + 1) * job.train.micro_batches * tensor * 4;
  CHECK(f32.device_bytes[0] - device.device_bytes[0] == f32_stash / 2 - 2 * tensor * 4);
}

TEST_CASE("micro_batches auto plans a bf16 stash at 2 bytes per stashed value", "[worker][relay][stash][planner]") {
  JobConfig job = TinyJob();
  auto cpu = kernels::CreateCpuBackend(1);
  const double values = static_cast<double>(job.train.micro_batch_size * job.seq_len() * job.model.d_model);
  auto f32 = MeasurePlanInputs(cpu.get(), job, 0, 1);
  REQUIRE(f32.ok());
  CHECK(f32->activation_bytes_per_micro_batch == values * 4);
  job.train.stash_dtype = DType::kBF16;
  auto bf16 = MeasurePlanInputs(cpu.get(), job, 0, 1);
  REQUIRE(bf16.ok());
  CHECK(bf16->activation_bytes_per_micro_batch == values * 2);
}

TEST_CASE("Relay and reference trainer give the same bits in every recompute mode",
          "[worker][relay][recompute]") {
  const int which = GENERATE(0, 1, 2);
  JobConfig job = which == 0 ? TinyJob() : which == 1 ? TinyLlamaJob() : TinyBertJob();
  INFO("family " << ToString(job.model.family));
  const int steps = 3;
  const int64_t L = job.model.n_layer, M = job.train.micro_batches;
  RelayRun base = RunRelays(job, 1, steps);  // recompute always (the default)
  RequireAllOk(base);
  RefRun ref_base = RunReference(job, 1, steps);
  CHECK(base.kept_blocks[0] == 0);
  CHECK(ref_base.kept_blocks == 0);
  RequireMatches(job, base, ref_base);

  const size_t per = KeptBytesPerBlock(job);
  REQUIRE(per > 0);
  struct Case {
    RecomputeMode mode;
    size_t relay_budget, ref_budget;   // 0: the default
    int64_t relay_kept, ref_kept;      // blocks expected to keep their intermediates
  };
  const Case cases[] = {
      {RecomputeMode::kNever, 0, 0, L, L},
      // auto with room for 2 blocks x M micro-batches (relay) and 1 block (reference
      // trainer: one micro-batch at a time), plus half a block that must not count.
      {RecomputeMode::kAuto, per * M * 2 + per / 2, per + per / 2, 2, 1},
      {RecomputeMode::kAuto, 0, 0, L, L},  // the default budget holds this tiny model
  };
  for (const Case& c : cases) {
    job.train.recompute = c.mode;
    INFO("recompute " << ToString(c.mode) << ", relay budget " << c.relay_budget << ", ref budget " << c.ref_budget);
    RelayRun relay = RunRelays(job, 1, steps, {}, c.relay_budget);
    RequireAllOk(relay);
    RefRun ref = RunReference(job, 1, steps, c.ref_budget);
    CHECK(relay.kept_blocks[0] == c.relay_kept);
    CHECK(ref.kept_blocks == c.ref_kept);
    if (c.relay_kept == L) CHECK(relay.recompute_s[0] == 0.0);
    for (int s = 0; s < steps; ++s) {
      CHECK(relay.losses[0][s] == base.losses[0][s]);
      CHECK(ref.losses[s] == ref_base.losses[s]);
    }
    for (size_t l = 0; l < base.params.size(); ++l) {
      INFO("layer " << l);
      CHECK(relay.params[l] == base.params[l]);
      CHECK(ref.params[l] == ref_base.params[l]);
    }
  }
}

TEST_CASE("Lock-free relay keeping intermediates trains like the recomputing one", "[worker][relay][recompute]") {
  // The lazy EPS hands a single worker the same (stalest allowed) versions in both runs,
  // so the forward and the backward of a block use one version and the kept values apply.
  JobConfig job = TinyJob();
  job.train.mode = l2l::TrainMode::kLockfree;
  job.train.staleness = 1;
  FakeEpsOptions lazy;
  lazy.lazy_updates = true;
  const int steps = 4;
  RelayRun always = RunRelays(job, 1, steps, lazy);
  RequireAllOk(always);
  job.train.recompute = RecomputeMode::kNever;
  RelayRun never = RunRelays(job, 1, steps, lazy);
  RequireAllOk(never);
  CHECK(never.kept_blocks[0] == job.model.n_layer);
  CHECK(never.versions[0].max_lag == 1);
  CHECK(never.losses[0] == always.losses[0]);
  for (size_t l = 0; l < always.params.size(); ++l) {
    INFO("layer " << l);
    CHECK(never.params[l] == always.params[l]);
  }
}

TEST_CASE("recompute never fails at start, naming the bytes, when the budget is too small",
          "[worker][relay][recompute]") {
  JobConfig job = TinyJob();
  job.train.recompute = RecomputeMode::kNever;
  const size_t per = KeptBytesPerBlock(job);
  const size_t budget = per;  // less than L x M blocks' worth
  auto eps = FakeEps::Create(job, FakeEpsOptions{});
  REQUIRE(eps.ok());
  auto client = (*eps)->Connect(0);
  REQUIRE(client.ok());
  auto backend = kernels::CreateCpuBackend(1);
  RelayOptions opts = *RelayOptions::FromJob(job);
  opts.activation_budget_bytes = budget;
  auto relay = Relay::Create(client->get(), backend.get(), job, opts);
  REQUIRE_FALSE(relay.ok());
  CHECK(relay.status().code() == StatusCode::kFailedPrecondition);
  const std::string msg = relay.status().ToString();
  INFO(msg);
  const size_t need = per * static_cast<size_t>(job.model.n_layer * job.train.micro_batches);
  CHECK(msg.find("train.recompute=never") != std::string::npos);
  CHECK(msg.find(std::to_string(need) + " bytes") != std::string::npos);
  CHECK(msg.find(std::to_string(budget) + " bytes") != std::string::npos);

  ReferenceTrainerOptions o;
  o.num_threads = 1;
  o.activation_budget_bytes = per * static_cast<size_t>(job.model.n_layer) - 1;
  auto ref = ReferenceTrainer::Create(job, o);
  REQUIRE_FALSE(ref.ok());
  CHECK(ref.status().message().find("train.recompute=never") != std::string::npos);
}

}  // namespace

TEST_CASE("Relay trains LoRA adapters like the reference trainer, the base frozen", "[worker][relay][lora]") {
  JobConfig job = TinyLlamaJob();
  const int workers = GENERATE(1, 2);
  job.lora.enabled = true;
  job.lora.r = 4;
  job.lora.alpha = 8;
  job.lora.init_seed = 5;
  SECTION("llama, all-linear, global clipping") {}
  SECTION("llama untied, q_proj + v_proj, lm_head trained in full, per-layer clipping") {
    job.model.tied_embeddings = false;
    job.lora.target = {"q_proj", "v_proj"};
    job.lora.modules_to_save = {"lm_head"};
    job.train.clip = ClipMode::kPerLayer;
  }
  SECTION("llama, all-linear, a 4-bit (NF4) base") {
    job.lora.base_dtype = LoraBaseDType::kQ4;
  }
  SECTION("llama untied, an 8-bit (Q8_0) base, lm_head trained in full") {
    job.model.tied_embeddings = false;
    job.lora.base_dtype = LoraBaseDType::kQ8;
    job.lora.modules_to_save = {"lm_head"};
  }
  SECTION("gpt2 tied, c_attn + c_fc, bf16 base") {
    const LoraConfig lora = job.lora;
    job = TinyJob();
    job.lora = lora;
    job.lora.target = {"c_attn", "c_fc"};
    job.lora.base_dtype = LoraBaseDType::kBF16;
    job.train.recompute = RecomputeMode::kNever;  // the backward from kept intermediates
  }
  SECTION("llama, all-linear, adapter dropout 0.1") {
    job.lora.dropout = 0.1;
    // The masks are keyed by the global micro-batch (data_rank * M + u): the relay's
    // workers together must draw the reference trainer's masks. Guard against a vacuous
    // pass (dropout ignored on both sides): the reference's losses change with it.
    JobConfig plain = job;
    plain.lora.dropout = 0;
    const RefRun without = RunReference(plain, workers, 2);
    const RefRun with = RunReference(job, workers, 2);
    CHECK(with.losses[0] == without.losses[0]);  // every B starts at 0: no adapter output yet
    CHECK(with.losses[1] != without.losses[1]);  // dB saw the dropped inputs
  }
  SECTION("gpt2, c_attn + c_proj, adapter dropout 0.3, kept intermediates") {
    const LoraConfig lora = job.lora;
    job = TinyJob();
    job.lora = lora;
    job.lora.target = {"c_attn", "c_proj"};
    job.lora.dropout = 0.3;
    job.train.recompute = RecomputeMode::kNever;  // the backward regenerates the mask
  }
  REQUIRE(job.Validate().ok());
  INFO(workers << " worker(s), targets " << job.lora.target.size() << ", dropout " << job.lora.dropout);
  const int steps = 3;
  RelayRun relay = RunRelays(job, workers, steps);
  RequireAllOk(relay);
  RefRun ref = RunReference(job, workers, steps);
  double max_abs = 0, norm_ratio = 0;
  const double ratio = WorstRatio(job, relay.params, ref.params, &max_abs, &norm_ratio);
  INFO("worst ratio " << ratio << ", max abs " << max_abs << ", norm ratio " << norm_ratio);
  CHECK(ratio <= 1.0);
  CHECK(norm_ratio <= 1.0);
  for (int s = 0; s < steps; ++s) {
    double mean = 0;
    for (int w = 0; w < workers; ++w) mean += relay.losses[w][s] / workers;
    CHECK(mean == Approx(ref.losses[s]).epsilon(1e-5));
  }
  // The base did not move (both sides hold the initial, rounded base bit for bit); the
  // adapters did (every B started at 0); the pushed gradients were the trainable spans.
  auto fresh = ReferenceTrainer::Create(job);
  REQUIRE(fresh.ok());
  const std::vector<LayerLayout> layouts = BuildLoraLayout(job.model, job.lora);
  double b_max = 0;
  size_t frozen = 0;
  for (size_t l = 0; l < layouts.size(); ++l) {
    CHECK(relay.last_grads[l].size() == TrainableRange(layouts[l]).numel);
    for (const ParamInfo& p : layouts[l].params) {
      for (size_t i = p.offset; i < p.offset + p.numel; ++i) {
        if (!p.trainable) {
          frozen += relay.params[l][i] == (*fresh)->params()[l][i] && ref.params[l][i] == (*fresh)->params()[l][i];
        } else if (p.name.find(".lora_B.") != std::string::npos) {
          b_max = std::max(b_max, std::fabs(double(relay.params[l][i])));
        }
      }
    }
  }
  size_t frozen_total = 0;
  for (const LayerLayout& l : layouts) {
    for (const ParamInfo& p : l.params) frozen_total += p.trainable ? 0 : p.numel;
  }
  CHECK(frozen == frozen_total);
  CHECK(b_max > 1e-3);
}

}  // namespace l2l::worker
