#pragma once

/// \file
/// The bounds doorman holds every input to, named once: a configuration's values
/// (`config_limits`) and what crosses the wire (`request_limits`). Plain constants, so that a
/// header that only needs a bound (the client's resource ids) includes nothing else.

#include <cstddef>
#include <cstdint>

namespace doorman {

/// Limits that configuration values must respect. Durations are in seconds.
struct config_limits {
  static constexpr double min_duration = 0.1;  ///< lease_length, refresh_interval
  /// For every duration: about 11.6 days, the most a lease may say on the wire
  /// (`request_limits::max_seconds`), so any configured lease can be granted.
  static constexpr double max_duration = 1e6;
  static constexpr std::size_t max_glob_bytes = 256;  ///< as resource ids on the wire
  /// capacity and safe_capacity (and, on the wire, every wants, capacity and outstanding:
  /// `request_limits::max_quantity`).
  static constexpr double max_capacity = 1e15;
};

/// Bounds on every number and list that crosses a trust boundary: requests to an engine, and
/// the answers a client or an intermediate takes from a server (docs/protocol.md lists them).
/// They are chosen so that no sum the engine keeps can overflow: a band's wants and a server
/// child's `outstanding` are at most `max_quantity`, a resource of a server child has at most
/// `max_bands` bands, so a client's demand is at most 1e18 and a sum over 2^32 clients at most
/// about 4e27, far inside a double's range.
struct request_limits {
  static constexpr std::size_t max_id_bytes = 256;
  static constexpr std::size_t max_resources = 10'000;
  static constexpr std::int64_t max_num_clients = 1'000'000'000;
  /// Priority bands of one resource in a `get_server_capacity`.
  static constexpr std::size_t max_bands = 1'000;
  /// Wants, capacities (`has`, grants, configured capacities) and `outstanding`: at most 1e15
  /// (units per second, or in flight), which leaves integer quantities exact in a double.
  static constexpr double max_quantity = config_limits::max_capacity;
  /// A lease's `expires_in` (within ±max_seconds) and `refresh_interval` (0 to max_seconds),
  /// in seconds: about 11.6 days, the longest lease a configuration allows.
  static constexpr double max_seconds = 1e6;
  /// A page of `status` leases: where it starts, and how many it holds at most.
  static constexpr std::int64_t max_status_offset = 1'000'000'000;
  static constexpr std::int64_t max_status_limit = 1'000'000;
  /// `count_hits`: hits counted at once on one resource, and a fixed window's length in
  /// seconds (a millisecond to 366 days: every unit of a rate limit rule, a year included).
  static constexpr double max_hits = 1e9;
  static constexpr double min_window_seconds = 0.001;
  static constexpr double max_window_seconds = 366 * 86'400.0;
  /// A budget window's start on the wire: Unix seconds up to the year 5138.
  static constexpr double max_window_start = 1e11;
};

}  // namespace doorman
