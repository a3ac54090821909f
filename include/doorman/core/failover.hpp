#pragma once

/// \file
/// Where and when a channel connects (sans-I/O): the addresses of a tree position, the one in
/// use, the move to the next one when a connection fails, hangs or is refused, redirects to
/// the master, and one jittered, capped backoff for every way of failing. `net::channel` only
/// drives it; the simulator drives the same machine.
///
///     doorman::failover<time_point> f({"10.0.0.7:7700", "10.0.0.8:7700"}, {});
///     if (now >= f.connect_at()) connect(f.current());   // else wait until then
///     f.answered();                                      // a real answer came
///     f.failed(now, failure::hung);                      // or: the call's deadline passed
///
/// Every failure moves to the next address. Once every address has failed in a row (a round),
/// the next attempt waits a backoff: `backoff.initial` doubling per round up to
/// `backoff.maximum`, each delay jittered in [½, 1] of its step. Only an answer on a
/// connection resets the rounds: a node that accepts and closes at once (over its connection
/// limit, a refused certificate, plaintext to a TLS port) is a failure like a refused connect,
/// so a refused client backs off instead of reconnecting thousands of times a second. A refusal
/// that names a retry delay is honoured as a floor.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "doorman/core/backoff.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// How a connection failed, for the log and the counters (every kind moves on and counts
/// toward the backoff).
enum class failure : std::uint8_t {
  unreachable,  ///< the connect (or TLS handshake) failed or timed out
  closed,       ///< closed by the peer before any answer (refused after accept)
  lost,         ///< broke after answers had come
  hung,         ///< a call's deadline passed without an answer: the peer is hung or cut off
  refused,      ///< an explicit refusal (over the connection limit), maybe with a retry delay
  no_master,    ///< a non-master that knows no master: an election is under way
};

/// Options of the failover machine, with their defaults.
struct failover_options {
  backoff_options backoff{seconds(0.05), seconds(5)};  ///< after each failed round
  std::uint64_t seed = 0x0fa1'10e7;                    ///< of the jitter
};

template <class TimePoint>
class failover {
 public:
  using time_point = TimePoint;
  using duration = typename TimePoint::duration;

  /// Throws `std::invalid_argument` when `addresses` is empty.
  failover(std::vector<std::string> addresses, failover_options options)
      : addresses_(std::move(addresses)), backoff_(options.backoff, options.seed) {
    if (addresses_.empty()) throw std::invalid_argument("failover: no addresses");
  }

  /// Every address known: the configured ones, then masters learned from redirects.
  [[nodiscard]] const std::vector<std::string>& addresses() const noexcept { return addresses_; }

  /// The address to connect to (or connected to).
  [[nodiscard]] const std::string& current() const noexcept { return addresses_[current_]; }

  /// The earliest time of the next connection attempt.
  [[nodiscard]] time_point connect_at() const noexcept { return connect_at_; }

  /// When a call that began at `start`, with deadline `deadline`, makes its next attempt: at
  /// `connect_at()`, except that its first attempt (`first`) waits out the backoff only until
  /// halfway to its deadline. A refresh's deadline is bounded by half the lease time left
  /// (`refresh_schedule::call_timeout`), so a peer back within the backoff is reached while a
  /// lease still runs; each call makes at most one attempt early, so the caller's own pacing
  /// (the refresh schedule's backoff) bounds them. A retry delay the peer asked for is kept.
  /// `time_point::max()`: no attempt before the deadline.
  [[nodiscard]] time_point attempt_at(time_point start, time_point deadline,
                                      bool first) const noexcept {
    time_point at = connect_at_;
    if (first && deadline > start)
      at = std::min(at, std::max(start + (deadline - start) / 2, floor_until_));
    return at >= deadline ? time_point::max() : at;
  }

  /// Failures in a row since the last answer.
  [[nodiscard]] std::uint32_t failures() const noexcept { return failures_; }

  /// An answer came (a result or an error answer): the peer is alive, so the rounds of
  /// failures start again from zero, and a refusal's retry delay is forgotten. A connection
  /// that merely came up is not a success: one closed before any answer is a failure.
  void answered() noexcept {
    failures_ = 0;
    retry_floor_ = duration::zero();
    dead_.assign(dead_.size(), false);
  }

  /// The connection (or the attempt) failed at `now`: move to the next address, after a
  /// backoff once a whole round has failed. `retry_after`: a delay the peer asked for (a
  /// floor for the next attempt at any address, and for every later failure's wait until an
  /// answer comes: a call that times out just after connecting must not undo it).
  ///
  /// A non-master that knows no master (`failure::no_master`) is alive but of no use now: it
  /// may be cut from the election while another address already is the master, or a standby
  /// while an election is under way. It is left for the next address that has not failed
  /// otherwise since the last answer (hung, refused, unreachable): so a tree leaves a master cut
  /// from etcd, yet does not go back to a paused master from the standby that will replace
  /// it. When every other address has failed otherwise, it is kept.
  void failed(time_point now, failure why, seconds retry_after = seconds(0)) {
    last_ = why;
    ++failures_;
    const std::size_t n = addresses_.size();
    dead_.resize(n);
    if (why != failure::no_master) {
      dead_[current_] = true;
      current_ = (current_ + 1) % n;
    } else {
      for (std::size_t k = 1; k < n; ++k) {
        if (!dead_[(current_ + k) % n]) {
          current_ = (current_ + k) % n;
          break;
        }
      }
    }
    duration wait = duration::zero();
    if (failures_ % n == 0) {
      const auto rounds = std::min<std::size_t>(failures_ / n, 31);
      wait = to_duration<duration>(backoff_.delay(static_cast<int>(rounds)).count());
    }
    retry_floor_ =
        std::max(retry_floor_, to_duration<duration>(std::clamp(retry_after.count(), 0.0, 300.0)));
    connect_at_ = now + std::max(wait, retry_floor_);
    floor_until_ = now + retry_floor_;
  }

  /// A non-master named `master` as the master: go there next, at once (the rounds of
  /// failures are kept, so a redirect loop to a dead address still backs off). A master not
  /// among the addresses is added.
  void redirected(const std::string& master, time_point now) {
    auto it = std::find(addresses_.begin(), addresses_.end(), master);
    if (it == addresses_.end()) {
      addresses_.push_back(master);
      it = addresses_.end() - 1;
    }
    current_ = static_cast<std::size_t>(it - addresses_.begin());
    connect_at_ = std::max(connect_at_, now);
  }

  /// A non-master that knows no master: `failed(now, failure::no_master)`.
  void no_master(time_point now) { failed(now, failure::no_master); }

  /// The kind of the last failure.
  [[nodiscard]] failure last_failure() const noexcept { return last_; }

 private:
  std::vector<std::string> addresses_;
  std::size_t current_ = 0;
  std::uint32_t failures_ = 0;
  failure last_ = failure::unreachable;
  time_point connect_at_{};
  duration retry_floor_{};    // the longest retry delay asked for since the last answer
  time_point floor_until_{};  // the last failure + retry_floor_: no attempt before, ever
  std::vector<bool> dead_;    // per address: failed other than no_master since the last answer
  jittered_backoff backoff_;
};

}  // namespace doorman
