// ServerSecurity: how l2l-eps protects its sockets (docs/operations.md "Security").
//
//  * Loopback by default. A non-loopback gRPC address needs client authentication: a
//    shared token (auth.token_file), or mutual TLS (tls.cert + tls.key + tls.client_ca).
//    TLS alone (a server certificate, no client CA) encrypts but authenticates nobody, so
//    it does not count: beyond loopback it is refused like no protection at all. A
//    non-loopback metrics address needs the token (it has no TLS). Without these the
//    daemon refuses to start unless `insecure` is set (CheckExposure, called by l2l-eps
//    before it binds anything, and again by the servers' Start); the refusal names what
//    to add (--token-file or --tls-client-ca).
//  * TLS: the gRPC port (Control and Data services, health, reflection) speaks TLS with
//    the given certificate chain and key; clients verify it with their CA (--tls-ca).
//  * Mutual TLS: with tls.client_ca the TLS handshake requires a client certificate
//    and verifies it against that CA (GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_
//    AND_VERIFY); a client without one, or with one another CA signed, gets no
//    connection at all (health included). Clients present theirs with --tls-cert and
//    --tls-key. Any certificate the CA signed is accepted: the CA is the access list.
//  * Token: every gRPC call must carry metadata "authorization: Bearer <token>", else it
//    ends with UNAUTHENTICATED before any handler runs. Exception: the standard
//    grpc.health.v1.Health service stays open for load-balancer / systemd probes (it
//    reveals only SERVING / NOT_SERVING). Reflection needs the token. The metrics HTTP
//    endpoint asks for the same header (401 otherwise). Token and mutual TLS combine
//    (both are then required).
//  * Loopback without a token: any local user of the host can connect (a loopback port
//    is not per-user); --token-file works on loopback too.
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
  std::string tls_client_ca_pem;  // PEM CA(s) client certificates must chain to; "" = none asked
  std::string token;         // "" = no token required
  bool insecure = false;     // non-loopback without client authentication is accepted (with a warning)

  bool tls() const { return !tls_cert_pem.empty(); }
  bool mutual_tls() const { return tls() && !tls_client_ca_pem.empty(); }
  bool has_token() const { return !token.empty(); }
};

// Reads cfg.tls_cert / cfg.tls_key (PEM; the key must not be readable by others),
// cfg.tls_client_ca (PEM; needs tls_cert) and cfg.auth_token_file (common/auth_token.h:
// mode 0600, not empty). Errors name the file.
Result<ServerSecurity> LoadServerSecurity(const EpsConfig& cfg);

// "127.x.y.z:P", "localhost:P", "[::1]:P". Anything else (0.0.0.0, a host name, an
// interface address) counts as beyond this host.
bool IsLoopbackListen(const std::string& listen);

// Which API a check is about: the gRPC port can use TLS; the metrics endpoint cannot.
enum class ExposedApi { kGrpc, kMetrics };

// OK for a loopback address, or when the API's clients must authenticate (a token for
// both; mutual TLS for gRPC), or when `s.insecure`. Otherwise PermissionDenied naming the
// address and what to add (--token-file, --tls-client-ca with --tls-cert/--tls-key, or
// --insecure); TLS without a client CA is refused with a message saying it authenticates
// no client.
Status CheckExposure(ExposedApi api, const std::string& listen, const ServerSecurity& s);

// A warning to log at start-up for an exposed address ("" when there is nothing to warn
// about): unauthenticated access under --insecure (also with TLS but no client CA), or a
// token sent in clear text.
std::string ExposureWarning(ExposedApi api, const std::string& listen, const ServerSecurity& s);

// l2l-eps's start-up check, before it binds anything: CheckExposure for the gRPC address
// and (when not empty) the metrics address, then the ExposureWarnings (an --insecure
// exposure goes to stderr whatever the log level, others to the log).
Status CheckStartupExposure(const std::string& listen, const std::string& metrics_listen, const ServerSecurity& s);

// The listening port's credentials: plaintext or TLS (requiring and verifying client
// certificates when a client CA is set), with the token check when a token is set.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerSecurity& s);

}  // namespace l2l::eps
