// JobRunner: runs one training job end to end on this host, for the `l2l` front door
// (cli/l2l_main.cc): starts l2l-eps on the job file with a state directory under the
// output directory, one l2l-worker per device (the CPU when no GPU is asked for), polls
// the daemon's status into a Progress (cli/progress.h: a live line on a terminal, plain
// lines otherwise, JSON lines with --json, nothing with --quiet), and when the job ends
// exports the weights (a Hugging Face directory by default) and stops the daemon.
//
// Interrupts: the first SIGINT/SIGTERM asks the daemon for a checkpoint and a clean stop
// (the run can continue with --resume); a second one stops every child at once. The
// children run in their own process group, so a terminal's Ctrl-C reaches only `l2l`.
//
// The daemon is allowed to read the job's model (model.from) and data files where they
// are (their directories become --allow-models / --allow-data), since the user who runs
// `l2l` named them.
//
// Files under `out`: state/ (the daemon's state dir: eps.port, checkpoints/, run.jsonl),
// eps.log, worker-N.log, and the export (model-hf/ by default). A LoRA job (a `lora:`
// section in job_path) exports its merged model (l2lctl export --merge) and its PEFT
// adapter as adapter/.
//
// Thread-safety: one per process (it owns the process's SIGINT/SIGTERM handling while it
// runs).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/progress.h"
#include "common/status.h"

namespace l2l::cli {

struct RunOptions {
  std::string job_path;        // the job YAML
  std::string out;             // output directory (created)
  std::string bin_dir;         // where l2l-eps and l2l-worker live
  bool resume = false;         // continue from out/state/checkpoints (its `latest`)
  std::vector<std::string> devices = {"cpu"};  // one worker per device
  int threads = 0;             // CPU worker threads (0: all cores)
  std::string export_format = "hf";  // hf | safetensors | gguf | none
  std::string export_type;           // l2lctl export --dtype (empty: f32); the daemon refuses a bad pair
};

struct RunResult {
  enum class End { kFinished, kInterrupted, kFailed } end = End::kFailed;
  std::string export_path;     // "" when nothing was exported
  std::string checkpoint;      // the last checkpoint the daemon reported
  int64_t steps = 0;
  double seconds = 0;
};

// Runs the job, reporting to `progress` (borrowed); an error names what failed and points
// at the log that says why.
Result<RunResult> RunJob(const RunOptions& opts, Progress* progress);

// The exit status for a result: 0 finished, 130 interrupted (checkpointed), 1 failed.
int ExitStatus(const RunResult& r);

}  // namespace l2l::cli
