#pragma once

/// \file
/// A seeded fault campaign over the simulator: a tree, a network and a stream of faults all
/// drawn from one seed, run with invariant 1 checked tree-wide whenever a client's lease
/// changes and invariants 1 and 2 at every decision. The same seed replays the same run.
///
///     auto r = doorman::sim::run_campaign({.seed = 42, .minutes = 600});
///     if (r.violation) std::cerr << describe(r) << "\n";  // names the seed to replay
///
/// Each run draws: 1 to 7 jobs (a root, 0 to 3 regions under it, 0 to 3 jobs under those) of
/// 2 or 3 tasks; 1 to 4 clients per job wanting 5 to 60 of a capacity of 100; a network of 1
/// to 5 ms latency, up to 5 ms jitter (requests of different callers overtake one another),
/// up to 2% loss and up to 2% duplicated requests; and every master's clock rate within the
/// documented bound of the election store's (±9%). Then, every `fault_interval` seconds on
/// average (exponentially), one fault at random: a master paused (up to 20 s), hung, lost (up
/// to 20 s) or replaced at once, cut from etcd, answering no one (up to 15 s), a job cut from
/// its clients or from its parent, a job refusing connections, a client leaving or coming
/// back, or demand changing.

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "doorman/core/backoff.hpp"
#include "doorman/sim/simulation.hpp"

namespace doorman::sim {

/// Options of one campaign run, with their defaults.
struct campaign_options {
  std::uint64_t seed = 1;
  double minutes = 60;             ///< simulated
  double fault_interval = 20;      ///< mean seconds between two faults
  bool fencing = true;             ///< off only to show that the campaign catches it
  double clock_rate_error = 0.09;  ///< within the bound the election term's margin covers
  /// Masters keep their record in the election store, as nodes electing in etcd do (a winner
  /// that finds none alive skips learning mode).
  bool election_record = true;
};

/// What a campaign can do to the tree, in the order they are counted.
enum class campaign_fault : std::uint8_t {
  pause_master,
  lose_master,
  cut_election,
  hang_answers,
  cut_clients,
  cut_parent,
  refuse,
  hang_master,
  elect_master,
  client_leaves,
  client_returns,
  demand_changes,
};
inline constexpr std::size_t campaign_fault_count = 12;

/// The fault's name, as `describe` prints it.
[[nodiscard]] inline const char* name_of(campaign_fault f) noexcept {
  constexpr std::array<const char*, campaign_fault_count> names = {
      "pause",  "lose", "etcd-cut", "hang-answers",  "cut-clients",    "cut-parent",
      "refuse", "hang", "elect",    "client-leaves", "client-returns", "demand"};
  return names[static_cast<std::size_t>(f)];
}

/// A finished campaign run.
struct campaign_result {
  std::uint64_t seed = 0;
  double minutes = 0;
  bool fencing = true;
  std::size_t jobs = 0;
  std::size_t clients = 0;
  std::size_t tasks = 0;
  network_options network{};
  std::uint64_t events = 0;
  std::array<std::uint64_t, campaign_fault_count> faults{};  ///< how many of each
  /// The first invariant that failed (the time, the node or client, the numbers), if any; the
  /// run stops there.
  std::optional<std::string> violation;
  /// The last faults before the end (or the violation), oldest first: "t=…: <fault> <target>".
  std::vector<std::string> recent;
};

/// One line for a run: the seed, what was drawn, the faults, and the violation if any, with
/// the command that replays it.
[[nodiscard]] inline std::string describe(const campaign_result& r) {
  std::string s = "seed " + std::to_string(r.seed) + ": " + std::to_string(r.jobs) + " jobs x " +
                  std::to_string(r.tasks) + " tasks, " + std::to_string(r.clients) +
                  " clients, loss " + std::to_string(r.network.loss) + ", duplicates " +
                  std::to_string(r.network.duplicate) + "; " +
                  std::to_string(static_cast<long long>(r.minutes)) + " min, " +
                  std::to_string(r.events) + " events; faults";
  for (std::size_t i = 0; i < campaign_fault_count; ++i) {
    s += " " + std::string(name_of(static_cast<campaign_fault>(i))) + "=" +
         std::to_string(r.faults[i]);
  }
  if (!r.violation) return s + "; no violation";
  s += "\n  VIOLATION: " + *r.violation + "\n  last faults:";
  for (const auto& f : r.recent)
    s += "\n    " + f;
  s += "\n  replay: doorman-sim --campaign " + std::to_string(r.seed) + " --minutes " +
       std::to_string(static_cast<long long>(std::ceil(r.minutes)));
  if (!r.fencing) s += " --no-fencing";
  return s;
}

namespace detail {

class campaign_runner {
  using splitmix64 = doorman::detail::splitmix64;

 public:
  explicit campaign_runner(const campaign_options& o)
      : o_(o), draw_(o.seed ^ 0x5eedc0ffee15ULL), sim_(options_of(o, draw_)) {}

  campaign_result run() {
    out_.seed = o_.seed;
    out_.fencing = o_.fencing;
    out_.network = sim_.options().network;
    out_.tasks = sim_.options().tasks;
    build();
    const double end = o_.minutes * 60;
    double t = next_fault_after(0);
    try {
      while (t < end) {
        sim_.run_until(at(t));
        strike();
        t = next_fault_after(t);
      }
      sim_.run_until(at(end));
      out_.minutes = o_.minutes;
    } catch (const invariant_violation& e) {
      out_.violation = e.what();
      out_.minutes = seconds_of(sim_.now()) / 60;
    }
    out_.events = sim_.events();
    return std::move(out_);
  }

 private:
  double uniform() { return draw_.uniform(); }
  std::size_t pick(std::size_t n) {
    return std::min(n - 1, static_cast<std::size_t>(uniform() * static_cast<double>(n)));
  }

  static simulation_options options_of(const campaign_options& o, splitmix64& draw) {
    simulation_options so;
    so.config = R"({"resources": [{"identifier_glob": "*", "capacity": 100,
        "algorithm": {"kind": "FAIR_SHARE", "lease_length": 8, "refresh_interval": 2,
                      "learning_mode_duration": 8}}]})";
    so.network.latency = 0.001 + 0.004 * draw.uniform();
    so.network.jitter = 0.005 * draw.uniform();
    so.network.loss = 0.02 * draw.uniform();
    so.network.duplicate = 0.02 * draw.uniform();
    so.network.timeout = 1;
    so.client_resource.mode = fallback::pessimistic;
    so.seed = o.seed;
    so.tasks = draw.uniform() < 0.5 ? 2 : 3;
    so.election_ttl = 4;
    so.fencing = o.fencing;
    so.election_record = o.election_record;
    so.clock_rate_error = o.clock_rate_error;
    so.failover.backoff = {seconds(0.05), seconds(2)};
    so.check_invariants = true;
    so.check_tree = true;
    return so;
  }

  // `prefix` and `n`, appended (GCC 12 at -O3 warns falsely of an overlap in "c" + string).
  static std::string named(std::string prefix, std::size_t n) {
    prefix += std::to_string(n);
    return prefix;
  }

  void add_clients(std::size_t job) {
    const std::size_t n = 1 + pick(4);
    for (std::size_t i = 0; i < n; ++i) {
      sim_.add_client(named("c", sim_.clients().size()), job, 5 + 55 * uniform());
    }
  }

  void build() {
    jobs_.push_back(sim_.add_job("root", std::nullopt));
    const std::size_t regions = pick(4);
    for (std::size_t r = 0; r < regions; ++r) {
      const std::size_t region = sim_.add_job(named("region", r), jobs_[0]);
      jobs_.push_back(region);
      const std::size_t below = pick(4) / 2;  // 0 or 1 mostly
      for (std::size_t d = 0; d < below; ++d) {
        jobs_.push_back(sim_.add_job(named(named("dc", r) + "-", d), region));
      }
    }
    for (const std::size_t j : jobs_)
      add_clients(j);
    out_.jobs = jobs_.size();
    out_.clients = sim_.clients().size();
  }

  double next_fault_after(double t) { return t + -std::log(1 - uniform()) * o_.fault_interval; }

  // One fault, drawn, applied and logged.
  void strike() {
    const auto f = static_cast<campaign_fault>(pick(campaign_fault_count));
    const std::size_t j = jobs_[pick(jobs_.size())];
    const std::size_t c = pick(sim_.clients().size());
    double d = 20 * uniform();
    // The faults of a job that last `d` seconds, in the order of `campaign_fault`.
    using timed_fault = void (simulation::*)(std::size_t, double);
    static constexpr std::array<timed_fault, 7> timed = {
        &simulation::pause_master, &simulation::lose_master, &simulation::cut_election,
        &simulation::hang_answers, &simulation::cut_clients, &simulation::cut_parent,
        &simulation::refuse};
    const auto i = static_cast<std::size_t>(f);
    if (f == campaign_fault::pause_master && uniform() < 0.5) {
      // Half of the pauses end around the takeover (the election TTL, a poll and a call
      // timeout after the last renewal): the callers still waiting then are what a master
      // without fencing would answer wrongly.
      d = 4 + 2 * uniform();
    }
    if (f == campaign_fault::hang_answers) d *= 0.75;
    std::string target = sim_.jobs()[j].name;
    if (i < timed.size()) {
      (sim_.*timed[i])(j, d);
    } else if (f == campaign_fault::hang_master) {
      sim_.hang_master(j, 30);
    } else if (f == campaign_fault::elect_master) {
      sim_.elect_master(j);
    } else {
      target = sim_.clients()[c].name;
      const bool active = sim_.clients()[c].active;
      if (f == campaign_fault::client_leaves) sim_.leave(c);
      if (f == campaign_fault::client_returns && !active) sim_.arrive(c, 5 + 55 * uniform());
      if (f == campaign_fault::demand_changes && active) sim_.set_wants(c, 5 + 55 * uniform());
    }
    ++out_.faults[i];
    out_.recent.push_back("t=" + std::to_string(seconds_of(sim_.now())) + ": " + name_of(f) + " " +
                          target + (i < timed.size() ? " for " + std::to_string(d) + " s" : ""));
    if (out_.recent.size() > 12) out_.recent.erase(out_.recent.begin());
  }

  const campaign_options& o_;
  splitmix64 draw_;
  simulation sim_;
  std::vector<std::size_t> jobs_;
  campaign_result out_;
};

}  // namespace detail

/// Runs one campaign: the seed decides everything; a violation stops the run and is reported.
[[nodiscard]] inline campaign_result run_campaign(const campaign_options& o) {
  return detail::campaign_runner(o).run();
}

}  // namespace doorman::sim
