// Process: a child process for tests that run the real binaries. fork/exec with stdout
// and stderr appended to a log file; the child gets PR_SET_PDEATHSIG(SIGKILL), so it
// dies with the test process; the destructor sends SIGTERM, waits, then SIGKILL.
//
// Ownership: the object owns (and reaps) its child. Thread-safety: one test thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace l2l::testing {

class Process {
 public:
  // Starts argv[0] (a path) with argv; stdout and stderr go to log_path.
  static Result<std::unique_ptr<Process>> Spawn(const std::vector<std::string>& argv,
                                                const std::string& log_path);
  ~Process();  // Stop() if still running
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool Running();
  // Waits for exit up to `timeout`; returns the exit status (128+signal when killed).
  // DEADLINE_EXCEEDED (with the log's tail) when still running.
  Result<int> Wait(std::chrono::milliseconds timeout);
  void Signal(int sig);
  // SIGTERM, up to 5 s grace, then SIGKILL; reaps the child.
  void Stop();
  std::string Log() const;
  std::string LogTail(size_t bytes = 2000) const;

 private:
  Process(pid_t pid, std::string log) : pid_(pid), log_path_(std::move(log)) {}
  pid_t pid_;
  std::string log_path_;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace l2l::testing
