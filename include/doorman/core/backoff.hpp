#pragma once

/// \file
/// Exponential backoff with jitter, shared by everything that retries (an intermediate's
/// requests to its parent, a channel's reconnects). Deterministic for a seed, so the simulator
/// repeats.
///
///     doorman::jittered_backoff backoff({.initial = seconds(0.5), .maximum = seconds(15)}, seed);
///     seconds wait = backoff.delay(attempt);  // attempt 1, 2, ...

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "doorman/core/time.hpp"

namespace doorman {

namespace detail {

/// splitmix64: a small, fast, well-mixed generator; deterministic for a seed.
class splitmix64 {
 public:
  explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

}  // namespace detail

/// The steps of a backoff, with their defaults.
struct backoff_options {
  seconds initial{0.5};  ///< the step of the first attempt
  seconds maximum{15};   ///< the ceiling of the step
};

/// Attempt n waits a delay uniform in [½, 1] of min(maximum, initial × 2ⁿ⁻¹).
class jittered_backoff {
 public:
  explicit jittered_backoff(backoff_options options, std::uint64_t seed) noexcept
      : options_(options), random_(seed) {}

  /// The delay before attempt `attempt` (1 for the first retry).
  [[nodiscard]] seconds delay(int attempt) noexcept {
    const double step =
        std::min(options_.maximum.count(),
                 options_.initial.count() *
                     std::pow(2.0, static_cast<double>(std::clamp(attempt, 1, 31) - 1)));
    return seconds(step * (0.5 + 0.5 * random_.uniform()));
  }

 private:
  backoff_options options_;
  detail::splitmix64 random_;
};

}  // namespace doorman
