// Envoy's rate limit service as a gRPC door (see rls_door.hpp).

#include "rls_door.hpp"

#include <atomic>
#include <exception>
#include <memory>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "hosting.hpp"
#include "rls.grpc.pb.h"
#include "rls_mapping.hpp"

namespace doorman::rls {

namespace {

namespace pb = ::envoy::service::ratelimit::v3;

class service final : public pb::RateLimitService::CallbackService {
 public:
  service(handler& h, header_names headers) : h_(h), headers_(std::move(headers)) {}

  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* ctx,
                                            const pb::RateLimitRequest* in,
                                            pb::RateLimitResponse* out) override {
    auto* reactor = ctx->DefaultReactor();
    check_request r;
    if (auto e = from_proto(*in, r)) {
      reactor->Finish({grpc::StatusCode::INVALID_ARGUMENT, e->message});
      return reactor;
    }
    auto once = std::make_shared<std::atomic_flag>();
    try {
      // Finished once: a handler that throws after answering does not answer twice.
      h_.check(r, [reactor, out, once, headers = &headers_](check_outcome o) {
        if (once->test_and_set()) return;
        if (o.unavailable) {
          reactor->Finish({grpc::StatusCode::UNAVAILABLE, *o.unavailable});
          return;
        }
        try {
          to_proto(o.statuses, *headers, *out);
        } catch (const std::exception& e) {
          reactor->Finish({grpc::StatusCode::INTERNAL, e.what()});
          return;
        }
        reactor->Finish(grpc::Status::OK);
      });
    } catch (const std::exception& e) {  // nothing may escape into gRPC's thread
      if (!once->test_and_set()) reactor->Finish({grpc::StatusCode::INTERNAL, e.what()});
    }
    return reactor;
  }

 private:
  handler& h_;
  header_names headers_;
};

}  // namespace

server::server(grpc_door::server_options options, handler& h, const header_names& headers)
    : grpc_door::server_base(
          std::make_unique<grpc_door::hosting>(std::move(options), [&h, headers] {
            grpc_door::hosting::services out;
            out.push_back(std::make_unique<service>(h, headers));
            return out;
          })) {}

}  // namespace doorman::rls
