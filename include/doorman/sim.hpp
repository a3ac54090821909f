#pragma once

/// \file
/// The simulator: whole capacity trees on a virtual clock, running the core's engine, upstream
/// and client state (docs/simulation.md).

#include "doorman/sim/campaign.hpp"
#include "doorman/sim/costs.hpp"
#include "doorman/sim/protected_service.hpp"
#include "doorman/sim/report.hpp"
#include "doorman/sim/scenario.hpp"
#include "doorman/sim/simulation.hpp"
