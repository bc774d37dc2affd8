// Progress (cli/progress.h).
#include "cli/progress.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace l2l::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kYellow = "\x1b[1;33m";
constexpr const char* kRed = "\x1b[1;31m";
constexpr const char* kReset = "\x1b[0m";
constexpr const char* kClearToEnd = "\x1b[K";

bool Done(const eps::CtlStatus& s) {
  return s.state == "finished" || (s.total_steps > 0 && s.step >= s.total_steps);
}

// 1234567 -> "1,234,567".
std::string Thousands(double v) {
  std::string digits = std::to_string(static_cast<long long>(std::llround(std::max(0.0, v))));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string Format(const char* fmt, double a, double b = 0) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, a, b);
  return buf;
}

}  // namespace

ProgressMode ChooseProgressMode(bool quiet, bool json, bool stdout_is_tty) {
  if (quiet) return ProgressMode::kQuiet;
  if (json) return ProgressMode::kJson;
  return stdout_is_tty ? ProgressMode::kLine : ProgressMode::kPlain;
}

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = std::llround(s);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", t / 3600, t / 60 % 60);
  } else if (t >= 60) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%llds", t);
  }
  return buf;
}

std::string SummaryJson(const Summary& s) {
  nlohmann::json j = {{"summary", true}, {"end", s.end},         {"step", s.steps},
                      {"done", s.end == "finished"}, {"seconds", s.seconds}, {"out", s.out}};
  if (!s.export_path.empty()) j["export"] = s.export_path;
  if (!s.checkpoint.empty()) j["checkpoint"] = s.checkpoint;
  if (std::isfinite(s.ppl_before) && s.ppl_before >= 0) j["ppl_before"] = s.ppl_before;
  if (std::isfinite(s.ppl_after) && s.ppl_after >= 0) j["ppl_after"] = s.ppl_after;
  return j.dump();
}

std::vector<std::string> SummaryLines(const Summary& s) {
  std::vector<std::string> lines;
  const std::string took = FormatDuration(s.seconds);
  if (s.end == "finished") {
    lines.push_back("l2l: finished " + std::to_string(s.steps) + " steps in " + took);
  } else if (s.end == "interrupted") {
    lines.push_back("l2l: interrupted at step " + std::to_string(s.steps) + " after " + took + "; " +
                    (s.checkpoint.empty() ? std::string("no checkpoint was written")
                                          : "checkpoint " + s.checkpoint + "; continue with " + s.resume_hint));
  } else {
    lines.push_back("l2l: failed after " + took);
  }
  if (s.ppl_before >= 0 || s.ppl_after >= 0 || std::isnan(s.ppl_before) || std::isnan(s.ppl_after)) {
    auto ppl = [](double p) { return std::isfinite(p) && p >= 0 ? Format("%.4f", p) : std::string("n/a"); };
    lines.push_back("l2l: held-out perplexity " + ppl(s.ppl_before) + " -> " + ppl(s.ppl_after));
  }
  if (!s.export_path.empty()) {
    lines.push_back("l2l: model: " + s.export_path +
                    (s.export_format == "hf" ? " (Hugging Face directory)" : " (" + s.export_format + ")"));
  }
  std::string logs = "l2l: logs: " + s.out + "/eps.log, " + s.out + "/worker-0.log";
  if (s.workers > 1) logs += " ... worker-" + std::to_string(s.workers - 1) + ".log";
  lines.push_back(logs + "; run log: " + s.out + "/state/run.jsonl");
  return lines;
}

Progress::Progress(ProgressMode mode, std::FILE* out, std::FILE* err, bool tty_err)
    : mode_(mode), out_(out), err_(err), color_(tty_err) {}

Progress::~Progress() { EndLine(); }

void Progress::EndLine() {
  if (!line_open_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  line_open_ = false;
}

void Progress::Note(const std::string& line, bool even_quiet) {
  if (!even_quiet && (mode_ == ProgressMode::kQuiet || mode_ == ProgressMode::kJson)) return;
  EndLine();
  std::fprintf(err_, "l2l: %s\n", line.c_str());
  std::fflush(err_);
}

void Progress::Warn(const std::string& line) {
  EndLine();
  std::fprintf(err_, "%sl2l: warning:%s %s\n", color_ ? kYellow : "", color_ ? kReset : "", line.c_str());
  std::fflush(err_);
}

void Progress::Error(const std::string& line) {
  EndLine();
  std::fprintf(err_, "%sl2l: error:%s %s\n", color_ ? kRed : "", color_ ? kReset : "", line.c_str());
  std::fflush(err_);
}

void Progress::Check(const eps::CtlStatus& s) {
  if (s.skipped_steps > skipped_seen_) {
    Warn("skipped " + std::to_string(s.skipped_steps - skipped_seen_) + " step(s) (" +
         (s.last_skip_reason.empty() ? std::string("non-finite loss or gradient") : s.last_skip_reason) +
         "); " + std::to_string(s.skipped_steps) + " so far");
    skipped_seen_ = s.skipped_steps;
  }
  if (s.state == "paused" && s.pause_reason != pause_seen_) {
    Warn("the job is paused: " + (s.pause_reason.empty() ? std::string("no reason given") : s.pause_reason));
  }
  pause_seen_ = s.state == "paused" ? s.pause_reason : "";
  if (!s.error.empty() && s.error != error_seen_) Error("the daemon reports: " + s.error);
  error_seen_ = s.error;
}

void Progress::Update(const eps::CtlStatus& s) {
  if (mode_ == ProgressMode::kQuiet) return;
  const auto now = Clock::now();
  if (first_step_ < 0) first_step_ = s.step, first_time_ = now;
  if (mode_ != ProgressMode::kJson) Check(s);
  // ETA from the steps seen during this run (a resumed run starts counting where it
  // resumed); before the first, from the daemon's last step time.
  const int64_t done_here = s.step - first_step_;
  const double per_step =
      done_here > 0 ? std::chrono::duration<double>(now - first_time_).count() / done_here : s.step_time_s;
  const double eta = s.total_steps > s.step && per_step > 0 ? (s.total_steps - s.step) * per_step : 0;
  const bool done = Done(s);
  switch (mode_) {
    case ProgressMode::kLine:
      Line(s, eta);
      break;
    case ProgressMode::kPlain:
      if (s.step != last_step_ && s.step > 0) Plain(s, eta);
      break;
    case ProgressMode::kJson:
      if (s.step != last_step_ || done) Json(s, eta, done);
      break;
    case ProgressMode::kQuiet:
      break;
  }
  last_step_ = s.step;
}

void Progress::Plain(const eps::CtlStatus& s, double eta) {
  std::string val;
  if (s.val_step > 0) val = Format(" val_loss %.4f val_ppl %.3f", s.val_loss, std::exp(s.val_loss));
  std::fprintf(out_, "step %lld/%lld loss %.4f%s tok/s %.0f eta %s\n", static_cast<long long>(s.step),
               static_cast<long long>(s.total_steps), s.last_loss, val.c_str(), s.tokens_per_s,
               FormatDuration(eta).c_str());
  std::fflush(out_);
}

void Progress::Line(const eps::CtlStatus& s, double eta) {
  constexpr int kWidth = 24;
  const double frac =
      s.total_steps > 0 ? std::clamp(static_cast<double>(s.step) / static_cast<double>(s.total_steps), 0.0, 1.0) : 0;
  const int fill = static_cast<int>(frac * kWidth);
  std::string line = "[" + std::string(fill, '#') + std::string(kWidth - fill, '-') + "] " +
                     Format("%3.0f%%", frac * 100) + " step " + std::to_string(s.step) + "/" +
                     std::to_string(s.total_steps);
  if (s.step > 0) {
    line += Format("  loss %.4f", s.last_loss);
    if (s.val_step > 0) line += Format("  val %.4f (ppl %.2f)", s.val_loss, std::exp(s.val_loss));
    line += "  " + Thousands(s.tokens_per_s) + " tok/s  ETA " + FormatDuration(eta);
  } else {
    line += "  " + s.state + "...";
  }
  std::fprintf(out_, "\r%s%s", line.c_str(), kClearToEnd);
  std::fflush(out_);
  line_open_ = true;
}

void Progress::Json(const eps::CtlStatus& s, double eta, bool done) {
  nlohmann::json j = {{"step", s.step},     {"total_steps", s.total_steps}, {"state", s.state},
                      {"loss", s.last_loss}, {"tokens_per_s", s.tokens_per_s}, {"step_time_s", s.step_time_s},
                      {"eta_s", eta},       {"done", done}};
  if (s.val_step > 0) {
    j["val_loss"] = s.val_loss;
    j["val_ppl"] = std::exp(s.val_loss);
    j["val_step"] = s.val_step;
  }
  if (s.skipped_steps > 0) j["skipped_steps"] = s.skipped_steps;
  if (!s.error.empty()) j["error"] = s.error;
  std::fprintf(out_, "%s\n", j.dump().c_str());
  std::fflush(out_);
}

void Progress::PrintSummary(const Summary& s) {
  EndLine();
  if (mode_ == ProgressMode::kJson) {
    std::fprintf(out_, "%s\n", SummaryJson(s).c_str());
  } else {
    for (const std::string& line : SummaryLines(s)) std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

}  // namespace l2l::cli
