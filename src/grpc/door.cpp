// Doorman's gRPC service as a door of a node (see door.hpp).

#include "door.hpp"

#include <chrono>
#include <stdexcept>
#include <utility>

#include <grpcpp/grpcpp.h>

#include <doorman/net/tls.hpp>

#include "doorman.grpc.pb.h"
#include "hosting.hpp"
#include "mapping.hpp"

namespace doorman::grpc_door {

namespace {

// A refusal as gRPC says it: a request that breaks a bound names its field.
grpc::Status status_of(rpc_code code, const std::string& message,
                       std::string_view list = "resource",
                       const std::vector<std::size_t>& indices = {}) {
  switch (code) {
    case rpc_code::invalid_params:
      return {grpc::StatusCode::INVALID_ARGUMENT, proto_path(message, list, indices)};
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
    std::vector<std::size_t> kept;  // the proto's index of each id kept, for the errors
    release_request r = from_proto(*in, &kept);
    return serve<release_response>(
        ctx, out, "resource_id",
        [&](auto done) { h_.release_capacity(std::move(r), caller_of(*ctx), done); },
        std::move(kept));
  }

 private:
  // One call: `start` hands the request to the handler with the reply that writes the answer
  // into `out` (or refuses, naming the field of `list`) and finishes the call.
  template <class Answer, class Out, class Start>
  static grpc::ServerUnaryReactor* serve(grpc::CallbackServerContext* ctx, Out* out,
                                         std::string_view list, Start start,
                                         std::vector<std::size_t> indices = {}) {
    auto* reactor = ctx->DefaultReactor();
    start(reply<Answer>([reactor, out, list, indices = std::move(indices)](call_result<Answer> r) {
      if (!r) return reactor->Finish(status_of(r.code(), r.message(), list, indices));
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

}  // namespace

server::server(server_options options, handler& h)
    : server_base(std::make_unique<hosting>(std::move(options),
                                            [&h] { return std::make_unique<service>(h); })) {}

}  // namespace doorman::grpc_door
