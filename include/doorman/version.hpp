#pragma once

/// \file
/// The library's version, the one place it is written: CMake reads it for `project(VERSION)`,
/// the package files and every tool's `--version`.
///
///     static_assert(DOORMAN_VERSION_MAJOR == 0);
///     std::puts(DOORMAN_VERSION_STRING);  // "0.1.0"

#define DOORMAN_VERSION_MAJOR 0
#define DOORMAN_VERSION_MINOR 1
#define DOORMAN_VERSION_PATCH 0
#define DOORMAN_VERSION_STRING "0.1.0"
