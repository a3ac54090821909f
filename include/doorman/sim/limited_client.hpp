#pragma once

/// \file
/// What the simulator's workloads share (`cost_workload`, `service_workload`): each simulated
/// client calls through the library's own rate limiter, its rate and burst set from what the
/// client may use as the client library sets them.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "doorman/limit/rate_limiter.hpp"
#include "doorman/sim/simulation.hpp"

namespace doorman::sim::detail {

/// The options of a workload's run: one FAIR_SHARE resource of `capacity` (and `extra` fields
/// of its template), a 60 s lease refreshed every 5 s; jobs of two tasks; clients that use
/// nothing once a lease expired; invariants checked at every decision and tree-wide.
[[nodiscard]] inline simulation_options checked_run(double capacity, std::uint64_t seed,
                                                    const std::string& extra = "") {
  simulation_options so;
  so.config = R"({"resources": [{"identifier_glob": "*", "capacity": )" + std::to_string(capacity) +
              extra +
              R"(, "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60,
                 "refresh_interval": 5}}]})";
  so.client_resource.mode = fallback::pessimistic;
  so.seed = seed;
  so.tasks = 2;
  so.check_invariants = true;
  so.check_tree = true;
  return so;
}

/// One simulated client's limiter.
struct limited_client {
  using limiter_type = basic_rate_limiter<manual_clock_ref>;

  limited_client(std::size_t i, manual_clock_ref clock) : index(i), limiter({.rate = 0}, clock) {}

  std::size_t index = 0;  ///< in the simulation
  limiter_type limiter;
  double capacity = std::numeric_limits<double>::quiet_NaN();  ///< last applied

  /// What the client may use into its limiter, on a change (as the client library pushes it).
  void apply(double c) {
    if (c == capacity) return;
    capacity = c;
    apply_capacity(limiter, c);
  }
};

/// A `Runner` (a `limited_client`) for each of `clients` of `s`, on its clock.
template <class Runner>
[[nodiscard]] std::vector<std::unique_ptr<Runner>> runners_for(
    simulation& s, const std::vector<std::size_t>& clients) {
  std::vector<std::unique_ptr<Runner>> out;
  for (const std::size_t c : clients)
    out.push_back(std::make_unique<Runner>(c, manual_clock_ref{&s.clock()}));
  return out;
}

/// A workload of simulated clients, each a `Runner` (a `limited_client`): started together,
/// each then moving by its own events.
template <class Runner>
class workload {
 public:
  workload(const workload&) = delete;
  workload& operator=(const workload&) = delete;

 protected:
  workload(simulation& s, const std::vector<std::size_t>& clients)
      : s_(s), runners_(runners_for<Runner>(s, clients)) {}
  ~workload() = default;

  /// `next(i)` for every runner at `seconds`.
  template <class Next>
  void start_each(double seconds, Next next) {
    for (std::size_t i = 0; i < runners_.size(); ++i)
      s_.at(seconds, [next, i] { next(i); });
  }

  simulation& s_;
  std::vector<std::unique_ptr<Runner>> runners_;
};

}  // namespace doorman::sim::detail
