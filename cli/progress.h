// Progress: what `l2l finetune` / `l2l run` show while a job trains, drawn from the
// daemon's status (ctl/'s CtlStatus, polled by cli/job_runner.cc):
//   kLine  (stdout is a terminal): one live line, redrawn in place:
//          [########------------]  40% step 12/30  loss 2.3456  val 2.5012 (ppl 12.19)  1,024 tok/s  ETA 1m30s
//   kPlain (stdout is a pipe or a file): one line per new step,
//          "step 12/30 loss 2.3456 val_loss 2.5012 val_ppl 12.193 tok/s 1024 eta 1m30s";
//   kJson  (--json): one JSON object per new step (step, total_steps, loss, tokens_per_s,
//          eta_s, done, val_loss/val_ppl/val_step once there is one, state), and the
//          summary as the last object ({"summary": true, ...});
//   kQuiet (--quiet): nothing but the summary.
// Notes ("l2l: starting l2l-eps ...") go to stderr (not in kQuiet / kJson); warnings and
// errors always go to stderr, prefixed "l2l: warning:" / "l2l: error:", in colour when
// stderr is a terminal; a live line is cleared before anything else is printed, so
// nothing lands in the middle of it. Warnings it raises itself from the status: a skipped
// step (non-finite loss or gradient), a paused job, a failed one.
// The summary (Summary(), see SummaryLines) is the last thing printed.
//
// Thread-safety: one thread (the job runner's).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "ctl/ctl_client.h"

namespace l2l::cli {

enum class ProgressMode { kLine, kPlain, kJson, kQuiet };

// --quiet wins, then --json; otherwise a live line when stdout is a terminal.
ProgressMode ChooseProgressMode(bool quiet, bool json, bool stdout_is_tty);

// What a run ended with, for the summary.
struct Summary {
  std::string end;             // "finished" | "interrupted" | "failed"
  int64_t steps = 0;           // optimizer steps done
  double seconds = 0;          // wall time of the whole command
  std::string export_path;     // "" when nothing was exported
  std::string export_format;   // hf | safetensors | gguf
  std::string checkpoint;      // interrupted: the checkpoint to continue from ("" none)
  std::string resume_hint;     // interrupted: the command line that continues
  double ppl_before = -1, ppl_after = -1;  // < 0: not measured; NaN: failed to measure
  std::string out;             // the output directory (logs are under it)
  int workers = 1;
};

// "1h02m", "3m05s", "42s"; "?" for a negative or non-finite time.
std::string FormatDuration(double seconds);

// The summary as one JSON object (what --json prints last, and `l2l` writes to
// OUT/summary.json): summary (true), end, step, done, seconds, out, and export,
// checkpoint, ppl_before, ppl_after when known.
std::string SummaryJson(const Summary& s);

// The summary as text lines (each without a newline), in print order; the last one names
// the logs.
std::vector<std::string> SummaryLines(const Summary& s);

class Progress {
 public:
  // out: progress and summary (stdout); err: notes, warnings, errors (stderr). tty_err
  // turns on colour for warnings and errors.
  Progress(ProgressMode mode, std::FILE* out, std::FILE* err, bool tty_err);
  ~Progress();  // ends a live line

  ProgressMode mode() const { return mode_; }
  // One status poll: redraws (kLine) or prints a line per new step (kPlain, kJson).
  void Update(const eps::CtlStatus& s);
  // even_quiet: also in kQuiet / kJson (what the user must see: an interrupt's handling).
  void Note(const std::string& line, bool even_quiet = false);
  void Warn(const std::string& line);
  void Error(const std::string& line);
  // Ends a live line (a newline after it), so the next output starts on its own line.
  void EndLine();
  // The summary, last.
  void PrintSummary(const Summary& s);

 private:
  void Plain(const eps::CtlStatus& s, double eta);
  void Line(const eps::CtlStatus& s, double eta);
  void Json(const eps::CtlStatus& s, double eta, bool done);
  void Check(const eps::CtlStatus& s);  // warnings from the status

  ProgressMode mode_;
  std::FILE* out_;
  std::FILE* err_;
  bool color_;
  bool line_open_ = false;  // a live line is on the terminal
  int64_t last_step_ = -1;
  int64_t first_step_ = -1;
  std::chrono::steady_clock::time_point first_time_;
  int64_t skipped_seen_ = 0;
  std::string pause_seen_, error_seen_;
};

}  // namespace l2l::cli
