#pragma once

/// \file
/// The upstream state of an intermediate node (sans-I/O): what to ask the parent, when, and
/// what to do with its answer. The network layer (or the simulator) only carries the messages.
///
///     doorman::basic_upstream<engine_type> up({.server_id = "dc-1:7701"});
///     if (up.due(engine, now)) {
///       auto req = up.make_request(engine, now);           // one bulk get_server_capacity
///       ... send it; then either
///       up.on_response(engine, response, clock.now());     // leases become our capacity
///       up.on_failure(clock.now());                        // back off with jitter
///     }
///     timer.expires_at(up.next_request());
///
/// Refresh rule (docs/node.md): a node asks again after the shortest, over its resources, of
/// the parent's refresh interval and `decay_factor` × the refresh interval the node itself hands
/// out for that resource (the template's for clients, × `decay_factor` again for server
/// children), never sooner than `minimum_interval` after the previous request. So a node of
/// height h (clients are height 0) refreshes every template refresh × decay_factor^h.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "doorman/core/backoff.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// Options of the upstream state, with their defaults.
struct upstream_options {
  std::string server_id;                ///< this node's id at its parent (e.g. its address)
  seconds minimum_interval{0.5};        ///< the floor between two requests
  seconds initial_backoff{0.5};         ///< after the first failure
  seconds maximum_backoff{15};          ///< the ceiling of the exponential backoff
  seconds idle_interval{5};             ///< how often to ask when there is nothing to ask for
  double decay_factor = 0.5;            ///< as the engine's: see the file comment
  std::uint64_t seed = 0x5eed'0f'd00d;  ///< of the jitter; fixed, so the simulation repeats
  /// Receives one line per parent answer that held invalid grants (which are ignored). Null:
  /// silent.
  std::function<void(std::string_view)> log{};
};

/// What changed with a response or a failure, for the node's log.
enum class upstream_event {
  none,
  parent_reached,   ///< the first answer
  parent_lost,      ///< the first failure after answers
  parent_regained,  ///< the first answer after failures
};

/// An intermediate node's relation to its parent. `Engine` is a `basic_engine`.
template <class Engine>
class basic_upstream {
 public:
  using engine_type = Engine;
  using time_point = typename Engine::time_point;
  using duration = typename Engine::duration;

  explicit basic_upstream(upstream_options options)
      : options_(std::move(options)),
        backoff_({options_.initial_backoff, options_.maximum_backoff}, options_.seed) {}

  [[nodiscard]] const upstream_options& options() const noexcept { return options_; }

  /// Whether a request should go out at `now`: its time has come, or the engine has news (a
  /// new resource, or capacity its clients gave back that the parent waits for; see
  /// `basic_engine::news`) and the floor since the last request has passed. Never while one is
  /// in flight.
  [[nodiscard]] bool due(const Engine& eng, time_point now) const noexcept {
    if (in_flight_) return false;
    return now >= next_request(eng);
  }

  /// When the next request is due (see `due`).
  [[nodiscard]] time_point next_request(const Engine& eng) const noexcept {
    if (failures_ == 0 && eng.news() != news_seen_) {
      return std::min(next_, last_request_ + floor());
    }
    return next_;
  }

  /// Whether the parent answered the last request.
  [[nodiscard]] bool connected() const noexcept { return answered_ && failures_ == 0; }

  /// Consecutive failures so far.
  [[nodiscard]] int failures() const noexcept { return failures_; }

  /// Grants of the parent's answers that were ignored as invalid (an id not asked for, a
  /// duplicate, a number out of bounds), since the start.
  [[nodiscard]] std::uint64_t invalid_grants() const noexcept { return invalid_grants_; }

  /// The bulk request for every resource the engine has state for: its clients per priority
  /// band, its outstanding grants and the lease it holds from the parent. Marks a request in
  /// flight until `on_response` or `on_failure`. Every number is brought within the protocol's
  /// bounds (`request_limits`), so that the parent never refuses the request for what this
  /// node's clients sum to: wants and outstanding in [0, max_quantity], at most `max_bands`
  /// bands (the lowest priorities beyond that are merged into the last one kept).
  [[nodiscard]] server_capacity_request make_request(Engine& eng, time_point now) {
    eng.expire(now);
    server_capacity_request req;
    req.server_id = options_.server_id;
    eng.for_each_resource([&](std::string_view id, const auto& store) {
      server_resource_request r;
      r.resource_id.assign(id);
      if (const auto l = eng.parent_lease(id); l && !l->expired(now)) {
        r.has = to_lease_info(*l, now);
      }
      // What is out beneath this node: its leases, and what its own server children still
      // hold beyond theirs (leases cannot be revoked).
      r.outstanding = detail::bounded_quantity(store.sum_held());
      demand_sums last;  // the last band sent, before rounding and bounds
      store.for_each_band([&](std::int64_t priority, const demand_sums& sums) {
        if (r.wants.size() < request_limits::max_bands) {
          last = sums;
          r.wants.push_back(band_of(priority, last));
        } else {  // beyond the limit, lower priorities join the last band sent
          last.wants += sums.wants;
          last.subclients += sums.subclients;
          r.wants.back() = band_of(r.wants.back().priority, last);
        }
      });
      // No clients left (the resource lives on its parent lease): say so, which hands the
      // capacity back at the parent's next decision.
      if (r.wants.empty()) r.wants.push_back({0, 1, 0});
      req.resources.push_back(std::move(r));
    });
    // Deterministic order whatever the engine's hash map does.
    std::sort(req.resources.begin(), req.resources.end(),
              [](const auto& a, const auto& b) { return a.resource_id < b.resource_id; });
    if (req.resources.size() > request_limits::max_resources) {
      req.resources.resize(request_limits::max_resources);
    }
    asked_.clear();
    for (const auto& r : req.resources)
      asked_.push_back(r.resource_id);  // sorted, as the request is
    news_seen_ = eng.news();
    last_request_ = now;
    in_flight_ = true;
    return req;
  }

  /// Adopts the parent's answer: each grant becomes the engine's lease (and algorithm) for its
  /// resource; the next request is scheduled by the refresh rule. A non-master's answer (no
  /// grants) is a failure: the transport should have followed its redirect. The answer is
  /// untrusted: a grant for a resource the request did not ask for, a second grant for one,
  /// or one with a number out of bounds (`check_grant`) is ignored, changes no state, and is
  /// logged (one line per answer).
  upstream_event on_response(Engine& eng, const server_capacity_response& resp, time_point now) {
    if (!resp.mastership.is_master) return on_failure(now);
    in_flight_ = false;
    double interval = std::numeric_limits<double>::infinity();
    const auto screen = screen_grants(resp.resources, asked_);
    for (std::size_t i = 0; i < resp.resources.size(); ++i) {
      if (!screen.adopt[i]) continue;
      const auto& g = resp.resources[i];
      // Counted from when the request was sent, as the client state does: the parent computed
      // `expires_in` later than that, so this node never thinks its lease lasts longer than
      // the parent does, however long the answer took.
      if (!eng.set_parent_lease(g.resource_id, from_lease_info<time_point>(g.gets, last_request_),
                                now, g.algorithm)) {
        continue;
      }
      const double own = eng.template_of(g.resource_id).algorithm.refresh_interval.count();
      const auto* store = eng.store(g.resource_id);
      const double handed_out = own * (store && store->servers() > 0 ? options_.decay_factor : 1.0);
      interval = std::min({interval, g.gets.refresh_interval, options_.decay_factor * handed_out});
      if (g.gets.expires_in > 0) interval = std::min(interval, g.gets.expires_in);
    }
    if (screen.ignored > 0) {
      invalid_grants_ += screen.ignored;
      if (options_.log) options_.log(screen.log_line("parent's answer"));
    }
    earliest_expiry_ = time_point::max();
    eng.for_each_resource([&](std::string_view id, const auto&) {
      if (const auto l = eng.parent_lease(id); l && l->expiry > now) {
        earliest_expiry_ = std::min(earliest_expiry_, l->expiry);
      }
    });
    if (!std::isfinite(interval)) interval = options_.idle_interval.count();
    next_ = now + to_duration<duration>(std::max(interval, floor_seconds()));
    const upstream_event e = !answered_      ? upstream_event::parent_reached
                             : failures_ > 0 ? upstream_event::parent_regained
                                             : upstream_event::none;
    answered_ = true;
    failures_ = 0;
    return e;
  }

  /// The request failed (transport error, deadline, error answer): retry after an exponential
  /// backoff with jitter (uniform in [½, 1] of the step), but within half the time left on the
  /// earliest lease held, so that a parent back in time is reached before a lease runs out. Leases
  /// already held stay until they expire; the engine then has capacity 0 for them.
  upstream_event on_failure(time_point now) {
    in_flight_ = false;
    ++failures_;
    double delay = backoff_.delay(failures_).count();
    // Never sleep through the end of a lease still held: retry within half the time left.
    if (const auto left = earliest_expiry_ - now; earliest_expiry_ > now) {
      delay = std::min(delay, to_seconds(left) / 2);
    }
    delay = std::max(floor_seconds(), delay);
    next_ = now + to_duration<duration>(delay);
    return failures_ == 1 && answered_ ? upstream_event::parent_lost : upstream_event::none;
  }

 private:
  [[nodiscard]] double floor_seconds() const noexcept { return options_.minimum_interval.count(); }

  // A band as the parent accepts it: whole clients from 1 to max_num_clients, bounded wants.
  static priority_band band_of(std::int64_t priority, const demand_sums& sums) noexcept {
    const double n = std::ceil(sums.subclients - 1e-9);
    return {priority,
            static_cast<std::int64_t>(
                std::clamp(n, 1.0, static_cast<double>(request_limits::max_num_clients))),
            detail::bounded_quantity(sums.wants)};
  }
  [[nodiscard]] duration floor() const noexcept { return to_duration<duration>(floor_seconds()); }

  upstream_options options_;
  jittered_backoff backoff_;
  time_point next_{};
  time_point last_request_{};
  time_point earliest_expiry_ = time_point::max();  // of the parent's leases, at the last answer
  std::uint64_t news_seen_ = 0;
  std::vector<std::string> asked_;  // the resources of the request in flight, sorted
  std::uint64_t invalid_grants_ = 0;
  int failures_ = 0;
  bool answered_ = false;
  bool in_flight_ = false;
};

}  // namespace doorman
