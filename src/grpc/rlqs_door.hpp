#pragma once

// Envoy's rate limit quota service (`envoy.service.rate_limit_quota.v3.RateLimitQuotaService`)
// on the node's gRPC port (docs/envoy.md): each stream drives an `rlqs::session`
// (protocol/rlqs_session.hpp), which decides everything; the door reads and writes the stream's
// messages, asks the handler (the node) what the session asks for, and wakes each session when
// it has something to do. Internal to the compiled layer: it shows gRPC's headers.

#include <memory>

#include <grpcpp/impl/service_type.h>

#include "door.hpp"

namespace doorman::grpc_door {

// The service over `h`, for `hosting`.
std::unique_ptr<grpc::Service> make_rlqs_service(handler& h, const rlqs_options& o);

}  // namespace doorman::grpc_door
