#pragma once

/// \file
/// Time for the sans-I/O core: the `clock` concept, a manual clock for tests and simulation,
/// and conversions between durations and the wire's relative seconds.

#include <cassert>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>

namespace doorman {

/// Seconds as a floating-point duration: the unit of configuration and of the wire protocol.
using seconds = std::chrono::duration<double>;

/// What the core needs of a clock: its time types and a way to read it.
///
/// The core never reads a clock by itself; the layers above read one and pass `now` in. The
/// clock type only fixes the `time_point` and `duration` types the core stores.
/// `std::chrono::steady_clock` and `doorman::manual_clock` both satisfy it.
template <class C>
concept clock = requires(const C& c) {
  typename C::duration;
  typename C::time_point;
  { c.now() } -> std::same_as<typename C::time_point>;
};

/// A clock that only moves when told to: for tests and the deterministic simulation.
///
///     doorman::manual_clock clock;
///     clock.advance(doorman::seconds{16});
class manual_clock {
 public:
  using rep = std::int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<manual_clock, duration>;
  static constexpr bool is_steady = true;

  constexpr manual_clock() = default;
  constexpr explicit manual_clock(time_point start) noexcept : now_(start) {}

  /// The current virtual time.
  [[nodiscard]] constexpr time_point now() const noexcept { return now_; }

  /// Moves time forward by `d` (which must not be negative).
  template <class Rep, class Period>
  constexpr void advance(std::chrono::duration<Rep, Period> d) noexcept {
    assert(d.count() >= 0);
    now_ += std::chrono::duration_cast<duration>(d);
  }

  /// Sets the time to `t`, which must not be earlier than `now()`.
  constexpr void set(time_point t) noexcept {
    assert(t >= now_);
    now_ = t;
  }

 private:
  time_point now_{};
};

/// A handle to a manual clock, itself a clock: for objects that keep their clock by value (the
/// limiters) while a test or a simulation moves the one they share.
///
///     doorman::manual_clock clock;
///     doorman::basic_rate_limiter<doorman::manual_clock_ref> lim({.rate = 1}, {&clock});
struct manual_clock_ref {
  using rep = manual_clock::rep;
  using period = manual_clock::period;
  using duration = manual_clock::duration;
  using time_point = manual_clock::time_point;
  static constexpr bool is_steady = true;

  const manual_clock* source = nullptr;

  [[nodiscard]] time_point now() const noexcept { return source->now(); }
};

static_assert(clock<manual_clock>);
static_assert(clock<manual_clock_ref>);
static_assert(clock<std::chrono::steady_clock>);

/// Converts relative seconds to `Duration`, saturating instead of overflowing, so that a huge
/// but finite number of seconds from the wire cannot wrap around. NaN converts to zero.
template <class Duration>
[[nodiscard]] Duration to_duration(double secs) noexcept {
  using rep = typename Duration::rep;
  if (!(secs == secs)) return Duration::zero();
  const double ticks = secs * static_cast<double>(Duration::period::den) /
                       static_cast<double>(Duration::period::num);
  // Stay well inside rep's range so time_point + duration cannot overflow either.
  const double limit = static_cast<double>(std::numeric_limits<rep>::max()) / 4;
  if (ticks >= limit) return Duration{static_cast<rep>(limit)};
  if (ticks <= -limit) return Duration{static_cast<rep>(-limit)};
  return Duration{static_cast<rep>(std::llround(ticks))};
}

/// Converts a duration to relative seconds.
template <class Rep, class Period>
[[nodiscard]] constexpr double to_seconds(std::chrono::duration<Rep, Period> d) noexcept {
  return std::chrono::duration_cast<seconds>(d).count();
}

/// The system clock's time now, in seconds since 1970-01-01 00:00 UTC (what budgets' windows, the
/// state file and the admin pages count in).
[[nodiscard]] inline double unix_seconds_now() noexcept {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace doorman
