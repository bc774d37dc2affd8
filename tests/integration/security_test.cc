// Security defaults of l2l-eps and its clients (docs/operations.md "Security"), against
// real processes on loopback (tests/integration/harness.h). One test case per refusal:
//  * a non-loopback --listen / --metrics-listen without client authentication: l2l-eps
//    exits 1 before binding or writing anything, naming the address and the ways out;
//    TLS alone (no --tls-client-ca, no token) is refused the same way, naming
//    --tls-client-ca and --token-file (the positive side, --insecure / token / mutual TLS,
//    is checked in-process and through a start that fails later for another reason: no
//    test here binds beyond 127.0.0.1; tests/integration/netns_test.py does, in network
//    namespaces);
//  * a token file readable by group or others, or empty (daemon and l2lctl);
//  * a daemon with a token: Control and Data calls without it or with a wrong one end
//    UNAUTHENTICATED, with it they succeed; grpc.health.v1 stays open; l2lctl and
//    l2l-worker without the token exit non-zero with "requires a token", with it they work
//    (the worker trains two steps);
//  * TLS (a self-signed certificate made here with the openssl CLI): l2lctl with --tls-ca
//    works, plaintext or a wrong CA fails; a worker over TLS + token trains; a certificate
//    naming only eps.test verifies from 127.0.0.1 with --tls-server-name eps.test (l2lctl
//    and a training worker), not without it or with another name; the flag needs --tls-ca;
//  * mutual TLS (--tls-client-ca; a CA and client certificates made here with openssl):
//    l2lctl and l2l-worker without a client certificate, or with one another CA signed,
//    are refused at the handshake (exit 2, naming authentication and --tls-cert); with a
//    valid one l2lctl works and the worker trains; with a token too, both are needed; the
//    clients' --tls-cert/--tls-key need each other and --tls-ca, and a key others may
//    read is refused;
//  * checkpoint paths escaping the state dir ('..', a symlink) are refused;
//  * shared-memory segments (published weights, a worker's gradients) are mode 0600.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "common/auth_token.h"
#include "eps_server/eps_config.h"
#include "eps_server/server_security.h"
#include "proto/control.grpc.pb.h"
#include "proto/data.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/testing/jobs.h"

namespace l2l::itest {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace ctl = ::l2l::control::v1;
namespace data = ::l2l::data::v1;

std::unique_ptr<TempDir> MakeDir(const std::string& name) {
  auto d = TempDir::Create("l2l-sec-" + name);
  REQUIRE(d.ok());
  return std::move(d).value();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `content` to `path` with permission bits `mode` (set after writing).
std::string WriteFile(const std::string& path, const std::string& content, fs::perms mode) {
  {
    std::ofstream f(path);
    f << content;
    REQUIRE(f.good());
  }
  fs::permissions(path, mode, fs::perm_options::replace);
  return path;
}

constexpr fs::perms k600 = fs::perms::owner_read | fs::perms::owner_write;

JobConfig TinyJob(const std::string& tokens_path, int64_t steps) {
  JobConfig job = testing::GptJob({64, 8, 16, 2, 2, 32},
                                  {.steps = steps, .micro_batch_size = 2, .micro_batches = 2, .seed = 77});
  job.data.train_path = tokens_path;
  std::vector<int32_t> t(4096);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 5 + i / 11) % job.model.vocab_size);
  REQUIRE(WriteTokens(tokens_path, t).ok());
  return job;
}

struct Run {
  int code = -1;
  std::string out, err;
};

// Runs `env... BINARY args...` through /bin/sh, stdout and stderr captured separately.
Run Exec(const TempDir& dir, const std::string& binary, const std::vector<std::string>& args,
         const std::string& env = "", std::chrono::seconds timeout = 60s) {
  static int n = 0;
  const std::string out = dir.File("run" + std::to_string(n) + ".out");
  const std::string err = dir.File("run" + std::to_string(n++) + ".err");
  std::string cmd = env + " exec '" + BinaryPath(binary) + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " 2>'" + err + "'";
  auto p = Process::Spawn({"/bin/sh", "-c", cmd}, out);
  REQUIRE(p.ok());
  auto code = (*p)->Wait(timeout);
  INFO(code.status().ToString());
  REQUIRE(code.ok());
  return Run{*code, Slurp(out), Slurp(err)};
}

// SIGTERM and a clean exit (the harness's own Shutdown rpc carries no token or TLS).
void StopDaemon(EpsDaemon& d) {
  d.process().Signal(SIGTERM);
  auto code = d.process().Wait(30s);
  INFO(code.status().ToString() << "\n" << d.process().LogTail());
  REQUIRE(code.ok());
  CHECK(*code == 0);
}

// Control.GetStatus and Data.Register/Deregister with an optional authorization value.
grpc::StatusCode ControlCode(const std::string& addr, const std::string& auth) {
  auto stub = ctl::Control::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + 10s);
  if (!auth.empty()) c.AddMetadata("authorization", auth);
  ctl::GetStatusRequest req;
  ctl::GetStatusReply rep;
  const grpc::Status s = stub->GetStatus(&c, req, &rep);
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) CHECK(rep.job_id().empty());
  return s.error_code();
}

struct DataResult {
  grpc::Status status;
  int32_t worker_id = -1;
};

DataResult DataRegister(const std::string& addr, const std::string& auth) {
  auto stub = data::Data::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + 10s);
  if (!auth.empty()) c.AddMetadata("authorization", auth);
  data::RegisterRequest req;
  req.set_worker_name("security-test");
  req.set_transport("grpc");
  data::RegisterReply rep;
  DataResult r{stub->Register(&c, req, &rep), rep.worker_id()};
  if (r.status.ok()) {
    grpc::ClientContext d;
    d.set_deadline(std::chrono::system_clock::now() + 10s);
    d.AddMetadata("authorization", auth);
    data::DeregisterRequest dr;
    dr.set_worker_id(rep.worker_id());
    dr.set_registration_id(rep.registration_id());
    data::DeregisterReply drep;
    CHECK(stub->Deregister(&d, dr, &drep).ok());
  }
  return r;
}

// grpc.health.v1.Health/Check with an empty request; "\x08\x01" is status SERVING.
grpc::Status HealthCheck(const std::string& addr, std::string* reply) {
  grpc::GenericStub stub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + 10s);
  grpc::Slice empty("");
  grpc::ByteBuffer req(&empty, 1), rep;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status st;
  stub.UnaryCall(&c, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &rep, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    st = std::move(s);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  std::vector<grpc::Slice> slices;
  if (st.ok() && rep.Dump(&slices).ok()) {
    for (const auto& s : slices) reply->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return st;
}

// A self-signed certificate for 127.0.0.1 and localhost (key mode 0600), made with the
// openssl CLI (scripts/setup.sh installs it). Returns {cert, key}.
std::pair<std::string, std::string> MakeCert(const TempDir& dir, const std::string& name) {
  const std::string cert = dir.File(name + "-cert.pem"), key = dir.File(name + "-key.pem");
  const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                          "-subj /CN=l2l-test -addext 'subjectAltName=IP:127.0.0.1,DNS:localhost' -keyout '" +
                          key + "' -out '" + cert + "' >'" + dir.File(name + "-openssl.log") + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  INFO("openssl (scripts/setup.sh installs it) failed: " << Slurp(dir.File(name + "-openssl.log")));
  REQUIRE(rc == 0);
  fs::permissions(key, k600, fs::perm_options::replace);
  return {cert, key};
}

bool Has(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

// Runs `cmd` (openssl) with its output in dir/<log>; REQUIREs success.
void OpenSsl(const TempDir& dir, const std::string& cmd, const std::string& log) {
  const int rc = std::system((cmd + " >'" + dir.File(log) + "' 2>&1").c_str());
  INFO("openssl (scripts/setup.sh installs it) failed: " << cmd << "\n" << Slurp(dir.File(log)));
  REQUIRE(rc == 0);
}

// A certificate authority for client certificates (self-signed, CA:TRUE; key mode
// 0600), made at test time: no private key is committed. Returns {cert, key}.
std::pair<std::string, std::string> MakeCa(const TempDir& dir, const std::string& name) {
  const std::string cert = dir.File(name + "-ca.pem"), key = dir.File(name + "-ca-key.pem");
  OpenSsl(dir,
          "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=" + name +
              " -keyout '" + key + "' -out '" + cert + "'",
          name + "-ca-openssl.log");
  fs::permissions(key, k600, fs::perm_options::replace);
  return {cert, key};
}

// A client certificate (CN=`name`, extendedKeyUsage clientAuth) signed by `ca` (MakeCa's
// {cert, key}); key mode 0600. Returns {cert, key}.
std::pair<std::string, std::string> MakeClientCert(const TempDir& dir, const std::string& name,
                                                   const std::pair<std::string, std::string>& ca) {
  const std::string cert = dir.File(name + "-client.pem"), key = dir.File(name + "-client-key.pem");
  const std::string csr = dir.File(name + ".csr"), ext = dir.File(name + "-ext.cnf");
  {
    std::ofstream f(ext);
    f << "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n";
  }
  OpenSsl(dir,
          "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=" + name + " -keyout '" +
              key + "' -out '" + csr + "'",
          name + "-csr-openssl.log");
  OpenSsl(dir,
          "openssl x509 -req -in '" + csr + "' -CA '" + ca.first + "' -CAkey '" + ca.second +
              "' -CAcreateserial -days 2 -extfile '" + ext + "' -out '" + cert + "'",
          name + "-sign-openssl.log");
  fs::permissions(key, k600, fs::perm_options::replace);
  return {cert, key};
}

}  // namespace

TEST_CASE("l2l-eps refuses a non-loopback listen address without TLS or a token, before binding",
          "[integration][security]") {
  auto dir = MakeDir("refuse");
  const std::string state = dir->File("state");
  auto p = Process::Spawn({BinaryPath("l2l-eps"), "--listen", "0.0.0.0:0", "--state-dir", state},
                          dir->File("eps.log"));
  REQUIRE(p.ok());
  auto code = (*p)->Wait(20s);
  REQUIRE(code.ok());
  const std::string log = (*p)->Log();
  INFO(log);
  CHECK(*code == 1);
  CHECK(Has(log, "0.0.0.0:0"));
  CHECK(Has(log, "--tls-cert"));
  CHECK(Has(log, "--tls-key"));
  CHECK(Has(log, "--token-file"));
  CHECK(Has(log, "--insecure"));
  // Refused before binding or writing: no "listening" line, not even the state dir.
  CHECK(!Has(log, "listening on"));
  CHECK(!fs::exists(state));
}

TEST_CASE("l2l-eps refuses a non-loopback metrics address without a token, before binding",
          "[integration][security]") {
  auto dir = MakeDir("refuse-metrics");
  const std::string state = dir->File("state");
  // TLS does not cover the plain-HTTP metrics endpoint: a certificate alone is not enough.
  const auto [cert, key] = MakeCert(*dir, "m");
  auto p = Process::Spawn({BinaryPath("l2l-eps"), "--listen", "127.0.0.1:0", "--state-dir", state, "--tls-cert",
                           cert, "--tls-key", key, "--metrics-listen", "0.0.0.0:0"},
                          dir->File("eps.log"));
  REQUIRE(p.ok());
  auto code = (*p)->Wait(20s);
  REQUIRE(code.ok());
  const std::string log = (*p)->Log();
  INFO(log);
  CHECK(*code == 1);
  CHECK(Has(log, "metrics address 0.0.0.0:0"));
  CHECK(Has(log, "--token-file"));
  CHECK(Has(log, "--insecure"));
  CHECK(!Has(log, "listening on"));
  CHECK(!fs::exists(state));
}

// Changed with issue 28: TLS alone (a server certificate, no client CA, no token) used to
// pass this check; it authenticates no client, so beyond loopback it is now refused.
TEST_CASE("The flags --insecure, a token or mutual TLS let a non-loopback address past the check, TLS alone "
          "does not (no bind)",
          "[integration][security]") {
  using eps::CheckExposure;
  using eps::ExposedApi;
  eps::ServerSecurity none, insecure, tls, mtls, token, tls_insecure;
  insecure.insecure = true;
  tls.tls_cert_pem = "-----BEGIN CERTIFICATE-----";
  tls.tls_key_pem = "-----BEGIN PRIVATE KEY-----";
  mtls = tls;
  mtls.tls_client_ca_pem = "-----BEGIN CERTIFICATE----- (client CA)";
  tls_insecure = tls;
  tls_insecure.insecure = true;
  token.token = "t0ken";
  for (const std::string addr : {"0.0.0.0:7500", "10.1.2.3:7500", "myhost:7500", "[::]:7500"}) {
    INFO(addr);
    const Status refused = CheckExposure(ExposedApi::kGrpc, addr, none);
    CHECK(refused.code() == StatusCode::kPermissionDenied);
    CHECK(Has(refused.message(), addr));
    CHECK(Has(refused.message(), "--tls-client-ca"));
    CHECK(Has(refused.message(), "--token-file"));
    CHECK(CheckExposure(ExposedApi::kGrpc, addr, insecure).ok());
    const Status tls_alone = CheckExposure(ExposedApi::kGrpc, addr, tls);
    CHECK(tls_alone.code() == StatusCode::kPermissionDenied);
    CHECK(Has(tls_alone.message(), addr));
    CHECK(Has(tls_alone.message(), "authenticates no client"));
    CHECK(Has(tls_alone.message(), "--tls-client-ca"));
    CHECK(Has(tls_alone.message(), "--token-file"));
    CHECK(CheckExposure(ExposedApi::kGrpc, addr, mtls).ok());
    CHECK(CheckExposure(ExposedApi::kGrpc, addr, token).ok());
    CHECK(CheckExposure(ExposedApi::kGrpc, addr, tls_insecure).ok());
    CHECK(CheckExposure(ExposedApi::kMetrics, addr, tls).code() == StatusCode::kPermissionDenied);
    CHECK(CheckExposure(ExposedApi::kMetrics, addr, mtls).code() == StatusCode::kPermissionDenied);
    CHECK(CheckExposure(ExposedApi::kMetrics, addr, token).ok());
    CHECK(CheckExposure(ExposedApi::kMetrics, addr, insecure).ok());
    CHECK(Has(eps::ExposureWarning(ExposedApi::kGrpc, addr, insecure), "INSECURE"));
    CHECK(Has(eps::ExposureWarning(ExposedApi::kGrpc, addr, tls_insecure), "authenticates no client"));
    CHECK(Has(eps::ExposureWarning(ExposedApi::kGrpc, addr, token), "clear text"));
    CHECK(eps::ExposureWarning(ExposedApi::kGrpc, addr, mtls).empty());
  }
  for (const std::string addr : {"127.0.0.1:0", "127.0.0.5:9", "localhost:7500", "[::1]:7500"}) {
    INFO(addr);
    CHECK(CheckExposure(ExposedApi::kGrpc, addr, none).ok());
    CHECK(CheckExposure(ExposedApi::kMetrics, addr, none).ok());
    CHECK(eps::ExposureWarning(ExposedApi::kGrpc, addr, none).empty());
  }

  // The real binary with --insecure gets past the check: it then fails on the missing job
  // file, which it reads before binding.
  auto dir = MakeDir("insecure");
  auto p = Process::Spawn({BinaryPath("l2l-eps"), "--listen", "0.0.0.0:0", "--insecure", "--state-dir",
                           dir->File("state"), "--job", dir->File("no-such-job.yaml")},
                          dir->File("eps.log"));
  REQUIRE(p.ok());
  auto code = (*p)->Wait(20s);
  REQUIRE(code.ok());
  const std::string log = (*p)->Log();
  INFO(log);
  CHECK(*code == 1);
  CHECK(Has(log, "WARNING: INSECURE"));
  CHECK(Has(log, "no-such-job.yaml"));
  CHECK(!Has(log, "refusing"));
  CHECK(!Has(log, "listening on"));

  // The daemon config's keys reach the same checks.
  auto cfg = eps::ParseEpsConfig("listen: 0.0.0.0:7500\ninsecure: true\n", "<test>");
  REQUIRE(cfg.ok());
  auto sec = eps::LoadServerSecurity(*cfg);
  REQUIRE(sec.ok());
  CHECK(CheckExposure(ExposedApi::kGrpc, cfg->listen, *sec).ok());
  cfg->insecure = false;
  sec = eps::LoadServerSecurity(*cfg);
  REQUIRE(sec.ok());
  CHECK(!CheckExposure(ExposedApi::kGrpc, cfg->listen, *sec).ok());
  // tls.client_ca: mutual TLS from the config file; it needs tls.cert.
  const auto [cert, key] = MakeCert(*dir, "cfg");
  const auto [ca, ca_key] = MakeCa(*dir, "cfg-ca");
  cfg = eps::ParseEpsConfig("listen: 0.0.0.0:7500\ntls:\n  cert: " + cert + "\n  key: " + key + "\n", "<test>");
  REQUIRE(cfg.ok());
  sec = eps::LoadServerSecurity(*cfg);
  REQUIRE(sec.ok());
  CHECK(!CheckExposure(ExposedApi::kGrpc, cfg->listen, *sec).ok());
  cfg = eps::ParseEpsConfig(
      "listen: 0.0.0.0:7500\ntls:\n  cert: " + cert + "\n  key: " + key + "\n  client_ca: " + ca + "\n", "<test>");
  REQUIRE(cfg.ok());
  sec = eps::LoadServerSecurity(*cfg);
  INFO(sec.status().ToString());
  REQUIRE(sec.ok());
  CHECK(sec->mutual_tls());
  CHECK(CheckExposure(ExposedApi::kGrpc, cfg->listen, *sec).ok());
  auto no_cert = eps::ParseEpsConfig("tls:\n  client_ca: " + ca + "\n", "<test>");
  REQUIRE(!no_cert.ok());
  CHECK(Has(no_cert.status().message(), "tls.client_ca"));
  CHECK(Has(no_cert.status().message(), "tls.cert"));
}

TEST_CASE("l2l-eps refuses TLS alone on a non-loopback listen address, before binding", "[integration][security]") {
  auto dir = MakeDir("refuse-tls-alone");
  const std::string state = dir->File("state");
  const auto [cert, key] = MakeCert(*dir, "server");
  auto p = Process::Spawn({BinaryPath("l2l-eps"), "--listen", "0.0.0.0:0", "--state-dir", state, "--tls-cert", cert,
                           "--tls-key", key},
                          dir->File("eps.log"));
  REQUIRE(p.ok());
  auto code = (*p)->Wait(20s);
  REQUIRE(code.ok());
  const std::string log = (*p)->Log();
  INFO(log);
  CHECK(*code == 1);
  CHECK(Has(log, "0.0.0.0:0"));
  CHECK(Has(log, "authenticates no client"));
  CHECK(Has(log, "--tls-client-ca"));
  CHECK(Has(log, "--token-file"));
  CHECK(!Has(log, "listening on"));
  CHECK(!fs::exists(state));
  // --tls-client-ca needs the daemon's own certificate.
  const auto [ca, ca_key] = MakeCa(*dir, "ca");
  const Run r = Exec(*dir, "l2l-eps", {"--listen", "127.0.0.1:0", "--state-dir", state, "--tls-client-ca", ca});
  INFO(r.out << r.err);
  CHECK(r.code == 1);
  CHECK(Has(r.err, "--tls-client-ca"));
  CHECK(Has(r.err, "--tls-cert"));
  CHECK(!fs::exists(state));
}

TEST_CASE("A token file readable by group or others, or empty, is refused", "[integration][security]") {
  auto dir = MakeDir("tokfile");
  const std::string state = dir->File("state");
  for (const auto& [mode, text] : {std::pair{fs::perms::owner_read | fs::perms::owner_write |
                                                 fs::perms::others_read, "0604"},
                                   std::pair{fs::perms::owner_read | fs::perms::group_read, "0440"}}) {
    const std::string tok = WriteFile(dir->File(std::string("tok-") + text), "abc123\n", mode);
    const Run r = Exec(*dir, "l2l-eps", {"--token-file", tok, "--state-dir", state});
    INFO(r.out << r.err);
    CHECK(r.code == 1);
    CHECK(Has(r.err, "mode " + std::string(text)));
    CHECK(Has(r.err, "chmod 600 " + tok));
    CHECK(!Has(r.out, "listening on"));
    CHECK(!fs::exists(state));
    // Clients too: the token is as secret on their side.
    const Run c = Exec(*dir, "l2lctl", {"--eps", "127.0.0.1:1", "--token-file", tok, "status"});
    INFO(c.out << c.err);
    CHECK(c.code == 64);
    CHECK(Has(c.err, "chmod 600 " + tok));
    const Run e = Exec(*dir, "l2lctl", {"--eps", "127.0.0.1:1", "status"}, "L2L_TOKEN_FILE='" + tok + "'");
    CHECK(e.code == 64);
    CHECK(Has(e.err, "$L2L_TOKEN_FILE"));
  }
  const std::string empty = WriteFile(dir->File("empty"), "\n", k600);
  const Run r = Exec(*dir, "l2l-eps", {"--token-file", empty, "--state-dir", state});
  CHECK(r.code == 1);
  CHECK(Has(r.err, "is empty"));
  CHECK(!fs::exists(state));
  // A trailing newline is stripped; the rest must match exactly.
  auto t = ReadTokenFile(WriteFile(dir->File("ok"), "s3cret\r\n", k600));
  REQUIRE(t.ok());
  CHECK(*t == "s3cret");
  CHECK(BearerMatches("Bearer s3cret", "s3cret"));
  CHECK(BearerMatches("bearer  s3cret ", "s3cret"));
  CHECK(!BearerMatches("Bearer s3cre", "s3cret"));
  CHECK(!BearerMatches("Bearer s3cretX", "s3cret"));
  CHECK(!BearerMatches("s3cret", "s3cret"));
  CHECK(!BearerMatches("Bearer ", ""));
}

TEST_CASE("With a token, Control and Data calls without it or with a wrong one are UNAUTHENTICATED",
          "[integration][security]") {
  auto dir = MakeDir("token-rpc");
  const JobConfig job = TinyJob(dir->File("train.bin"), 2);
  const std::string tok = WriteFile(dir->File("token"), "right-token-42\n", k600);
  DaemonOptions o;
  o.transport = l2l::Transport::kGrpc;
  o.extra_args = {"--token-file", tok};
  auto eps = EpsDaemon::Start(job, o, *dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  EpsDaemon& d = **eps;
  const std::string addr = d.address();

  CHECK(ControlCode(addr, "") == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(ControlCode(addr, "Bearer wrong-token") == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(ControlCode(addr, "Bearer right-token-4") == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(ControlCode(addr, "right-token-42") == grpc::StatusCode::UNAUTHENTICATED);  // no scheme
  CHECK(ControlCode(addr, "Bearer right-token-42") == grpc::StatusCode::OK);

  const DataResult none = DataRegister(addr, "");
  CHECK(none.status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(Has(none.status.error_message(), "authorization: Bearer"));
  const DataResult wrong = DataRegister(addr, "Bearer nope");
  CHECK(wrong.status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(Has(wrong.status.error_message(), "does not match"));
  const DataResult right = DataRegister(addr, "Bearer right-token-42");
  INFO(right.status.error_message());
  CHECK(right.status.ok());
  CHECK(right.worker_id == 0);

  // The standard health service stays open for probes.
  std::string reply;
  const grpc::Status h = HealthCheck(addr, &reply);
  INFO(h.error_message());
  CHECK(h.ok());
  CHECK(reply == std::string("\x08\x01", 2));  // SERVING
  StopDaemon(d);
}

TEST_CASE("l2lctl and l2l-worker without the token fail clearly, with it they work",
          "[integration][security]") {
  auto dir = MakeDir("token-cli");
  const JobConfig job = TinyJob(dir->File("train.bin"), 2);
  const std::string tok = WriteFile(dir->File("token"), "cli-token\n", k600);
  const std::string bad = WriteFile(dir->File("bad"), "not-the-token\n", k600);
  DaemonOptions o;
  o.extra_args = {"--token-file", tok};
  auto eps = EpsDaemon::Start(job, o, *dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  EpsDaemon& d = **eps;
  const std::string addr = d.address();

  const Run no = Exec(*dir, "l2lctl", {"--eps", addr, "status"});
  INFO(no.out << no.err);
  CHECK(no.code == 1);
  CHECK(Has(no.err, "the daemon at " + addr + " requires a token: pass --token-file"));
  const Run wrong = Exec(*dir, "l2lctl", {"--eps", addr, "--token-file", bad, "status"});
  CHECK(wrong.code == 1);
  CHECK(Has(wrong.err, "does not match"));
  const Run ok = Exec(*dir, "l2lctl", {"--eps", addr, "--token-file", tok, "status", "--json"});
  INFO(ok.err);
  CHECK(ok.code == 0);
  CHECK(Has(ok.out, "\"job_id\":\"" + d.job_id() + "\""));
  const Run env = Exec(*dir, "l2lctl", {"--eps", addr, "status"}, "L2L_TOKEN_FILE='" + tok + "'");
  CHECK(env.code == 0);

  // A worker without the token is refused at registration (exit 1, not "unreachable").
  auto w0 = StartWorker(addr, "no-token", dir->File("w0.log"), {"--connect-timeout-ms", "5000"});
  REQUIRE(w0.ok());
  auto c0 = (*w0)->Wait(30s);
  REQUIRE(c0.ok());
  INFO((*w0)->Log());
  CHECK(*c0 == 1);
  CHECK(Has((*w0)->Log(), "requires a token: pass --token-file"));

  // With the token it trains the job's two steps.
  auto w = StartWorker(addr, "with-token", dir->File("w1.log"), {"--token-file", tok});
  REQUIRE(w.ok());
  auto c = (*w)->Wait(60s);
  REQUIRE(c.ok());
  INFO((*w)->LogTail());
  CHECK(*c == 0);
  CHECK(ParseSummary((*w)->Log()).at("steps") == 2);
  StopDaemon(d);
}

TEST_CASE("TLS: l2lctl with --tls-ca works, plaintext or another CA fails, a worker trains over TLS + token",
          "[integration][security]") {
  auto dir = MakeDir("tls");
  const auto [cert, key] = MakeCert(*dir, "server");
  const auto [other_cert, other_key] = MakeCert(*dir, "other");
  const JobConfig job = TinyJob(dir->File("train.bin"), 2);
  {
    DaemonOptions o;
    o.extra_args = {"--tls-cert", cert, "--tls-key", key};
    auto eps = EpsDaemon::Start(job, o, *dir);
    INFO(eps.status().ToString());
    REQUIRE(eps.ok());
    EpsDaemon& d = **eps;
    const std::string port = d.address().substr(d.address().rfind(':') + 1);
    for (const std::string host : {"127.0.0.1", "localhost"}) {
      const Run ok = Exec(*dir, "l2lctl", {"--eps", host + ":" + port, "--tls-ca", cert, "status", "--json"});
      INFO(ok.err);
      CHECK(ok.code == 0);
      CHECK(Has(ok.out, "\"job_id\":\"" + d.job_id() + "\""));
    }
    const Run plain = Exec(*dir, "l2lctl", {"--eps", d.address(), "--connect-timeout-ms", "700", "status"});
    CHECK(plain.code == 2);
    CHECK(Has(plain.err, "--tls-ca"));
    const Run other = Exec(*dir, "l2lctl",
                           {"--eps", d.address(), "--connect-timeout-ms", "700", "--tls-ca", other_cert, "status"});
    CHECK(other.code == 2);
    // The raw Control stub over plaintext fails too (UNAVAILABLE: no TLS handshake).
    CHECK(ControlCode(d.address(), "") == grpc::StatusCode::UNAVAILABLE);
    StopDaemon(d);
  }
  {
    // TLS and a token together; the worker's layers and gradients go over gRPC (TLS).
    const std::string tok = WriteFile(dir->File("token"), "tls-token\n", k600);
    DaemonOptions o;
    o.transport = l2l::Transport::kGrpc;
    o.extra_args = {"--tls-cert", cert, "--tls-key", key, "--token-file", tok};
    auto eps = EpsDaemon::Start(job, o, *dir);
    INFO(eps.status().ToString());
    REQUIRE(eps.ok());
    EpsDaemon& d = **eps;
    const Run no = Exec(*dir, "l2lctl", {"--eps", d.address(), "--tls-ca", cert, "status"});
    CHECK(no.code == 1);
    CHECK(Has(no.err, "requires a token"));
    auto w = StartWorker(d.address(), "tls", dir->File("w.log"), {"--tls-ca", cert, "--token-file", tok});
    REQUIRE(w.ok());
    auto c = (*w)->Wait(60s);
    REQUIRE(c.ok());
    INFO((*w)->LogTail());
    CHECK(*c == 0);
    CHECK(ParseSummary((*w)->Log()).at("steps") == 2);
    const Run ok = Exec(*dir, "l2lctl", {"--eps", d.address(), "--tls-ca", cert, "--token-file", tok, "status"});
    CHECK(ok.code == 0);
    CHECK(Has(ok.out, "step 2/2"));
    StopDaemon(d);
  }
}

TEST_CASE("Mutual TLS: a client without a certificate or with one another CA signed is refused, a valid one works",
          "[integration][security]") {
  auto dir = MakeDir("mtls");
  const auto [cert, key] = MakeCert(*dir, "server");
  const auto ca = MakeCa(*dir, "clients");
  const auto rogue_ca = MakeCa(*dir, "rogue");
  const auto [client_cert, client_key] = MakeClientCert(*dir, "worker", ca);
  const auto [rogue_cert, rogue_key] = MakeClientCert(*dir, "intruder", rogue_ca);
  const JobConfig job = TinyJob(dir->File("train.bin"), 2);
  const std::vector<std::string> valid = {"--tls-ca", cert, "--tls-cert", client_cert, "--tls-key", client_key};
  const std::vector<std::string> rogue = {"--tls-ca", cert, "--tls-cert", rogue_cert, "--tls-key", rogue_key};
  const std::vector<std::string> no_cert = {"--tls-ca", cert};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  {
    DaemonOptions o;
    o.transport = l2l::Transport::kGrpc;  // the worker's layers and gradients go over the mTLS channel
    o.extra_args = {"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca.first};
    auto eps = EpsDaemon::Start(job, o, *dir);
    INFO(eps.status().ToString());
    REQUIRE(eps.ok());
    EpsDaemon& d = **eps;
    const std::string addr = d.address();
    const std::vector<std::string> quick = {"--eps", addr, "--connect-timeout-ms", "1000"};

    // l2lctl: no client certificate, or one the daemon's CA did not sign: refused at the
    // handshake; the error names authentication and the flags to pass.
    const Run none = Exec(*dir, "l2lctl", with(with(quick, no_cert), {"status"}));
    INFO(none.out << none.err);
    CHECK(none.code == 2);
    CHECK(Has(none.err, "authentication failed: no client certificate"));
    CHECK(Has(none.err, "--tls-cert FILE --tls-key FILE"));
    const Run other = Exec(*dir, "l2lctl", with(with(quick, rogue), {"status"}));
    INFO(other.out << other.err);
    CHECK(other.code == 2);
    CHECK(Has(other.err, "authentication fails"));
    // The server certificate is not a client certificate of the clients' CA either.
    const Run server_as_client =
        Exec(*dir, "l2lctl", with(quick, {"--tls-ca", cert, "--tls-cert", cert, "--tls-key", key, "status"}));
    CHECK(server_as_client.code == 2);
    // A raw plaintext stub gets nowhere (UNAVAILABLE: no TLS handshake).
    CHECK(ControlCode(addr, "") == grpc::StatusCode::UNAVAILABLE);
    const Run ok = Exec(*dir, "l2lctl", with({"--eps", addr}, with(valid, {"status", "--json"})));
    INFO(ok.out << ok.err);
    CHECK(ok.code == 0);
    CHECK(Has(ok.out, "\"job_id\":\"" + d.job_id() + "\""));

    // l2l-worker: refused without a certificate and with the rogue one (exit 2 after the
    // bounded retry, naming authentication), trains with the valid one.
    for (const auto& [what, flags] : {std::pair{"no-cert", no_cert}, std::pair{"rogue", rogue}}) {
      auto w = StartWorker(addr, what, dir->File(std::string(what) + ".log"),
                           with({"--connect-timeout-ms", "1500"}, flags));
      REQUIRE(w.ok());
      auto c = (*w)->Wait(30s);
      REQUIRE(c.ok());
      INFO(what << ": " << (*w)->Log());
      CHECK(*c == 2);
      CHECK(Has((*w)->Log(), "authentication"));
      CHECK(Has((*w)->Log(), "--tls-client-ca"));
    }
    auto w = StartWorker(addr, "valid", dir->File("valid.log"), valid);
    REQUIRE(w.ok());
    auto c = (*w)->Wait(60s);
    REQUIRE(c.ok());
    INFO((*w)->LogTail());
    CHECK(*c == 0);
    CHECK(ParseSummary((*w)->Log()).at("steps") == 2);
    const Run done = Exec(*dir, "l2lctl", with({"--eps", addr}, with(valid, {"status", "--json"})));
    INFO(done.out << done.err);
    CHECK(done.code == 0);
    CHECK(Has(done.out, "\"step\":2"));
    // Only the valid worker ever registered.
    CHECK(Has(done.out, "\"name\":\"valid\""));
    CHECK(!Has(done.out, "\"name\":\"no-cert\""));
    CHECK(!Has(done.out, "\"name\":\"rogue\""));
    StopDaemon(d);
  }
  {
    // Mutual TLS and a token together: each is required.
    const std::string tok = WriteFile(dir->File("token"), "mtls-token\n", k600);
    DaemonOptions o;
    o.extra_args = {"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca.first, "--token-file", tok};
    auto eps = EpsDaemon::Start(job, o, *dir);
    INFO(eps.status().ToString());
    REQUIRE(eps.ok());
    EpsDaemon& d = **eps;
    const std::string addr = d.address();
    const Run cert_only = Exec(*dir, "l2lctl", with({"--eps", addr}, with(valid, {"status"})));
    INFO(cert_only.out << cert_only.err);
    CHECK(cert_only.code == 1);
    CHECK(Has(cert_only.err, "requires a token"));
    const Run token_only = Exec(*dir, "l2lctl",
                                with({"--eps", addr, "--connect-timeout-ms", "1000", "--token-file", tok},
                                     with(no_cert, {"status"})));
    INFO(token_only.out << token_only.err);
    CHECK(token_only.code == 2);
    const Run both = Exec(*dir, "l2lctl", with({"--eps", addr, "--token-file", tok}, with(valid, {"status"})));
    INFO(both.out << both.err);
    CHECK(both.code == 0);
    StopDaemon(d);
  }
  // The clients' flags: certificate and key together, with --tls-ca; a key others may
  // read is refused (as the daemon's --tls-key), before any connection.
  const std::string loose_key = WriteFile(dir->File("loose-key.pem"), Slurp(client_key),
                                          k600 | fs::perms::group_read | fs::perms::others_read);
  const std::vector<std::pair<std::vector<std::string>, std::string>> usage = {
      {{"--tls-ca", cert, "--tls-cert", client_cert}, "--tls-cert needs --tls-key"},
      {{"--tls-ca", cert, "--tls-key", client_key}, "--tls-key needs --tls-cert"},
      {{"--tls-cert", client_cert, "--tls-key", client_key}, "need --tls-ca"},
      {{"--tls-ca", cert, "--tls-cert", client_cert, "--tls-key", loose_key}, "chmod 600 " + loose_key},
  };
  for (const auto& [flags, says] : usage) {
    const Run r = Exec(*dir, "l2lctl", with({"--eps", "127.0.0.1:1"}, with(flags, {"status"})));
    INFO(says << ": " << r.out << r.err);
    CHECK(r.code == 64);
    CHECK(Has(r.err, says));
    auto w = StartWorker("127.0.0.1:1", "usage", dir->File("usage.log"), flags);
    REQUIRE(w.ok());
    auto c = (*w)->Wait(30s);
    REQUIRE(c.ok());
    INFO((*w)->Log());
    CHECK(*c == 1);
    CHECK(Has((*w)->Log(), says));
  }
}

TEST_CASE("Checkpoint directories escaping the state dir are refused", "[integration][security]") {
  auto dir = MakeDir("ckpt-escape");
  const JobConfig job = TinyJob(dir->File("train.bin"), 2);
  auto eps = EpsDaemon::Start(job, DaemonOptions{}, *dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  EpsDaemon& d = **eps;
  fs::create_directories(dir->File("outside"));
  fs::create_directory_symlink(dir->File("outside"), d.state_dir() + "/link");
  for (const std::string& bad :
       std::vector<std::string>{"../escape", "ckpts/../../escape", "link/ckpt", dir->File("abs-ckpt")}) {
    const Run r = Exec(*dir, "l2lctl", {"--eps", d.address(), "checkpoint", "--dir", bad});
    INFO(bad << ": " << r.out << r.err);
    CHECK(r.code == 1);
    CHECK(Has(r.err, "state dir"));
  }
  CHECK(!fs::exists(dir->File("escape")));
  CHECK(!fs::exists(dir->File("abs-ckpt")));
  CHECK(fs::is_empty(dir->File("outside")));
  // Inside is fine.
  const Run ok = Exec(*dir, "l2lctl", {"--eps", d.address(), "checkpoint", "--dir", "ckpts/inside"});
  INFO(ok.err);
  CHECK(ok.code == 0);
  CHECK(fs::is_directory(d.state_dir() + "/ckpts/inside"));
  REQUIRE(d.Shutdown().ok());
}

TEST_CASE("Shared-memory segments (weights and a worker's gradients) are mode 0600", "[integration][security]") {
  auto dir = MakeDir("shm");
  const JobConfig job = TinyJob(dir->File("train.bin"), 2);
  DaemonOptions o;
  o.workers = 2;  // one worker registers and then waits for the second: its segment stays
  auto eps = EpsDaemon::Start(job, o, *dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  EpsDaemon& d = **eps;
  auto w = StartWorker(d.address(), "shm", dir->File("w.log"), {"--transport", "shm"});
  REQUIRE(w.ok());
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  size_t registered = 0;
  while (registered == 0 && std::chrono::steady_clock::now() < deadline) {
    auto st = d.GetStatus();
    REQUIRE(st.ok());
    registered = st->workers.size();
    if (registered == 0) std::this_thread::sleep_for(50ms);
  }
  INFO((*w)->LogTail());
  REQUIRE(registered == 1);
  const std::vector<std::string> segs = d.ShmSegments();
  bool weights = false, grads = false;
  for (const std::string& name : segs) {
    struct stat st {};
    REQUIRE(stat(("/dev/shm/" + name).c_str(), &st) == 0);
    INFO(name);
    CHECK((st.st_mode & 0777) == 0600);
    weights |= name.find("-g") == std::string::npos;
    grads |= name.find("-g0") != std::string::npos;
  }
  INFO("segments: " << segs.size());
  CHECK(weights);
  CHECK(grads);
  (*w)->Signal(SIGKILL);
  (*w)->Wait(10s).status().IgnoreError();
  REQUIRE(d.Shutdown().ok());
}

namespace {

// A self-signed certificate whose only name is DNS:`dns_name` (no IP SAN, so a client
// dialling 127.0.0.1 cannot verify it without --tls-server-name).
std::pair<std::string, std::string> MakeNamedCert(const TempDir& dir, const std::string& dns_name) {
  const std::string cert = dir.File(dns_name + "-cert.pem"), key = dir.File(dns_name + "-key.pem");
  const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                          "-subj /CN=" + dns_name + " -addext 'subjectAltName=DNS:" + dns_name + "' -keyout '" +
                          key + "' -out '" + cert + "' >'" + dir.File(dns_name + "-openssl.log") + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  INFO("openssl (scripts/setup.sh installs it) failed: " << Slurp(dir.File(dns_name + "-openssl.log")));
  REQUIRE(rc == 0);
  fs::permissions(key, k600, fs::perm_options::replace);
  return {cert, key};
}

}  // namespace

TEST_CASE("TLS: --tls-server-name verifies a certificate that names another host than the one dialled",
          "[integration][security]") {
  auto dir = MakeDir("tls-name");
  const auto [cert, key] = MakeNamedCert(*dir, "eps.test");
  const JobConfig job = TinyJob(dir->File("train.bin"), 2);
  DaemonOptions o;
  o.transport = l2l::Transport::kGrpc;  // the worker's layers and gradients go over the TLS channel too
  o.extra_args = {"--tls-cert", cert, "--tls-key", key};
  auto eps = EpsDaemon::Start(job, o, *dir);
  INFO(eps.status().ToString());
  REQUIRE(eps.ok());
  EpsDaemon& d = **eps;
  const std::string addr = d.address();  // 127.0.0.1:PORT: not a name of the certificate

  // The right CA but no override: the name check fails (exit 2), with a hint.
  const Run no_name = Exec(*dir, "l2lctl", {"--eps", addr, "--connect-timeout-ms", "700", "--tls-ca", cert, "status"});
  INFO(no_name.out << no_name.err);
  CHECK(no_name.code == 2);
  CHECK(Has(no_name.err, "--tls-server-name"));
  // The name the certificate holds: it works.
  const Run ok = Exec(*dir, "l2lctl",
                      {"--eps", addr, "--tls-ca", cert, "--tls-server-name", "eps.test", "status", "--json"});
  INFO(ok.out << ok.err);
  CHECK(ok.code == 0);
  CHECK(Has(ok.out, "\"job_id\":\"" + d.job_id() + "\""));
  // Another name: verification fails again.
  const Run wrong = Exec(*dir, "l2lctl", {"--eps", addr, "--connect-timeout-ms", "700", "--tls-ca", cert,
                                          "--tls-server-name", "other.test", "status"});
  INFO(wrong.out << wrong.err);
  CHECK(wrong.code == 2);
  CHECK(Has(wrong.err, "--tls-server-name other.test"));
  // Without --tls-ca it is a usage error, before any connection.
  const Run no_ca = Exec(*dir, "l2lctl", {"--eps", addr, "--tls-server-name", "eps.test", "status"});
  INFO(no_ca.out << no_ca.err);
  CHECK(no_ca.code == 64);
  CHECK(Has(no_ca.err, "--tls-server-name eps.test needs --tls-ca"));

  // l2l-worker: refused without --tls-ca; unverifiable without the name; trains with it.
  auto w_no_ca = StartWorker(addr, "name-no-ca", dir->File("w0.log"), {"--tls-server-name", "eps.test"});
  REQUIRE(w_no_ca.ok());
  auto c0 = (*w_no_ca)->Wait(30s);
  REQUIRE(c0.ok());
  INFO((*w_no_ca)->Log());
  CHECK(*c0 == 1);
  CHECK(Has((*w_no_ca)->Log(), "--tls-server-name eps.test needs --tls-ca"));
  auto w_no_name =
      StartWorker(addr, "no-name", dir->File("w1.log"), {"--tls-ca", cert, "--connect-timeout-ms", "1500"});
  REQUIRE(w_no_name.ok());
  auto c1 = (*w_no_name)->Wait(30s);
  REQUIRE(c1.ok());
  INFO((*w_no_name)->Log());
  CHECK(*c1 == 2);
  auto w = StartWorker(addr, "named", dir->File("w2.log"), {"--tls-ca", cert, "--tls-server-name", "eps.test"});
  REQUIRE(w.ok());
  auto c = (*w)->Wait(60s);
  REQUIRE(c.ok());
  INFO((*w)->LogTail());
  CHECK(*c == 0);
  CHECK(ParseSummary((*w)->Log()).at("steps") == 2);
  StopDaemon(d);
}

}  // namespace l2l::itest
