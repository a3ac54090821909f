#pragma once

// Shared by the libFuzzer targets: a check that aborts (so libFuzzer records the input), and
// the engine invariants every target that drives an engine checks after each step.

#include <doorman/core.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace doorman_fuzz {

using clock_type = doorman::manual_clock;
using engine_type = doorman::basic_engine<clock_type>;

[[noreturn]] inline void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "invariant broken: %s %s\n", what, detail.c_str());
  std::abort();
}

#define DOORMAN_FUZZ_CHECK(cond, detail)                \
  do {                                                  \
    if (!(cond)) ::doorman_fuzz::fail(#cond, (detail)); \
  } while (false)

// Configuration used by the engine targets: one template of each algorithm, learning mode of
// 2 s (so that inputs reach both sides of it), leases of 10 s.
inline std::string config_text(double fair = 100, double proportional = 50) {
  return R"({"resources": [
    {"identifier_glob": "f*", "capacity": )" +
         std::to_string(fair) + R"(,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 10, "refresh_interval": 2,
                   "learning_mode_duration": 2}},
    {"identifier_glob": "p*", "capacity": )" +
         std::to_string(proportional) + R"(,
     "algorithm": {"kind": "PROPORTIONAL_SHARE", "lease_length": 10, "refresh_interval": 2,
                   "learning_mode_duration": 2}},
    {"identifier_glob": "s*", "capacity": 5,
     "algorithm": {"kind": "STATIC", "lease_length": 10, "refresh_interval": 2,
                   "learning_mode_duration": 2}},
    {"identifier_glob": "*", "capacity": 1e15,
     "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 10, "refresh_interval": 2,
                   "learning_mode_duration": 2}}]})";
}

// Every resource's state is sane (finite, non-negative, within the protocol's bounds, sums
// that match their parts), and outside learning mode the unexpired leases of a resource whose
// algorithm shares its capacity sum to at most the capacity. `checked_from`: the invariant on
// capacity holds only once every lease granted under an earlier configuration has expired.
inline void check_engine(engine_type& eng, clock_type::time_point now,
                         clock_type::time_point checked_from) {
  constexpr double max_q = doorman::request_limits::max_quantity;
  eng.for_each_resource([&](std::string_view id, const auto& store) {
    const std::string rid(id);
    double leased = 0;
    double magnitude = 0;
    store.for_each([&](const auto& c) {
      DOORMAN_FUZZ_CHECK(c.lease.capacity >= 0 && c.lease.capacity <= max_q, rid);
      DOORMAN_FUZZ_CHECK(c.outstanding() >= 0 && c.outstanding() <= max_q, rid);
      DOORMAN_FUZZ_CHECK(std::isfinite(c.wants()), rid);
      magnitude += c.lease.capacity;
      if (!c.lease.expired(now)) leased += c.lease.capacity;
    });
    const auto totals = store.totals();
    DOORMAN_FUZZ_CHECK(std::isfinite(totals.wants) && totals.wants >= 0, rid);
    DOORMAN_FUZZ_CHECK(std::isfinite(totals.subclients) && totals.subclients >= 0, rid);
    DOORMAN_FUZZ_CHECK(std::isfinite(store.sum_held()) && store.sum_held() >= 0, rid);
    // The running sum of leases agrees with the leases (expired ones included: the store
    // drops them lazily).
    DOORMAN_FUZZ_CHECK(
        std::fabs(store.sum_has() - magnitude) <= 1e-9 * (1 + magnitude),
        rid + " sum_has " + std::to_string(store.sum_has()) + " vs " + std::to_string(magnitude));
    const auto kind = eng.template_of(id).algorithm.kind;
    const bool shares = kind == "FAIR_SHARE" || kind == "PROPORTIONAL_SHARE";
    if (shares && now >= checked_from && !eng.learning(id, now)) {
      const double capacity = eng.capacity(id, now);
      DOORMAN_FUZZ_CHECK(
          leased <= capacity * (1 + 1e-9) + 1e-9,
          rid + ": " + std::to_string(leased) + " leased of " + std::to_string(capacity));
    }
  });
}

}  // namespace doorman_fuzz
