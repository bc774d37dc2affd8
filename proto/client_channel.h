// Client channels to l2l-eps, shared by l2lctl (ctl/ctl_client.cc) and l2l-worker
// (worker/eps_client_grpc.cc): plain or TLS credentials, and the shared token sent as
// "authorization: Bearer <token>" on every call (eps_server/server_security.h checks it).
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
std::shared_ptr<grpc::Channel> MakeEpsChannel(const std::string& address, const std::string& tls_ca_pem,
                                              const std::string& token, const grpc::ChannelArguments& args,
                                              const std::string& tls_server_name = {});

}  // namespace l2l
