// In-job validation (job `eval: {data, every, tokens}`) through the real processes: a
// daemon and one or two workers (shared memory) train a small GPT-2 job for 4 steps with
// eval every 2 steps on a held-out tokens file with a loss mask. The val_loss the daemon
// logs in run.jsonl at step s must equal (rel <= 1e-5)
//   * the in-process reference trainer trained s-1 steps on the same data, then scoring
//     the same windows: the weights really are that step's; and
//   * l2l-eval (tools/eval_main.cc, the reference trainer's forward) on the checkpoint the
//     daemon wrote after s-1 steps (train.checkpoint_every 1; at least one of them): the
//     same weights, scored by independent code.
// The last val_loss also shows in the Prometheus gauge l2l_val_loss and in `l2lctl
// watch --json`.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "common/formats/tokens_file.h"
#include "eps_server/checkpoint.h"
#include "eps_server/run_log.h"
#include "kernels/backend.h"
#include "tests/integration/harness.h"
#include "tests/integration/relay_util.h"
#include "worker/data_loader.h"
#include "worker/reference/reference_trainer.h"

namespace l2l::itest {
namespace {

using namespace relay;  // tests/integration/relay_util.h

constexpr int64_t kEvalTokens = 5 * 16 + 1;  // 5 windows of T+1 = 17: micro-batches of 2, 2, 1

// stdout of `cmd` (2>&1) and its exit status.
std::pair<std::string, int> Shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  return {out, pclose(p)};
}

// The eval windows as l2l-eval cuts them (tools/eval_main.cc), scored by `ref`: the
// oracle's mean over the unmasked targets.
double ReferenceEvalLoss(worker::ReferenceTrainer* ref, const std::vector<int32_t>& toks,
                         const std::vector<uint8_t>& mask, int64_t T) {
  const int64_t windows = (kEvalTokens - 1) / T;
  double weighted = 0;
  int64_t scored = 0;
  for (int64_t w = 0; w < windows; ++w) {
    worker::MicroBatch mb;
    mb.B = 1;
    mb.T = T;
    int64_t count = 0;
    for (int64_t j = 0; j < T; ++j) {
      const size_t at = static_cast<size_t>(w * T + j);
      mb.inputs.push_back(toks[at]);
      const bool keep = mask[at + 1] != 0;
      mb.targets.push_back(keep ? toks[at + 1] : kernels::kIgnoreTarget);
      count += keep ? 1 : 0;
    }
    if (count == 0) continue;
    auto loss = ref->Evaluate({mb});
    REQUIRE(loss.ok());
    weighted += static_cast<double>(*loss) * static_cast<double>(count);
    scored += count;
  }
  REQUIRE(scored > 0);
  return weighted / static_cast<double>(scored);
}

void CheckRel(const std::string& what, double got, double want, double rel) {
  INFO(what << ": " << got << " vs " << want << " (rel " << std::fabs(got - want) / std::fabs(want) << ")");
  CHECK(std::fabs(got - want) <= rel * std::fabs(want));
}

}  // namespace

TEST_CASE("In-job validation logs the loss l2l-eval and the reference trainer give at that step's weights",
          "[integration][eval]") {
  const int workers = GENERATE(1, 2);
  INFO(workers << " worker(s)");
  Run r = Prepare("eval");
  r.job.train.steps = 4;
  r.job.train.checkpoint_every = 1;
  // Held-out data: another stream than train.bin, with a loss mask leaving out every
  // fifth target (as l2l-tokenize --jsonl masks prompts).
  std::vector<int32_t> held = MakeTokens(3000, r.job.model.vocab_size);
  held.erase(held.begin(), held.begin() + 1234);
  const std::string val_path = r.dir->File("val.bin");
  REQUIRE(WriteTokens(val_path, held).ok());
  std::vector<uint8_t> mask(held.size(), 1);
  for (size_t i = 0; i < mask.size(); i += 5) mask[i] = 0;
  REQUIRE(WriteLossMaskFile(LossMaskPath(val_path), mask).ok());
  r.job.eval.data_path = val_path;
  r.job.eval.every = 2;
  r.job.eval.tokens = kEvalTokens;
  REQUIRE(r.job.Validate().ok());

  DaemonOptions o;
  o.workers = workers;
  o.extra_args = {"--metrics-listen", "127.0.0.1:0"};
  auto eps = EpsDaemon::Start(r.job, o, *r.dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  const std::vector<std::string> logs = RunWorkers(**eps, *r.dir, workers, {"--transport", "shm"});
  for (const std::string& log : logs) REQUIRE(ParseProgress(log).size() == 4);

  // run.jsonl: val_loss and val_ppl on steps 2 and 4 only.
  auto records = eps::ReadRunLog((*eps)->state_dir() + "/run.jsonl");
  REQUIRE(records.ok());
  std::map<int64_t, double> val;
  for (const eps::StepRecord& rec : *records) {
    if (!rec.val_loss) continue;
    REQUIRE(rec.val_ppl);
    CHECK(*rec.val_ppl == Approx(std::exp(*rec.val_loss)).epsilon(1e-12));
    val[rec.step] = *rec.val_loss;
  }
  REQUIRE(val.size() == 2);
  REQUIRE(val.count(2) == 1);
  REQUIRE(val.count(4) == 1);
  CHECK(val[2] != val[4]);  // training moved the weights between them

  int l2l_eval_compared = 0;
  for (const auto& [step, loss] : val) {
    // The reference trainer, trained independently to the same step.
    auto ref = TrainedReference(r.job, workers, step - 1);
    CheckRel("step " + std::to_string(step) + " vs the reference trainer", loss,
             ReferenceEvalLoss(ref.get(), held, mask, 16), 1e-5);
    // l2l-eval on the checkpoint after step-1 optimizer steps (the weights step `step`'s
    // forward pass used). The periodic checkpointer skips a boundary the workers pass
    // while it writes the previous one, so a fast run may lack some; one always exists.
    const std::string ckpt = (*eps)->state_dir() + "/checkpoints/" + eps::CheckpointDirName(step - 1);
    INFO("checkpoint " << ckpt);
    if (!std::filesystem::exists(ckpt + "/manifest.json")) continue;
    ++l2l_eval_compared;
    const auto [out, rc] = Shell(BinaryPath("l2l-eval") + " --checkpoint " + ckpt + " --data " + val_path + " --tokens " +
                                 std::to_string(kEvalTokens) + " --context 16 --batch 2");
    INFO(out);
    REQUIRE(rc == 0);
    std::smatch m;
    REQUIRE(std::regex_search(out, m, std::regex("eval: loss ([0-9.eE+-]+)")));
    CheckRel("step " + std::to_string(step) + " vs l2l-eval", loss, std::stod(m[1]), 1e-5);
  }
  CHECK(l2l_eval_compared >= 1);

  // Metrics: the gauge holds the last validation loss (step 4).
  const std::string dlog = (*eps)->process().Log();
  std::smatch m;
  REQUIRE(std::regex_search(dlog, m, std::regex("metrics on http://127\\.0\\.0\\.1:([0-9]+)/metrics")));
  const Result<std::string> got = HttpGet(std::stoi(m[1]), "/metrics");
  INFO(got.status().ToString());
  REQUIRE(got.ok());
  const std::string& body = *got;
  INFO(body.substr(0, 3000));
  std::smatch g;
  REQUIRE(std::regex_search(body, g, std::regex("\nl2l_val_loss ([^\n]+)\n")));
  CheckRel("l2l_val_loss gauge", std::stod(g[1]), val[4], 1e-6);
  CHECK(body.find("# TYPE l2l_val_loss gauge") != std::string::npos);
  REQUIRE(std::regex_search(body, g, std::regex("\nl2l_val_step ([^\n]+)\n")));
  CHECK(std::stod(g[1]) == 4);

  // l2lctl watch (the job is finished: one line, then exit 0).
  const auto [watch, wrc] = Shell(BinaryPath("l2lctl") + " --eps " + (*eps)->address() + " --json watch");
  INFO(watch);
  REQUIRE(wrc == 0);
  const auto j = nlohmann::json::parse(watch.substr(0, watch.find('\n')));
  REQUIRE(j.contains("val_loss"));
  CheckRel("l2lctl watch val_loss", j.at("val_loss").get<double>(), val[4], 1e-6);
  CHECK(j.at("val_step").get<int64_t>() == 4);
  const auto [text, trc] = Shell(BinaryPath("l2lctl") + " --eps " + (*eps)->address() + " watch");
  INFO(text);
  CHECK(trc == 0);
  CHECK(text.find("val_loss ") != std::string::npos);

  REQUIRE((*eps)->Shutdown().ok());
}

}  // namespace l2l::itest
