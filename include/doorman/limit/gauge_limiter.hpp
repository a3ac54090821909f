#pragma once

/// \file
/// A gauge (concurrency) limiter: at most `limit` operations in flight, shared by any number of
/// threads.
///
///     doorman::gauge_limiter gauge(8);
///     {
///       doorman::gauge_guard held(gauge);  // blocks until one of the 8 slots is free
///       run_transaction();
///     }                                    // released here
///     if (gauge.try_acquire()) { ...; gauge.release(); }
///
/// Lowering the limit never revokes what is in flight; it admits no one until the count is
/// under the new limit. A limit < 0 means unlimited, 0 blocked; a fractional limit (a lease of
/// 12.5) admits its whole part.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stop_token>

namespace doorman {

class gauge_limiter {
 public:
  /// `limit` < 0: unlimited.
  explicit gauge_limiter(double limit = -1) noexcept { set_limit(limit); }

  gauge_limiter(const gauge_limiter&) = delete;
  gauge_limiter& operator=(const gauge_limiter&) = delete;

  /// Takes a slot if one is free now; never blocks. Lock-free.
  [[nodiscard]] bool try_acquire() noexcept {
    note_demand(1);
    return try_take();
  }

  /// Blocks until a slot is free, then takes it.
  void acquire() { (void)acquire(std::stop_token{}); }

  /// Blocks until a slot is free and takes it (true), or until `stop` is requested (false,
  /// nothing taken).
  bool acquire(std::stop_token stop) {
    if (try_acquire()) return true;
    waiting_.fetch_add(1);
    const std::stop_callback wake_on_stop(stop, [this] { notify(); });
    bool taken = false;
    for (;;) {
      const std::uint32_t seen = changes_.load(std::memory_order_acquire);
      if (try_take()) {
        taken = true;
        break;
      }
      if (stop.stop_requested()) break;
      note_demand(0);
      changes_.wait(seen, std::memory_order_acquire);
    }
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    return taken;
  }

  /// Gives a slot back (exactly once per successful acquire).
  void release() noexcept {
    in_flight_.fetch_sub(1);
    wake();
  }

  /// Changes the limit (a new lease). Wakes waiters when it grows.
  void set_limit(double limit) noexcept {
    std::int64_t l = -1;
    if (std::isnan(limit)) {
      l = 0;
    } else if (limit >= 0) {
      l = static_cast<std::int64_t>(std::floor(std::min(limit, 1e15)));
    }
    limit_.store(l);
    wake();
  }

  /// The limit: < 0 unlimited.
  [[nodiscard]] std::int64_t limit() const noexcept {
    return limit_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::int64_t in_flight() const noexcept {
    return in_flight_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::int64_t waiting() const noexcept {
    return waiting_.load(std::memory_order_relaxed);
  }

  /// The highest in flight + waiting (+ 1 for each refused `try_acquire`) since the previous
  /// call, which starts a new period at the current value: what the demand estimator samples.
  std::int64_t take_peak() noexcept {
    return peak_.exchange(in_flight() + waiting(), std::memory_order_relaxed);
  }

 private:
  // Everything is ordered (sequentially consistent; on x86 a CAS costs the same): a waiter
  // announces itself in
  // `waiting_` and then looks at `in_flight_` and `limit_`; a releaser changes those and then
  // looks at `waiting_`. One of the two always sees the other, so no wake-up is lost.
  bool try_take() noexcept {
    std::int64_t cur = in_flight_.load();
    for (;;) {
      const std::int64_t lim = limit_.load();
      if (lim >= 0 && cur >= lim) return false;
      if (in_flight_.compare_exchange_weak(cur, cur + 1)) return true;
    }
  }

  // Raises the peak to in flight + waiting + extra, without a write when it is not higher.
  void note_demand(std::int64_t extra) noexcept {
    const std::int64_t want = in_flight() + waiting() + extra;
    std::int64_t p = peak_.load(std::memory_order_relaxed);
    while (p < want && !peak_.compare_exchange_weak(p, want, std::memory_order_relaxed)) {
    }
  }

  void wake() noexcept {
    if (waiting_.load() != 0) notify();
  }

  void notify() noexcept {
    changes_.fetch_add(1);
    changes_.notify_all();
  }

  std::atomic<std::int64_t> in_flight_{0};
  std::atomic<std::int64_t> limit_{-1};
  std::atomic<std::int64_t> waiting_{0};
  std::atomic<std::int64_t> peak_{0};
  std::atomic<std::uint32_t> changes_{0};
};

/// Holds one slot of a gauge for its lifetime (blocking to get it).
class gauge_guard {
 public:
  explicit gauge_guard(gauge_limiter& g) : gauge_(&g) { g.acquire(); }
  gauge_guard(const gauge_guard&) = delete;
  gauge_guard& operator=(const gauge_guard&) = delete;
  ~gauge_guard() { gauge_->release(); }

 private:
  gauge_limiter* gauge_;
};

}  // namespace doorman
