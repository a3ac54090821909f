#pragma once

/// \file
/// The server engine: a node's capacity decisions as plain calls taking `now` (sans-I/O).
///
///     doorman::basic_engine<doorman::manual_clock> engine(repo);
///     engine.set_mastership(true, "127.0.0.1:7700", clock.now());
///     auto r = engine.get_capacity({"client-1", {{"mysql-17", 0, 40.0, std::nullopt}}},
///     clock.now());
///     // r.value().resources[0].gets.capacity

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "doorman/core/algorithm.hpp"
#include "doorman/core/config.hpp"
#include "doorman/core/error.hpp"
#include "doorman/core/hit_counts.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/lease_store.hpp"
#include "doorman/core/log_throttle.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/core/string_hash.hpp"
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
  /// but not in a storm while it is away.
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

  /// Receives one line per notable event (e.g. a client reporting a lease the engine does not
  /// know). Null: silent.
  std::function<void(std::string_view)> log{};
};

/// The capacity server of one tree position, deciding one requester at a time.
///
/// Time comes in as `now` on every call; `Clock` only fixes the time types. Not thread-safe:
/// one owner (a strand) calls it. Cost per decision: O(log n) in the resource's clients.
template <clock Clock, class Algorithms = default_algorithms>
class basic_engine {
 public:
  using clock_type = Clock;
  using time_point = typename Clock::time_point;
  using duration = typename Clock::duration;
  using lease_type = basic_lease<time_point>;
  using store_type = basic_lease_store<time_point>;
  using algorithms = Algorithms;

  /// An engine that is not master until `set_mastership` says so.
  /// Throws `std::invalid_argument` when `options.decay_factor` is not in (0, 1].
  explicit basic_engine(resource_repository config, engine_options options = {})
      : config_(std::move(config)), options_(std::move(options)) {
    if (!(options_.decay_factor > 0 && options_.decay_factor <= 1)) {
      throw std::invalid_argument("decay_factor must be in (0, 1]");
    }
  }

  /// Parses a configuration accepting exactly this engine's algorithm kinds. Throws
  /// `config_error`.
  [[nodiscard]] static resource_repository parse_config(std::string_view text) {
    return resource_repository::parse(text, Algorithms::kinds);
  }

  /// Replaces the configuration; every lease and demand is kept and each resource resolves its
  /// template again (new capacity, algorithm and lease parameters apply from the next decision).
  void set_config(resource_repository config) {
    config_ = std::move(config);
    ++config_generation_;  // `count_hits` limits are looked up again
    for (auto& [id, r] : resources_)
      configure(r);
  }

  [[nodiscard]] const resource_repository& config() const noexcept { return config_; }
  [[nodiscard]] const engine_options& options() const noexcept { return options_; }

  /// Becoming master forgets every lease and starts learning mode at `now`; losing mastership
  /// forgets every lease too (the new master owns them). `master` is where to redirect.
  ///
  /// `quiet`: how long before `now` the previous master is known to have stopped granting (an
  /// election that waited out the old master's lock, or a position that was unreachable that
  /// long). Its leases end within a lease length of that, so learning mode is that much
  /// shorter (none once a whole lease length has passed).
  void set_mastership(bool is_master, std::optional<std::string> master, time_point now,
                      duration quiet = duration::zero()) {
    if (is_master != mastership_.is_master) {
      resources_.clear();
      if (is_master) master_since_ = now - std::max(quiet, duration::zero());
    }
    mastership_ = {is_master, std::move(master)};
  }

  [[nodiscard]] const mastership_info& mastership() const noexcept { return mastership_; }

  /// Fencing: a master answers as master only before `t`, its election's validity deadline
  /// (`election_term::valid_until`). Every call at or after it steps the engine down first
  /// (`fence`), so a task that was paused past its term answers what queued up meanwhile as a
  /// non-master that knows no master. `time_point::max()`, the default, is no deadline.
  void set_valid_until(time_point t) noexcept { valid_until_ = t; }
  [[nodiscard]] time_point valid_until() const noexcept { return valid_until_; }

  /// Steps down (every lease forgotten, the master unknown) when master and the term is over at
  /// `now`; true when it did. Every call that decides or reports runs it first.
  bool fence(time_point now) {
    if (!mastership_.is_master || now < valid_until_) return false;
    set_mastership(false, std::nullopt, now);
    ++fenced_;
    return true;
  }

  /// How many times `fence` stepped the engine down.
  [[nodiscard]] std::uint64_t fenced() const noexcept { return fenced_; }

  /// For an intermediate: the lease this node holds from its parent for `resource_id`, and the
  /// parent's algorithm and lease parameters for it, which replace the local template's (a kind
  /// this engine does not know is ignored, with a log line). Returns false when not master.
  bool set_parent_lease(std::string_view resource_id, const lease_type& lease, time_point now,
                        const std::optional<algorithm_config>& algorithm = std::nullopt) {
    fence(now);
    if (!mastership_.is_master) return false;
    resource& r = resource_for(resource_id, now);
    r.parent_lease = lease;
    r.parent_answers_at = now + lease.refresh_interval;
    if (algorithm && algorithm != r.parent_algorithm) {
      if (std::find(Algorithms::kinds.begin(), Algorithms::kinds.end(), algorithm->kind) ==
          Algorithms::kinds.end()) {
        if (options_.log) {
          options_.log("warning: resource " + r.id + ": parent's algorithm " + algorithm->kind +
                       " is unknown here; keeping " + r.tmpl.algorithm.kind);
        }
      } else {
        r.parent_algorithm = algorithm;
        configure(r);
      }
    }
    return true;
  }

  /// The lease this node holds from its parent for `resource_id`, if any (expired or not).
  [[nodiscard]] std::optional<lease_type> parent_lease(std::string_view resource_id) const {
    const auto it = resources_.find(resource_id);
    if (it == resources_.end()) return std::nullopt;
    return it->second.parent_lease;
  }

  /// The template in effect for `resource_id`: the configured one, with the algorithm learned
  /// from the parent when there is one.
  [[nodiscard]] resource_template template_of(std::string_view resource_id) const {
    const auto it = resources_.find(resource_id);
    if (it == resources_.end()) return config_.find(resource_id);
    return it->second.tmpl;
  }

  /// Whether `resource_id` is in learning mode at `now`.
  [[nodiscard]] bool learning(std::string_view resource_id, time_point now) const {
    if (!mastership_.is_master) return false;
    return now < learning_until(template_of(resource_id));
  }

  /// The capacity this engine has for `resource_id` at `now`.
  [[nodiscard]] double capacity(std::string_view resource_id, time_point now) const {
    if (options_.is_root) return config_.find(resource_id).capacity;
    const auto it = resources_.find(resource_id);
    if (it == resources_.end()) return 0;
    return own_capacity(it->second, now);
  }

  /// The lease store of `resource_id`, or null when it has no state.
  [[nodiscard]] const store_type* store(std::string_view resource_id) const {
    const auto it = resources_.find(resource_id);
    return it == resources_.end() ? nullptr : &it->second.store;
  }

  /// How many times a resource's state was created (a cheap "something new" signal).
  [[nodiscard]] std::uint64_t resources_created() const noexcept { return resources_created_; }

  /// Something the parent should hear about soon: a resource's state was created, or (with
  /// `report_releases`) a node holding more than its capacity (its parent shrank its lease)
  /// saw its clients give some of it back, which its parent is waiting for. A counter: the
  /// upstream asks again (after its floor) when it changes.
  [[nodiscard]] std::uint64_t news() const noexcept {
    return resources_created_ + excess_released_;
  }

  /// Calls `f(resource_id, const store_type&)` for every resource with state.
  template <class F>
  void for_each_resource(F&& f) const {
    for (const auto& [id, r] : resources_)
      f(std::string_view(r.id), r.store);
  }

  /// A hint before `get_capacity(req, ...)` or `get_server_capacity` (changes nothing): stage 0
  /// brings the hash cells of the client's lookups into cache, stage 1 (once those are there)
  /// its records. A caller holding several requests runs stage 0 for all of them, then stage
  /// 1, then decides: their cache misses overlap instead of following one another. (The index
  /// paths were tried as a stage 2: no gain, as the index prefetches its own path already.)
  template <class Request>
  void prefetch(const Request& req, std::string_view client_id, int stage) const noexcept {
    for (const auto& x : req.resources) {
      const auto it = resources_.find(std::string_view(x.resource_id));
      if (it == resources_.end()) continue;
      if (stage == 0) {
        it->second.store.prefetch_cell(client_id);
      } else {
        it->second.store.prefetch_client(client_id);
      }
    }
  }

  /// `get_capacity`: decides every listed resource for one client.
  [[nodiscard]] result<capacity_response> get_capacity(const capacity_request& req,
                                                       time_point now) {
    return decide_each<capacity_response>(req, now, [&](const resource_request& x, resource& r) {
      const band_demand band{x.priority, x.wants, 1};
      const lease_type l = decide(r, req.client_id, std::span(&band, 1), x.has, std::nullopt, now);
      return resource_grant{x.resource_id, to_lease_info(l, now), safe_capacity(r, now)};
    });
  }

  /// `get_server_capacity`: decides every listed resource for a server child, which counts as
  /// as many subclients as it reports clients, per priority band.
  [[nodiscard]] result<server_capacity_response> get_server_capacity(
      const server_capacity_request& req, time_point now) {
    std::vector<band_demand> bands;
    return decide_each<server_capacity_response>(
        req, now, [&](const server_resource_request& x, resource& r) {
          bands.clear();
          for (const auto& b : x.wants) {
            bands.push_back({b.priority, b.wants, static_cast<double>(b.num_clients)});
          }
          const lease_type l = decide(r, req.server_id, bands, x.has, x.outstanding, now);
          return server_resource_grant{x.resource_id, to_lease_info(l, now), safe_capacity(r, now),
                                       r.tmpl.algorithm};
        });
  }

  /// `release_capacity`: forgets the client's leases (and demand) on the listed resources.
  [[nodiscard]] result<release_response> release_capacity(const release_request& req,
                                                          time_point now) {
    if (auto e = validate(req)) return *e;
    fence(now);
    if (mastership_.is_master) {
      for (const auto& id : req.resources) {
        const auto it = resources_.find(id);
        if (it == resources_.end()) continue;
        it->second.store.erase(req.client_id);
        it->second.store.expire(now);
      }
    }
    return release_response{mastership_};
  }

  /// `count_hits`: counts each listed resource's hits in its current fixed window, exactly:
  /// admitted when they fit in what the window has left of the limit (the resource's capacity
  /// × the window, rounded down), else refused whole. Windows are multiples of their length on
  /// this engine's clock; a count with another window length than the resource's last keeps
  /// the hits counted in the window under way (a count restarts only when its window ends).
  /// Only a root counts (an intermediate holds a share, not the limit); a non-master
  /// answers with its mastership alone. A new master counts from zero.
  [[nodiscard]] result<count_response> count_hits(const count_request& req, time_point now) {
    if (!options_.is_root) {
      return request_error{errc::invalid_params,
                           "resources: counted only at the root (this node has a parent)",
                           "resources"};
    }
    return answer_each<count_response>(req, now, [&](const hit_count& x) {
      return counts_.count(
          x, now, [&] { return count_limit(x); }, config_generation_);
    });
  }

  /// `count_hits` counters held now.
  [[nodiscard]] std::size_t hit_counters() const noexcept { return counts_.size(); }

  /// `discovery`: who is master at `now` (fenced first, as every call).
  [[nodiscard]] discovery_response discovery(time_point now) {
    fence(now);
    return {mastership_};
  }

  /// `status`: every resource with state; with a resource id, that resource and its leases
  /// (`page` of them, in client id order).
  [[nodiscard]] result<status_response> status(const status_request& req, time_point now,
                                               const lease_page& page = {}) {
    if (auto e = validate(req, page)) return *e;
    fence(now);
    expire(now);
    status_response out;
    out.mastership = mastership_;
    if (req.resource_id) {
      out.resources.push_back(describe(*req.resource_id, now));
      out.lease_count = 0;
      if (const auto it = resources_.find(*req.resource_id); it != resources_.end()) {
        page_of_leases(it->second, page, now, out);
      }
      return out;
    }
    for (const auto& [id, r] : resources_)
      out.resources.push_back(describe(r.id, now));
    std::sort(out.resources.begin(), out.resources.end(),
              [](const auto& a, const auto& b) { return a.resource_id < b.resource_id; });
    return out;
  }

  /// Removes expired leases of every resource, and resources left with no state. O(resources +
  /// expired leases); the decision path only expires the resource it touches.
  void expire(time_point now) {
    counts_.sweep(now);
    for (auto it = resources_.begin(); it != resources_.end();) {
      resource& r = it->second;
      r.store.expire(now);
      const bool parent_lease_live = r.parent_lease && !r.parent_lease->expired(now);
      if (r.store.size() == 0 && !parent_lease_live) {
        it = resources_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  /// What both decisions share: the request validated, the term fenced; a non-master answers
  /// with its mastership alone, a master with `decide_one(item, resource)` for each item.
  template <class Response, class Request, class DecideOne>
  [[nodiscard]] result<Response> decide_each(const Request& req, time_point now,
                                             DecideOne decide_one) {
    return answer_each<Response>(
        req, now, [&](const auto& x) { return decide_one(x, resource_for(x.resource_id, now)); });
  }

  /// The same for any request of resources: `answer_one(item)` for each item, when master.
  template <class Response, class Request, class AnswerOne>
  [[nodiscard]] result<Response> answer_each(const Request& req, time_point now,
                                             AnswerOne answer_one) {
    if (auto e = validate(req)) return *e;
    Response out;
    fence(now);
    out.mastership = mastership_;
    if (!mastership_.is_master) return out;
    out.resources.reserve(req.resources.size());
    for (const auto& x : req.resources)
      out.resources.push_back(answer_one(x));
    return out;
  }

  [[nodiscard]] double count_limit(const hit_count& x) const {
    // rate × window may land a hair under the integer it means (10 / 60 × 60)
    return std::floor(config_.find(x.resource_id).capacity * x.window + 1e-6);
  }

  struct resource {
    std::string id;
    resource_template tmpl;
    typename Algorithms::variant algorithm;
    store_type store;
    std::optional<lease_type> parent_lease;
    time_point parent_answers_at{};  // when this node asks its parent again, by its lease
    std::optional<algorithm_config> parent_algorithm;
  };

  void configure(resource& r) const {
    r.tmpl = config_.find(r.id);
    if (r.parent_algorithm) r.tmpl.algorithm = *r.parent_algorithm;
    r.algorithm = Algorithms::make(r.tmpl.algorithm.kind, r.tmpl.algorithm.parameters);
  }

  resource& resource_for(std::string_view id, time_point) {
    auto it = resources_.find(id);
    if (it == resources_.end()) {
      it = resources_.emplace(std::string(id), resource{}).first;
      ++resources_created_;
      it->second.id.assign(id);
      configure(it->second);
    }
    return it->second;
  }

  [[nodiscard]] time_point learning_until(const resource_template& t) const {
    return master_since_ + to_duration<duration>(t.algorithm.learning_mode_duration.count());
  }

  [[nodiscard]] double own_capacity(const resource& r, time_point now) const {
    if (options_.is_root) return r.tmpl.capacity;
    return r.parent_lease && !r.parent_lease->expired(now) ? r.parent_lease->capacity : 0.0;
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
    r.store.expire(now);
    const decision d{.r = r,
                     .client_id = client_id,
                     .has = has,
                     .server = outstanding.has_value(),
                     .capacity = own_capacity(r, now),
                     .sharing = shares_capacity(r),
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
    const bool cut = options_.count_unconfirmed_cuts && !c.lease.expired(d.now) &&
                     gets < c.lease.capacity * (1 - 1e-9);
    lease_type l = shape(d, gets, owed, cut);
    if (!options_.is_root) bound_by_parent(d, l);
    d.r.store.set_lease(c, l, d.now, options_.count_unconfirmed_cuts);
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
    const double gets = std::min(entitled, d.capacity - others);
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

  // The leases of `r` in client id order from `req.offset`, at most `req.limit`: O(leases) to
  // pick the page (partitions, not a full sort), then O(page × log page).
  void page_of_leases(const resource& r, const lease_page& req, time_point now,
                      status_response& out) const {
    using holder = typename store_type::client;
    std::vector<const holder*> all;
    all.reserve(r.store.size());
    r.store.for_each([&](const holder& c) { all.push_back(&c); });
    out.lease_count = all.size();
    const auto by_id = [](const holder* a, const holder* b) { return a->id < b->id; };
    const std::size_t from = std::min(all.size(), static_cast<std::size_t>(req.offset));
    const std::size_t to =
        req.limit ? std::min(all.size(), from + static_cast<std::size_t>(*req.limit)) : all.size();
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(from);
    const auto last = all.begin() + static_cast<std::ptrdiff_t>(to);
    if (from > 0) std::nth_element(all.begin(), first, all.end(), by_id);
    if (to < all.size()) std::nth_element(first, last, all.end(), by_id);
    std::sort(first, last, by_id);
    out.leases.reserve(to - from);
    for (auto i = first; i != last; ++i) {
      const holder& c = **i;
      out.leases.push_back({c.id, to_lease_info(c.lease, now), c.wants(), c.subclients(),
                            c.is_server, c.outstanding(), c.bands.to_vector()});
    }
  }

  [[nodiscard]] resource_status describe(const std::string& id, time_point now) const {
    resource_status s;
    s.resource_id = id;
    s.capacity = capacity(id, now);
    s.learning = learning(id, now);
    const auto it = resources_.find(id);
    if (it == resources_.end()) {
      s.algorithm = config_.find(id).algorithm.kind;
      return s;
    }
    const resource& r = it->second;
    s.algorithm = std::string(Algorithms::kind_of(r.algorithm));
    s.sum_has = r.store.sum_has();
    const auto totals = r.store.totals();
    s.sum_wants = totals.wants;
    s.subclients = totals.subclients;
    s.clients = r.store.size();
    return s;
  }

  resource_repository config_;
  engine_options options_;
  mastership_info mastership_;
  time_point master_since_{};                   // learning mode counts from here
  time_point valid_until_ = time_point::max();  // the term's end (fencing)
  std::uint64_t fenced_ = 0;
  mutable log_throttle<time_point> unknown_lease_log_{seconds(10)};
  std::unordered_map<std::string, resource, string_hash, std::equal_to<>> resources_;
  std::uint64_t resources_created_ = 0;
  std::uint64_t excess_released_ = 0;
  hit_counts<Clock> counts_{options_.max_hit_counters};
  std::uint64_t config_generation_ = 0;  // set_config calls so far
};

/// The engine on the steady clock.
using engine = basic_engine<std::chrono::steady_clock>;

}  // namespace doorman
