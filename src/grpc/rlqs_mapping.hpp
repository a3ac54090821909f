#pragma once

// Envoy's rate limit quota messages (proto/envoy/rlqs.proto) to the session's terms and back
// (protocol/rlqs_session.hpp). Pure functions; nothing is validated here beyond what the wire
// form needs: the session checks every report.

#include <doorman/protocol/rlqs_session.hpp>

#include "rlqs.pb.h"

namespace doorman::grpc_door {

// A report in the session's terms. A duration that is not one (negative, nanos out of range)
// becomes -1 s, which the session refuses, naming the field.
rlqs::usage_reports from_proto(
    const ::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports& in);

// An action as Envoy reads it: a quota as a `token_bucket` (or `DENY_ALL` for none), or a
// budget's block as a `token_bucket` that is not refilled, for its time to live in whole
// seconds; or an abandon.
void to_proto(const rlqs::bucket_action& a,
              ::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse::BucketAction& out);

}  // namespace doorman::grpc_door
