// Doorman's gRPC service as a door of a node (see door.hpp).

#include "door.hpp"

#include <chrono>
#include <stdexcept>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "doorman.grpc.pb.h"
#include "hosting.hpp"
#include "mapping.hpp"
#include "rlqs_door.hpp"

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

server::server(server_options options, handler& h, rlqs_options rlqs)
    : server_base(std::make_unique<hosting>(std::move(options), [&h, rlqs] {
        hosting::services out;
        out.push_back(std::make_unique<service>(h));
        if (rlqs.enabled) out.push_back(make_rlqs_service(h, rlqs));
        return out;
      })) {}

}  // namespace doorman::grpc_door
