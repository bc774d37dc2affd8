// ServerSecurity: how l2l-eps protects its sockets (docs/operations.md "Security").
//
//  * Loopback by default. A non-loopback listen address (gRPC or metrics) needs TLS
//    (gRPC only: tls.cert + tls.key) or a shared token (auth.token_file); without either
//    the daemon refuses to start unless `insecure` is set (CheckExposure, called by
//    l2l-eps before it binds anything, and again by the servers' Start).
//  * TLS: the gRPC port (Control and Data services, health, reflection) speaks TLS with
//    the given certificate chain and key; clients verify it with their CA (--tls-ca).
//  * Token: every gRPC call must carry metadata "authorization: Bearer <token>", else it
//    ends with UNAUTHENTICATED before any handler runs. Exception: the standard
//    grpc.health.v1.Health service stays open for load-balancer / systemd probes (it
//    reveals only SERVING / NOT_SERVING). Reflection needs the token. The metrics HTTP
//    endpoint asks for the same header (401 otherwise).
//
// The token check is a gRPC-core auth metadata processor installed on the listening
// port's credentials (MakeServerCredentials): it works with TLS and with plaintext,
// which gRPC C++ 1.51's own InsecureServerCredentials()->SetAuthMetadataProcessor does
// not (it aborts), and unlike a C++ server interceptor it can end a call before the
// handler runs.
//
// Thread-safety: values and free functions; the credentials' processor is called by
// gRPC's threads concurrently and only reads the token.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "eps_server/eps_config.h"

namespace grpc {
class ServerCredentials;
}  // namespace grpc

namespace l2l::eps {

struct ServerSecurity {
  std::string tls_cert_pem;  // PEM certificate chain; with tls_key_pem: TLS on the gRPC port
  std::string tls_key_pem;   // PEM private key
  std::string token;         // "" = no token required
  bool insecure = false;     // non-loopback without TLS or token is accepted (with a warning)

  bool tls() const { return !tls_cert_pem.empty(); }
  bool has_token() const { return !token.empty(); }
};

// Reads cfg.tls_cert / cfg.tls_key (PEM; the key must not be readable by others) and
// cfg.auth_token_file (common/auth_token.h: mode 0600, not empty). Errors name the file.
Result<ServerSecurity> LoadServerSecurity(const EpsConfig& cfg);

// "127.x.y.z:P", "localhost:P", "[::1]:P". Anything else (0.0.0.0, a host name, an
// interface address) counts as beyond this host.
bool IsLoopbackListen(const std::string& listen);

// Which API a check is about: the gRPC port can use TLS; the metrics endpoint cannot.
enum class ExposedApi { kGrpc, kMetrics };

// OK for a loopback address, or when the API is protected (TLS for gRPC, a token for
// both), or when `s.insecure`. Otherwise PermissionDenied naming the address and the
// ways out (--tls-cert/--tls-key, --token-file, --insecure).
Status CheckExposure(ExposedApi api, const std::string& listen, const ServerSecurity& s);

// A warning to log at start-up for an exposed address ("" when there is nothing to warn
// about): unauthenticated access under --insecure, or a token sent in clear text.
std::string ExposureWarning(ExposedApi api, const std::string& listen, const ServerSecurity& s);

// l2l-eps's start-up check, before it binds anything: CheckExposure for the gRPC address
// and (when not empty) the metrics address, then the ExposureWarnings (an --insecure
// exposure goes to stderr whatever the log level, others to the log).
Status CheckStartupExposure(const std::string& listen, const std::string& metrics_listen, const ServerSecurity& s);

// The listening port's credentials: plaintext or TLS, with the token check when a token
// is set.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerSecurity& s);

}  // namespace l2l::eps
