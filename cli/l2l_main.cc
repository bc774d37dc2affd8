// l2l: the front door. One command per task a user has; the programs it runs (l2l-eps,
// l2l-worker, l2lctl, l2l-tokenize, l2l-eval, l2l-sample) stay for operators and scripts.
//
//   l2l finetune --model M --data D [--out DIR] [--steps N] [--seq-len T] [--batch B]
//                [--lr X] [--val-fraction F] [--device cpu|cuda:N ...] [--threads N]
//                [--export hf|safetensors|gguf|none] [--no-eval] [--resume] [--quiet|--json]
//                [--lora [--lora-r R] [--lora-alpha A] [--lora-base q4|q8|bf16|fp32]
//                        [--lora-target all-linear|q_proj,v_proj,...] [--lora-dropout P]]
//       M: a Hugging Face directory or a GGUF file. D: text, SFT JSONL (.jsonl: prompt /
//       completion or messages, the loss on completions only) or an llm.c tokens file
//       (.bin). Tokenizes D with M's tokenizer (bytes when a directory has no
//       tokenizer.json; the last F held out), writes DIR/job.yaml,
//       measures held-out perplexity before, trains through the relay (l2l-eps + one
//       worker per --device), exports DIR/model-hf, measures perplexity after, and prints
//       a summary as its last lines (also written to DIR/summary.json).
//       --lora: LoRA / QLoRA instead of full fine-tuning (the job's `lora:` section,
//       docs/finetune.md): adapters of rank R (16) and alpha A (2R) on every linear of the
//       blocks, the frozen base held in 4-bit NF4 (q4, the default), lr 5e-4 unless --lr
//       is given; exports the merged model (DIR/model-hf) and the PEFT adapter (DIR/adapter).
//   l2l run JOB.yaml [--out DIR] [--device ...] [--threads N] [--export F] [--resume] [--quiet|--json]
//       the same for a job file written by hand (docs/finetune.md).
//   l2l eval | sample | chat | tokenize ARGS...   = l2l-eval | l2l-sample | l2l-chat | l2l-tokenize ARGS...
//   l2l export | status ARGS...           = l2lctl export | status ARGS... (a running daemon)
//
// Progress (cli/progress.h): a live line on a terminal, plain lines on a pipe, JSON lines
// with --json, only the summary with --quiet; warnings and errors on stderr, in colour on
// a terminal.
// Ctrl-C during training checkpoints and stops cleanly (a second Ctrl-C: stop now); run
// again with --resume (same --out) to continue. Exit status: 0 done, 1 failed, 130
// interrupted (checkpointed), 64 bad usage.
// main() only parses flags, builds objects and runs (STYLE.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli/job_runner.h"
#include "cli/progress.h"
#include "common/child_process.h"
#include "common/status.h"

namespace {

namespace fs = std::filesystem;
namespace cli = l2l::cli;

constexpr int kExitUsage = 64;

struct FinetuneFlags {
  std::string model, data, out = "l2l-out";
  int64_t steps = 30, seq_len = 256, batch = 4, micro_batches = 1;
  double lr = 1e-4, val_fraction = 0.1;
  bool no_eval = false;
  bool lr_given = false;  // --lr on the command line (LoRA's default is 5e-4)
  // --lora: the job's `lora:` section (common/lora.h).
  bool lora = false;
  int64_t lora_r = 16;
  double lora_alpha = 0;  // 0: 2 * r
  double lora_dropout = 0;
  std::string lora_base = "q4", lora_target = "all-linear";
};

// The job's `lora:` line for the flags ("" without --lora).
std::string LoraYaml(const FinetuneFlags& f) {
  if (!f.lora) return "";
  std::string targets;
  std::stringstream in(f.lora_target);
  for (std::string t; std::getline(in, t, ',');) {
    if (t.empty()) continue;
    targets += (targets.empty() ? "" : ", ") + t;
  }
  std::ostringstream y;
  y << "lora: {r: " << f.lora_r << ", alpha: " << (f.lora_alpha > 0 ? f.lora_alpha : 2.0 * f.lora_r)
    << ", dropout: " << f.lora_dropout << ", target: [" << targets << "], base_dtype: " << f.lora_base << "}\n";
  return y.str();
}

struct CommonFlags {
  std::string out = "l2l-out", export_format = "hf", export_type;
  std::vector<std::string> devices;
  int threads = 0;
  bool resume = false, quiet = false, json = false;
};

std::string BinDir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

std::string Abs(const std::string& p) { return fs::absolute(p).lexically_normal().string(); }

// Runs a program to completion with its output in `log`; an error carries the log's tail.
l2l::Status RunQuiet(const std::vector<std::string>& argv, const std::string& log, const std::string& what) {
  L2L_ASSIGN_OR_RETURN(std::unique_ptr<l2l::ChildProcess> p, l2l::ChildProcess::Spawn(argv, log));
  l2l::Result<int> rc = p->Wait(std::chrono::hours(24));
  if (!rc.ok()) return rc.status();
  if (*rc != 0) return l2l::Internal(what + " failed (exit " + std::to_string(*rc) + "):\n" + p->LogTail(1200));
  return l2l::Status::Ok();
}

// l2l-eval's perplexity of `model` on `data` (NaN when it cannot be measured).
double Perplexity(const std::string& bin, const std::string& model, const std::string& data, int64_t context,
                  const std::string& log) {
  std::error_code ec;
  fs::remove(log, ec);
  if (!RunQuiet({bin + "/l2l-eval", "--model", model, "--data", data, "--context", std::to_string(context)}, log,
                "l2l-eval")
           .ok()) {
    return std::nan("");
  }
  std::ifstream f(log);
  std::string line;
  std::smatch m;
  static const std::regex re("perplexity ([0-9.eE+-]+)");
  while (std::getline(f, line)) {
    if (std::regex_search(line, m, re)) return std::stod(m[1]);
  }
  return std::nan("");
}

cli::RunOptions ToRunOptions(const CommonFlags& c, const std::string& job) {
  cli::RunOptions o;
  o.job_path = job;
  o.out = c.out;
  o.bin_dir = BinDir();
  o.resume = c.resume;
  if (!c.devices.empty()) o.devices = c.devices;
  o.threads = c.threads;
  o.export_format = c.export_format;
  o.export_type = c.export_type;
  return o;
}

using Clock = std::chrono::steady_clock;

std::string FormatPpl(double p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4f", p);
  return buf;
}

cli::Summary ToSummary(const cli::RunResult& r, const std::string& out, const CommonFlags& c, Clock::time_point t0) {
  cli::Summary s;
  s.end = r.end == cli::RunResult::End::kFinished      ? "finished"
          : r.end == cli::RunResult::End::kInterrupted ? "interrupted"
                                                       : "failed";
  s.steps = r.steps;
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  s.export_path = r.export_path;
  s.export_format = c.export_format;
  s.checkpoint = r.checkpoint;
  s.resume_hint = "--resume --out " + out;
  s.out = out;
  s.workers = c.devices.empty() ? 1 : static_cast<int>(c.devices.size());
  return s;
}

// The summary, last; also into OUT/summary.json.
void Finish(cli::Progress* progress, const cli::Summary& s) {
  std::ofstream(s.out + "/summary.json") << cli::SummaryJson(s) << "\n";
  progress->PrintSummary(s);
}

int Fail(cli::Progress* progress, const l2l::Status& s) {
  progress->Error(s.ToString());
  return 1;
}

cli::Progress MakeProgress(const CommonFlags& c) {
  return cli::Progress(cli::ChooseProgressMode(c.quiet, c.json, isatty(STDOUT_FILENO) != 0), stdout, stderr,
                       isatty(STDERR_FILENO) != 0);
}

int CmdRun(const CommonFlags& c, const std::string& job) {
  const auto t0 = Clock::now();
  cli::Progress progress = MakeProgress(c);
  if (!c.resume && !fs::is_regular_file(job)) {
    return Fail(&progress, l2l::NotFound("job file " + job + " does not exist"));
  }
  cli::RunOptions o = ToRunOptions(c, Abs(job));
  l2l::Result<cli::RunResult> r = cli::RunJob(o, &progress);
  if (!r.ok()) return Fail(&progress, r.status());
  Finish(&progress, ToSummary(*r, Abs(c.out), c, t0));
  return cli::ExitStatus(*r);
}

int CmdFinetune(const CommonFlags& c, const FinetuneFlags& f) {
  const auto t0 = Clock::now();
  cli::Progress progress = MakeProgress(c);
  auto fail = [&](const l2l::Status& s) { return Fail(&progress, s); };
  const std::string bin = BinDir(), out = Abs(c.out), model = Abs(f.model);
  if (!fs::exists(model)) return fail(l2l::NotFound("--model " + f.model + " does not exist"));
  std::error_code ec;
  fs::create_directories(out + "/data", ec);
  const std::string job = out + "/job.yaml";
  std::string train, val;
  if (c.resume) {
    if (!fs::exists(job)) return fail(l2l::FailedPrecondition("--resume: " + out + " has no job.yaml"));
    val = fs::exists(out + "/data/val.bin") ? out + "/data/val.bin" : "";
  } else {
    if (!fs::is_regular_file(f.data)) return fail(l2l::NotFound("--data " + f.data + " is not a file"));
    const std::string ext = fs::path(f.data).extension().string();
    if (ext == ".bin") {
      train = Abs(f.data);
    } else {
      train = out + "/data/train.bin";
      val = f.val_fraction > 0 ? out + "/data/val.bin" : "";
      std::vector<std::string> argv = {bin + "/l2l-tokenize", Abs(f.data), train};
      // The model's own tokenizer: a GGUF file, or a directory's tokenizer.json; a model
      // without one (a byte-level model of 256 ids) is tokenized by bytes.
      if (!fs::is_directory(model) || fs::exists(model + "/tokenizer.json")) {
        argv.insert(argv.end(), {"--tokenizer", model});
      }
      if (ext == ".jsonl") argv.push_back("--jsonl");
      if (!val.empty()) argv.insert(argv.end(), {"--val-fraction", std::to_string(f.val_fraction), "--val-output", val});
      progress.Note("tokenizing " + f.data + " with the model's tokenizer" +
                    (val.empty() ? "" : " (the last " + std::to_string(static_cast<int>(f.val_fraction * 100 + 0.5)) +
                                            "% held out)"));
      if (l2l::Status s = RunQuiet(argv, out + "/tokenize.log", "l2l-tokenize"); !s.ok()) return fail(s);
    }
    const int64_t warmup = std::max<int64_t>(1, f.steps / 10);
    const double lr = f.lora && !f.lr_given ? 5e-4 : f.lr;  // adapters take a larger step
    std::ofstream y(job);
    y << "# Written by `l2l finetune`: fine-tune " << model << " on " << Abs(f.data) << ".\n"
      << "model:\n  from: " << model << "\n"
      << "optim: {lr: " << lr << ", min_lr_ratio: 0.1, warmup_steps: " << warmup << ", total_steps: " << f.steps
      << ", weight_decay: 0.0, grad_clip: 1.0}\n"
      << "train: {steps: " << f.steps << ", micro_batch_size: " << f.batch << ", micro_batches: " << f.micro_batches
      << ", seq_len: " << f.seq_len << ", seed: 1234, log_every: 1, checkpoint_every: 0}\n"
      << "data: {train_path: " << train << "}\n"
      << LoraYaml(f);
    if (!val.empty()) {
      y << "eval: {data: " << val << ", every: " << std::max<int64_t>(1, f.steps / 3)
        << ", tokens: " << f.batch * f.seq_len + 1 << "}\n";
    }
    if (!y.good()) return fail(l2l::Internal("cannot write " + job));
  }
  const bool eval = !f.no_eval && !val.empty();
  double before = std::nan("");
  if (eval && !c.resume) {
    progress.Note("held-out perplexity before fine-tuning (log " + out + "/eval-before.log)");
    before = Perplexity(bin, model, val, f.seq_len, out + "/eval-before.log");
    if (std::isnan(before)) progress.Warn("could not measure it: see " + out + "/eval-before.log");
    else progress.Note("held-out perplexity before: " + FormatPpl(before));
  }
  cli::RunOptions o = ToRunOptions(c, job);
  l2l::Result<cli::RunResult> r = cli::RunJob(o, &progress);
  if (!r.ok()) return fail(r.status());
  double after = std::nan("");
  if (eval && r->end == cli::RunResult::End::kFinished && c.export_format == "hf") {
    progress.Note("held-out perplexity after fine-tuning (log " + out + "/eval-after.log)");
    after = Perplexity(bin, r->export_path, val, f.seq_len, out + "/eval-after.log");
    if (std::isnan(after)) progress.Warn("could not measure it: see " + out + "/eval-after.log");
  }
  cli::Summary summary = ToSummary(*r, out, c, t0);
  if (eval && r->end == cli::RunResult::End::kFinished) {
    summary.ppl_before = before;  // NaN on --resume (not measured by this run)
    summary.ppl_after = after;
  }
  Finish(&progress, summary);
  return cli::ExitStatus(*r);
}

// `l2l eval ...` and friends: the program itself, with the rest of the arguments.
int Forward(const std::string& program, const std::vector<std::string>& prefix, int argc, char** argv, int from) {
  std::vector<std::string> args = {BinDir() + "/" + program};
  args.insert(args.end(), prefix.begin(), prefix.end());
  for (int i = from; i < argc; ++i) args.push_back(argv[i]);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execv(cargs[0], cargs.data());
  std::fprintf(stderr, "l2l: cannot run %s: %s\n", args[0].c_str(), std::strerror(errno));
  return 127;
}

void AddCommon(CLI::App* app, CommonFlags* c) {
  app->add_option("--out", c->out, "output directory (job, data, state, logs, the model)")->capture_default_str();
  app->add_option("--device", c->devices, "cpu or cuda:N, repeatable: one worker each (default cpu)");
  app->add_option("--threads", c->threads, "CPU worker threads (0: all cores)");
  app->add_option("--export", c->export_format, "format of the result: hf | safetensors | gguf | none")
      ->check(CLI::IsMember({"hf", "safetensors", "gguf", "none"}))
      ->capture_default_str();
  app->add_option("--export-type", c->export_type,
                  "tensor type of the export (l2l export --dtype): f32 (default) or bf16; gguf also f16, q8_0 and "
                  "q4_k_m (llama.cpp's Q4_K_M mix)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0", "q4_k_m"}));
  app->add_flag("--resume", c->resume, "continue the run in --out from its last checkpoint");
  auto* q = app->add_flag("--quiet", c->quiet, "no progress, only the summary");
  app->add_flag("--json", c->json, "progress as JSON lines")->excludes(q);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2) {
    const std::string cmd = argv[1];
    if (cmd == "eval" || cmd == "sample" || cmd == "chat" || cmd == "tokenize") {
      return Forward("l2l-" + cmd, {}, argc, argv, 2);
    }
    if (cmd == "export" || cmd == "status") return Forward("l2lctl", {cmd}, argc, argv, 2);
  }
  CLI::App app{"l2l: fine-tune, evaluate and sample models larger than your GPU"};
  app.require_subcommand(1);
  CommonFlags common;
  FinetuneFlags ft;
  auto* finetune = app.add_subcommand("finetune", "fine-tune a pretrained model on your data, end to end");
  finetune->add_option("--model", ft.model, "Hugging Face directory or GGUF file")->required();
  finetune->add_option("--data", ft.data, "text, SFT .jsonl or tokens .bin file")->required();
  finetune->add_option("--steps", ft.steps, "optimizer steps")->capture_default_str()->check(CLI::PositiveNumber);
  finetune->add_option("--seq-len", ft.seq_len, "tokens per sequence")->capture_default_str()->check(CLI::PositiveNumber);
  finetune->add_option("--batch", ft.batch, "sequences per micro-batch")->capture_default_str()->check(CLI::PositiveNumber);
  finetune->add_option("--micro-batches", ft.micro_batches, "micro-batches per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  finetune->add_option("--lr", ft.lr, "peak learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  finetune->add_option("--val-fraction", ft.val_fraction, "held-out tail of the data (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
  finetune->add_flag("--no-eval", ft.no_eval, "skip the before/after perplexity");
  finetune->add_flag("--lora", ft.lora, "LoRA / QLoRA: train low-rank adapters, the base frozen (4-bit by default)");
  finetune->add_option("--lora-r", ft.lora_r, "--lora: adapter rank")->capture_default_str()->check(CLI::PositiveNumber);
  finetune->add_option("--lora-alpha", ft.lora_alpha, "--lora: scale numerator (default 2 x rank)")
      ->check(CLI::PositiveNumber);
  finetune->add_option("--lora-base", ft.lora_base, "--lora: how the frozen base is held: q4 (NF4) | q8 | bf16 | fp32")
      ->capture_default_str()
      ->check(CLI::IsMember({"q4", "q8", "bf16", "fp32"}));
  finetune->add_option("--lora-target", ft.lora_target,
                       "--lora: all-linear, or Hugging Face module names, comma-separated (q_proj,v_proj)")
      ->capture_default_str();
  finetune->add_option("--lora-dropout", ft.lora_dropout, "--lora: dropout on the adapters' input")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  AddCommon(finetune, &common);
  std::string job;
  auto* run = app.add_subcommand("run", "run a job file end to end");
  run->add_option("job", job, "job YAML")->required();
  AddCommon(run, &common);
  app.footer(
      "Also: l2l eval|sample|chat|tokenize ARGS (= l2l-eval|l2l-sample|l2l-chat|l2l-tokenize), l2l export|status "
      "ARGS (= l2lctl export|status, for a running daemon).\nExit status: 0 done, 1 failed, 130 interrupted (checkpointed; "
      "continue with --resume), 64 bad usage.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }
  if (*finetune) {
    ft.lr_given = finetune->count("--lr") > 0;
    for (const char* o : {"--lora-r", "--lora-alpha", "--lora-base", "--lora-target", "--lora-dropout"}) {
      if (!ft.lora && finetune->count(o) > 0) {
        std::fprintf(stderr, "l2l finetune: %s needs --lora\n", o);
        return kExitUsage;
      }
    }
    return CmdFinetune(common, ft);
  }
  return CmdRun(common, job);
}
