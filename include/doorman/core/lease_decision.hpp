#pragma once

/// \file
/// One lease decision, in named steps: what `basic_engine` runs for each resource of a
/// `get_capacity` or `get_server_capacity` (docs/architecture.md, "The engine's decision"),
/// and the engine's options, which steer the steps.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "doorman/core/algorithm.hpp"
#include "doorman/core/budget.hpp"
#include "doorman/core/config.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/lease_store.hpp"
#include "doorman/core/log_throttle.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// Options of an engine, with their defaults.
struct engine_options {
  /// A client that asks again for a resource sooner than this gets its current lease back
  /// without the algorithm being rerun (its new wants are still recorded). 0 disables.
  seconds minimum_refresh_interval{5};

  /// Root: capacities come from the configuration. Otherwise (an intermediate node) a
  /// resource's capacity is the lease set by `set_parent_lease`, 0 without one, and no grant
  /// outlives that lease.
  bool is_root = true;

  /// `count_hits` counters held at most (one per resource counted in a window that has not
  /// ended): a new resource past it is refused until windows end.
  std::size_t max_hit_counters = 1'000'000;

  /// A grant to a server child (`get_server_capacity`) gets the template's refresh interval
  /// times this factor, so that the tree's inner levels refresh faster than its clients (see
  /// docs/node.md for the whole rule). In (0, 1]; 1 turns decay off.
  double decay_factor = 0.5;

  /// An intermediate without a live lease from its parent grants 0 with this refresh interval
  /// (or the template's, if shorter), so that clients come back soon after the parent answers
  /// but not in a storm while it is away; so does a root keeping budget marks whose window's
  /// first mark is not stored yet.
  seconds no_parent_refresh_interval{2};

  /// A server child whose own grants (its reported `outstanding`) exceed its lease (its lease
  /// shrank, and leases cannot be revoked) counts as holding those grants until it reports
  /// less, so that what it still has out is not granted to others meanwhile (docs/simulation.md:
  /// this is what keeps the tree as a whole within capacity). False: Doorman's behaviour.
  bool count_outstanding = true;

  /// A lease cut while it was live still counts at its larger size until the client asks
  /// again saying it has the smaller one (or the larger one has ended): the answer carrying
  /// the cut may be lost, and a lease cannot be revoked. Without it, what the cut frees is
  /// granted to others at once, and the tree can exceed its capacity for as long as the larger
  /// lease had left. With `refresh_when_owed`, the cut client is asked back within a quarter
  /// of the refresh interval. False: Doorman's behaviour.
  bool count_unconfirmed_cuts = true;

  /// While more is out than the capacity (it came down: a parent's cut lease, a learned
  /// capacity's cut, a new configuration), a client that asks again comes down to its share,
  /// never above what it holds, instead of getting what the others' leases leave (nothing,
  /// for the first to ask after a large cut): what is out only falls, and the first to ask do
  /// not pay for the whole cut (docs/learned-capacity.md). False: Doorman's behaviour.
  bool share_cuts = true;

  /// A lease granted in learning mode asks the client to come back when learning mode ends
  /// (if that is sooner than the refresh interval), so that the real shares apply at once.
  bool refresh_after_learning = true;

  /// A client granted less than its share because the capacity was still held by others is
  /// asked to come back after a quarter of the refresh interval (never sooner than
  /// `minimum_refresh_interval` for clients), instead of a whole one, to collect it once
  /// freed. At an intermediate whose parent lease is 0, clients come back just after the
  /// node's next exchange with its parent.
  bool refresh_when_owed = true;

  /// In learning mode, an intermediate that has no capacity from its parent yet hands a
  /// client's reported lease back unchanged (not extended) with a short refresh interval,
  /// instead of cutting it to 0, which the client would then report until learning mode ends;
  /// and a grant is capped by what the other leases leave of the capacity, not by all of it.
  /// False: Doorman's behaviour.
  bool echo_in_learning = true;

  /// An intermediate holding more than its capacity (its parent shrank its lease) that sees
  /// its clients give some back tells its upstream through `news()`, so that its parent, which
  /// counts that excess (`count_outstanding`), hears of it at once.
  bool report_releases = true;

  /// Budgets count in windows of UTC time (docs/budgets.md): the UTC time of a `now` is its
  /// count of seconds since its clock's epoch plus this offset. The node sets it from the
  /// system clock when it starts; a test or a simulation picks its own.
  double utc_offset = 0;

  /// Budget marks (docs/budgets.md, "When every root is lost"): 0, none; else a root keeps,
  /// per budget window, a durable mark that what is spent and allotted never passes, raised
  /// this fraction of the budget's limit at a time (`basic_engine::budget_mark_tasks`; the
  /// node stores it in etcd). A new master starts its count from it.
  double budget_mark_step = 0;

  /// Receives one line per notable event (e.g. a client reporting a lease the engine does not
  /// know). Null: silent.
  std::function<void(std::string_view)> log{};
};

namespace detail {

/// The decision steps and what they keep between decisions (when learning mode started, the
/// log throttle, released excess); `basic_engine` holds the resources and calls `decide`.
template <class Clock, class Algorithms>
class lease_decision {
 protected:
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using lease_type = basic_lease<time_point>;
  using store_type = basic_lease_store<time_point>;

  explicit lease_decision(engine_options options) : options_(std::move(options)) {}

  // One resource's state in an engine.
  struct resource {
    std::string id;
    resource_template tmpl;
    typename Algorithms::variant algorithm;
    store_type store;
    std::optional<lease_type> parent_lease;
    time_point parent_answers_at{};  // when this node asks its parent again, by its lease
    std::optional<algorithm_config> parent_algorithm;
    std::optional<budget_count> budget;  // a budget resource: its window's count here
    // An intermediate's budget: what its parent last said of it (window, limit, count) and the
    // most its clients may have spent in all in the window: what the parent counts of its
    // reports plus the allotment granted on top (docs/budgets.md).
    std::optional<budget_info> parent_budget;
    double budget_ceiling = 0;
    budget_mark_state mark{};  // a root keeping budget marks
    // Overload signals: an intermediate's, for its parent; a root's, for its learned capacity.
    std::optional<signal_count> signals;
    std::optional<learned_state<time_point>> learned;  // a root's learned capacity
  };

  [[nodiscard]] double utc(time_point now) const noexcept {
    return std::chrono::duration<double>(now.time_since_epoch()).count() + options_.utc_offset;
  }

  // Removes the leases ended by `now`. For a budget, what they held counts as spent (their
  // holders did not say what they spent of it), then the count moves to `now`'s window.
  void expire_leases(resource& r, time_point now) {
    if (!r.budget) {
      r.store.expire(now);
      return;
    }
    const double before = r.store.sum_held();
    r.store.expire(now);
    r.budget->add(before - r.store.sum_held());
    if (options_.is_root) {
      r.budget->roll(*r.tmpl.budget, utc(now));
    } else if (utc(now) >= static_cast<double>(r.budget->window().end)) {
      r.budget->roll_to({});  // over (its parent's lease with it): the parent names the next
    }
  }

  [[nodiscard]] time_point learning_until(const resource_template& t) const {
    return master_since_ + to_duration<duration>(t.algorithm.learning_mode_duration.count());
  }

  [[nodiscard]] double own_capacity(const resource& r, time_point now) const {
    if (r.budget && options_.is_root) {
      return std::max(0.0, std::min(r.tmpl.capacity, mark_bound(r)) - r.budget->spent());
    }
    if (options_.is_root) return r.learned ? r.learned->law.capacity() : r.tmpl.capacity;
    if (!r.parent_lease || r.parent_lease->expired(now)) return 0.0;
    // An intermediate's budget: what its clients may still spend of its ceiling.
    if (r.budget) return std::max(0.0, r.budget_ceiling - r.budget->spent());
    return r.parent_lease->capacity;
  }

  // What a root keeping budget marks may have spent and allotted in all: its window's durable
  // mark, once read (nothing before).
  [[nodiscard]] double mark_bound(const resource& r) const noexcept {
    if (!(options_.budget_mark_step > 0)) return std::numeric_limits<double>::infinity();
    const bool holds = r.mark.known && r.mark.window == r.budget->window().start;
    return holds ? r.mark.durable : 0.0;
  }

  [[nodiscard]] double safe_capacity(const resource& r, time_point now) const {
    if (r.tmpl.safe_capacity) return *r.tmpl.safe_capacity;
    const double subclients = r.store.totals().subclients;
    return own_capacity(r, now) / std::max(1.0, subclients);
  }

  [[nodiscard]] bool shares_capacity(const resource& r) const {
    return std::visit(
        [](const auto& a) { return static_cast<bool>(std::decay_t<decltype(a)>::shares_capacity); },
        r.algorithm);
  }

  // ---- one decision, in steps ----
  //
  // The default path reads top to bottom in `decide`: record the demand, hand back a lease
  // refreshed too soon, compute the grant (learning mode: confirm what the client has; else
  // the algorithm's share of what the others leave), set its expiry and refresh interval, cap
  // it by this node's own lease, store it. The Doorman-compatibility switches of
  // `engine_options` each steer one step, named there.

  using client_type = typename store_type::client;

  // What every step of one decision reads.
  struct decision {
    resource& r;
    std::string_view client_id;
    const std::optional<lease_info>& has;
    bool server;      // a server child (`get_server_capacity`), reporting `outstanding`
    double capacity;  // this node's, now
    bool sharing;     // the algorithm shares the capacity (not NO_ALGORITHM)
    bool learning;
    time_point now;
  };

  static duration as_duration(seconds s) noexcept { return to_duration<duration>(s.count()); }

  lease_type decide(resource& r, std::string_view client_id, std::span<const band_demand> bands,
                    const std::optional<lease_info>& has, std::optional<double> outstanding,
                    time_point now) {
    expire_leases(r, now);
    const decision d{.r = r,
                     .client_id = client_id,
                     .has = has,
                     .server = outstanding.has_value(),
                     .capacity = own_capacity(r, now),
                     .sharing = shares_capacity(r) || r.budget.has_value(),
                     .learning = now < learning_until(r.tmpl),
                     .now = now};
    std::vector<band_demand> kept;
    if (d.server && options_.count_outstanding) bands = demand_while_relearning(d, bands, kept);
    const double held_before = r.store.sum_held();
    const auto [c, created] = record_demand(d, bands, outstanding);
    const lease_type l = refreshed_too_soon(d, c, created) ? c.lease : grant(d, c, created);
    if (options_.report_releases && !options_.is_root && held_before > d.capacity + 1e-9 &&
        r.store.sum_held() < held_before - 1e-9) {
      ++excess_released_;  // news for the upstream (see `news`)
    }
    return l;
  }

  // The algorithm's grant (or learning mode's), shaped, bounded and stored.
  lease_type grant(const decision& d, const client_type& c, bool created) {
    double gets = 0;
    bool owed = false;
    if (d.learning) {
      if (auto echo = echo_in_learning(d, c)) return *echo;
      gets = confirm_in_learning(d, c);
    } else {
      std::tie(gets, owed) = share_of(d, c, created);
    }
    // A cut of a live lease counts as the larger lease until the client confirms it (the
    // store's `uncut`): the client is asked back soon, so that what it gave back is free soon.
    // A budget's allotment spent in the answer's flight would be lost from the count: always.
    const bool keep_cuts = options_.count_unconfirmed_cuts || d.r.budget;
    const bool cut = keep_cuts && !c.lease.expired(d.now) && gets < c.lease.capacity * (1 - 1e-9);
    lease_type l = shape(d, gets, owed, cut);
    if (!options_.is_root) bound_by_parent(d, l);
    if (d.r.budget) within_window(d, l);
    d.r.store.set_lease(c, l, d.now, keep_cuts);
    return l;
  }

  // A server child relearning (see `record_demand`) knows only the clients that have come
  // back to it so far: while it reports fewer subclients than before, keep its earlier
  // demand, so that a partial count does not shrink its share (nor, through this node's own
  // report, this node's). `kept` holds the earlier demand when it is used.
  std::span<const band_demand> demand_while_relearning(const decision& d,
                                                       std::span<const band_demand> bands,
                                                       std::vector<band_demand>& kept) const {
    const auto* known = d.r.store.find(d.client_id);
    if (known == nullptr || !relearning(*known, d.has, d.now)) return bands;
    const auto sub = [](const auto& list) {
      double n = 0;
      for (const auto& b : list)
        n += b.subclients;
      return n;
    };
    if (!(sub(bands) < sub(known->bands))) return bands;
    kept = known->bands.to_vector();
    return kept;
  }

  // Records the demand (the lease and the time of the last decision stay as they were), what
  // the client says it has (a cut it confirms stops counting at its larger size), and a server
  // child's outstanding grants. With `count_outstanding`, a server child that held a live lease
  // here but reports none lost its state (a new master): beneath it, its predecessor's grants
  // may still be out, which it will only learn (and report) as its clients come back, so what
  // it held (its lease, a cut not yet confirmed, its grants) counts until the child's learning
  // mode is over.
  typename store_type::demand_result record_demand(const decision& d,
                                                   std::span<const band_demand> bands,
                                                   std::optional<double> outstanding) {
    auto [c, created] = d.r.store.set_demand(d.client_id, bands);
    const bool relearn =
        outstanding && options_.count_outstanding && !created && starts_relearning(c, d.has, d.now);
    if (relearn) {
      d.r.store.set_relearn(c, store_type::held(c),
                            d.now + as_duration(d.r.tmpl.algorithm.learning_mode_duration));
    }
    d.r.store.confirm_cut(c, reported(d), d.now);
    if (!outstanding) return {c, created};
    double out = *outstanding;
    if (options_.count_outstanding && d.now < c.relearn_until()) {
      out = std::max(out, c.relearn_floor());
    }
    d.r.store.set_server_info(c, out);
    return {c, created};
  }

  // A client asking again sooner than `minimum_refresh_interval` gets its lease back as it is.
  // Server children are few and refresh on purpose faster than clients: no minimum for them.
  // Nor for a client holding nothing: rerunning the algorithm for it costs little and lets it
  // in as soon as capacity appears (e.g. an intermediate's first lease from its parent). Nor
  // for a lease with less than the minimum left: an intermediate's grant ends with its own
  // lease, and a client that comes back as it ends must get one that ends with the lease the
  // parent has renewed since, not the old one again (it would run out, unrenewed).
  [[nodiscard]] bool refreshed_too_soon(const decision& d, const client_type& c,
                                        bool created) const {
    const auto minimum = as_duration(options_.minimum_refresh_interval);
    return !created && !c.lease.expired(d.now) && !d.server && c.lease.capacity > 0 &&
           minimum > duration::zero() && d.now - c.last_decision < minimum &&
           c.lease.expiry - d.now >= minimum;
  }

  // What the client says it has, when its lease is live (0 for a newcomer).
  [[nodiscard]] static double reported(const decision& d) noexcept {
    return d.has && d.has->expires_in > 0 ? d.has->capacity : 0.0;
  }

  // `echo_in_learning`: an intermediate with no capacity from its parent yet cannot confirm
  // anything in learning mode: it hands the client's lease back unchanged (no capacity is
  // created, the expiry is not extended), recorded so that the parent hears of it as
  // outstanding, and asks the client back soon. (Cutting it to 0 instead would stick: the
  // client would report 0 from then on.) Nothing when that does not apply.
  std::optional<lease_type> echo_in_learning(const decision& d, const client_type& c) {
    const double has = reported(d);
    // A root's capacity is configured, so a 0 there is known, not missing: nothing to echo.
    if (!(!options_.is_root && d.sharing && options_.echo_in_learning && d.capacity <= 0 &&
          has > 0)) {
      return {};
    }
    const auto& alg = d.r.tmpl.algorithm;
    lease_type echo;
    echo.capacity = has;
    echo.expiry =
        d.now + to_duration<duration>(std::min(d.has->expires_in, alg.lease_length.count()));
    // Soon, and before the echoed lease runs out: a client coming back at its expiry would no
    // longer report it, and would be granted nothing until learning mode ends.
    echo.refresh_interval =
        std::min({as_duration(alg.refresh_interval),
                  as_duration(options_.no_parent_refresh_interval), (echo.expiry - d.now) / 2});
    // Not a decision: the minimum refresh interval must not hand it back again.
    d.r.store.set_lease(c, echo, d.now - as_duration(options_.minimum_refresh_interval));
    return echo;
  }

  // Learning mode: the engine does not know who holds what yet, so it confirms what the
  // client says it has, within what fits: the whole capacity (Doorman), or (`echo_in_learning`)
  // what the others' leases leave of it. Leases only: what server children hold beyond theirs
  // is being given back.
  [[nodiscard]] double confirm_in_learning(const decision& d, const client_type& c) const {
    const double has = reported(d);
    if (!d.sharing) return has;
    return std::min(
        has, options_.echo_in_learning ? d.capacity - d.r.store.leased_by_others(c) : d.capacity);
  }

  // The algorithm's share over the client's bands, within what the others hold (their leases,
  // and with `count_outstanding` what server children granted beyond theirs). Also whether
  // the client is owed: granted noticeably less than its share, because others still hold it.
  std::pair<double, bool> share_of(const decision& d, const client_type& c, bool created) const {
    if (created && d.has && d.has->capacity > 0 && d.has->expires_in > 0 && options_.log) {
      // One line per 10 s at most: after a restart, every client reports one.
      unknown_lease_log_.log(options_.log,
                             "resource " + d.r.id + ": client " + std::string(d.client_id) +
                                 " reports a lease of " + std::to_string(d.has->capacity) +
                                 " this engine does not know; treated as a newcomer",
                             d.now);
    }
    const double others =
        options_.count_outstanding ? d.r.store.held_by_others(c) : d.r.store.leased_by_others(c);
    double entitled = 0;
    std::visit(
        [&](const auto& alg) {
          for (const auto& b : c.bands) {
            const share_index& idx = *d.r.store.band(b.priority);
            const band_context ctx{idx, d.capacity,
                                   d.r.store.band_capacity(b.priority, d.capacity)};
            entitled += alg.share(ctx, demand{b.wants, b.subclients});
          }
        },
        d.r.algorithm);
    if (!d.sharing) return {entitled, false};
    double gets = std::min(entitled, d.capacity - others);
    // More is out than the capacity (`share_cuts`): the others' leases come down to their
    // shares at their own refreshes, so this one comes down to its share too.
    const double holds = c.lease.expired(d.now) ? 0.0 : c.lease.capacity;
    if (options_.share_cuts && d.capacity - others < holds) {
      gets = std::max(gets, std::min(entitled, holds));
    }
    return {gets, gets < entitled * 0.99};
  }

  // The lease for a grant: the template's length and refresh interval (× `decay_factor` for a
  // server child), the refresh brought forward to the end of learning mode
  // (`refresh_after_learning`: server children first, clients a little later, so that
  // capacity has come down the tree when they ask) or, for a client owed capacity
  // (`refresh_when_owed`), to a quarter of the interval (never below the minimum refresh
  // interval for clients), and for a client whose lease was cut to a quarter (below the
  // minimum: the cut is not free for others until it confirms it).
  [[nodiscard]] lease_type shape(const decision& d, double gets, bool owed, bool cut) const {
    const auto& alg = d.r.tmpl.algorithm;
    lease_type l;
    // Within the wire's bounds whatever the algorithm computed (NO_ALGORITHM grants the sum of
    // a child's bands, which may exceed any one band's bound).
    l.capacity = detail::bounded_quantity(gets);
    l.expiry = d.now + as_duration(alg.lease_length);
    l.refresh_interval = to_duration<duration>(alg.refresh_interval.count() *
                                               (d.server ? options_.decay_factor : 1.0));
    if (d.learning && options_.refresh_after_learning) {
      const auto stagger =
          d.server ? duration::zero() : as_duration(options_.no_parent_refresh_interval);
      l.refresh_interval =
          std::min(l.refresh_interval,
                   std::max(learning_until(d.r.tmpl) - d.now + stagger, duration::zero()));
    } else if (owed && options_.refresh_when_owed) {
      const auto minimum = as_duration(options_.minimum_refresh_interval);
      l.refresh_interval =
          std::min(l.refresh_interval,
                   d.server ? l.refresh_interval / 4 : std::max(minimum, l.refresh_interval / 4));
    } else if (cut && options_.refresh_when_owed) {
      // Back within a quarter of the interval, even below the minimum: until it confirms,
      // what it gave back is not free, and the clients owed it come back at the minimum.
      l.refresh_interval = l.refresh_interval / 4;
    }
    return l;
  }

  // An intermediate's grant never outlives its own lease and comes back before it ends. With
  // a lease of 0 from the parent (it is learning, or did not have the demand yet) and
  // `refresh_when_owed`, the client comes back shortly after this node has asked its parent
  // again. Without a live lease there is nothing to give until the parent answers (usually
  // milliseconds): 0, for `no_parent_refresh_interval`, so that the demand is kept for the
  // parent to hear about.
  void bound_by_parent(const decision& d, lease_type& l) const {
    const auto soon = as_duration(options_.no_parent_refresh_interval);
    const auto& parent = d.r.parent_lease;
    if (!parent || parent->expired(d.now)) {
      l.capacity = 0;
      l.refresh_interval = std::min(l.refresh_interval, soon);
      l.expiry = d.now + l.refresh_interval;
      return;
    }
    l.expiry = std::min(l.expiry, parent->expiry);
    l.refresh_interval = std::min(l.refresh_interval, l.expiry - d.now);
    if (d.capacity <= 0 && options_.refresh_when_owed) {
      l.refresh_interval =
          std::min(l.refresh_interval, std::max(soon, d.r.parent_answers_at - d.now + soon));
    }
  }

  // A budget's allotment ends with its window, and its holder comes back then for the next.
  void within_window(const decision& d, lease_type& l) const {
    const double left = static_cast<double>(d.r.budget->window().end) - utc(d.now);
    const time_point end = d.now + to_duration<duration>(std::max(0.0, left));
    l.expiry = std::min(l.expiry, end);
    l.refresh_interval = std::min(l.refresh_interval, l.expiry - d.now);
    // A root that has not stored its first mark of the window yet allots nothing of it; the
    // mark takes a read and a write (milliseconds), so the client comes back as soon as one
    // waiting for its parent's capacity would, not a whole interval later.
    if (options_.is_root && mark_bound(d.r) <= 0) {
      l.refresh_interval =
          std::min(l.refresh_interval, as_duration(options_.no_parent_refresh_interval));
    }
  }

  // A server child that held a live lease here reports none: it lost its state.
  [[nodiscard]] static bool starts_relearning(const typename store_type::client& c,
                                              const std::optional<lease_info>& has,
                                              time_point now) noexcept {
    return !c.lease.expired(now) && c.lease.capacity > 0 && !(has && has->expires_in > 0);
  }

  [[nodiscard]] static bool relearning(const typename store_type::client& c,
                                       const std::optional<lease_info>& has,
                                       time_point now) noexcept {
    return now < c.relearn_until() || starts_relearning(c, has, now);
  }

  engine_options options_;
  time_point master_since_{};  // learning mode counts from here
  mutable log_throttle<time_point> unknown_lease_log_{seconds(10)};
  std::uint64_t excess_released_ = 0;
};

}  // namespace detail
}  // namespace doorman
