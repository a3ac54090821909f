#pragma once

/// \file
/// An elected master's term, sans-I/O: when to renew the election's lease, how long a renewal
/// may take, and until when this task's mastership is certainly valid by its own monotonic
/// clock. That last instant, `valid_until()`, fences every decision (`basic_engine::
/// set_valid_until`): a task paused past it steps down before it answers what queued up.
///
/// Why the deadline is safe (docs/high-availability.md): the lock service (etcd) expires a
/// lease `ttl` after the last renewal it received, and that renewal was sent no earlier than
/// `sent`; so, on any clock that runs at the lock service's rate, the lease holds at least until
/// `sent + ttl`, and no other task can win before then. The term ends `margin()` earlier
/// (ttl / 10, at least 100 ms): no two masters grant at once while the two clocks' rates differ
/// by less than a tenth.
///
///     doorman::election_term<clock::time_point> term(std::chrono::seconds(10));
///     const auto sent = clock::now();
///     if (renewed) term.confirmed(sent); else if (lease_gone) term.lost();
///     engine.set_valid_until(term.valid_until());

#include <algorithm>
#include <chrono>

namespace doorman {

template <class TimePoint>
class election_term {
 public:
  using time_point = TimePoint;
  using duration = typename TimePoint::duration;

  /// A term with no validity yet, for a lease of `ttl`.
  explicit election_term(duration ttl) noexcept : ttl_(ttl) {}

  /// The lease's TTL, as the lock service granted it.
  [[nodiscard]] duration ttl() const noexcept { return ttl_; }
  void set_ttl(duration ttl) noexcept { ttl_ = ttl; }

  /// How much earlier than the lease could expire the term ends.
  [[nodiscard]] duration margin() const noexcept {
    return std::max<duration>(ttl_ / 10, std::chrono::milliseconds(100));
  }

  /// The time between two renewal rounds (ttl / 5, at least 50 ms): four more chances to renew
  /// before the term could end.
  [[nodiscard]] duration period() const noexcept {
    return std::max<duration>(ttl_ / 5, std::chrono::milliseconds(50));
  }

  /// A renewal (or the grant) sent at `sent` was confirmed: the term runs until `sent + ttl -
  /// margin()`, never less than it already did.
  void confirmed(time_point sent) noexcept {
    valid_until_ = std::max(valid_until_, sent + ttl_ - margin());
  }

  /// The lease is gone (expired, revoked, or another task holds the key): no validity left.
  void lost() noexcept { valid_until_ = time_point::min(); }

  /// Mastership is certainly valid before this instant and not at or after it.
  [[nodiscard]] time_point valid_until() const noexcept { return valid_until_; }

  /// Whether the term is valid at `now`.
  [[nodiscard]] bool valid(time_point now) const noexcept { return now < valid_until_; }

  /// The deadline of a renewal round begun at `sent`: one period, and for a master whose term
  /// is still running never past its end (the master must learn in time that it cannot renew;
  /// the decisions are fenced by `valid_until()` whatever the round does).
  [[nodiscard]] time_point round_deadline(time_point sent, bool master) const noexcept {
    const time_point full = sent + period();
    return master && valid_until_ > sent ? std::min(full, valid_until_) : full;
  }

  /// When the next round begins after one that ended at `now`: a period later when the lock
  /// service answered, a quarter of one when it did not.
  [[nodiscard]] time_point next_round(time_point now, bool answered) const noexcept {
    return now + (answered ? period() : period() / 4);
  }

 private:
  duration ttl_;
  time_point valid_until_ = time_point::min();
};

}  // namespace doorman
