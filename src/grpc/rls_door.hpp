#pragma once

// Envoy's global rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) as a gRPC
// door: each ShouldRateLimit call is read and checked (rls_mapping.hpp), decided by a
// `handler` (the rules, and the leases behind them), and answered as Envoy expects
// (docs/envoy.md). Compiled once (doorman::grpc); no gRPC or protobuf header shows through.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <doorman/limit/rules.hpp>

#include "door.hpp"

namespace doorman::rls {

struct check_request;
struct header_names;

// How a check ended: a status per descriptor, in order; or, when `unavailable` says why, no
// decision (the call is answered UNAVAILABLE, and Envoy's failure_mode_deny decides).
struct check_outcome {
  std::vector<descriptor_status> statuses;
  std::optional<std::string> unavailable;
};

// Decides requests: from any gRPC thread, concurrently. `done` is called once, on this thread
// before `check` returns or later on another (a count asked of the tree's root); `check` keeps
// no reference to `r`.
class handler {
 public:
  using done_type = std::function<void(check_outcome)>;
  virtual ~handler() = default;
  virtual void check(const check_request& r, done_type done) = 0;

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
