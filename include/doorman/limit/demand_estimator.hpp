#pragma once

/// \file
/// Wants measured from use, so that a client need not guess them: a moving average over a
/// sliding window of samples.
///
///     doorman::demand_estimator demand(std::chrono::seconds(10));
///     // once a second (the client's loop does this for its resources):
///     demand.add(attempts_in_the_last_second, std::chrono::seconds(1));  // for a rate
///     double wants = demand.estimate();
///
/// A sample is a value that held for a span of time (a rate measured over the span, or the
/// peak in flight during it). The estimate is the time-weighted mean of the samples of the
/// last `window`; an empty estimator estimates 0.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>

namespace doorman {

class demand_estimator {
 public:
  using duration = std::chrono::duration<double>;

  /// `window`: how much history the average covers (at least one sample is always kept).
  explicit demand_estimator(duration window = std::chrono::seconds(10)) : window_(window) {}

  /// Records that `value` held for `span` (a non-positive span or a negative or NaN value is
  /// ignored).
  void add(double value, duration span) {
    const double s = span.count();
    if (!(s > 0) || !(value >= 0)) return;
    samples_.push_back({value * s, s});
    weighted_ += value * s;
    covered_ += s;
    while (samples_.size() > 1 && covered_ - samples_.front().span >= window_.count()) {
      weighted_ -= samples_.front().weighted;
      covered_ -= samples_.front().span;
      samples_.pop_front();
    }
  }

  /// The time-weighted mean over the window.
  [[nodiscard]] double estimate() const noexcept {
    return covered_ > 0 ? std::max(0.0, weighted_ / covered_) : 0.0;
  }

  [[nodiscard]] duration window() const noexcept { return window_; }

  void clear() noexcept {
    samples_.clear();
    weighted_ = covered_ = 0;
  }

 private:
  struct sample {
    double weighted;
    double span;
  };
  duration window_;
  std::deque<sample> samples_;
  double weighted_ = 0;
  double covered_ = 0;
};

/// Permits asked for per second over `span` seconds (admitted or not); when a waiter was
/// delayed since the last sample (`throttled`), at least `capacity` (1 when less) × `headroom`:
/// a throttled client asks past what it holds, so its lease can grow. The client's demand
/// sample of a rate resource, in C++ and Python alike (python/doorman/_core.py).
[[nodiscard]] inline double rate_demand(double asked, double span, bool throttled, double capacity,
                                        double headroom) noexcept {
  double value = asked / span;
  if (throttled) value = std::max(value, std::max(capacity, 1.0) * headroom);
  return value;
}

/// Adds one sample (`value` over `span` seconds) to `demand` and returns the wants it makes:
/// the estimate × `headroom`, at least `min_wants`; a throttled sample's value at once (the
/// average only brings wants down as demand falls); for a gauge the next whole number;
/// within the protocol's bound on a quantity (0 to 1e15).
[[nodiscard]] inline double sampled_wants(demand_estimator& demand, double value, double span,
                                          bool throttled, bool gauge, double headroom = 1,
                                          double min_wants = 0) {
  demand.add(value, std::chrono::duration<double>(span));
  double wants = std::max(demand.estimate() * headroom, min_wants);
  if (throttled) wants = std::max(wants, value);
  // Concurrency is whole operations: a gauge asks for the next whole number.
  if (gauge) wants = std::ceil(wants - 1e-6);
  return wants > 0 ? std::min(wants, 1e15) : 0.0;
}

/// A budget resource's wants (docs/budgets.md): the units its callers asked for (`asked` over
/// `span` seconds, admitted or not), at the rate they asked, for two refreshes (`refresh`
/// seconds, at least `sample_interval`); after a refusal (`throttled`) at least its
/// `allotment` × `throttled_headroom`, so a client short of units doubles what it asks for
/// each refresh as a throttled rate does. The rate goes through `demand` (`sampled_wants`,
/// with `headroom`); at least `min_wants` units.
[[nodiscard]] inline double budget_wants(demand_estimator& demand, double asked, double span,
                                         bool throttled, double allotment, double refresh,
                                         double sample_interval, double throttled_headroom,
                                         double headroom = 1, double min_wants = 0) {
  const double horizon = 2 * std::max(refresh, sample_interval);
  const double value = rate_demand(asked, span, throttled, allotment / horizon, throttled_headroom);
  const double per_second = sampled_wants(demand, value, span, throttled, false, headroom, 0);
  return std::min(std::max(per_second * horizon, min_wants), 1e15);
}

}  // namespace doorman
