#pragma once

/// \file
/// The limiters' default time source: a monotonic clock that is cheap to read.
///
/// `std::chrono::steady_clock::now()` costs about 29 ns on the machines this project is
/// measured on, more than the rest of a limiter decision. `coarse_clock` reads
/// `CLOCK_MONOTONIC_COARSE` instead (6–9 ns; it advances once per kernel tick, 1–4 ms) where
/// the platform has it, and is `steady_clock` elsewhere.
///
///     doorman::rate_limiter limiter({.rate = 100});  // reads doorman::coarse_clock

#include <chrono>
#include <cstdint>
#include <ctime>

namespace doorman {

/// A steady clock with the resolution of the kernel tick. Satisfies the standard's Clock
/// requirements, so asio's `basic_waitable_timer<coarse_clock>` and `sleep_until` accept it.
struct coarse_clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<coarse_clock, duration>;
  static constexpr bool is_steady = true;

  [[nodiscard]] static time_point now() noexcept {
#if defined(CLOCK_MONOTONIC_COARSE)
    ::timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return time_point{duration{std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec}};
#else
    return time_point{
        std::chrono::duration_cast<duration>(std::chrono::steady_clock::now().time_since_epoch())};
#endif
  }

  /// The precise time on the same scale (`CLOCK_MONOTONIC`, i.e. steady_clock on Linux):
  /// never earlier than `now()`, and at most `resolution()` later.
  [[nodiscard]] static time_point precise_now() noexcept {
    return time_point{
        std::chrono::duration_cast<duration>(std::chrono::steady_clock::now().time_since_epoch())};
  }

  /// How far `now()` may lag real time: the clock's tick (0 when it is steady_clock).
  [[nodiscard]] static duration resolution() noexcept {
#if defined(CLOCK_MONOTONIC_COARSE)
    static const duration res = [] {
      ::timespec ts{};
      ::clock_getres(CLOCK_MONOTONIC_COARSE, &ts);
      return duration{std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec};
    }();
    return res;
#else
    return duration::zero();
#endif
  }
};

}  // namespace doorman
