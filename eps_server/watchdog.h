// Watchdog: keeps systemd's service watchdog (WatchdogSec= in l2l-eps.service) fed. When
// the service manager enabled it for this process (sd_watchdog_enabled: WATCHDOG_USEC
// set and WATCHDOG_PID unset or ours), a thread sends "WATCHDOG=1" via sd_notify every
// half period -- but only while `healthy()` says so, so a wedged daemon (e.g. its
// control service no longer answering) is killed and restarted by systemd
// (Restart=on-failure). Without systemd it does nothing and starts no thread.
//
// Hook (l2l-eps main, after READY=1):
//   auto watchdog = l2l::eps::Watchdog::StartIfEnabled([&] { return !core.stopped(); });
// and nothing else: the destructor stops the thread (before STOPPING=1 is fine too).
//
// Ownership: owns its thread. Thread-safety: construct and destroy on one thread;
// `healthy` runs on the watchdog thread and must be thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "common/thread_annotations.h"

namespace l2l::eps {

class Watchdog {
 public:
  // nullptr when the watchdog is not enabled for this process.
  static std::unique_ptr<Watchdog> StartIfEnabled(std::function<bool()> healthy = nullptr);
  // Starts with an explicit period (tests); pings every period/2.
  static std::unique_ptr<Watchdog> Start(std::chrono::microseconds period, std::function<bool()> healthy);
  ~Watchdog();

  std::chrono::microseconds interval() const { return interval_; }

 private:
  Watchdog(std::chrono::microseconds interval, std::function<bool()> healthy)
      : interval_(interval), healthy_(std::move(healthy)) {}
  void Loop();

  const std::chrono::microseconds interval_;
  const std::function<bool()> healthy_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace l2l::eps
