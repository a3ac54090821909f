#pragma once

/// \file
/// A resource's settings in a client (docs/client.md): its priority and wants, and the fallback
/// that applies once its lease has expired unrenewed. Apart from the client state
/// (`core/client_state.hpp`) so that the client's public header stays light.

#include <cstdint>
#include <optional>

namespace doorman {

/// What a client may use once its lease has expired and it could not refresh (docs/client.md).
enum class fallback {
  pessimistic,  ///< nothing (0)
  optimistic,   ///< its wants
  safe,         ///< the safe capacity: the configured one, or else the server's last dynamic one
};

/// A resource's settings in the client.
struct client_resource_options {
  std::int64_t priority = 0;
  double wants = 0;
  fallback mode = fallback::safe;
  /// Overrides the safe capacity the server returns (−1: unlimited).
  std::optional<double> safe_capacity{};
  /// Measured wants are the demand × this (at least 1; see `resource_options::headroom`).
  double headroom = 1;
  /// Measured wants are at least this (see `resource_options::min_wants`).
  double min_wants = 0;
  /// A budget (docs/budgets.md): its leases are allotments of units, it reports what it spent,
  /// and it has no fallback (nothing is spent without an allotment).
  bool budget = false;
};

}  // namespace doorman
