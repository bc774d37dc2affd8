// Tests for common/config.h and common/yaml_util.h: the shipped configs load with the
// shapes their names promise, a config survives JobConfigToYaml -> ParseJobConfig, every
// kind of bad input is rejected with a message naming the file:line and the key path,
// presets resolve as documented, and --set overrides apply with the same checks.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

#include "common/config.h"
#include "common/formats/tokens_file.h"
#include "tests/common/temp_dir.h"
#include "tests/testing/scoped_env.h"

namespace l2l {
namespace {

using testing::TempDir;

const std::string kConfigs = std::string(L2L_SOURCE_DIR) + "/configs";

// Expects `r` to fail with a message containing every one of `needles`.
const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) { return r.status(); }

template <typename R>
void ExpectError(const R& r, std::initializer_list<std::string> needles) {
  REQUIRE_FALSE(r.ok());
  const std::string msg = StatusOf(r).message();
  INFO("message: " << msg);
  for (const std::string& n : needles) CHECK(msg.find(n) != std::string::npos);
}

Result<JobConfig> ParseIn(const TempDir& dir, const std::string& text) {
  return LoadJobConfig(dir.Write("job.yaml", text));
}

void RequireEqual(const JobConfig& a, const JobConfig& b) {
  REQUIRE(a.model == b.model);
  CHECK(a.optim.lr == b.optim.lr);
  CHECK(a.optim.min_lr_ratio == b.optim.min_lr_ratio);
  CHECK(a.optim.warmup_steps == b.optim.warmup_steps);
  CHECK(a.optim.total_steps == b.optim.total_steps);
  CHECK(a.optim.beta1 == b.optim.beta1);
  CHECK(a.optim.beta2 == b.optim.beta2);
  CHECK(a.optim.eps == b.optim.eps);
  CHECK(a.optim.weight_decay == b.optim.weight_decay);
  CHECK(a.optim.grad_clip == b.optim.grad_clip);
  CHECK(a.optim.gpu_fraction == b.optim.gpu_fraction);
  CHECK(a.train.steps == b.train.steps);
  CHECK(a.train.micro_batch_size == b.train.micro_batch_size);
  CHECK(a.train.micro_batches == b.train.micro_batches);
  CHECK(a.train.micro_batches_auto == b.train.micro_batches_auto);
  CHECK(a.train.seq_len == b.train.seq_len);
  CHECK(a.train.seed == b.train.seed);
  CHECK(a.train.log_every == b.train.log_every);
  CHECK(a.train.checkpoint_every == b.train.checkpoint_every);
  CHECK(a.train.mode == b.train.mode);
  CHECK(a.train.staleness == b.train.staleness);
  CHECK(a.train.clip == b.train.clip);
  CHECK(a.train.stash == b.train.stash);
  CHECK(a.train.stash_dtype == b.train.stash_dtype);
  CHECK(a.train.recompute == b.train.recompute);
  CHECK(a.train.activation_budget_mb == b.train.activation_budget_mb);
  CHECK(a.data.train_path == b.data.train_path);
  CHECK(a.data.val_path == b.data.val_path);
  CHECK(a.publish_dtype == b.publish_dtype);
  CHECK(a.eval.data_path == b.eval.data_path);
  CHECK(a.eval.every == b.eval.every);
  CHECK(a.eval.tokens == b.eval.tokens);
}

}  // namespace

TEST_CASE("Shipped model presets load with the shapes their names promise", "[config]") {
  struct Want {
    const char* name;
    ModelSpec spec;
  };
  const Want wants[] = {
      {"tiny", {256, 32, 32, 2, 2, 128, true}},
      {"small", {256, 128, 128, 4, 4, 512, true}},
      {"gpt2-small", {50257, 1024, 768, 12, 12, 3072, true}},
      {"gpt2-medium", {50257, 1024, 1024, 24, 16, 4096, true}},
      {"gpt2-large", {50257, 1024, 1280, 36, 20, 5120, true}},
      {"gpt2-xl", {50257, 1024, 1600, 48, 25, 6400, true}},
      {"6.7b", {50257, 2048, 4096, 32, 32, 16384, true}},
  };
  for (const Want& w : wants) {
    INFO(w.name);
    Result<JobConfig> cfg = LoadJobConfig(kConfigs + "/models/" + w.name + ".yaml");
    REQUIRE(cfg.ok());
    CHECK(cfg->model == w.spec);
  }
  // GPT-2 small has the well-known 124,439,808 parameters (tied embeddings).
  CHECK(LoadJobConfig(kConfigs + "/models/gpt2-small.yaml")->model.NumParams() == 124439808);
}

TEST_CASE("Shipped job configs load and quickstart uses the small preset and resolves data paths", "[config]") {
  Result<JobConfig> q = LoadJobConfig(kConfigs + "/quickstart.yaml");
  INFO(q.status().ToString());
  REQUIRE(q.ok());
  CHECK(q->model == ModelSpec{256, 128, 128, 4, 4, 512, true});
  CHECK(std::filesystem::path(q->data.train_path).is_absolute());
  CHECK(q->data.train_path ==
        std::filesystem::absolute(kConfigs + "/../data/quickstart/train.bin").lexically_normal().string());
  Result<JobConfig> t = LoadJobConfig(kConfigs + "/test-tiny.yaml");
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  CHECK(t->model == ModelSpec{256, 32, 32, 2, 2, 128, true});
}

TEST_CASE("A job config survives JobConfigToYaml -> ParseJobConfig unchanged", "[config]") {
  TempDir dir;
  Result<JobConfig> a = ParseIn(dir, R"(
model: {vocab_size: 300, seq_len: 48, d_model: 36, n_layer: 3, n_head: 6, d_ff: 100, tied_embeddings: false}
optim: {lr: 3.3e-4, min_lr_ratio: 0.07, warmup_steps: 11, total_steps: 999, beta1: 0.85, beta2: 0.999,
        eps: 1.0e-7, weight_decay: 0.01, grad_clip: -1, gpu_fraction: 0.33}
train: {steps: 77, micro_batch_size: 3, micro_batches: 5, seq_len: 40, seed: 18446744073709551615,
        log_every: 7, checkpoint_every: 20, mode: lockfree, staleness: 2, clip: per_layer, stash: host,
        stash_dtype: bf16, recompute: auto, activation_budget_mb: 123}
data: {train_path: "tok ens/train.bin", val_path: /abs/val.bin}
publish_dtype: bf16
)");
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  CHECK(a->optim.lr == 3.3e-4f);
  CHECK(a->optim.gpu_fraction == GpuFraction{.automatic = false, .value = 0.33});
  CHECK(a->train.seed == 18446744073709551615ull);
  CHECK(a->data.train_path == dir.File("tok ens/train.bin"));
  CHECK(a->data.val_path == "/abs/val.bin");
  CHECK(a->publish_dtype == DType::kBF16);
  CHECK(a->seq_len() == 40);
  CHECK(a->train.recompute == RecomputeMode::kAuto);
  CHECK(a->train.activation_budget_mb == 123);
  CHECK(a->train.stash_dtype == DType::kBF16);
  const std::string text = JobConfigToYaml(*a);
  Result<JobConfig> b = ParseJobConfig(text, "<roundtrip>", "/elsewhere");
  INFO(text);
  REQUIRE(b.ok());
  RequireEqual(*a, *b);
  // And the defaults round-trip too.
  Result<JobConfig> d = ParseJobConfig(JobConfigToYaml(JobConfig{}), "<defaults>");
  REQUIRE(d.ok());
  RequireEqual(JobConfig{}, *d);
}

TEST_CASE("train.micro_batches: auto is kept (for the worker's planner) and round-trips", "[config]") {
  TempDir dir;
  Result<JobConfig> a = ParseIn(dir, "train: {steps: 3, micro_batches: auto}\n");
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  CHECK(a->train.micro_batches_auto);
  CHECK(a->train.micro_batches == TrainingConfig{}.micro_batches);  // until the worker plans it
  const std::string text = JobConfigToYaml(*a);
  CHECK(text.find("micro_batches: auto") != std::string::npos);
  Result<JobConfig> b = ParseJobConfig(text, "<roundtrip>");
  REQUIRE(b.ok());
  RequireEqual(*a, *b);
  // Any other word is still an error naming the key.
  ExpectError(ParseIn(dir, "train: {micro_batches: many}\n"), {"train.micro_batches"});
}

TEST_CASE("Malformed YAML is rejected with the parser's file:line", "[config][errors]") {
  TempDir dir;
  auto r = ParseIn(dir, "train:\n  steps: 5\n  mode: [sync\n");
  ExpectError(r, {dir.File("job.yaml") + ":", "malformed YAML"});
  ExpectError(ParseJobConfig("a: b: c", "<text>"), {"<text>:1:", "malformed YAML"});
}

TEST_CASE("An empty, whitespace-only or comment-only job file is an error, not every default",
          "[config][errors]") {
  TempDir dir;
  for (const char* text : {"", "   \n\t\n", "# just a comment\n# and another\n", "---\n"}) {
    INFO("text: '" << text << "'");
    ExpectError(ParseIn(dir, text), {dir.File("job.yaml"), "the job config is empty"});
  }
  ExpectError(ParseJobConfig("", "<CreateJob>"), {"<CreateJob>", "empty"});
}

TEST_CASE("Unknown keys are rejected naming the key path and line", "[config][errors]") {
  TempDir dir;
  ExpectError(ParseIn(dir, "train:\n  steps: 5\n  stpes: 6\n"),
              {dir.File("job.yaml") + ":3", "unknown key train.stpes", "steps"});
  ExpectError(ParseIn(dir, "# comment\ntrainer:\n  steps: 5\n"), {"job.yaml:2", "unknown key trainer"});
  ExpectError(ParseIn(dir, "model:\n  d_model: 32\n  heads: 4\n"), {"job.yaml:3", "unknown key model.heads"});
}

TEST_CASE("A model whose n_head does not divide d_model is rejected at the model section", "[config][errors]") {
  TempDir dir;
  ExpectError(ParseIn(dir, "train:\n  steps: 5\nmodel:\n  d_model: 30\n  n_head: 4\n"),
              {dir.File("job.yaml") + ":3", "n_head=4", "d_model=30"});
  // Also when the divisibility is broken by a key overriding a preset.
  ExpectError(ParseIn(dir, "model:\n  preset: " + kConfigs + "/models/tiny.yaml\n  n_head: 5\n"),
              {"job.yaml:1", "n_head=5", "d_model=32"});
}

TEST_CASE("Zero and negative values are rejected naming key, value and line", "[config][errors]") {
  TempDir dir;
  ExpectError(ParseIn(dir, "train:\n  micro_batch_size: 0\n"),
              {"job.yaml:2", "train.micro_batch_size", "'0'", "integer >= 1"});
  ExpectError(ParseIn(dir, "optim:\n  lr: 1e-3\n  eps: -1e-8\n"), {"job.yaml:3", "optim.eps", "'-1e-8'", "> 0"});
  ExpectError(ParseIn(dir, "model:\n  n_layer: -2\n"), {"job.yaml:2", "model.n_layer", "'-2'"});
  ExpectError(ParseIn(dir, "optim:\n  beta2: 1.0\n"), {"job.yaml:2", "optim.beta2", "[0, 1)"});
  ExpectError(ParseIn(dir, "model:\n  seq_len: 16\ntrain:\n  seq_len: 17\n"),
              {"job.yaml:4", "train.seq_len=17", "model.seq_len=16"});
}

TEST_CASE("Values of the wrong type are rejected naming key, value and expected type", "[config][errors]") {
  TempDir dir;
  ExpectError(ParseIn(dir, "train:\n  steps: five\n"), {"job.yaml:2", "train.steps", "'five'", "integer"});
  ExpectError(ParseIn(dir, "train:\n  steps: 1.5\n"), {"job.yaml:2", "train.steps", "'1.5'"});
  ExpectError(ParseIn(dir, "train:\n  steps: 99999999999999999999\n"), {"train.steps", "99999999999999999999"});
  ExpectError(ParseIn(dir, "model:\n  tied_embeddings: maybe\n"),
              {"job.yaml:2", "model.tied_embeddings", "'maybe'", "true or false"});
  ExpectError(ParseIn(dir, "optim:\n  lr: [1, 2]\n"), {"job.yaml:2", "optim.lr", "a list"});
  ExpectError(ParseIn(dir, "optim:\n  lr: .nan\n"), {"optim.lr", ".nan"});
  ExpectError(ParseIn(dir, "train: 5\n"), {"job.yaml:1", "train", "expected a map"});
  ExpectError(ParseIn(dir, "train:\n  mode: async\n"), {"job.yaml:2", "train.mode", "'async'", "sync, lockfree"});
  ExpectError(ParseIn(dir, "publish_dtype: f64\n"), {"job.yaml:1", "publish_dtype", "'f64'"});
  ExpectError(ParseIn(dir, "train:\n  stash_dtype: f16\n"), {"job.yaml:2", "train.stash_dtype", "'f16'", "f32, bf16"});
  ExpectError(ParseIn(dir, "train:\n  steps: 1\n  steps: 2\n"), {"job.yaml:3", "duplicate key train.steps"});
  ExpectError(ParseIn(dir, "- a\n- b\n"), {"expected a map"});
}

TEST_CASE("Presets resolve beside the config, via L2L_CONFIG_DIR, or fail listing the paths tried", "[config]") {
  TempDir dir;
  dir.Write("models/mine.yaml", "model:\n  vocab_size: 100\n  d_model: 24\n  n_head: 3\n  n_layer: 1\n");
  Result<JobConfig> a = ParseIn(dir, "model:\n  preset: mine\n  n_layer: 5\n");
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  CHECK(a->model.vocab_size == 100);
  CHECK(a->model.d_model == 24);
  CHECK(a->model.n_layer == 5);  // the job's key wins over the preset's

  ExpectError(ParseIn(dir, "model:\n  preset: nosuch\n"), {"job.yaml:2", "model.preset", "nosuch", "tried"});
  ExpectError(ParseIn(dir, "model:\n  preset: ../etc\n"), {"model.preset"});
  dir.Write("models/bad.yaml", "model:\n  d_modle: 24\n");
  ExpectError(ParseIn(dir, "model:\n  preset: bad\n"), {"job.yaml:2", "bad.yaml:2", "unknown key model.d_modle"});
  dir.Write("models/loop.yaml", "model:\n  preset: mine\n");
  ExpectError(ParseIn(dir, "model:\n  preset: loop\n"), {"cannot name another preset"});

  TempDir other;
  other.Write("models/envonly.yaml", "model:\n  d_model: 48\n");
  Result<JobConfig> e = [&] {
    testing::ScopedEnv config_dir("L2L_CONFIG_DIR", other.path());
    return ParseIn(dir, "model:\n  preset: envonly\n");
  }();
  INFO(e.status().ToString());
  REQUIRE(e.ok());
  CHECK(e->model.d_model == 48);
}

TEST_CASE("Overrides apply with the same checks and leave the config unchanged on error", "[config]") {
  JobConfig cfg;
  cfg.model = ModelSpec{256, 32, 32, 2, 2, 128, true};
  REQUIRE(ApplyOverride(&cfg, "train.steps=5").ok());
  CHECK(cfg.train.steps == 5);
  REQUIRE(ApplyOverride(&cfg, "optim.lr=2e-4").ok());
  CHECK(cfg.optim.lr == 2e-4f);
  REQUIRE(ApplyOverride(&cfg, "publish_dtype=bf16").ok());
  CHECK(cfg.publish_dtype == DType::kBF16);
  REQUIRE(ApplyOverride(&cfg, "data.train_path=/x/y.bin").ok());
  CHECK(cfg.data.train_path == "/x/y.bin");

  const JobConfig before = cfg;
  ExpectError(ApplyOverride(&cfg, "train.steps=abc"), {"train.steps", "'abc'", "integer"});
  ExpectError(ApplyOverride(&cfg, "train.stepz=3"), {"unknown key train.stepz"});
  ExpectError(ApplyOverride(&cfg, "model.n_head=5"), {"n_head=5", "d_model=32"});
  ExpectError(ApplyOverride(&cfg, "train.seq_len=64"), {"train.seq_len=64", "model.seq_len=32"});
  ExpectError(ApplyOverride(&cfg, "steps"), {"section.key=value"});
  ExpectError(ApplyOverride(&cfg, "a.b.c=1"), {"section.key=value"});
  RequireEqual(before, cfg);
}

TEST_CASE("JobConfig::Validate catches bad values set in code", "[config][errors]") {
  JobConfig cfg;
  REQUIRE(cfg.Validate().ok());
  cfg.train.micro_batches = 0;
  CHECK(cfg.Validate().message().find("train.micro_batches=0") != std::string::npos);
  cfg = JobConfig{};
  cfg.train.staleness = -1;
  CHECK(cfg.Validate().message().find("train.staleness=-1") != std::string::npos);
  cfg = JobConfig{};
  cfg.model.n_head = 3;
  CHECK(cfg.Validate().message().find("n_head") != std::string::npos);
}

TEST_CASE("train.recompute and train.activation_budget_mb reject bad values, naming the key", "[config]") {
  TempDir dir;
  ExpectError(ParseIn(dir, "train:\n  recompute: sometimes\n"), {"train.recompute", "always, never, auto"});
  ExpectError(ParseIn(dir, "train:\n  activation_budget_mb: -1\n"), {"train.activation_budget_mb"});
}

}  // namespace l2l

namespace l2l {
namespace {

// A tokens file of `n` ids (id i = i % modulo) at dir/name.
std::string WriteEvalTokens(const TempDir& dir, const std::string& name, size_t n, uint32_t modulo) {
  std::vector<uint16_t> toks(n);
  for (size_t i = 0; i < n; ++i) toks[i] = static_cast<uint16_t>(i % modulo);
  const std::string p = dir.File(name);
  REQUIRE(WriteTokensFile(p, toks).ok());
  return p;
}

// A small job (B=2, T=8: one micro-batch of eval windows is 2*8+1 = 17 tokens) with `eval`.
std::string EvalJob(const std::string& eval) {
  return "model: {vocab_size: 64, seq_len: 8, d_model: 16, n_layer: 1, n_head: 2, d_ff: 32}\n"
         "train: {steps: 10, micro_batch_size: 2, micro_batches: 1}\n" + eval;
}

}  // namespace

TEST_CASE("An eval section parses into EvalConfig, resolves its path and round-trips", "[config][eval]") {
  TempDir dir;
  WriteEvalTokens(dir, "held out.bin", 100, 64);
  Result<JobConfig> a = ParseIn(dir, EvalJob("eval: {data: \"held out.bin\", every: 3, tokens: 40}\n"));
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  CHECK(a->eval.enabled());
  CHECK(a->eval.data_path == dir.File("held out.bin"));
  CHECK(a->eval.every == 3);
  CHECK(a->eval.tokens == 40);
  CHECK(a->eval.windows(8) == 4);         // (40-1)/8
  CHECK(a->eval.micro_batches(2, 8) == 2);
  // Evaluated at steps 3, 6, 9 (1-based) and the last, 10.
  std::vector<int64_t> at;
  for (int64_t s = 0; s < 10; ++s) {
    if (a->EvalAt(s)) at.push_back(s + 1);
  }
  CHECK(at == std::vector<int64_t>{3, 6, 9, 10});
  Result<JobConfig> b = ParseJobConfig(JobConfigToYaml(*a), "<roundtrip>", "/elsewhere");
  INFO(JobConfigToYaml(*a));
  REQUIRE(b.ok());
  RequireEqual(*a, *b);
  // Without the section: disabled, and no step evaluates.
  Result<JobConfig> none = ParseIn(dir, EvalJob(""));
  REQUIRE(none.ok());
  CHECK_FALSE(none->eval.enabled());
  CHECK_FALSE(none->EvalAt(9));
}

TEST_CASE("Bad eval sections are rejected naming the eval key, the value and the line", "[config][eval][errors]") {
  TempDir dir;
  const std::string good = WriteEvalTokens(dir, "val.bin", 100, 64);
  const std::string job = dir.File("job.yaml");
  SECTION("missing file") {
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: nope.bin\n  every: 2\n  tokens: 17\n")),
                {job + ":4", "eval.data=", "nope.bin", "no such file"});
  }
  SECTION("every <= 0") {
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: val.bin\n  every: 0\n  tokens: 17\n")),
                {job + ":5", "eval.every", "'0'"});
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: val.bin\n  every: -3\n  tokens: 17\n")),
                {job + ":5", "eval.every", "'-3'"});
  }
  SECTION("every missing") {
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: val.bin\n  tokens: 17\n")), {"eval.every=0", "integer >= 1"});
  }
  SECTION("tokens below one micro-batch") {
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: val.bin\n  every: 2\n  tokens: 16\n")),
                {job + ":6", "eval.tokens=16", "one micro-batch", "2*8+1 = 17"});
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: val.bin\n  every: 2\n  tokens: 0\n")),
                {job + ":6", "eval.tokens", "'0'"});
  }
  SECTION("tokens beyond the file") {
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: val.bin\n  every: 2\n  tokens: 101\n")),
                {"eval.data=", "val.bin", "holds 100 tokens", "eval.tokens=101"});
  }
  SECTION("ids outside the model's vocabulary") {
    WriteEvalTokens(dir, "big.bin", 100, 65);  // id 64 at index 64
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: big.bin\n  every: 2\n  tokens: 70\n")),
                {job + ":4", "eval.data=", "big.bin", "token 64 is id 64", "[0, 64)"});
    // The same file is fine when only its first 64 tokens are scored.
    CHECK(ParseIn(dir, EvalJob("eval:\n  data: big.bin\n  every: 2\n  tokens: 64\n")).ok());
  }
  SECTION("not a tokens file") {
    dir.Write("text.bin", std::string(3000, 'x'));
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: text.bin\n  every: 2\n  tokens: 17\n")),
                {job + ":4", "eval.data=", "text.bin"});
  }
  SECTION("a loss mask of the wrong length") {
    std::vector<uint8_t> mask(50, 1);
    REQUIRE(WriteLossMaskFile(LossMaskPath(good), mask).ok());
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: val.bin\n  every: 2\n  tokens: 17\n")),
                {"eval.data=", "val.bin", "loss mask"});
  }
  SECTION("empty data, unknown keys, every/tokens without data") {
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: \"\"\n  every: 2\n")), {job + ":4", "eval.data is empty"});
    ExpectError(ParseIn(dir, EvalJob("eval:\n  data: val.bin\n  every: 2\n  tokens: 17\n  evry: 3\n")),
                {job + ":7", "eval.evry"});
    ExpectError(ParseIn(dir, EvalJob("eval:\n  every: 2\n  tokens: 17\n")), {"eval.data", "every / eval.tokens"});
  }
  SECTION("an override is checked the same way") {
    Result<JobConfig> cfg = ParseIn(dir, EvalJob("eval: {data: val.bin, every: 2, tokens: 17}\n"));
    REQUIRE(cfg.ok());
    ExpectError(Status(ApplyOverride(&*cfg, "eval.every=0")), {"eval.every", "'0'"});
    CHECK(cfg->eval.every == 2);
    ExpectError(Status(ApplyOverride(&*cfg, "eval.tokens=9")), {"eval.tokens=9", "2*8+1 = 17"});
    REQUIRE(ApplyOverride(&*cfg, "eval.tokens=33").ok());
    CHECK(cfg->eval.tokens == 33);
  }
  SECTION("job text from the daemon or a checkpoint is not checked against files here") {
    // A worker on another host, or l2l-eval reading a checkpoint whose eval file is gone:
    // ParseJobConfig keeps the section; the worker and the daemon check the file.
    Result<JobConfig> cfg = ParseJobConfig(EvalJob("eval: {data: /nonexistent/val.bin, every: 2, tokens: 17}\n"),
                                           "<register reply>");
    INFO(cfg.status().ToString());
    REQUIRE(cfg.ok());
    CHECK(cfg->eval.data_path == "/nonexistent/val.bin");
    ExpectError(CheckEvalData(*cfg), {"eval.data=/nonexistent/val.bin", "no such file"});
  }
  SECTION("Validate catches values set in code") {
    Result<JobConfig> cfg = ParseIn(dir, EvalJob("eval: {data: val.bin, every: 2, tokens: 17}\n"));
    REQUIRE(cfg.ok());
    JobConfig c = *cfg;
    c.eval.every = 0;
    ExpectError(c.Validate(), {"eval.every=0"});
    c = *cfg;
    c.train.micro_batch_size = 3;  // one micro-batch is now 3*8+1 = 25 tokens
    ExpectError(c.Validate(), {"eval.tokens=17", "3*8+1 = 25"});
    c = *cfg;
    c.model.vocab_size = 10;  // CheckEvalData: ids 10.. of the file are outside
    ExpectError(CheckEvalData(c), {"eval.data=", "token 10 is id 10", "[0, 10)"});
  }
}

}  // namespace l2l
