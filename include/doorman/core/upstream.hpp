#pragma once

/// \file
/// The upstream state of an intermediate node (sans-I/O): what to ask the parent, when, and
/// what to do with its answer. The network layer (or the simulator) only carries the messages.
///
///     doorman::basic_upstream<engine_type> up({.server_id = "dc-1:7701"});
///     if (const auto step = up.next(engine, now); step.send) {
///       auto req = up.make_request(engine, now);           // one bulk get_server_capacity
///       ... send it; then either
///       up.on_reply(engine, response, clock.now());        // leases become our capacity
///       up.on_reply(error, clock.now());                   // back off with jitter
///     } else {
///       timer.expires_at(step.at);
///     }
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
#include <system_error>
#include <utility>
#include <vector>

#include "doorman/core/error.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/core/refresh.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// Options of the upstream state, with their defaults.
struct upstream_options {
  std::string server_id;  ///< this node's id at its parent (e.g. its address)
  /// When to ask: at least 0.5 s apart, every 5 s when there is nothing to ask for, backing
  /// off from 0.5 s to 15 s after failures.
  refresh_options refresh{.minimum_interval = seconds(0.5),
                          .idle_interval = seconds(5),
                          .backoff = {},
                          .seed = 0x5eed'0f'd00d};
  double decay_factor = 0.5;  ///< as the engine's: see the file comment
  /// Receives one line per parent answer that held invalid grants (which are ignored). Null:
  /// silent.
  std::function<void(std::string_view)> log{};
};

/// An intermediate node's relation to its parent. `Engine` is a `basic_engine`.
template <class Engine>
class basic_upstream {
 public:
  using engine_type = Engine;
  using time_point = typename Engine::time_point;

  explicit basic_upstream(upstream_options options)
      : options_(std::move(options)), schedule_(options_.refresh) {}

  [[nodiscard]] const upstream_options& options() const noexcept { return options_; }

  /// Whether a request should go out at `now`: its time has come, or the engine has news (a
  /// new resource, or capacity its clients gave back that the parent waits for; see
  /// `basic_engine::news`) and the floor since the last request has passed. Never while one is
  /// in flight.
  [[nodiscard]] bool due(const Engine& eng, time_point now) const noexcept {
    return schedule_.due(now, has_news(eng));
  }

  /// When the next request is due (see `due`).
  [[nodiscard]] time_point next_request(const Engine& eng) const noexcept {
    return schedule_.next_request(has_news(eng));
  }

  /// What the driver does next: send a request (`make_request`) now, or look again at `at`
  /// (sooner if the engine has news meanwhile: see `next_request`).
  [[nodiscard]] refresh_step<time_point> next(const Engine& eng, time_point now) const noexcept {
    if (due(eng, now)) return {true, now};
    return {false, schedule_.in_flight() ? time_point::max() : next_request(eng)};
  }

  /// Whether the engine has news the parent has not been asked with yet.
  [[nodiscard]] bool has_news(const Engine& eng) const noexcept { return eng.news() != news_seen_; }

  /// Whether the parent answered the last request.
  [[nodiscard]] bool connected() const noexcept { return schedule_.connected(); }

  /// Consecutive failures so far.
  [[nodiscard]] int failures() const noexcept { return schedule_.failures(); }

  [[nodiscard]] bool in_flight() const noexcept { return schedule_.in_flight(); }

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
      eng.report_budget(r);
      eng.report_signals(r, now);
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
      asked_.push_back(r.resource_id);  // sorted, as req is
    news_seen_ = eng.news();
    schedule_.sent(now);
    return req;
  }

  /// Adopts the parent's answer: each grant becomes the engine's lease (and algorithm) for its
  /// resource; the next request is scheduled by the refresh rule. A non-master's answer (no
  /// grants) is a failure: the transport should have followed its redirect. The answer is
  /// untrusted: a grant for a resource the request did not ask for, a second grant for one,
  /// or one with a number out of bounds (`check_grant`) is ignored, changes no state, and is
  /// logged (one line per answer).
  refresh_event on_reply(Engine& eng, const server_capacity_response& resp, time_point now) {
    if (!resp.mastership.is_master) return on_reply(make_error_code(errc::no_master), now);
    double interval = std::numeric_limits<double>::infinity();
    adopt_screened(
        resp.resources, asked_, invalid_grants_, options_.log, "parent's answer",
        [&](const server_resource_grant& g) {
          // Counted from when the request was sent, as the client state does: the parent
          // computed `expires_in` later than that, so this node never thinks its lease lasts
          // longer than the parent does, however long the answer took.
          const auto lease = from_lease_info<time_point>(g.gets, schedule_.last_request());
          if (!eng.set_parent_lease(g.resource_id, lease, now, g.algorithm, g.budget)) {
            return;
          }
          const double own = eng.template_of(g.resource_id).algorithm.refresh_interval.count();
          const auto* store = eng.store(g.resource_id);
          const double handed_out =
              own * (store && store->servers() > 0 ? options_.decay_factor : 1.0);
          interval =
              std::min({interval, g.gets.refresh_interval, options_.decay_factor * handed_out});
          if (g.gets.expires_in > 0) interval = std::min(interval, g.gets.expires_in);
        });
    earliest_expiry_ = time_point::max();
    eng.for_each_resource([&](std::string_view id, const auto&) {
      if (const auto l = eng.parent_lease(id); l && l->expiry > now) {
        earliest_expiry_ = std::min(earliest_expiry_, l->expiry);
      }
    });
    return schedule_.answered(now, interval);
  }

  /// How long the request sent at `now` may wait for its answer: `configured`, bounded by
  /// half the time left on the earliest lease held (`refresh_schedule::call_timeout`).
  [[nodiscard]] seconds call_timeout(time_point now, seconds configured) const noexcept {
    return refresh_schedule<time_point>::call_timeout(now, earliest_expiry_, configured);
  }

  /// The request failed (`error` says why): retry after an exponential backoff with jitter
  /// (uniform in [½, 1] of the step), but within half the time left on the earliest lease
  /// held, so that a parent back in time is reached before a lease runs out. Leases already
  /// held stay until they expire; the engine then has capacity 0 for them.
  refresh_event on_reply(std::error_code error, time_point now) {
    (void)error;  // every failure is retried the same way
    return schedule_.failed(now, earliest_expiry_);
  }

 private:
  // A band as the parent accepts it: whole clients from 1 to max_num_clients, bounded wants.
  static priority_band band_of(std::int64_t priority, const demand_sums& sums) noexcept {
    const double n = std::ceil(sums.subclients - 1e-9);
    return {priority,
            static_cast<std::int64_t>(
                std::clamp(n, 1.0, static_cast<double>(request_limits::max_num_clients))),
            detail::bounded_quantity(sums.wants)};
  }

  upstream_options options_;
  refresh_schedule<time_point> schedule_;
  time_point earliest_expiry_ = time_point::max();  // of the parent's leases, at the last answer
  std::uint64_t news_seen_ = 0;
  std::vector<std::string> asked_;  // the resources of the request in flight, sorted
  std::uint64_t invalid_grants_ = 0;
};

}  // namespace doorman
