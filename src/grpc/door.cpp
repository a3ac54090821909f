// Doorman's gRPC service as a door of a node (see door.hpp).

#include "door.hpp"

#include <chrono>
#include <stdexcept>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>

#include <doorman/net/tls.hpp>

#include "doorman.grpc.pb.h"
#include "mapping.hpp"
#include "pem.hpp"

namespace doorman::grpc_door {

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A refusal as gRPC says it: a request that breaks a bound names its field.
grpc::Status status_of(rpc_code code, const std::string& message,
                       std::string_view list = "resource") {
  switch (code) {
    case rpc_code::invalid_params:
      return {grpc::StatusCode::INVALID_ARGUMENT, proto_path(message, list)};
    case rpc_code::forbidden:
      return {grpc::StatusCode::PERMISSION_DENIED, message};
    default:
      return {grpc::StatusCode::INTERNAL, message};
  }
}

// The identity of the peer's verified certificate, by the rules of the node's other ports.
std::string identity_of(const grpc::CallbackServerContext& ctx) {
#ifdef DOORMAN_TLS
  const auto auth = ctx.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return {};
  const auto pems = auth->FindPropertyValues("x509_pem_cert");
  if (pems.empty()) return {};
  const std::string pem(pems.front().data(), pems.front().size());
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return {};
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (cert == nullptr) return {};
  std::string id = net::detail::identity_of(cert);
  X509_free(cert);
  return id;
#else
  (void)ctx;
  return {};
#endif
}

caller caller_of(const grpc::CallbackServerContext& ctx) {
  const auto auth = ctx.auth_context();
  return {ctx.peer(), identity_of(ctx), auth && auth->IsPeerAuthenticated()};
}

class service final : public ::doorman::Capacity::CallbackService {
 public:
  explicit service(handler& h) : h_(h) {}

  grpc::ServerUnaryReactor* Discovery(grpc::CallbackServerContext* ctx,
                                      const ::doorman::DiscoveryRequest*,
                                      ::doorman::DiscoveryResponse* out) override {
    return serve<discovery_response>(ctx, out, "resource",
                                     [&](auto done) { h_.discovery(caller_of(*ctx), done); });
  }

  grpc::ServerUnaryReactor* GetCapacity(grpc::CallbackServerContext* ctx,
                                        const ::doorman::GetCapacityRequest* in,
                                        ::doorman::GetCapacityResponse* out) override {
    return serve<capacity_response>(ctx, out, "resource", [&](auto done) {
      h_.get_capacity(from_proto(*in, unix_now()), caller_of(*ctx), done);
    });
  }

  grpc::ServerUnaryReactor* GetServerCapacity(grpc::CallbackServerContext* ctx,
                                              const ::doorman::GetServerCapacityRequest* in,
                                              ::doorman::GetServerCapacityResponse* out) override {
    return serve<server_capacity_response>(ctx, out, "resource", [&](auto done) {
      h_.get_server_capacity(from_proto(*in, unix_now()), caller_of(*ctx), done);
    });
  }

  grpc::ServerUnaryReactor* ReleaseCapacity(grpc::CallbackServerContext* ctx,
                                            const ::doorman::ReleaseCapacityRequest* in,
                                            ::doorman::ReleaseCapacityResponse* out) override {
    return serve<release_response>(ctx, out, "resource_id", [&](auto done) {
      h_.release_capacity(from_proto(*in), caller_of(*ctx), done);
    });
  }

 private:
  // One call: `start` hands the request to the handler with the reply that writes the answer
  // into `out` (or refuses, naming the field of `list`) and finishes the call.
  template <class Answer, class Out, class Start>
  static grpc::ServerUnaryReactor* serve(grpc::CallbackServerContext* ctx, Out* out,
                                         std::string_view list, Start start) {
    auto* reactor = ctx->DefaultReactor();
    start(reply<Answer>([reactor, out, list](call_result<Answer> r) {
      if (!r) return reactor->Finish(status_of(r.code(), r.message(), list));
      if constexpr (requires { to_proto(r.value(), 0.0, *out); }) {
        to_proto(r.value(), unix_now(), *out);  // leases: absolute on Doorman's wire
      } else {
        to_proto(r.value(), *out);
      }
      reactor->Finish(grpc::Status::OK);
    }));
    return reactor;
  }

 private:
  handler& h_;
};

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

}  // namespace

struct server::impl {
  server_options options;
  handler& h;
  std::unique_ptr<service> svc;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::thread retiring;  // shuts down the server a reload replaced

  impl(server_options o, handler& hh) : options(std::move(o)), h(hh) {}

  // A server with its own service on `address`, with `credentials`; null when it cannot bind.
  std::pair<std::unique_ptr<grpc::Server>, std::unique_ptr<service>> build(
      const std::string& address, const std::shared_ptr<grpc::ServerCredentials>& credentials,
      int& bound) {
    auto s = std::make_unique<service>(h);
    grpc::ServerBuilder b;
    b.AddListeningPort(address, credentials, &bound);
    b.SetMaxReceiveMessageSize(options.max_message_bytes);
    b.SetMaxSendMessageSize(options.max_message_bytes);
    b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
    b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 1);  // a reload binds beside the old server
    b.RegisterService(s.get());
    auto built = b.BuildAndStart();
    if (!built || bound == 0) return {};
    return {std::move(built), std::move(s)};
  }

  void retire(std::unique_ptr<grpc::Server> old, std::unique_ptr<service> old_svc,
              std::chrono::milliseconds grace) {
    if (retiring.joinable()) retiring.join();
    retiring = std::thread([old = std::move(old), old_svc = std::move(old_svc), grace]() mutable {
      old->Shutdown(std::chrono::system_clock::now() + grace);
      old.reset();
      old_svc.reset();
    });
  }
};

server::server(server_options options, handler& h)
    : impl_(std::make_unique<impl>(std::move(options), h)) {}

server::~server() {
  stop();
}

void server::start() {
  auto [s, svc] =
      impl_->build(impl_->options.listen, credentials_of(impl_->options.tls), impl_->port);
  if (!s) throw std::runtime_error("grpc: cannot listen on " + impl_->options.listen);
  impl_->server = std::move(s);
  impl_->svc = std::move(svc);
}

bool server::reload_tls(std::chrono::milliseconds grace) {
  if (!impl_->server || !impl_->options.tls.active()) return false;
#ifdef DOORMAN_TLS
  // Checked as the node's other ports check them: a file that does not load is named.
  (void)net::tls_context(net::tls_side::server, impl_->options.tls, "grpc tls");
#endif
  const auto credentials = credentials_of(impl_->options.tls);
  const auto host = impl_->options.listen.substr(0, impl_->options.listen.rfind(':'));
  int bound = 0;
  auto [s, svc] = impl_->build(host + ":" + std::to_string(impl_->port), credentials, bound);
  if (!s)
    throw std::runtime_error("grpc: cannot listen again on port " + std::to_string(impl_->port));
  std::swap(impl_->server, s);
  std::swap(impl_->svc, svc);
  impl_->retire(std::move(s), std::move(svc), grace);
  return true;
}

int server::port() const noexcept {
  return impl_->port;
}

void server::stop(std::chrono::milliseconds grace) {
  if (impl_->retiring.joinable()) impl_->retiring.join();
  if (!impl_->server) return;
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  impl_->server.reset();
  impl_->svc.reset();
}

}  // namespace doorman::grpc_door
