#pragma once

/// \file
/// Everything doorman offers.

#include "doorman/core.hpp"
