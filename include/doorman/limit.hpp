#pragma once

/// \file
/// The local limiters: usable without any server.

#include "doorman/limit/any_limiter.hpp"
#include "doorman/limit/budget_counter.hpp"
#include "doorman/limit/clock.hpp"
#include "doorman/limit/demand_estimator.hpp"
#include "doorman/limit/gauge_limiter.hpp"
#include "doorman/limit/keyed_limiter.hpp"
#include "doorman/limit/leaky_bucket.hpp"
#include "doorman/limit/limiter_base.hpp"
#include "doorman/limit/rate_limiter.hpp"
#include "doorman/limit/rules.hpp"
#include "doorman/limit/window_limiter.hpp"
