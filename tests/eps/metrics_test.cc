// MetricsRegistry + MetricsHttpServer (eps_server/metrics.h): scraped over a real
// loopback socket with a hand-written HTTP client, the Prometheus text format parsed
// here, and every value checked against what the test put in (histogram buckets are
// recounted from the observations).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "eps_server/metrics.h"

namespace l2l::eps {
namespace {

// Sends `request` to 127.0.0.1:port and returns the whole response (the server closes).
std::string HttpExchange(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

struct Response {
  int code = 0;
  std::map<std::string, std::string> headers;
  std::string body;
};

Response Get(int port, const std::string& path, const std::string& method = "GET",
             const std::string& extra_headers = "") {
  const std::string raw =
      HttpExchange(port, method + " " + path + " HTTP/1.1\r\nHost: x\r\n" + extra_headers + "\r\n");
  Response r;
  const size_t head_end = raw.find("\r\n\r\n");
  REQUIRE(head_end != std::string::npos);
  std::istringstream head(raw.substr(0, head_end));
  std::string line, version;
  std::getline(head, line);
  std::istringstream status(line);
  status >> version >> r.code;
  CHECK(version == "HTTP/1.1");
  while (std::getline(head, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t c = line.find(':');
    if (c != std::string::npos) r.headers[line.substr(0, c)] = line.substr(c + 2);
  }
  r.body = raw.substr(head_end + 4);
  if (r.headers.count("Content-Length")) CHECK(std::stoul(r.headers["Content-Length"]) == r.body.size());
  return r;
}

// Parsed exposition: sample "name{sorted labels}" -> value, plus TYPE and HELP per family.
struct Exposition {
  std::map<std::string, double> samples;
  std::map<std::string, std::string> type, help;
};

double ParseValue(const std::string& s) {
  if (s == "+Inf") return INFINITY;
  if (s == "-Inf") return -INFINITY;
  if (s == "NaN") return NAN;
  return std::stod(s);
}

Exposition Parse(const std::string& text) {
  static const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$)");
  static const std::regex label(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)")re");
  Exposition e;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    INFO("line: " << line);
    if (line.rfind("# HELP ", 0) == 0) {
      const std::string rest = line.substr(7);
      e.help[rest.substr(0, rest.find(' '))] = rest.substr(rest.find(' ') + 1);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      e.type[name] = type;
      continue;
    }
    std::smatch m;
    REQUIRE(std::regex_match(line, m, sample));
    std::map<std::string, std::string> labels;
    const std::string ls = m[3];
    for (auto it = std::sregex_iterator(ls.begin(), ls.end(), label); it != std::sregex_iterator(); ++it) {
      labels[(*it)[1]] = (*it)[2];
    }
    std::string key = m[1].str();
    if (!labels.empty()) {
      key += "{";
      for (const auto& [k, v] : labels) key += k + "=" + v + ",";
      key.back() = '}';
    }
    REQUIRE(e.samples.count(key) == 0);
    e.samples[key] = ParseValue(m[4]);
  }
  return e;
}

TEST_CASE("Metrics served on /metrics parse back to the values recorded", "[eps][metrics]") {
  MetricsRegistry reg;
  Counter* steps = reg.GetCounter("l2l_steps_total", "Optimizer steps completed");
  Gauge* v3 = reg.GetGauge("l2l_layer_version", "Published version per layer", {{"layer", "3"}});
  Gauge* v0 = reg.GetGauge("l2l_layer_version", "ignored", {{"layer", "0"}});
  Gauge* odd = reg.GetGauge("l2l_odd", "Help with \\ and\nnewline", {{"path", "a\"b\\c\nd"}});
  const std::vector<double> bounds = {0.1, 0.5, 1, 2.5};
  Histogram* h = reg.GetHistogram("l2l_step_seconds", "Step wall time", bounds);

  steps->Increment();
  steps->Increment(2.5);
  v3->Set(17);
  v0->Set(16);
  v0->Add(-0.5);
  odd->Set(-1e-3);
  const std::vector<double> obs = {0.05, 0.1, 0.3, 0.7, 0.9, 1.0, 2.0, 3.0, 100.0, 0.5};
  for (double o : obs) h->Observe(o);
  CHECK(reg.GetCounter("l2l_steps_total", "") == steps);  // get-or-create returns the same series

  auto server = MetricsHttpServer::Start(&reg);
  REQUIRE(server.ok());
  REQUIRE((*server)->port() > 0);
  const Response r = Get((*server)->port(), "/metrics");
  REQUIRE(r.code == 200);
  CHECK(r.headers.at("Content-Type").rfind("text/plain; version=0.0.4", 0) == 0);
  INFO(r.body);
  const Exposition e = Parse(r.body);

  CHECK(e.type.at("l2l_steps_total") == "counter");
  CHECK(e.type.at("l2l_layer_version") == "gauge");
  CHECK(e.type.at("l2l_step_seconds") == "histogram");
  CHECK(e.help.at("l2l_layer_version") == "Published version per layer");
  CHECK(e.help.at("l2l_odd") == "Help with \\\\ and\\nnewline");
  CHECK(e.samples.at("l2l_steps_total") == 3.5);
  CHECK(e.samples.at("l2l_layer_version{layer=3}") == 17);
  CHECK(e.samples.at("l2l_layer_version{layer=0}") == 15.5);
  CHECK(e.samples.at("l2l_odd{path=a\\\"b\\\\c\\nd}") == -1e-3);

  // Buckets recounted from the observations; cumulative, +Inf == _count, _sum == sum.
  double sum = 0;
  for (double o : obs) sum += o;
  for (double b : bounds) {
    int expect = 0;
    for (double o : obs) expect += o <= b;
    std::ostringstream key;
    key << "l2l_step_seconds_bucket{le=" << FormatMetricValue(b) << "}";
    INFO(key.str());
    CHECK(e.samples.at(key.str()) == expect);
  }
  CHECK(e.samples.at("l2l_step_seconds_bucket{le=+Inf}") == obs.size());
  CHECK(e.samples.at("l2l_step_seconds_count") == obs.size());
  CHECK(e.samples.at("l2l_step_seconds_sum") == Approx(sum).epsilon(1e-12));
  CHECK((*server)->requests_served() == 1);
}

TEST_CASE("Histogram snapshots stay consistent under concurrent observers", "[eps][metrics]") {
  MetricsRegistry reg;
  Histogram* h = reg.GetHistogram("l2l_x_seconds", "x", Histogram::ExponentialBuckets(0.001, 10, 4),
                                  {{"worker", "a"}});
  Counter* c = reg.GetCounter("l2l_x_total", "x");
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        h->Observe((i % 5) * 0.01 + t * 1e-4);
        c->Increment();
      }
    });
  }
  // While they run, every snapshot is internally consistent.
  for (int k = 0; k < 200; ++k) {
    const auto s = h->Snap();
    for (size_t i = 1; i < s.cumulative.size(); ++i) REQUIRE(s.cumulative[i] >= s.cumulative[i - 1]);
    REQUIRE(s.count >= s.cumulative.back());
  }
  for (auto& t : ts) t.join();
  const auto s = h->Snap();
  CHECK(s.count == uint64_t{kThreads} * kEach);
  CHECK(c->value() == double(kThreads) * kEach);
  // bounds 0.001, 0.01, 0.1, 1: values (i%5)*0.01 + t*1e-4 -> i%5==0 lands <= 0.001.
  CHECK(s.cumulative[0] == uint64_t{kThreads} * kEach / 5);
  CHECK(s.cumulative[2] == uint64_t{kThreads} * kEach);
}

TEST_CASE("Metrics HTTP server answers 404, 405, runs collect hooks and stops cleanly", "[eps][metrics]") {
  MetricsRegistry reg;
  int hook_runs = 0;
  Gauge* g = reg.GetGauge("l2l_hooked", "set by a hook");
  reg.AddCollectHook([&] { g->Set(++hook_runs); });
  auto server = MetricsHttpServer::Start(&reg, {"127.0.0.1:0", false, 500, ""});
  REQUIRE(server.ok());
  const int port = (*server)->port();
  CHECK(Get(port, "/nope").code == 404);
  CHECK(Get(port, "/metrics", "POST").code == 405);
  CHECK(Get(port, "/").code == 200);
  CHECK(Parse(Get(port, "/metrics?x=1").body).samples.at("l2l_hooked") == 1);
  CHECK(Parse(Get(port, "/metrics").body).samples.at("l2l_hooked") == 2);

  // A client that never finishes its request does not wedge the server.
  const int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(idle, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(send(idle, "GET /metr", 9, MSG_NOSIGNAL) == 9);
  CHECK(Get(port, "/metrics").code == 200);  // served after the 500 ms io timeout
  close(idle);

  (*server)->Stop();
  (*server)->Stop();  // idempotent
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0);  // nobody listens any more
  close(fd);
}

TEST_CASE("Metrics server refuses a non-loopback address without a token or --insecure", "[eps][metrics]") {
  MetricsRegistry reg;
  // Refused before binding: nothing listens on 0.0.0.0 afterwards (Start returns early).
  auto s = MetricsHttpServer::Start(&reg, {"0.0.0.0:0", false, 1000, ""});
  REQUIRE(!s.ok());
  CHECK(s.status().code() == StatusCode::kPermissionDenied);
  CHECK(s.status().message().find("0.0.0.0:0") != std::string::npos);
  CHECK(s.status().message().find("--token-file") != std::string::npos);
  CHECK(s.status().message().find("--insecure") != std::string::npos);
  auto bad = MetricsHttpServer::Start(&reg, {"no-port-here", false, 1000, ""});
  REQUIRE(!bad.ok());
  CHECK(bad.status().message().find("no-port-here") != std::string::npos);
}

TEST_CASE("Metrics server with a token answers 401 unless the request carries it", "[eps][metrics]") {
  MetricsRegistry reg;
  reg.GetGauge("l2l_guarded", "x")->Set(7);
  MetricsServerOptions o;
  o.token = "s3cret-token";
  auto server = MetricsHttpServer::Start(&reg, o);
  REQUIRE(server.ok());
  const int port = (*server)->port();
  const Response none = Get(port, "/metrics");
  CHECK(none.code == 401);
  CHECK(none.headers.at("WWW-Authenticate").find("Bearer") == 0);
  CHECK(none.body.find("l2l_guarded") == std::string::npos);
  CHECK(Get(port, "/metrics", "GET", "Authorization: Bearer wrong-token\r\n").code == 401);
  CHECK(Get(port, "/metrics", "GET", "Authorization: Bearer s3cret-tokenX\r\n").code == 401);
  CHECK(Get(port, "/metrics", "GET", "Authorization: Basic s3cret-token\r\n").code == 401);
  CHECK(Get(port, "/", "GET", "X-Other: Bearer s3cret-token\r\n").code == 401);
  const Response ok = Get(port, "/metrics", "GET", "authorization: bearer s3cret-token\r\n");
  CHECK(ok.code == 200);
  CHECK(Parse(ok.body).samples.at("l2l_guarded") == 7);
  CHECK(Get(port, "/metrics", "GET", "Accept: */*\r\nAuthorization:  Bearer s3cret-token \r\n").code == 200);
}

TEST_CASE("FormatMetricValue writes Prometheus' special values and round-trips", "[eps][metrics]") {
  CHECK(FormatMetricValue(INFINITY) == "+Inf");
  CHECK(FormatMetricValue(-INFINITY) == "-Inf");
  CHECK(FormatMetricValue(NAN) == "NaN");
  for (double v : {0.1, 1e-300, 123456789.125, -2.5, 3.0}) CHECK(std::stod(FormatMetricValue(v)) == v);
}

TEST_CASE("UpdateEpsMetrics exports the daemon's status under the documented names", "[eps][metrics]") {
  MetricsRegistry reg;
  EpsSnapshot s;
  s.step = 7;
  s.total_steps = 100;
  s.loss = 3.25;
  s.tokens_per_s = 1234.5;
  s.update_busy_s = 0.5;
  s.update_exposed_s = 0.125;
  s.layer_version = {7, 7, 6};
  s.memory = {{"ram", 1 << 20, 1 << 30}, {"shm", 4096, 0}};
  s.workers_by_state = {{"active", 2}, {"left", 1}};
  UpdateEpsMetrics(&reg, s);
  ObserveStepSeconds(&reg, 0.75);
  ObserveStepSeconds(&reg, 0.25);
  const Exposition e = Parse(reg.Render());
  CHECK(e.samples.at("l2l_step") == 7);
  CHECK(e.samples.at("l2l_total_steps") == 100);
  CHECK(e.samples.at("l2l_loss") == 3.25);
  CHECK(e.samples.at("l2l_tokens_per_second") == 1234.5);
  CHECK(e.samples.at("l2l_update_busy_seconds") == 0.5);
  CHECK(e.samples.at("l2l_update_exposed_seconds") == 0.125);
  CHECK(e.samples.at("l2l_layer_version{layer=0}") == 7);
  CHECK(e.samples.at("l2l_layer_version{layer=2}") == 6);
  CHECK(e.samples.at("l2l_memory_bytes{tier=ram}") == (1 << 20));
  CHECK(e.samples.at("l2l_memory_budget_bytes{tier=ram}") == (1 << 30));
  CHECK(e.samples.at("l2l_memory_bytes{tier=shm}") == 4096);
  CHECK(e.samples.at("l2l_workers{state=active}") == 2);
  CHECK(e.samples.at("l2l_workers{state=lost}") == 0);
  CHECK(e.samples.at("l2l_workers{state=left}") == 1);
  CHECK(e.samples.at("l2l_step_seconds_count") == 2);
  CHECK(e.samples.at("l2l_step_seconds_sum") == 1.0);
  CHECK(e.samples.at("l2l_step_seconds_bucket{le=0.32}") == 1);
  CHECK(e.samples.at("l2l_step_seconds_bucket{le=0.64}") == 1);
  CHECK(e.samples.at("l2l_step_seconds_bucket{le=1.28}") == 2);
}

}  // namespace
}  // namespace l2l::eps
