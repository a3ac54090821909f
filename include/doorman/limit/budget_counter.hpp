#pragma once

/// \file
/// A budget resource's count inside one process (docs/budgets.md): the units spent in the
/// root's current window against a ceiling that each allotment sets, shared by any number of
/// threads, lock-free. The client's refresh loop drives it (`grant`, `close`); callers take
/// units (`try_acquire`) and settle a call's real cost after it (`settle`).
///
///     doorman::budget_counter<> b;
///     b.grant({.units = 5000, .spent_at_send = 0, .expires = t + 30s});
///     const auto w = b.window();
///     if (b.try_acquire(estimate, clock::now())) { call(); b.settle(estimate, used, w); }
///
/// The ceiling is the spend the allotment allows in all: what the client had reported when it
/// asked, plus the units granted. `spent` only grows within a window, except by a refund
/// (`settle` below the reservation, of a call admitted in the same window: a call still open
/// when the root names a new window gives nothing back to the new one), and the report the
/// client sends never goes down (see `report`): what the root counted stays counted.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <stop_token>

#include "doorman/limit/clock.hpp"
#include "doorman/limit/limiter_base.hpp"

namespace doorman {

template <class Clock = coarse_clock>
class budget_counter {
 public:
  using clock = Clock;
  using time_point = typename Clock::time_point;

  /// An allotment as the driver applies it: `units` granted on the request sent when the
  /// report said `spent_at_send`; `new_window`: the root counts in a new window, where what
  /// was admitted since that report counts again (never under); `expires`: the lease's end.
  struct allotment {
    double units = 0;
    double spent_at_send = 0;
    bool new_window = false;
    time_point expires{};  ///< the lease's end, as the callers' clock reads it
  };

  budget_counter() = default;
  budget_counter(const budget_counter&) = delete;
  budget_counter& operator=(const budget_counter&) = delete;

  /// Takes `n` units if the allotment has them at `now` (true); else nothing. Never admits an
  /// `n` that is negative or not finite, nor anything once the allotment expired or while a
  /// settled debt is unpaid.
  [[nodiscard]] bool try_acquire(double n, time_point now) noexcept {
    if (!valid_permits(n)) return false;
    attempted_.fetch_add(n, std::memory_order_relaxed);
    return try_again(n, now) || refuse();
  }

  /// `try_acquire` again for a caller already counted (a waiter): neither its units nor a
  /// refusal count as demand again. Every operation is sequentially consistent: a waiter
  /// counts itself before it looks at the spend, and a grant or refund changes the spend before
  /// it reads the waiters, so no wake-up is lost (as in `gauge_limiter`).
  [[nodiscard]] bool try_again(double n, time_point now) noexcept {
    if (!(now < expires())) return false;
    double s = spent_.load();
    do {
      if (s + n > ceiling_.load()) return false;
    } while (!spent_.compare_exchange_weak(s, s + n));
    return true;
  }

  /// Blocks until `n` units are taken (true), or until `stop` is requested (false, nothing
  /// taken). Units come back with an allotment (`grant`) or a refund (`settle`); `now()`
  /// reads the callers' clock. False at once for an `n` that is negative or not finite.
  template <class Now>
  bool wait(double n, std::stop_token stop, Now now) {
    if (!valid_permits(n)) return false;
    if (try_acquire(n, now())) return true;
    waiting_.fetch_add(1);
    const std::stop_callback wake_on_stop(stop, [this] { notify(); });
    bool taken = false;
    for (;;) {
      const std::uint32_t seen = changes_.load();
      if (try_again(n, now())) {
        taken = true;
        break;
      }
      if (stop.stop_requested()) break;
      changes_.wait(seen);
    }
    waiting_.fetch_sub(1);
    return taken;
  }

  /// The window a call admitted now counts in: read it before `try_acquire` (or a wait) and
  /// pass it to `settle`. It changes when the root names a new window (`grant`).
  [[nodiscard]] std::uint64_t window() const noexcept { return window_.load(); }

  /// A call admitted for `reserved` units in `window` cost `used`: above the reservation the
  /// difference is spent too (a debt when it passes the ceiling: nothing is admitted until an
  /// allotment covers it); below, it is given back if `window` is still the counter's (a call
  /// admitted in a window the root has closed refunds nothing: its units were counted there,
  /// and the new window's count never went up for them). False, changing nothing, when either
  /// amount is not a finite number >= 0.
  bool settle(double reserved, double used, std::uint64_t window) noexcept {
    if (!valid_permits(reserved) || !valid_permits(used)) return false;
    if (used == reserved) return true;
    if (used > reserved) {
      attempted_.fetch_add(used - reserved, std::memory_order_relaxed);
      double s = spent_.load();
      while (!spent_.compare_exchange_weak(s, s + (used - reserved))) {
      }
      return true;
    }
    {
      // Under the driver's lock: a new window cannot begin between the check and the refund.
      const std::scoped_lock lock(window_lock_);
      if (window != window_.load()) return true;
      double s = spent_.load();
      while (!spent_.compare_exchange_weak(s, std::max(0.0, s - (reserved - used)))) {
      }
      refunded_ += reserved - used;
    }
    wake();
    return true;
  }

  /// What the allotment has left at `now` (0 once expired; negative: a debt).
  [[nodiscard]] double left(time_point now) const noexcept {
    if (!(now < expires())) return std::min(0.0, ceiling_.load() - spent_.load());
    return ceiling_.load() - spent_.load();
  }

  /// Units spent in the window, as this process counts them.
  [[nodiscard]] double spent() const noexcept { return spent_.load(); }

  /// Units asked for in all (admitted or not, and settled above their reservations): the
  /// demand the driver measures.
  [[nodiscard]] double attempted() const noexcept { return attempted_.load(); }

  /// Refusals in all (the driver's sign that its callers want more than they hold).
  [[nodiscard]] std::uint64_t refused() const noexcept { return refused_.load(); }

  // The driver's side: one thread.

  /// The spend to report: what was spent in the window, never less than a report before it
  /// (a refund after a report is not taken back from the root).
  [[nodiscard]] double report() noexcept {
    const std::scoped_lock lock(window_lock_);
    at_report_ = spent_.load();
    refunded_ = 0;
    reported_ = std::max(reported_, at_report_);
    return reported_;
  }

  /// Applies an allotment answering the last `report`. In a new window the count starts again
  /// from what was admitted since that report: refunds since then are not taken off it (they
  /// may be of calls the root counted in the window that ended), and a call admitted before
  /// the new window refunds nothing into it (`settle`).
  void grant(const allotment& a) noexcept {
    if (a.new_window) {
      close();
      const std::scoped_lock lock(window_lock_);
      double s = spent_.load();
      while (!spent_.compare_exchange_weak(s, std::max(0.0, s + refunded_ - at_report_))) {
      }
      window_.fetch_add(1);
      reported_ = at_report_ = refunded_ = 0;
      ceiling_.store(a.units);
    } else {
      ceiling_.store(a.spent_at_send + a.units);
    }
    expires_.store(a.expires.time_since_epoch().count());
    wake();
  }

  /// The allotment ended (expired unrenewed, or released): admits nothing more.
  void close() noexcept {
    expires_.store(std::numeric_limits<std::int64_t>::min());
    wake();  // (a waiter's stop is what ends its wait)
  }

 private:
  [[nodiscard]] time_point expires() const noexcept {
    return time_point(typename Clock::duration(expires_.load()));
  }
  void wake() noexcept {
    if (waiting_.load() != 0) notify();
  }
  void notify() noexcept {
    changes_.fetch_add(1);
    changes_.notify_all();
  }
  bool refuse() noexcept {
    refused_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  std::atomic<double> spent_{0};
  std::atomic<double> ceiling_{0};
  std::atomic<std::int64_t> expires_{std::numeric_limits<std::int64_t>::min()};
  std::atomic<double> attempted_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<int> waiting_{0};
  std::atomic<std::uint32_t> changes_{0};
  std::atomic<std::uint64_t> window_{0};
  detail::spin_lock window_lock_;  // a new window or a report against a refund; guards:
  double reported_ = 0;            // the last report
  double at_report_ = 0;           // the spend when it was made
  double refunded_ = 0;            // refunds since then
};

}  // namespace doorman
