// Watchdog thread for systemd's WatchdogSec=. See watchdog.h.
#include "eps_server/watchdog.h"

#include <systemd/sd-daemon.h>

#include <cstdint>

#include "common/logging.h"

namespace l2l::eps {

std::unique_ptr<Watchdog> Watchdog::StartIfEnabled(std::function<bool()> healthy) {
  uint64_t usec = 0;
  const int r = sd_watchdog_enabled(/*unset_environment=*/0, &usec);
  if (r < 0) L2L_LOG_WARN("watchdog: bad WATCHDOG_USEC/WATCHDOG_PID in the environment (error {})", r);
  if (r <= 0 || usec == 0) return nullptr;
  return Start(std::chrono::microseconds(usec), std::move(healthy));
}

std::unique_ptr<Watchdog> Watchdog::Start(std::chrono::microseconds period, std::function<bool()> healthy) {
  std::unique_ptr<Watchdog> w(new Watchdog(period / 2, std::move(healthy)));
  L2L_LOG_INFO("watchdog: notifying systemd every {} ms", w->interval_.count() / 1000);
  w->thread_ = std::thread([p = w.get()] { p->Loop(); });
  return w;
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Loop() {
  UniqueLock lock(mu_);
  bool warned = false;
  while (!stop_) {
    lock.unlock();
    const bool ok = !healthy_ || healthy_();
    if (ok) {
      sd_notify(0, "WATCHDOG=1");
      warned = false;
    } else if (!warned) {
      L2L_LOG_ERROR("watchdog: daemon unhealthy, no longer notifying systemd (it will restart us)");
      warned = true;
    }
    lock.lock();
    cv_.wait_for(lock.native(), interval_, [this]() REQUIRES(mu_) { return stop_; });
  }
}

}  // namespace l2l::eps
