#pragma once

/// \file
/// Calls of any cost on the simulator (docs/budgets.md, "Calls of any cost, simulated"): each
/// simulated client runs a client's rate resource — the library's own `basic_rate_limiter`,
/// its rate and burst set from the client's lease as the client library sets them — and
/// makes one call after another, as a saturated client does: it reserves an estimate, the call
/// runs, and it settles the call's real cost, drawn from a heavy tail. Then `judge` checks the
/// calls against the lease's promise.
///
///     doorman::sim::simulation s(options);
///     ... add jobs and clients ...
///     doorman::sim::cost_workload w(s, {0, 1, 2}, {.seed = 7});
///     w.start(0);
///     s.run_until(doorman::sim::at(600));
///     auto verdict = doorman::sim::judge(w.calls(), w.largest(), {.capacity = 1000, .from = 60});

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "doorman/core/backoff.hpp"
#include "doorman/core/time.hpp"
#include "doorman/sim/limited_client.hpp"
#include "doorman/sim/simulation.hpp"

namespace doorman::sim {

/// The calls a cost workload makes, with their defaults.
struct cost_options {
  double min_cost = 100;    ///< the cheapest call
  double max_cost = 30000;  ///< the dearest call (a truncated Pareto tail between the two)
  double shape = 1.1;       ///< the tail's Pareto shape: smaller is heavier
  double estimate = 1000;   ///< what a client reserves for a call before it knows the cost
  double latency = 0.005;   ///< seconds from a call's admission to its settlement
  double poll = 0.05;       ///< a client whose limiter is blocked (rate 0) looks again after this
  std::uint64_t seed = 1;
};

/// One admitted call.
struct cost_call {
  std::size_t client = 0;  ///< the index of the client in the workload
  double at = 0;           ///< when it was admitted (simulated seconds)
  double cost = 0;         ///< what it was settled at
  /// When the client's fair share would have admitted it: its previous call's admission plus
  /// the longer of that call's latency and its cost over the fair share (0: the first call).
  double due = 0;
};

/// Draws a cost from a Pareto tail of `shape` truncated to [lo, hi], from `u` uniform in [0, 1).
[[nodiscard]] inline double heavy_tailed_cost(double u, double lo, double hi, double shape) {
  const double a = std::pow(lo, -shape);
  const double b = std::pow(hi, -shape);
  return std::clamp(std::pow(a - u * (a - b), -1.0 / shape), lo, hi);
}

namespace detail {

// A cost workload's client: its limiter and its call under way.
struct cost_runner : limited_client {
  using limited_client::limited_client;
  bool calling = false;
  std::int64_t slot = 0;  // the call under way's place in the limiter's schedule
  double cost = 0;        // of the call under way
  double due = 0;         // of the next call
};

}  // namespace detail

/// Simulated clients making calls of heavy-tailed cost through their rate resources.
class cost_workload : detail::workload<detail::cost_runner> {
 public:
  /// `clients`: indices of clients of `s` (each wants more than its share, so that demand
  /// exceeds capacity); `fair_share`: what each would get of an even split (for `due`).
  cost_workload(simulation& s, std::vector<std::size_t> clients, cost_options options = {},
                double fair_share = 0)
      : workload(s, clients), options_(options), fair_share_(fair_share), draw_(options.seed) {}

  /// Every client starts calling at `seconds`.
  void start(double seconds) {
    start_each(seconds, [this](std::size_t i) { next(i); });
  }

  [[nodiscard]] const std::vector<cost_call>& calls() const noexcept { return calls_; }

  /// The largest call each client made.
  [[nodiscard]] std::vector<double> largest() const {
    std::vector<double> out(runners_.size(), 0.0);
    for (const auto& c : calls_)
      out[c.client] = std::max(out[c.client], c.cost);
    return out;
  }

 private:
  using limiter_type = detail::limited_client::limiter_type;
  using runner = detail::cost_runner;

  // The call under way (if any) is settled; the next is reserved and, once admitted, runs.
  void next(std::size_t i) {
    runner& r = *runners_[i];
    const double now = seconds_of(s_.now());
    r.apply(s_.effective_capacity(r.index));
    if (r.calling) {
      r.limiter.settle(options_.estimate, r.cost, r.slot);
      r.calling = false;
    }
    const auto reserved = r.limiter.reserve(options_.estimate);
    const auto at = reserved.at;
    if (at == limiter_type::time_point::max()) {
      s_.at(now + options_.poll, [this, i] { next(i); });
      return;
    }
    const double admitted = std::max(now, seconds_of(at));
    r.cost =
        heavy_tailed_cost(draw_.uniform(), options_.min_cost, options_.max_cost, options_.shape);
    r.calling = true;
    r.slot = reserved.slot;
    calls_.push_back({i, admitted, r.cost, r.due});
    const double share = fair_share_ > 0 ? r.cost / fair_share_ : 0.0;
    r.due = admitted + std::max(options_.latency, share);
    s_.at(admitted + options_.latency, [this, i] { next(i); });
  }

  cost_options options_;
  double fair_share_;
  doorman::detail::splitmix64 draw_;
  std::vector<cost_call> calls_;
};

/// What `judge` checks the calls against.
struct cost_bounds {
  double capacity = 0;  ///< the resource's capacity, units per second
  double window = 60;   ///< the spend of every window this long is bounded
  double from = 0;      ///< calls before this are not judged (convergence)
  double to = 0;        ///< nor after this (0: the last call)
  double lateness = 0;  ///< a call admitted later than its due time plus this is late
};

/// The verdict on a workload's calls.
struct cost_verdict {
  std::size_t calls = 0;    ///< judged
  double capacity = 0;      ///< units per second, as judged against
  double worst_window = 0;  ///< the most spent in any window of the judged span
  double bound = 0;         ///< capacity × window + each client's largest call
  double used = 0;          ///< spent over the judged span, as a fraction of capacity × span
  double worst_late = 0;    ///< the latest admission past its due time, seconds
  std::size_t late = 0;     ///< calls admitted later than their due time plus `lateness`
};

/// Judges `calls` (in admission order per client) on `bounds`.
[[nodiscard]] inline cost_verdict judge(const std::vector<cost_call>& calls,
                                        const std::vector<double>& largest,
                                        const cost_bounds& bounds) {
  cost_verdict v;
  v.capacity = bounds.capacity;
  std::vector<cost_call> judged;
  const double to = bounds.to > 0 ? bounds.to : std::numeric_limits<double>::infinity();
  for (const auto& c : calls) {
    if (c.at >= bounds.from && c.at < to) judged.push_back(c);
  }
  std::stable_sort(judged.begin(), judged.end(),
                   [](const cost_call& a, const cost_call& b) { return a.at < b.at; });
  v.calls = judged.size();
  v.bound = bounds.capacity * bounds.window;
  for (const double x : largest)
    v.bound += x;
  double spent = 0;
  double in_window = 0;
  std::size_t first = 0;
  for (const auto& c : judged) {
    spent += c.cost;
    in_window += c.cost;
    while (judged[first].at <= c.at - bounds.window)
      in_window -= judged[first++].cost;
    v.worst_window = std::max(v.worst_window, in_window);
    if (c.due > 0) {
      v.worst_late = std::max(v.worst_late, c.at - c.due);
      if (c.at > c.due + bounds.lateness) ++v.late;
    }
  }
  if (!judged.empty()) {
    const double span = (bounds.to > 0 ? bounds.to : judged.back().at) - bounds.from;
    if (span > 0) v.used = spent / (bounds.capacity * span);
  }
  return v;
}

/// Whether a verdict keeps the promise: no window over its bound, at least `least` of the
/// capacity used, no call late.
[[nodiscard]] inline bool kept(const cost_verdict& v, double least = 0.95) noexcept {
  return v.calls > 0 && v.worst_window <= v.bound && v.used >= least && v.late == 0;
}

/// One line on a verdict, e.g. "337144 calls, the fullest minute 18078776 of 18295516 allowed
/// (18000000 + the largest calls), 100.0 % used, the latest call 0.000 s past due".
[[nodiscard]] inline std::string describe(const cost_verdict& v, double window = 60) {
  char line[300];
  std::snprintf(line, sizeof line,
                "%zu calls, the fullest %.0f s %.0f of %.0f allowed (%.0f + the largest calls), "
                "%.1f %% used, the latest call %.3f s past due",
                v.calls, window, v.worst_window, v.bound, v.capacity * window, 100 * v.used,
                std::max(0.0, v.worst_late));
  return line;
}

/// A cost run: a root job of two tasks and an intermediate job, `clients` clients under the
/// intermediate each wanting twice its fair share of `capacity` (units per second), FAIR_SHARE
/// with a 60 s lease refreshed every 5 s; the root's master is lost at a third of the run for
/// 10 s. Invariant 1 is checked over the whole tree at every change of a lease.
struct cost_run_options {
  std::uint64_t seed = 1;
  double duration = 600;     ///< simulated seconds
  double capacity = 300000;  ///< units per second (18 million per minute)
  std::size_t clients = 10;
  bool master_change = true;
  cost_options costs{};  ///< the seed is the run's
};

/// What a cost run made, and the verdict on it from the end of learning mode (60 s) on.
struct cost_run {
  std::vector<cost_call> calls;
  std::vector<double> largest;
  cost_verdict verdict;
};

[[nodiscard]] inline cost_run run_costs(const cost_run_options& o) {
  simulation s(detail::checked_run(o.capacity, o.seed));
  const std::size_t root = s.add_job("root", std::nullopt);
  const std::size_t dc = s.add_job("dc", root);
  const double share = o.capacity / static_cast<double>(o.clients);
  std::vector<std::size_t> clients;
  for (std::size_t i = 0; i < o.clients; ++i) {
    clients.push_back(s.add_client("client-" + std::to_string(i), dc, 2 * share));
  }
  cost_options costs = o.costs;
  costs.seed = o.seed;
  cost_workload w(s, clients, costs, share);
  w.start(0);
  if (o.master_change) s.at(o.duration / 3, [&s, root] { s.lose_master(root, 10); });
  s.run_until(at(o.duration));
  cost_run out{w.calls(), w.largest(), {}};
  out.verdict = judge(out.calls, out.largest,
                      {.capacity = o.capacity, .from = 60, .to = o.duration, .lateness = 5});
  return out;
}

}  // namespace doorman::sim
