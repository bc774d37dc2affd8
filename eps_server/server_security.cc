// Exposure checks, TLS and the bearer-token processor of the gRPC port. See
// server_security.h.
#include "eps_server/server_security.h"

#include <grpc/grpc_security.h>
#include <grpcpp/security/server_credentials.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <utility>

#include "common/auth_token.h"
#include "common/logging.h"

namespace l2l::eps {
namespace {

// The standard health service stays open for probes (see server_security.h).
constexpr std::string_view kOpenPrefix = "/grpc.health.v1.Health/";

std::string_view View(const grpc_slice& s) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)), GRPC_SLICE_LENGTH(s)};
}

// State of the gRPC-core auth metadata processor: the token and a rate limit for the
// "rejected" log line (a scanner must not flood the log).
struct TokenChecker {
  std::string token;
  std::atomic<int64_t> rejected{0};
  std::atomic<int64_t> last_log_ms{-1000000};
};

void ProcessAuthMetadata(void* state, grpc_auth_context*, const grpc_metadata* md, size_t num_md,
                         grpc_process_auth_metadata_done_cb cb, void* user_data) {
  auto* checker = static_cast<TokenChecker*>(state);
  std::string_view path, auth;
  bool has_auth = false;
  for (size_t i = 0; i < num_md; ++i) {
    const std::string_view key = View(md[i].key);
    if (key == ":path") path = View(md[i].value);
    if (key == "authorization" && !has_auth) {
      auth = View(md[i].value);
      has_auth = true;
    }
  }
  if (path.substr(0, kOpenPrefix.size()) == kOpenPrefix || (has_auth && BearerMatches(auth, checker->token))) {
    cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
    return;
  }
  const char* why =
      !has_auth
          ? "no 'authorization: Bearer <token>' metadata, and this l2l-eps requires its token "
            "(l2lctl, l2l-worker: --token-file; grpcurl: -H 'authorization: Bearer ...')"
          : "the bearer token does not match this l2l-eps's token (its --token-file)";
  const int64_t n = checker->rejected.fetch_add(1) + 1;
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now().time_since_epoch()).count();
  int64_t last = checker->last_log_ms.load();
  if (now_ms - last >= 10000 && checker->last_log_ms.compare_exchange_strong(last, now_ms)) {
    L2L_LOG_WARN("rejected rpc {}: {} token ({} rejected so far; logged at most every 10 s)",
                 std::string(path), has_auth ? "wrong" : "no", n);
  }
  cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, why);
}

void DestroyChecker(void* state) { delete static_cast<TokenChecker*>(state); }

// Listening-port credentials built with gRPC's C API so the token processor can sit on
// plaintext ports too. ServerBuilder calls AddPortToServer once per port at
// BuildAndStart; the core keeps its own reference to the C credentials (and so to the
// processor state) for as long as the server lives.
class TokenServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit TokenServerCredentials(ServerSecurity s) : s_(std::move(s)) {}

  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    L2L_CHECK(false) << "TokenServerCredentials installs its own processor";
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    grpc_server_credentials* c = nullptr;
    if (s_.tls()) {
      grpc_ssl_pem_key_cert_pair pair{s_.tls_key_pem.c_str(), s_.tls_cert_pem.c_str()};
      c = s_.mutual_tls()
              ? grpc_ssl_server_credentials_create_ex(s_.tls_client_ca_pem.c_str(), &pair, 1,
                                                      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
                                                      nullptr)
              : grpc_ssl_server_credentials_create_ex(nullptr, &pair, 1, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
                                                      nullptr);
    } else {
      c = grpc_insecure_server_credentials_create();
    }
    if (c == nullptr) return 0;
    grpc_server_credentials_set_auth_metadata_processor(
        c, grpc_auth_metadata_processor{ProcessAuthMetadata, DestroyChecker, new TokenChecker{s_.token}});
    const int port = grpc_server_add_http2_port(server, addr.c_str(), c);
    grpc_server_credentials_release(c);
    return port;
  }

  const ServerSecurity s_;
};

// True when every client of `api` must prove who it is: the token (both APIs) or a
// client certificate (gRPC only).
bool Authenticated(ExposedApi api, const ServerSecurity& s) {
  return s.has_token() || (api == ExposedApi::kGrpc && s.mutual_tls());
}

std::string WaysOut(ExposedApi api) {
  if (api == ExposedApi::kGrpc) {
    return "Add client authentication: --token-file FILE (clients send 'authorization: Bearer <token>'; config "
           "auth.token_file; use it with --tls-cert FILE --tls-key FILE so the token is not sent in clear text), "
           "or --tls-client-ca CA.pem with --tls-cert FILE --tls-key FILE (mutual TLS: clients present a "
           "certificate signed by CA.pem with their --tls-cert/--tls-key; config tls.client_ca), or, on a "
           "trusted network only, --insecure (accept unauthenticated access; config insecure: true)";
  }
  return "The metrics endpoint has no TLS. Choose one: --token-file FILE (scrapers send "
         "'Authorization: Bearer <token>'; config auth.token_file) or --insecure (unauthenticated, trusted "
         "networks only; config insecure: true)";
}

}  // namespace

Result<ServerSecurity> LoadServerSecurity(const EpsConfig& cfg) {
  ServerSecurity s;
  s.insecure = cfg.insecure;
  if (cfg.tls_cert.empty() != cfg.tls_key.empty()) {
    return InvalidArgument("--tls-cert and --tls-key must be given together (got only " +
                           std::string(cfg.tls_cert.empty() ? "--tls-key" : "--tls-cert") + ")");
  }
  if (!cfg.tls_client_ca.empty() && cfg.tls_cert.empty()) {
    return InvalidArgument("--tls-client-ca (tls.client_ca) needs --tls-cert and --tls-key: client certificates "
                           "are only asked for over TLS");
  }
  if (!cfg.tls_cert.empty()) {
    L2L_ASSIGN_OR_RETURN(s.tls_cert_pem, ReadPemFile(cfg.tls_cert, "--tls-cert (tls.cert)", false));
    L2L_ASSIGN_OR_RETURN(s.tls_key_pem, ReadPemFile(cfg.tls_key, "--tls-key (tls.key)", true));
  }
  if (!cfg.tls_client_ca.empty()) {
    L2L_ASSIGN_OR_RETURN(s.tls_client_ca_pem, ReadPemFile(cfg.tls_client_ca, "--tls-client-ca (tls.client_ca)", false));
  }
  if (!cfg.auth_token_file.empty()) {
    L2L_ASSIGN_OR_RETURN(s.token, ReadTokenFile(cfg.auth_token_file));
  }
  return s;
}

bool IsLoopbackListen(const std::string& listen) {
  return listen.rfind("127.", 0) == 0 || listen.rfind("localhost:", 0) == 0 || listen.rfind("[::1]:", 0) == 0;
}

Status CheckExposure(ExposedApi api, const std::string& listen, const ServerSecurity& s) {
  if (IsLoopbackListen(listen) || s.insecure || Authenticated(api, s)) return Status::Ok();
  const std::string what = api == ExposedApi::kGrpc ? "listen address " : "metrics address ";
  std::string risk;
  if (api == ExposedApi::kMetrics) {
    risk = "no token protects the metrics endpoint";
  } else if (s.tls()) {
    risk = "TLS alone (--tls-cert/--tls-key without --tls-client-ca or --token-file) encrypts the connection but "
           "authenticates no client: anyone who reaches it could stop the job, read the weights or push "
           "gradients";
  } else {
    risk = "no client authentication protects the Control and Data APIs (anyone who reaches it could stop the "
           "job, read the weights or push gradients)";
  }
  return PermissionDenied("refusing to start: " + what + listen + " is not loopback and " + risk + ". " +
                          WaysOut(api) + ".");
}

std::string ExposureWarning(ExposedApi api, const std::string& listen, const ServerSecurity& s) {
  if (IsLoopbackListen(listen)) return "";
  const char* name = api == ExposedApi::kGrpc ? "the gRPC APIs" : "the metrics endpoint";
  if (!Authenticated(api, s)) {
    return std::string("INSECURE (--insecure): ") + name + " on " + listen +
           " accept anyone who can reach them, without a token or a client certificate" +
           (api == ExposedApi::kGrpc && s.tls() ? " (TLS encrypts but authenticates no client)" : "");
  }
  if (s.has_token() && !(api == ExposedApi::kGrpc && s.tls())) {
    return std::string(name) + " on " + listen +
           " check a token but carry it in clear text; use TLS (--tls-cert/--tls-key) on untrusted networks";
  }
  return "";
}

Status CheckStartupExposure(const std::string& listen, const std::string& metrics_listen, const ServerSecurity& s) {
  L2L_RETURN_IF_ERROR(CheckExposure(ExposedApi::kGrpc, listen, s));
  if (!metrics_listen.empty()) L2L_RETURN_IF_ERROR(CheckExposure(ExposedApi::kMetrics, metrics_listen, s));
  for (const auto& [api, addr] : {std::pair{ExposedApi::kGrpc, listen}, std::pair{ExposedApi::kMetrics, metrics_listen}}) {
    if (addr.empty()) continue;
    const std::string w = ExposureWarning(api, addr, s);
    if (w.rfind("INSECURE", 0) == 0) {
      std::fprintf(stderr, "l2l-eps: WARNING: %s\n", w.c_str());
    } else if (!w.empty()) {
      L2L_LOG_WARN("{}", w);
    }
  }
  return Status::Ok();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerSecurity& s) {
  if (s.has_token()) return std::make_shared<TokenServerCredentials>(s);
  if (s.tls()) {
    grpc::SslServerCredentialsOptions o(s.mutual_tls() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                       : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    o.pem_root_certs = s.tls_client_ca_pem;
    o.pem_key_cert_pairs.push_back({s.tls_key_pem, s.tls_cert_pem});
    return grpc::SslServerCredentials(o);
  }
  return grpc::InsecureServerCredentials();
}

}  // namespace l2l::eps
