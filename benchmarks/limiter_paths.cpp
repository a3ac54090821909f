// One path of the local limiters per executable, for counting instructions per call without
// the other paths' code around it (in one binary, the placement of the others changed a path's
// instructions per call by about 1.5x):
//
//   valgrind --tool=callgrind --callgrind-out-file=/dev/null PROGRAM 1000000
//
// with PROGRAM build/release/benchmarks/doorman_bench_limiter_path_builtin, for instance.
//
// Collected instructions / calls = instructions per call (the setup adds under 0.1 per call at
// 10^6 calls). Each executable prints one JSON line: its path, the calls, the admitted ones.
// LIMITER_PATH: plain (rate_limiter::try_acquire), builtin (any_rate_limiter running GCRA),
// users (a user's GCRA behind the virtual call of basic_rate_resource), settle_debt
// (try_acquire(2) then settle(2, 3)), settle_refund (try_acquire(2) then settle(2, 1, its slot)),
// budget (a budget's units: budget_counter::try_acquire at coarse_clock's time, as
// budget_resource calls it), budget_settle (budget_counter::try_acquire(2) then settle(2, 1)).

#include <doorman/limit.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {

constexpr doorman::rate_algorithm users_gcra{"users_gcra"};
struct users_gcra_algorithm {
  static constexpr std::string_view name = users_gcra.name;
  using limiter = doorman::rate_limiter;
  static doorman::rate_limiter_options options(const doorman::rate_algorithm_options& o,
                                               double rate) noexcept {
    return {.rate = rate, .burst = o.burst};
  }
};
using users_list = doorman::default_local_algorithms::with<users_gcra_algorithm>;

}  // namespace

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 1'000'000;
  if (calls <= 0) {
    std::fprintf(stderr, "usage: %s [calls > 0]\n", argv[0]);
    return 2;
  }
  // A rate no loop exhausts: every call is admitted.
  [[maybe_unused]] constexpr double rate = 1e9;
#if LIMITER_PATH == 1
  doorman::any_rate_limiter lim({.burst = 1000}, rate);
  auto call = [&] { return lim.try_acquire().admitted; };
#elif LIMITER_PATH == 2
  doorman::any_rate_limiter lim({.algorithm = users_gcra,
                                 .burst = 1000,
                                 .other = &doorman::make_other_rate_limiter<users_list>},
                                rate);
  auto call = [&] { return lim.try_acquire().admitted; };
#elif LIMITER_PATH == 3
  doorman::rate_limiter lim({.rate = rate, .burst = 1000});
  auto call = [&] { return lim.try_acquire(2).admitted && lim.settle(2, 3); };
#elif LIMITER_PATH == 4
  doorman::rate_limiter lim({.rate = rate, .burst = 1000});
  auto call = [&] {
    const auto r = lim.try_acquire(2);
    return r.admitted && lim.settle(2, 1, r.slot);
  };
#elif LIMITER_PATH == 5 || LIMITER_PATH == 6
  // An allotment no loop exhausts, for an hour.
  doorman::budget_counter<> lim;
  lim.grant({.units = 1e15, .expires = doorman::coarse_clock::now() + std::chrono::hours(1)});
#if LIMITER_PATH == 5
  auto call = [&] { return lim.try_acquire(1, doorman::coarse_clock::now()); };
#else
  auto call = [&] {
    const auto w = lim.window();
    return lim.try_acquire(2, doorman::coarse_clock::now()) && lim.settle(2, 1, w);
  };
#endif
#else
  doorman::rate_limiter lim({.rate = rate, .burst = 1000});
  auto call = [&] { return lim.try_acquire().admitted; };
#endif
  long admitted = 0;
  for (long i = 0; i < calls; ++i)
    admitted += call() ? 1 : 0;
  std::printf("{\"path\": \"%s\", \"calls\": %ld, \"admitted\": %ld}\n", LIMITER_PATH_NAME, calls,
              admitted);
  return admitted > 0 ? 0 : 1;
}
