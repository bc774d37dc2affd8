// RunLog: <state_dir>/run.jsonl writer and reader. See run_log.h.
#include "eps_server/run_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/json_util.h"
#include "common/logging.h"

namespace l2l::eps {
namespace {

using Json = nlohmann::json;

struct Field {
  const char* name;
  std::optional<double> StepRecord::*member;
};
constexpr Field kFields[] = {
    {"loss", &StepRecord::loss},           {"tokens_per_s", &StepRecord::tokens_per_s},
    {"lr", &StepRecord::lr},               {"forward_s", &StepRecord::forward_s},
    {"recompute_s", &StepRecord::recompute_s}, {"backward_s", &StepRecord::backward_s},
    {"wait_layer_s", &StepRecord::wait_layer_s}, {"wait_push_s", &StepRecord::wait_push_s},
    {"update_s", &StepRecord::update_s},    {"skipped_steps", &StepRecord::skipped_steps},
    {"val_loss", &StepRecord::val_loss},    {"val_ppl", &StepRecord::val_ppl},
    {"step_s", &StepRecord::step_s},        {"compute_s", &StepRecord::compute_s},
    {"wait_first_layer_s", &StepRecord::wait_first_layer_s}, {"worker_step_s", &StepRecord::worker_step_s},
    {"between_s", &StepRecord::between_s},  {"update_lag_s", &StepRecord::update_lag_s},
    {"commit_wait_s", &StepRecord::commit_wait_s},
};

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Status WriteAll(int fd, const std::string& s, const std::string& path) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", path, errno);
    }
    off += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Parses one line; errors name path:line.
Result<StepRecord> ParseLine(const std::string& line, const std::string& where) {
  Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return DataLoss(where + ": not a JSON object");
  if (!j.contains("step") || !j["step"].is_number_integer()) return DataLoss(where + ": no integer 'step'");
  StepRecord r;
  Result<int64_t> step = JsonInt<int64_t>(j["step"], where + ": 'step'");
  if (!step.ok()) return DataLoss(step.status().message());
  r.step = *step;
  if (j.contains("time") && j["time"].is_number()) r.time = j["time"].get<double>();
  for (const Field& f : kFields) {
    if (!j.contains(f.name)) continue;
    if (!j[f.name].is_number()) return DataLoss(where + ": '" + f.name + "' is not a number");
    r.*f.member = j[f.name].get<double>();
  }
  return r;
}

}  // namespace

std::string StepRecordToJson(const StepRecord& r) {
  Json j = Json::object();
  j["step"] = r.step;
  j["time"] = r.time > 0 ? r.time : NowUnix();
  for (const Field& f : kFields) {
    const auto& v = r.*f.member;
    if (v && std::isfinite(*v)) j[f.name] = *v;
  }
  return j.dump();
}

Result<std::unique_ptr<RunLog>> RunLog::Open(const std::string& state_dir, int64_t resume_step) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) return Status(StatusCode::kIoError, "create_directories(" + state_dir + "): " + ec.message());
  const std::string path = state_dir + "/" + kFileName;
  int64_t last_step = 0;
  L2L_ASSIGN_OR_RETURN(const int fd, OpenKeeping(path, resume_step, &last_step));
  return std::unique_ptr<RunLog>(new RunLog(path, fd, last_step));
}

Status RunLog::Rewind(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  if (step >= last_step_) return Status::Ok();
  int64_t last_step = 0;
  L2L_ASSIGN_OR_RETURN(const int fd, OpenKeeping(path_, step, &last_step));
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
  last_step_ = last_step;
  return Status::Ok();
}

Result<int> RunLog::OpenKeeping(const std::string& path, int64_t resume_step, int64_t* last_step_out) {
  // Keep the complete lines we want; rewrite the file only when something must go.
  int64_t last_step = 0;
  bool rewrite = false;
  std::string kept;
  {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string all = ss.str();
      size_t pos = 0;
      int lineno = 0;
      while (pos < all.size()) {
        const size_t nl = all.find('\n', pos);
        ++lineno;
        if (nl == std::string::npos) {
          L2L_LOG_WARN("{}:{}: dropping a torn last line ({} bytes) left by a crash", path, lineno,
                       all.size() - pos);
          rewrite = true;
          break;
        }
        const std::string line = all.substr(pos, nl - pos);
        pos = nl + 1;
        if (line.empty()) continue;
        auto rec = ParseLine(line, path + ":" + std::to_string(lineno));
        if (!rec.ok()) return rec.status();
        if (resume_step >= 0 && rec->step > resume_step) {
          rewrite = true;  // this and later lines describe work lost with the crash
          continue;
        }
        last_step = std::max(last_step, rec->step);
        kept += line + "\n";
      }
    }
  }
  if (rewrite) {
    const std::string tmp = path + ".tmp";
    const int tfd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (tfd < 0) return ErrnoError("open", tmp, errno);
    Status s = WriteAll(tfd, kept, tmp);
    if (s.ok() && fsync(tfd) != 0) s = ErrnoError("fsync", tmp, errno);
    close(tfd);
    L2L_RETURN_IF_ERROR(s);
    if (rename(tmp.c_str(), path.c_str()) != 0) return ErrnoError("rename", tmp + " -> " + path, errno);
  }
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("open", path, errno);
  *last_step_out = last_step;
  return fd;
}

RunLog::~RunLog() {
  if (fd_ >= 0 && close(fd_) != 0) L2L_LOG_WARN("close({}): {}", path_, std::strerror(errno));
}

Status RunLog::Append(const StepRecord& r) {
  const std::string line = StepRecordToJson(r) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  if (r.step < last_step_) {
    return FailedPrecondition(path_ + ": step " + std::to_string(r.step) + " logged after step " +
                              std::to_string(last_step_));
  }
  // One write(2) on O_APPEND: a line is never interleaved with another writer's.
  const ssize_t n = write(fd_, line.data(), line.size());
  if (n < 0) return ErrnoError("write", path_, errno);
  if (static_cast<size_t>(n) != line.size()) {
    return Status(StatusCode::kIoError, path_ + ": short write (" + std::to_string(n) + " of " +
                                            std::to_string(line.size()) + " bytes; disk full?)");
  }
  last_step_ = r.step;
  return Status::Ok();
}

Status RunLog::Sync() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fsync(fd_) != 0) return ErrnoError("fsync", path_, errno);
  return Status::Ok();
}

Result<std::vector<StepRecord>> ReadRunLog(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open run log " + path);
  std::vector<StepRecord> out;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    L2L_ASSIGN_OR_RETURN(StepRecord r, ParseLine(line, path + ":" + std::to_string(lineno)));
    out.push_back(r);
  }
  return out;
}

}  // namespace l2l::eps
