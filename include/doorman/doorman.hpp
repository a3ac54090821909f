#pragma once

/// \file
/// Everything doorman offers.

#include "doorman/client.hpp"
#include "doorman/core.hpp"
#include "doorman/node.hpp"
#include "doorman/protocol.hpp"
#include "doorman/version.hpp"
