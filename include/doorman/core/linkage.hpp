#pragma once

/// \file
/// Header-only by default, compiled once when asked (docs/building.md): the way asio does it.
///
/// By default every definition is inline in the headers. Define `DOORMAN_SEPARATE_COMPILATION`
/// for the whole program and compile `<doorman/src.hpp>` in exactly one of its translation
/// units (the CMake target `doorman::compiled` does both): the headers then only declare the
/// heavy parts (the coroutines of the network layer and the client), and that one unit
/// defines them. Every other unit compiles in a fraction of the time and memory.
///
/// `DOORMAN_DECL` marks those functions: `inline` when header-only, nothing otherwise.

#if defined(DOORMAN_SEPARATE_COMPILATION)
#define DOORMAN_DECL
#else
#define DOORMAN_HEADER_ONLY 1
#define DOORMAN_DECL inline
#endif
