#pragma once

// Envoy's global rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) as a gRPC
// door: each ShouldRateLimit call is read and checked (rls_mapping.hpp), decided by a
// `handler` (the rules, and the leases behind them), and answered as Envoy expects
// (docs/envoy.md). Compiled once (doorman::grpc); no gRPC or protobuf header shows through.

#include <chrono>
#include <memory>
#include <vector>

#include <doorman/limit/rules.hpp>

#include "door.hpp"

namespace doorman::rls {

struct check_request;
struct header_names;

// Decides requests: from any gRPC thread, concurrently.
class handler {
 public:
  virtual ~handler() = default;
  // A status per descriptor, in order.
  virtual std::vector<descriptor_status> check(const check_request& r) = 0;

 protected:
  handler() = default;
  handler(const handler&) = default;
  handler& operator=(const handler&) = default;
};

// The gRPC server of the rate limit service over `h` (grpc_door::server_base: start, port,
// TLS reload, stop).
class server : public grpc_door::server_base {
 public:
  server(grpc_door::server_options options, handler& h, const header_names& headers);
};

}  // namespace doorman::rls
