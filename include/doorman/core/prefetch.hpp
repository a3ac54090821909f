#pragma once

/// \file
/// A hint to the processor to bring memory into cache ahead of use: the lookups of a decision
/// wait on memory once clients number in the millions, and a caller that knows what comes next
/// can overlap those waits.

#include <cstddef>

namespace doorman::detail {

/// Asks for the `bytes` at `p`, one cache line at a time (nothing where the compiler has no
/// prefetch builtin). Never faults, whatever `p` is.
inline void prefetch(const void* p, std::size_t bytes = 1) noexcept {
#if defined(__GNUC__)
  const char* c = static_cast<const char*>(p);
  for (std::size_t off = 0; off < bytes; off += 64)
    __builtin_prefetch(c + off);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace doorman::detail
