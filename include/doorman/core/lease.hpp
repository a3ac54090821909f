#pragma once

/// \file
/// A lease on capacity, in absolute time (inside a process) and in relative seconds (on the wire).

#include <algorithm>
#include <functional>

#include "doorman/core/time.hpp"

namespace doorman {

/// A lease as a process keeps it: the holder may use `capacity` until `expiry`, and should come
/// back after `refresh_interval`.
template <class TimePoint>
struct basic_lease {
  using time_point = TimePoint;
  using duration = typename TimePoint::duration;

  double capacity = 0;
  time_point expiry{};
  duration refresh_interval{};

  /// Whether the lease no longer grants anything at `now`.
  [[nodiscard]] bool expired(time_point now) const noexcept { return now >= expiry; }

  friend bool operator==(const basic_lease&, const basic_lease&) = default;
};

/// A lease as the wire carries it: durations in relative seconds, so that no clock needs to be
/// synchronized between machines. `{"capacity": 12.5, "expires_in": 59.98, "refresh_interval": 16}`
struct lease_info {
  double capacity = 0;
  double expires_in = 0;
  double refresh_interval = 0;

  friend bool operator==(const lease_info&, const lease_info&) = default;
};

/// The wire form of `l` as seen at `now`; an expired lease has `expires_in` 0.
template <class TimePoint>
[[nodiscard]] lease_info to_lease_info(const basic_lease<TimePoint>& l, TimePoint now) noexcept {
  return {l.capacity, std::max(0.0, to_seconds(l.expiry - now)), to_seconds(l.refresh_interval)};
}

/// The absolute form of a lease received at `now`.
template <class TimePoint>
[[nodiscard]] basic_lease<TimePoint> from_lease_info(const lease_info& l, TimePoint now) noexcept {
  using duration = typename TimePoint::duration;
  return {l.capacity, now + to_duration<duration>(l.expires_in),
          to_duration<duration>(l.refresh_interval)};
}

/// The sum of `projection(x)` over `range`, in its order (a sum of capacities or demands).
template <class Range, class Projection>
[[nodiscard]] double sum_over(const Range& range, Projection projection) {
  double sum = 0;
  for (const auto& x : range)
    sum += std::invoke(projection, x);
  return sum;
}

}  // namespace doorman
