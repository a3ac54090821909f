#pragma once

// How the benchmarks' clients change what they want between two requests.
//
// A client wants between 1 and 100. Each refresh moves its wants by a step of up to ±2.5 (5% of
// the mean want), reflected back into [1, 100] at either end. That keeps the wants spread
// evenly over [1, 100] however long a run lasts, so a capacity of 30 per client stays about 60%
// of total wants, and every decision stays contended.
//
// A multiplicative drift (wants × a factor between 0.95 and 1.05, clamped) does not: its
// logarithm falls a little at each step, so after a few thousand refreshes per client most
// wants sit at the floor, total wants drop below the capacity, and every client gets what it
// asks for without the algorithm doing any work. The benchmarks used it until 2026-11-27; at
// 10³ clients their decisions stopped being contended within the first second.

#include <random>

namespace doorman_bench {

inline constexpr double min_wants = 1;
inline constexpr double max_wants = 100;

// Initial wants: uniform over [min_wants, max_wants].
inline double initial_wants(std::mt19937_64& rng) {
  return std::uniform_real_distribution<double>(min_wants, max_wants)(rng);
}

// The wants of a client that wanted `wants` at its last request.
inline double drift_wants(double wants, std::mt19937_64& rng) {
  double w = wants + std::uniform_real_distribution<double>(-2.5, 2.5)(rng);
  if (w < min_wants) w = 2 * min_wants - w;
  if (w > max_wants) w = 2 * max_wants - w;
  return w;
}

}  // namespace doorman_bench
