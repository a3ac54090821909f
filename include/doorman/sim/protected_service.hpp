#pragma once

/// \file
/// A protected service on the simulator (docs/learned-capacity.md): its true capacity steps,
/// drifts and is noisy, and it answers "overloaded" to the calls above it. Saturated clients
/// call it through the library's own rate limiter, set from what their client state lets them
/// use, and hand what their calls met to the state, which sends it with its refreshes: the
/// root learns the capacity from those signals, with the node's own code.
///
///     doorman::sim::service_options svc{.truth = {{0, 1000}, {120, 1000}, {120, 500}}};
///     doorman::sim::service_workload w(s, {0, 1, 2}, svc);
///     w.start(0);
///     s.run_until(doorman::sim::at(300));
///     // w.seconds()[t]: the calls, the overloads, the truth and the root's capacity in second t

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "doorman/core/backoff.hpp"
#include "doorman/core/capacity_learner.hpp"
#include "doorman/sim/limited_client.hpp"
#include "doorman/sim/report.hpp"
#include "doorman/sim/simulation.hpp"

namespace doorman::sim {

/// The protected service and how its clients call it.
struct service_options {
  /// The true capacity, calls per second: points {seconds, capacity} in time order, linear in
  /// between (a drift); two points at one time make a step. Constant before the first and
  /// after the last.
  std::vector<std::pair<double, double>> truth{{0, 1000}};
  double noise = 0.02;  ///< each second, the capacity is off by up to this share (uniform)
  double burst = 0.1;   ///< seconds of capacity the service absorbs at once
  /// Each client learns alone, as teams do without a shared limit: per-process AIMD on its own
  /// answers, from its first lease. Each second with an overload multiplies its rate by
  /// `backoff`; each second without adds `increase` of the rate it started from. Nothing
  /// reaches the root.
  bool alone = false;
  double backoff = 0.9;    ///< alone: the cut on a second with an overload
  double increase = 0.02;  ///< alone: the rise on a second without, a share of the start
  double poll = 0.05;      ///< a client whose limiter admits nothing looks again after this
  std::uint64_t seed = 1;
};

/// The true capacity at `t` on the points of `truth` (see `service_options::truth`).
[[nodiscard]] inline double truth_at(const std::vector<std::pair<double, double>>& truth,
                                     double t) {
  if (truth.empty()) return 0;
  if (t < truth.front().first) return truth.front().second;
  for (std::size_t i = truth.size() - 1; i-- > 0;) {
    const auto& [t0, c0] = truth[i];
    const auto& [t1, c1] = truth[i + 1];
    if (t >= t0 && t < t1) return c0 + (c1 - c0) * (t - t0) / (t1 - t0);
  }
  return truth.back().second;
}

/// One second of a service run.
struct service_second {
  double calls = 0;      ///< calls made
  double overloads = 0;  ///< of those, answered overloaded
  double truth = 0;      ///< the true capacity (noise aside)
  double learned = 0;    ///< the root's capacity at the second's end (alone: the clients' sum)
};

namespace detail {

// A service workload's client: its limiter, what its calls met, and alone its own rate.
struct service_runner : limited_client {
  using limited_client::limited_client;
  overload_signals met{};  // in all
  // Alone: its rate, the rate it started from and the overloads of the second under way.
  double own = 0;
  double start = 0;
  double overloads = 0;
};

}  // namespace detail

/// Saturated clients calling a protected service through their rate limiters.
class service_workload : detail::workload<detail::service_runner> {
 public:
  /// `clients`: indices of clients of `s`, each wanting more than its share.
  service_workload(simulation& s, std::vector<std::size_t> clients, service_options options)
      : workload(s, clients), options_(std::move(options)), draw_(options_.seed) {}

  /// Every client starts calling at `seconds`; the service keeps its books each second.
  void start(double seconds) {
    start_each(seconds, [this](std::size_t i) { next(i); });
    s_.at(std::floor(seconds) + 1, [this] { tick(); });
  }

  /// Second by second, from 0.
  [[nodiscard]] const std::vector<service_second>& seconds() const noexcept { return seconds_; }

 private:
  using limiter_type = detail::limited_client::limiter_type;

  using runner = detail::service_runner;

  [[nodiscard]] double now() const { return seconds_of(s_.now()); }

  service_second& second(double t) {
    const auto i = static_cast<std::size_t>(std::max(0.0, t));
    if (seconds_.size() <= i) seconds_.resize(i + 1);
    return seconds_[i];
  }

  // What the client's limiter enforces: its state's capacity, or alone its own law's.
  void apply(runner& r) {
    double c = s_.client_capacity(r.index);
    if (options_.alone) {
      if (r.start <= 0) r.start = r.own = c;
      c = r.own;
    }
    r.apply(c);
  }

  // The service: a token bucket filled at the noisy true capacity.
  bool serve(double t) {
    const double rate = truth_at(options_.truth, t) * noise_;
    tokens_ = std::min(rate * options_.burst, tokens_ + rate * std::max(0.0, t - filled_));
    filled_ = t;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }

  void next(std::size_t i) {
    runner& r = *runners_[i];
    const double t = now();
    apply(r);
    const auto at = r.limiter.reserve(1).at;
    if (at == limiter_type::time_point::max()) {
      s_.at(t + options_.poll, [this, i] { next(i); });
      return;
    }
    const double admitted = std::max(t, seconds_of(at));
    if (admitted > t) {
      s_.at(admitted, [this, i] { call(i); });
    } else {
      call(i);
    }
  }

  void call(std::size_t i) {
    runner& r = *runners_[i];
    const double t = now();
    const bool ok = serve(t);
    service_second& sec = second(t);
    sec.calls += 1;
    r.met.calls += 1;
    if (!ok) {
      sec.overloads += 1;
      r.met.overloads += 1;
      r.overloads += 1;
    }
    if (!options_.alone) s_.set_signals(r.index, r.met);
    // The next call once this one is admitted (a saturated client keeps its limiter busy).
    s_.at(t, [this, i] { next(i); });
  }

  // Once a second: the books, the noise of the next second, and alone each client's law.
  void tick() {
    const double t = now();
    service_second& sec = second(t - 1);
    sec.truth = truth_at(options_.truth, t - 1);
    noise_ = 1 + options_.noise * (2 * draw_.uniform() - 1);
    double sum = 0;
    for (auto& r : runners_) {
      if (!options_.alone || r->start <= 0) continue;
      r->own = r->overloads > 0 ? r->own * options_.backoff : r->own + options_.increase * r->start;
      r->overloads = 0;
      sum += r->own;
    }
    sec.learned = options_.alone ? sum : s_.root_capacity();
    s_.at(t + 1, [this] { tick(); });
  }

  service_options options_;
  doorman::detail::splitmix64 draw_;
  std::vector<service_second> seconds_;
  double tokens_ = 0;
  double filled_ = 0;
  double noise_ = 1;
};

/// A learning run: a root job of two tasks and an intermediate job, `clients` clients under
/// the intermediate each wanting twice its share of the true capacity's peak, FAIR_SHARE with a
/// 60 s lease refreshed every 5 s, learning between `min` and `max` from `start`. Invariant 1
/// is checked over the whole tree at every change of a lease (against the most the root's
/// capacity was over the last lease length).
struct learning_run_options {
  std::uint64_t seed = 1;
  double duration = 480;  ///< simulated seconds
  std::size_t clients = 10;
  double start = 1000;  ///< the configured capacity, where learning starts
  double min = 50;
  double max = 5000;
  /// The true capacity: 1000, -50 % at 120 s, +50 % at 240 s, then a drift up by a fifth over
  /// two minutes from 360 s.
  std::vector<std::pair<double, double>> truth{{0, 1000},  {120, 1000}, {120, 500}, {240, 500},
                                               {240, 750}, {360, 750},  {480, 900}};
  bool alone = false;        ///< per-process AIMD instead (`service_options`)
  bool intermediate = true;  ///< the clients ask an intermediate (else the root itself)
  std::optional<double> master_change{};  ///< the root's master is lost then, for 10 s
};

/// Runs it; the seconds of the service.
[[nodiscard]] inline std::vector<service_second> run_learning(const learning_run_options& o) {
  simulation s(detail::checked_run(o.start, o.seed,
                                   R"(, "learn": {"min": )" + std::to_string(o.min) +
                                       R"(, "max": )" + std::to_string(o.max) + "}"));
  const std::size_t root = s.add_job("root", std::nullopt);
  const std::size_t dc = s.add_job("dc", root);
  double peak = 0;
  for (const auto& p : o.truth)
    peak = std::max(peak, p.second);
  std::vector<std::size_t> clients;
  for (std::size_t i = 0; i < o.clients; ++i) {
    clients.push_back(s.add_client("client-" + std::to_string(i), o.intermediate ? dc : root,
                                   2 * peak / static_cast<double>(o.clients)));
  }
  service_workload w(s, clients, {.truth = o.truth, .alone = o.alone, .seed = o.seed});
  w.start(0);
  if (o.master_change) s.at(*o.master_change, [&s, root] { s.lose_master(root, 10); });
  s.run_until(at(o.duration));
  return w.seconds();
}

/// What a learning run shows over [from, to) seconds.
struct learning_span {
  double calls = 0;
  double overloads = 0;
  double served = 0;        ///< calls not overloaded
  double truth = 0;         ///< the true capacity's calls over the span
  double worst_error = 0;   ///< the largest |learned − truth| / truth of any second
  std::size_t seconds = 0;  ///< seconds with a truth
  std::size_t off = 0;      ///< of those, seconds with the learned capacity over 10 % off it
  double overload_share() const { return calls > 0 ? overloads / calls : 0; }
  double used() const { return truth > 0 ? served / truth : 0; }
};

[[nodiscard]] inline learning_span judge_span(const std::vector<service_second>& secs, double from,
                                              double to) {
  learning_span out;
  for (auto i = static_cast<std::size_t>(from); i < secs.size() && static_cast<double>(i) < to;
       ++i) {
    const auto& x = secs[i];
    out.calls += x.calls;
    out.overloads += x.overloads;
    out.served += x.calls - x.overloads;
    out.truth += x.truth;
    if (x.truth > 0) {
      const double error = std::abs(x.learned - x.truth) / x.truth;
      out.worst_error = std::max(out.worst_error, error);
      ++out.seconds;
      if (error > 0.1) ++out.off;
    }
  }
  return out;
}

/// The verdict on a learning run with `learning_run_options`' default truth (the steps at
/// 120 s and 240 s, the drift from 360 s), judged from 60 s (the end of learning mode).
struct learning_verdict {
  double reach_down = 0;      ///< seconds after the -50 % step until within 10 % of the truth
  double reach_up = 0;        ///< the same after the +50 % step
  double step_overloads = 0;  ///< the share of calls overloaded in the 30 s after -50 %
  double overloads = 0;       ///< the share of calls overloaded from 60 s on
  double used = 0;            ///< the least share of the truth served in a steady span
  double swing = 0;           ///< the largest |learned - truth| / truth in a steady span
  /// The share of the steady spans' seconds with the learned capacity over 10 % off the truth:
  /// how long the swing lasts.
  double off = 0;
};

[[nodiscard]] inline learning_verdict judge_learning(const std::vector<service_second>& secs) {
  learning_verdict v;
  const auto reach = [&](double from) {
    for (auto i = static_cast<std::size_t>(from); i < secs.size(); ++i) {
      if (std::abs(secs[i].learned - secs[i].truth) <= 0.1 * secs[i].truth) {
        return static_cast<double>(i) - from;
      }
    }
    return std::numeric_limits<double>::infinity();
  };
  v.reach_down = reach(120);
  v.reach_up = reach(240);
  v.step_overloads = judge_span(secs, 120, 150).overload_share();
  v.overloads = judge_span(secs, 60, static_cast<double>(secs.size())).overload_share();
  v.used = 1;
  std::size_t seconds = 0, off = 0;
  // Steady: from 30 s after each change of the truth to the next.
  for (const auto& [a, b] : {std::pair{90.0, 120.0}, {150.0, 240.0}, {270.0, 360.0}}) {
    const auto span = judge_span(secs, a, b);
    v.used = std::min(v.used, span.used());
    v.swing = std::max(v.swing, span.worst_error);
    seconds += span.seconds;
    off += span.off;
  }
  v.off = seconds > 0 ? static_cast<double>(off) / static_cast<double>(seconds) : 0;
  return v;
}

/// A line chart of a learning run: the true capacity, the learned one, what was served and
/// what was answered overloaded, a second at a time.
inline void write_learning_svg(std::ostream& os, const std::vector<service_second>& secs,
                               const std::string& title) {
  double top = 0;
  for (const auto& x : secs)
    top = std::max({top, x.truth, x.learned, x.calls});
  doorman::detail::svg_chart chart(os, static_cast<double>(secs.size()), top);
  chart.title(title);
  chart.axes();
  const auto t = [](std::size_t i) { return static_cast<double>(i); };
  const std::size_t n = secs.size();
  chart.lines(
      n, t,
      {{[&](std::size_t i) { return secs[i].truth; }, "#2ca02c", "true capacity"},
       {[&](std::size_t i) { return secs[i].learned; }, "#d62728", "learned"},
       {[&](std::size_t i) { return secs[i].calls - secs[i].overloads; }, "#1f77b4",
        "served a second"},
       {[&](std::size_t i) { return secs[i].overloads; }, "#ff7f0e", "overloaded a second"}});
  chart.end();
}

}  // namespace doorman::sim
