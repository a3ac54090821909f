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

}  // namespace doorman
