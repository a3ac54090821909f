#pragma once

/// \file
/// The engine's budget steps (docs/budgets.md): what a budget resource's report, release and
/// parent's answer do to its window's count, what its answers say of it, and the root's budget
/// marks. `basic_engine` (<doorman/core/engine.hpp>) calls them around each decision.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "doorman/core/budget.hpp"
#include "doorman/core/learned_steps.hpp"
#include "doorman/core/lease_decision.hpp"
#include "doorman/core/log_throttle.hpp"
#include "doorman/core/messages.hpp"

namespace doorman::detail {

/// The budget steps over `lease_decision`'s resources; `basic_engine` holds the resources.
template <class Clock, class Algorithms>
class budget_steps : protected learned_steps<Clock, Algorithms> {
 protected:
  using base = learned_steps<Clock, Algorithms>;
  using base::expire_leases;
  using base::learning_until;
  using base::options_;
  using base::utc;
  using typename base::duration;
  using typename base::lease_type;
  using typename base::resource;
  using typename base::store_type;
  using typename base::time_point;

  explicit budget_steps(engine_options options) : base(std::move(options)) {}

  // An intermediate's budget, from its parent's answer: counted in the parent's window, the
  // allotment granted on top of what the parent counts of this node's reports (none when the
  // parent does not say), which makes the most its clients may spend in all. A count new to the
  // window (a new process, or a new window) starts from the parent's: what this node reports next
  // continues it, never counting twice what the parent has.
  void adopt_budget(resource& r, const lease_type& lease, const std::optional<budget_info>& b,
                    time_point now) {
    if (!b) {
      r.budget.reset();
      r.parent_budget.reset();
      return;
    }
    if (!r.budget) r.budget.emplace();
    const double end = utc(now) + b->reset;
    const bool fresh = r.budget->roll_to({b->window, static_cast<std::int64_t>(std::ceil(end))});
    const double counted = b->counted.value_or(0.0);
    if (fresh) r.budget->add(counted);
    r.budget_ceiling = counted + lease.capacity;
    r.parent_budget = b;
    r.parent_budget->counted.reset();
  }

  // A budget resource's report, before its decision: what the client spent since its last
  // report comes off its allotment and into the window's count. A client that says it holds
  // nothing while the engine knows a live allotment of its (its process restarted, or the
  // answer granting it was lost) may have spent all of it: it counts as spent.
  // So does a request with no report at all (a client that does not know budgets): what it
  // held is then spent at each of its requests. (A door whose protocol has no report gets 0
  // before this: `capacity_request::reports_spend`.)
  template <class Request>
  void charge(resource& r, std::string_view client_id, const Request& x, time_point now) {
    expire_leases(r, now);
    const auto* c = r.store.find(client_id);
    if (c != nullptr && !(x.has && x.has->expires_in > 0 && x.spend)) {
      r.budget->add(store_type::held(*c));
      r.store.consume(*c, store_type::held(*c));
    }
    // What it still holds of an earlier master's allotment is, with its report, its part of
    // a restored mark (learning mode confirms it).
    const bool earlier = x.has && x.has->expires_in > 0 && now < learning_until(r.tmpl);
    const double added =
        r.budget->report(client_id, x.spend, options_.is_root, earlier ? x.has->capacity : 0.0);
    if (c != nullptr && added > 0) r.store.consume(*c, added);
    if (r.budget->reporters() > 2 * r.store.size() + 1024) {
      r.budget->forget_unless(
          [&](const std::string& id) { return id == client_id || r.store.find(id) != nullptr; });
    }
  }

  // A budget mark is due when the resource's window has none read yet, or what is spent and
  // allotted came within half a step of it (and the budget is not all marked already).
  void mind_mark(resource& r) {
    if (!(options_.budget_mark_step > 0) || !options_.is_root) return;
    marks_.mind(r.id, r.mark, *r.budget, r.store.sum_held(), r.tmpl.capacity,
                options_.budget_mark_step * r.tmpl.capacity);
  }

  std::optional<budget_mark_task> mark_task(resource& r) const {
    return marks_.task(r.id, r.mark, *r.budget, r.store.sum_held(), r.tmpl.capacity,
                       options_.budget_mark_step * r.tmpl.capacity);
  }

  // `count_hits` on a budget resource (after `expire_leases`): `x.hits` spent at once when they
  // fit in what the window has neither spent nor allotted, else refused whole. Hits the budget
  // has room for but its durable mark not yet (being read, or to be raised) are refused with
  // `remaining` saying so (at least `x.hits`: not counted yet, rather than over the limit).
  [[nodiscard]] hit_verdict draw_hits(resource& r, const hit_count& x, time_point now) {
    hit_verdict v{.resource_id = x.resource_id, .limit = r.tmpl.capacity};
    if (!r.budget) return v;  // (a configuration without it: nothing to draw from)
    const double held = r.store.sum_held();
    const double marked = std::max(0.0, base::own_capacity(r, now) - held);
    v.admitted = x.hits <= marked;
    if (v.admitted) r.budget->add(x.hits);
    // What the budget has left (the mark only delays it).
    v.remaining = std::max(0.0, r.tmpl.capacity - r.budget->spent() - held);
    r.mark.at_window(r.budget->window().start);
    if (!v.admitted && x.hits <= v.remaining) r.mark.draw = std::max(r.mark.draw, x.hits);
    v.reset = std::max(0.0, static_cast<double>(r.budget->window().end) - utc(now));
    mind_mark(r);
    return v;
  }

  // A budget resource released: the client's last report, if it gave one, and the rest of
  // what it held is free; without one, all it held counts as spent.
  void settle_release(resource& r, const release_request& req, time_point now) {
    expire_leases(r, now);
    const auto* c = r.store.find(req.client_id);
    const auto s = std::find_if(req.spends.begin(), req.spends.end(),
                                [&](const resource_spend& x) { return x.resource_id == r.id; });
    if (s != req.spends.end()) {
      r.budget->report(req.client_id, budget_spend{s->window, s->spent}, options_.is_root);
    } else if (c != nullptr) {
      r.budget->add(store_type::held(*c));
    }
  }

  // A budget's state for an answer: its window and count, as of `now`.
  // An intermediate passes its parent's word on, with the time left as of `now`.
  [[nodiscard]] std::optional<budget_info> budget_of(const resource& r, time_point now) const {
    if (!r.budget) return std::nullopt;
    if (!options_.is_root) {
      if (!r.parent_budget || r.budget->window().start != r.parent_budget->window) {
        return std::nullopt;  // its window is over: the parent has not named the next yet
      }
      budget_info b = *r.parent_budget;
      b.reset = std::max(0.0, static_cast<double>(r.budget->window().end) - utc(now));
      return b;
    }
    return budget_state(r.budget->window(), r.tmpl.capacity, r.budget->spent(), r.store.sum_held(),
                        now);
  }

  // A window of `limit` units with `spent` of them spent and `held` allotted, at `now`.
  [[nodiscard]] budget_info budget_state(const budget_window& w, double limit, double spent,
                                         double held, time_point now) const {
    return budget_info{.window = w.start,
                       .reset = std::max(0.0, static_cast<double>(w.end) - utc(now)),
                       .limit = limit,
                       .spent = detail::bounded_quantity(spent),
                       .left = std::max(0.0, limit - spent - held)};
  }

  budget_marks marks_;  // a root's budget marks (engine_options::budget_mark_step)

  // A budget asked for by a requester that cannot report what it spends (Doorman's gRPC
  // door): it would take an allotment for a rate, and be counted as spending all of it at each
  // request. It gets a lease of 0, and its other resources are decided as always; a warning
  // says so (one line per 10 s at most).
  [[nodiscard]] lease_info unreportable(const resource& r, std::string_view who, time_point now) {
    unreportable_log_.log(options_.log,
                          "warning: " + std::string(who) + " asked for budget " + r.id +
                              " through Doorman's protocol, which cannot report a spend: "
                              "granted 0 (ask for it over JSON-RPC)",
                          now);
    return {0.0, r.tmpl.algorithm.lease_length.count(), r.tmpl.algorithm.refresh_interval.count()};
  }

  log_throttle<time_point> unreportable_log_{seconds(10)};
};

}  // namespace doorman::detail
