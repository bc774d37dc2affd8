// ChildProcess: a child process that runs one of our programs (the `l2l` front door runs
// l2l-eps, l2l-worker, l2lctl; tests run the real binaries through tests/testing/process.h).
// fork/exec with stdout and stderr appended to a log file (or, with an empty log path,
// the parent's); the child gets PR_SET_PDEATHSIG(SIGKILL), so it dies with its parent;
// with own_process_group it leaves the terminal's foreground group, so a Ctrl-C reaches
// only the parent, which decides what the child is told. The destructor sends SIGTERM,
// waits, then SIGKILL.
//
// Ownership: the object owns (and reaps) its child. Thread-safety: one test thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace l2l {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv; stdout and stderr go to log_path ("" = inherited).
  static Result<std::unique_ptr<ChildProcess>> Spawn(const std::vector<std::string>& argv,
                                                     const std::string& log_path, bool own_process_group = false);
  ~ChildProcess();  // Stop() if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

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
  ChildProcess(pid_t pid, std::string log) : pid_(pid), log_path_(std::move(log)) {}
  pid_t pid_;
  std::string log_path_;
  bool reaped_ = false;
  int status_ = 0;
};

}  // namespace l2l
