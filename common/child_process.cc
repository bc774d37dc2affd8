// See child_process.h.
#include "common/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <thread>

namespace l2l {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

Result<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const std::vector<std::string>& argv,
                                                          const std::string& log_path, bool own_process_group) {
  if (argv.empty()) return InvalidArgument("ChildProcess::Spawn: empty argv");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return NotFound(argv[0] + " is not an executable (build it first)");
  }
  const int fd = log_path.empty() ? -1 : open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (!log_path.empty() && fd < 0) return ErrnoError("open", log_path, errno);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    if (fd >= 0) close(fd);
    return ErrnoError("fork", argv[0], errno);
  }
  if (pid == 0) {
    // Child: die with the test process, log to the file, exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (own_process_group) setpgid(0, 0);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  if (fd >= 0) close(fd);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, log_path));
}

ChildProcess::~ChildProcess() { Stop(); }

bool ChildProcess::Running() {
  if (reaped_) return false;
  int st = 0;
  const pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    status_ = st;
    return false;
  }
  return r == 0;
}

Result<int> ChildProcess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Running()) {
    if (Clock::now() >= deadline) {
      return Status(StatusCode::kDeadlineExceeded,
                    "pid " + std::to_string(pid_) + " still running after " +
                        std::to_string(timeout.count()) + " ms; log tail:\n" + LogTail());
    }
    std::this_thread::sleep_for(20ms);
  }
  if (WIFEXITED(status_)) return WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) return 128 + WTERMSIG(status_);
  return -1;
}

void ChildProcess::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

void ChildProcess::Stop() {
  if (!Running()) return;
  kill(pid_, SIGTERM);
  if (!Wait(5s).ok()) {
    kill(pid_, SIGKILL);
    Wait(5s).status().IgnoreError();
  }
}

std::string ChildProcess::Log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string ChildProcess::LogTail(size_t bytes) const {
  const std::string s = Log();
  return s.size() <= bytes ? s : s.substr(s.size() - bytes);
}

}  // namespace l2l
