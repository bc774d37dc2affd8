// RunLog: the training run's step log, <state_dir>/run.jsonl, one JSON object per
// optimizer step, appended as each step completes. scripts/plot_run.py turns it into a
// PNG (loss, tokens/s, per-step time breakdown); operators tail it
// or load it with pandas (pd.read_json(path, lines=True)).
//
//   {"step":12,"time":1716200000.123,"loss":4.12,"tokens_per_s":5321.0,"lr":0.0003,
//    "forward_s":0.21,"recompute_s":0.18,"backward_s":0.33,"wait_layer_s":0.01,
//    "wait_push_s":0.0,"update_s":0.02,"val_loss":4.31,"val_ppl":74.4,"step_s":0.77,
//    "compute_s":0.72,"wait_first_layer_s":0.004,"worker_step_s":0.74,"between_s":0.02,
//    "update_lag_s":0.015,"commit_wait_s":0.0}
//
// step is the 1-based count of optimizer steps completed; time is Unix seconds (wall
// clock); the *_s fields are seconds. A field that is unknown (std::nullopt) or not
// finite (a NaN loss) is left out of its line -- JSON has no NaN, and plot_run.py skips
// missing fields.
//
// Crash safety: each line is written with one write(2) on an O_APPEND descriptor. A
// line torn by a crash is cut off when the log is opened again; on resume from a
// checkpoint at step N, lines with step > N (work that the checkpoint lost and that
// will be redone) are dropped so the log never shows a step twice.
//
// Ownership: owns the file descriptor. Thread-safety: Append may be called from any
// thread (a mutex orders lines).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace l2l::eps {

struct StepRecord {
  int64_t step = 0;           // optimizer steps completed (1-based)
  double time = 0;            // Unix seconds when the step completed; 0 = now
  std::optional<double> loss;          // mean training loss over all workers
  std::optional<double> tokens_per_s;  // all workers, over this step's wall time
  std::optional<double> lr;            // learning rate used by this step's update
  // Per-step seconds (worker phases averaged over workers; update_s = EPS busy time).
  std::optional<double> forward_s, recompute_s, backward_s, wait_layer_s, wait_push_s, update_s;
  // The step's timeline (docs/operations.md "run.jsonl"): step_s the daemon's wall time of
  // the step (previous step reported -> this one reported); worker side (averaged over
  // workers) compute_s, wait_first_layer_s, worker_step_s (the relay step), between_s
  // (previous relay step's end -> this one's start); daemon side, for the update this
  // step's forward waited for (update_s is its busy time): update_lag_s (its last
  // gradient -> its version published) and commit_wait_s (its last layer applied ->
  // published).
  std::optional<double> step_s, compute_s, wait_first_layer_s, worker_step_s, between_s, update_lag_s,
      commit_wait_s;
  // Set on the extra line logged when a step was skipped (non-finite gradient or loss):
  // skipped steps so far, this one included.
  std::optional<double> skipped_steps;
  // In-job validation (job `eval:`), on the steps it ran: mean loss over the eval tokens
  // with the weights this step's `loss` is computed at, and exp(val_loss).
  std::optional<double> val_loss, val_ppl;
};

// One line of JSON (no trailing newline) for `r`.
std::string StepRecordToJson(const StepRecord& r);

class RunLog {
 public:
  static constexpr const char* kFileName = "run.jsonl";

  // Opens (creating the directory and file if needed) <state_dir>/run.jsonl for
  // appending. resume_step >= 0: drop lines with step > resume_step. A torn last line is
  // cut off (with a warning). Errors name the path.
  static Result<std::unique_ptr<RunLog>> Open(const std::string& state_dir, int64_t resume_step = -1);
  ~RunLog();

  const std::string& path() const { return path_; }
  // Appends one line. Steps must not go backwards (FAILED_PRECONDITION otherwise).
  Status Append(const StepRecord& r);
  // fsync(2): call at checkpoints so the log is as durable as the checkpoint.
  Status Sync();
  // The job's state went back to `step` steps done (a rollback): the lines of later steps
  // go (the file is rewritten, as Open with resume_step does), and those steps are
  // logged again as they are redone.
  Status Rewind(int64_t step);

 private:
  // Opens `path` for appending after dropping lines of steps > resume_step (>= 0) and a
  // torn last line; *last_step: the last step kept.
  static Result<int> OpenKeeping(const std::string& path, int64_t resume_step, int64_t* last_step);
  RunLog(std::string path, int fd, int64_t last_step) : path_(std::move(path)), fd_(fd), last_step_(last_step) {}
  const std::string path_;
  std::mutex mu_;
  int fd_ GUARDED_BY(mu_);
  int64_t last_step_ GUARDED_BY(mu_);
};

// Reads a run log back (for l2lctl and tests). Errors name path:line.
Result<std::vector<StepRecord>> ReadRunLog(const std::string& path);

}  // namespace l2l::eps
