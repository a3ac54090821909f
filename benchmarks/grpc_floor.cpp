// doorman_bench_grpc_floor: the least a gRPC server of doorman's per-request traffic can do, as
// the floor that doorman_bench_rls (and doorman_bench_load --grpc) compare the doors with
// (benchmarks/README.md).
//
//   doorman_bench_grpc_floor [--listen HOST:PORT] [--tls-cert FILE --tls-key FILE
//                            [--tls-ca FILE] [--tls-client-auth none|request|require]]
//
// Hosted as the doors are (src/grpc/hosting.hpp: the same gRPC, callback API, threads and
// limits; plaintext, or TLS with the node's flags), it answers Envoy's `ShouldRateLimit` and
// Doorman's `GetCapacity` on gRPC's thread, after gRPC parsed the request: OK for each descriptor,
// or each resource granted what it wants. No mapping, no decision, no hop to another thread. Says
// "gRPC floor listening on HOST:PORT" on stderr; stops on SIGTERM.

#include <fmt/format.h>

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>

#include <doorman/net/tls_options.hpp>

#include "arguments.hpp"
#include "doorman.grpc.pb.h"
#include "hosting.hpp"
#include "rls.grpc.pb.h"

namespace {

namespace rls = ::envoy::service::ratelimit::v3;

class rate_limit final : public rls::RateLimitService::CallbackService {
  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* ctx,
                                            const rls::RateLimitRequest* in,
                                            rls::RateLimitResponse* out) override {
    out->set_overall_code(rls::RateLimitResponse::OK);
    for (int i = 0; i < in->descriptors_size(); ++i)
      out->add_statuses()->set_code(rls::RateLimitResponse::OK);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

class capacity final : public ::doorman::Capacity::CallbackService {
  grpc::ServerUnaryReactor* GetCapacity(grpc::CallbackServerContext* ctx,
                                        const ::doorman::GetCapacityRequest* in,
                                        ::doorman::GetCapacityResponse* out) override {
    const std::int64_t expiry = std::time(nullptr) + 60;  // as a node's answer: a lease of 60 s
    for (const auto& r : in->resource()) {
      auto& g = *out->add_response();
      g.set_resource_id(r.resource_id());
      auto& lease = *g.mutable_gets();
      lease.set_expiry_time(expiry);
      lease.set_refresh_interval(5);
      lease.set_capacity(r.wants());
      g.set_safe_capacity(0);
    }
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

}  // namespace

int main(int argc, char** argv) {
  doorman::grpc_door::server_options o;
  o.listen = "127.0.0.1:0";
  const auto client_auth = [&](auto& a) {
    const std::string v = a.value();
    const auto mode = doorman::net::parse_client_auth(v);
    if (!mode) {
      throw std::invalid_argument("--tls-client-auth: expected none, request or require, got \"" +
                                  v + "\"");
    }
    o.tls.client_auth = *mode;
  };
  return doorman_examples::run_program(
      argc, argv, "doorman_bench_grpc_floor",
      "usage: doorman_bench_grpc_floor [--listen HOST:PORT] [--tls-cert FILE --tls-key FILE\n"
      "                                [--tls-ca FILE] [--tls-client-auth none|request|require]]\n",
      {{"--listen", [&](auto& a) { o.listen = a.value(); }},
       {"--tls-cert", [&](auto& a) { o.tls.cert_file = a.value(); }},
       {"--tls-key", [&](auto& a) { o.tls.key_file = a.value(); }},
       {"--tls-ca", [&](auto& a) { o.tls.ca_file = a.value(); }},
       {"--tls-client-auth", client_auth}},
      [&] {
        if (o.tls.active() && (o.tls.cert_file.empty() || o.tls.key_file.empty()))
          throw std::invalid_argument("TLS needs --tls-cert and --tls-key");
        // Blocked before gRPC starts its threads, so that only
        // sigwait takes them.
        sigset_t stop;
        sigemptyset(&stop);
        sigaddset(&stop, SIGTERM);
        sigaddset(&stop, SIGINT);
        pthread_sigmask(SIG_BLOCK, &stop, nullptr);
        doorman::grpc_door::hosting server(o, [] {
          doorman::grpc_door::hosting::services s;
          s.push_back(std::make_unique<rate_limit>());
          s.push_back(std::make_unique<capacity>());
          return s;
        });
        server.start();
        fmt::print(stderr, "gRPC floor listening on {}:{}\n",
                   o.listen.substr(0, o.listen.rfind(':')), server.port());
        std::fflush(stderr);
        int signal = 0;
        sigwait(&stop, &signal);
        server.stop(std::chrono::milliseconds(1000));
        return 0;
      });
}
