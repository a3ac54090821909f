// Envoy's rate limit service as a gRPC door (see rls_door.hpp).

#include "rls_door.hpp"

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
    to_proto(h_.check(r), headers_, *out);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  handler& h_;
  header_names headers_;
};

}  // namespace

struct server::impl {
  grpc_door::hosting host;

  impl(grpc_door::server_options o, handler& h, header_names headers)
      : host(std::move(o), [&h, headers] { return std::make_unique<service>(h, headers); }) {}
};

server::server(grpc_door::server_options options, handler& h, const header_names& headers)
    : impl_(std::make_unique<impl>(std::move(options), h, headers)) {}

server::~server() {
  stop();
}

void server::start() {
  impl_->host.start();
}

int server::port() const noexcept {
  return impl_->host.port();
}

bool server::reload_tls(std::chrono::milliseconds grace) {
  return impl_->host.reload_tls(grace);
}

void server::stop(std::chrono::milliseconds grace) {
  impl_->host.stop(grace);
}

}  // namespace doorman::rls
