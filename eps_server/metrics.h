// Metrics for operators: a registry of counters, gauges and histograms rendered in the
// Prometheus text exposition format (version 0.0.4), and a tiny HTTP/1.1 server that
// serves it at GET /metrics so Prometheus (or curl) can scrape l2l-eps.
//
//   MetricsRegistry reg;
//   Counter* steps = reg.GetCounter("l2l_steps_total", "Optimizer steps completed");
//   Gauge* ver = reg.GetGauge("l2l_layer_version", "Published version", {{"layer", "3"}});
//   Histogram* t = reg.GetHistogram("l2l_step_seconds", "Step wall time",
//                                   Histogram::ExponentialBuckets(0.01, 2, 12));
//   auto http = MetricsHttpServer::Start(&reg, "127.0.0.1:0");   // (*http)->port()
//
// Names follow Prometheus' rules ([a-zA-Z_:][a-zA-Z0-9_:]*, labels without "__"
// prefix); a bad name, or one name registered with two types, is a bug (L2L_CHECK).
// Histogram buckets are cumulative ("le") with a final +Inf bucket equal to _count.
//
// Ownership: the registry owns every metric; the returned pointers stay valid for the
// registry's lifetime. The HTTP server borrows the registry (it must outlive the
// server) and owns its listening socket and its one thread.
// Thread-safety: metric updates (Increment/Set/Observe) are lock-free or take a
// per-metric mutex and may be called from any thread; Get*/Render take the registry
// mutex. Collect hooks run on the scraping thread before each render.
// Security (eps_server/server_security.h): a non-loopback address needs a token (the
// daemon's --token-file) or `insecure`, else Start refuses; with a token every request
// must carry "Authorization: Bearer <token>" (401 otherwise).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"

namespace l2l::eps {

using Labels = std::map<std::string, std::string>;  // label name -> value

// Monotonic: only grows (a negative increment is a bug).
class Counter {
 public:
  void Increment(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // start, start*factor, ... (count bounds); REQUIRES start > 0, factor > 1, count >= 1.
  static std::vector<double> ExponentialBuckets(double start, double factor, int count);

  // `bounds`: strictly increasing finite upper bounds; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  // A consistent view: cumulative[i] = observations <= bounds[i]; count includes +Inf.
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot Snap() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_ GUARDED_BY(mu_);  // per bucket, not cumulative; last = +Inf.
  double sum_ GUARDED_BY(mu_) = 0;
};

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Get-or-create the series `name{labels}`. `help` is taken from the first call.
  Counter* GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge* GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  // Every series of one histogram family must use the same bounds (checked).
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<double>& bounds, const Labels& labels = {});

  // Runs before every Render (e.g. to copy EpsCore::GetStatus() into gauges).
  void AddCollectHook(std::function<void()> hook);

  // The whole registry in the Prometheus text format, families sorted by name.
  std::string Render() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;  // histograms only
    std::map<std::string, std::unique_ptr<Counter>> counters;      // key: rendered labels
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  Family* GetFamily(const std::string& name, const std::string& help, Type type) REQUIRES(mu_);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_ GUARDED_BY(mu_);
  std::vector<std::function<void()>> hooks_ GUARDED_BY(mu_);
};

// The daemon's standard metrics (names in docs/operations.md), filled from plain values
// so this file does not depend on EpsCore: the lead's collect hook copies
// EpsCore::GetStatus() into an EpsSnapshot and calls UpdateEpsMetrics.
struct EpsSnapshot {
  int64_t step = 0, total_steps = 0;
  double loss = 0, tokens_per_s = 0;
  double update_busy_s = 0, update_exposed_s = 0;
  std::vector<int64_t> layer_version;                 // per layer, model order
  struct Tier { std::string tier; int64_t used_bytes = 0, budget_bytes = 0; };
  std::vector<Tier> memory;
  std::map<std::string, int> workers_by_state;        // "active" -> 2, ...
  int64_t skipped_steps = 0, consecutive_skips = 0;   // non-finite gradient or loss
  // In-job validation: the last val loss and its step; val_step 0 = none yet (the
  // l2l_val_loss / l2l_val_step gauges appear with the first one).
  double val_loss = 0;
  int64_t val_step = 0;
};
void UpdateEpsMetrics(MetricsRegistry* registry, const EpsSnapshot& s);
// Call once per completed step (feeds the l2l_step_seconds histogram).
void ObserveStepSeconds(MetricsRegistry* registry, double seconds);

// Formats a sample value as Prometheus does: "+Inf", "-Inf", "NaN", or the shortest
// decimal that round-trips.
std::string FormatMetricValue(double v);

struct MetricsServerOptions {
  std::string listen = "127.0.0.1:0";  // host:port; port 0 picks a free port
  bool insecure = false;               // allows a non-loopback address without a token
  int io_timeout_ms = 2000;            // a client that sends no full request is dropped
  std::string token;                   // "" = open; else requests need "Authorization: Bearer <token>"
};

// Serves GET /metrics (200, text/plain; version=0.0.4), GET / (a pointer to /metrics),
// 404 for other paths, 405 for other methods, 401 for any request without the token
// when one is set; one connection at a time, then closes it
// (scrapes are small and rare). Start returns once the socket listens.
class MetricsHttpServer {
 public:
  static Result<std::unique_ptr<MetricsHttpServer>> Start(const MetricsRegistry* registry,
                                                          const MetricsServerOptions& options = {});
  ~MetricsHttpServer();  // Stop()

  int port() const { return port_; }
  uint64_t requests_served() const { return served_.load(); }
  // Wakes the thread, closes the socket, joins. Idempotent.
  void Stop();

 private:
  MetricsHttpServer(const MetricsRegistry* r, MetricsServerOptions o) : registry_(r), opts_(std::move(o)) {}
  void Loop();
  void Serve(int fd);

  const MetricsRegistry* registry_;
  const MetricsServerOptions opts_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop() writes it to end Loop()
  int port_ = 0;
  std::atomic<uint64_t> served_{0};
  std::thread thread_;
  std::once_flag stopped_;
};

}  // namespace l2l::eps
