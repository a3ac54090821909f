#pragma once

/// \file
/// Window limiters: at most `limit` permits per `window`, counted three ways.
///
///     doorman::fixed_window_limiter per_minute({.limit = 100, .window = 60s});
///     doorman::sliding_log_limiter exact({.limit = 100, .window = 60s});
///     doorman::sliding_window_limiter smooth({.limit = 100, .window = 60s, .sub_windows = 12});
///     if (auto r = exact.try_acquire(); !r) reply_429(r.retry_after);
///
/// - **Fixed window** counts the permits of the current aligned window (windows start at
///   multiples of `window` since the clock's epoch) and forgets them at its end: one 64-bit
///   atomic, lock-free. At most `limit` in each aligned window, so up to 2 × `limit` in a
///   window of the same length straddling an edge.
/// - **Sliding log** keeps the time of every admission for one window: exact (never more than
///   `limit` in any window of length `window`), and never refuses what an exact count would
///   admit. Memory: 16 bytes per distinct admission time in the window, at most
///   `max_log_entries` entries; beyond that the newest entry absorbs new permits and moves to
///   the present, which only delays their expiry (it may refuse early, never admit more).
/// - **Sliding window counter** keeps counts of `sub_windows` + 1 sub-windows and estimates
///   the sliding count as the newest `sub_windows` counts plus the oldest one weighted by the
///   part of it still inside the window (with 1 sub-window: the current window plus the
///   previous one × the uncovered fraction). In any window of length `window` it admits at
///   most `limit` + the count of one sub-window (at most `limit` + `limit` / `sub_windows`
///   when no sub-window takes more than its share). Memory: 8 bytes per sub-window.
///
/// The last two take a small spin lock around a few words; all three are thread-safe and have
/// the same surface as `rate_limiter` (`try_acquire`, `wait`, `set_rate`, `status`). A limit
/// < 0 means unlimited, 0 blocked; `set_rate(r)` sets the limit to r × window, so a
/// `rate_resource` can follow its lease with any of them. Permits count in thousandths; a limit
/// is at most 10^9 permits per window (larger values are clamped).
///
/// Time: the cheap clock decides; a refusal that its lag could explain is decided again on the
/// precise clock (as `rate_limiter` does), so window edges are seen when they come.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <stop_token>
#include <vector>

#include "doorman/limit/clock.hpp"
#include "doorman/limit/limiter_base.hpp"

namespace doorman {

/// Options of a window limiter, with their defaults.
struct window_limiter_options {
  double limit = -1;  ///< permits per window; < 0 unlimited, 0 blocked; at most 10^9
  std::chrono::nanoseconds window = std::chrono::seconds(1);  ///< at least 1 ms
  unsigned sub_windows = 1;                                   ///< sliding window counter: 1 to 1024
  std::size_t max_log_entries = 4096;                         ///< sliding log: 16 to 2^24
};

namespace detail {

inline constexpr std::uint64_t max_window_milli = 1'000'000'000'000ull;  // 10^9 permits

inline std::int64_t window_ns(std::chrono::nanoseconds w) noexcept {
  return std::max<std::int64_t>(w.count(), 1'000'000);
}

// floor(a / b) for b > 0.
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  return a / b - ((a % b != 0) && (a < 0));
}

/// Fixed window: [window number mod 2^24 | count in thousandths, 40 bits] in one atomic.
class fixed_window_policy {
 public:
  static constexpr bool lock_free = true;

  explicit fixed_window_policy(const window_limiter_options& o) : window_(window_ns(o.window)) {}

  void set_limit(std::uint64_t milli) noexcept { limit_.store(milli, std::memory_order_relaxed); }

  std::int64_t admit(std::int64_t now, std::uint64_t m) noexcept {
    const std::uint64_t limit = limit_.load(std::memory_order_relaxed);
    if (m > limit) return never;
    const std::int64_t w = floor_div(now, window_);
    std::uint64_t s = state_.load(std::memory_order_relaxed);
    for (;;) {
      const auto [current, count] = view(s, w);
      if (count + m > limit) return std::max<std::int64_t>(1, (current + 1) * window_ - now);
      if (state_.compare_exchange_weak(s, pack(current, count + m), std::memory_order_relaxed))
        return 0;
    }
  }

  std::uint64_t used(std::int64_t now) const noexcept {
    return view(state_.load(std::memory_order_relaxed), floor_div(now, window_)).count;
  }
  std::int64_t reset(std::int64_t now) const noexcept {
    const auto v = view(state_.load(std::memory_order_relaxed), floor_div(now, window_));
    return v.count == 0 ? 0 : (v.window + 1) * window_ - now;
  }
  std::int64_t span() const noexcept { return window_; }
  std::size_t dynamic_bytes() const noexcept { return 0; }

 private:
  static constexpr int count_bits = 40;
  static constexpr std::uint64_t count_mask = (std::uint64_t{1} << count_bits) - 1;
  static constexpr std::uint64_t number_mask = (std::uint64_t{1} << 24) - 1;

  struct window_count {
    std::int64_t window;
    std::uint64_t count;
  };

  // The window the state counts, seen from window `w`: the same one, an older one (then its
  // count no longer applies), or a newer one that a thread with a later clock reading started
  // (then it is the current window: a late reading must not reset it).
  static window_count view(std::uint64_t s, std::int64_t w) noexcept {
    const std::uint64_t stored = s >> count_bits;
    const std::uint64_t behind = (static_cast<std::uint64_t>(w) - stored) & number_mask;
    if (behind == 0) return {w, s & count_mask};
    if (behind >= (number_mask + 1) / 2)
      return {w + static_cast<std::int64_t>(number_mask + 1 - behind), s & count_mask};
    return {w, 0};
  }
  static std::uint64_t pack(std::int64_t w, std::uint64_t count) noexcept {
    return ((static_cast<std::uint64_t>(w) & number_mask) << count_bits) | count;
  }

  const std::int64_t window_;
  std::atomic<std::uint64_t> limit_{0};
  std::atomic<std::uint64_t> state_{0};
};

/// Sliding log: (time, permits) of each admission in the window, oldest first.
class sliding_log_policy {
 public:
  static constexpr bool lock_free = false;

  explicit sliding_log_policy(const window_limiter_options& o)
      : window_(window_ns(o.window)),
        max_entries_(std::clamp<std::size_t>(o.max_log_entries, 16, std::size_t{1} << 24)) {}

  void set_limit(std::uint64_t milli) noexcept { limit_ = milli; }

  std::int64_t admit(std::int64_t now, std::uint64_t m) {
    expire(now);
    if (m > limit_) return never;
    if (total_ + m <= limit_) {
      record(now, m);
      return 0;
    }
    // Wait for enough of the oldest permits to leave the window.
    const std::uint64_t excess = total_ + m - limit_;
    std::uint64_t freed = 0;
    for (const auto& e : log_) {
      freed += e.count;
      if (freed >= excess) return std::max<std::int64_t>(1, e.time + window_ - now);
    }
    return never;  // (unreachable: the log holds total_)
  }

  std::uint64_t used(std::int64_t now) {
    expire(now);
    return total_;
  }
  std::int64_t reset(std::int64_t now) {
    expire(now);
    return log_.empty() ? 0 : log_.back().time + window_ - now;
  }
  std::int64_t span() const noexcept { return window_; }
  std::size_t dynamic_bytes() const noexcept { return log_.size() * sizeof(entry); }

 private:
  struct entry {
    std::int64_t time;
    std::uint64_t count;
  };

  void expire(std::int64_t now) {
    while (!log_.empty() && log_.front().time <= now - window_) {
      total_ -= log_.front().count;
      log_.pop_front();
    }
  }

  void record(std::int64_t now, std::uint64_t m) {
    total_ += m;
    if (!log_.empty() && (log_.back().time >= now || log_.size() >= max_entries_)) {
      // The same time (or a full log): the newest entry takes the permits, at the later time.
      log_.back().time = std::max(log_.back().time, now);
      log_.back().count += m;
      return;
    }
    log_.push_back({now, m});
  }

  const std::int64_t window_;
  const std::size_t max_entries_;
  std::uint64_t limit_ = 0;
  std::uint64_t total_ = 0;
  std::deque<entry> log_;
};

/// Sliding window counter: counts of the last k + 1 sub-windows (a ring), the estimate being
/// the newest k (kept summed, so a decision is O(1) in k) plus the oldest weighted by the part
/// of it still in the window.
class sliding_window_policy {
 public:
  static constexpr bool lock_free = false;

  explicit sliding_window_policy(const window_limiter_options& o)
      : k_(std::clamp(o.sub_windows, 1u, 1024u)),
        sub_(std::max<std::int64_t>(window_ns(o.window) / k_, 1)),
        counts_(k_ + 1, 0) {}

  void set_limit(std::uint64_t milli) noexcept { limit_ = milli; }

  std::int64_t admit(std::int64_t now, std::uint64_t m) {
    if (m > limit_) return never;
    now = advance(now);
    if (estimate(now) + static_cast<double>(m) <= static_cast<double>(limit_)) {  // (fits)
      counts_[slot(newest_)] += m;
      whole_ += m;
      return 0;
    }
    return until_fits(now, m);
  }

  std::uint64_t used(std::int64_t now) {
    return static_cast<std::uint64_t>(std::ceil(estimate(advance(now))));
  }
  std::int64_t reset(std::int64_t now) {
    now = advance(now);
    // Back to zero once the newest non-empty sub-window has left the window.
    for (std::int64_t j = 0; j <= static_cast<std::int64_t>(k_); ++j) {
      if (counts_[slot(newest_ - j)] != 0) return (newest_ - j + 1 + k_) * sub_ - now;
    }
    return 0;
  }
  std::int64_t span() const noexcept { return sub_ * (k_ + 1); }
  std::size_t dynamic_bytes() const noexcept { return counts_.capacity() * sizeof(std::uint64_t); }

 private:
  std::size_t slot(std::int64_t sub) const noexcept {
    return static_cast<std::size_t>(floor_mod(sub, static_cast<std::int64_t>(k_ + 1)));
  }
  static std::int64_t floor_mod(std::int64_t a, std::int64_t b) noexcept {
    return a - floor_div(a, b) * b;
  }

  // Moves the ring to `now`'s sub-window, clearing the ones it skips; a reading older than the
  // newest sub-window (another thread's later one came first) counts as its start.
  std::int64_t advance(std::int64_t now) {
    const std::int64_t s = floor_div(now, sub_);
    if (s < newest_) return newest_ * sub_;
    if (s - newest_ > static_cast<std::int64_t>(k_)) {
      std::fill(counts_.begin(), counts_.end(), 0);
      whole_ = 0;
    } else {
      // Each new sub-window takes the slot of the one that leaves the window, and the one
      // that becomes the oldest leaves the newest k.
      for (std::int64_t x = newest_ + 1; x <= s; ++x) {
        counts_[slot(x)] = 0;
        whole_ -= counts_[slot(x - static_cast<std::int64_t>(k_))];
      }
    }
    newest_ = s;
    return now;
  }

  // The estimate at `now` (in the newest sub-window), in thousandths.
  double estimate(std::int64_t now) const noexcept {
    return weighted(whole_, counts_[slot(newest_ - k_)], now - newest_ * sub_);
  }

  // The newest sub-windows' count plus the oldest's, weighted by the part of it still inside
  // the window `into` nanoseconds into the current sub-window.
  double weighted(std::uint64_t whole, std::uint64_t oldest, std::int64_t into) const noexcept {
    const double covered = static_cast<double>(into) / static_cast<double>(sub_);
    return static_cast<double>(whole) + static_cast<double>(oldest) * (1.0 - covered);
  }
  bool fits(std::uint64_t whole, std::uint64_t oldest, std::int64_t into,
            std::uint64_t m) const noexcept {
    return weighted(whole, oldest, into) + static_cast<double>(m) <= static_cast<double>(limit_);
  }

  // Until `m` fits, with no admission meanwhile: the oldest sub-window's weight falls to 0
  // across the current sub-window; then the next oldest becomes the oldest, and so on.
  std::int64_t until_fits(std::int64_t now, std::uint64_t m) const noexcept {
    const double room = static_cast<double>(limit_ - m);
    std::uint64_t whole = whole_;
    for (std::int64_t step = 0; step <= static_cast<std::int64_t>(k_); ++step) {
      const std::int64_t cur = newest_ + step;
      const std::uint64_t oldest = counts_[slot(cur - static_cast<std::int64_t>(k_))];
      if (step > 0) whole -= oldest;  // it left the newest k
      const std::int64_t start = std::max(now, cur * sub_);
      if (static_cast<double>(whole) <= room) {
        if (oldest == 0) return std::max<std::int64_t>(1, start - now);
        // whole + oldest × (1 − f) <= room  ⇔  f >= 1 − (room − whole) / oldest; then the
        // first nanosecond at which `admit`'s own arithmetic agrees.
        const double f = 1.0 - (room - static_cast<double>(whole)) / static_cast<double>(oldest);
        std::int64_t at = std::max(
            start, cur * sub_ + static_cast<std::int64_t>(f * static_cast<double>(sub_)) - 2);
        while (!fits(whole, oldest, at - cur * sub_, m))
          ++at;
        return std::max<std::int64_t>(1, at - now);
      }
    }
    return std::max<std::int64_t>(1, (newest_ + k_ + 1) * sub_ - now);
  }

  const unsigned k_;
  const std::int64_t sub_;  // nanoseconds per sub-window
  std::uint64_t limit_ = 0;
  std::int64_t newest_ = 0;  // the newest sub-window's number
  std::uint64_t whole_ = 0;  // the newest k sub-windows' counts, summed
  std::vector<std::uint64_t> counts_;
};

// No lock, for a policy that is itself thread-safe.
struct no_lock {
  void lock() noexcept {}
  void unlock() noexcept {}
};

}  // namespace detail

/// A window limiter on clock `Clock` counting with `Policy` (one of the three above);
/// use the aliases below. The demand counter (`attempted`) has `Stripes` cache lines, one per
/// thread for the first ones: 16 keeps one limiter shared by many threads fast (each line
/// 64 bytes); 1 makes a compact limiter for one per key (`keyed_limiter`).
template <class Policy, class Clock, unsigned Stripes = 16>
class basic_window_limiter : public detail::limiter_counters<Stripes> {
 public:
  using clock_type = Clock;
  using duration = typename Clock::duration;
  using time_point = typename Clock::time_point;
  using acquire_result = basic_acquire_result<duration>;
  using options_type = window_limiter_options;

  explicit basic_window_limiter(window_limiter_options options = {}, Clock clock = Clock{})
      : clock_(std::move(clock)), window_(detail::window_ns(options.window)), policy_(options) {
    set_limit(options.limit);
  }

  basic_window_limiter(const basic_window_limiter&) = delete;
  basic_window_limiter& operator=(const basic_window_limiter&) = delete;

  /// Takes `n` permits if they fit now; never blocks. Thread-safe.
  acquire_result try_acquire(double n = 1) noexcept {
    this->count_attempt(n);
    const std::int64_t wait = decide(n);
    if (wait == 0) return {true, {}};
    this->count_refusal();
    return {false, ticks::to_duration(wait)};
  }

  /// `try_acquire` for a caller already counted (a retried asynchronous wait): neither its
  /// demand nor a refusal is counted again.
  acquire_result try_again(double n = 1) noexcept {
    const std::int64_t wait = decide(n);
    return {wait == 0, wait == 0 ? duration{} : ticks::to_duration(wait)};
  }

  /// Blocks until `n` permits are admitted, retrying when the refusal said they would fit
  /// (not first come, first served: a new caller may take them first). Returns false when
  /// `stop` was requested first, or when `n` exceeds the limit (it never fits); while the
  /// limiter is blocked it waits for a rate change. A wait takes permits only when admitted.
  bool wait(double n = 1, std::stop_token stop = {}) {
    this->count_attempt(n);
    bool counted = false;
    for (;;) {
      if (stop.stop_requested()) return false;
      const std::uint32_t seen = changes_.seen();
      const std::int64_t wait = decide(n);
      if (wait == 0) return true;
      if (!counted) this->count_delay();
      counted = true;
      if (wait != detail::never) {
        const time_point at = ticks::precise(clock_) + ticks::to_duration(wait);
        if (!detail::sleep_until([this] { return ticks::precise(clock_); }, at, stop)) return false;
      } else if (limit_milli_.load(std::memory_order_relaxed) == 0) {
        changes_.wait(seen, stop);
      } else {
        return false;
      }
    }
  }

  /// Sets the limit per window (< 0 unlimited, 0 blocked); what was counted stays counted.
  void set_limit(double limit) noexcept {
    std::uint64_t milli = unlimited;
    if (std::isnan(limit) || limit == 0) {
      milli = 0;
    } else if (limit > 0) {
      milli = std::clamp<std::uint64_t>(detail::to_milli(limit), 1, detail::max_window_milli);
    }
    {
      const std::lock_guard lock(lock_);
      policy_.set_limit(milli == unlimited ? 0 : milli);
      limit_milli_.store(milli, std::memory_order_relaxed);
    }
    changes_.notify();
  }

  /// Sets the limit to `rate` permits per second × the window (< 0 unlimited, 0 blocked): how
  /// a `rate_resource` applies its lease.
  void set_rate(double rate) noexcept {
    set_limit(rate > 0 ? rate * static_cast<double>(window_) / 1e9 : rate);
  }

  /// The burst of a window limiter is its limit; accepted for a uniform surface, ignored.
  void set_burst(double) noexcept {}

  /// The limit per window: < 0 unlimited, 0 blocked.
  [[nodiscard]] double limit() const noexcept {
    const std::uint64_t milli = limit_milli_.load(std::memory_order_relaxed);
    return milli == unlimited ? -1 : static_cast<double>(milli) / 1000.0;
  }
  /// The limit per second (limit / window): < 0 unlimited, 0 blocked.
  [[nodiscard]] double rate() const noexcept {
    const double l = limit();
    return l > 0 ? l * 1e9 / static_cast<double>(window_) : l;
  }
  [[nodiscard]] std::chrono::nanoseconds window() const noexcept {
    return std::chrono::nanoseconds{window_};
  }

  /// The limit, the permits that would be admitted now, and the time until the count is back
  /// to zero if nothing more is admitted (for a fixed window, the end of the current one).
  [[nodiscard]] limit_status status() noexcept {
    const std::uint64_t milli = limit_milli_.load(std::memory_order_relaxed);
    if (milli == unlimited) return {-1, -1, {}};
    const std::int64_t now = ticks::point(ticks::precise(clock_));
    const std::lock_guard lock(lock_);
    const std::uint64_t used = policy_.used(now);
    return {static_cast<double>(milli) / 1000.0,
            static_cast<double>(milli - std::min(used, milli)) / 1000.0,
            std::chrono::nanoseconds{std::max<std::int64_t>(0, policy_.reset(now))}};
  }

  /// How long after its last use the limiter is as a new one.
  [[nodiscard]] std::chrono::nanoseconds memory_span() const noexcept {
    return std::chrono::nanoseconds{policy_.span()};
  }

  /// The bytes the limiter occupies now, with what it allocated.
  [[nodiscard]] std::size_t memory_bytes() noexcept {
    const std::lock_guard lock(lock_);
    return sizeof(*this) + policy_.dynamic_bytes();
  }

  [[nodiscard]] const Clock& clock() const noexcept { return clock_; }

 private:
  using ticks = detail::ticks_of<Clock>;
  static constexpr std::uint64_t unlimited = ~std::uint64_t{0};

  // 0 when `n` permits were taken now; else nanoseconds until they would fit, or never.
  std::int64_t decide(double n) noexcept {
    const std::uint64_t milli = limit_milli_.load(std::memory_order_relaxed);
    if (milli == unlimited) return 0;
    if (milli == 0) return detail::never;
    const std::uint64_t m = detail::to_milli(n);
    std::int64_t wait = admit(ticks::point(clock_.now()), m);
    // The cheap clock lags: a refusal its lag could explain is decided on the precise clock.
    if (wait != 0 && wait != detail::never && wait <= lag_) {
      wait = admit(ticks::point(ticks::precise(clock_)), m);
    }
    return wait;
  }

  std::int64_t admit(std::int64_t now, std::uint64_t m) noexcept {
    const std::lock_guard lock(lock_);
    return policy_.admit(now, m);
  }

  using lock_type = std::conditional_t<Policy::lock_free, detail::no_lock, detail::spin_lock>;

  [[no_unique_address]] Clock clock_;
  const std::int64_t lag_ = ticks::lag(clock_);
  const std::int64_t window_;
  std::atomic<std::uint64_t> limit_milli_{0};
  [[no_unique_address]] lock_type lock_;
  Policy policy_;
  detail::change_signal changes_;
};

template <class Clock = coarse_clock, unsigned Stripes = 16>
using basic_fixed_window_limiter =
    basic_window_limiter<detail::fixed_window_policy, Clock, Stripes>;
template <class Clock = coarse_clock, unsigned Stripes = 16>
using basic_sliding_log_limiter = basic_window_limiter<detail::sliding_log_policy, Clock, Stripes>;
template <class Clock = coarse_clock, unsigned Stripes = 16>
using basic_sliding_window_limiter =
    basic_window_limiter<detail::sliding_window_policy, Clock, Stripes>;

using fixed_window_limiter = basic_fixed_window_limiter<>;
using sliding_log_limiter = basic_sliding_log_limiter<>;
using sliding_window_limiter = basic_sliding_window_limiter<>;

/// The compact forms, for a limiter per key (`keyed_limiter`, rules): one demand counter.
using compact_fixed_window_limiter = basic_fixed_window_limiter<coarse_clock, 1>;
using compact_sliding_log_limiter = basic_sliding_log_limiter<coarse_clock, 1>;
using compact_sliding_window_limiter = basic_sliding_window_limiter<coarse_clock, 1>;

}  // namespace doorman
