// A gRPC server hosting the services of one port (see hosting.hpp).

#include "hosting.hpp"

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>

#include <grpcpp/security/server_credentials.h>

#include <doorman/net/tls.hpp>

#include "pem.hpp"

namespace doorman::grpc_door {

namespace {

std::shared_ptr<grpc::ServerCredentials> credentials_of(const net::tls_options& tls) {
  if (!tls.active()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o;
  o.pem_key_cert_pairs.push_back(
      {read_pem(tls.key_file, "grpc tls key"), read_pem(tls.cert_file, "grpc tls certificate")});
  if (!tls.ca_file.empty()) o.pem_root_certs = read_pem(tls.ca_file, "grpc tls ca");
  switch (tls.client_auth) {
    case net::client_auth::none:
      o.client_certificate_request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
      break;
    case net::client_auth::request:
      o.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
      break;
    case net::client_auth::require:
      o.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
      break;
  }
  return grpc::SslServerCredentials(o);
}

#ifdef DOORMAN_TLS
// The identity in a certificate's PEM text (empty when it does not parse).
std::string identity_in(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return {};
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) return {};
  std::string id = net::detail::identity_of(cert);
  X509_free(cert);
  return id;
}

// The identities of the certificates seen lately, by their whole PEM text: gRPC hands each call
// the peer's certificate as text, and parsing it per call took a call over mutual TLS to 8.5
// times the gRPC floor's CPU (docs/security.md), while every call on a connection carries the
// same one. An identity is a function of the certificate alone (gRPC verified it at
// the handshake), so the text is the key. At most `most` of them: full, it starts again.
class identity_cache {
 public:
  std::string get(const std::string& pem) {
    {
      const std::lock_guard lock(mutex_);
      if (const auto it = ids_.find(pem); it != ids_.end()) return it->second;
    }
    std::string id = identity_in(pem);
    const std::lock_guard lock(mutex_);
    if (ids_.size() >= most) ids_.clear();
    ids_.emplace(pem, id);
    return id;
  }

 private:
  static constexpr std::size_t most = 4096;
  std::mutex mutex_;
  std::unordered_map<std::string, std::string> ids_;
};
#endif

// The identity of the peer's verified certificate, by the rules of the node's other ports.
std::string identity_of(const grpc::CallbackServerContext& ctx) {
#ifdef DOORMAN_TLS
  static identity_cache cache;
  const auto auth = ctx.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return {};
  const auto pems = auth->FindPropertyValues("x509_pem_cert");
  if (pems.empty()) return {};
  return cache.get(std::string(pems.front().data(), pems.front().size()));
#else
  (void)ctx;
  return {};
#endif
}

}  // namespace

caller caller_of(const grpc::CallbackServerContext& ctx) {
  const auto auth = ctx.auth_context();
  return {ctx.peer(), identity_of(ctx), auth && auth->IsPeerAuthenticated()};
}

hosting::built hosting::build(const std::string& address,
                              const std::shared_ptr<grpc::ServerCredentials>& creds, int& bound) {
  built b{nullptr, make_()};
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, creds, &bound);
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 1);  // a reload binds beside the old one
  for (const auto& service : b.served)
    builder.RegisterService(service.get());
  b.server = builder.BuildAndStart();
  if (!b.server || bound == 0) return {};
  return b;
}

void hosting::start() {
  auto b = build(options_.listen, credentials_of(options_.tls), port_);
  if (!b.server) throw std::runtime_error("grpc: cannot listen on " + options_.listen);
  current_ = std::move(b);
}

bool hosting::reload_tls(std::chrono::milliseconds grace) {
  if (!current_.server || !options_.tls.active()) return false;
#ifdef DOORMAN_TLS
  // Checked as the node's other ports check them: a file that does not load is named.
  (void)net::tls_context(net::tls_side::server, options_.tls, "grpc tls");
#endif
  const auto creds = credentials_of(options_.tls);
  const auto host = options_.listen.substr(0, options_.listen.rfind(':'));
  int bound = 0;
  auto b = build(host + ":" + std::to_string(port_), creds, bound);
  if (!b.server)
    throw std::runtime_error("grpc: cannot listen again on port " + std::to_string(port_));
  std::swap(current_, b);
  retire(std::move(b), grace);
  return true;
}

void hosting::retire(built old, std::chrono::milliseconds grace) {
  if (retiring_.joinable()) retiring_.join();
  retiring_ = std::thread([old = std::move(old), grace]() mutable {
    old.server->Shutdown(std::chrono::system_clock::now() + grace);
    old.server.reset();
    old.served.clear();
  });
}

void hosting::stop(std::chrono::milliseconds grace) {
  if (retiring_.joinable()) retiring_.join();
  if (!current_.server) return;
  current_.server->Shutdown(std::chrono::system_clock::now() + grace);
  current_.server.reset();
  current_.served.clear();
}

server_base::server_base(std::unique_ptr<hosting> host) : host_(std::move(host)) {}

server_base::~server_base() {
  stop();
}

void server_base::start() {
  host_->start();
}

int server_base::port() const noexcept {
  return host_->port();
}

bool server_base::reload_tls(std::chrono::milliseconds grace) {
  return host_->reload_tls(grace);
}

void server_base::stop(std::chrono::milliseconds grace) {
  host_->stop(grace);
}

}  // namespace doorman::grpc_door
