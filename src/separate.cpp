// The one translation unit of doorman::compiled (CMake): every definition that
// DOORMAN_SEPARATE_COMPILATION takes out of the headers (docs/building.md).
#include "doorman/src.hpp"
