#pragma once

// Envoy's rate limit service messages (proto/envoy/rls.proto) to doorman's rule checks and
// back (docs/envoy.md). Pure functions; a request is validated here (it comes from outside),
// its errors naming the proto field.

#include <optional>
#include <string>
#include <vector>

#include <doorman/core/error.hpp>
#include <doorman/limit/rules.hpp>

#include "rls.pb.h"

namespace doorman::rls {

// Bounds on a request (beyond the message size gRPC already bounds).
struct request_limits {
  static constexpr std::size_t max_descriptors = 64;
  static constexpr std::size_t max_entries = 16;            // per descriptor
  static constexpr std::size_t max_bytes = 1024;            // of a domain, a key or a value
  static constexpr std::uint64_t max_hits = 1'000'000'000;  // hits_addend
};

// A request as the rules check it.
struct check_request {
  std::string domain;
  std::vector<descriptor_check> descriptors;
};

// Reads `r` into `out`; the problem, naming the field ("descriptors[0].entries[1].key: must
// not be empty"), when it breaks a bound. A descriptor's hits are its own `hits_addend`, else
// the request's, else 1.
std::optional<request_error> from_proto(const ::envoy::service::ratelimit::v3::RateLimitRequest& r,
                                        check_request& out);

// The headers ratelimit can add for the descriptor with the fewest requests left (off unless
// names are given; its defaults are RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset).
struct header_names {
  bool enabled = false;
  std::string limit = "RateLimit-Limit";
  std::string remaining = "RateLimit-Remaining";
  std::string reset = "RateLimit-Reset";
};

// The answer for `statuses` (one per descriptor, in order): OVER_LIMIT overall when any
// descriptor is over a limit that is not in shadow mode; a shadow rule's status is OK; an
// unlimited one is OK with limit_remaining 2^32 - 1; a descriptor with no limit is OK alone.
void to_proto(const std::vector<descriptor_status>& statuses, const header_names& headers,
              ::envoy::service::ratelimit::v3::RateLimitResponse& out);

}  // namespace doorman::rls
