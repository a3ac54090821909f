#pragma once

/// \file
/// What a server counts of its connections (`net::server::counts`), apart from the server so
/// that the admin pages can hold it without the network code.

#include <cstdint>

namespace doorman::net {

/// What a server counts of its connections since it started.
struct connection_counts {
  std::uint64_t accepted = 0;           ///< and not refused
  std::uint64_t refused = 0;            ///< because `max_connections` was reached
  std::uint64_t closed_idle = 0;        ///< for `idle_timeout`
  std::uint64_t failed_handshakes = 0;  ///< TLS handshakes that failed or timed out
};

}  // namespace doorman::net
