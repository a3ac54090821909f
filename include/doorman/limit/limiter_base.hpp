#pragma once

/// \file
/// What the local rate algorithms share: the outcome of `try_acquire`, a limiter's status (for
/// `RateLimit-*` headers), the clock helpers, the demand and refusal counters, and the one
/// sleeping loop of their `wait`s. Each algorithm keeps its state in nanoseconds since its
/// clock's epoch.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>
#include <stop_token>
#include <thread>

namespace doorman {

/// The outcome of `try_acquire`.
template <class Duration>
struct basic_acquire_result {
  bool admitted = false;
  /// When refused: how long until the same request would be admitted (for a `Retry-After`);
  /// with `coarse_clock`, possibly overstated by up to its resolution (never understated).
  /// `Duration::max()` when the limiter is blocked (rate 0), when `n` is not a number of
  /// permits (`valid_permits`), or, for the algorithms that cannot borrow (all but GCRA), when
  /// the request is larger than they ever admit at once.
  Duration retry_after{};
  /// When admitted by an algorithm that keeps a schedule (GCRA, the leaky bucket): the call's
  /// place in it, to pass to `settle` so that a call that used less than it took can give back
  /// the part of its time no later call holds. `no_slot` otherwise.
  std::int64_t slot = no_slot;

  explicit operator bool() const noexcept { return admitted; }

  /// A slot that gives nothing back: `settle` with it only runs debts.
  static constexpr std::int64_t no_slot = std::numeric_limits<std::int64_t>::min();
};

/// A reservation (`reserve`): the time `at` its permits are due (`TimePoint::max()` when
/// nothing was reserved) and its `slot`, for `cancel_reservation` and `settle`.
template <class TimePoint>
struct basic_reservation {
  TimePoint at = TimePoint::max();
  std::int64_t slot = basic_acquire_result<typename TimePoint::duration>::no_slot;
};

/// Where a limiter stands, in its own terms (what `RateLimit-Limit`, `RateLimit-Remaining`
/// and `RateLimit-Reset` report).
struct limit_status {
  double limit = 0;                  ///< permits per window (the burst, for GCRA); < 0 unlimited
  double remaining = 0;              ///< permits that would be admitted now
  std::chrono::nanoseconds reset{};  ///< until `remaining` is back to `limit`, if unused
};

/// Whether `n` is a number of permits a limiter takes: finite and not negative. Anything else
/// is refused, never admitted and never counted as demand.
[[nodiscard]] constexpr bool valid_permits(double n) noexcept {
  return n >= 0 && n <= std::numeric_limits<double>::max();
}

namespace detail {

/// A small number per thread, in order of first use: the stripe a thread counts in.
inline unsigned thread_slot() noexcept {
  static std::atomic<unsigned> next{0};
  thread_local const unsigned slot = next.fetch_add(1, std::memory_order_relaxed);
  return slot;
}

/// "Never": the wait of a request that cannot be admitted as things stand.
inline constexpr std::int64_t never = std::numeric_limits<std::int64_t>::max();

/// A clock `C` with a cheap `now()` that lags a `precise_now()` by at most `resolution()`.
template <class C>
concept two_speed_clock = requires(const C& c) {
  { c.precise_now() } -> std::same_as<typename C::time_point>;
  { c.resolution() } -> std::same_as<typename C::duration>;
};

/// Nanoseconds since `Clock`'s epoch, and back.
template <class Clock>
struct ticks_of {
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  static std::int64_t point(time_point t) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }
  static time_point to_point(std::int64_t t) noexcept {
    return time_point{std::chrono::duration_cast<duration>(std::chrono::nanoseconds{t})};
  }
  static duration to_duration(std::int64_t t) noexcept {
    if (t == never) return duration::max();
    return std::chrono::duration_cast<duration>(std::chrono::nanoseconds{t});
  }
  static time_point precise(const Clock& c) noexcept {
    if constexpr (two_speed_clock<Clock>) {
      return c.precise_now();
    } else {
      return c.now();
    }
  }
  static std::int64_t lag(const Clock& c) noexcept {
    if constexpr (two_speed_clock<Clock>) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(c.resolution()).count();
    } else {
      return 0;
    }
  }
};

/// The two algorithms that keep a schedule (GCRA's theoretical arrival time, the leaky bucket's
/// next departure) count a rate as nanoseconds per permit: 0 unlimited (a rate < 0), infinity
/// blocked (a rate of 0, or not a number).
[[nodiscard]] inline double interval_of(double rate) noexcept {
  if (rate == 0 || std::isnan(rate)) return std::numeric_limits<double>::infinity();
  return rate > 0 ? 1e9 / rate : 0.0;
}

/// The rate of `interval` (`interval_of` backwards): < 0 unlimited, 0 blocked.
[[nodiscard]] inline double rate_of(double interval) noexcept {
  if (interval == 0) return -1;
  if (std::isinf(interval)) return 0;
  return 1e9 / interval;
}

/// A span of `ns` nanoseconds as the schedules keep it: saturated to [0, 10^18] (~31 years), so
/// that a huge request cannot overflow the state (and 0 for not a number).
[[nodiscard]] inline std::int64_t schedule_span(double ns) noexcept {
  return static_cast<std::int64_t>(std::min(1e18, std::max(0.0, ns)));
}

/// A schedule `t` (the time it is next free) after its interval went from `old` to `interval`
/// at `now`: the permits already taken beyond now are kept in permits, not in time, so a faster
/// rate applies at once and a slower one is not escaped. Nothing moves from or to unlimited or
/// blocked. Returns the value it replaced (`now` when it moved nothing).
inline std::int64_t rescale_schedule(std::atomic<std::int64_t>& t, double old, double interval,
                                     std::int64_t now) noexcept {
  if (!(old > 0 && interval > 0 && std::isfinite(old) && std::isfinite(interval)) ||
      old == interval) {
    return now;
  }
  std::int64_t at = t.load(std::memory_order_relaxed);
  while (at > now && !t.compare_exchange_weak(
                         at, now + schedule_span(static_cast<double>(at - now) * interval / old),
                         std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
  return std::max(at, now);
}

/// Permits in thousandths, the unit the counting algorithms keep (so that sums are exact);
/// clamped to [0, 10^12] permits.
inline std::uint64_t to_milli(double n) noexcept {
  if (!(n > 0)) return 0;
  return static_cast<std::uint64_t>(std::min(n, 1e12) * 1000.0 + 0.5);
}

/// Permits asked for, in thousandths, striped by thread: a thread with a stripe of its own adds
/// with a plain load and store (no locked instruction on the hot path); the threads beyond the
/// stripes share the last one with fetch_add.
template <unsigned Stripes>
class demand_counter {
 public:
  void add(double n) noexcept {
    const std::uint64_t m = to_milli(n);
    const unsigned slot = thread_slot();
    if (slot < Stripes - 1) {
      auto& v = stripes_[slot].value;
      v.store(v.load(std::memory_order_relaxed) + m, std::memory_order_relaxed);
    } else {
      stripes_[Stripes - 1].value.fetch_add(m, std::memory_order_relaxed);
    }
  }
  [[nodiscard]] double total() const noexcept {
    std::uint64_t sum = 0;
    for (const auto& s : stripes_)
      sum += s.value.load(std::memory_order_relaxed);
    return static_cast<double>(sum) / 1000.0;
  }

 private:
  struct alignas(Stripes > 1 ? 64 : 8) stripe {
    std::atomic<std::uint64_t> value{0};
  };
  stripe stripes_[Stripes]{};
};

/// A test-and-test-and-set lock for a few-word critical section (BasicLockable).
class spin_lock {
 public:
  void lock() noexcept {
    for (unsigned spins = 0;; ++spins) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

/// What a schedule (GCRA's theoretical arrival time, the leaky bucket's next departure) may
/// give back when a call used less than it took, and the bookkeeping that makes it safe.
///
/// Each call holds a span of the schedule, its slot, which ends where the schedule stood after
/// it; every call admitted later holds a span after it, and uses its permits no later than its
/// span begins. Over any window W the permits used are then at most what fits in W plus the
/// tolerance (`rate·W + burst`), and a refund keeps that bound when it gives back only time no
/// one uses: at most the call's unused span, and none of it before now (time already passed
/// was held). Moving the schedule's end back by g moves every later span back by g, which each
/// of them can take while it still begins after the time its permits were used: true of every
/// call already admitted when g ≤ (the call's end − now), not of a reservation due later.
/// Hence the rule: a refund gives min(unused span, end − now), and only from the schedule's
/// tail while any reservation is still ahead of now.
///
/// A slot is the call's end plus the refunds made before it (`refunded()`, read before the
/// call's compare-and-swap); the refunds made since, which may have moved it back, are taken
/// off when it settles, so the end a refund assumes is never later than the real one. A rate
/// change counts the whole schedule ahead of now as refunded, so a call open across it gives
/// nothing back. Refunds take a short lock among themselves (admissions never do).
class refund_book {
 public:
  /// The refunds so far: read before an admission's compare-and-swap, to make its slot.
  [[nodiscard]] std::int64_t refunded() const noexcept {
    return refunded_.load(std::memory_order_acquire);
  }

  /// The slot of a call whose span ends at `end`, `refunded` having been read before it.
  [[nodiscard]] static std::int64_t slot(std::int64_t end, std::int64_t refunded) noexcept {
    return end + refunded;
  }

  /// Before a reservation's compare-and-swap (made with release): its permits are due at `due`.
  void reserving(std::int64_t due) noexcept {
    std::int64_t seen = reserved_until_.load(std::memory_order_relaxed);
    while (seen < due &&
           !reserved_until_.compare_exchange_weak(seen, due, std::memory_order_relaxed)) {
    }
  }

  /// Gives back up to `span` of the call at `slot` to the schedule `t`, `lo` and `hi` bounding
  /// now from below and above: what the rule above allows (0 for `no_slot`). Returns it.
  std::int64_t give_back(std::atomic<std::int64_t>& t, std::int64_t slot, std::int64_t span,
                         std::int64_t lo, std::int64_t hi) noexcept {
    if (slot == std::numeric_limits<std::int64_t>::min() || span <= 0) return 0;
    const std::lock_guard lock(lock_);
    const std::int64_t refunded = refunded_.load(std::memory_order_relaxed);
    const std::int64_t end = slot - refunded;  // never later than the call's span really ends
    if (end <= hi) return 0;
    const std::int64_t give = std::min(span, end - hi);
    std::int64_t at = t.load(std::memory_order_acquire);
    for (;;) {
      // Read after the schedule: a reservation in it has published its due time.
      const bool ahead = reserved_until_.load(std::memory_order_relaxed) > lo;
      if (ahead && at != end) return 0;
      if (t.compare_exchange_weak(at, at - give, std::memory_order_acq_rel,
                                  std::memory_order_acquire)) {
        break;
      }
    }
    refunded_.store(refunded + give, std::memory_order_release);
    return give;
  }

  /// `rescale_schedule(t, old, interval, now)` (a new rate), with every call open across it
  /// giving nothing back: the schedule ahead of now that it moved counts as refunded.
  void rescale(std::atomic<std::int64_t>& t, double old, double interval,
               std::int64_t now) noexcept {
    const std::lock_guard lock(lock_);
    const std::int64_t before = rescale_schedule(t, old, interval, now);
    if (before > now) {
      refunded_.store(refunded_.load(std::memory_order_relaxed) + (before - now),
                      std::memory_order_release);
    }
  }

 private:
  std::atomic<std::int64_t> refunded_{0};
  std::atomic<std::int64_t> reserved_until_{std::numeric_limits<std::int64_t>::min()};
  spin_lock lock_;
};

/// The demand and hold-back counters every rate algorithm keeps, and their readings: the
/// algorithms derive from it, so these are part of their public surface.
template <unsigned Stripes>
class limiter_counters {
 public:
  /// Permits asked for so far, admitted or not (what the demand estimator samples).
  [[nodiscard]] double attempted() const noexcept { return attempted_.total(); }

  /// `try_acquire` calls refused (for the leaky bucket, also waits refused by a full queue).
  [[nodiscard]] std::uint64_t refused() const noexcept {
    return refused_.load(std::memory_order_relaxed);
  }

  /// Waits that had to wait for their permits or found the limiter blocked: callers held
  /// back, whose attempts per second understate their demand.
  [[nodiscard]] std::uint64_t delayed() const noexcept {
    return delayed_.load(std::memory_order_relaxed);
  }

  /// Both of the above: every request the limiter held back.
  [[nodiscard]] std::uint64_t throttled() const noexcept { return refused() + delayed(); }

 protected:
  void count_attempt(double n) noexcept { attempted_.add(n); }
  void count_refusal() noexcept { refused_.fetch_add(1, std::memory_order_relaxed); }
  void count_delay() noexcept { delayed_.fetch_add(1, std::memory_order_relaxed); }

  /// `settle(reserved, used, slot)` for a limiter whose state is the time `t` its schedule is
  /// next free (GCRA's theoretical arrival time, the leaky bucket's next departure), at
  /// `interval` ns per permit: false for a number that is not one of permits; the use above the
  /// reservation counted as attempted; `t` moved later by `span(used − reserved)` (a debt,
  /// counted from `now(t, true)` when the schedule was already free), or `refunds` gives back
  /// what it safely can of `span(reserved − used)` (`refund_book::give_back`). Unlimited or
  /// blocked: nothing to move (true).
  template <class Now, class Span>
  bool settle_schedule(std::atomic<std::int64_t>& t, refund_book& refunds, std::int64_t slot,
                       double interval, double reserved, double used, Now now, Span span) noexcept {
    if (!valid_permits(reserved) || !valid_permits(used)) return false;
    if (used > reserved) count_attempt(used - reserved);
    if (!(interval > 0) || std::isinf(interval) || used == reserved) return true;
    if (used < reserved) {
      // Now from below (the cheap clock) and from above (the precise one).
      const std::int64_t lo = now(std::numeric_limits<std::int64_t>::max(), false);
      const std::int64_t hi = now(std::numeric_limits<std::int64_t>::min(), true);
      refunds.give_back(t, slot, span(reserved - used), lo, hi);
      return true;
    }
    std::int64_t at = t.load(std::memory_order_relaxed);
    const std::int64_t from = now(at, true);
    const std::int64_t shift = span(used - reserved);
    while (!t.compare_exchange_weak(at, std::max(at, from) + shift, std::memory_order_relaxed)) {
    }
    return true;
  }

 private:
  demand_counter<Stripes> attempted_;
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> delayed_{0};
};

/// Sleeps until `precise()` reaches `at`; whether it did before `stop` was requested. Without
/// a stop that can be requested, a plain sleep.
template <class Precise, class TimePoint>
bool sleep_until(const Precise& precise, TimePoint at, const std::stop_token& stop) {
  if (!stop.stop_possible()) {
    for (auto now = precise(); now < at; now = precise())
      std::this_thread::sleep_for(at - now);
    return true;
  }
  std::mutex m;
  std::condition_variable_any cv;
  std::unique_lock lock(m);
  for (auto now = precise(); now < at; now = precise()) {
    cv.wait_for(lock, stop, at - now, [] { return false; });
    if (stop.stop_requested()) return false;
  }
  return true;
}

/// Wakes callers blocked while a limiter is blocked (rate 0) when its rate changes.
class change_signal {
 public:
  [[nodiscard]] std::uint32_t seen() const noexcept {
    return changes_.load(std::memory_order_acquire);
  }
  void notify() noexcept {
    changes_.fetch_add(1, std::memory_order_release);
    changes_.notify_all();
  }
  /// Blocks until a change after `seen`, or until `stop` is requested.
  void wait(std::uint32_t seen, const std::stop_token& stop) {
    const std::stop_callback wake(stop, [this] { notify(); });
    if (stop.stop_requested()) return;
    changes_.wait(seen, std::memory_order_acquire);
  }

 private:
  std::atomic<std::uint32_t> changes_{0};
};

}  // namespace detail

}  // namespace doorman
