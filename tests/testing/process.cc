// See process.h.
#include "tests/testing/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <thread>

namespace l2l::testing {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

Result<std::unique_ptr<Process>> Process::Spawn(const std::vector<std::string>& argv,
                                                const std::string& log_path) {
  if (argv.empty()) return InvalidArgument("Process::Spawn: empty argv");
  if (access(argv[0].c_str(), X_OK) != 0) {
    return NotFound(argv[0] + " is not an executable (build it first)");
  }
  const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("open", log_path, errno);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return ErrnoError("fork", argv[0], errno);
  }
  if (pid == 0) {
    // Child: die with the test process, log to the file, exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fd);
  return std::unique_ptr<Process>(new Process(pid, log_path));
}

Process::~Process() { Stop(); }

bool Process::Running() {
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

Result<int> Process::Wait(std::chrono::milliseconds timeout) {
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

void Process::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

void Process::Stop() {
  if (!Running()) return;
  kill(pid_, SIGTERM);
  if (!Wait(5s).ok()) {
    kill(pid_, SIGKILL);
    Wait(5s).status().IgnoreError();
  }
}

std::string Process::Log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string Process::LogTail(size_t bytes) const {
  const std::string s = Log();
  return s.size() <= bytes ? s : s.substr(s.size() - bytes);
}

}  // namespace l2l::testing
