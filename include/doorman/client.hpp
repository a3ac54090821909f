#pragma once

/// \file
/// The client library: `doorman::client`, `rate_resource`, `gauge_resource`,
/// `keyed_rate_resource`, and the local limiters that enforce their leases (`any_rate_limiter`,
/// `gauge_limiter`). The other local limiters and the rules are in <doorman/limit.hpp>;
/// `window_draws` (exact per-window limits drawn from a root's count, which doorman-rls uses)
/// in <doorman/client/window_draws.hpp>, kept out of this header: it brings the protocol's
/// messages and JSON, which a unit of the client alone does not parse (docs/building.md).

#include "doorman/client/client.hpp"
#include "doorman/client/client_id.hpp"
#include "doorman/client/keyed_resource.hpp"
#include "doorman/client/resource.hpp"
