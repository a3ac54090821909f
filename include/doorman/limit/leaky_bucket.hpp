#pragma once

/// \file
/// A leaky bucket shaper: permits leave at a constant rate, one every 1/rate seconds, with no
/// burst; callers that `wait` queue first come, first served, and at most `queue` permits may
/// wait. A caller that would overflow the queue is refused at once.
///
///     doorman::leaky_bucket_limiter shaper({.rate = 50, .queue = 100});
///     if (!shaper.wait()) reply_429();           // queued: runs at most 50 per second
///     if (auto r = shaper.try_acquire(); !r) ... // admitted only when nobody is queued
///
/// The state is one 64-bit atomic, the time the queue drains (`next`); lock-free. Over any
/// window of length W at most rate × W + n permits leave (n: the largest request). Unlike a
/// token bucket, an idle shaper saves nothing up: it smooths load for a downstream that cannot
/// take bursts, at the cost of making callers wait up to `queue` / rate.
///
/// `rate` < 0 means unlimited, 0 blocked.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stop_token>

#include "doorman/limit/clock.hpp"
#include "doorman/limit/limiter_base.hpp"

namespace doorman {

/// Options of a leaky bucket, with their defaults.
struct leaky_bucket_options {
  double rate = -1;   ///< permits released per second; < 0 unlimited, 0 blocked
  double queue = 10;  ///< permits that may wait (>= 0; negative values are 0)
};

template <class Clock>
class basic_leaky_bucket_limiter : public detail::limiter_counters<1> {
 public:
  using clock_type = Clock;
  using duration = typename Clock::duration;
  using time_point = typename Clock::time_point;
  using acquire_result = basic_acquire_result<duration>;
  using reservation = basic_reservation<time_point>;
  using options_type = leaky_bucket_options;

  explicit basic_leaky_bucket_limiter(leaky_bucket_options options = {}, Clock clock = Clock{})
      : clock_(std::move(clock)) {
    set_queue(options.queue);
    set_rate(options.rate);
  }

  basic_leaky_bucket_limiter(const basic_leaky_bucket_limiter&) = delete;
  basic_leaky_bucket_limiter& operator=(const basic_leaky_bucket_limiter&) = delete;

  /// Takes `n` permits if nobody is queued and the previous permits have left; never blocks.
  acquire_result try_acquire(double n = 1) noexcept {
    this->count_attempt(n);
    const double interval = interval_.load(std::memory_order_relaxed);
    if (interval == 0) return {true, {}};
    if (std::isinf(interval)) return refuse(detail::never);
    std::int64_t now = ticks::point(clock_.now());
    bool precise = lag_ == 0;
    const std::int64_t refunded = refunds_.refunded();  // before the CAS: see refund_book
    std::int64_t next = next_.load(std::memory_order_relaxed);
    for (;;) {
      if (next > now) {
        if (!precise && next - now <= lag_) {
          now = ticks::point(ticks::precise(clock_));
          precise = true;
          continue;
        }
        return refuse(next - now);
      }
      const std::int64_t end = now + span(n, interval);
      if (next_.compare_exchange_weak(next, end, std::memory_order_relaxed))
        return {true, {}, detail::refund_book::slot(end, refunded)};
    }
  }

  /// Queues for `n` permits: the time `at` they leave (now or later) and the reservation's
  /// slot (for `cancel_reservation` and `settle`); `at` is `time_point::max()` when the queue
  /// is full or the shaper is blocked (nothing is queued then).
  reservation reserve(double n = 1) noexcept {
    this->count_attempt(n);
    return reserve_uncounted(n);
  }

  /// Drops `n` permits queued (`reserve`) whose time is still ahead (a cancelled wait): the
  /// callers queued behind keep their times. Its place goes back as `rate_limiter`'s does:
  /// only when no one queued after it. False once its time has come (the permits count as
  /// used).
  bool cancel_reservation(double n, const reservation& r) noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    if (!(interval > 0) || std::isinf(interval)) return false;
    const std::int64_t now = ticks::point(ticks::precise(clock_));
    if (ticks::point(r.at) <= now) return false;
    refunds_.give_back(next_, r.slot, span(n, interval), now, now);
    return true;
  }

  /// Settles a call admitted for `reserved` permits (its `slot` from `try_acquire` or
  /// `reserve`) that turned out to use `used`, as `rate_limiter::settle` does: more moves the
  /// permits queued after it later by the difference (a debt; later callers leave later), less
  /// gives back what of the difference no one holds (the part of its span still ahead, and
  /// only when no one queued after it). A use above the reservation counts as attempted. False,
  /// changing nothing, when either is not a number of permits; unlimited or blocked: true.
  bool settle(double reserved, double used, std::int64_t slot) noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    return this->settle_schedule(
        next_, refunds_, slot, interval, reserved, used,
        [this](std::int64_t, bool) { return ticks::point(ticks::precise(clock_)); },
        [interval](double n) { return span(n, interval); });
  }

  /// `settle` of a call whose slot is unknown: its debt only.
  bool settle(double reserved, double used) noexcept {
    return settle(reserved, used, acquire_result::no_slot);
  }

  /// Queues for `n` permits and blocks until they leave: true then; false when the queue was
  /// full, or `stop` was requested first (a stopped wait gives its place back). While the
  /// shaper is blocked (rate 0) it waits for a rate change.
  bool wait(double n = 1, std::stop_token stop = {}) {
    this->count_attempt(n);
    for (;;) {
      if (stop.stop_requested()) return false;
      const std::uint32_t seen = changes_.seen();
      const reservation r = reserve_uncounted(n);
      if (r.at != time_point::max()) {
        return detail::sleep_until([this] { return ticks::precise(clock_); }, r.at, stop) ||
               !cancel_reservation(n, r);
      }
      if (!std::isinf(interval_.load(std::memory_order_relaxed))) return false;  // full
      changes_.wait(seen, stop);
    }
  }

  /// Changes the rate at once; permits already queued keep their place, at the new spacing.
  void set_rate(double rate) noexcept {
    const double interval = detail::interval_of(rate);
    const double old = interval_.exchange(interval, std::memory_order_relaxed);
    refunds_.rescale(next_, old, interval, ticks::point(ticks::precise(clock_)));
    changes_.notify();
  }

  /// Changes how many permits may wait.
  void set_queue(double queue) noexcept {
    queue_.store(std::isfinite(queue) ? std::max(0.0, queue) : 0.0, std::memory_order_relaxed);
  }

  /// A shaper has no burst; accepted for a uniform surface, ignored.
  void set_burst(double) noexcept {}

  [[nodiscard]] double rate() const noexcept {
    return detail::rate_of(interval_.load(std::memory_order_relaxed));
  }
  [[nodiscard]] double queue() const noexcept { return queue_.load(std::memory_order_relaxed); }

  /// `limit` is the queue's size, `remaining` its free places, `reset` the time it drains.
  [[nodiscard]] limit_status status() const noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    if (interval == 0) return {-1, -1, {}};
    if (std::isinf(interval)) return {0, 0, std::chrono::nanoseconds::max()};
    const double q = queue();
    const std::int64_t ahead = std::max<std::int64_t>(
        0, next_.load(std::memory_order_relaxed) - ticks::point(ticks::precise(clock_)));
    return {q, std::max(0.0, q - static_cast<double>(ahead) / interval),
            std::chrono::nanoseconds{ahead}};
  }

  /// How long after its last use the shaper is as a new one (its queue drained).
  [[nodiscard]] std::chrono::nanoseconds memory_span() const noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    if (!(interval > 0) || std::isinf(interval)) return {};
    return std::chrono::nanoseconds{to_ns((queue() + 1) * interval)};
  }

  [[nodiscard]] static constexpr std::size_t memory_bytes() noexcept {
    return sizeof(basic_leaky_bucket_limiter);
  }

  [[nodiscard]] const Clock& clock() const noexcept { return clock_; }

 private:
  using ticks = detail::ticks_of<Clock>;

  acquire_result refuse(std::int64_t wait) noexcept {
    this->count_refusal();
    return {false, ticks::to_duration(wait)};
  }

  reservation reserve_uncounted(double n) noexcept {
    const double interval = interval_.load(std::memory_order_relaxed);
    const std::int64_t now = ticks::point(ticks::precise(clock_));
    if (interval == 0) return {ticks::to_point(now)};
    if (std::isinf(interval)) {
      this->count_delay();
      return {};
    }
    const std::int64_t room = to_ns(queue() * interval);
    const std::int64_t s = span(n, interval);
    const std::int64_t refunded = refunds_.refunded();
    std::int64_t next = next_.load(std::memory_order_relaxed);
    std::int64_t at = 0;
    do {
      at = std::max(next, now);
      if (at - now > room) {
        this->count_refusal();
        return {};
      }
      refunds_.reserving(at);  // published before the CAS (release)
    } while (!next_.compare_exchange_weak(next, at + s, std::memory_order_release,
                                          std::memory_order_relaxed));
    if (at > now) this->count_delay();
    return {ticks::to_point(at), detail::refund_book::slot(at + s, refunded)};
  }

  static std::int64_t span(double n, double interval) noexcept { return to_ns(n * interval); }
  static std::int64_t to_ns(double ns) noexcept { return detail::schedule_span(ns); }

  [[no_unique_address]] Clock clock_;
  const std::int64_t lag_ = ticks::lag(clock_);
  std::atomic<double> interval_{0};  // nanoseconds per permit
  std::atomic<double> queue_{0};
  alignas(64) std::atomic<std::int64_t> next_{std::numeric_limits<std::int64_t>::min() / 2};
  detail::refund_book refunds_;
  detail::change_signal changes_;
};

using leaky_bucket_limiter = basic_leaky_bucket_limiter<coarse_clock>;

}  // namespace doorman
