#pragma once

/// \file
/// The refresh schedule (sans-I/O): when a requester (a client, or an intermediate node facing
/// its parent) should send its next request, given the answers and failures so far. It holds
/// every timing rule the two share, once: the floor between two requests, the idle interval,
/// the jittered exponential backoff, and "retry within half the time left on a lease". The
/// client state (`basic_client_state`) and the upstream (`basic_upstream`) each own one and
/// add what differs: what a request holds, and how an answer sets the next interval.
///
///     doorman::refresh_schedule<time_point> s({.minimum_interval = seconds(1)});
///     if (s.due(now, news)) { s.sent(now); ... }             // a request goes out
///     s.answered(now, interval);                             // next one after `interval`
///     s.failed(now, earliest_expiry);                        // or after a backoff
///     timer.expires_at(s.next_request(news));
///
/// "News" is the requester's: something it should tell soon (a resource not asked for yet, or
/// capacity given back that the parent waits for). With news and no failure, the next request
/// is due as soon as the floor since the previous one has passed.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "doorman/core/backoff.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// The timing rules of a refresh schedule, with the client's defaults (the upstream's differ:
/// see `upstream_options`).
struct refresh_options {
  seconds minimum_interval{1};       ///< the floor between two requests
  seconds idle_interval{16};         ///< how often to ask when no answer says otherwise
  backoff_options backoff{};         ///< after failures: 0.5 s doubling up to 15 s, jittered
  std::uint64_t seed = 0xc11e'0175;  ///< of the jitter; fixed, so that a simulation repeats
};

/// What an answer or a failure changed, for the requester's log.
enum class refresh_event {
  none,
  reached,   ///< the first answer
  lost,      ///< the first failure after answers
  regained,  ///< the first answer after failures
};

/// What a driver should do next: send a request now, or wait until `at` and look again.
template <class TimePoint>
struct refresh_step {
  bool send = false;
  TimePoint at = TimePoint::max();
};

/// The schedule. `TimePoint` is the clock's (steady in production, manual in tests and the
/// simulator); the schedule never reads a clock.
template <class TimePoint>
class refresh_schedule {
 public:
  using time_point = TimePoint;
  using duration = typename TimePoint::duration;

  explicit refresh_schedule(const refresh_options& options) noexcept
      : floor_(options.minimum_interval.count()),
        idle_(options.idle_interval.count()),
        backoff_(options.backoff, options.seed) {}

  /// When the next request is due: after the interval set by the last answer or failure, or
  /// (with news and no failure) as soon as the floor since the previous request has passed.
  [[nodiscard]] time_point next_request(bool news) const noexcept {
    if (news && failures_ == 0) return std::min(next_, last_request_ + floor());
    return next_;
  }

  /// Whether a request should go out at `now`; never while one is in flight.
  [[nodiscard]] bool due(time_point now, bool news) const noexcept {
    return !in_flight_ && now >= next_request(news);
  }

  /// A request went out at `now`: in flight until `answered` or `failed`.
  void sent(time_point now) noexcept {
    last_request_ = now;
    in_flight_ = true;
  }

  /// The answer came at `now` and asks for the next request after `interval` seconds (infinite:
  /// nothing said, so the idle interval); never sooner than the floor.
  refresh_event answered(time_point now, double interval) noexcept {
    in_flight_ = false;
    if (!std::isfinite(interval)) interval = idle_;
    interval_ = std::max(interval, floor_);
    next_ = now + to_duration<duration>(interval_);
    const refresh_event e = !answered_      ? refresh_event::reached
                            : failures_ > 0 ? refresh_event::regained
                                            : refresh_event::none;
    answered_ = true;
    failures_ = 0;
    return e;
  }

  /// The request failed at `now` (no answer, an error answer, an answer not to be used): retry
  /// after the backoff of this many consecutive failures, but within half the time left until
  /// `earliest_expiry` (of the leases still held), so that a peer back in time is reached
  /// before a lease runs out, and never later than the interval of the last answer (a failing
  /// requester asks no more often than a served one, and a healed link is used within one
  /// interval); never sooner than the floor.
  refresh_event failed(time_point now, time_point earliest_expiry) noexcept {
    in_flight_ = false;
    ++failures_;
    double delay = std::min(backoff_.delay(failures_).count(), interval_);
    if (earliest_expiry > now) delay = std::min(delay, to_seconds(earliest_expiry - now) / 2);
    next_ = now + to_duration<duration>(std::max(floor_, delay));
    return failures_ == 1 && answered_ ? refresh_event::lost : refresh_event::none;
  }

  /// How long a request sent at `now` may wait for its answer: `configured`, but no more than
  /// half the time left until `earliest_expiry` (of the leases held), so that a peer that
  /// hangs is given up in time to ask the next address before a lease runs out; never less
  /// than a quarter second (or `configured`, when that is less).
  [[nodiscard]] static seconds call_timeout(time_point now, time_point earliest_expiry,
                                            seconds configured) noexcept {
    if (earliest_expiry <= now || earliest_expiry == time_point::max()) return configured;
    const double half = to_seconds(earliest_expiry - now) / 2;
    return seconds(std::min(configured.count(), std::max(half, 0.25)));
  }

  /// Makes the next request due at `now`, ahead of the floor and of the interval the last
  /// answer set (once: the next answer sets the schedule again). Nothing while a request is in
  /// flight (its answer sets the schedule) or after failures (the backoff stands).
  void expedite(time_point now) noexcept {
    if (!in_flight_ && failures_ == 0) next_ = std::min(next_, now);
  }

  /// When the last request went out.
  [[nodiscard]] time_point last_request() const noexcept { return last_request_; }
  [[nodiscard]] bool in_flight() const noexcept { return in_flight_; }
  /// Consecutive failures so far.
  [[nodiscard]] int failures() const noexcept { return failures_; }
  /// Whether the last request was answered.
  [[nodiscard]] bool connected() const noexcept { return answered_ && failures_ == 0; }

 private:
  [[nodiscard]] duration floor() const noexcept { return to_duration<duration>(floor_); }

  double floor_;
  double idle_;
  double interval_ = idle_;  // set by the last answer
  jittered_backoff backoff_;
  time_point next_{};
  time_point last_request_{};
  int failures_ = 0;
  bool answered_ = false;
  bool in_flight_ = false;
};

}  // namespace doorman
