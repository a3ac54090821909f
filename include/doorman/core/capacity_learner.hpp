#pragma once

/// \file
/// Learned capacity: the control law that moves a resource's capacity from what its clients'
/// calls to the protected service met (sans-I/O; one step per control interval). It is the
/// first part of capacity learned from the protected service: the signals' way to the root and
/// the root's use of it come next.
///
///     doorman::capacity_learner learn({.min = 100, .max = 5000}, 1000);
///     // each interval, the clients' calls and overload answers, summed:
///     learn.update({.calls = 5200, .overloads = 600, .seconds = 5, .held = true});
///     // learn.capacity() == 892.4: what got through (920 a second), less 3 %
///
/// The law, chosen on a model of a protected service whose true capacity steps by -50% and
/// +50% (tests/capacity_learner_test.cpp):
/// - **Cut to what got through.** When more than `overload_ratio` (0.5 %) of the calls were
///   answered overloaded, the service served about its true capacity: the calls that got
///   through, a second. The capacity goes there, less `margin`, never below `(1 - max_cut)` of
///   itself.
/// - **Rise by doubling steps.** An interval without overload in which some client was held
///   back by its lease (the capacity binds) raises the capacity by `step`, which starts at
///   `first_step` after each cut. Once past what got through at the last cut, the step
///   doubles, up to `max_step`, but only after an interval whose calls used the whole
///   capacity (within `margin`): leases adopt a change over a refresh interval, and a rise
///   not yet tried is not yet evidence. Near the true capacity the steps stay small (a swing
///   of about 5 %); after the service grows they grow until an overload finds its new level.
/// - **Hold on silence.** No calls, numbers that are not finite and >= 0, more overloads than
///   calls, or demand below the capacity: nothing changes. Silence never raises a capacity.
/// - Always between `min` and `max`.

#include <algorithm>
#include <cmath>
#include <limits>

namespace doorman {

/// The bounds and gains of a learned capacity.
struct learning_options {
  double min = 0;                                        ///< the least it may learn
  double max = std::numeric_limits<double>::infinity();  ///< the most it may learn
  double overload_ratio = 0.005;  ///< the share of calls overloaded above which it is cut
  double margin = 0.03;           ///< a cut goes this share below what got through
  double first_step = 0.02;       ///< the first rise after a cut, a share of the capacity
  double max_step = 0.25;         ///< the most one rise adds, a share of the capacity
  double max_cut = 0.5;           ///< the most one cut takes, a share of the capacity
};

/// One control interval's signals, summed over the clients.
struct overload_sample {
  double calls = 0;      ///< calls made to the protected service
  double overloads = 0;  ///< of those, answered overloaded (429, 503, RESOURCE_EXHAUSTED, ...)
  double seconds = 0;    ///< the interval's length
  bool held = false;     ///< some client wanted more than its lease: the capacity binds
};

/// What one step did.
enum class learn_step { hold, cut, rise };

/// The control law of a learned capacity (see the file's comment).
class capacity_learner {
 public:
  /// `start` is clamped to the bounds.
  capacity_learner(learning_options o, double start) : o_(o), step_(o.first_step) {
    capacity_ = clamp(start);
  }

  [[nodiscard]] double capacity() const noexcept { return capacity_; }

  /// Moves the capacity for one interval's signals.
  learn_step update(const overload_sample& s) {
    if (!usable(s)) return learn_step::hold;
    if (s.overloads > o_.overload_ratio * s.calls) {
      const double through = (s.calls - s.overloads) / s.seconds;
      peak_ = through;
      const double target = through * (1 - o_.margin);
      capacity_ = clamp(std::max(capacity_ * (1 - o_.max_cut), std::min(capacity_, target)));
      step_ = o_.first_step;
      return learn_step::cut;
    }
    if (!s.held) return learn_step::hold;
    // Whether the clients used the whole capacity: leases adopt a change over a refresh, so
    // an interval after a rise may not have tried it yet.
    const bool tried = s.calls / s.seconds >= (1 - o_.margin) * capacity_;
    capacity_ = clamp(capacity_ * (1 + step_));
    // Below the last overload's level, small steps back to it; past it, doubling ones, each
    // once the last was tried.
    if (capacity_ >= peak_ && tried) step_ = std::min(step_ * 2, o_.max_step);
    return learn_step::rise;
  }

 private:
  static bool usable(const overload_sample& s) noexcept {
    const auto ok = [](double x) { return std::isfinite(x) && x >= 0; };
    return ok(s.calls) && ok(s.overloads) && ok(s.seconds) && s.calls > 0 && s.seconds > 0 &&
           s.overloads <= s.calls;
  }

  [[nodiscard]] double clamp(double c) const noexcept {
    if (std::isnan(c)) c = o_.min;
    return std::max(o_.min, std::min(o_.max, c));
  }

  learning_options o_;
  double capacity_ = 0;
  double step_;
  double peak_ = 0;  // what got through at the last cut
};

}  // namespace doorman
