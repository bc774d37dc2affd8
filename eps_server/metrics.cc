// Metrics registry, Prometheus text rendering and the /metrics HTTP server. See metrics.h.
#include "eps_server/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <sstream>

#include "common/auth_token.h"
#include "common/logging.h"
#include "eps_server/server_security.h"

namespace l2l::eps {
namespace {

bool ValidName(const std::string& n, bool label) {
  if (n.empty()) return false;
  if (label && n.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!label && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!(alpha || (i > 0 && digit))) return false;
  }
  return true;
}

// Label values escape backslash, double quote and newline; help text backslash and newline.
std::string Escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (quote && c == '"') out += "\\\"";
    else out += c;
  }
  return out;
}

// "a=\"x\",b=\"y\"" (sorted by name, as std::map iterates), or "" without labels.
std::string LabelKey(const Labels& labels) {
  std::string out;
  for (const auto& [k, v] : labels) {
    L2L_CHECK(ValidName(k, true)) << "bad metric label name '" << k << "'";
    L2L_CHECK(k != "le") << "label 'le' is reserved for histogram buckets";
    if (!out.empty()) out += ',';
    out += k + "=\"" + Escape(v, true) + "\"";
  }
  return out;
}

std::string Braced(const std::string& key, const std::string& extra = "") {
  std::string inner = key;
  if (!extra.empty()) inner += (inner.empty() ? "" : ",") + extra;
  return inner.empty() ? "" : "{" + inner + "}";
}

void AtomicAdd(std::atomic<double>* a, double v) {
  double cur = a->load(std::memory_order_relaxed);
  while (!a->compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
  }
}

Status SocketError(const std::string& op, const std::string& where) { return ErrnoError(op, where, errno); }

// The value of the first header `lower_name` (matched case-insensitively) in an HTTP
// request head, or "" when absent.
std::string HeaderValue(const std::string& head, const std::string& lower_name) {
  std::istringstream in(head);
  std::string line;
  std::getline(in, line);  // the request line
  while (std::getline(in, line) && line != "\r" && !line.empty()) {
    const size_t colon = line.find(':');
    if (colon != lower_name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < colon && same; ++i) {
      same = static_cast<char>(std::tolower(static_cast<unsigned char>(line[i]))) == lower_name[i];
    }
    if (same) return line.substr(colon + 1);  // BearerMatches trims spaces and '\r'
  }
  return "";
}

}  // namespace

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

// ---- metrics ---------------------------------------------------------------------------

void Counter::Increment(double v) {
  L2L_CHECK(v >= 0) << "counter increment must be >= 0, got " << v;
  AtomicAdd(&value_, v);
}

void Gauge::Add(double v) { AtomicAdd(&value_, v); }

std::vector<double> Histogram::ExponentialBuckets(double start, double factor, int count) {
  L2L_CHECK(start > 0 && factor > 1 && count >= 1) << "start=" << start << " factor=" << factor;
  std::vector<double> b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    L2L_CHECK(std::isfinite(bounds_[i])) << "histogram bound " << i << " is not finite";
    L2L_CHECK(i == 0 || bounds_[i] > bounds_[i - 1]) << "histogram bounds must increase (index " << i << ")";
  }
}

void Histogram::Observe(double v) {
  // First bucket whose upper bound is >= v ("le" is inclusive); NaN lands in +Inf.
  size_t i = 0;
  while (i < bounds_.size() && !(v <= bounds_[i])) ++i;
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[i];
  sum_ += v;
}

Histogram::Snapshot Histogram::Snap() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t acc = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    acc += counts_[i];
    s.cumulative.push_back(acc);
  }
  s.count = acc + counts_.back();
  s.sum = sum_;
  return s;
}

// ---- registry --------------------------------------------------------------------------

MetricsRegistry::Family* MetricsRegistry::GetFamily(const std::string& name, const std::string& help,
                                                    Type type) {
  L2L_CHECK(ValidName(name, false)) << "bad metric name '" << name << "'";
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  }
  L2L_CHECK(it->second.type == type) << "metric '" << name << "' registered with two types";
  return &it->second;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = GetFamily(name, help, Type::kCounter)->counters[LabelKey(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Gauge* MetricsRegistry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = GetFamily(name, help, Type::kGauge)->gauges[LabelKey(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return slot.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::string& help,
                                         const std::vector<double>& bounds, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family* f = GetFamily(name, help, Type::kHistogram);
  if (f->histograms.empty()) f->bounds = bounds;
  L2L_CHECK(f->bounds == bounds) << "histogram '" << name << "' used with different buckets";
  auto& slot = f->histograms[LabelKey(labels)];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return slot.get();
}

void MetricsRegistry::AddCollectHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hooks_.push_back(std::move(hook));
}

std::string MetricsRegistry::Render() const {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hooks = hooks_;
  }
  for (auto& h : hooks) h();  // outside mu_: hooks call Get*/Set

  std::ostringstream out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, f] : families_) {
    static const char* kTypeName[] = {"counter", "gauge", "histogram"};
    out << "# HELP " << name << ' ' << Escape(f.help, false) << '\n';
    out << "# TYPE " << name << ' ' << kTypeName[static_cast<int>(f.type)] << '\n';
    for (const auto& [key, c] : f.counters) out << name << Braced(key) << ' ' << FormatMetricValue(c->value()) << '\n';
    for (const auto& [key, g] : f.gauges) out << name << Braced(key) << ' ' << FormatMetricValue(g->value()) << '\n';
    for (const auto& [key, h] : f.histograms) {
      const Histogram::Snapshot s = h->Snap();
      for (size_t i = 0; i < s.bounds.size(); ++i) {
        out << name << "_bucket" << Braced(key, "le=\"" + FormatMetricValue(s.bounds[i]) + "\"") << ' '
            << s.cumulative[i] << '\n';
      }
      out << name << "_bucket" << Braced(key, "le=\"+Inf\"") << ' ' << s.count << '\n';
      out << name << "_sum" << Braced(key) << ' ' << FormatMetricValue(s.sum) << '\n';
      out << name << "_count" << Braced(key) << ' ' << s.count << '\n';
    }
  }
  return out.str();
}

// ---- the daemon's metrics --------------------------------------------------------------

void UpdateEpsMetrics(MetricsRegistry* r, const EpsSnapshot& s) {
  r->GetGauge("l2l_step", "Optimizer steps completed")->Set(static_cast<double>(s.step));
  r->GetGauge("l2l_total_steps", "Optimizer steps the job runs")->Set(static_cast<double>(s.total_steps));
  r->GetGauge("l2l_loss", "Mean training loss of the last step, all workers")->Set(s.loss);
  if (s.val_step > 0) {
    r->GetGauge("l2l_val_loss", "Validation loss (job eval:) at l2l_val_step, mean over the eval tokens")
        ->Set(s.val_loss);
    r->GetGauge("l2l_val_step", "Step of the last validation loss")->Set(static_cast<double>(s.val_step));
  }
  r->GetGauge("l2l_tokens_per_second", "Tokens per second over the last step, all workers")->Set(s.tokens_per_s);
  r->GetGauge("l2l_update_busy_seconds", "EPS update pipeline busy time in the last step")->Set(s.update_busy_s);
  r->GetGauge("l2l_update_exposed_seconds", "EPS update time after the last gradient of the step arrived")
      ->Set(s.update_exposed_s);
  r->GetGauge("l2l_skipped_steps_total", "Steps skipped for a non-finite gradient or loss (state unchanged)")
      ->Set(static_cast<double>(s.skipped_steps));
  r->GetGauge("l2l_consecutive_skipped_steps", "Steps skipped in a row up to the last completed step")
      ->Set(static_cast<double>(s.consecutive_skips));
  for (size_t i = 0; i < s.layer_version.size(); ++i) {
    r->GetGauge("l2l_layer_version", "Published version per layer", {{"layer", std::to_string(i)}})
        ->Set(static_cast<double>(s.layer_version[i]));
  }
  for (const auto& t : s.memory) {
    r->GetGauge("l2l_memory_bytes", "Bytes used per memory tier", {{"tier", t.tier}})
        ->Set(static_cast<double>(t.used_bytes));
    r->GetGauge("l2l_memory_budget_bytes", "Budget per memory tier (0 = unlimited)", {{"tier", t.tier}})
        ->Set(static_cast<double>(t.budget_bytes));
  }
  // Every known state is exported, 0 when empty, so a worker leaving shows as a drop.
  for (const char* st : {"active", "lost", "left"}) {
    const auto it = s.workers_by_state.find(st);
    r->GetGauge("l2l_workers", "Registered workers by state", {{"state", st}})
        ->Set(it == s.workers_by_state.end() ? 0 : it->second);
  }
}

void ObserveStepSeconds(MetricsRegistry* r, double seconds) {
  r->GetHistogram("l2l_step_seconds", "Wall time per optimizer step",
                  Histogram::ExponentialBuckets(0.01, 2, 16))  // 10 ms .. ~5.5 min
      ->Observe(seconds);
}

// ---- HTTP server -----------------------------------------------------------------------

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const MetricsRegistry* registry,
                                                                    const MetricsServerOptions& options) {
  const size_t colon = options.listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == options.listen.size()) {
    return InvalidArgument("metrics listen address '" + options.listen + "' is not host:port");
  }
  std::string host = options.listen.substr(0, colon);
  const std::string port = options.listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return InvalidArgument("metrics listen address '" + options.listen + "': " + gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  const bool loopback =
      (res->ai_family == AF_INET &&
       (ntohl(reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr.s_addr) >> 24) == 127) ||
      (res->ai_family == AF_INET6 &&
       IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr));
  if (!loopback) {
    ServerSecurity sec;
    sec.token = options.token;
    sec.insecure = options.insecure;
    L2L_RETURN_IF_ERROR(CheckExposure(ExposedApi::kMetrics, options.listen, sec));
  }

  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer(registry, options));
  s->listen_fd_ = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return SocketError("socket", options.listen);
  const int one = 1;
  setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(s->listen_fd_, res->ai_addr, res->ai_addrlen) != 0) return SocketError("bind", options.listen);
  if (listen(s->listen_fd_, 16) != 0) return SocketError("listen", options.listen);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return SocketError("getsockname", options.listen);
  }
  s->port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                              : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  s->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd_ < 0) return SocketError("eventfd", options.listen);
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);  // also on a failed Start
  if (wake_fd_ >= 0) close(wake_fd_);
}

void MetricsHttpServer::Stop() {
  if (!thread_.joinable()) return;
  std::call_once(stopped_, [this] {
    const uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
      L2L_LOG_WARN("metrics server: cannot wake its thread: {}", std::strerror(errno));
    }
    thread_.join();
    close(listen_fd_);  // from now on connections are refused
    listen_fd_ = -1;
  });
}

void MetricsHttpServer::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      L2L_LOG_ERROR("metrics server: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the peer went away between poll and accept
    Serve(fd);
    close(fd);
  }
}

void MetricsHttpServer::Serve(int fd) {
  // Read the request head (we ignore any body), bounded in size and time.
  std::string req;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.io_timeout_ms);
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || req.size() > 16384) return;
    pollfd p{fd, POLLIN, 0};
    pollfd w{wake_fd_, POLLIN, 0};
    pollfd both[2] = {p, w};
    if (poll(both, 2, static_cast<int>(left.count())) <= 0) return;
    if (both[1].revents) return;  // shutting down
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  std::istringstream line(req.substr(0, req.find('\n')));
  std::string method, target, version;
  line >> method >> target >> version;
  const std::string path = target.substr(0, target.find('?'));
  int code = 200;
  std::string reason = "OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (!opts_.token.empty() && !BearerMatches(HeaderValue(req, "authorization"), opts_.token)) {
    code = 401, reason = "Unauthorized", type = "text/plain",
    body = "this l2l-eps requires 'Authorization: Bearer <token>' (the token in its --token-file)\n";
  } else if (method != "GET" && method != "HEAD") {
    code = 405, reason = "Method Not Allowed", type = "text/plain", body = "only GET is served\n";
  } else if (path == "/metrics") {
    body = registry_->Render();
  } else if (path == "/") {
    type = "text/plain", body = "l2l-eps metrics: GET /metrics\n";
  } else {
    code = 404, reason = "Not Found", type = "text/plain", body = "no such page: " + path + "; try /metrics\n";
  }
  std::string resp = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
                     "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n" +
                     (code == 405 ? "Allow: GET, HEAD\r\n" : "") +
                     (code == 401 ? "WWW-Authenticate: Bearer realm=\"l2l-eps\"\r\n" : "") + "\r\n";
  if (method != "HEAD") resp += body;
  size_t off = 0;
  while (off < resp.size()) {
    const ssize_t n = send(fd, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
  served_.fetch_add(1);
}

}  // namespace l2l::eps
