// Secrets for the daemon's APIs, without gRPC: the shared bearer token (l2l-eps
// --token-file, l2lctl / l2l-worker --token-file or $L2L_TOKEN_FILE) and PEM files for
// TLS (server certificate and key, the CA a client trusts, a client's own certificate and
// key for a daemon that requires one: l2l-eps --tls-client-ca). The gRPC wiring lives in the
// adapters (eps_server/server_security.cc, ctl/ctl_client.cc,
// worker/eps_client_grpc.cc); the metrics HTTP server checks the same header.
//
//   L2L_ASSIGN_OR_RETURN(std::string token, ReadTokenFile(path));   // mode 0600 or refused
//   if (!BearerMatches(header_value, token)) ... 401 / UNAUTHENTICATED
//
// Clients send "authorization: Bearer <token>" (RFC 6750; the scheme is matched
// case-insensitively). Tokens are compared in constant time (for a given length).
//
// Thread-safety: free functions on values; ReadTokenFile/ReadPemFile read the file
// system.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace l2l {

inline constexpr size_t kMaxTokenBytes = 4096;

// Reads the shared token from `path`. Refused (PermissionDenied / InvalidArgument,
// naming the path): not a regular file; any permission bit for group or others
// ("chmod 600 PATH"); empty after stripping trailing whitespace (a final newline is
// normal); longer than kMaxTokenBytes; a character outside printable ASCII 0x21..0x7e
// (it travels in an HTTP/2 header).
Result<std::string> ReadTokenFile(const std::string& path);

// Reads a PEM file (`what` names it in errors: "--tls-cert"). Must contain a
// "-----BEGIN " block. private_key: refused when others (not only the group) may read
// it ("chmod 600 PATH").
Result<std::string> ReadPemFile(const std::string& path, const std::string& what, bool private_key);

// A client's TLS material (l2lctl, l2l-worker): ca_pem verifies the daemon ("" =
// plaintext); cert_pem + key_pem are presented to a daemon that requires client
// certificates (mutual TLS; "" = none).
struct ClientTlsFiles {
  std::string ca_pem, cert_pem, key_pem;
};

// Reads the clients' --tls-ca, --tls-cert and --tls-key (each "" = not given).
// Refused (InvalidArgument): --tls-cert without --tls-key or the reverse; either without
// --tls-ca (a client certificate only travels over TLS). The key as ReadPemFile's
// private_key (not readable by others).
Result<ClientTlsFiles> ReadClientTlsFiles(const std::string& ca, const std::string& cert, const std::string& key);

// a == b, taking time that depends only on the lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// True when `header_value` is "Bearer <token>" (scheme case-insensitive, surrounding
// spaces ignored) and <token> equals `token` (constant time). An empty `token` never
// matches.
bool BearerMatches(std::string_view header_value, std::string_view token);

// The client's token file: `flag` when set, else $L2L_TOKEN_FILE, else "" (no token).
std::string TokenFileFromFlagOrEnv(const std::string& flag);

}  // namespace l2l
