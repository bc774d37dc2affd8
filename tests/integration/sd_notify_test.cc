// systemd notifications without systemd: the test binds a unix datagram socket, passes
// it as NOTIFY_SOCKET (as systemd does for Type=notify units) and reads what arrives:
//  * the real l2l-eps: READY=1 with STATUS naming the port it wrote to eps.port, then
//    STOPPING=1 on SIGTERM and exit status 0; WATCHDOG=1 when WATCHDOG_USEC is set;
//  * eps_server/watchdog.h in-process: pings at half the period, none while unhealthy,
//    none when the watchdog is not enabled.
#include <catch2/catch.hpp>

#include <signal.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "eps_server/watchdog.h"
#include "tests/integration/harness.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A bound AF_UNIX datagram socket; sets NOTIFY_SOCKET (and the given extra variables)
// in this process's environment for as long as it lives, so children inherit them.
class NotifySocket {
 public:
  NotifySocket(const TempDir& dir, std::vector<std::pair<std::string, std::string>> env = {})
      : path_(dir.File("notify")), env_(std::move(env)) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    REQUIRE(path_.size() < sizeof(a.sun_path));
    std::copy(path_.begin(), path_.end(), a.sun_path);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    setenv("NOTIFY_SOCKET", path_.c_str(), 1);
    for (const auto& [k, v] : env_) setenv(k.c_str(), v.c_str(), 1);
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    for (const auto& kv : env_) unsetenv(kv.first.c_str());
    close(fd_);
  }

  // Next datagram within `timeout`; "" on timeout.
  std::string Receive(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return "";
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }
  // Collects datagrams until one contains `what` or `timeout` passes; returns all seen.
  std::string WaitFor(const std::string& what, std::chrono::milliseconds timeout) {
    std::string seen;
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      const std::string m = Receive(std::max(left, 1ms));
      if (m.empty()) continue;
      seen += m + "\n";
      if (m.find(what) != std::string::npos) break;
    }
    return seen;
  }
  int CountFor(const std::string& what, std::chrono::milliseconds window) {
    int n = 0;
    const auto deadline = Clock::now() + window;
    while (Clock::now() < deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (Receive(std::max(left, 1ms)).find(what) != std::string::npos) ++n;
    }
    return n;
  }

 private:
  std::string path_;
  std::vector<std::pair<std::string, std::string>> env_;
  int fd_ = -1;
};

std::unique_ptr<TempDir> MakeDir() {
  auto d = TempDir::Create("l2l-sdn");
  REQUIRE(d.ok());
  return std::move(d).value();
}

std::unique_ptr<Process> StartEps(const TempDir& dir) {
  auto p = Process::Spawn({BinaryPath("l2l-eps"), "--listen", "127.0.0.1:0", "--state-dir", dir.File("state"),
                           "--job-id", "sdn" + std::to_string(getpid())},
                          dir.File("eps.log"));
  REQUIRE(p.ok());
  return std::move(p).value();
}

TEST_CASE("l2l-eps tells systemd READY with its port, then STOPPING on SIGTERM, and exits 0",
          "[integration][systemd]") {
  auto dir = MakeDir();
  NotifySocket sock(*dir);
  auto eps = StartEps(*dir);
  const std::string ready = sock.WaitFor("READY=1", 30000ms);
  INFO("datagrams:\n" << ready << "log:\n" << eps->LogTail());
  REQUIRE(ready.find("READY=1") != std::string::npos);
  int port = 0;
  std::ifstream(dir->File("state/eps.port")) >> port;
  REQUIRE(port > 0);
  CHECK(ready.find("STATUS=") != std::string::npos);
  CHECK(ready.find(std::to_string(port)) != std::string::npos);  // STATUS names the port

  eps->Signal(SIGTERM);
  const std::string stopping = sock.WaitFor("STOPPING=1", 20000ms);
  INFO("datagrams:\n" << stopping << "log:\n" << eps->LogTail());
  CHECK(stopping.find("STOPPING=1") != std::string::npos);
  auto code = eps->Wait(30s);
  REQUIRE(code.ok());
  CHECK(*code == 0);
}

TEST_CASE("l2l-eps feeds the systemd watchdog when WATCHDOG_USEC is set", "[integration][systemd]") {
  auto dir = MakeDir();
  NotifySocket sock(*dir, {{"WATCHDOG_USEC", "1000000"}});  // 1 s period: a ping every 0.5 s
  auto eps = StartEps(*dir);
  REQUIRE(sock.WaitFor("READY=1", 30000ms).find("READY=1") != std::string::npos);
  const std::string wd = sock.WaitFor("WATCHDOG=1", 3000ms);
  INFO("datagrams:\n" << wd << "log:\n" << eps->LogTail());
  CHECK(wd.find("WATCHDOG=1") != std::string::npos);
  eps->Signal(SIGTERM);
  auto code = eps->Wait(30s);
  REQUIRE(code.ok());
  CHECK(*code == 0);
}

TEST_CASE("Watchdog pings at half its period, only while healthy, and only when enabled",
          "[integration][systemd]") {
  auto dir = MakeDir();
  SECTION("enabled through the environment") {
    NotifySocket sock(*dir, {{"WATCHDOG_USEC", "400000"}, {"WATCHDOG_PID", std::to_string(getpid())}});
    auto w = eps::Watchdog::StartIfEnabled();
    REQUIRE(w != nullptr);
    CHECK(w->interval() == 200ms);
    const int n = sock.CountFor("WATCHDOG=1", 1100ms);  // ~6 pings (one at start, then every 200 ms)
    CHECK(n >= 4);
    CHECK(n <= 8);
  }
  SECTION("another process's watchdog is not ours") {
    NotifySocket sock(*dir, {{"WATCHDOG_USEC", "400000"}, {"WATCHDOG_PID", std::to_string(getppid())}});
    CHECK(eps::Watchdog::StartIfEnabled() == nullptr);
  }
  SECTION("not enabled") {
    NotifySocket sock(*dir);
    CHECK(eps::Watchdog::StartIfEnabled() == nullptr);
    CHECK(sock.Receive(300ms).empty());
  }
  SECTION("unhealthy: no pings, then pings once healthy again") {
    NotifySocket sock(*dir);
    std::atomic<bool> healthy{false};
    auto w = eps::Watchdog::Start(100ms, [&] { return healthy.load(); });
    CHECK(sock.CountFor("WATCHDOG=1", 400ms) == 0);
    healthy = true;
    CHECK(sock.CountFor("WATCHDOG=1", 400ms) >= 3);
  }
}

}  // namespace
}  // namespace l2l::itest
