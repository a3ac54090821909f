#pragma once

/// \file
/// The client library: `doorman::client`, `rate_resource`, `gauge_resource`, and the local
/// limiters they use.

#include "doorman/client/client.hpp"
#include "doorman/client/keyed_resource.hpp"
#include "doorman/client/resource.hpp"
#include "doorman/limit.hpp"
