#pragma once

/// \file
/// A lock-free rate limiter: at most `rate` permits per second, with a burst, shared by any
/// number of threads.
///
///     doorman::rate_limiter limiter({.rate = 100, .burst = 10});
///     if (auto r = limiter.try_acquire(); !r) reply_429(r.retry_after);
///     limiter.wait();        // blocks until admitted, first come first served
///     limiter.set_rate(250); // a new lease: takes effect at once
///
/// The algorithm is GCRA (the generic cell rate algorithm, a token bucket kept as one number):
/// the state is the theoretical arrival time `tat` of the next permit, one 64-bit atomic
/// updated by compare-and-swap. A request for n permits at `now` is admitted when
/// `max(tat, now) + min(n, burst)·T − now <= burst·T` (T = 1/rate), and moves `tat` to
/// `max(tat, now) + n·T`: a request larger than the burst is admitted once the burst is whole
/// and leaves it in debt (it borrows from its future), so a call of any cost is admitted when
/// due. Consequences: over any window of length W at most `rate·W + burst` permits are
/// admitted, plus the excess of one call larger than the burst;
/// an idle limiter holds at most `burst` permits (never more, whatever the rate was); unused
/// permits are not lost at a second's boundary, as Doorman's Go limiter loses them.
///
/// `rate` < 0 means unlimited, 0 means blocked (Doorman's conventions for a capacity).
///
/// Time: a clock that also offers `precise_now()` and `resolution()` (as `coarse_clock` does)
/// is read cheaply first; since the cheap reading lags real time, deciding with it can only
/// refuse too early, never admit too early, and a refusal within `resolution` of admission is
/// decided again on the precise clock. The latest precise reading, a time already passed, is
/// kept as a lower bound too, so one precise reading serves up to a burst of later calls. So
/// the rate is reached exactly while an admitted `try_acquire` costs one cheap clock read and
/// one CAS, and the bound above holds in real time but for one case, by choice: a call
/// admitted when the limiter was idle starts its span at the cheap reading, up to `resolution`
/// before now, so a window may hold up to `rate × resolution` permits more (the property test
/// of settled costs allows exactly that on its lagging clock). A precise reading for every
/// call that finds the limiter idle would close it at 4.5 times the cost of such a call
/// (docs/client.md, "Time").
/// `wait` and `reserve` use the precise clock.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <stop_token>
#include <thread>

#include "doorman/limit/clock.hpp"
#include "doorman/limit/limiter_base.hpp"

namespace doorman {

/// Options of a rate limiter, with their defaults.
struct rate_limiter_options {
  double rate = -1;  ///< permits per second; < 0 unlimited, 0 blocked
  double burst = 1;  ///< permits an idle limiter admits at once (>= 1; smaller values are 1)
};

/// The rate limiter on clock `Clock`, which must be steady; `rate_limiter` reads
/// `coarse_clock`. `Clock` is held by value, so a test can pass a handle to a manual clock.
template <class Clock>
class basic_rate_limiter : public detail::limiter_counters<16> {
 public:
  using clock_type = Clock;
  using duration = typename Clock::duration;
  using time_point = typename Clock::time_point;
  using acquire_result = basic_acquire_result<duration>;
  using reservation = basic_reservation<time_point>;
  using options_type = rate_limiter_options;

  explicit basic_rate_limiter(rate_limiter_options options = {}, Clock clock = Clock{})
      : clock_(std::move(clock)) {
    set_burst(options.burst);
    set_rate(options.rate);
  }

  basic_rate_limiter(const basic_rate_limiter&) = delete;
  basic_rate_limiter& operator=(const basic_rate_limiter&) = delete;

  /// Takes `n` permits if they are available now; never blocks. Thread-safe, lock-free. `n`
  /// above the burst is admitted once the burst is whole, and later calls wait out the debt;
  /// an `n` that is negative or not finite is refused (`duration::max()`), and not counted.
  acquire_result try_acquire(double n = 1) noexcept {
    if (!valid_permits(n)) return {false, duration::max()};
    this->count_attempt(n);
    const double interval = interval_.load(std::memory_order_relaxed);
    if (interval == 0) return {true, {}};
    if (std::isinf(interval)) {
      this->count_refusal();
      return {false, duration::max()};
    }
    const std::int64_t tolerance = tolerance_.load(std::memory_order_relaxed);
    const std::int64_t increment = increment_for(n, interval);
    const std::int64_t due = std::min(increment, tolerance);  // a larger call borrows the rest
    // The cheap clock first: it lags real time, so deciding with it never admits too early.
    // Only a refusal that the lag could explain is decided again on the precise clock.
    // The latest precise reading any thread took is a lower bound of the time too, and often a
    // later one: with it, one precise reading serves up to a burst of calls.
    std::int64_t now = std::max(ticks(clock_.now()), seen_.load(std::memory_order_relaxed));
    bool precise = !has_precise_clock;
    const std::int64_t refunded = refunds_.refunded();  // before the CAS: see refund_book
    std::int64_t tat = tat_.load(std::memory_order_relaxed);
    for (;;) {
      const std::int64_t base = std::max(tat, now);
      const std::int64_t late = base + due - now - tolerance;  // > 0: not due yet
      if (late > 0) {
        if (!precise && late <= lag_) {
          now = ticks(precise_now());
          seen_.store(now, std::memory_order_relaxed);
          precise = true;
          continue;
        }
        this->count_refusal();
        return {false, from_ticks(late)};
      }
      if (tat_.compare_exchange_weak(tat, base + increment, std::memory_order_relaxed))
        return {true, {}, detail::refund_book::slot(base + increment, refunded)};
    }
  }

  /// Reserves `n` permits: the time `at` which the caller may use them (now or later), and
  /// the reservation's slot (for `cancel_reservation` and `settle`). Reservations are served in
  /// the order they are made, and one larger than the burst is due when `try_acquire` would
  /// admit it. `at` is `time_point::max()` when blocked (rate 0) or when `n` is not a number
  /// of permits: nothing is reserved then. (`wait` and asynchronous waits build on it.)
  reservation reserve(double n = 1) noexcept {
    if (!valid_permits(n)) return {};
    this->count_attempt(n);
    return reserve_uncounted(n);
  }

  /// Blocks until `n` permits are admitted, first come first served (by reservation). While
  /// the limiter is blocked (rate 0) it waits for a rate change. A reservation already made
  /// keeps its time if the rate changes meanwhile. Returns the time the permits were due (the
  /// caller runs at most a scheduling delay after it).
  time_point wait(double n = 1) { return wait_until_admitted(n, std::stop_token{}); }

  /// `wait` that gives up when `stop` is requested: whether the permits were admitted. A
  /// caller stopped while its reservation was still ahead gives it back
  /// (`cancel_reservation`), so a stopped wait consumes nothing. False at once when `n` is not
  /// a number of permits (`valid_permits`).
  bool wait(double n, std::stop_token stop) {
    return wait_until_admitted(n, stop) != time_point::max();
  }

  /// Drops a reservation of `n` permits (`reserve`) whose time is still ahead: the caller
  /// will not use them (a cancelled wait). Reservations made since keep their times. Its time
  /// goes back to the schedule as a refund does (`settle`): all of it when no reservation was
  /// made after it, else none (the permits are lost, never given twice). Whether it was
  /// dropped: false once its time has come (the permits count as used).
  bool cancel_reservation(double n, const reservation& r) noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    if (!(interval > 0) || std::isinf(interval)) return false;
    const std::int64_t now = ticks(precise_now());
    if (ticks(r.at) <= now) return false;
    refunds_.give_back(tat_, r.slot, increment_for(n, interval), now, now);
    return true;
  }

  /// Settles a call admitted for `reserved` permits (by `try_acquire` or `reserve`, whose
  /// `slot` it passes) that turned out to use `used`. A call that used more runs the limiter
  /// into debt by the difference (later calls wait until it is repaid at the rate, as after a
  /// call larger than the burst). One that used less gives back what of the difference no one
  /// else holds: the part of its span still ahead of now (time passed was the call's), from
  /// anywhere in the schedule when no reservation is waiting, else only when no call came after
  /// it; a call open across a change of rate gives nothing back. So over any window W at most
  /// `rate·W + burst` permits are used, plus what the calls settled at its end used above their
  /// reservations. A use above the reservation counts as attempted (the demand measured grows
  /// by it); a refund does not lower what was attempted (the counters only grow). False,
  /// changing nothing, when either is not a number of permits (`valid_permits`). Unlimited or
  /// blocked: nothing to move in time (true).
  bool settle(double reserved, double used, std::int64_t slot) noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    // A time already passed (the cheap clock, or the latest precise reading) serves a refund,
    // whose floor it only lowers, and a debt on a limiter busy past it; a debt on a limiter
    // idle within the cheap clock's lag counts from the precise time, so none is forgiven.
    const auto now = [this](std::int64_t tat, bool debt) {
      std::int64_t t = std::max(ticks(clock_.now()), seen_.load(std::memory_order_relaxed));
      if (has_precise_clock && debt && tat < t + lag_) {
        t = ticks(precise_now());
        seen_.store(t, std::memory_order_relaxed);
      }
      return t;
    };
    return this->settle_schedule(tat_, refunds_, slot, interval, reserved, used, now,
                                 [&](double n) { return increment_for(n, interval); });
  }

  /// `settle` of a call whose slot is unknown: its debt only (a use below the reservation
  /// gives nothing back).
  bool settle(double reserved, double used) noexcept {
    return settle(reserved, used, acquire_result::no_slot);
  }

  /// Changes the rate, at once: a limiter that was idle holds at most `burst` permits at the
  /// new rate; reservations already made keep their times. Wakes waiters blocked at rate 0.
  void set_rate(double rate) noexcept {
    const double interval = detail::interval_of(rate);
    const double old = interval_.exchange(interval, std::memory_order_relaxed);
    update_steps();
    refunds_.rescale(tat_, old, interval, ticks(precise_now()));
    notify_change();
  }

  /// Changes the burst (values below 1 become 1).
  void set_burst(double burst) noexcept {
    burst_.store(std::isfinite(burst) ? std::max(1.0, burst) : 1.0, std::memory_order_relaxed);
    update_steps();
  }

  /// The rate: permits per second, < 0 unlimited, 0 blocked.
  [[nodiscard]] double rate() const noexcept {
    return detail::rate_of(interval_.load(std::memory_order_relaxed));
  }

  [[nodiscard]] double burst() const noexcept { return burst_.load(std::memory_order_relaxed); }

  /// Where the limiter stands: `limit` is the burst, `remaining` the permits admitted at once
  /// now, `reset` the time until the whole burst is back. Rate < 0: limit and remaining −1;
  /// rate 0: both 0, reset `nanoseconds::max()`.
  [[nodiscard]] limit_status status() const noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    if (interval == 0) return {-1, -1, {}};
    if (std::isinf(interval)) return {0, 0, std::chrono::nanoseconds::max()};
    const double burst = burst_.load(std::memory_order_relaxed);
    const std::int64_t debt =
        std::max<std::int64_t>(0, tat_.load(std::memory_order_relaxed) - ticks(precise_now()));
    return {burst, std::max(0.0, burst - static_cast<double>(debt) / interval),
            std::chrono::nanoseconds{debt}};
  }

  /// How long after its last use the limiter is as a new one (what `keyed_limiter` waits
  /// before it may forget a key): the burst's span.
  [[nodiscard]] std::chrono::nanoseconds memory_span() const noexcept {
    return std::chrono::nanoseconds{tolerance_.load(std::memory_order_relaxed)};
  }

  /// The bytes the limiter occupies (it allocates nothing).
  [[nodiscard]] static constexpr std::size_t memory_bytes() noexcept {
    return sizeof(basic_rate_limiter);
  }

  [[nodiscard]] const Clock& clock() const noexcept { return clock_; }

 private:
  // The hot path's integers, derived from the rate and the burst.
  void update_steps() noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    step_.store(to_ticks(interval), std::memory_order_relaxed);
    tolerance_.store(to_ticks(burst_.load(std::memory_order_relaxed) * interval),
                     std::memory_order_relaxed);
  }

  // The span n permits take at `interval` (the precomputed step for the common n = 1).
  std::int64_t increment_for(double n, double interval) const noexcept {
    return n == 1 ? step_.load(std::memory_order_relaxed) : to_ticks(n * interval);
  }

  reservation reserve_uncounted(double n) noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    const std::int64_t now = ticks(precise_now());
    if (interval == 0) return {from_tick_point(now)};
    if (std::isinf(interval)) {
      this->count_delay();
      return {};
    }
    const std::int64_t tolerance = tolerance_.load(std::memory_order_relaxed);
    const std::int64_t increment = increment_for(n, interval);
    const std::int64_t due = std::min(increment, tolerance);  // as try_acquire admits it
    const std::int64_t refunded = refunds_.refunded();
    std::int64_t tat = tat_.load(std::memory_order_relaxed);
    std::int64_t base = 0;
    do {
      base = std::max(tat, now);
      refunds_.reserving(base + due - tolerance);  // published before the CAS (release)
    } while (!tat_.compare_exchange_weak(tat, base + increment, std::memory_order_release,
                                         std::memory_order_relaxed));
    const std::int64_t slot = detail::refund_book::slot(base + increment, refunded);
    if (base + due - tolerance > now) {
      this->count_delay();
      return {from_tick_point(base + due - tolerance), slot};
    }
    return {from_tick_point(now), slot};
  }

  // The one waiting loop of both `wait` forms: the time the permits were due, or max when
  // `stop` was requested first (then nothing is consumed: a reservation still ahead is given
  // back, unless its time came meanwhile).
  time_point wait_until_admitted(double n, const std::stop_token& stop) {
    if (!valid_permits(n)) return time_point::max();
    this->count_attempt(n);
    for (;;) {
      if (stop.stop_requested()) return time_point::max();
      const std::uint32_t seen = changes_.seen();
      const reservation r = reserve_uncounted(n);
      if (r.at != time_point::max()) {
        return sleep_until(r.at, stop) || !cancel_reservation(n, r) ? r.at : time_point::max();
      }
      changes_.wait(seen, stop);
    }
  }

  bool sleep_until(time_point at, const std::stop_token& stop) const {
    return detail::sleep_until([this] { return precise_now(); }, at, stop);
  }

  void notify_change() noexcept { changes_.notify(); }

  static constexpr bool has_precise_clock = requires(const Clock& c) {
    { c.precise_now() } -> std::same_as<time_point>;
    { c.resolution() } -> std::same_as<duration>;
  };

  time_point precise_now() const noexcept {
    if constexpr (has_precise_clock) {
      return clock_.precise_now();
    } else {
      return clock_.now();
    }
  }

  static std::int64_t lag_of(const Clock& c) noexcept {
    if constexpr (has_precise_clock) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(c.resolution()).count();
    } else {
      return 0;
    }
  }

  // The state counts nanoseconds since the clock's epoch.
  static std::int64_t ticks(time_point t) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }
  static time_point from_tick_point(std::int64_t t) noexcept {
    return time_point{std::chrono::duration_cast<duration>(std::chrono::nanoseconds{t})};
  }
  static duration from_ticks(std::int64_t t) noexcept {
    return std::chrono::duration_cast<duration>(std::chrono::nanoseconds{t});
  }
  static std::int64_t to_ticks(double ns) noexcept { return detail::schedule_span(ns); }
  [[no_unique_address]] Clock clock_;
  std::int64_t lag_ = lag_of(clock_);  // how far clock_.now() may lag precise_now()
  // Read-mostly configuration on one cache line, the contended state on another.
  alignas(64) std::atomic<double> interval_{0};
  std::atomic<double> burst_{1};
  std::atomic<std::int64_t> step_{0};       // nanoseconds per permit
  std::atomic<std::int64_t> tolerance_{0};  // burst × step
  alignas(64) std::atomic<std::int64_t> tat_{std::numeric_limits<std::int64_t>::min() / 2};
  // The latest precise reading (any thread's): a time already passed, so never ahead of now.
  std::atomic<std::int64_t> seen_{std::numeric_limits<std::int64_t>::min() / 2};
  detail::refund_book refunds_;
  detail::change_signal changes_;
};

/// The rate limiter on the cheap monotonic clock.
using rate_limiter = basic_rate_limiter<coarse_clock>;

/// A lease's capacity put into a rate limiter, as a client's rate resource does with each new
/// capacity: the rate, and (`auto_burst`: no burst configured) a burst of a tenth of a
/// second's worth, at least 1. `Limiter`: a `basic_rate_limiter` or an `any_rate_limiter`.
template <class Limiter>
void apply_capacity(Limiter& limiter, double capacity, bool auto_burst = true) noexcept {
  if (auto_burst) limiter.set_burst(std::max(1.0, capacity * 0.1));
  limiter.set_rate(capacity);
}

}  // namespace doorman
