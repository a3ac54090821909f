// The simulator: determinism, invariants, traced totals, the measured changes.

#include <catch2/catch.hpp>

#include <doorman/sim.hpp>

#include <sstream>
#include <string>

using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

std::string csv_of(const doorman::sim::run_result& r) {
  std::ostringstream os;
  doorman::sim::write_csv(os, r);
  doorman::sim::write_events_csv(os, r);
  doorman::sim::write_svg(os, r);
  return os.str();
}

}  // namespace

TEST_CASE("simulation: the same seed gives the same bytes, another seed differs", "[sim]") {
  doorman::sim::run_options o{.scenario = 7, .seed = 1, .duration = 600};
  const std::string a = csv_of(doorman::sim::run_scenario(o));
  const std::string b = csv_of(doorman::sim::run_scenario(o));
  CHECK(a == b);
  o.seed = 2;
  CHECK(a != csv_of(doorman::sim::run_scenario(o)));
  CHECK_THAT(a, Contains("t,capacity,wants,granted,learning"));
  CHECK_THAT(a, Contains("<svg"));
}

TEST_CASE("simulation: scenario 5 is never over capacity, at any second", "[sim]") {
  const auto r = doorman::sim::run_scenario({.scenario = 5, .seed = 1});
  REQUIRE(r.trace.size() == 601);
  for (const auto& p : r.trace) {
    INFO("t=" << p.t);
    REQUIRE(p.granted <= p.capacity * (1 + 1e-9));
  }
  CHECK(r.summary.over_samples == 0);
  CHECK(r.summary.mean_allocation > 0.97);
}

TEST_CASE("simulation: scenario 2 passes learning mode without over-granting", "[sim]") {
  const auto r = doorman::sim::run_scenario({.scenario = 2, .seed = 1, .check_invariants = true});
  bool learned = false;
  for (const auto& p : r.trace) {
    INFO("t=" << p.t);
    REQUIRE(p.granted <= p.capacity * (1 + 1e-9));
    if (p.t > 140 && p.learning) learned = true;
  }
  CHECK(learned);  // the new master did go through learning mode
  REQUIRE(r.marks.size() == 2);
  CHECK(r.summary.mean_allocation > 0.95);
}

TEST_CASE("simulation: the invariants hold at every decision in every scenario", "[sim]") {
  const int scenario = GENERATE(1, 2, 3, 4, 5, 6, 7);
  const std::uint64_t seed = GENERATE(1, 2);
  INFO("scenario " << scenario << " seed " << seed);
  doorman::sim::run_options o{.scenario = scenario, .seed = seed, .duration = 400};
  o.check_invariants = true;
  SECTION("a perfect network") {
    (void)doorman::sim::run_scenario(o);
  }
  SECTION("jitter and 5% loss") {
    o.network = {.latency = 0.01, .jitter = 0.05, .loss = 0.05, .timeout = 1};
    (void)doorman::sim::run_scenario(o);
  }
}

TEST_CASE("simulation: events run in time order, ties in the order scheduled", "[sim]") {
  doorman::sim::simulation s({.config = R"({"resources": [{"identifier_glob": "*",
      "capacity": 100, "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60,
      "refresh_interval": 16}}]})"});
  std::vector<std::pair<std::string, double>> seen;
  const auto note = [&](std::string name) {
    return [&seen, &s, name] { seen.emplace_back(name, doorman::sim::seconds_of(s.now())); };
  };
  // Far beyond the ring of buckets (68 s), inside it, in one bucket, and now.
  s.at(5000, note("far"));
  s.at(10, note("b"));
  s.at(10.000001, note("c"));
  s.at(10, note("b2"));
  s.at(200, [&] {
    seen.emplace_back("e", doorman::sim::seconds_of(s.now()));
    s.at(200, note("e-now"));  // scheduled for the current time: after e
    s.at(4999, note("f"));     // before the far one
  });
  s.at(0, note("first"));
  s.run_until(doorman::sim::at(6000));
  const std::vector<std::pair<std::string, double>> want{
      {"first", 0}, {"b", 10},      {"b2", 10},  {"c", 10.000001},
      {"e", 200},   {"e-now", 200}, {"f", 4999}, {"far", 5000}};
  CHECK(seen == want);
}

TEST_CASE("simulation: the traced totals are the clients' effective capacities", "[sim]") {
  const auto fallback = GENERATE(doorman::fallback::pessimistic, doorman::fallback::optimistic,
                                 doorman::fallback::safe);
  INFO("fallback " << static_cast<int>(fallback));
  doorman::sim::run_options o{.scenario = 7, .seed = 3, .duration = 400};
  o.client_fallback = fallback;
  o.network = {.latency = 0.01, .jitter = 0.05, .loss = 0.2, .timeout = 1};
  int checked = 0;
  o.on_trace = [&](const doorman::sim::simulation& s, const doorman::sim::trace_point& p) {
    double granted = 0;
    double wants = 0;
    for (const auto& c : s.clients()) {
      if (!c.active) continue;
      // What the client library itself says the client may use.
      const double x = doorman::sim::client_state_type::capacity_of(*c.held, s.now());
      granted += x < 0 ? c.wants : x;
      wants += c.wants;
    }
    INFO("t=" << p.t);
    REQUIRE(p.granted == granted);
    REQUIRE(p.wants == wants);
    ++checked;
  };
  (void)doorman::sim::run_scenario(o);
  CHECK(checked == 401);

  // Clients that leave and come back.
  doorman::sim::simulation s({.config = R"({"resources": [{"identifier_glob": "*",
      "capacity": 100, "algorithm": {"kind": "FAIR_SHARE", "lease_length": 20,
      "refresh_interval": 5, "learning_mode_duration": 0}}]})"});
  const auto root = s.add_job("root", std::nullopt);
  const auto a = s.add_client("a", root, 70);
  const auto b = s.add_client("b", root, 70);
  const auto total = [&] {
    double sum = 0;
    for (const auto& c : s.clients()) {
      if (c.active) sum += doorman::sim::client_state_type::capacity_of(*c.held, s.now());
    }
    return sum;
  };
  s.run_until(doorman::sim::at(10));
  CHECK(s.total_granted() == total());
  CHECK(s.total_granted() == Approx(100));
  s.leave(a);
  CHECK(s.total_granted() == total());
  CHECK(s.total_wants() == 70);
  s.run_until(doorman::sim::at(30));
  s.arrive(a, 20);
  s.set_wants(b, 50);
  CHECK(s.total_wants() == 70);
  s.run_until(doorman::sim::at(60));
  CHECK(s.total_granted() == total());
  CHECK(s.total_granted() == Approx(70));
}

TEST_CASE("simulation: a broken invariant fails with the time and the node", "[sim]") {
  // NO_ALGORITHM grants wants whatever the capacity: what the checker must catch.
  doorman::sim::simulation s({.config = R"({"resources": [{"identifier_glob": "*",
      "capacity": 100, "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60,
      "refresh_interval": 16, "learning_mode_duration": 0}}]})",
                              .check_invariants = true});
  const auto root = s.add_job("root", std::nullopt);
  (void)s.add_client("c-1", root, 150);
  CHECK_THROWS_WITH(s.run_until(doorman::sim::at(5)),
                    Contains("t=0.001") && Contains("node root") && Contains("c-1"));
}

TEST_CASE("simulation: the changes beat Doorman's behaviour on scenario 7", "[sim]") {
  const auto ours = doorman::sim::run_scenario({.scenario = 7, .seed = 1});
  doorman::sim::run_options o{.scenario = 7, .seed = 1};
  o.engine = doorman::sim::doorman_engine_options();
  const auto theirs = doorman::sim::run_scenario(o);
  CHECK(ours.summary.mean_allocation >= 0.98);
  CHECK(ours.summary.max_allocation <= 1.01);
  CHECK(ours.summary.over_samples * 3 < 14);  // a third of Doorman's published 14
  CHECK(ours.summary.mean_allocation > theirs.summary.mean_allocation);
  CHECK(ours.summary.over_samples < theirs.summary.over_samples);
}

TEST_CASE("simulation: an action may schedule more actions", "[sim]") {
  doorman::sim::simulation s({.config = R"({"resources": [{"identifier_glob": "*",
    "capacity": 10, "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60,
    "refresh_interval": 16}}]})"});
  int ran = 0;
  int* counter = &ran;
  // Small enough to live inside its std::function: the list of actions growing under it
  // (ASan sees a use after free) must not move it while it runs.
  s.at(1, [&s, counter] {
    for (int i = 0; i < 100; ++i)
      s.at(2, [counter] { ++*counter; });
    ++*counter;
  });
  s.run_until(doorman::sim::at(3));
  CHECK(ran == 101);
}
