// libFuzzer target: the client's local limiters, as programs of operations (structure-aware:
// each byte picks the next operation or an amount). Every bound their docs state is checked
// after every step (tests/fuzz/limit_properties.hpp): a budget window's count is never under
// what the window's calls really spent, whatever the order of calls, settles, reports and
// allotments, new windows included; the calls a rate limiter (GCRA or the leaky bucket, on
// either clock) admitted, settled and cancelled use no more over any window than its rate and
// burst allow.

#include <cstddef>
#include <cstdint>

#include "fuzz_support.hpp"
#include "limit_properties.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (const auto broken = doorman_fuzz::budget_window_property(data, size))
    doorman_fuzz::fail("budget window", *broken);
  if (const auto broken = doorman_fuzz::rate_window_property(data, size))
    doorman_fuzz::fail("rate window", *broken);
  return 0;
}
