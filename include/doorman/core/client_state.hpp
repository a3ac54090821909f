#pragma once

/// \file
/// The client state (sans-I/O): the resources a client holds, what it wants of each, the
/// leases it got, and what capacity it may use at any time. The asio client (and the
/// simulator) only carry its messages and call it with the time.
///
///     doorman::client_state state({.client_id = "web-1:4242:0"});
///     state.add("api", {.wants = 100, .mode = doorman::fallback::safe}, clock.now());
///     if (const auto step = state.next(now); step.send) {
///       auto req = state.make_request(now);     // one bulk get_capacity
///       ... send it; then either
///       state.on_reply(response, clock.now());
///       state.on_reply(error, clock.now());     // retried with backoff and jitter
///     } else {
///       timer.expires_at(step.at);              // a refresh or an expiry
///     }
///     double limit = state.capacity("api", now);  // the lease, or the fallback once expired
///
/// A lease's expiry counts from when the request was sent, not from when the answer came: the
/// server computed `expires_in` later than that, so the client never holds a lease longer than
/// the server granted it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "doorman/core/client_resource.hpp"
#include "doorman/core/error.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/core/refresh.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// Options of the client state, with their defaults.
struct client_state_options {
  std::string client_id;      ///< unique per client object (default: hostname:pid:n)
  refresh_options refresh{};  ///< when to ask (the asio client draws a random jitter seed)
  /// Receives one line per server answer that held invalid grants (which are ignored). Null:
  /// silent.
  std::function<void(std::string_view)> log{};
};

/// What a resource may use without a lease: its fallback, given the safe capacity the server
/// returned last (if any). −1: unlimited.
[[nodiscard]] inline double fallback_capacity(const client_resource_options& o,
                                              std::optional<double> server_safe_capacity) {
  if (o.budget) return 0;  // nothing of a budget is spent without an allotment
  switch (o.mode) {
    case fallback::pessimistic:
      return 0;
    case fallback::optimistic:
      return o.wants;
    case fallback::safe:
      if (o.safe_capacity) return *o.safe_capacity;
      return server_safe_capacity.value_or(0);
  }
  return 0;
}

/// A budget resource's account in the client: what its driver says it spent and has left, and
/// what the server's last answer said (docs/budgets.md).
struct budget_account {
  double spent = 0;                   ///< units spent in the window the server named, in all
  double left = 0;                    ///< of the allotment, as the driver counts it
  double spent_at_send = 0;           ///< `spent` when the request in flight went out
  std::optional<budget_info> info{};  ///< the server's last word on the budget
};

/// A new allotment for the driver to apply (`take_allotment`): `units`, granted on the
/// request sent when the driver had spent `spent_at_send`; what it spent since comes off
/// them. `new_window`: the server counts in a new window (the driver's count starts again).
struct budget_allotment {
  double units = 0;
  double spent_at_send = 0;
  bool new_window = false;
};

/// What a resource's calls to the protected service met, as the client keeps it
/// (docs/learned-capacity.md): the driver's counts in all, sent with each request, and the
/// client's own cut while it waits for the root's.
template <class TimePoint>
struct overload_watch {
  overload_signals total{};  ///< the driver's counts, in all
  bool reported = false;     ///< the driver reported some (so requests carry them)
  overload_signals mark{};   ///< `total` at the start of the second under way
  TimePoint since{};         ///< when that second started
  /// What got through in a second with overloads, less the learned capacity's margin: the
  /// most the limiter admits until the next grant (the root's answer to the same signals).
  std::optional<double> cut{};
  TimePoint cut_at{};  ///< when it was last lowered
};

/// One resource as the client holds it.
template <class TimePoint>
struct client_resource {
  client_resource_options options;
  std::optional<basic_lease<TimePoint>> lease;  ///< the last lease granted
  std::optional<double> server_safe_capacity;   ///< the last one the server returned
  bool held_back = false;                       ///< callers wait at capacity 0 for it (`hold_back`)
  bool fast_started = false;                    ///< its one request ahead of the floor was made
  budget_account budget{};                      ///< a budget resource's account
  std::optional<budget_allotment> allotment{};  ///< a grant the driver has not taken yet
  /// The server's last grant was of the other kind: a budget's for a rate or gauge, or a
  /// rate's for a budget. Nothing of it is used, and wants 0 are asked until that changes.
  bool other_kind = false;
  overload_watch<TimePoint> overload{};  ///< what its calls met (`set_signals`)
};

/// The client state. `Clock` fixes the time types (`std::chrono::steady_clock` in the client,
/// `manual_clock` in tests and the simulator); the state never reads it.
template <clock Clock>
class basic_client_state {
 public:
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using resource = client_resource<time_point>;

  explicit basic_client_state(client_state_options options)
      : options_(std::move(options)), schedule_(options_.refresh) {}

  [[nodiscard]] const client_state_options& options() const noexcept { return options_; }

  /// Adds a resource (or updates its options); a new one is asked for at the next request,
  /// which is due at once (past the floor). Returns whether it was new. Throws
  /// `std::invalid_argument` on an id or wants the protocol would refuse.
  bool add(std::string_view id, client_resource_options options) {
    if (const char* problem = detail::id_problem(id)) {
      throw std::invalid_argument("resource id " + std::string(problem));
    }
    check_wants(options.wants);
    auto [it, inserted] = resources_.try_emplace(std::string(id));
    it->second.options = options;
    if (inserted) {
      unasked_ = true;
      releases_.erase(std::remove(releases_.begin(), releases_.end(), it->first), releases_.end());
    }
    return inserted;
  }

  /// Forgets a resource; its capacity is to be released (see `take_releases`).
  bool remove(std::string_view id) {
    const auto it = resources_.find(id);
    if (it == resources_.end()) return false;
    releases_.push_back(it->first);
    resources_.erase(it);
    return true;
  }

  /// Sets what the client wants of a resource (from the user or the demand estimator); sent
  /// with the next refresh.
  void set_wants(std::string_view id, double wants) {
    check_wants(wants);
    auto* r = lookup(id);
    if (r == nullptr) return;
    // Held back: the start wants stay until capacity comes (see `hold_back`).
    if (r->held_back) wants = std::max(wants, start_wants(*r).value_or(0));
    r->options.wants = wants;
  }

  /// A budget resource's account, from its driver before each request: `spent` units in the
  /// window the server named, in all (it only grows within a window), and `left` of the
  /// allotment. Sent with the next request. Nothing for an unknown or non-budget id.
  void set_spend(std::string_view id, double spent, double left) {
    detail::require_quantity(spent, "spent");
    auto* r = lookup(id);
    if (r == nullptr || !r->options.budget) return;
    r->budget.spent = spent;
    r->budget.left = std::max(0.0, std::isfinite(left) ? left : 0.0);
  }

  /// What the calls of `id` to the protected service met, from its driver: `s`, its counts in
  /// all at `now` (they only grow). Sent with the next request (docs/learned-capacity.md).
  /// Once a second, a second in which more than `learning_options::overload_ratio` of the
  /// calls were overloaded cuts what the client may use to what got through, less the margin,
  /// until the next grant: the root cuts for the whole fleet a refresh later, the client at
  /// once. Throws `std::invalid_argument` on counts that are not quantities or overloads above
  /// calls; nothing for an unknown id or a budget.
  void set_signals(std::string_view id, const overload_signals& s, time_point now) {
    detail::require_quantity(s.calls, "calls");
    detail::require_quantity(s.overloads, "overloads");
    if (s.overloads > s.calls) throw std::invalid_argument("overloads must be at most calls");
    auto* r = lookup(id);
    if (r == nullptr || r->options.budget) return;
    auto& w = r->overload;
    if (!w.reported || s.calls < w.mark.calls || s.overloads < w.mark.overloads) {
      w.mark = s;  // the first counts, or a driver that started again
      w.since = now;
    }
    w.total = s;
    w.reported = true;
    const double span = to_seconds(now - w.since);
    if (span < 1) return;
    const double calls = s.calls - w.mark.calls;
    const double overloads = s.overloads - w.mark.overloads;
    const learning_options law{};
    if (calls > 0 && overloads > law.overload_ratio * calls) {
      const double through = (calls - overloads) / span * (1 - law.margin);
      w.cut = std::min(w.cut.value_or(through), through);
      w.cut_at = now;
      overloaded_unsent_ = true;  // the root hears of it at once (after the floor)
    }
    w.mark = s;
    w.since = now;
  }

  /// The allotment of `id` granted by the last answer, once (nothing if none is new).
  std::optional<budget_allotment> take_allotment(std::string_view id) {
    auto* r = lookup(id);
    if (r == nullptr) return std::nullopt;
    return std::exchange(r->allotment, std::nullopt);
  }

  /// Fast start, for a resource whose wants are measured: its callers are held back by a
  /// capacity of 0 (its first request went out before any use, so it asked for nothing, or
  /// its lease ran dry). Its wants become at least its start wants — the safe capacity the
  /// server returned for it (by default the resource's equal share: capacity / clients), at
  /// least 1 — and it is asked for again at once, ahead of the floor, the first time; later
  /// times, once the floor has passed. Before the server's first answer, this waits for it.
  /// Nothing for an unknown id or one with capacity at `now`.
  void hold_back(std::string_view id, time_point now) {
    auto* r = lookup(id);
    if (r == nullptr || capacity_of(*r, now) != 0 || r->held_back) return;
    r->held_back = true;
    start(*r, now);
  }

  /// The ids whose capacity should be released (removed since the last call).
  [[nodiscard]] std::vector<std::string> take_releases() { return std::exchange(releases_, {}); }

  [[nodiscard]] const resource* find(std::string_view id) const {
    const auto it = resources_.find(id);
    return it == resources_.end() ? nullptr : &it->second;
  }

  [[nodiscard]] std::size_t size() const noexcept { return resources_.size(); }

  /// Calls `f(id, resource)` for every resource, in id order.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [id, r] : resources_)
      f(std::string_view(id), r);
  }

  /// What the client may use of `id` at `now`: the unexpired lease's capacity, or else the
  /// fallback (−1: unlimited; an unknown id: 0).
  [[nodiscard]] double capacity(std::string_view id, time_point now) const {
    const auto* r = find(id);
    return r == nullptr ? 0 : capacity_of(*r, now);
  }

  /// The same for a resource already found (`find`; the pointer stays valid until the
  /// resource is removed).
  [[nodiscard]] static double capacity_of(const resource& r, time_point now) noexcept {
    const double c = r.lease && !r.lease->expired(now)
                         ? r.lease->capacity
                         : fallback_capacity(r.options, r.server_safe_capacity);
    if (!r.overload.cut) return c;
    return c < 0 ? *r.overload.cut : std::min(c, *r.overload.cut);
  }

  /// Whether the lease of `id` is unexpired at `now` (so `capacity` is the lease, not a
  /// fallback).
  [[nodiscard]] bool leased(std::string_view id, time_point now) const {
    const auto* r = find(id);
    return r != nullptr && r->lease && !r->lease->expired(now);
  }

  /// Whether a request should go out at `now`. Never while one is in flight or without
  /// resources.
  [[nodiscard]] bool due(time_point now) const noexcept {
    return !resources_.empty() && schedule_.due(now, news());
  }

  /// When the next request is due: the earliest refresh interval among the resources after
  /// the last answer, or at once for a resource not yet asked for; never sooner than the
  /// floor after the previous request (nor before a backoff ends).
  [[nodiscard]] time_point next_request() const noexcept { return schedule_.next_request(news()); }

  /// When the capacity of some resource may change by itself (a lease expires) or a request is
  /// due, whichever comes first after `now`: when the driver should look again.
  [[nodiscard]] time_point next_change(time_point now) const noexcept {
    time_point t = schedule_.in_flight() || resources_.empty() ? time_point::max() : next_request();
    return std::min(t, earliest_expiry(now));
  }

  /// What the driver does next: send a request (`make_request`) now, or look again at `at`.
  [[nodiscard]] refresh_step<time_point> next(time_point now) const noexcept {
    if (due(now)) return {true, now};
    return {false, next_change(now)};
  }

  /// The bulk `get_capacity` for every resource, with the leases still held. Marks a request
  /// in flight until `on_response` or `on_failure`.
  [[nodiscard]] capacity_request make_request(time_point now) {
    capacity_request req;
    req.client_id = options_.client_id;
    for (auto& [id, r] : resources_) {
      if (req.resources.size() == request_limits::max_resources) break;
      resource_request rr;
      rr.resource_id = id;
      rr.priority = r.options.priority;
      rr.wants = r.other_kind ? 0.0 : r.options.wants;
      // Held back by its own cut, it wants no more than that: the root sees no demand above
      // the service's level, so it does not rise meanwhile.
      if (r.overload.cut) rr.wants = std::min(rr.wants, *r.overload.cut);
      if (r.lease && !r.lease->expired(now)) rr.has = to_lease_info(*r.lease, now);
      if (r.options.budget) add_spend(r, rr);
      if (r.overload.reported) rr.signals = r.overload.total;
      req.resources.push_back(std::move(rr));
    }
    unasked_ = resources_.size() > req.resources.size();
    start_unsent_ = false;
    overloaded_unsent_ = false;
    asked_.clear();
    for (const auto& rr : req.resources)
      asked_.push_back(rr.resource_id);  // in id order, as the map is
    schedule_.sent(now);
    return req;
  }

  /// Adopts the server's answer (to the request sent last): each grant becomes its resource's
  /// lease; the next request is due after the shortest refresh interval. A non-master's answer
  /// is a failure (the transport should have followed its redirect). The answer is untrusted:
  /// grants for resources the request did not ask for (or removed meanwhile), second grants for
  /// one resource, and grants with a number out of bounds (`check_grant`) are ignored, change
  /// nothing, and are logged (one line per answer).
  refresh_event on_reply(const capacity_response& resp, time_point now) {
    if (!resp.mastership.is_master) return on_reply(make_error_code(errc::no_master), now);
    double interval = std::numeric_limits<double>::infinity();
    adopt_screened(resp.resources, asked_, invalid_grants_, options_.log, "server's answer",
                   [&](const resource_grant& g) {
                     auto* r = lookup(g.resource_id);
                     if (r == nullptr) return;  // removed since the request went out
                     r->lease = from_lease_info<time_point>(g.gets, schedule_.last_request());
                     r->server_safe_capacity = g.safe_capacity;
                     keep_cut(*r, now);
                     if (other_kind(*r, g)) r->lease->capacity = 0;
                     if (r->options.budget) adopt_allotment(*r, g);
                     interval =
                         std::min(interval, g.gets.refresh_interval > 0 ? g.gets.refresh_interval
                                                                        : idle_seconds());
                     // Come back before the lease runs out even if the server asked for a
                     // later refresh.
                     const double left = to_seconds(r->lease->expiry - now);
                     if (left > 0) interval = std::min(interval, left);
                     if (r->lease->capacity > 0) r->held_back = false;
                   });
    const refresh_event e = schedule_.answered(now, interval);
    // Resources held back before this first answer: their start wants are known now.
    for (auto& [id, r] : resources_) {
      if (r.held_back && !r.fast_started) start(r, now);
    }
    return e;
  }

  /// The request failed (`error` says why): retry after an exponential backoff with jitter,
  /// but within half the time left on the earliest lease held. Leases already held stay until
  /// they expire; then the fallback applies.
  refresh_event on_reply(std::error_code error, time_point now) {
    (void)error;  // every failure is retried the same way
    return schedule_.failed(now, earliest_expiry(now));
  }

  /// How long the request sent at `now` may wait for its answer: `configured`, bounded by
  /// half the time left on the earliest lease held (`refresh_schedule::call_timeout`).
  [[nodiscard]] seconds call_timeout(time_point now, seconds configured) const noexcept {
    return refresh_schedule<time_point>::call_timeout(now, earliest_expiry(now), configured);
  }

  /// Grants of the server's answers that were ignored as invalid, since the start.
  [[nodiscard]] std::uint64_t invalid_grants() const noexcept { return invalid_grants_; }

  /// Consecutive failures so far.
  [[nodiscard]] int failures() const noexcept { return schedule_.failures(); }
  [[nodiscard]] bool in_flight() const noexcept { return schedule_.in_flight(); }

 private:
  struct less {
    using is_transparent = void;
    bool operator()(std::string_view a, std::string_view b) const noexcept { return a < b; }
  };

  resource* lookup(std::string_view id) {
    const auto it = resources_.find(id);
    return it == resources_.end() ? nullptr : &it->second;
  }

  static void check_wants(double wants) { detail::require_quantity(wants, "wants"); }

  // A grant: the client's own cut stays until the root's grants come down to it (they follow
  // its signals a refresh or two later), for at most two refresh intervals.
  static void keep_cut(resource& r, time_point now) {
    auto& w = r.overload;
    if (!w.cut) return;
    const auto two = 2 * (r.lease->refresh_interval);
    if (r.lease->capacity <= *w.cut || now - w.cut_at >= two) w.cut.reset();
  }

  // The server's safe capacity for `r` (unlimited: not a hint), at least 1; none before the
  // server's first answer.
  static std::optional<double> start_wants(const resource& r) noexcept {
    if (!r.server_safe_capacity) return std::nullopt;
    const double hint = *r.server_safe_capacity;
    return hint > 1 ? std::min(hint, request_limits::max_quantity) : 1.0;
  }

  // A budget's report: its spend in the window the server last named (none before the first
  // answer: nothing was spent), and what it has left of a live allotment.
  static void add_spend(resource& r, resource_request& rr) {
    auto& b = r.budget;
    b.spent_at_send = b.spent;
    if (b.info) rr.spend = budget_spend{b.info->window, b.spent};
    if (rr.has) rr.has->capacity = std::min(rr.has->capacity, b.left);
  }

  // A budget's grant: the allotment for the driver, and the server's word on the window (a
  // grant of the other kind: an allotment of 0).
  static void adopt_allotment(resource& r, const resource_grant& g) {
    const bool new_window = r.budget.info && g.budget && g.budget->window != r.budget.info->window;
    if (g.budget) r.budget.info = *g.budget;
    r.allotment = budget_allotment{r.lease->capacity, r.budget.spent_at_send, new_window};
  }

  // Whether `g` is of the other kind than `r` (a budget's grant carries `budget`), logged when
  // that begins: a rate used as units, or units used as a rate, would pass what the server
  // counts (docs/budgets.md).
  bool other_kind(resource& r, const resource_grant& g) {
    const bool other = g.budget.has_value() != r.options.budget;
    if (other && !r.other_kind && options_.log) {
      options_.log(r.options.budget
                       ? "resource " + g.resource_id +
                             " is not a budget at the server: this budget handle takes nothing "
                             "of it, and asks for nothing"
                       : "resource " + g.resource_id +
                             " is a budget at the server: use a budget handle; this one takes "
                             "nothing of it, and asks for nothing");
    }
    r.other_kind = other;
    return other;
  }

  // News: a resource not asked for yet, or start wants not sent yet.
  [[nodiscard]] bool news() const noexcept {
    return unasked_ || start_unsent_ || overloaded_unsent_;
  }

  // A held-back resource's wants rise to its start wants, known from the server's answer; the
  // first time, the request goes out at once.
  void start(resource& r, time_point now) {
    const auto wants = start_wants(r);
    if (!wants) return;  // no answer yet: on_reply comes back here
    r.options.wants = std::max(r.options.wants, *wants);
    start_unsent_ = true;
    if (!r.fast_started) {
      r.fast_started = true;
      schedule_.expedite(now);
    }
  }

  [[nodiscard]] double idle_seconds() const noexcept {
    return options_.refresh.idle_interval.count();
  }

  // The earliest expiry after `now` of the leases held (max: none).
  [[nodiscard]] time_point earliest_expiry(time_point now) const noexcept {
    time_point t = time_point::max();
    for (const auto& [id, r] : resources_) {
      if (r.lease && r.lease->expiry > now) t = std::min(t, r.lease->expiry);
    }
    return t;
  }

  client_state_options options_;
  refresh_schedule<time_point> schedule_;
  std::map<std::string, resource, less> resources_;
  std::vector<std::string> releases_;
  std::vector<std::string> asked_;  // the resources of the request in flight, in id order
  std::uint64_t invalid_grants_ = 0;
  bool unasked_ = false;            // a resource not asked for yet
  bool start_unsent_ = false;       // start wants (`hold_back`) not sent yet
  bool overloaded_unsent_ = false;  // a second of overloads (`set_signals`) not reported yet
};

/// The client state on the steady clock.
using client_state = basic_client_state<std::chrono::steady_clock>;

}  // namespace doorman
