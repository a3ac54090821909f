#pragma once

/// \file
/// Everything doorman offers.

#include "doorman/core.hpp"
#include "doorman/protocol.hpp"
