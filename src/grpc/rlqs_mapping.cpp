// Envoy's rate limit quota messages to the session's terms and back (see rlqs_mapping.hpp).

#include "rlqs_mapping.hpp"

#include <cstdint>
#include <utility>

namespace doorman::grpc_door {

namespace pb = ::envoy::service::rate_limit_quota::v3;
namespace tpb = ::envoy::type::v3;

rlqs::usage_reports from_proto(const pb::RateLimitQuotaUsageReports& in) {
  rlqs::usage_reports r;
  r.domain = in.domain();
  r.usages.reserve(static_cast<std::size_t>(in.bucket_quota_usages_size()));
  for (const auto& u : in.bucket_quota_usages()) {
    rlqs::bucket_usage b;
    for (const auto& [k, v] : u.bucket_id().bucket())
      b.bucket.emplace_back(k, v);
    const auto& d = u.time_elapsed();
    const bool valid = d.seconds() >= 0 && d.nanos() >= 0 && d.nanos() < 1'000'000'000;
    b.elapsed = valid ? static_cast<double>(d.seconds()) + d.nanos() / 1e9 : -1;
    b.allowed = u.num_requests_allowed();
    b.denied = u.num_requests_denied();
    r.usages.push_back(std::move(b));
  }
  return r;
}

void to_proto(const rlqs::bucket_action& a, pb::RateLimitQuotaResponse::BucketAction& out) {
  auto& id = *out.mutable_bucket_id()->mutable_bucket();
  for (const auto& [k, v] : a.bucket)
    id[k] = v;
  if (!a.assign && !a.spend) {
    out.mutable_abandon_action();
    return;
  }
  auto& q = *out.mutable_quota_assignment_action();
  q.mutable_assignment_time_to_live()->set_seconds(a.ttl);
  auto& strategy = *q.mutable_rate_limit_strategy();
  if (a.spend) {  // a budget's block: full, a token a year
    auto& bucket = *strategy.mutable_token_bucket();
    bucket.set_max_tokens(a.spend->tokens);
    bucket.mutable_tokens_per_fill()->set_value(1);
    bucket.mutable_fill_interval()->set_seconds(rlqs::block_fill_seconds);
    bucket.mutable_fill_interval()->set_nanos(static_cast<std::int32_t>(a.spend->number));
    return;
  }
  if (a.assign->per_minute == 0) {
    strategy.set_blanket_rule(tpb::RateLimitStrategy::DENY_ALL);
    return;
  }
  auto& bucket = *strategy.mutable_token_bucket();
  bucket.set_max_tokens(a.assign->burst);
  bucket.mutable_tokens_per_fill()->set_value(a.assign->per_minute);
  bucket.mutable_fill_interval()->set_seconds(rlqs::fill_seconds);
}

}  // namespace doorman::grpc_door
