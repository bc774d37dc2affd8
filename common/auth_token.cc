// Bearer token and PEM file reading. See auth_token.h.
#include "common/auth_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "common/env.h"

namespace l2l {
namespace {

std::string Octal(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// Reads a whole regular file of at most max_bytes; *mode gets its permission bits.
Result<std::string> ReadSmallFile(const std::string& path, const std::string& what, size_t max_bytes,
                                  mode_t* mode) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open " + what, path, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return ErrnoError("fstat " + what, path, e);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return InvalidArgument(what + " " + path + " is not a regular file");
  }
  if (static_cast<size_t>(st.st_size) > max_bytes) {
    close(fd);
    return InvalidArgument(what + " " + path + " has " + std::to_string(st.st_size) + " bytes, more than the " +
                           std::to_string(max_bytes) + " expected");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      close(fd);
      return ErrnoError("read " + what, path, e);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  out.resize(got);
  *mode = st.st_mode;
  return out;
}

char Lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

Result<std::string> ReadTokenFile(const std::string& path) {
  if (path.empty()) return InvalidArgument("token file: empty path");
  mode_t mode = 0;
  L2L_ASSIGN_OR_RETURN(std::string token, ReadSmallFile(path, "token file", kMaxTokenBytes + 2, &mode));
  if ((mode & 077) != 0) {
    return PermissionDenied("token file " + path + " has mode " + Octal(mode) +
                            ": group or others may access it; run chmod 600 " + path);
  }
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' ||
                            token.back() == '\t')) {
    token.pop_back();
  }
  if (token.empty()) return InvalidArgument("token file " + path + " is empty; put the shared token in it");
  if (token.size() > kMaxTokenBytes) {
    return InvalidArgument("token file " + path + ": the token has " + std::to_string(token.size()) +
                           " bytes, more than " + std::to_string(kMaxTokenBytes));
  }
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x21 || c > 0x7e) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02x", c);
      return InvalidArgument("token file " + path + ": byte " + std::to_string(i) + " (" + hex +
                             ") is not printable ASCII; a token is one line of visible characters, e.g. "
                             "from `openssl rand -hex 32`");
    }
  }
  return token;
}

Result<std::string> ReadPemFile(const std::string& path, const std::string& what, bool private_key) {
  if (path.empty()) return InvalidArgument(what + ": empty path");
  mode_t mode = 0;
  L2L_ASSIGN_OR_RETURN(std::string pem, ReadSmallFile(path, what, size_t{1} << 20, &mode));
  if (private_key && (mode & 007) != 0) {
    return PermissionDenied(what + " " + path + " has mode " + Octal(mode) +
                            ": others may read the private key; run chmod 600 " + path);
  }
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return InvalidArgument(what + " " + path + " is not PEM (no '-----BEGIN ' line)");
  }
  return pem;
}

Result<ClientTlsFiles> ReadClientTlsFiles(const std::string& ca, const std::string& cert, const std::string& key) {
  if (cert.empty() != key.empty()) {
    return InvalidArgument(std::string(cert.empty() ? "--tls-key" : "--tls-cert") + " needs " +
                           (cert.empty() ? "--tls-cert" : "--tls-key") +
                           ": this client's certificate and its private key go together");
  }
  if (!cert.empty() && ca.empty()) {
    return InvalidArgument("--tls-cert/--tls-key need --tls-ca CA.pem: a client certificate is only presented "
                           "over TLS, and without --tls-ca the connection is plaintext");
  }
  ClientTlsFiles f;
  if (!ca.empty()) {
    L2L_ASSIGN_OR_RETURN(f.ca_pem, ReadPemFile(ca, "--tls-ca", /*private_key=*/false));
  }
  if (!cert.empty()) {
    L2L_ASSIGN_OR_RETURN(f.cert_pem, ReadPemFile(cert, "--tls-cert", /*private_key=*/false));
    L2L_ASSIGN_OR_RETURN(f.key_pem, ReadPemFile(key, "--tls-key", /*private_key=*/true));
  }
  return f;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited; no early exit on a mismatch.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool BearerMatches(std::string_view v, std::string_view token) {
  if (token.empty()) return false;
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\r')) v.remove_suffix(1);
  static constexpr std::string_view kScheme = "bearer";
  if (v.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (Lower(v[i]) != kScheme[i]) return false;
  }
  if (v[kScheme.size()] != ' ') return false;
  v.remove_prefix(kScheme.size() + 1);
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  return ConstantTimeEquals(v, token);
}

std::string TokenFileFromFlagOrEnv(const std::string& flag) {
  if (!flag.empty()) return flag;
  return EnvString(EnvVar::kTokenFile);
}

}  // namespace l2l
