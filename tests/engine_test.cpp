// The engine: the share index, the algorithms, decisions, learning mode, properties on random
// workloads, and hostile numbers.

#include "core_support.hpp"

#include "../benchmarks/drift.hpp"

#include <numeric>

using namespace doorman_test;  // NOLINT: the tests' own helpers (core_support.hpp)

namespace {

struct reference_client {
  double wants;
  double subclients;
};

// Weighted max-min fairness by the textbook fixpoint: repeatedly give the unsatisfied clients
// an equal level per subclient, satisfy those who want less, until nothing changes.
std::vector<double> brute_fair(const std::vector<reference_client>& cs, double capacity) {
  std::vector<double> out(cs.size(), -1);
  double left = capacity;
  for (bool changed = true; changed;) {
    changed = false;
    double subclients = 0;
    for (std::size_t i = 0; i < cs.size(); ++i) {
      if (out[i] < 0) subclients += cs[i].subclients;
    }
    if (subclients == 0) break;
    const double level = left / subclients;
    for (std::size_t i = 0; i < cs.size(); ++i) {
      if (out[i] < 0 && cs[i].wants <= level * cs[i].subclients) {
        out[i] = cs[i].wants;
        left -= cs[i].wants;
        changed = true;
      }
    }
    if (!changed) {
      for (std::size_t i = 0; i < cs.size(); ++i) {
        if (out[i] < 0) out[i] = level * cs[i].subclients;
      }
    }
  }
  return out;
}

// Proportional share by direct sums over every client.
std::vector<double> brute_proportional(const std::vector<reference_client>& cs, double capacity) {
  double wants = 0;
  double subclients = 0;
  for (const auto& c : cs) {
    wants += c.wants;
    subclients += c.subclients;
  }
  std::vector<double> out;
  if (wants <= capacity) {
    for (const auto& c : cs)
      out.push_back(c.wants);
    return out;
  }
  const double equal = capacity / subclients;
  double left_over = 0;
  double excess = 0;
  for (const auto& c : cs) {
    const double e = equal * c.subclients;
    if (c.wants < e) left_over += e - c.wants;
    if (c.wants > e) excess += c.wants - e;
  }
  for (const auto& c : cs) {
    const double e = equal * c.subclients;
    out.push_back(c.wants <= e ? c.wants : e + (c.wants - e) * left_over / excess);
  }
  return out;
}

}  // namespace

// ---- share index --------------------------------------------------------------------------

TEST_CASE("the benchmarks' drifting wants stay spread over [1, 100], so capacity stays short",
          "[core][index]") {
  // doorman_bench_decision and doorman_bench_load give each client 30 of capacity, about 60% of
  // what the clients want, so that every decision is contended. That holds only while the
  // drift keeps the wants' mean near 50.5 however many refreshes a run makes (a multiplicative
  // drift brought them to the floor within a few thousand).
  std::mt19937_64 rng(3);
  std::vector<double> wants(1000);
  for (auto& w : wants)
    w = doorman_bench::initial_wants(rng);
  double lowest = doorman_bench::max_wants;
  double highest = doorman_bench::min_wants;
  for (int refresh = 0; refresh < 5000; ++refresh) {  // the old drift: mean < 30 after ~1 300
    for (auto& w : wants) {
      w = doorman_bench::drift_wants(w, rng);
      lowest = std::min(lowest, w);
      highest = std::max(highest, w);
    }
  }
  CHECK(lowest >= doorman_bench::min_wants);
  CHECK(highest <= doorman_bench::max_wants);
  const double mean = std::accumulate(wants.begin(), wants.end(), 0.0) / 1000;
  CHECK(mean > 45);
  CHECK(mean < 56);
  CHECK(30 / mean < 0.7);  // capacity short of total wants
  const auto low = std::count_if(wants.begin(), wants.end(), [](double w) { return w < 10; });
  CHECK(low < 150);  // about 9% of a uniform spread
}

TEST_CASE("the share index agrees with brute force under random updates", "[core][index]") {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> wants(0, 100);
  std::uniform_int_distribution<int> subclients(1, 5);
  doorman::share_index idx;
  std::vector<std::pair<doorman::share_index::handle, reference_client>> live;
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op < 2 || live.empty()) {
      const reference_client c{wants(rng), static_cast<double>(subclients(rng))};
      live.emplace_back(idx.insert(c.wants, c.subclients), c);
    } else {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      if (op == 2) {
        idx.erase(it->first);
        *it = live.back();
        live.pop_back();
      } else {
        it->second = {wants(rng), static_cast<double>(subclients(rng))};
        idx.update(it->first, it->second.wants, it->second.subclients);
      }
    }
    std::vector<reference_client> cs;
    double total = 0;
    for (const auto& [h, c] : live) {
      cs.push_back(c);
      total += c.wants;
    }
    REQUIRE(idx.size() == live.size());
    REQUIRE(idx.totals().wants == Approx(total).margin(1e-9));
    const double threshold = wants(rng) / 3;
    doorman::demand_sums below;
    for (const auto& c : cs) {
      if (c.wants / c.subclients < threshold) {
        below.wants += c.wants;
        below.subclients += c.subclients;
      }
    }
    REQUIRE(idx.below(threshold).wants == Approx(below.wants).margin(1e-9));
    REQUIRE(idx.below(threshold).subclients == Approx(below.subclients).margin(1e-9));
    const double capacity = total * 0.6;
    if (!cs.empty() && total > 0) {
      const double level = idx.water_level(capacity);
      const auto ref = brute_fair(cs, capacity);
      double filled = 0;
      for (std::size_t i = 0; i < cs.size(); ++i) {
        const double got = std::min(cs[i].wants, level * cs[i].subclients);
        REQUIRE(got == Approx(ref[i]).margin(1e-9));
        filled += got;
      }
      REQUIRE(filled == Approx(capacity).margin(1e-6));
    }
  }
}

TEST_CASE("the share index empties, refills and keeps exact sums", "[core][index]") {
  std::mt19937_64 rng(7);
  doorman::share_index idx;
  std::vector<std::pair<doorman::share_index::handle, reference_client>> live;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 5000; ++i) {
      const reference_client c{static_cast<double>(rng() % 100000) / 100.0,
                               1.0 + static_cast<double>(rng() % 3)};
      live.emplace_back(idx.insert(c.wants, c.subclients), c);
    }
    for (int i = 0; i < 20000; ++i) {  // many updates: deltas must not drift
      auto& [h, c] = live[rng() % live.size()];
      c.wants = static_cast<double>(rng() % 100000) / 100.0;
      idx.update(h, c.wants, c.subclients);
    }
    double total = 0;
    for (const auto& [h, c] : live)
      total += c.wants;
    CHECK(idx.totals().wants == Approx(total).epsilon(1e-12));
    std::shuffle(live.begin(), live.end(), rng);
    while (!live.empty()) {  // empty it completely, in random order
      idx.erase(live.back().first);
      live.pop_back();
    }
    CHECK(idx.empty());
    CHECK(idx.totals().wants == 0);
    CHECK(idx.totals().subclients == 0);
    CHECK(idx.water_level(1) == std::numeric_limits<double>::infinity());
  }
}

TEST_CASE("the share index moves demands out of a leaf until it empties", "[core][index]") {
  // An update walks to the old and the new place together. When taking the demand out empties
  // its leaf, the tree changes under the new place's path, which must then be walked again.
  doorman::share_index idx;
  std::vector<std::pair<doorman::share_index::handle, reference_client>> live;
  for (int i = 0; i < 200; ++i) {  // several leaves, ratios 1..200
    const reference_client c{static_cast<double>(i + 1), 1};
    live.emplace_back(idx.insert(c.wants, c.subclients), c);
  }
  auto check = [&] {
    double total = 0;
    doorman::demand_sums below;
    for (const auto& [h, c] : live) {
      total += c.wants;
      if (c.wants / c.subclients < 150) {
        below.wants += c.wants;
        below.subclients += c.subclients;
      }
    }
    REQUIRE(idx.totals().wants == Approx(total));
    REQUIRE(idx.below(150).wants == Approx(below.wants));
    REQUIRE(idx.below(150).subclients == Approx(below.subclients));
  };
  // The smallest demands, one by one, go past the largest: the first leaves empty in turn.
  for (int i = 0; i < 120; ++i) {
    auto& [h, c] = live[static_cast<std::size_t>(i)];
    c = {1000.0 + i, 2};
    idx.update(h, c.wants, c.subclients);
    check();
  }
  // And back, into the place the emptied leaves left.
  for (int i = 0; i < 120; ++i) {
    auto& [h, c] = live[static_cast<std::size_t>(i)];
    c = {0.5 + i / 1000.0, 1};
    idx.update(h, c.wants, c.subclients);
    check();
  }
  REQUIRE(idx.size() == 200);
}

TEST_CASE("the share index keeps demands of equal ratio apart, across leaves", "[core][index]") {
  // Five ratios for 2 000 demands: each ratio spans several leaves, so every place is found
  // among equal ratios by the id, and every removal must find its own demand among them.
  std::mt19937_64 rng(11);
  const double wants_of[] = {10, 20, 30};
  auto draw = [&] {
    return reference_client{wants_of[rng() % 3], static_cast<double>(1 + rng() % 2)};
  };
  doorman::share_index idx;
  std::vector<std::pair<doorman::share_index::handle, reference_client>> live;
  for (int i = 0; i < 2000; ++i) {
    const reference_client c = draw();
    live.emplace_back(idx.insert(c.wants, c.subclients), c);
  }
  for (int step = 0; step < 1500; ++step) {
    auto& [h, c] = live[rng() % live.size()];
    if (step % 5 == 0) {  // out and back in: the freed slot and id are reused
      idx.erase(h);
      c = draw();
      h = idx.insert(c.wants, c.subclients);
    } else {
      c = draw();
      idx.update(h, c.wants, c.subclients);
    }
    if (step % 10 != 0) continue;
    std::vector<reference_client> cs;
    double total = 0;
    for (const auto& entry : live) {
      cs.push_back(entry.second);
      total += entry.second.wants;
    }
    for (const double ratio : {5.0, 10.0, 15.0, 20.0, 30.0, 31.0}) {
      doorman::demand_sums below;
      for (const auto& x : cs) {
        if (x.wants / x.subclients < ratio) {
          below.wants += x.wants;
          below.subclients += x.subclients;
        }
      }
      REQUIRE(idx.below(ratio).wants == Approx(below.wants));
      REQUIRE(idx.below(ratio).subclients == Approx(below.subclients));
    }
    const double capacity = total * 0.5;
    const double level = idx.water_level(capacity);
    const auto ref = brute_fair(cs, capacity);
    for (std::size_t i = 0; i < cs.size(); ++i)
      REQUIRE(std::min(cs[i].wants, level * cs[i].subclients) == Approx(ref[i]).margin(1e-9));
  }
  REQUIRE(idx.size() == 2000);
}

// ---- algorithms through the engine ------------------------------------------------------------

TEST_CASE("worked allocation vectors", "[core][algorithm]") {
  // Each client first arrives (registering its demand), then everyone refreshes in order twice:
  // a lease cut in the first refresh is free for the others once its client confirms the cut
  // (asks again) in the second.
  auto run = [](const std::string& kind, double capacity,
                const std::vector<reference_client>& clients) {
    fixture f(repo_for(kind, capacity));
    auto round = [&] {
      std::vector<double> got;
      for (std::size_t i = 0; i < clients.size(); ++i) {
        const std::string id = "c" + std::to_string(i);
        if (clients[i].subclients == 1) {
          got.push_back(f.ask(id, clients[i].wants));
        } else {
          got.push_back(f.ask_server(
              id, {{0, static_cast<std::int64_t>(clients[i].subclients), clients[i].wants}}));
        }
      }
      f.clock.advance(6s);  // past the minimum refresh interval
      return got;
    };
    (void)round();
    (void)round();
    return round();
  };
  using V = std::vector<double>;
  CHECK(run("FAIR_SHARE", 120, {{1000, 1}, {60, 1}, {10, 1}}) == V{55, 55, 10});
  CHECK(run("FAIR_SHARE", 120, {{1000, 1}, {50, 1}, {10, 1}}) == V{60, 50, 10});
  CHECK(run("FAIR_SHARE", 120, {{1000, 6}, {500, 4}, {200, 2}}) == V{60, 40, 20});
  CHECK(run("STATIC", 100, {{100, 1}, {10, 1}, {120, 1}}) == V{100, 10, 100});
  // Our own: proportional share of 120 among 1000, 60, 10: equal share 40; 30 left over by the
  // 10, split 960:20 between the others.
  const auto p = run("PROPORTIONAL_SHARE", 120, {{1000, 1}, {60, 1}, {10, 1}});
  CHECK(p[0] == Approx(40 + 30.0 * 960 / 980));
  CHECK(p[1] == Approx(40 + 30.0 * 20 / 980));
  CHECK(p[2] == 10);
  CHECK(run("NO_ALGORITHM", 10, {{1000, 1}, {60, 1}}) == V{1000, 60});
  // STATIC caps per end client: a server child of 3 clients may get 3 x capacity.
  CHECK(run("STATIC", 100, {{500, 3}, {50, 2}}) == V{300, 50});
}

TEST_CASE("arrival order: a newcomer gets only what is available", "[core][algorithm]") {
  fixture f(repo_for("FAIR_SHARE", 120));
  CHECK(f.ask("a", 1000) == 120);  // alone: everything
  CHECK(f.ask("b", 60) == 0);      // entitled to 60, but a holds it all
  CHECK(f.ask("c", 10) == 0);
  f.clock.advance(6s);
  CHECK(f.ask("a", 1000) == 55);  // cut down to its fair share
  // Not free until a confirms the cut by asking again: the answer could be lost, and a would
  // hold 120 until its lease ends.
  CHECK(f.ask("b", 60) == 0);
  f.clock.advance(6s);
  CHECK(f.ask("a", 1000) == 55);
  CHECK(f.ask("b", 60) == 55);
  CHECK(f.ask("c", 10) == 10);

  SECTION("PROPORTIONAL_SHARE likewise") {
    fixture g(repo_for("PROPORTIONAL_SHARE", 100));
    CHECK(g.ask("a", 80) == 80);
    CHECK(g.ask("b", 80) == 20);  // entitled to 50, only 20 left
    g.clock.advance(6s);
    CHECK(g.ask("a", 80) == 50);
    g.clock.advance(6s);
    CHECK(g.ask("a", 80) == 50);
    CHECK(g.ask("b", 80) == 50);
  }
}

TEST_CASE("subclients weigh fairness per end client", "[core][algorithm]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  // A server with 3 clients and a lone client, both wanting a lot: 75 / 25.
  (void)f.ask_server("leaf", {{0, 3, 1000}});
  (void)f.ask("solo", 1000);
  f.clock.advance(6s);
  CHECK(f.ask_server("leaf", {{0, 3, 1000}}) == Approx(75));  // a cut, confirmed next time
  f.clock.advance(6s);
  CHECK(f.ask_server("leaf", {{0, 3, 1000}}) == Approx(75));
  CHECK(f.ask("solo", 1000) == Approx(25));
}

TEST_CASE("higher priority bands are served first", "[core][algorithm]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  (void)f.ask("low", 100, "res", 0);
  (void)f.ask("high", 70, "res", 1);
  f.clock.advance(6s);
  CHECK(f.ask("low", 100, "res", 0) == Approx(30));  // a cut, confirmed next time
  f.clock.advance(6s);
  CHECK(f.ask("low", 100, "res", 0) == Approx(30));
  CHECK(f.ask("high", 70, "res", 1) == Approx(70));
  SECTION("a server child's bands are decided each in its own priority") {
    f.clock.advance(6s);
    CHECK(f.ask_server("leaf", {{1, 1, 10}, {0, 1, 100}}) == 0);  // a newcomer: nothing free
    f.clock.advance(6s);
    // high: 70 + leaf's 10 at priority 1 fit; 20 left at priority 0, split 10/10.
    CHECK(f.ask("high", 70, "res", 1) == Approx(70));
    CHECK(f.ask("low", 100, "res", 0) == Approx(10));
    f.clock.advance(6s);
    CHECK(f.ask("low", 100, "res", 0) == Approx(10));  // the cut confirmed
    CHECK(f.ask_server("leaf", {{1, 1, 10}, {0, 1, 100}}) == Approx(20));
  }
}

namespace {

// A user's own algorithm: grants a configurable fraction of wants (default one half).
struct fraction_of_wants {
  static constexpr std::string_view kind = "FRACTION";
  static constexpr bool shares_capacity = true;
  double fraction = 0.5;
  fraction_of_wants() = default;
  explicit fraction_of_wants(const nlohmann::json& parameters)
      : fraction(parameters.value("fraction", 0.5)) {}
  [[nodiscard]] double share(const doorman::band_context&, doorman::demand d) const {
    return d.wants * fraction;
  }
};
static_assert(doorman::algorithm<fraction_of_wants>);

}  // namespace

TEST_CASE("users extend the algorithms with their own type", "[core][algorithm]") {
  using algorithms = doorman::default_algorithms::with<fraction_of_wants>;
  using custom_engine = doorman::basic_engine<manual_clock, algorithms>;
  const std::string text = R"({"resources": [
    {"identifier_glob": "quarter", "capacity": 100,
     "algorithm": {"kind": "FRACTION", "lease_length": 60, "refresh_interval": 16,
                   "learning_mode_duration": 0, "parameters": {"fraction": 0.25}}},
    {"identifier_glob": "*", "capacity": 100,
     "algorithm": {"kind": "fraction", "lease_length": 60, "refresh_interval": 16,
                   "learning_mode_duration": 0}}]})";
  manual_clock clock;
  custom_engine e(custom_engine::parse_config(text));
  e.set_mastership(true, std::nullopt, clock.now());
  auto r = e.get_capacity({"a", {{"half", 0, 40, std::nullopt}, {"quarter", 0, 40, std::nullopt}}},
                          clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets.capacity == 20);
  CHECK(r.value().resources[1].gets.capacity == 10);
  // Capped by what is available, like the built-in sharing algorithms.
  auto big = e.get_capacity({"b", {{"half", 0, 1000, std::nullopt}}}, clock.now());
  REQUIRE(big);
  CHECK(big.value().resources[0].gets.capacity == 80);
  // The default engine does not know the kind.
  CHECK_THROWS_WITH(engine_t::parse_config(text), Contains("unknown algorithm kind \"FRACTION\""));
}

// ---- engine behaviour ----------------------------------------------------------------------

TEST_CASE("expired leases free their capacity", "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  CHECK(f.ask("a", 100) == 100);
  CHECK(f.ask("b", 100) == 0);
  f.clock.advance(50s);
  CHECK(f.ask("b", 100) == 0);  // a still holds its lease
  f.clock.advance(10s);         // a's lease (60 s) ends now
  CHECK(f.ask("b", 100) == 100);
  CHECK(f.engine.store("res")->size() == 1);
  f.clock.advance(61s);
  f.engine.expire(f.clock.now());
  CHECK(f.engine.store("res") == nullptr);  // nothing left: the resource's state is dropped
}

TEST_CASE("leases carry the template's length and refresh interval", "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  auto r = f.engine.get_capacity({"a", {{"res", 0, 10, std::nullopt}}}, f.clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets == doorman::lease_info{10, 60, 16});
  CHECK(r.value().mastership == doorman::mastership_info{true, "self:7700"});
}

TEST_CASE("learning mode grants what clients say they have", "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100, 60));
  auto has = [&](const std::string& id, double wants, double capacity) {
    auto r = f.engine.get_capacity({id, {{"res", 0, wants, doorman::lease_info{capacity, 30, 16}}}},
                                   f.clock.now());
    REQUIRE(r);
    return r.value().resources[0].gets.capacity;
  };
  CHECK(f.engine.learning("res", f.clock.now()));
  CHECK(has("a", 100, 70) == 70);
  CHECK(has("b", 100, 30) == 30);
  CHECK(f.ask("newcomer", 50) == 0);
  CHECK(has("liar", 1000, 5000) == 0);  // never more than the others' leases leave
  f.clock.advance(60s);
  CHECK_FALSE(f.engine.learning("res", f.clock.now()));
  f.engine.expire(f.clock.now());
  CHECK(f.engine.store("res") == nullptr);  // every learned lease (60 s) expired too

  SECTION("a liar alone gets at most the whole capacity") {
    fixture g(repo_for("FAIR_SHARE", 100, 60));
    auto r = g.engine.get_capacity({"liar", {{"res", 0, 1000, doorman::lease_info{5000, 30, 16}}}},
                                   g.clock.now());
    REQUIRE(r);
    CHECK(r.value().resources[0].gets.capacity == 100);
  }
  SECTION("0 turns learning mode off") {
    fixture g(repo_for("FAIR_SHARE", 100, 0));
    CHECK_FALSE(g.engine.learning("res", g.clock.now()));
    CHECK(g.ask("a", 40) == 40);
  }
  SECTION("learning restarts when mastership is regained") {
    f.engine.set_mastership(false, "other:7700", f.clock.now());
    f.engine.set_mastership(true, "self:7700", f.clock.now());
    CHECK(f.engine.learning("res", f.clock.now()));
    CHECK(f.ask("a", 40) == 0);
  }
}

TEST_CASE("learned leases are honoured after learning mode", "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100, 10));
  auto r = f.engine.get_capacity({"a", {{"res", 0, 100, doorman::lease_info{80, 50, 16}}}},
                                 f.clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets.capacity == 80);
  f.clock.advance(10s);  // learning over; a's learned lease (60 s) is still live
  CHECK(f.ask("b", 100) == 20);
}

TEST_CASE("minimum refresh interval returns the current lease", "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  CHECK(f.ask("a", 40) == 40);
  f.clock.advance(2s);
  auto r = f.engine.get_capacity({"a", {{"res", 0, 90, std::nullopt}}}, f.clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets == doorman::lease_info{40, 58, 16});  // same lease
  CHECK(f.engine.store("res")->totals().wants == 90);                     // wants recorded
  f.clock.advance(3s);
  CHECK(f.ask("a", 90) == 90);  // 5 s after the decision: the algorithm runs again

  SECTION("a client holding nothing is decided again at once") {
    f.clock.advance(5s);
    CHECK(f.ask("a", 100) == 100);
    CHECK(f.ask("b", 60) == 0);  // nothing left
    (void)f.engine.release_capacity({"a", {"res"}}, f.clock.now()).value();
    CHECK(f.ask("b", 60) == 60);  // not held back by the minimum interval: it held little
  }
  SECTION("0 disables it") {
    doorman::engine_options opts;
    opts.minimum_refresh_interval = doorman::seconds{0};
    fixture g(repo_for("FAIR_SHARE", 100), opts);
    CHECK(g.ask("a", 40) == 40);
    CHECK(g.ask("a", 90) == 90);
  }
}

TEST_CASE("release gives capacity back at once", "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  CHECK(f.ask("a", 100) == 100);
  auto r = f.engine.release_capacity({"a", {"res", "unknown-resource"}}, f.clock.now());
  REQUIRE(r);
  CHECK(r.value().mastership.is_master);
  CHECK(f.ask("b", 100) == 100);
  CHECK(f.engine.store("res")->size() == 1);
}

TEST_CASE("safe capacity: configured, or capacity per live subclient", "[core][engine]") {
  auto safe_of = [](fixture& f, const std::string& id) {
    auto r = f.engine.get_capacity({id, {{"res", 0, 10, std::nullopt}}}, f.clock.now());
    REQUIRE(r);
    return r.value().resources[0].safe_capacity;
  };
  fixture dynamic(repo_for("FAIR_SHARE", 120));
  CHECK(safe_of(dynamic, "a") == 120);
  (void)dynamic.ask_server("leaf", {{0, 3, 10}});
  CHECK(safe_of(dynamic, "b") == 24);  // 120 / (1 + 3 + 1)
  fixture configured(repo_for("FAIR_SHARE", 120, 0, R"(, "safe_capacity": 7)"));
  CHECK(safe_of(configured, "a") == 7);
  fixture unlimited(repo_for("FAIR_SHARE", 120, 0, R"(, "safe_capacity": -1)"));
  CHECK(safe_of(unlimited, "a") == -1);
}

TEST_CASE("an intermediate's grants are capped by its own lease", "[core][engine]") {
  doorman::engine_options opts;
  opts.is_root = false;
  fixture f(repo_for("FAIR_SHARE", 1000), opts);
  auto none = f.engine.get_capacity({"a", {{"res", 0, 10, std::nullopt}}}, f.clock.now());
  REQUIRE(none);
  // No lease from the parent yet: nothing to give, and no invitation to come straight back.
  CHECK(none.value().resources[0].gets == doorman::lease_info{0, 2, 2});
  f.clock.advance(6s);
  f.engine.set_parent_lease("res", {50, f.clock.now() + 20s, 8s}, f.clock.now());
  auto r = f.engine.get_capacity({"a", {{"res", 0, 80, std::nullopt}}}, f.clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets.capacity == 50);    // the parent's capacity, not 1000
  CHECK(r.value().resources[0].gets.expires_in == 20);  // not 60: never outlive our lease
  CHECK(r.value().resources[0].gets.refresh_interval == 16);
  f.clock.advance(15s);
  auto s = f.engine.get_capacity({"b", {{"res", 0, 80, std::nullopt}}}, f.clock.now());
  REQUIRE(s);
  CHECK(s.value().resources[0].gets.expires_in == 5);
  CHECK(s.value().resources[0].gets.refresh_interval == 5);
  f.clock.advance(5s);
  CHECK(f.engine.capacity("res", f.clock.now()) == 0);
  CHECK(f.ask("c", 10) == 0);
}

TEST_CASE("an intermediate's client coming back as its lease ends gets the renewed parent lease",
          "[core][engine]") {
  // A grant ends with the intermediate's own lease. Within minimum_refresh_interval (5 s) a
  // client gets its lease back unchanged, but not one with less than that left: that one would
  // run out although the parent has renewed since (the simulator's hang_answers fault found
  // every client of an intermediate without a lease for a refresh interval).
  doorman::engine_options opts;
  opts.is_root = false;
  fixture f(repo_for("FAIR_SHARE", 1000), opts);
  f.clock.advance(6s);
  f.engine.set_parent_lease("res", {50, f.clock.now() + 8s, 2s}, f.clock.now());
  const auto ask = [&](std::optional<doorman::lease_info> has) {
    auto r = f.engine.get_capacity({"a", {{"res", 0, 10, has}}}, f.clock.now());
    REQUIRE(r);
    return r.value().resources[0].gets;
  };
  const auto first = ask(std::nullopt);
  CHECK(first.expires_in == 8);  // the parent's lease
  f.clock.advance(1s);
  const auto soon = ask(doorman::lease_info{first.capacity, 7, first.refresh_interval});
  CHECK(soon.expires_in == 7);  // 1 s later, 7 s left: handed back as it is
  f.clock.advance(3s);
  f.engine.set_parent_lease("res", {50, f.clock.now() + 8s, 2s}, f.clock.now());  // renewed
  const auto ending = ask(doorman::lease_info{first.capacity, 4, first.refresh_interval});
  CHECK(ending.capacity == 10);
  CHECK(ending.expires_in == 8);  // 4 s after the decision, 4 s left: decided again
}

TEST_CASE("a non-master answers with its mastership only", "[core][engine]") {
  manual_clock clock;
  engine_t e(repo_for("FAIR_SHARE", 100));
  e.set_mastership(false, "10.0.0.7:7700", clock.now());
  auto r = e.get_capacity({"a", {{"res", 0, 10, std::nullopt}}}, clock.now());
  REQUIRE(r);
  CHECK(r.value().resources.empty());
  CHECK(r.value().mastership == doorman::mastership_info{false, "10.0.0.7:7700"});
  CHECK(e.discovery(clock.now()).mastership.master == "10.0.0.7:7700");
  auto s = e.get_server_capacity({"leaf", {{"res", std::nullopt, 0, {{0, 2, 10}}}}}, clock.now());
  REQUIRE(s);
  CHECK(s.value().resources.empty());
  CHECK(e.store("res") == nullptr);
}

TEST_CASE("a lease the engine does not know is logged, not trusted", "[core][engine]") {
  std::vector<std::string> lines;
  doorman::engine_options opts;
  opts.log = [&](std::string_view line) { lines.emplace_back(line); };
  fixture f(repo_for("FAIR_SHARE", 100), opts);
  CHECK(f.ask("a", 100) == 100);
  auto r = f.engine.get_capacity({"b", {{"res", 0, 50, doorman::lease_info{50, 30, 16}}}},
                                 f.clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets.capacity == 0);  // only what is available
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Contains("client b reports a lease of 50"));
}

TEST_CASE("invalid requests are refused with the field named and change nothing",
          "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  auto error_of = [&](const doorman::capacity_request& req) {
    auto r = f.engine.get_capacity(req, f.clock.now());
    REQUIRE_FALSE(r);
    CHECK(r.error().code == doorman::errc::invalid_params);
    return r.error().message;
  };
  CHECK(error_of({"", {}}) == "client_id: must be a non-empty string");
  CHECK(error_of({std::string(257, 'x'), {}}) == "client_id: must be at most 256 bytes");
  CHECK(error_of({"a", {{"res", 0, -1, std::nullopt}}}) ==
        "resources[0].wants: must be a finite number between 0 and 1e15");
  CHECK(error_of({"a", {{"res", 0, std::nan(""), std::nullopt}}}) ==
        "resources[0].wants: must be a finite number between 0 and 1e15");
  CHECK(error_of({"a", {{"res", 0, 1, std::nullopt}, {"", 0, 1, std::nullopt}}}) ==
        "resources[1].resource_id: must be a non-empty string");
  CHECK(error_of({"a", {{"res", 0, 1, std::nullopt}, {"res", 0, 1, std::nullopt}}}) ==
        "resources[1]: duplicate resource id \"res\"");
  CHECK(error_of({"a", {{"res", 0, 1, doorman::lease_info{-3, 1, 1}}}}) ==
        "resources[0].has.capacity: must be a finite number between 0 and 1e15");
  doorman::capacity_request many{"a", {}};
  for (int i = 0; i <= 10'000; ++i)
    many.resources.push_back({"r" + std::to_string(i), 0, 1, {}});
  CHECK(error_of(many) == "resources: must hold at most 10000 resources");
  CHECK(f.engine.store("res") == nullptr);  // nothing was recorded

  auto server_error = [&](const doorman::server_capacity_request& req) {
    auto r = f.engine.get_server_capacity(req, f.clock.now());
    REQUIRE_FALSE(r);
    return r.error().message;
  };
  CHECK(server_error({"leaf", {{"res", std::nullopt, 0, {{0, 0, 10}}}}}) ==
        "resources[0].wants[0].num_clients: must be an integer between 1 and 1000000000");
  CHECK(server_error({"leaf", {{"res", std::nullopt, -1, {{0, 1, 10}}}}}) ==
        "resources[0].outstanding: must be a finite number between 0 and 1e15");
  CHECK(server_error({"leaf", {{"res", std::nullopt, 0, {}}}}) ==
        "resources[0].wants: must hold at least one band");
  CHECK(server_error({"leaf", {{"res", std::nullopt, 0, {{0, 1, 10}, {0, 2, 5}}}}}) ==
        "resources[0].wants[1].priority: duplicates wants[0].priority");
  auto release = f.engine.release_capacity({"a", {"x", "x"}}, f.clock.now());
  REQUIRE_FALSE(release);
  CHECK(release.error().message == "resources[1]: duplicate resource id \"x\"");
  auto status = f.engine.status({std::string()}, f.clock.now());
  REQUIRE_FALSE(status);
  CHECK(status.error().message == "resource_id: must be a non-empty string");
  CHECK(f.engine.store("res") == nullptr);
}

TEST_CASE("a server child's outstanding grants are recorded on every request", "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  auto outstanding_after = [&](double outstanding) {
    REQUIRE(f.engine.get_server_capacity(
        {"leaf", {{"res", std::nullopt, outstanding, {{0, 2, 40}}}}}, f.clock.now()));
    auto s = f.engine.status({"res"}, f.clock.now());
    REQUIRE(s);
    REQUIRE(s.value().leases.size() == 1);
    CHECK(s.value().leases[0].is_server);
    return s.value().leases[0].outstanding;
  };
  CHECK(outstanding_after(12) == 12);
  f.clock.advance(1s);  // within the minimum refresh interval: the lease is reused...
  CHECK(outstanding_after(30) == 30);  // ...but what the child reports is still recorded
}

TEST_CASE("configuration reload keeps leases", "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  CHECK(f.ask("a", 80) == 80);
  f.engine.set_config(repo_for("FAIR_SHARE", 200));
  CHECK(f.engine.store("res")->sum_has() == 80);
  CHECK(f.ask("b", 150) == 120);  // the new capacity, minus a's lease
  f.engine.set_config(repo_for("PROPORTIONAL_SHARE", 200));
  auto s = f.engine.status({"res"}, f.clock.now());
  REQUIRE(s);
  CHECK(s.value().resources[0].algorithm == "PROPORTIONAL_SHARE");
  CHECK(s.value().leases.size() == 2);
}

TEST_CASE("count_hits counts exactly in fixed windows of the capacity × the window",
          "[core][engine][count]") {
  // res*: 0.5 per second, so 30 per minute.
  fixture f(repo_for("FAIR_SHARE", 0.5));
  f.clock.advance(30s);  // half way through the first minute
  auto count = [&](const std::string& id, double hits, double window = 60) {
    auto r = f.engine.count_hits({"c", {{id, hits, window}}}, f.clock.now());
    REQUIRE(r);
    REQUIRE(r.value().resources.size() == 1);
    CHECK(r.value().resources[0].resource_id == id);
    return r.value().resources[0];
  };
  auto v = count("res1", 20);
  CHECK(v.admitted);
  CHECK(v.limit == 30);
  CHECK(v.remaining == 10);
  CHECK(v.reset == Approx(30));
  v = count("res1", 11);  // refused whole: nothing consumed
  CHECK_FALSE(v.admitted);
  CHECK(v.remaining == 10);
  CHECK(count("res1", 10).admitted);
  v = count("res1", 1);
  CHECK_FALSE(v.admitted);
  CHECK(v.remaining == 0);
  CHECK(count("res2", 30).admitted);        // another resource, its own count
  CHECK_FALSE(count("other", 1).admitted);  // the "*" template: capacity 0
  f.clock.advance(30s);                     // the next window
  v = count("res1", 1);
  CHECK(v.admitted);
  CHECK(v.remaining == 29);
  CHECK(v.reset == Approx(60));
  CHECK(count("res1", 0.5, 1).limit == 0);  // another window length: its own limit, 0.5 × 1 s
  CHECK(f.engine.hit_counters() == 3);
  f.clock.advance(61s);
  f.engine.expire(f.clock.now());  // every window has ended
  CHECK(f.engine.hit_counters() == 0);
}

TEST_CASE("count_hits: another window length never restarts a count under way",
          "[core][engine][count]") {
  fixture f(repo_for("FAIR_SHARE", 1));  // 60 a minute, 61 in 61 s
  f.clock.advance(10s);
  auto count = [&](double hits, double window) {
    return f.engine.count_hits({"c", {{"res", hits, window}}}, f.clock.now()).value().resources[0];
  };
  // Alternating the length asked for, as fast as one can: the hits of the window under way
  // stay counted, so a second admits one window's limit, not a limit per call.
  double admitted = 0;
  for (int i = 0; i < 1000; ++i) {
    if (count(1, i % 2 == 0 ? 60 : 61).admitted) ++admitted;
    f.clock.advance(1ms);
  }
  CHECK(admitted <= 61);
  CHECK(admitted >= 60);
  // Once the window it was counted in has ended, the count starts afresh.
  f.clock.advance(61s);
  const auto v = count(1, 60);
  CHECK(v.admitted);
  CHECK(v.remaining == 59);
}

TEST_CASE("count_hits: the table keeps being swept once it was empty", "[core][engine][count]") {
  doorman::engine_options o;
  o.max_hit_counters = 2;
  fixture f(repo_for("FAIR_SHARE", 1), o);
  auto admitted = [&](const std::string& id) {
    return f.engine.count_hits({"c", {{id, 1, 10}}}, f.clock.now()).value().resources[0].admitted;
  };
  f.engine.expire(f.clock.now());  // a sweep of the empty table
  // Many windows later, a new resource still finds room as soon as an old one's window ended.
  for (int i = 0; i < 50; ++i) {
    INFO("round " << i);
    CHECK(admitted("res_a" + std::to_string(i)));
    CHECK(admitted("res_b" + std::to_string(i)));
    CHECK_FALSE(admitted("res_full" + std::to_string(i)));  // two windows are live
    f.clock.advance(10s);
    if (i % 7 == 0) f.engine.expire(f.clock.now());  // sweeps that empty it, now and then
  }
  CHECK(f.engine.hit_counters() <= 2);
}

TEST_CASE("count_hits: a reload applies its capacity to the window under way",
          "[core][engine][count]") {
  fixture f(repo_for("FAIR_SHARE", 0.5));  // 30 a minute
  auto count = [&](double hits) {
    return f.engine.count_hits({"c", {{"res", hits, 60}}}, f.clock.now()).value().resources[0];
  };
  CHECK(count(30).remaining == 0);
  f.engine.set_config(repo_for("FAIR_SHARE", 1));  // 60 a minute: 30 more in this window
  const auto v = count(1);
  CHECK(v.admitted);
  CHECK(v.limit == 60);
  CHECK(v.remaining == 29);
}

TEST_CASE("count_hits: bounds, non-masters, intermediates and a full table",
          "[core][engine][count]") {
  doorman::engine_options o;
  o.max_hit_counters = 2;
  fixture f(repo_for("FAIR_SHARE", 1), o);
  auto r = f.engine.count_hits({"c", {{"res", 1, 0}}}, f.clock.now());
  REQUIRE_FALSE(r);
  CHECK(r.error().message ==
        "resources[0].window: must be between 0.001 and 31622400 seconds (366 days)");
  r = f.engine.count_hits({"c", {{"res", -1, 1}}}, f.clock.now());
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "resources[0].hits: must be a number between 0 and 1e9");
  r = f.engine.count_hits({"c", {{"res", 1, 1}, {"res", 1, 1}}}, f.clock.now());
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "resources[1]: duplicate resource id \"res\"");
  CHECK(f.engine.hit_counters() == 0);  // nothing counted

  // A full table refuses a new resource until a window ends, and keeps counting the others.
  CHECK(f.engine.count_hits({"c", {{"res1", 1, 10}, {"res2", 1, 20}}}, f.clock.now())
            .value()
            .resources[1]
            .admitted);
  auto full = f.engine.count_hits({"c", {{"res3", 1, 10}, {"res1", 1, 10}}}, f.clock.now());
  CHECK_FALSE(full.value().resources[0].admitted);
  CHECK(full.value().resources[1].admitted);
  f.clock.advance(10s);  // res1's window ended: room again
  CHECK(f.engine.count_hits({"c", {{"res3", 1, 10}}}, f.clock.now()).value().resources[0].admitted);

  // A non-master counts nothing and names the master.
  f.engine.set_mastership(false, "other:7700", f.clock.now());
  auto redirect = f.engine.count_hits({"c", {{"res1", 1, 10}}}, f.clock.now());
  REQUIRE(redirect);
  CHECK(redirect.value().resources.empty());
  CHECK(redirect.value().mastership.master == "other:7700");

  // An intermediate holds a share, not the limit: it does not count.
  doorman::engine_options io;
  io.is_root = false;
  fixture mid(repo_for("FAIR_SHARE", 1), io);
  auto refused = mid.engine.count_hits({"c", {{"res", 1, 1}}}, mid.clock.now());
  REQUIRE_FALSE(refused);
  CHECK(refused.error().message == "resources: counted only at the root (this node has a parent)");
}

TEST_CASE("status reports resources and, for one resource, its leases", "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  (void)f.ask("a", 30);
  (void)f.ask_server("leaf", {{0, 4, 50}});
  (void)f.ask("other-client", 5, "elsewhere");
  auto all = f.engine.status({}, f.clock.now());
  REQUIRE(all);
  REQUIRE(all.value().resources.size() == 2);
  const auto& res = all.value().resources[1];
  CHECK(res.resource_id == "res");
  CHECK(res.capacity == 100);
  CHECK(res.sum_has == 80);
  CHECK(res.sum_wants == 80);
  CHECK(res.clients == 2);
  CHECK(res.subclients == 5);
  CHECK(res.algorithm == "FAIR_SHARE");
  CHECK_FALSE(res.learning);
  auto one = f.engine.status({"res"}, f.clock.now());
  REQUIRE(one);
  REQUIRE(one.value().leases.size() == 2);
  CHECK(one.value().leases[1].client_id == "leaf");
  CHECK(one.value().leases[1].is_server);
  CHECK(one.value().leases[1].subclients == 4);
}

// ---- properties on random workloads --------------------------------------------------------

namespace {

// Grants as the test itself saw them, to check the invariant without trusting the store's sums.
struct grant_ledger {
  std::map<std::string, std::pair<double, manual_clock::time_point>> grants;
  void record(const std::string& id, const doorman::lease_info& l, manual_clock::time_point now) {
    grants[id] = {l.capacity, now + doorman::to_duration<manual_clock::duration>(l.expires_in)};
  }
  [[nodiscard]] double live(manual_clock::time_point now) const {
    double sum = 0;
    for (const auto& [id, g] : grants) {
      if (g.second > now) sum += g.first;
    }
    return sum;
  }
};

}  // namespace

TEST_CASE("sum of unexpired grants never exceeds capacity (random workloads)", "[core][property]") {
  for (const std::string kind : {"FAIR_SHARE", "PROPORTIONAL_SHARE"}) {
    for (std::uint64_t seed = 1; seed <= 8; ++seed) {
      CAPTURE(kind, seed);
      std::mt19937_64 rng(seed);
      const double capacity = 50.0 + static_cast<double>(rng() % 1000);
      fixture f(repo_for(kind, capacity));
      grant_ledger ledger;
      std::uniform_real_distribution<double> wants(0, capacity / 3);
      for (int step = 0; step < 4000; ++step) {
        const std::string id = "c" + std::to_string(rng() % 60);
        switch (rng() % 10) {
          case 0: {
            REQUIRE(f.engine.release_capacity({id, {"res"}}, f.clock.now()));
            ledger.grants.erase(id);
            break;
          }
          case 1: {
            std::vector<doorman::priority_band> bands{
                {0, static_cast<std::int64_t>(1 + rng() % 5), wants(rng) * 3}};
            auto r = f.engine.get_server_capacity({id, {{"res", std::nullopt, 0, bands}}},
                                                  f.clock.now());
            REQUIRE(r);
            ledger.record(id, r.value().resources[0].gets, f.clock.now());
            break;
          }
          default: {
            auto r = f.engine.get_capacity(
                {id, {{"res", static_cast<std::int64_t>(rng() % 2), wants(rng), std::nullopt}}},
                f.clock.now());
            REQUIRE(r);
            ledger.record(id, r.value().resources[0].gets, f.clock.now());
          }
        }
        REQUIRE(ledger.live(f.clock.now()) <= capacity * (1 + 1e-12));
        f.clock.advance(std::chrono::milliseconds(rng() % 1500));
      }
    }
  }
}

TEST_CASE("FAIR_SHARE and PROPORTIONAL_SHARE converge to the brute-force allocation",
          "[core][property]") {
  for (const std::string kind : {"FAIR_SHARE", "PROPORTIONAL_SHARE"}) {
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      CAPTURE(kind, seed);
      std::mt19937_64 rng(seed);
      const std::size_t n = 2 + rng() % 40;
      std::vector<reference_client> cs;
      double total = 0;
      for (std::size_t i = 0; i < n; ++i) {
        cs.push_back({static_cast<double>(rng() % 1000) / 7.0, static_cast<double>(1 + rng() % 4)});
        total += cs.back().wants;
      }
      // From scarce to plentiful.
      const double capacity = total * static_cast<double>(1 + rng() % 12) / 10.0;
      fixture f(repo_for(kind, capacity));
      std::vector<std::size_t> order(n);
      for (std::size_t i = 0; i < n; ++i)
        order[i] = i;
      std::vector<double> got(n);
      // Arrival, then three refreshes: cuts, their confirmations, what they freed collected.
      for (int round = 0; round < 4; ++round) {
        std::shuffle(order.begin(), order.end(), rng);
        for (const auto i : order) {
          const std::string id = "c" + std::to_string(i);
          got[i] = cs[i].subclients == 1
                       ? f.ask(id, cs[i].wants)
                       : f.ask_server(
                             id, {{0, static_cast<std::int64_t>(cs[i].subclients), cs[i].wants}});
        }
        f.clock.advance(6s);
      }
      const auto ref =
          kind == "FAIR_SHARE" ? brute_fair(cs, capacity) : brute_proportional(cs, capacity);
      for (std::size_t i = 0; i < n; ++i) {
        CAPTURE(i, cs[i].wants, cs[i].subclients);
        CHECK(got[i] == Approx(ref[i]).margin(1e-9 * capacity));
      }
    }
  }
}

// ---- the changes measured in the simulator (docs/simulation.md) ----

TEST_CASE("a parent counts what a server child still has out beyond its lease", "[core][engine]") {
  const bool counting = GENERATE(true, false);
  doorman::engine_options o;
  o.count_outstanding = counting;
  fixture f(repo_for("FAIR_SHARE", 100), o);
  const auto serve = [&](const std::string& id, double wants, double outstanding, double has) {
    std::optional<doorman::lease_info> lease;
    if (has > 0) lease = doorman::lease_info{has, 50, 8};
    auto r = f.engine.get_server_capacity({id, {{"res", lease, outstanding, {{0, 1, wants}}}}},
                                          f.clock.now());
    REQUIRE(r);
    return r.value().resources[0].gets.capacity;
  };
  CHECK(serve("a", 100, 0, 0) == 100);
  // a's lease shrinks to its share, but its own clients still hold the 100 it had.
  f.clock.advance(1s);
  CHECK(serve("a", 50, 100, 100) == 50);
  f.clock.advance(1s);
  // b may only have what a's clients do not still hold.
  CHECK(serve("b", 100, 0, 0) == (counting ? 0 : 50));
  // Once a reports that its clients gave the excess back, b gets it.
  f.clock.advance(1s);
  CHECK(serve("a", 50, 50, 50) == 50);
  f.clock.advance(1s);
  CHECK(serve("b", 100, 0, 0) == 50);
}

TEST_CASE("a server child that lost its state keeps its old lease counted and its demand",
          "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 90));
  const auto serve = [&](const std::string& id, double subclients, double wants, double outstanding,
                         std::optional<doorman::lease_info> has) {
    auto r = f.engine.get_server_capacity(
        {id, {{"res", has, outstanding, {{0, static_cast<std::int64_t>(subclients), wants}}}}},
        f.clock.now());
    REQUIRE(r);
    return r.value().resources[0].gets.capacity;
  };
  CHECK(serve("a", 2, 60, 0, std::nullopt) == 60);
  CHECK(serve("b", 1, 60, 0, std::nullopt) == 30);
  f.clock.advance(1s);
  // a's new master: no lease from here, one of its two clients back so far, nothing granted.
  CHECK(serve("a", 1, 10, 0, std::nullopt) == 60);  // its old demand (2 clients) still counts
  const auto* a = f.engine.store("res")->find("a");
  REQUIRE(a != nullptr);
  CHECK(a->subclients() == 2);
  CHECK(doorman::basic_lease_store<manual_clock::time_point>::held(*a) >= 60);
  f.clock.advance(1s);
  CHECK(serve("b", 1, 60, 30, doorman::lease_info{30, 50, 8}) == 30);  // no more for b
  // After a's learning mode, its report counts again.
  f.clock.advance(61s);
  CHECK(serve("a", 1, 10, 10, doorman::lease_info{60, 10, 8}) == 10);
}

TEST_CASE("learning mode: an intermediate without capacity hands leases back unchanged",
          "[core][engine]") {
  const bool echo = GENERATE(true, false);
  doorman::engine_options o;
  o.is_root = false;
  o.echo_in_learning = echo;
  fixture f(repo_for("FAIR_SHARE", 100, 60), o);
  auto r = f.engine.get_capacity({"a", {{"res", 0, 50, doorman::lease_info{30, 20, 16}}}},
                                 f.clock.now());
  REQUIRE(r);
  const auto& got = r.value().resources[0].gets;
  if (echo) {
    CHECK(got.capacity == 30);
    CHECK(got.expires_in <= 20);  // not extended
    CHECK(got.refresh_interval <= 2);
  } else {
    CHECK(got.capacity == 0);  // cut to the capacity: the client would report 0 from now on
  }
  if (echo) {
    // A lease about to run out comes back halfway through what it has left, while the client
    // can still report it (not after the 2 s of no_parent_refresh_interval).
    const auto soon = f.engine.get_capacity(
        {"a", {{"res", 0, 50, doorman::lease_info{10, 1.5, 16}}}}, f.clock.now());
    REQUIRE(soon);
    CHECK(soon.value().resources[0].gets.capacity == 10);
    CHECK(soon.value().resources[0].gets.refresh_interval == Approx(0.75));
  }
  // With a lease from the parent, what fits is confirmed (and extended).
  f.engine.set_parent_lease("res", {25, f.clock.now() + 60s, 8s}, f.clock.now());
  r = f.engine.get_capacity({"a", {{"res", 0, 50, doorman::lease_info{30, 18, 16}}}},
                            f.clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets.capacity == 25);
  CHECK(r.value().resources[0].gets.expires_in > 50);
}

TEST_CASE("learning mode: a root whose capacity is 0 confirms nothing", "[core][engine]") {
  // Found by the engine fuzzer: the echo meant for an intermediate without a parent lease also
  // answered a root configured with capacity 0, handing back a client's reported lease, which
  // then outlived learning mode (2 s) by a whole lease (10 s) over a capacity of 0.
  fixture f(repo_for("PROPORTIONAL_SHARE", 0, 2));  // echo_in_learning is on by default
  REQUIRE(f.engine.learning("res", f.clock.now()));
  auto r = f.engine.get_capacity({"c2", {{"res", -1, 1e15, doorman::lease_info{38.6, 3e5, 2}}}},
                                 f.clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets.capacity == 0);
}

TEST_CASE("refresh intervals: soon when owed, at the end of learning mode", "[core][engine]") {
  SECTION("owed") {
    const bool owed = GENERATE(true, false);
    doorman::engine_options o;
    o.refresh_when_owed = owed;
    fixture f(repo_for("FAIR_SHARE", 100), o);
    CHECK(f.ask("a", 100) == 100);
    auto r = f.engine.get_capacity({"b", {{"res", 0, 100, std::nullopt}}}, f.clock.now());
    REQUIRE(r);
    CHECK(r.value().resources[0].gets.capacity == 0);  // a still holds it all
    CHECK(r.value().resources[0].gets.refresh_interval == (owed ? 5 : 16));
  }
  SECTION("learning") {
    const bool after = GENERATE(true, false);
    doorman::engine_options o;
    o.refresh_after_learning = after;
    fixture f(repo_for("FAIR_SHARE", 100, 60), o);
    f.clock.advance(50s);
    auto r = f.engine.get_capacity({"a", {{"res", 0, 10, std::nullopt}}}, f.clock.now());
    REQUIRE(r);
    // Clients come back 2 s after learning mode ends (server children at its end).
    CHECK(r.value().resources[0].gets.refresh_interval == Approx(after ? 12 : 16));
  }
}

TEST_CASE("a master elected after a known quiet period learns for that much less",
          "[core][engine]") {
  fixture f(repo_for("FAIR_SHARE", 100, 60));
  f.engine.set_mastership(false, "other", f.clock.now());
  f.engine.set_mastership(true, "self", f.clock.now(), 40s);
  f.clock.advance(19s);
  CHECK(f.engine.learning("res", f.clock.now()));
  f.clock.advance(2s);
  CHECK_FALSE(f.engine.learning("res", f.clock.now()));
  f.engine.set_mastership(false, "other", f.clock.now());
  f.engine.set_mastership(true, "self", f.clock.now(), 600s);  // a whole lease: none
  CHECK_FALSE(f.engine.learning("res", f.clock.now()));
}

TEST_CASE("an intermediate tells its parent soon when its clients give back an excess",
          "[core][engine]") {
  doorman::engine_options o;
  o.is_root = false;
  fixture f(repo_for("FAIR_SHARE", 100), o);
  f.engine.set_parent_lease("res", {100, f.clock.now() + 60s, 8s}, f.clock.now());
  CHECK(f.ask("a", 50) == 50);
  CHECK(f.ask("b", 50) == 50);
  const auto before = f.engine.news();
  f.engine.set_parent_lease("res", {60, f.clock.now() + 60s, 8s}, f.clock.now());  // shrunk
  f.clock.advance(6s);
  CHECK(f.ask("a", 50) == 30);  // down to its share (`share_cuts`): a cut, yet to be confirmed
  CHECK(f.engine.news() == before);
  f.clock.advance(1s);
  CHECK(f.ask("a", 50) == 30);  // confirmed: the excess shrinks
  CHECK(f.engine.news() == before + 1);
  f.clock.advance(6s);
  CHECK(f.ask("a", 50) == 30);  // b still holds 50: nothing given back this time
  CHECK(f.engine.news() == before + 1);
}

TEST_CASE("over its capacity, a node brings each requester down to its share, never up",
          "[core][engine]") {
  for (const bool share : {true, false}) {
    INFO((share ? "share_cuts" : "Doorman's rule"));
    doorman::engine_options o;
    o.is_root = false;
    o.share_cuts = share;
    fixture f(repo_for("FAIR_SHARE", 100), o);
    f.engine.set_parent_lease("res", {100, f.clock.now() + 60s, 8s}, f.clock.now());
    CHECK(f.ask("a", 50) == 50);
    CHECK(f.ask("b", 30) == 30);
    CHECK(f.ask("c", 20) == 20);
    f.engine.set_parent_lease("res", {40, f.clock.now() + 60s, 8s}, f.clock.now());  // -60 %
    f.clock.advance(6s);
    // Doorman's rule gives what the others' leases leave (nothing); the share (40 / 3, 13.3)
    // comes instead, while more is out than the capacity.
    CHECK(f.ask("a", 50) == Approx(share ? 40.0 / 3 : 0));
    // Never above what it holds: c keeps 20 at most, though its share is above what it holds
    // once the others came down (until the excess is gone).
    CHECK(f.ask("c", 50) <= 20);
    const auto* store = f.engine.store("res");
    REQUIRE(store != nullptr);
    CHECK(store->sum_has() <= 100);  // what is out only falls
  }
}

// ---- hostile numbers: bounds, exact sums, untrusted answers -----------------------------------

TEST_CASE("band wants are bounded, so a child's demand cannot sum to infinity", "[core][bounds]") {
  fixture f(repo_for("NO_ALGORITHM", 1e15));
  auto r = f.engine.get_server_capacity(
      {"leaf", {{"res", std::nullopt, 0, {{0, 1, 1e308}, {1, 1, 1e308}}}}}, f.clock.now());
  REQUIRE_FALSE(r);
  CHECK(r.error().message ==
        "resources[0].wants[0].wants: must be a finite number between 0 and 1e15");
  CHECK(f.engine.store("res") == nullptr);

  // The largest accepted bands: the grant is finite, within bounds, and its answer decodes.
  std::vector<doorman::priority_band> bands;
  for (int p = 0; p < 1000; ++p)
    bands.push_back({p, 1'000'000'000, 1e15});
  auto ok =
      f.engine.get_server_capacity({"leaf", {{"res", std::nullopt, 1e15, bands}}}, f.clock.now());
  REQUIRE(ok);
  const auto& gets = ok.value().resources[0].gets;
  CHECK(std::isfinite(gets.capacity));
  CHECK(gets.capacity == 1e15);
  CHECK_FALSE(doorman::check_grant(gets, ok.value().resources[0].safe_capacity));
  const auto* store = f.engine.store("res");
  REQUIRE(store != nullptr);
  CHECK(std::isfinite(store->totals().wants));
  CHECK(std::isfinite(store->sum_held()));

  bands.push_back({1000, 1, 1});
  auto too_many =
      f.engine.get_server_capacity({"leaf", {{"res", std::nullopt, 0, bands}}}, f.clock.now());
  REQUIRE_FALSE(too_many);
  CHECK(too_many.error().message == "resources[0].wants: must hold at most 1000 bands");
}

TEST_CASE("a duplicate priority is named among many bands too", "[core][bounds]") {
  fixture f(repo_for("FAIR_SHARE", 100));
  std::vector<doorman::priority_band> bands;
  for (int p = 0; p < 40; ++p)
    bands.push_back({p, 1, 1});
  bands[31].priority = 7;
  bands[35].priority = 3;
  auto r = f.engine.get_server_capacity({"leaf", {{"res", std::nullopt, 0, bands}}}, f.clock.now());
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "resources[0].wants[31].priority: duplicates wants[7].priority");
}

TEST_CASE("a child's huge outstanding does not erase what the others hold", "[core][bounds]") {
  fixture f(repo_for("FAIR_SHARE", 10));
  CHECK(f.ask("a", 3.34) == Approx(3.34));
  CHECK(f.ask("b", 3.34) == Approx(3.34));
  for (const double outstanding : {1e17, 1.7e308, 1e15}) {
    auto r = f.engine.get_server_capacity(
        {"leaf", {{"res", std::nullopt, outstanding, {{0, 1, 10}}}}}, f.clock.now());
    if (outstanding > 1e15) {
      REQUIRE_FALSE(r);
      CHECK(r.error().message ==
            "resources[0].outstanding: must be a finite number between 0 and 1e15");
      continue;
    }
    REQUIRE(r);
    // a and b hold 6.68 of 10: never more than 3.32 for the child, whatever it reports.
    CHECK(r.value().resources[0].gets.capacity <= 10 - 2 * 3.34 + 1e-9);
  }
  const auto* store = f.engine.store("res");
  REQUIRE(store != nullptr);
  CHECK(std::isfinite(store->sum_held()));
  double leased = 0;
  store->for_each([&](const auto& c) { leased += c.lease.capacity; });
  CHECK(leased <= 10 + 1e-9);
  // The others still see the child's grants as held: nothing is left for a newcomer.
  CHECK(f.ask("c", 5) == 0);
}

TEST_CASE("a lease store keeps a small lease next to a huge one", "[core][bounds]") {
  doorman::basic_lease_store<manual_clock::time_point> store;
  const doorman::band_demand band{0, 1, 1};
  const auto& a = store.set_demand("a", std::span(&band, 1)).who;
  store.set_lease(a, {1e300, {}, {}}, {});
  store.set_lease(a, {33.3, {}, {}}, {});
  CHECK(store.sum_has() == 33.3);
  CHECK(store.sum_held() == 33.3);
  const auto& b = store.set_demand("b", std::span(&band, 1)).who;
  store.set_lease(b, {1e15, {}, {}}, {});
  CHECK(store.leased_by_others(b) == 33.3);
  CHECK(store.held_by_others(b) == 33.3);
  store.set_server_info(b, 1e15);
  store.set_server_info(b, 0);
  CHECK(store.sum_held() == 1e15 + 33.3);
}

TEST_CASE("a lease store's expiry queue is bounded by its clients, not by its refreshes",
          "[core][bounds]") {
  // Each refresh queues the new lease's expiry; the old entry is stale. Stale entries must not
  // pile up until they expire (a lease length of refreshes at the request rate).
  doorman::basic_lease_store<manual_clock::time_point> store;
  manual_clock clock;
  const doorman::band_demand band{0, 1, 1};
  for (int round = 0; round < 200; ++round) {
    for (int c = 0; c < 100; ++c) {
      const auto& who = store.set_demand(fmt::format("c{}", c), std::span(&band, 1)).who;
      store.set_lease(who, {1, clock.now() + std::chrono::seconds(60), std::chrono::seconds(16)},
                      clock.now());
      clock.advance(std::chrono::milliseconds(1));
    }
  }
  CHECK(store.size() == 100);
  CHECK(store.expiry_entries() <= 2 * 100 + 64);
  // Still exact: every lease expires when it should, not before.
  CHECK(store.expire(clock.now() + std::chrono::seconds(59)) == 0);
  CHECK(store.expire(clock.now() + std::chrono::seconds(60)) == 100);
  CHECK(store.expiry_entries() == 0);
}

TEST_CASE("demands that come and go leave no negative residue in the totals", "[core][bounds]") {
  // Ordinary wants (0.1 ... 40.1) whose running total used to end at about -7e-15 once the last
  // two clients wanted 0: an intermediate then sent a negative band and its parent refused it.
  for (unsigned seed = 0; seed < 2000; ++seed) {
    std::mt19937 rng(seed);
    doorman::share_index idx;
    std::vector<doorman::share_index::handle> hs;
    const int n = 2 + static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i)
      hs.push_back(idx.insert(0.1 + static_cast<double>(rng() % 41), 1));
    std::shuffle(hs.begin(), hs.end(), rng);
    for (int i = 2; i < n; ++i)
      idx.erase(hs[static_cast<std::size_t>(i)]);
    idx.update(hs[0], 0, 1);
    idx.update(hs[1], 0, 1);
    INFO("seed " << seed);
    REQUIRE(idx.totals().wants == 0);
    REQUIRE(idx.totals().subclients == 2);
  }
}

// ---- logs an operator can read --------------------------------------------------------------

TEST_CASE("after a restart, clients reporting unknown leases give a few summarized lines",
          "[core][log]") {
  std::vector<std::string> lines;
  doorman::engine_options o;
  o.log = [&](std::string_view l) { lines.emplace_back(l); };
  fixture f(repo_for("FAIR_SHARE", 1e6), o);
  auto report = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      const doorman::lease_info has{1, 30, 16};
      REQUIRE(
          f.engine.get_capacity({"c" + std::to_string(i), {{"res", 0, 1, has}}}, f.clock.now()));
    }
  };
  report(0, 1000);
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Contains("client c0 reports a lease of 1.0"));
  f.clock.advance(std::chrono::seconds(11));
  report(1000, 1001);
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[1], Contains("client c1000 reports"));
  CHECK_THAT(lines[1], Contains("(and 999 more like it since the last such line)"));
}

TEST_CASE("log_throttle passes one line per interval and counts the rest", "[core][log]") {
  manual_clock c;
  doorman::log_throttle<manual_clock::time_point> t(doorman::seconds(5));
  CHECK(t.pass("a", c.now()) == "a");
  CHECK(!t.pass("b", c.now()));
  c.advance(std::chrono::seconds(4));
  CHECK(!t.pass("c", c.now()));
  CHECK(t.held() == 2);
  c.advance(std::chrono::seconds(1));
  CHECK(t.pass("d", c.now()) == "d (and 2 more like it since the last such line)");
  CHECK(t.held() == 0);
}

TEST_CASE("election_term: renewals extend the term, a lost lease ends it", "[core][election]") {
  using namespace std::chrono_literals;
  using tp = manual_clock::time_point;
  doorman::election_term<tp> term(10s);
  const tp t0{};
  CHECK(term.margin() == 1s);
  CHECK(term.period() == 2s);
  CHECK_FALSE(term.valid(t0));  // no term before the first confirmation

  term.confirmed(t0);
  CHECK(term.valid_until() == t0 + 9s);  // the TTL less the margin, from when it was sent
  CHECK(term.valid(t0 + 8999ms));
  CHECK_FALSE(term.valid(t0 + 9s));

  // An answer that arrives late counts from when its renewal was sent, and never shortens.
  term.confirmed(t0 + 5s);
  CHECK(term.valid_until() == t0 + 14s);
  term.confirmed(t0 + 1s);
  CHECK(term.valid_until() == t0 + 14s);

  // A master's round never runs past the term; a non-master's takes a period.
  CHECK(term.round_deadline(t0 + 13s, true) == t0 + 14s);
  CHECK(term.round_deadline(t0 + 6s, true) == t0 + 8s);
  CHECK(term.round_deadline(t0 + 13s, false) == t0 + 15s);
  CHECK(term.round_deadline(t0 + 20s, true) == t0 + 22s);  // over already: nothing to protect
  CHECK(term.next_round(t0, true) == t0 + 2s);
  CHECK(term.next_round(t0, false) == t0 + 500ms);

  term.lost();
  CHECK_FALSE(term.valid(t0 + 6s));

  SECTION("short TTLs keep a margin of 100 ms and a period of 50 ms") {
    doorman::election_term<tp> shorter(200ms);
    CHECK(shorter.margin() == 100ms);
    CHECK(shorter.period() == 50ms);
  }
}

namespace {

using campaign_t = doorman::election_campaign<manual_clock::time_point>;
using campaign_kind = campaign_t::kind;

// A campaign of task "a:1" on key "/k" with a 10 s lease (a 2 s period, a 1 s margin).
campaign_t campaign_of_a(bool watch = true) {
  using namespace std::chrono_literals;
  return campaign_t(
      {.key = "/k", .advertise = "a:1", .watch = watch, .standby_poll = doorman::seconds(0.25)},
      10s);
}

// Drives `c` from its start to mastership at `t0` with lease 42: what it says on the way.
std::vector<std::string> win(campaign_t& c, manual_clock::time_point t0) {
  using namespace std::chrono_literals;
  auto a = c.start(t0);
  REQUIRE(a.what == campaign_kind::grant);
  a = c.granted(t0, 42, 10);
  REQUIRE(a.what == campaign_kind::claim);
  a = c.claimed(t0, 5, 42, "a:1");
  REQUIRE(a.what == campaign_kind::sleep);
  return c.take_log();
}

// A campaign of task "a:1", and the start of time.
struct campaign_fixture {
  using kind = campaign_kind;
  campaign_t c = campaign_of_a();
  const manual_clock::time_point t0{};
};

}  // namespace

TEST_CASE_METHOD(campaign_fixture,
                 "election campaign: resume maps each action's outcome to the event it makes",
                 "[core][election]") {
  // Two campaigns through the same path, one told each event, one handed the outcomes (as
  // etcd_election and the simulator hand them): the same actions, reports and term.
  using namespace std::chrono_literals;
  using outcome = campaign_t::outcome;
  campaign_t by_outcome = campaign_of_a();
  auto a = c.start(t0);
  CHECK(by_outcome.start(t0) == a);
  const auto both = [&](campaign_t::action expected, kind done, const outcome& o) {
    CHECK(by_outcome.resume(t0 + 1s, done, o) == expected);
    CHECK(by_outcome.take_reports() == c.take_reports());
    CHECK(by_outcome.valid_until() == c.valid_until());
  };
  both(c.granted(t0 + 1s, 42, 10), kind::grant, {.lease = 42, .ttl = 10});
  both(c.claimed(t0 + 1s, 5, 42, "a:1"), kind::claim,
       {.revision = 5, .holder = doorman::election_holder{42, "a:1"}});
  both(c.woke(t0 + 1s), kind::sleep, {});
  both(c.kept_alive(t0 + 1s, 0), kind::keep_alive, {.ttl = 0});  // expired: steps down
  both(c.granted(t0 + 1s, 43, 10), kind::grant, {.lease = 43, .ttl = 10});
  both(c.claim_lease_gone(t0 + 1s), kind::claim, {});  // no holder: our lease went
  both(c.woke(t0 + 1s), kind::sleep, {});
  both(c.failed(t0 + 1s, "refused"), kind::grant, {.error = "refused"});
  both(c.woke(t0 + 1s), kind::sleep, {});
  both(c.granted(t0 + 1s, 44, 10), kind::grant, {.lease = 44, .ttl = 10});
  both(c.claimed(t0 + 1s, 7, 9, "b:1"), kind::claim,
       {.revision = 7, .holder = doorman::election_holder{9, "b:1"}});
  both(c.watched(t0 + 1s, "no watch"), kind::watch, {.error = "no watch"});
  both(c.woke(t0 + 1s), kind::sleep, {});
  both(c.read_key(t0 + 1s, true, "b:1"), kind::read, {.value = "b:1"});
  CHECK(by_outcome.resume(t0 + 1s, kind::done, {}).what == kind::done);  // nothing follows
}

TEST_CASE("election campaign: a master's record tells the next winner whether a lease may be out",
          "[core][election]") {
  using namespace std::chrono_literals;
  using kind = campaign_kind;
  using doorman::election_holder;
  const manual_clock::time_point t0{};
  // Leases of up to 60 s under a 10 s election: the record outlives the term by them, and a
  // tenth more for the clocks' rates.
  CHECK(doorman::record_ttl_for(doorman::seconds(60), doorman::seconds(10)) == 78);
  CHECK(doorman::record_ttl_for(doorman::seconds(0), doorman::seconds(10)) == 0);
  CHECK(doorman::record_prefix("/k") == "/k/leases/");
  const auto with_record = [] {
    return campaign_t({.key = "/k", .advertise = "a:1", .record_ttl = 78}, 10s);
  };
  // The first round grants both leases, and the claim carries the record's.
  campaign_t c = with_record();
  auto a = c.start(t0);
  REQUIRE(a.what == kind::grant);
  CHECK(a.record_ttl == 78);
  a = c.resume(t0, kind::grant, {.lease = 42, .ttl = 10, .record_lease = 43, .record_ttl = 78});
  REQUIRE(a.what == kind::claim);
  CHECK(a.lease == 42);
  CHECK(a.record_lease == 43);
  CHECK(c.leases_may_be_out());  // not master yet: nothing known
  // It creates the key where no record was alive: no lease of an earlier master can be out.
  a = c.resume(t0, kind::claim,
               {.revision = 5, .holder = election_holder{42, "a:1"}, .records = 0});
  CHECK(c.is_master());
  CHECK_FALSE(c.leases_may_be_out());
  // Each round renews the record lease with the election's.
  a = c.woke(t0 + 2s);
  REQUIRE(a.what == kind::keep_alive);
  CHECK(a.record_lease == 43);
  CHECK(a.record_ttl == 0);
  a = c.resume(t0 + 2s, kind::keep_alive, {.ttl = 10, .record_lease = 43, .record_ttl = 78});
  REQUIRE(a.what == kind::claim);
  CHECK(c.valid_until() == t0 + 2s + 9s);
  // From the first renewal on, its own grants may be out: were it fenced and elected again
  // without a new win, it would learn.
  CHECK(c.leases_may_be_out());
  // Another task holds the key now: ours is abandoned (it runs out after our grants), and a
  // new record lease comes with the next round.
  a = c.resume(t0 + 2s, kind::claim, {.revision = 9, .holder = election_holder{7, "b:1"}});
  CHECK_FALSE(c.is_master());
  CHECK(c.record_lease() == 0);
  REQUIRE(a.what == kind::watch);
  a = c.resume(t0 + 4s, kind::watch, {});  // the key changed: a round
  REQUIRE(a.what == kind::keep_alive);
  CHECK(a.record_lease == 0);
  CHECK(a.record_ttl == 78);
  a = c.resume(t0 + 4s, kind::keep_alive, {.ttl = 10, .record_lease = 44, .record_ttl = 78});
  REQUIRE(a.what == kind::claim);
  CHECK(a.record_lease == 44);
  // It wins again beside a record still alive (b's, or its own abandoned one): learning.
  a = c.resume(t0 + 4s, kind::claim,
               {.revision = 12, .holder = election_holder{42, "a:1"}, .records = 1});
  CHECK(c.is_master());
  CHECK(c.leases_may_be_out());
  // A record lease found gone while the election's lives: both are given up and granted anew.
  a = c.resume(t0 + 6s, kind::keep_alive, {.ttl = 10, .record_lease = 44, .record_ttl = 0});
  CHECK_FALSE(c.is_master());
  CHECK(c.lease() == 0);
  CHECK(c.record_lease() == 0);
  CHECK_THAT(c.take_log().back(), Contains("our record's lease has expired"));
  // A record lease granted shorter than asked cannot cover the leases: the round fails.
  a = c.start(t0 + 8s);
  REQUIRE(a.what == kind::grant);
  a = c.resume(t0 + 8s, kind::grant, {.lease = 50, .ttl = 10, .record_lease = 51, .record_ttl = 5});
  CHECK(a.what == kind::sleep);
  CHECK(c.record_lease() == 0);
  CHECK_THAT(c.take_log().back(), Contains("a record lease of 5 s granted for 78 s"));
  // Won by a claim that did not create the key (an earlier one of ours did, its answer lost):
  // the count is unknown, so an earlier lease may be out.
  campaign_t d = with_record();
  (void)d.start(t0);
  (void)d.resume(t0, kind::grant, {.lease = 42, .ttl = 10, .record_lease = 43, .record_ttl = 78});
  (void)d.resume(t0, kind::claim, {.revision = 5, .holder = election_holder{42, "a:1"}});
  CHECK(d.is_master());
  CHECK(d.leases_may_be_out());
  // Without a record, every win may have leases out, and no record lease is asked for.
  campaign_t e = campaign_of_a();
  a = e.start(t0);
  CHECK(a.record_ttl == 0);
  (void)e.resume(t0, kind::grant, {.lease = 42, .ttl = 10});
  (void)e.resume(t0, kind::claim, {.revision = 5, .holder = election_holder{42, "a:1"}});
  CHECK(e.is_master());
  CHECK(e.leases_may_be_out());
}

TEST_CASE_METHOD(campaign_fixture,
                 "election campaign: a task wins, renews every period, and reports only changes",
                 "[core][election]") {
  using namespace std::chrono_literals;
  auto a = c.start(t0);
  CHECK(a == campaign_t::action{kind::grant, t0 + 2s, 0, 0});  // a round takes a period at most
  a = c.granted(t0 + 10ms, 42, 10);
  CHECK(a == campaign_t::action{kind::claim, t0 + 2010ms, 42, 0});
  a = c.claimed(t0 + 20ms, 5, 42, "a:1");
  // Won: the term runs from when the round was sent, the TTL less the margin.
  CHECK(c.valid_until() == t0 + 9s);
  CHECK(c.take_reports() == std::vector<doorman::mastership_change>{{true, "a:1"}});
  CHECK(c.take_log() == std::vector<std::string>{"etcd: won the election on /k"});
  CHECK(a == campaign_t::action{kind::sleep, t0 + 2020ms, 0, 0});

  // The next round renews; a master's round never runs past its term.
  a = c.woke(t0 + 8500ms);
  CHECK(a == campaign_t::action{kind::keep_alive, t0 + 9s, 42, 0});
  a = c.kept_alive(t0 + 8600ms, 9);
  CHECK(c.valid_until() == t0 + 17500ms);  // confirmed as sent at 8.5 s
  CHECK(a.what == kind::claim);
  a = c.claimed(t0 + 8700ms, 5, 42, "a:1");
  CHECK(c.take_reports().empty());  // no change, nothing said
  CHECK(c.take_log().empty());
  CHECK(a == campaign_t::action{kind::sleep, t0 + 10700ms, 0, 0});
}

TEST_CASE_METHOD(campaign_fixture,
                 "election campaign: a standby redirects, watches, polls when watching fails, and "
                 "campaigns when the key is freed",
                 "[core][election]") {
  using namespace std::chrono_literals;
  (void)c.start(t0);
  (void)c.granted(t0, 42, 10);
  auto a = c.claimed(t0, 7, 9, "b:1");  // another task's lease holds the key
  CHECK(c.take_reports() == std::vector<doorman::mastership_change>{{false, "b:1"}});
  CHECK(c.take_log() == std::vector<std::string>{"etcd: b:1 holds /k"});
  CHECK_FALSE(c.valid_until() > t0);
  CHECK(a == campaign_t::action{kind::watch, t0 + 2s, 0, 8});  // changes after the claim's

  // The watch ends (a change, or the round is due): a round.
  a = c.watched(t0 + 1s, std::nullopt);
  CHECK(a == campaign_t::action{kind::keep_alive, t0 + 3s, 42, 0});
  (void)c.kept_alive(t0 + 1s, 10);
  a = c.claimed(t0 + 1s, 8, 9, "b:1");
  CHECK(c.take_reports().empty());
  CHECK(a.what == kind::watch);

  // A watch that fails: said once; the key is read every standby_poll instead.
  a = c.watched(t0 + 1100ms, std::string("watch refused"));
  CHECK(c.take_log() ==
        std::vector<std::string>{"warning: etcd: cannot watch /k (watch refused); reading it every "
                                 "0.25 s instead"});
  CHECK(a == campaign_t::action{kind::sleep, t0 + 1350ms, 0, 0});
  a = c.woke(t0 + 1350ms);
  CHECK(a == campaign_t::action{kind::read, t0 + 1600ms, 0, 0});
  a = c.read_key(t0 + 1360ms, true, std::string("b:1"));  // the same master: look again
  CHECK(a == campaign_t::action{kind::sleep, t0 + 1610ms, 0, 0});
  a = c.read_key(t0 + 1360ms, false, std::nullopt);  // a failed read: look again
  CHECK(a.what == kind::sleep);
  a = c.woke(t0 + 1610ms);
  a = c.read_key(t0 + 1620ms, true, std::nullopt);  // free: campaign at once
  CHECK(a == campaign_t::action{kind::keep_alive, t0 + 3620ms, 42, 0});
  (void)c.kept_alive(t0 + 1630ms, 10);
  a = c.claimed(t0 + 1640ms, 9, 42, "a:1");
  CHECK(c.take_reports() == std::vector<doorman::mastership_change>{{true, "a:1"}});
  CHECK(c.valid_until() == t0 + 10620ms);
  CHECK(a.what == kind::sleep);

  // Polling reaches the round's time: a round, not a read.
  auto d = campaign_of_a(false);
  (void)d.start(t0);
  (void)d.granted(t0, 43, 10);
  a = d.claimed(t0, 7, 9, "b:1");
  CHECK(a == campaign_t::action{kind::sleep, t0 + 250ms, 0, 0});  // no watch: polls
  for (int i = 1; i < 8; ++i) {
    a = d.woke(t0 + i * 250ms);
    REQUIRE(a.what == kind::read);
    a = d.read_key(t0 + i * 250ms, true, std::string("b:1"));
  }
  CHECK(a == campaign_t::action{kind::sleep, t0 + 2s, 0, 0});
  CHECK(d.woke(t0 + 2s).what == kind::keep_alive);
}

TEST_CASE_METHOD(campaign_fixture,
                 "election campaign: a master rides out an etcd outage within its term, then steps "
                 "down, and a lease that expired is replaced",
                 "[core][election]") {
  using namespace std::chrono_literals;
  (void)win(c, t0);
  (void)c.take_reports();
  auto a = c.woke(t0 + 2s);
  a = c.failed(t0 + 2500ms, "no etcd member answered");
  CHECK(c.take_log() == std::vector<std::string>{
                            "warning: etcd: renewal failed (no etcd member answered); retrying, "
                            "the term is safe for 6500 ms"});
  CHECK(a == campaign_t::action{kind::sleep, t0 + 3s, 0, 0});  // a quarter period
  a = c.woke(t0 + 3s);
  CHECK(a.until == t0 + 5s);
  (void)c.failed(t0 + 5s, "no etcd member answered");
  CHECK(c.take_log().empty());  // said once
  CHECK(c.take_reports().empty());
  (void)c.woke(t0 + 8s);
  a = c.failed(t0 + 9s, "no etcd member answered");  // the term is over: step down
  CHECK(c.take_reports() == std::vector<doorman::mastership_change>{{false, std::nullopt}});
  CHECK(c.take_log() == std::vector<std::string>{
                            "warning: etcd: mastership could not be confirmed before the lease is "
                            "at risk; stepping down"});
  CHECK_FALSE(c.is_master());

  // Back: said, and the lease is found expired; a new one is asked for at the next round.
  a = c.woke(t0 + 9500ms);
  CHECK(a.what == kind::keep_alive);
  a = c.kept_alive(t0 + 9600ms, 0);
  CHECK(c.take_log() == std::vector<std::string>{
                            "warning: etcd: our lease has expired; campaigning with a new one"});
  CHECK(c.lease() == 0);
  CHECK(a.what == kind::watch);
  a = c.watched(t0 + 9700ms, std::nullopt);
  CHECK(a.what == kind::grant);
  a = c.granted(t0 + 9700ms, 50, 10);
  a = c.claimed(t0 + 9800ms, 12, 50, "a:1");
  CHECK(c.take_log() ==
        std::vector<std::string>{"etcd: reachable again", "etcd: won the election on /k"});
  CHECK(c.take_reports() == std::vector<doorman::mastership_change>{{true, "a:1"}});

  // The lease expired between the renewal and the claim: not master, a new lease next.
  a = c.woke(t0 + 11800ms);
  (void)c.kept_alive(t0 + 11800ms, 10);
  a = c.claim_lease_gone(t0 + 11900ms);
  CHECK(c.take_reports() == std::vector<doorman::mastership_change>{{false, std::nullopt}});
  CHECK_FALSE(c.valid_until() > t0 + 11900ms);
  CHECK(c.lease() == 0);
}

TEST_CASE_METHOD(campaign_fixture,
                 "election campaign: a stop revokes the lease, and without one ends at once",
                 "[core][election]") {
  using namespace std::chrono_literals;
  (void)win(c, t0);
  auto a = c.stop(t0 + 1s);
  CHECK(a == campaign_t::action{kind::revoke, t0 + 2s, 42, 0});
  CHECK_FALSE(c.valid_until() > t0);  // no decision as master from the stop on
  a = c.revoked(t0 + 1100ms, std::nullopt);
  CHECK(a.what == kind::done);
  CHECK(c.take_log() ==
        std::vector<std::string>{"etcd: lease revoked; another task can take over at once"});
  CHECK(c.start(t0 + 2s).what == kind::done);  // over for good

  auto d = campaign_of_a();
  (void)d.start(t0);
  CHECK(d.stop(t0).what == kind::done);  // no lease yet: nothing to revoke

  auto e = campaign_of_a();
  (void)win(e, t0);
  (void)e.stop(t0);
  (void)e.revoked(t0, std::string("timed out"));
  CHECK(e.take_log().back() ==
        "etcd: could not revoke the lease (timed out); it expires by itself");
}

TEST_CASE("fencing: a master past its term steps down before it decides anything",
          "[core][engine][election]") {
  using namespace std::chrono_literals;
  manual_clock clock;
  engine_t e(repo_for("FAIR_SHARE", 100, 60));
  e.set_mastership(true, "10.0.0.7:7700", clock.now());
  e.set_valid_until(clock.now() + 2s);
  // Learning mode: the client has what it says (nothing).
  auto first = e.get_capacity({"a", {{"res", 0, 10, std::nullopt}}}, clock.now());
  REQUIRE(first);
  REQUIRE(first.value().resources.size() == 1);
  CHECK(first.value().mastership.is_master);

  // The process was paused past its term: what queued up is answered as a non-master that
  // knows no master, whatever the method, and every lease is forgotten.
  clock.advance(2s);
  SECTION("get_capacity") {
    auto r = e.get_capacity({"a", {{"res", 0, 10, std::nullopt}}}, clock.now());
    REQUIRE(r);
    CHECK(r.value().resources.empty());
    CHECK(r.value().mastership == doorman::mastership_info{false, std::nullopt});
  }
  SECTION("get_server_capacity") {
    auto r = e.get_server_capacity({"leaf", {{"res", std::nullopt, 0, {{0, 2, 10}}}}}, clock.now());
    REQUIRE(r);
    CHECK(r.value().resources.empty());
    CHECK_FALSE(r.value().mastership.is_master);
  }
  SECTION("discovery and status") {
    CHECK_FALSE(e.discovery(clock.now()).mastership.is_master);
    CHECK_FALSE(e.status({}, clock.now()).value().mastership.is_master);
  }
  SECTION("a parent's lease is not taken") {
    CHECK_FALSE(e.set_parent_lease("res", {10, clock.now() + 10s, 1s}, clock.now()));
  }
  CHECK(e.store("res") == nullptr);
  CHECK(e.fenced() == 1);
  CHECK_FALSE(e.fence(clock.now()));  // once

  // A new term (a renewal confirmed while the election still names it) is a new mastership.
  e.set_valid_until(clock.now() + 9s);
  e.set_mastership(true, "10.0.0.7:7700", clock.now());
  CHECK(e.learning("res", clock.now()));
  auto again = e.get_capacity({"a", {{"res", 0, 10, std::nullopt}}}, clock.now());
  REQUIRE(again);
  CHECK(again.value().mastership.is_master);
}

TEST_CASE("a lease cut while its answer is lost still counts until the client confirms the cut",
          "[core][engine][invariant]") {
  // Found by the fault campaign (sim seed 3): a client's lease was cut from 26.8 to 18.2, the
  // answer was lost, and the 8.6 went to another client while the first still held 26.8 for
  // 4 more seconds. A lease cannot be revoked: until the client says it has the smaller one
  // (or the larger one has expired), the larger one is what it holds.
  using namespace std::chrono_literals;
  doorman::engine_options opts;
  opts.minimum_refresh_interval = doorman::seconds{0};
  fixture f(repo_for("FAIR_SHARE", 100), opts);
  auto ask = [&](const std::string& id, double wants, std::optional<double> has) {
    std::optional<doorman::lease_info> h;
    if (has) h = doorman::lease_info{*has, 50, 16};
    auto r = f.engine.get_capacity({id, {{"res", 0, wants, h}}}, f.clock.now());
    REQUIRE(r);
    return r.value().resources.at(0).gets.capacity;
  };
  REQUIRE(ask("a", 100, std::nullopt) == Approx(100));
  CHECK(ask("b", 100, std::nullopt) == Approx(0));  // a holds it all
  f.clock.advance(1s);
  CHECK(ask("a", 100, 100) == Approx(50));  // cut to its share; the answer is lost
  f.clock.advance(1s);
  CHECK(ask("b", 100, 0) == Approx(0));     // a may still hold 100
  CHECK(ask("a", 100, 100) == Approx(50));  // a says it still has 100: the cut again
  CHECK(ask("b", 100, 0) == Approx(0));
  f.clock.advance(1s);
  CHECK(ask("a", 100, 50) == Approx(50));  // a has the cut lease now
  CHECK(ask("b", 100, 0) == Approx(50));   // so b gets the rest
  SECTION("a client that never confirms holds the larger lease until it expires") {
    CHECK(ask("c", 100, std::nullopt) == Approx(0));
    f.clock.advance(1s);
    const double b_cut = ask("b", 100, 50);  // b's share shrinks; its answer is lost
    CHECK(b_cut < 50);
    CHECK(ask("c", 100, 0) + 50 + 50 <= 100 + 1e-9);  // a has 50, b may still hold 50
    f.clock.advance(60s);  // b's old lease (60 s) has ended; its new one ended a little later
    CHECK(ask("c", 100, 0) > 0);
  }
}
