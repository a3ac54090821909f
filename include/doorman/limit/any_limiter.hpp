#pragma once

/// \file
/// A rate limiter whose algorithm is chosen at run time: what a `rate_resource` holds, so that
/// any of the local algorithms can enforce a lease.
///
///     doorman::any_rate_limiter lim({.algorithm = doorman::rate_algorithm::sliding_window,
///                                    .window = 60s, .sub_windows = 12}, 100.0 / 60);
///     lim.set_rate(capacity);  // a new lease: the window limit becomes capacity × 60 s
///
/// The choice, in short (docs/algorithms.md measures them):
/// - `gcra` (the default): a token bucket; rate × W + burst in any window W; the cheapest.
/// - `fixed_window`: a counter per aligned window; cheap; up to 2 × the limit across an edge.
/// - `sliding_log`: exact over any window; memory grows with the limit (bounded).
/// - `sliding_window`: counts per sub-window; within one sub-window's count of exact.
/// - `leaky_bucket`: a shaper; no burst, callers queue (bounded) and leave at the rate.

#include <chrono>
#include <cstddef>
#include <optional>
#include <stop_token>
#include <string_view>
#include <utility>
#include <variant>

#include "doorman/limit/clock.hpp"
#include "doorman/limit/leaky_bucket.hpp"
#include "doorman/limit/limiter_base.hpp"
#include "doorman/limit/rate_limiter.hpp"
#include "doorman/limit/window_limiter.hpp"

namespace doorman {

/// The local rate algorithms.
enum class rate_algorithm { gcra, fixed_window, sliding_log, sliding_window, leaky_bucket };

/// The algorithm's name as configurations spell it: "gcra", "fixed_window", "sliding_log",
/// "sliding_window", "leaky_bucket".
constexpr std::string_view to_string(rate_algorithm a) noexcept {
  switch (a) {
    case rate_algorithm::gcra:
      return "gcra";
    case rate_algorithm::fixed_window:
      return "fixed_window";
    case rate_algorithm::sliding_log:
      return "sliding_log";
    case rate_algorithm::sliding_window:
      return "sliding_window";
    case rate_algorithm::leaky_bucket:
      return "leaky_bucket";
  }
  return "gcra";
}

/// The algorithm named `name`, if any.
constexpr std::optional<rate_algorithm> rate_algorithm_from(std::string_view name) noexcept {
  for (auto a : {rate_algorithm::gcra, rate_algorithm::fixed_window, rate_algorithm::sliding_log,
                 rate_algorithm::sliding_window, rate_algorithm::leaky_bucket}) {
    if (to_string(a) == name) return a;
  }
  return std::nullopt;
}

/// The algorithm and its parameters (each applies to the algorithms it names).
struct rate_algorithm_options {
  rate_algorithm algorithm = rate_algorithm::gcra;
  double burst = 1;  ///< gcra: permits an idle limiter admits at once
  std::chrono::nanoseconds window = std::chrono::seconds(1);  ///< the window algorithms
  unsigned sub_windows = 1;                                   ///< sliding_window
  std::size_t max_log_entries = 4096;                         ///< sliding_log
  double queue = 10;  ///< leaky_bucket: permits that may wait
};

class any_rate_limiter {
 public:
  using clock_type = coarse_clock;
  using duration = coarse_clock::duration;
  using time_point = coarse_clock::time_point;
  using acquire_result = basic_acquire_result<duration>;

  /// A limiter running `options.algorithm` at `rate` permits per second (< 0 unlimited, 0
  /// blocked).
  explicit any_rate_limiter(const rate_algorithm_options& options = {}, double rate = -1)
      : algorithm_(options.algorithm), impl_(make(options, rate)) {}

  any_rate_limiter(const any_rate_limiter&) = delete;
  any_rate_limiter& operator=(const any_rate_limiter&) = delete;

  [[nodiscard]] rate_algorithm algorithm() const noexcept { return algorithm_; }

  acquire_result try_acquire(double n = 1) noexcept {
    return std::visit([n](auto& l) { return l.try_acquire(n); }, impl_);
  }
  /// `try_acquire` again for a caller already counted (a retried wait): the demand counters
  /// do not count it twice.
  acquire_result try_again(double n = 1) noexcept {
    return std::visit(
        [n](auto& l) {
          if constexpr (requires { l.try_again(n); }) {
            return l.try_again(n);
          } else {
            return l.try_acquire(n);
          }
        },
        impl_);
  }
  /// Blocks until admitted: true; false when `stop` came first (or, for the window algorithms,
  /// `n` exceeds the limit; for the leaky bucket, its queue is full).
  bool wait(double n, std::stop_token stop) {
    return std::visit([&](auto& l) { return l.wait(n, stop); }, impl_);
  }
  void set_rate(double rate) noexcept {
    std::visit([rate](auto& l) { l.set_rate(rate); }, impl_);
  }
  void set_burst(double burst) noexcept {
    std::visit([burst](auto& l) { l.set_burst(burst); }, impl_);
  }
  [[nodiscard]] double rate() const noexcept {
    return std::visit([](const auto& l) { return l.rate(); }, impl_);
  }
  [[nodiscard]] limit_status status() noexcept {
    return std::visit([](auto& l) { return l.status(); }, impl_);
  }
  [[nodiscard]] double attempted() const noexcept {
    return std::visit([](const auto& l) { return l.attempted(); }, impl_);
  }
  [[nodiscard]] std::uint64_t refused() const noexcept {
    return std::visit([](const auto& l) { return l.refused(); }, impl_);
  }
  [[nodiscard]] std::uint64_t delayed() const noexcept {
    return std::visit([](const auto& l) { return l.delayed(); }, impl_);
  }

  /// Whether waits are served first come, first served through reservations (`gcra` and
  /// `leaky_bucket`); the others are retried when their refusal says.
  [[nodiscard]] bool reserves() const noexcept {
    return algorithm_ == rate_algorithm::gcra || algorithm_ == rate_algorithm::leaky_bucket;
  }
  /// With `reserves()`: see `rate_limiter::reserve` and `leaky_bucket_limiter::reserve`. Otherwise
  /// `time_point::max()`.
  time_point reserve(double n) noexcept {
    return std::visit(
        [n](auto& l) {
          if constexpr (requires { l.reserve(n); }) {
            return l.reserve(n);
          } else {
            return time_point::max();
          }
        },
        impl_);
  }
  bool cancel_reservation(double n, time_point at) noexcept {
    return std::visit(
        [&](auto& l) {
          if constexpr (requires { l.cancel_reservation(n, at); }) {
            return l.cancel_reservation(n, at);
          } else {
            return false;
          }
        },
        impl_);
  }

  /// The limiter, when it runs `L`'s algorithm.
  template <class L>
  [[nodiscard]] L* get_if() noexcept {
    return std::get_if<L>(&impl_);
  }

 private:
  using variant = std::variant<rate_limiter, fixed_window_limiter, sliding_log_limiter,
                               sliding_window_limiter, leaky_bucket_limiter>;

  static variant make(const rate_algorithm_options& o, double rate) {
    const window_limiter_options w{
        .limit = rate > 0 ? rate * std::chrono::duration<double>(o.window).count() : rate,
        .window = o.window,
        .sub_windows = o.sub_windows,
        .max_log_entries = o.max_log_entries};
    switch (o.algorithm) {
      case rate_algorithm::fixed_window:
        return variant(std::in_place_index<1>, w);
      case rate_algorithm::sliding_log:
        return variant(std::in_place_index<2>, w);
      case rate_algorithm::sliding_window:
        return variant(std::in_place_index<3>, w);
      case rate_algorithm::leaky_bucket:
        return variant(std::in_place_index<4>,
                       leaky_bucket_options{.rate = rate, .queue = o.queue});
      case rate_algorithm::gcra:
        break;
    }
    return variant(std::in_place_index<0>, rate_limiter_options{.rate = rate, .burst = o.burst});
  }

  const rate_algorithm algorithm_;
  variant impl_;
};

}  // namespace doorman
