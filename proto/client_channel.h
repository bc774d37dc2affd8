// Client channels to l2l-eps, shared by l2lctl (ctl/ctl_client.cc) and l2l-worker
// (worker/eps_client_grpc.cc): plain or TLS credentials (with this client's own
// certificate for a daemon that requires one: mutual TLS), and the shared token sent as
// "authorization: Bearer <token>" on every call (eps_server/server_security.h checks
// both).
// Lives in proto/ because both clients depend on it and on gRPC; common/ has no gRPC.
//
// Thread-safety: a free function; the channel it returns is thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace l2l {

// tls_ca_pem "" = plaintext; otherwise the PEM CA the server's certificate must chain to.
// token "" = no authorization metadata.
// tls_server_name "" = the certificate must name the host of `address`; otherwise the
// name it must hold instead (gRPC's "grpc.ssl_target_name_override"), for a daemon dialled
// by IP or another alias than its certificate names. Only meaningful with TLS: callers
// reject it without a CA (l2lctl / l2l-worker --tls-server-name without --tls-ca); here it
// is ignored for plaintext.
// tls_cert_pem / tls_key_pem "" = no client certificate; otherwise the PEM certificate
// chain and private key this client presents to a daemon started with --tls-client-ca.
// Only meaningful with TLS (callers reject them without a CA: --tls-cert needs --tls-ca).
std::shared_ptr<grpc::Channel> MakeEpsChannel(const std::string& address, const std::string& tls_ca_pem,
                                              const std::string& token, const grpc::ChannelArguments& args,
                                              const std::string& tls_server_name = {},
                                              const std::string& tls_cert_pem = {},
                                              const std::string& tls_key_pem = {});

// A clause (starting "; if") to add to a "cannot reach the daemon" error of a TLS
// client: a daemon that requires client certificates (l2l-eps --tls-client-ca) ends the
// TLS handshake of a client without one, or with one its CA did not sign, and the client
// sees only an unreachable daemon. "" for plaintext (tls false).
std::string ClientCertificateHint(bool tls, bool has_client_cert);

}  // namespace l2l
