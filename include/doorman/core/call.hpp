#pragma once

/// \file
/// One call to a tree position, start to end (sans-I/O): when to connect, when to send, how
/// long to wait out a backoff, where a redirect goes, when to give up and with what error. It
/// drives the position's `failover` machine; its driver only does what each action says and
/// reports what happened, as Boost.Redis's operations switch over their machines' actions.
///
///     doorman::call_machine<time_point> m(route, now, now + timeout, {});
///     auto a = m.resume(now, connection_up);
///     for (;;) switch (a.what) {
///       case kind::connect: a = connect_ok ? m.resume(now, true) : m.connect_failed(now); break;
///       case kind::wait:    sleep_until(a.until); a = m.resume(now, connection_up); break;
///       case kind::send:    ... a = m.answered(now, hint) / m.lost(now) / m.timed_out(now);
///       case kind::moved:   drop_connection(); a = m.resume(now, false); break;
///       case kind::done:    return the answer;
///       case kind::fail:    return the failure (a.error, a.message);
///     }
///
/// The sequence: while the connection is down, connect at `failover::attempt_at` (the call's
/// first attempt may cut a backoff short), or fail `unreachable` when no attempt fits before
/// the deadline; send once it is up; a connection lost before the answer is connected again
/// and the call sent again (calls are idempotent) while the deadline allows; no answer by the
/// deadline is `timed_out` (the peer is hung: the route moves on); an answer from a non-master
/// moves the route (to the master it names, or past it when it names none) and the call goes
/// on, at most `max_redirects` times and never past the deadline (`no_master`).

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "doorman/core/error.hpp"
#include "doorman/core/failover.hpp"

namespace doorman {

/// What a call's driver does next.
template <class TimePoint>
struct call_action {
  enum class kind {
    connect,  ///< connect to the route's current address, then `resume` or `connect_failed`
    send,     ///< send the call on the connection, then `answered`, `lost` or `timed_out`
    wait,     ///< wait until `until` (or a wake-up), then `resume`
    moved,    ///< the route moved (a redirect): close the connection, then `resume`
    done,     ///< the answer is the call's result
    fail,     ///< the call failed: `error`, `message`
  };
  kind what = kind::fail;
  TimePoint until{};
  errc error{};
  std::string message;

  /// A step other than `fail`.
  [[nodiscard]] static call_action to(kind k, TimePoint until = TimePoint{}) {
    return {k, until, errc{}, std::string()};
  }
};

/// Options of one call.
struct call_options {
  int max_redirects = 3;         ///< non-master answers followed, at most
  bool follow_redirects = true;  ///< false: a non-master's answer is the call's answer
};

template <class TimePoint>
class call_machine {
 public:
  using action = call_action<TimePoint>;
  using kind = typename action::kind;

  /// A call begun at `start` over `route`, given up at `deadline`.
  call_machine(failover<TimePoint>& route, TimePoint start, TimePoint deadline, call_options o)
      : route_(&route), start_(start), deadline_(deadline), options_(o) {}

  [[nodiscard]] TimePoint deadline() const noexcept { return deadline_; }

  /// The route moved in memory (the machine holds it by address): drive this one from now on.
  void rebind(failover<TimePoint>& route) noexcept { route_ = &route; }
  [[nodiscard]] int redirects() const noexcept { return redirects_; }

  /// The next step at `now`, the connection being up (`connected`) or not; `problem`: the
  /// driver's words for the last failure, added to an `unreachable` failure's message.
  [[nodiscard]] action resume(TimePoint now, bool connected, std::string_view problem = {}) {
    if (connected) return action::to(kind::send);
    const TimePoint at = route_->attempt_at(start_, deadline_, first_);
    if (now >= deadline_ || at == TimePoint::max()) {
      return fail(errc::unreachable,
                  fmt::format("no task of the position answered; backing off after {} failures "
                              "in a row{}",
                              route_->failures(), problem));
    }
    if (now < at) return action::to(kind::wait, at);
    first_ = false;
    return action::to(kind::connect);
  }

  /// The attempt to connect failed at `now`; `counted`: it says something of the peer (an
  /// attempt cut short by this call's own deadline, or cancelled, does not).
  [[nodiscard]] action connect_failed(TimePoint now, bool counted = true,
                                      std::string_view problem = {}) {
    if (counted) route_->failed(now, failure::unreachable);
    return resume(now, false, problem);
  }

  /// An answer came at `now`. `not_master`: it says its sender is not the master; `master`:
  /// the master it names (checked to be an address by the driver), if any.
  [[nodiscard]] action answered(TimePoint now, bool not_master,
                                const std::optional<std::string>& master = std::nullopt) {
    if (!not_master || !options_.follow_redirects) {
      route_->answered();
      return action::to(kind::done);
    }
    if (++redirects_ > options_.max_redirects)
      return fail(errc::too_many_redirects, "too many mastership redirects");
    if (master) {
      moved_from_ = route_->current();
      route_->redirected(*master, now);
    } else {
      moved_from_.clear();
      route_->no_master(now);
    }
    if (now >= deadline_) return fail(errc::no_master, "no master found before the deadline");
    return action::to(kind::moved);
  }

  /// An error answer came (the peer refused the call): the peer is alive, and the answer is
  /// the call's.
  [[nodiscard]] action error_answer() {
    route_->answered();
    return action::to(kind::done);
  }

  /// With `moved`: the address the route left for a named master (empty when it named none).
  [[nodiscard]] const std::string& moved_from() const noexcept { return moved_from_; }

  /// The connection was lost at `now` before the answer: connected and sent again while the
  /// deadline allows.
  [[nodiscard]] action lost(TimePoint now, std::string why) {
    if (now < deadline_) return resume(now, false, "; " + why);
    return fail(errc::unreachable, std::move(why));
  }

  /// No answer by the deadline: the peer is hung or cut off, and the route moves on.
  [[nodiscard]] action timed_out(TimePoint now, std::string why) {
    route_->failed(now, failure::hung);
    return fail(errc::timed_out, std::move(why));
  }

 private:
  static action fail(errc e, std::string message) {
    return {kind::fail, TimePoint{}, e, std::move(message)};
  }

  failover<TimePoint>* route_;
  TimePoint start_;
  TimePoint deadline_;
  call_options options_;
  bool first_ = true;  // the attempt that may cut the backoff short (`failover::attempt_at`)
  int redirects_ = 0;
  std::string moved_from_;
};

}  // namespace doorman
