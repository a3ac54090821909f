// Envoy's rate limit service messages to doorman's rule checks and back (see rls_mapping.hpp).

#include "rls_mapping.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <string_view>
#include <utility>

namespace doorman::rls {

namespace {

namespace pb = ::envoy::service::ratelimit::v3;

request_error bad(std::string path, std::string_view reason) {
  return {errc::invalid_params, path + ": " + std::string(reason), path};
}

// A domain, key or value: at most max_bytes; `required`: not empty either.
std::optional<request_error> text(const std::string& s, const std::string& path, bool required) {
  if (required && s.empty()) return bad(path, "must not be empty");
  if (s.size() > request_limits::max_bytes) return bad(path, "must be at most 1024 bytes");
  return std::nullopt;
}

// Envoy's units (envoy.type.v3.RateLimitUnit) and their seconds (a month is 30 days, a year
// 365, as envoyproxy/ratelimit counts them), and 7, a week: Envoy's enum stops at YEAR, but
// envoyproxy/ratelimit reads the number as its own response unit, where 7 is WEEK.
constexpr std::array<std::int64_t, 8> unit_seconds{0,     1,       60,       3600,
                                                   86400, 2592000, 31536000, 604800};

std::optional<request_error> descriptor_of(
    const ::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor& d, double request_hits,
    const std::string& path, descriptor_check& out) {
  if (d.entries_size() == 0) return bad(path + ".entries", "must hold at least one entry");
  if (static_cast<std::size_t>(d.entries_size()) > request_limits::max_entries)
    return bad(path + ".entries", "must hold at most 16 entries");
  for (int i = 0; i < d.entries_size(); ++i) {
    const auto at = path + ".entries[" + std::to_string(i) + "]";
    if (auto e = text(d.entries(i).key(), at + ".key", true)) return e;
    if (auto e = text(d.entries(i).value(), at + ".value", false)) return e;
    out.entries.push_back({d.entries(i).key(), d.entries(i).value()});
  }
  out.hits = request_hits;
  if (d.has_hits_addend()) {
    if (d.hits_addend().value() > request_limits::max_hits)
      return bad(path + ".hits_addend", "must be at most 1e9");
    out.hits = static_cast<double>(d.hits_addend().value());
  }
  if (d.has_limit()) {
    const auto unit = static_cast<std::size_t>(d.limit().unit());
    if (unit == 0 || unit >= unit_seconds.size())
      return bad(path + ".limit.unit",
                 "must be one of SECOND, MINUTE, HOUR, DAY, MONTH, YEAR, or 7 (a week)");
    out.limit = limit_override{static_cast<double>(d.limit().requests_per_unit()),
                               std::chrono::seconds(unit_seconds[unit])};
  }
  return std::nullopt;
}

pb::RateLimitResponse::RateLimit::Unit unit_of(std::chrono::nanoseconds window) {
  using U = pb::RateLimitResponse::RateLimit;
  constexpr std::array<std::pair<std::int64_t, U::Unit>, 7> units{{{1, U::SECOND},
                                                                   {60, U::MINUTE},
                                                                   {3600, U::HOUR},
                                                                   {86400, U::DAY},
                                                                   {604800, U::WEEK},
                                                                   {2592000, U::MONTH},
                                                                   {31536000, U::YEAR}}};
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(window).count();
  for (const auto& [seconds, unit] : units)
    if (seconds == s) return unit;
  return U::UNKNOWN;
}

std::uint32_t whole(double v) {
  return static_cast<std::uint32_t>(
      std::clamp(std::floor(v), 0.0, double(std::numeric_limits<std::uint32_t>::max())));
}

void add_header(pb::RateLimitResponse& out, const std::string& key, std::string value) {
  auto& h = *out.add_response_headers_to_add();
  h.set_key(key);
  h.set_value(std::move(value));
}

}  // namespace

std::optional<request_error> from_proto(const pb::RateLimitRequest& r, check_request& out) {
  if (auto e = text(r.domain(), "domain", true)) return e;
  if (r.descriptors_size() == 0) return bad("descriptors", "must hold at least one descriptor");
  if (static_cast<std::size_t>(r.descriptors_size()) > request_limits::max_descriptors)
    return bad("descriptors", "must hold at most 64 descriptors");
  if (r.hits_addend() > request_limits::max_hits) return bad("hits_addend", "must be at most 1e9");
  const double hits = r.hits_addend() == 0 ? 1.0 : static_cast<double>(r.hits_addend());
  out.domain = r.domain();
  out.descriptors.resize(static_cast<std::size_t>(r.descriptors_size()));
  for (int i = 0; i < r.descriptors_size(); ++i) {
    if (auto e = descriptor_of(r.descriptors(i), hits, "descriptors[" + std::to_string(i) + "]",
                               out.descriptors[static_cast<std::size_t>(i)]))
      return e;
  }
  return std::nullopt;
}

void to_proto(const std::vector<descriptor_status>& statuses, const header_names& headers,
              pb::RateLimitResponse& out) {
  out.set_overall_code(request_refused(statuses) ? pb::RateLimitResponse::OVER_LIMIT
                                                 : pb::RateLimitResponse::OK);
  const descriptor_status* fewest = nullptr;  // the limit closest to its end, for the headers
  for (const auto& s : statuses) {
    auto& x = *out.add_statuses();
    x.set_code(over_limit(s) ? pb::RateLimitResponse::OVER_LIMIT : pb::RateLimitResponse::OK);
    if (s.unlimited) {
      x.set_limit_remaining(std::numeric_limits<std::uint32_t>::max());
      continue;
    }
    if (s.limit < 0) continue;
    auto& limit = *x.mutable_current_limit();
    limit.set_requests_per_unit(whole(s.limit));
    limit.set_unit(unit_of(s.window));
    limit.set_name(s.name);
    const double remaining = over_limit(s) ? 0 : s.remaining;
    x.set_limit_remaining(whole(remaining));
    const auto reset = std::max(std::chrono::nanoseconds(0), s.reset);
    x.mutable_duration_until_reset()->set_seconds(
        std::chrono::duration_cast<std::chrono::seconds>(reset).count());
    x.mutable_duration_until_reset()->set_nanos(
        static_cast<std::int32_t>(reset.count() % 1'000'000'000));
    if (!fewest || over_limit(s) || (!over_limit(*fewest) && remaining < fewest->remaining))
      fewest = &s;
  }
  if (!headers.enabled || !fewest) return;
  add_header(out, headers.limit, std::to_string(whole(fewest->limit)));
  add_header(out, headers.remaining,
             std::to_string(over_limit(*fewest) ? 0 : whole(fewest->remaining)));
  add_header(out, headers.reset, std::to_string(header_seconds(fewest->reset)));
}

}  // namespace doorman::rls
