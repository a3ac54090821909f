#pragma once

/// \file
/// Learned capacity's steps in an engine (docs/learned-capacity.md): a resource's learned state
/// from its template, the clients' signals counted, the root's control steps, and an
/// intermediate's signals for its parent. `basic_engine` calls them; the law itself is
/// `capacity_learner` (core/capacity_learner.hpp).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "doorman/core/capacity_learner.hpp"
#include "doorman/core/json_reader.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/lease_decision.hpp"
#include "doorman/core/messages.hpp"

namespace doorman::detail {

/// The learned-capacity steps over `lease_decision`'s resources.
template <class Clock, class Algorithms>
class learned_steps : protected lease_decision<Clock, Algorithms> {
 protected:
  explicit learned_steps(engine_options options)
      : lease_decision<Clock, Algorithms>(std::move(options)) {}

  using base = lease_decision<Clock, Algorithms>;
  using base::learning_until, base::master_since_, base::options_;
  using typename base::duration, typename base::resource, typename base::time_point;

  // An intermediate's signals for its parent at `now`: its clients' rates summed over time;
  // nothing when none reported.
  std::optional<overload_signals> signals_for_parent(resource& r, time_point now) {
    if (!r.signals) return std::nullopt;
    const double stale = 2 * r.tmpl.algorithm.refresh_interval.count();
    return r.signals->report_up(to_seconds(now.time_since_epoch()), stale);
  }

  // A learned capacity starts at the template's capacity, and starts again when the capacity
  // or the bounds change (an operator's word outranks what was learned).
  void configure_learned(resource& r) const {
    if (!r.tmpl.learn) {
      r.learned.reset();
      return;
    }
    const learn_config& b = *r.tmpl.learn;
    if (r.learned && r.learned->start == r.tmpl.capacity && r.learned->last.min == b.min &&
        r.learned->last.max == b.max) {
      return;
    }
    r.learned.emplace(b.min, b.max, r.tmpl.capacity);
  }

  // A client's (or a server child's) overload signals, with its demand: counted for the
  // parent at an intermediate (which asks its parent soon when they hold overloads), for the
  // learned capacity at a root (ignored at a root that learns nothing). The root's control
  // step runs first, so that the report counts in the interval under way; a report of
  // overloads may cut at once, to what the clients would call at (each its lease, or its wants
  // when less: a client that cut itself wants its cut).
  void learn_from(resource& r, std::string_view who, const std::optional<overload_signals>& s,
                  std::span<const band_demand> bands, time_point now) {
    step_learned(r, now, false);
    if (!s || (options_.is_root && !r.learned)) return;
    if (!r.signals) r.signals.emplace();
    const overload_signals added = r.signals->report(who, *s, to_seconds(now.time_since_epoch()),
                                                     sum_over(bands, &band_demand::wants));
    r.signals->forget_unless(r.store.size(), [&](const std::string& id) {
      return id == who || r.store.find(id) != nullptr;
    });
    if (added.overloads > 0 && !options_.is_root) ++overload_news_;
    // A cut at once on the law's own threshold (nothing to cut where nothing is learned).
    if (r.learned && added.overloads > r.learned->law.options().overload_ratio * added.calls) {
      step_learned(r, now, true);
    }
  }

  // A root's control step (docs/learned-capacity.md): once per refresh interval of the
  // resource, on the clients' rates; or `at_once` on a report of overloads, at most once a
  // second, a cut to what the clients would call at (`capacity_learner::cut_to`). None in
  // learning mode (the leases are the old master's); the first after it starts from what the
  // clients said they hold (the capacity the old master had learned, as far as it was
  // granted); none at once before its first interval (the rates are of part of it).
  void step_learned(resource& r, time_point now, bool at_once) {
    if (!r.learned) return;
    auto& l = *r.learned;
    const time_point learned_from = learning_until(r.tmpl);
    if (now < learned_from || !l.seeded) {
      if (r.signals) r.signals->next_interval();
      l.from = now;
      if (now < learned_from) return;
      l.seeded = true;
      const double held = r.store.sum_has();
      if (master_since_ < learned_from && held > 0) {
        l.law = capacity_learner({.min = l.last.min, .max = l.last.max}, held);
      }
      return;
    }
    const double span = to_seconds(now - l.from);
    const double interval = r.tmpl.algorithm.refresh_interval.count();
    const double at = to_seconds(now.time_since_epoch());
    const double before = l.law.capacity();
    if (at_once) {
      // O(senders): at most once a second, however many clients report their cuts.
      if (!r.signals || l.last.seconds <= 0 || now - l.limited_at < std::chrono::seconds(1)) {
        return;
      }
      l.limited_at = now;
      if (!l.law.cut_to(would_call_at(r, now, 2 * interval))) return;
      l.cut = true;
      l.cut_at = now;
      record_learned(r, at, before, r.signals->rate(at, 2 * interval), learn_step::cut);
      return;
    }
    if (span < interval) return;
    // The overloads of a client silent since the last cut were taken into account by it.
    const overload_signals rate =
        r.signals ? r.signals->rate(at, 2 * interval,
                                    l.cut ? to_seconds(l.cut_at.time_since_epoch()) : -1)
                  : overload_signals{};
    const auto& totals = r.store.totals();
    const learn_step step = l.law.update({.calls = rate.calls * span,
                                          .overloads = rate.overloads * span,
                                          .seconds = span,
                                          .held = totals.wants > before * (1 + 1e-9),
                                          .offered = std::min(r.store.sum_has(), totals.wants)});
    if (r.signals) r.signals->next_interval();
    l.from = now;
    l.last.calls = rate.calls * span;
    l.last.overloads = rate.overloads * span;
    l.last.seconds = span;
    l.last.step = step_name(step);
    if (step == learn_step::cut) {
      l.cut = true;
      l.cut_at = now;
    }
    record_learned(r, at, before, rate, step);
  }

  // What the clients heard from within `stale` seconds of `now` would call at: each its lease,
  // or its wants when less (a client that cut itself wants its cut): the wants of its last
  // signals when they are no older than its last decision (the report under way comes before
  // its decision), else those of that decision. Every such client counts, whether it sent
  // signals or not: one that has not called yet still holds its lease. O(clients).
  double would_call_at(const resource& r, time_point now, double stale) const {
    double sum = 0;
    r.store.for_each([&](const auto& c) {
      if (to_seconds(now - c.last_decision) > stale) return;
      const double decided = to_seconds(c.last_decision.time_since_epoch());
      const auto reported = r.signals ? r.signals->wants_since(c.id, decided) : std::nullopt;
      sum += std::min(c.lease.capacity, reported.value_or(c.wants()));
    });
    return sum;
  }

  // A step in the history (and a log line for a large change).
  void record_learned(resource& r, double at, double before, const overload_signals& rate,
                      learn_step step) {
    auto& l = *r.learned;
    const double after = l.law.capacity();
    l.history.push_back({.at = at,
                         .capacity = after,
                         .wants = r.store.totals().wants,
                         .calls = rate.calls,
                         .overloads = rate.overloads,
                         .step = step});
    if (l.history.size() > learned_history_length) l.history.pop_front();
    if (std::abs(after - before) > 0.1 * before) log_learned(r, before, after, rate);
  }

  // The last control steps of `r`'s learned capacity (at most `learned_history_length`),
  // oldest first, each `at` in seconds relative to `now` (before it: negative); none for no
  // resource, or one that learns nothing here.
  static std::vector<learned_point> history_of(const resource* r, time_point now) {
    if (r == nullptr || !r->learned) return {};
    std::vector<learned_point> out(r->learned->history.begin(), r->learned->history.end());
    for (auto& p : out)
      p.at -= to_seconds(now.time_since_epoch());
    return out;
  }

  void log_learned(const resource& r, double before, double after,
                   const overload_signals& rate) const {
    if (!options_.log) return;
    const auto text = [](double v) { return detail::number_text(std::round(v * 10) / 10); };
    options_.log("resource " + r.id + ": learned capacity " + text(before) + " -> " + text(after) +
                 " (calls " + text(rate.calls) + "/s, overloaded " + text(rate.overloads) + "/s)");
  }

  std::uint64_t overload_news_ = 0;  // reports of overloads at an intermediate (`news`)
};

}  // namespace doorman::detail
