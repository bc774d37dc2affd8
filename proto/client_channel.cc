// Client channels to l2l-eps. See client_channel.h.
#include "proto/client_channel.h"

#include <grpcpp/support/client_interceptor.h>

#include <vector>

namespace l2l {
namespace {

// Adds "authorization: Bearer <token>" to every call of the channel.
class BearerInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string& value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      m->GetSendInitialMetadata()->insert({"authorization", value_});
    }
    m->Proceed();
  }

 private:
  const std::string value_;
};

class BearerInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token) : value_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(value_);
  }

 private:
  const std::string value_;
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeEpsChannel(const std::string& address, const std::string& tls_ca_pem,
                                              const std::string& token, const grpc::ChannelArguments& args,
                                              const std::string& tls_server_name, const std::string& tls_cert_pem,
                                              const std::string& tls_key_pem) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments channel_args = args;
  if (!tls_ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls_ca_pem;
    // This client's certificate, for a daemon that requires one (mutual TLS).
    ssl.pem_cert_chain = tls_cert_pem;
    ssl.pem_private_key = tls_key_pem;
    creds = grpc::SslCredentials(ssl);
    // Verify the certificate against this name instead of the dialled host (also the SNI
    // name sent).
    if (!tls_server_name.empty()) channel_args.SetSslTargetNameOverride(tls_server_name);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!token.empty()) interceptors.push_back(std::make_unique<BearerInterceptorFactory>(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, channel_args,
                                                                 std::move(interceptors));
}

std::string ClientCertificateHint(bool tls, bool has_client_cert) {
  if (!tls) return "";
  if (!has_client_cert) {
    return "; if the daemon requires client certificates (l2l-eps --tls-client-ca), it refuses this client at the "
           "TLS handshake (authentication failed: no client certificate): pass --tls-cert FILE --tls-key FILE "
           "signed by that CA.";
  }
  return "; if the daemon requires client certificates (l2l-eps --tls-client-ca), authentication fails at the TLS "
         "handshake when --tls-cert is not signed by that CA (or has expired).";
}

}  // namespace l2l
