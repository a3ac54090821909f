#pragma once

/// \file
/// The client library: `doorman::client`, `rate_resource`, `gauge_resource`,
/// `keyed_rate_resource`, and the local limiters that enforce their leases (`any_rate_limiter`,
/// `gauge_limiter`). The other local limiters and the rules are in <doorman/limit.hpp>.

#include "doorman/client/client.hpp"
#include "doorman/client/client_id.hpp"
#include "doorman/client/keyed_resource.hpp"
#include "doorman/client/resource.hpp"
#include "doorman/client/window_draws.hpp"
