#pragma once

/// \file
/// Doorman's convergence scenarios (its design doc, "convergence and shortfall") on the
/// simulator, with the metrics it judged them by, and a scale scenario.
///
///     auto result = doorman::sim::run_scenario({.scenario = 7, .seed = 1});
///     std::cout << doorman::sim::summary_table({result});
///
/// Every scenario: one resource, FAIR_SHARE, lease 60 s, refresh interval 16 s (Doorman's
/// defaults), learning mode as long as the lease, clients in `pessimistic` fallback. Wants drift:
/// every 10 s each client's wants are multiplied by a uniform factor in [0.9, 1.1] (scenarios 5–7
/// and the scale one).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "doorman/sim/simulation.hpp"

namespace doorman::sim {

/// What a scenario is.
struct scenario_info {
  int number = 0;
  std::string name;
  std::string description;
  double duration = 600;  ///< simulated seconds
};

/// Every scenario, in order (number 8 is the scale scenario).
[[nodiscard]] inline const std::vector<scenario_info>& scenarios() {
  static const std::vector<scenario_info> all = {
      {1, "root", "root job of 3 tasks, 5 clients wanting 110 each, capacity 500", 600},
      {2, "election", "as 1; the master is lost at 120 s and a new one elected at 140 s", 600},
      {3, "master-back", "as 1; the master is lost at 120 s and back at 190 s", 600},
      {4, "regional", "root and one regional job, 5 clients wanting 110 each at the region", 600},
      {5, "tree",
       "root, 3 regions x 3 datacenters x 5 clients (45), capacity 500, wants 15 drifting +-10% "
       "every 10 s",
       600},
      {6, "spike", "as 5; two clients spike to 1000 at 150 s", 600},
      {7, "mishaps",
       "as 5 for an hour, one mishap every 60 s: a client +100, an election in a job, or a "
       "job's master lost for 0-60 s",
       3600},
      {8, "scale",
       "root, 10 regions x 10 datacenters x 1000 clients (100 000), capacity 1 000 000, wants 15 "
       "drifting; one mishap every 60 s as in 7",
       3600},
  };
  return all;
}

/// The scenario numbered `n`; throws `std::out_of_range` for an unknown one.
[[nodiscard]] inline const scenario_info& find_scenario(int n) {
  for (const auto& s : scenarios()) {
    if (s.number == n) return s;
  }
  throw std::out_of_range("no scenario " + std::to_string(n) + " (there are 1 to " +
                          std::to_string(scenarios().size()) + ")");
}

/// Engine options without this project's departures from Doorman's design (docs/simulation.md),
/// to compare against.
[[nodiscard]] inline engine_options doorman_engine_options() {
  engine_options o;
  o.count_outstanding = false;
  o.refresh_after_learning = false;
  o.refresh_when_owed = false;
  o.echo_in_learning = false;
  o.report_releases = false;
  o.count_unconfirmed_cuts = false;
  o.share_cuts = false;
  return o;
}

/// Options of a scenario run, with their defaults.
struct run_options {
  int scenario = 7;
  std::uint64_t seed = 1;
  double duration = 0;         ///< simulated seconds; 0: the scenario's
  double trace_interval = 0;   ///< the time series. step (0: 1 s, 5 s for the scale scenario)
  double sample_interval = 5;  ///< metrics sample every this many seconds ...
  double warmup = 60;          ///< ... after this many
  network_options network{};
  engine_options engine{};
  bool check_invariants = false;
  /// What the clients use once a lease has expired. Pessimistic by default, so that the
  /// figures show what the tree grants (a `safe` fallback adds capacity nobody granted while
  /// a position is unreachable for longer than a lease).
  fallback client_fallback = fallback::pessimistic;
  /// Called with the fraction of simulated time done, about every 5%.
  std::function<void(double)> progress{};
  /// Called at every trace point with the simulation (to look inside it) and the point.
  std::function<void(const simulation&, const struct trace_point&)> on_trace{};
};

/// One point of the time series.
struct trace_point {
  double t = 0;
  double capacity = 0;
  double wants = 0;       ///< sum of the clients' wants
  double granted = 0;     ///< sum of what the clients may use (leases, or fallbacks once expired)
  bool learning = false;  ///< some master is in learning mode
};

/// A scripted event, and how the system re-converged after it.
struct event_mark {
  double t = 0;
  std::string label;
  std::optional<std::size_t> client;  ///< the client it concerns (a demand change), if any
  /// Seconds until the watched value (the client's capacity for a demand change, else the total
  /// granted) first came within 2% of its settled value (its mean over the last 30 s of the
  /// 120 s after the event, or of the time until the next event if shorter).
  std::optional<double> converged_after;
  std::vector<double> watched;  ///< the watched value at each trace point after the event
};

/// The metrics of a run (Doorman's convergence and shortfall figures; docs/simulation.md).
struct run_summary {
  std::size_t samples = 0;
  double mean_allocation = 0;               ///< granted / capacity
  double mean_allocation_of_demand = 0;     ///< granted / min(capacity, wants)
  std::size_t over_samples = 0;             ///< granted > capacity
  double max_allocation = 0;                ///< the largest granted / capacity
  double mean_when_over = 0;                ///< mean granted / capacity over the over samples
  std::vector<double> requests_per_second;  ///< per level, root first
};

/// A finished run.
struct run_result {
  scenario_info info;
  std::uint64_t seed = 0;
  std::size_t clients = 0;
  std::vector<trace_point> trace;
  std::vector<event_mark> marks;
  run_summary summary;
  std::uint64_t events = 0;
};

namespace detail {

[[nodiscard]] inline std::string scenario_config(double capacity) {
  return R"({"resources": [
    {"identifier_glob": "resource", "capacity": )" +
         std::to_string(capacity) + R"(,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16}},
    {"identifier_glob": "*", "capacity": 0,
     "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60, "refresh_interval": 16}}]})";
}

// The settled value: the mean over the last 30 s of the first 120 s after the event (or of
// the time until the next event, if shorter), so that wants drifting long after the event do
// not move it. The event converged when the value first came within 2% of it (or 0.2% of the
// capacity, for values near 0).
inline void converge(event_mark& m, double step, double capacity) {
  if (m.watched.empty()) return;
  const auto points = [&](double seconds) {
    return static_cast<std::size_t>(std::llround(seconds / step));
  };
  const std::size_t end = std::min(m.watched.size(), points(120) + 1);
  const std::size_t begin = end > points(30) ? end - points(30) : 0;
  double settled = 0;
  for (std::size_t i = begin; i < end; ++i)
    settled += m.watched[i];
  settled /= static_cast<double>(end - begin);
  const double band = std::max(0.02 * std::abs(settled), 0.002 * capacity);
  for (std::size_t i = 0; i < end; ++i) {
    if (std::abs(m.watched[i] - settled) <= band) {
      m.converged_after = static_cast<double>(i) * step;
      return;
    }
  }
}

// One run of a numbered scenario, in the order it happens: the tree, the scripted events, the
// run traced every `step` seconds, the metrics. The scripted events refer to the runner, which
// lives until the run is over.
class scenario_runner {
 public:
  scenario_runner(const run_options& ro, run_result& out)
      : ro_(ro),
        out_(out),
        n_(ro.scenario),
        scale_(n_ == 8),
        length_(ro.duration > 0 ? ro.duration : out.info.duration),
        capacity_(scale_ ? 1'000'000 : 500),
        step_(ro.trace_interval > 0 ? ro.trace_interval : (scale_ ? 5.0 : 1.0)),
        s_(options_of(ro, capacity_)) {}

  void run() {
    build();
    script();
    trace();
    for (auto& m : out_.marks)
      converge(m, step_, capacity_);
    summarize();
    out_.events = s_.events();
  }

 private:
  static simulation_options options_of(const run_options& ro, double capacity) {
    simulation_options so;
    so.config = scenario_config(capacity);
    so.network = ro.network;
    so.engine = ro.engine;
    so.seed = ro.seed;
    so.check_invariants = ro.check_invariants;
    so.client_resource.mode = ro.client_fallback;
    return so;
  }

  void add_clients(std::size_t job, int count, double wants) {
    for (int i = 0; i < count; ++i)
      s_.add_client("client-" + std::to_string(clients_++), job, wants);
  }

  // The jobs (root first) and their clients.
  void build() {
    root_ = s_.add_job("root", std::nullopt);
    jobs_.push_back(root_);
    if (n_ <= 3) {
      add_clients(root_, 5, 110);
    } else if (n_ == 4) {
      const std::size_t region = s_.add_job("region-0", root_);
      jobs_.push_back(region);
      add_clients(region, 5, 110);
    } else {
      const int regions = scale_ ? 10 : 3;
      const int dcs = scale_ ? 10 : 3;
      const int per_dc = scale_ ? 1000 : 5;
      for (int r = 0; r < regions; ++r) {
        const std::size_t region = s_.add_job("region-" + std::to_string(r), root_);
        jobs_.push_back(region);
        for (int d = 0; d < dcs; ++d) {
          const std::size_t dc =
              s_.add_job("dc-" + std::to_string(r) + "-" + std::to_string(d), region);
          jobs_.push_back(dc);
          add_clients(dc, per_dc, 15);
        }
      }
    }
    out_.clients = clients_;
  }

  void mark(std::string label, std::optional<std::size_t> client = std::nullopt) {
    out_.marks.push_back({seconds_of(s_.now()), std::move(label), client, std::nullopt, {}});
  }

  // The scripted events of the scenario.
  void script() {
    if (n_ == 2) {
      s_.at(120, [this] {
        s_.lose_master(root_, 20);
        mark("root master lost");
      });
      s_.at(140, [this] { mark("new root master"); });
    } else if (n_ == 3) {
      s_.at(120, [this] {
        s_.lose_master(root_, 70);
        mark("root master lost");
      });
      s_.at(190, [this] { mark("root master back"); });
    } else if (n_ >= 5) {
      for (double t = 10; t < length_; t += 10) {
        s_.at(t, [this] {
          for (std::size_t i = 0; i < clients_; ++i)
            s_.set_wants(i, s_.clients()[i].wants * (0.9 + 0.2 * s_.uniform()));
        });
      }
      if (n_ == 6) {
        s_.at(150, [this] {
          s_.set_wants(0, 1000);
          s_.set_wants(clients_ / 2, 1000);
          mark("two clients spike to 1000", 0);
        });
      }
      if (n_ >= 7) {
        for (double t = 60; t < length_; t += 60)
          s_.at(t, [this] { mishap(); });
      }
    }
  }

  std::size_t pick(std::size_t count) {
    return std::min(count - 1, static_cast<std::size_t>(s_.uniform() * static_cast<double>(count)));
  }

  // One of three mishaps, at random: a client +100, an election in a job, or a job's master
  // lost for 0-60 s.
  void mishap() {
    const double u = s_.uniform();
    if (u < 1.0 / 3) {
      const std::size_t c = pick(clients_);
      s_.set_wants(c, s_.clients()[c].wants + 100);
      mark(s_.clients()[c].name + " +100", c);
    } else if (u < 2.0 / 3) {
      const std::size_t j = jobs_[pick(jobs_.size())];
      s_.elect_master(j);
      mark("election in " + s_.jobs()[j].name);
    } else {
      const std::size_t j = jobs_[pick(jobs_.size())];
      const double d = 60 * s_.uniform();
      s_.lose_master(j, d);
      mark(s_.jobs()[j].name + " master lost for " + std::to_string(static_cast<int>(d)) + " s");
    }
  }

  // Runs, tracing every `step` seconds (and what each event watches, until the next event).
  void trace() {
    double next_progress = 0.05;
    for (double t = 0; t <= length_ + 1e-9; t += step_) {
      s_.run_until(at(t));
      trace_point p;
      p.t = t;
      p.capacity = s_.capacity();
      p.wants = s_.total_wants();
      p.granted = s_.total_granted();
      p.learning = s_.learning();
      if (ro_.on_trace) ro_.on_trace(s_, p);
      out_.trace.push_back(p);
      if (!out_.marks.empty() && out_.marks.back().t <= t) {
        auto& m = out_.marks.back();
        m.watched.push_back(m.client ? s_.effective_capacity(*m.client) : p.granted);
      }
      if (ro_.progress && t / length_ >= next_progress) {
        ro_.progress(std::min(1.0, t / length_));
        next_progress += 0.05;
      }
    }
  }

  // The allocation metrics over the samples after the warm-up, and requests per second per
  // level of the tree.
  void summarize() {
    run_summary& sum = out_.summary;
    double over_total = 0;
    const auto every = std::max<std::size_t>(
        1, static_cast<std::size_t>(std::llround(ro_.sample_interval / step_)));
    for (std::size_t i = 0; i < out_.trace.size(); i += every) {
      const trace_point& p = out_.trace[i];
      if (p.t < ro_.warmup) continue;
      ++sum.samples;
      const double a = p.granted / p.capacity;
      sum.mean_allocation += a;
      sum.mean_allocation_of_demand += p.granted / std::max(1e-9, std::min(p.capacity, p.wants));
      sum.max_allocation = std::max(sum.max_allocation, a);
      if (p.granted > p.capacity * (1 + 1e-9)) {
        ++sum.over_samples;
        over_total += a;
      }
    }
    if (sum.samples > 0) {
      sum.mean_allocation /= static_cast<double>(sum.samples);
      sum.mean_allocation_of_demand /= static_cast<double>(sum.samples);
    }
    if (sum.over_samples > 0) {
      sum.mean_when_over = over_total / static_cast<double>(sum.over_samples);
    }
    for (const job& j : s_.jobs()) {
      const auto level = static_cast<std::size_t>(j.level);
      if (sum.requests_per_second.size() <= level) sum.requests_per_second.resize(level + 1, 0.0);
      sum.requests_per_second[level] += static_cast<double>(j.requests) / length_;
    }
  }

  const run_options& ro_;
  run_result& out_;
  int n_;
  bool scale_;
  double length_;
  double capacity_;
  double step_;
  simulation s_;
  std::vector<std::size_t> jobs_;  // every job, root first
  std::size_t root_ = 0;
  std::size_t clients_ = 0;
};

}  // namespace detail

/// Runs a scenario and measures it.
[[nodiscard]] inline run_result run_scenario(const run_options& ro) {
  run_result out;
  out.info = find_scenario(ro.scenario);
  out.seed = ro.seed;
  detail::scenario_runner(ro, out).run();
  return out;
}

}  // namespace doorman::sim
