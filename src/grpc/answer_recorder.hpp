#pragma once

/// \file
/// What a service answered the calls of a grpc++ channel, recorded on a doorman resource for a
/// capacity the root learns (docs/learned-capacity.md). Part of the gRPC layer
/// (`doorman::grpc`); header-only over grpc++'s client interceptors.
///
///     doorman::rate_resource provider(client, "model-provider");
///     std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> f;
///     f.push_back(std::make_unique<doorman::grpc_answer_recorder>(provider));
///     auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
///         "provider:50051", grpc::InsecureChannelCredentials(), {}, std::move(f));
///     // each call: provider.wait() first; its status is recorded when it ends
///
/// It records and never waits: a call may start on any thread (an asynchronous or callback
/// call on one that must not block), so waiting for a permit stays with the caller.

#include <grpcpp/support/client_interceptor.h>
#include <grpcpp/support/interceptor.h>
#include <grpcpp/support/status.h>

#include <chrono>
#include <functional>
#include <optional>
#include <stdexcept>
#include <utility>

#include "doorman/core/time.hpp"

namespace doorman {

/// Whether a gRPC status says the service is overloaded: `RESOURCE_EXHAUSTED` or
/// `UNAVAILABLE`.
[[nodiscard]] inline bool grpc_overloaded(grpc::StatusCode code) noexcept {
  return code == grpc::StatusCode::RESOURCE_EXHAUSTED || code == grpc::StatusCode::UNAVAILABLE;
}

/// A client interceptor factory for `grpc::experimental::CreateCustomChannelWithInterceptors`:
/// every call of the channel, when it ends, is recorded on the resource (`record_answer`),
/// overloaded when `grpc_overloaded` says so or, with `latency_target`, when it ended more
/// than that after it started. A call its caller cancelled is not recorded (the service did
/// not answer it). The resource must outlive the channel.
class grpc_answer_recorder final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  /// `resource`: any doorman resource handle (`record_answer(bool)`). Throws
  /// `std::invalid_argument` on a latency target that is not a number of seconds above 0.
  template <class Handle>
  requires requires(Handle& h) { h.record_answer(true); }
  explicit grpc_answer_recorder(Handle& resource, std::optional<seconds> latency_target = {})
      : record_([&resource](bool overloaded) { resource.record_answer(overloaded); }),
        latency_target_(latency_target) {
    if (latency_target && !(latency_target->count() > 0 && latency_target->count() < 1e15)) {
      throw std::invalid_argument("latency_target: must be a number of seconds above 0");
    }
  }

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new call(*this);  // grpc++ deletes it when the call ends
  }

 private:
  class call final : public grpc::experimental::Interceptor {
   public:
    explicit call(const grpc_answer_recorder& r) : r_(r) {}

    void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
      using hook = grpc::experimental::InterceptionHookPoints;
      if (methods->QueryInterceptionHookPoint(hook::PRE_SEND_INITIAL_METADATA)) {
        started_ = std::chrono::steady_clock::now();
      }
      if (methods->QueryInterceptionHookPoint(hook::POST_RECV_STATUS)) {
        const grpc::Status* status = methods->GetRecvStatus();
        if (status != nullptr && status->error_code() != grpc::StatusCode::CANCELLED) {
          r_.record_(grpc_overloaded(status->error_code()) || late());
        }
      }
      methods->Proceed();
    }

   private:
    [[nodiscard]] bool late() const {
      return r_.latency_target_ && started_ &&
             std::chrono::steady_clock::now() - *started_ > *r_.latency_target_;
    }

    const grpc_answer_recorder& r_;
    std::optional<std::chrono::steady_clock::time_point> started_;
  };

  std::function<void(bool)> record_;
  std::optional<seconds> latency_target_;
};

}  // namespace doorman
