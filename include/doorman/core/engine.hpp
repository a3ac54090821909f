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
#include "doorman/core/budget_steps.hpp"
#include "doorman/core/config.hpp"
#include "doorman/core/error.hpp"
#include "doorman/core/hit_counts.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/lease_decision.hpp"
#include "doorman/core/lease_store.hpp"
#include "doorman/core/log_throttle.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/core/string_hash.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// The capacity server of one tree position, deciding one requester at a time.
///
/// Time comes in as `now` on every call; `Clock` only fixes the time types. Not thread-safe:
/// one owner (a strand) calls it. Cost per decision: O(log n) in the resource's clients.
template <clock Clock, class Algorithms = default_algorithms>
class basic_engine : private detail::budget_steps<Clock, Algorithms> {
  using base = detail::budget_steps<Clock, Algorithms>;
  using resource = typename base::resource;
  using base::adopt_budget;
  using base::budget_of;
  using base::budget_state;
  using base::charge;
  using base::configure_learned;
  using base::decide;
  using base::draw_hits;
  using base::excess_released_;
  using base::expire_leases;
  using base::learn_from;
  using base::learning_until;
  using base::mark_task;
  using base::marks_;
  using base::master_since_;
  using base::mind_mark;
  using base::options_;
  using base::overload_news_;
  using base::own_capacity;
  using base::safe_capacity;
  using base::settle_release;
  using base::signals_for_parent;
  using base::step_learned;
  using base::unreportable;
  using base::utc;

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
      : base(std::move(options)), config_(std::move(config)) {
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
      marks_.new_term();
      if (is_master) master_since_ = now - std::max(quiet, duration::zero());
    }
    mastership_ = {is_master, std::move(master)};
  }

  [[nodiscard]] const mastership_info& mastership() const noexcept { return mastership_; }

  /// Sets `engine_options::utc_offset` (an embedding that follows the system clock as it is
  /// stepped calls it; doorman-node sets the offset once, when it starts).
  void set_utc_offset(double seconds_since_epoch_at_clock_zero) noexcept {
    options_.utc_offset = seconds_since_epoch_at_clock_zero;
  }

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
  /// this engine does not know is ignored, with a log line). For a budget, `budget`: the
  /// parent's word on its window and on this node's spend (the lease is then an allotment;
  /// docs/budgets.md). Returns false when not master.
  bool set_parent_lease(std::string_view resource_id, const lease_type& lease, time_point now,
                        const std::optional<algorithm_config>& algorithm = std::nullopt,
                        const std::optional<budget_info>& budget = std::nullopt) {
    fence(now);
    if (!mastership_.is_master) return false;
    resource& r = resource_for(resource_id, now);
    r.parent_lease = lease;
    r.parent_answers_at = now + lease.refresh_interval;
    adopt_budget(r, lease, budget, now);
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

  /// For an intermediate, a budget resource's part of its request to its parent (`x`, whose
  /// `has` is the parent's lease when live): `spend`, what its clients spent in the parent's
  /// window in all (counted as a root counts it), and as `has`, what it has left of its
  /// allotments (its ceiling less that). Leaves `x` as it is for a resource that is not a
  /// budget here (yet: the parent's first answer says so).
  void report_budget(server_resource_request& x) const {
    const auto it = resources_.find(x.resource_id);
    if (options_.is_root || it == resources_.end() || !it->second.budget) return;
    const resource& r = it->second;
    x.spend = budget_spend{r.budget->window().start, r.budget->spent()};
    if (x.has) x.has->capacity = std::max(0.0, r.budget_ceiling - r.budget->spent());
  }

  /// For an intermediate, a resource's overload signals for its parent at `now` (`signals`):
  /// its clients' calls and overloads in all, as their rates say (docs/learned-capacity.md).
  /// Nothing when none reported.
  void report_signals(server_resource_request& x, time_point now) {
    const auto it = resources_.find(x.resource_id);
    if (!options_.is_root && it != resources_.end())
      x.signals = signals_for_parent(it->second, now);
  }

  using budget_mark_task = doorman::budget_mark_task;

  /// Whether a budget mark is to be read or raised (cheap: after every batch of calls).
  [[nodiscard]] bool budget_marks_due() const noexcept { return marks_.due(); }

  /// The marks to read or raise now, each out until `budget_mark_done` (`detail::budget_marks`
  /// says when one is due).
  [[nodiscard]] std::vector<budget_mark_task> budget_mark_tasks(time_point now) {
    std::vector<budget_mark_task> out;
    fence(now);
    auto due = marks_.take();
    if (!mastership_.is_master) return out;
    for (const auto& id : due) {
      const auto it = resources_.find(id);
      if (it == resources_.end() || !it->second.budget) continue;
      resource& r = it->second;
      expire_leases(r, now);
      r.mark.busy = false;  // queued, not out
      if (auto t = mark_task(r)) {
        r.mark.busy = true;
        out.push_back(std::move(*t));
      }
    }
    return out;
  }

  /// A mark task's outcome: `mark` is what is stored for the task's window now (a read: 0 when
  /// nothing is, or it is of another window; a raise: the value written), or nothing when the
  /// task failed (it comes again). A read starts the window's count from the mark (at most
  /// that much was spent and allotted before: `budget_count::restore`).
  void budget_mark_done(const budget_mark_task& t, std::optional<double> mark, time_point now) {
    const auto it = resources_.find(t.resource_id);
    if (!mastership_.is_master || it == resources_.end() || !it->second.budget) return;
    resource& r = it->second;
    expire_leases(r, now);
    if (marks_.done(t, mark, r.mark, *r.budget)) mind_mark(r);
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
    const auto it = resources_.find(resource_id);
    if (it == resources_.end()) return options_.is_root ? config_.find(resource_id).capacity : 0;
    if (options_.is_root && !it->second.learned) return it->second.tmpl.capacity;
    return own_capacity(it->second, now);
  }

  /// `resource_id`'s learned capacity's last steps, oldest first, `at` relative to `now`.
  [[nodiscard]] std::vector<learned_point> learned_history(std::string_view resource_id,
                                                           time_point now) const {
    const auto it = resources_.find(resource_id);
    return base::history_of(it == resources_.end() ? nullptr : &it->second, now);
  }

  /// The lease store of `resource_id`, or null when it has no state.
  [[nodiscard]] const store_type* store(std::string_view resource_id) const {
    const auto it = resources_.find(resource_id);
    return it == resources_.end() ? nullptr : &it->second.store;
  }

  /// How many times a resource's state was created (a cheap "something new" signal).
  [[nodiscard]] std::uint64_t resources_created() const noexcept { return resources_created_; }

  /// Something the parent should hear about soon: a resource's state was created, clients gave
  /// back some of an excess (`report_releases`), or (an intermediate) a client reported
  /// overloads (docs/learned-capacity.md). A counter: the upstream asks again (after its
  /// floor) when it changes.
  [[nodiscard]] std::uint64_t news() const noexcept {
    return resources_created_ + excess_released_ + overload_news_;
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
      if (r.budget && !req.reports_spend) {
        return resource_grant{x.resource_id, unreportable(r, req.client_id, now), 0.0, {}};
      }
      const band_demand band{x.priority, x.wants, 1};
      learn_from(r, req.client_id, x.signals, std::span(&band, 1), now);
      if (r.budget) charge(r, req.client_id, x, now);
      const lease_type l = decide(r, req.client_id, std::span(&band, 1), x.has, std::nullopt, now);
      if (r.budget) mind_mark(r);
      // Nothing of a budget may be spent without an allotment: no safe capacity.
      return resource_grant{x.resource_id, to_lease_info(l, now),
                            r.budget ? 0.0 : safe_capacity(r, now), budget_of(r, now)};
    });
  }

  /// `get_server_capacity`: decides every listed resource for a server child, which counts as
  /// as many subclients as it reports clients, per priority band.
  [[nodiscard]] result<server_capacity_response> get_server_capacity(
      const server_capacity_request& req, time_point now) {
    std::vector<band_demand> bands;
    return decide_each<server_capacity_response>(
        req, now, [&](const server_resource_request& x, resource& r) {
          if (r.budget && !req.reports_spend) {
            return server_resource_grant{
                x.resource_id, unreportable(r, req.server_id, now), 0.0, r.tmpl.algorithm, {}};
          }
          bands.clear();
          for (const auto& b : x.wants) {
            bands.push_back({b.priority, b.wants, static_cast<double>(b.num_clients)});
          }
          learn_from(r, req.server_id, x.signals, bands, now);
          // A budget's server child reports for its clients as a client does for itself.
          if (r.budget) charge(r, req.server_id, x, now);
          const lease_type l = decide(r, req.server_id, bands, x.has, x.outstanding, now);
          if (r.budget) mind_mark(r);
          server_resource_grant g{x.resource_id, to_lease_info(l, now),
                                  r.budget ? 0.0 : safe_capacity(r, now), r.tmpl.algorithm,
                                  budget_of(r, now)};
          if (g.budget) g.budget->counted = r.budget->counted(req.server_id);
          return g;
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
        if (it->second.budget) settle_release(it->second, req, now);
        it->second.store.erase(req.client_id);
        expire_leases(it->second, now);
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
  ///
  /// A budget resource's hits are drawn from its budget instead (its UTC window, its limit
  /// `capacity` per window whatever the request's `window`): spent at once when they fit in
  /// what is neither spent nor allotted, counted with its allotments, and, with budget marks,
  /// a new master counts from the window's mark (docs/budgets.md).
  [[nodiscard]] result<count_response> count_hits(const count_request& req, time_point now) {
    if (!options_.is_root) {
      return request_error{errc::invalid_params,
                           "resources: counted only at the root (this node has a parent)",
                           "resources"};
    }
    return answer_each<count_response>(req, now, [&](const hit_count& x) {
      if (config_.has_budgets() && config_.find(x.resource_id).budget) return draw(x, now);
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
      expire_leases(r, now);
      step_learned(r, now, false);
      const bool parent_lease_live = r.parent_lease && !r.parent_lease->expired(now);
      // A budget's count lives until its window ends, with or without leases; so does what
      // its durable mark is known to be, or a mark task out.
      const bool marked =
          r.budget && r.mark.window == r.budget->window().start && (r.mark.known || r.mark.busy);
      const bool counting =
          r.budget && (r.budget->spent() > 0 || r.budget->reporters() > 0 || marked);
      // A learned capacity that moved lives on without clients (they come back to it).
      const bool learned = r.learned && r.learned->law.capacity() != r.tmpl.capacity;
      if (r.store.size() == 0 && !parent_lease_live && !counting && !learned) {
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

  // `count_hits` on a budget resource: refused, creating nothing, when the engine holds as many
  // resources as it holds hit counters.
  [[nodiscard]] hit_verdict draw(const hit_count& x, time_point now) {
    if (resources_.size() >= options_.max_hit_counters && !resources_.contains(x.resource_id)) {
      const auto& t = config_.find(x.resource_id);
      const budget_window w = window_at(*t.budget, utc(now));
      return {x.resource_id, false, t.capacity, 0,
              std::max(0.0, static_cast<double>(w.end) - utc(now))};
    }
    resource& r = resource_for(x.resource_id, now);
    expire_leases(r, now);
    return draw_hits(r, x, now);
  }

  [[nodiscard]] double count_limit(const hit_count& x) const {
    // rate × window may land a hair under the integer it means (10 / 60 × 60)
    return std::floor(config_.find(x.resource_id).capacity * x.window + 1e-6);
  }

  void configure(resource& r) const {
    const auto was = r.tmpl.budget;
    r.tmpl = config_.find(r.id);
    if (r.parent_algorithm) r.tmpl.algorithm = *r.parent_algorithm;
    r.algorithm = Algorithms::make(r.tmpl.algorithm.kind, r.tmpl.algorithm.parameters);
    // A root's budgets and learned capacities follow its configuration; an intermediate's,
    // its parent's answers.
    if (!options_.is_root) return;
    configure_learned(r);
    if (!r.tmpl.budget) {
      r.budget.reset();
    } else if (!r.budget || was != r.tmpl.budget) {
      r.budget.emplace();  // a new budget, or another window: counted from now
    }
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

  // The leases of `r` in client id order from `req.offset`, at most `req.limit`.
  void page_of_leases(const resource& r, const lease_page& req, time_point now,
                      status_response& out) const {
    out.lease_count = r.store.size();
    const auto limit = req.limit ? std::optional<std::size_t>(*req.limit) : std::nullopt;
    const auto page = r.store.page(static_cast<std::size_t>(req.offset), limit);
    out.leases.reserve(page.size());
    for (const auto* c : page) {
      out.leases.push_back({c->id, to_lease_info(c->lease, now), c->wants(), c->subclients(),
                            c->is_server, c->outstanding(), c->bands.to_vector()});
    }
  }

  [[nodiscard]] resource_status describe(const std::string& id, time_point now) const {
    resource_status s;
    s.resource_id = id;
    s.capacity = capacity(id, now);
    s.learning = learning(id, now);
    const auto it = resources_.find(id);
    if (it == resources_.end()) {
      const auto& t = config_.find(id);
      s.algorithm = t.algorithm.kind;
      if (t.budget && options_.is_root) {  // nothing counted: a whole window
        s.budget = budget_state(window_at(*t.budget, utc(now)), t.capacity, 0, 0, now);
      }
      return s;
    }
    const resource& r = it->second;
    s.algorithm = std::string(Algorithms::kind_of(r.algorithm));
    s.sum_has = r.store.sum_has();
    const auto totals = r.store.totals();
    s.sum_wants = totals.wants;
    s.subclients = totals.subclients;
    s.clients = r.store.size();
    s.budget = budget_of(r, now);
    if (r.learned) s.learned = r.learned->last;
    if (s.budget && r.mark.known && r.mark.window == s.budget->window) {
      s.budget->mark = r.mark.durable;
    }
    return s;
  }

  resource_repository config_;
  mastership_info mastership_;
  time_point valid_until_ = time_point::max();  // the term's end (fencing)
  std::uint64_t fenced_ = 0;
  std::unordered_map<std::string, resource, string_hash, std::equal_to<>> resources_;
  std::uint64_t resources_created_ = 0;
  hit_counts<Clock> counts_{options_.max_hit_counters};
  std::uint64_t config_generation_ = 0;  // set_config calls so far
};

/// The engine on the steady clock.
using engine = basic_engine<std::chrono::steady_clock>;

}  // namespace doorman
