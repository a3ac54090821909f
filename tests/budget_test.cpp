// Budgets at the root: windows of UTC time, their configuration, the root's count of what was
// spent, and the tree's one promise for them: what the clients spend in a window never exceeds
// its budget, whatever answers are lost and whoever dies or restarts.

#include <atomic>
#include <future>
#include <numeric>
#include <stop_token>
#include <thread>

#include <doorman/limit/budget_counter.hpp>

#include "core_support.hpp"
#include "fuzz/limit_properties.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (core_support.hpp)

namespace {

// 2025-11-29 00:00:00 UTC, a Saturday.
constexpr std::int64_t day_start = 1764374400;

doorman::resource_repository budget_repo(const std::string& window, double units,
                                         const std::string& kind = "FAIR_SHARE", int learning = 0) {
  return doorman::resource_repository::parse(R"({"resources": [
    {"identifier_glob": "tokens", "capacity": )" +
                                             std::to_string(units) + R"(,
     "budget": {"window": )" + window + R"(},
     "algorithm": {"kind": ")" + kind + R"(", "lease_length": 60, "refresh_interval": 16,
                   "learning_mode_duration": )" +
                                             std::to_string(learning) + R"(}},
    {"identifier_glob": "*", "capacity": 0,
     "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60, "refresh_interval": 16}}]})");
}

// An engine whose clock's zero is `utc` (Unix seconds).
doorman::engine_options at_utc(double utc) {
  doorman::engine_options o;
  o.utc_offset = utc;
  return o;
}

// An engine whose clock's zero is `utc`, keeping budget marks `step` of a limit apart.
doorman::engine_options marking(double utc, double step) {
  doorman::engine_options o = at_utc(utc);
  o.budget_mark_step = step;
  return o;
}

struct budget_fixture : fixture {
  explicit budget_fixture(const std::string& window = R"("day")", double units = 1000,
                          double start = day_start + 3600.0, int learning = 0, double mark_step = 0)
      : fixture(budget_repo(window, units, "FAIR_SHARE", learning), marking(start, mark_step)) {}

  doorman::resource_grant ask_budget(const std::string& client, double wants,
                                     std::optional<doorman::lease_info> has = std::nullopt,
                                     std::optional<double> spent = std::nullopt) {
    doorman::resource_request x{"tokens", 0, wants, has};
    if (spent) x.spend = doorman::budget_spend{window(), *spent};
    auto r = engine.get_capacity({client, {x}}, clock.now());
    REQUIRE(r);
    REQUIRE(r.value().resources.size() == 1);
    return r.value().resources[0];
  }

  std::int64_t window() {
    const auto s = engine.status({"tokens"}, clock.now());
    return s.value().resources[0].budget ? s.value().resources[0].budget->window : 0;
  }

  doorman::budget_info budget() {
    auto s = engine.status({"tokens"}, clock.now());
    REQUIRE(s);
    REQUIRE(s.value().resources[0].budget);
    return *s.value().resources[0].budget;
  }
};

doorman::lease_info holding(double capacity) {
  return {capacity, 30, 16};
}

// A client holding an allotment, asking again with what it holds and has spent (a client
// asking without them would count its allotment as spent).
struct budget_client {
  std::string id;
  double held = 0;
  double spent = 0;

  template <class Fixture>
  double ask(Fixture& f, double wants) {
    held = f.ask_budget(id, wants, held > 0 ? std::optional(holding(held)) : std::nullopt, spent)
               .gets.capacity;
    return held;
  }
};

// Six clients that obey their allotments, one acting each second: spending at random, asking
// again (with probability `refresh`) and spending in the answer's flight, losing one answer
// in ten, dying now and then after spending all they held (unheard: a new process takes the
// id). `real` is what every process spent.
struct spending_clients {
  struct client {
    double remaining = 0;  // of its allotment, as it knows it
    double spent = 0;      // this process, in the window
    bool has = false;
    manual_clock::time_point expiry{};
  };
  std::vector<client> cs = std::vector<client>(6);
  double real = 0;
  std::uniform_real_distribution<double> u{0, 1};

  template <class Fixture>
  void step(Fixture& f, std::mt19937& rng, double refresh) {
    f.clock.advance(std::chrono::milliseconds(1000));
    const std::size_t i = rng() % cs.size();
    auto& c = cs[i];
    if (c.has && f.clock.now() >= c.expiry) c = {0, c.spent, false, {}};
    const auto spend = [&](double x) {
      x = std::min(x, c.remaining);
      c.remaining -= x;
      c.spent += x;
      real += x;
    };
    if (u(rng) < 0.6) spend(u(rng) * 400);
    if (u(rng) < refresh) {
      const auto expires_in = std::chrono::duration<double>(c.expiry - f.clock.now()).count();
      doorman::resource_request x{"tokens", 0, 300 + u(rng) * 600, std::nullopt};
      if (c.has) x.has = doorman::lease_info{c.remaining, expires_in, 16};
      x.spend = doorman::budget_spend{f.window() ? f.window() : day_start, c.spent};
      auto r = f.engine.get_capacity({"c" + std::to_string(i), {x}}, f.clock.now());
      REQUIRE(r);
      const auto& g = r.value().resources[0];
      if (u(rng) < 0.3) spend(u(rng) * 400);  // in the answer's flight, on the old allotment
      const double flight = c.spent - x.spend->spent;
      if (u(rng) < 0.9) {  // heard
        c.remaining = std::max(0.0, g.gets.capacity - flight);
        c.expiry = f.clock.now() + std::chrono::duration_cast<manual_clock::duration>(
                                       std::chrono::duration<double>(g.gets.expires_in));
        c.has = g.gets.expires_in > 0;
      }
    }
    if (u(rng) < 0.01) {  // dies after spending all it had; a new process takes its id
      spend(c.remaining);
      c = {};
    }
  }
};

// What etcd holds of budget marks: per resource, the window and the mark.
struct mark_store {
  std::map<std::string, std::pair<std::int64_t, double>, std::less<>> marks;

  // Performs the engine's mark tasks (reads and raises) until none is due.
  template <class Engine>
  void serve(Engine& engine, manual_clock::time_point now) {
    while (engine.budget_marks_due()) {
      for (const auto& t : engine.budget_mark_tasks(now))
        answer(engine, t, false, now);
    }
  }

  template <class Engine, class Task>
  void answer(Engine& engine, const Task& t, bool fail, manual_clock::time_point now) {
    if (fail) return engine.budget_mark_done(t, std::nullopt, now);
    auto& m = marks[t.resource_id];
    if (t.raise) {
      m = {t.window, *t.raise};
      return engine.budget_mark_done(t, *t.raise, now);
    }
    engine.budget_mark_done(t, m.first == t.window ? m.second : 0.0, now);
  }
};

}  // namespace

TEST_CASE("budget windows are UTC minutes, hours, days, months or fixed lengths",
          "[core][budget]") {
  using doorman::budget_period;
  const double noon = day_start + 12 * 3600 + 61.5;
  CHECK(doorman::window_at({budget_period::minute}, noon).start == day_start + 12 * 3600 + 60);
  CHECK(doorman::window_at({budget_period::hour}, noon).end == day_start + 13 * 3600);
  CHECK(doorman::window_at({budget_period::day}, noon) ==
        doorman::budget_window{day_start, day_start + 86400});
  // November has 30 days; February 2028 29.
  const auto nov = doorman::window_at({budget_period::month}, noon);
  CHECK(nov.start == day_start - 28 * 86400);
  CHECK(nov.end - nov.start == 30 * 86400);
  const auto feb = doorman::window_at({budget_period::month}, 1835481600.0 + 5);  // 2028-03-01
  CHECK(feb.start == 1835481600);
  const auto leap = doorman::window_at({budget_period::month}, 1835481600.0 - 1);
  CHECK(leap.end - leap.start == 29 * 86400);
  CHECK(doorman::window_at({budget_period::fixed, 600}, noon).start == day_start + 12 * 3600);
  CHECK(doorman::window_at({budget_period::fixed, 7}, 13.0) == doorman::budget_window{7, 14});
}

TEST_CASE("a budget's configuration names its window, and a bad one is refused naming it",
          "[core][budget][config]") {
  const auto repo = budget_repo(R"("month")", 5e6);
  REQUIRE(repo.find("tokens").budget);
  CHECK(repo.find("tokens").budget->period == doorman::budget_period::month);
  CHECK_FALSE(repo.find("other").budget);
  CHECK(doorman::resource_repository::from_json(repo.to_json()) == repo);
  CHECK(budget_repo("3600", 10).find("tokens").budget->fixed_seconds == 3600);
  CHECK(doorman::resource_repository::from_json(budget_repo("90", 1).to_json()) ==
        budget_repo("90", 1));

  const auto refused = [](const std::string& window, const std::string& kind = "FAIR_SHARE") {
    try {
      (void)budget_repo(window, 100, kind);
    } catch (const doorman::config_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refused(R"("week")") ==
        "resources[0].budget.window: must be minute, hour, day, month or a number of seconds");
  CHECK(refused("[1]") ==
        "resources[0].budget.window: must be minute, hour, day, month or a number of seconds");
  CHECK(refused("0") == "resources[0].budget.window: must be between 1 and 31622400 seconds");
  CHECK(refused("1.5") == "resources[0].budget.window: must be an integer");
  CHECK(refused(R"("day", "units": 3)") == "resources[0].budget.units: unknown field");
  CHECK_THAT(refused(R"("day")", "NO_ALGORITHM"), Contains("must not be NO_ALGORITHM"));
}

TEST_CASE("a budget's allotments share what the window has left, and spend comes off it",
          "[core][budget][engine]") {
  budget_fixture f;
  auto a = f.ask_budget("a", 600);
  CHECK(a.gets.capacity == 600);
  REQUIRE(a.budget);
  CHECK(a.budget->window == day_start);
  CHECK(a.budget->limit == 1000);
  CHECK(a.budget->reset == Approx(86400 - 3600));
  CHECK(a.safe_capacity == 0);  // nothing is spent without an allotment
  auto b = f.ask_budget("b", 600);
  CHECK(b.gets.capacity == 400);  // what a's allotment leaves
  CHECK(b.budget->left == 0);

  // a spends 500 and says so: 100 left of its allotment, 500 gone from the budget.
  f.clock.advance(16s);
  a = f.ask_budget("a", 100, holding(100), 500);
  CHECK(a.gets.capacity == Approx(100));
  CHECK(f.budget().spent == 500);
  // The same report again (a retry) counts once.
  f.clock.advance(16s);
  a = f.ask_budget("a", 100, holding(100), 500);
  CHECK(f.budget().spent == 500);
  // b spends its 400: the budget is all spent or allotted.
  b = f.ask_budget("b", 600, holding(0), 400);
  CHECK(f.budget().spent == 900);
  CHECK(b.gets.capacity == Approx(0));
  CHECK(f.budget().left == Approx(0));

  SECTION("a lease that ends unreported counts as spent") {
    f.clock.advance(61s);  // both leases end: a's 100 may have been spent
    f.engine.expire(f.clock.now());
    CHECK(f.budget().spent == Approx(1000));
    CHECK(f.ask_budget("c", 10).gets.capacity == 0);
  }
  SECTION("a release with a last report frees the rest of the allotment") {
    auto r =
        f.engine.release_capacity({"a", {"tokens"}, {{"tokens", day_start, 520}}}, f.clock.now());
    REQUIRE(r);
    CHECK(f.budget().spent == Approx(920));
    CHECK(f.budget().left == Approx(80));
    CHECK(f.ask_budget("c", 500).gets.capacity == Approx(40));  // b wants its share of it too
  }
  SECTION("a release without one counts the allotment as spent") {
    REQUIRE(f.engine.release_capacity({"a", {"tokens"}}, f.clock.now()));
    CHECK(f.budget().spent == Approx(1000));
  }
  SECTION("a client that comes back holding nothing may have spent all it held") {
    a = f.ask_budget("a", 50, std::nullopt, 0);  // a new process under a's id
    CHECK(f.budget().spent == Approx(1000));
    // Its count starts again from 0: what it spends from now on counts in full.
    CHECK(a.gets.capacity == 0);
  }
  SECTION("the next window starts with the whole budget") {
    f.clock.advance(std::chrono::seconds(86400 - 3600 - 32));
    f.engine.expire(f.clock.now());
    CHECK(f.budget().window == day_start + 86400);
    CHECK(f.budget().spent == 0);
    CHECK(f.ask_budget("a", 2000).gets.capacity == 1000);
    // A report of the window before counts nothing in this one.
    f.clock.advance(16s);
    doorman::resource_request x{"tokens", 0, 100, holding(1000)};
    x.spend = doorman::budget_spend{day_start, 700};
    REQUIRE(f.engine.get_capacity({"a", {x}}, f.clock.now()));
    CHECK(f.budget().spent == 0);
  }
}

TEST_CASE("a new process under a client's id counts from 0, however much it reports",
          "[core][budget][engine]") {
  budget_fixture f;
  CHECK(f.ask_budget("a", 400).gets.capacity == 400);
  f.clock.advance(16s);
  CHECK(f.ask_budget("a", 400, holding(300), 100).gets.capacity == Approx(400));
  // a dies; a new process takes its id: its first request knows no window, so reports nothing.
  f.clock.advance(1s);
  CHECK(f.ask_budget("b", 0).gets.capacity == 0);
  CHECK(f.ask_budget("a", 400).gets.capacity == Approx(400));
  CHECK(f.budget().spent == Approx(500));  // 100 reported, 400 held when it died
  // It spends 300, more than its predecessor's last report: all of it counts.
  f.clock.advance(16s);
  f.ask_budget("a", 400, holding(100), 300);
  CHECK(f.budget().spent == Approx(800));
}

TEST_CASE("a budget's allotments end with its window, and their holders come back then",
          "[core][budget][engine]") {
  budget_fixture f(R"("minute")", 100, day_start + 50.0);
  const auto a = f.ask_budget("a", 10);
  CHECK(a.gets.expires_in == Approx(10));
  CHECK(a.gets.refresh_interval == Approx(10));
  CHECK(a.budget->reset == Approx(10));
}

TEST_CASE("a hostile budget report is refused naming its field, changing nothing",
          "[core][budget][engine]") {
  budget_fixture f;
  const auto bad = [&](doorman::budget_spend s) {
    doorman::resource_request x{"tokens", 0, 10, std::nullopt};
    x.spend = s;
    auto r = f.engine.get_capacity({"a", {x}}, f.clock.now());
    REQUIRE_FALSE(r);
    return r.error().message;
  };
  CHECK(bad({day_start, -1}) ==
        "resources[0].spend.spent: must be a finite number between 0 and 1e15");
  CHECK(bad({day_start, std::nan("")}) ==
        "resources[0].spend.spent: must be a finite number between 0 and 1e15");
  CHECK(bad({-5, 1}) == "resources[0].spend.window: must be an integer between 0 and 1e11");
  CHECK(f.engine.store("tokens") == nullptr);

  const auto release = [&](doorman::release_request r) {
    auto out = f.engine.release_capacity(r, f.clock.now());
    return out ? std::string("accepted") : out.error().message;
  };
  CHECK(release({"a", {"tokens"}, {{"other", day_start, 1}}}) ==
        "spends[0].resource_id: must be one of resources");
  CHECK(release({"a", {"tokens"}, {{"tokens", day_start, 1}, {"tokens", day_start, 2}}}) ==
        "spends[1].resource_id: duplicates spends[0].resource_id");
  CHECK(release({"a", {"tokens"}, {{"tokens", day_start, 1e16}}}) ==
        "spends[0].spent: must be a finite number between 0 and 1e15");
}

TEST_CASE("what clients spend in a window never exceeds its budget, whatever is lost",
          "[core][budget][engine]") {
  // Clients that obey their allotments spend at random, their answers are lost at random
  // (the root decided; the client never heard), some spend in the flight of a request, some
  // die with an allotment (after spending all of it) and come back as new processes.
  const std::uint32_t seed = GENERATE(1u, 2u, 3u, 4u, 5u);
  std::mt19937 rng(seed);
  INFO("seed " << seed);
  budget_fixture f(R"("hour")", 10'000, day_start + 0.0);
  spending_clients fleet;
  for (int step = 0; step < 3000; ++step) {
    fleet.step(f, rng, 0.3);
    if (f.engine.store("tokens") != nullptr) {
      const auto b = f.budget();
      if (b.window != day_start) break;  // the hour is over
      REQUIRE(fleet.real <= 10'000 + 1e-6);
    }
  }
  CHECK(fleet.real <= 10'000 + 1e-6);
  CHECK(fleet.real >= 5'000);  // most of it is spent: demand exceeds it
}

TEST_CASE("a budget over JSON-RPC lines: the hot path and the DOM path answer alike",
          "[core][budget][protocol]") {
  budget_fixture hot;
  budget_fixture dom;
  const doorman::node_identity identity{"127.0.0.1:7700", "root", 0, std::nullopt};
  const auto both = [&](const std::string& line) {
    std::string a;
    std::string b;
    doorman::handle_line_to(a, hot.engine, line, hot.clock.now(), identity);
    doorman::detail::dispatch(b, dom.engine, line, dom.clock.now(), identity, nullptr, nullptr,
                              false);
    CHECK(a == b);
    return nlohmann::json::parse(a);
  };
  const auto ask = [](const std::string& resource) {
    return R"({"jsonrpc":"2.0","id":1,"method":"get_capacity","params":{"client_id":"a",
      "resources":[)" +
           resource + "]}}";
  };
  auto j = both(ask(R"({"resource_id":"tokens","wants":300})"));
  CHECK(j["result"]["resources"][0]["gets"]["capacity"] == 300);
  CHECK(j["result"]["resources"][0]["budget"]["window"] == day_start);
  CHECK(j["result"]["resources"][0]["budget"]["left"] == 700);
  hot.clock.advance(16s);
  dom.clock.advance(16s);
  j = both(ask(R"({"resource_id":"tokens","wants":300,
      "has":{"capacity":180,"expires_in":44,"refresh_interval":16},
      "spend":{"window":1764374400,"spent":120}})"));
  CHECK(j["result"]["resources"][0]["budget"]["spent"] == 120);
  j = both(ask(R"({"resource_id":"tokens","wants":300,"spend":{"window":1764374400}})"));
  CHECK(j["error"]["message"] == "params.resources[0].spend.spent: is required");
  j = both(ask(R"({"resource_id":"tokens","wants":300,"spend":{"window":1.5,"spent":1}})"));
  CHECK(j["error"]["message"] == "params.resources[0].spend.window: must be an integer");
  j = both(ask(R"({"resource_id":"tokens","wants":300,"spend":{"window":-5,"spent":1}})"));
  CHECK(j["error"]["message"] == "params.resources[0].spend.window: must be between 0 and 1e11");
  j = both(ask(R"({"resource_id":"tokens","wants":300,"spend":{"window":5,"spent":-1}})"));
  CHECK(j["error"]["message"] == "params.resources[0].spend.spent: must be between 0 and 1e15");
  j = both(R"({"jsonrpc":"2.0","id":1,"method":"release_capacity","params":{"client_id":"a",
      "resources":["tokens"],"spends":[{"resource_id":"tokens","window":1764374400,
      "spent":150}]}})");
  CHECK(j.contains("result"));
  CHECK(hot.budget().spent == 150);
  CHECK(hot.budget().left == 850);
  CHECK(dom.budget().spent == 150);
}

namespace {

// A root counting a budget of `units` per hour and an intermediate between it and some of its
// clients; their clocks' zero is `start` (UTC).
struct budget_tree {
  manual_clock clock;
  engine_t root;
  engine_t mid;
  upstream_t mid_up{{.server_id = "mid"}};

  explicit budget_tree(double units, double start = day_start + 0.0)
      : root(budget_repo(R"("hour")", units), at_utc(start)), mid(small_tree::placeholder(), [&] {
          auto o = at_utc(start);
          o.is_root = false;
          return o;
        }()) {
    root.set_mastership(true, "root", clock.now());
    mid.set_mastership(true, "mid", clock.now());
  }

  // One exchange between the intermediate and the root.
  void refresh() {
    const auto req = mid_up.make_request(mid, clock.now());
    auto resp = root.get_server_capacity(req, clock.now());
    REQUIRE(resp);
    mid_up.on_reply(mid, resp.value(), clock.now());
  }

  static doorman::budget_info budget_at(engine_t& e, manual_clock& c) {
    auto s = e.status({"tokens"}, c.now());
    REQUIRE(s);
    REQUIRE(s.value().resources[0].budget);
    return *s.value().resources[0].budget;
  }
};

// One client of a budget as the client libraries keep it: what it has left of its allotment,
// what its process spent in the window, the window its server last named.
struct budget_holder {
  double remaining = 0;
  double spent = 0;
  std::optional<std::int64_t> window;
  manual_clock::time_point expiry{};

  doorman::resource_request request(double wants, manual_clock::time_point now) const {
    doorman::resource_request x{"tokens", 0, wants, std::nullopt};
    if (expiry > now) {
      x.has =
          doorman::lease_info{remaining, std::chrono::duration<double>(expiry - now).count(), 16};
    }
    if (window) x.spend = doorman::budget_spend{*window, spent};
    return x;
  }

  // Adopts a grant answering a request that reported `reported` (spent since: off it).
  void adopt(const doorman::resource_grant& g, double reported, manual_clock::time_point sent) {
    remaining = std::max(0.0, g.gets.capacity - (spent - reported));
    expiry = sent + std::chrono::duration_cast<manual_clock::duration>(
                        std::chrono::duration<double>(g.gets.expires_in));
    if (g.budget) window = g.budget->window;
  }
};

}  // namespace

TEST_CASE("an intermediate passes a budget's allotments down and its clients' spend up",
          "[core][budget][upstream]") {
  budget_tree t(1000);
  // Before its parent's first answer, the intermediate has nothing to hand out.
  auto ask = [&](engine_t& e, const std::string& id, const budget_holder& h, double wants) {
    auto r = e.get_capacity({id, {h.request(wants, t.clock.now())}}, t.clock.now());
    REQUIRE(r);
    return r.value().resources[0];
  };
  budget_holder a;
  auto g = ask(t.mid, "a", a, 300);
  CHECK(g.gets.capacity == 0);
  CHECK_FALSE(g.budget);
  const auto first = t.mid_up.make_request(t.mid, t.clock.now());
  CHECK_FALSE(first.resources[0].spend);  // not known as a budget yet
  auto resp = t.root.get_server_capacity(first, t.clock.now());
  REQUIRE(resp);
  REQUIRE(resp.value().resources[0].budget);
  CHECK(resp.value().resources[0].gets.capacity == 300);
  CHECK(resp.value().resources[0].safe_capacity == 0);
  t.mid_up.on_reply(t.mid, resp.value(), t.clock.now());

  // The intermediate passes the allotment down with the root's word on the window.
  g = ask(t.mid, "a", a, 300);
  CHECK(g.gets.capacity == 300);
  REQUIRE(g.budget);
  CHECK(g.budget->window == day_start);
  CHECK(g.budget->limit == 1000);
  CHECK(g.budget->reset == Approx(3600));
  CHECK(g.safe_capacity == 0);
  a.adopt(g, 0, t.clock.now());

  // a spends 120 and says so: 180 left for it, the intermediate counts 120.
  a.spent = 120;
  a.remaining = 180;
  t.clock.advance(8s);
  g = ask(t.mid, "a", a, 300);
  CHECK(g.gets.capacity == Approx(180));  // all the intermediate has left
  a.adopt(g, 120, t.clock.now());
  CHECK(budget_tree::budget_at(t.mid, t.clock).window == day_start);
  CHECK(t.mid.capacity("tokens", t.clock.now()) == Approx(180));

  // Its report carries the spend up; what it has left is its `has`.
  const auto up = t.mid_up.make_request(t.mid, t.clock.now());
  REQUIRE(up.resources[0].spend);
  CHECK(up.resources[0].spend->window == day_start);
  CHECK(up.resources[0].spend->spent == 120);
  REQUIRE(up.resources[0].has);
  CHECK(up.resources[0].has->capacity == Approx(180));
  CHECK(up.resources[0].outstanding == Approx(180));
  resp = t.root.get_server_capacity(up, t.clock.now());
  REQUIRE(resp);
  t.mid_up.on_reply(t.mid, resp.value(), t.clock.now());
  CHECK(budget_tree::budget_at(t.root, t.clock).spent == 120);
  CHECK(resp.value().resources[0].gets.capacity == 300);  // its share of the 880 left
  // 120 reported + 300 granted: 300 more for its clients.
  CHECK(t.mid.capacity("tokens", t.clock.now()) == Approx(300));

  // A client of the root itself gets what the intermediate's allotment leaves.
  budget_holder z;
  CHECK(ask(t.root, "z", z, 1000).gets.capacity == Approx(1000 - 120 - 300));

  // A release with a last report: the rest is free at the intermediate, then at the root.
  REQUIRE(t.mid.release_capacity({"a", {"tokens"}, {{"tokens", day_start, 200}}}, t.clock.now()));
  CHECK(budget_tree::budget_at(t.mid, t.clock).window == day_start);
  t.clock.advance(4s);
  t.refresh();
  CHECK(budget_tree::budget_at(t.root, t.clock).spent == 200);
}

TEST_CASE("a hostile budget report from a server child is refused naming its field",
          "[core][budget][engine]") {
  budget_fixture f;
  doorman::server_resource_request x{"tokens", std::nullopt, 0, {{0, 2, 100}}};
  x.spend = doorman::budget_spend{day_start, -3};
  auto r = f.engine.get_server_capacity({"mid", {x}}, f.clock.now());
  REQUIRE_FALSE(r);
  CHECK(r.error().message ==
        "resources[0].spend.spent: must be a finite number between 0 and 1e15");
  CHECK(f.engine.store("tokens") == nullptr);
}

TEST_CASE("a budget through an intermediate is never overspent, whatever is lost",
          "[core][budget][upstream]") {
  // Clients keep to their allotments and spend at random, every second; four ask an
  // intermediate, two the root. Answers are lost on both hops and the intermediate's take up to
  // 3 s while its clients spend, clients die (after spending all they had) and come back as new
  // processes, and the intermediate restarts with nothing. Demand spends the budget in about
  // 20 minutes: none of it is spent twice over, and nearly all of it is spent.
  const std::uint32_t seed = GENERATE(1u, 2u, 3u, 4u, 5u);
  std::mt19937 rng(seed);
  INFO("seed " << seed);
  budget_tree t(100'000);
  std::vector<budget_holder> cs(6);
  double real = 0;  // what every process spent
  std::uniform_real_distribution<double> u(0, 1);
  // The intermediate's request in flight: its answer (none: lost) and when it arrives.
  std::optional<
      std::pair<std::optional<doorman::server_capacity_response>, manual_clock::time_point>>
      in_flight;
  for (int step = 0; step < 3000; ++step) {
    t.clock.advance(std::chrono::milliseconds(1000));
    for (std::size_t i = 0; i < cs.size(); ++i) {
      auto& c = cs[i];
      engine_t& server = i < 4 ? t.mid : t.root;
      const auto spend = [&](double x) {
        x = std::min(x, t.clock.now() < c.expiry ? c.remaining : 0.0);
        c.remaining -= x;
        c.spent += x;
        real += x;
      };
      if (u(rng) < 0.6) spend(u(rng) * 400);
      if (u(rng) < 0.3) {
        const auto x = c.request(300 + u(rng) * 600, t.clock.now());
        auto r = server.get_capacity({"c" + std::to_string(i), {x}}, t.clock.now());
        REQUIRE(r);
        if (u(rng) < 0.3) spend(u(rng) * 400);  // in the answer's flight, on the old allotment
        if (u(rng) < 0.9 && !r.value().resources.empty()) {
          c.adopt(r.value().resources[0], x.spend ? x.spend->spent : 0.0, t.clock.now());
        }
      }
      if (u(rng) < 0.002) {  // dies after spending all it had; a new process takes its id
        spend(c.remaining);
        c = {};
      }
    }
    // The intermediate's exchange: decided by the root when sent, its answer heard (or lost)
    // up to 3 s later, while its clients spend and report.
    if (in_flight && t.clock.now() >= in_flight->second) {
      if (in_flight->first) {
        t.mid_up.on_reply(t.mid, *in_flight->first, t.clock.now());
      } else {
        t.mid_up.on_reply(doorman::errc::timed_out, t.clock.now());
      }
      in_flight.reset();
    }
    if (!in_flight && t.mid_up.due(t.mid, t.clock.now())) {
      const auto req = t.mid_up.make_request(t.mid, t.clock.now());
      std::optional<doorman::server_capacity_response> answer;
      const double fate = u(rng);
      if (fate >= 0.1) {  // else lost on its way
        auto resp = t.root.get_server_capacity(req, t.clock.now());
        REQUIRE(resp);
        if (fate >= 0.2) answer = resp.value();  // else the answer is lost
      }
      in_flight.emplace(std::move(answer), t.clock.now() + std::chrono::seconds(rng() % 4));
    }
    if (u(rng) < 0.002) {  // the intermediate restarts: a new process, nothing kept
      t.mid = engine_t(small_tree::placeholder(), [&] {
        auto o = at_utc(day_start);
        o.is_root = false;
        return o;
      }());
      t.mid.set_mastership(true, "mid", t.clock.now());
      t.mid_up = upstream_t({.server_id = "mid"});
      in_flight.reset();
    }
    if (t.root.store("tokens") != nullptr) {
      if (budget_tree::budget_at(t.root, t.clock).window != day_start) break;  // hour over
    }
    REQUIRE(real <= 100'000 + 1e-6);
  }
  CHECK(real >= 90'000);  // nearly all of it is spent: demand exceeds it
}

TEST_CASE("a new master learns a budget's spend from the clients' cumulative reports",
          "[core][budget][engine]") {
  budget_fixture f(R"("day")", 1000, day_start + 3600.0, 60);
  f.clock.advance(60s);  // the first master's learning mode is over
  CHECK(f.ask_budget("a", 600).gets.capacity == 600);
  CHECK(f.ask_budget("b", 600).gets.capacity == 400);
  f.clock.advance(16s);
  f.ask_budget("a", 600, holding(600), 500);
  f.ask_budget("b", 600, holding(400), 100);
  REQUIRE(f.budget().spent == 600);

  // Mastership moves (here: lost and won back, which forgets every lease and count).
  f.engine.set_mastership(false, "other:7700", f.clock.now());
  f.engine.set_mastership(true, "self:7700", f.clock.now());
  CHECK(f.budget().spent == 0);
  f.clock.advance(1s);
  // Each client's report is its whole spend in the window; its `has`, what it has left.
  CHECK(f.ask_budget("a", 600, holding(100), 500).gets.capacity == 100);  // confirmed
  CHECK(f.ask_budget("b", 600, holding(300), 100).gets.capacity == 300);
  CHECK(f.budget().spent == 600);
  CHECK(f.ask_budget("c", 1000).gets.capacity == 0);  // learning: nothing new
  f.clock.advance(30s);
  CHECK(f.budget().spent == 600);
  CHECK(f.budget().left == Approx(0));  // a's 100 and b's 300 are still out
  // Unrenewed, their allotments end and count as spent: they may have been.
  f.clock.advance(31s);
  CHECK(f.ask_budget("c", 1000).gets.capacity == 0);
  CHECK(f.budget().spent == Approx(1000));
}

TEST_CASE("a client's budget counter: allotments set a ceiling, settling spends or refunds",
          "[budget][limit]") {
  using counter = doorman::budget_counter<manual_clock>;
  manual_clock clock;
  counter b;
  CHECK_FALSE(b.try_acquire(1, clock.now()));  // no allotment: nothing
  b.grant({.units = 100, .spent_at_send = 0, .expires = clock.now() + 10s});
  CHECK(b.try_acquire(60, clock.now()));
  CHECK_FALSE(b.try_acquire(50, clock.now()));  // 40 left: all or nothing
  CHECK_FALSE(b.try_acquire(-1, clock.now()));
  CHECK_FALSE(b.try_acquire(std::numeric_limits<double>::infinity(), clock.now()));
  CHECK(b.left(clock.now()) == 40);
  const auto w = b.window();
  CHECK(b.settle(60, 90, w));  // it cost 30 more: 10 left
  CHECK(b.left(clock.now()) == 10);
  CHECK(b.report() == 90);
  CHECK(b.settle(10, 0, w));  // a refund after the report ...
  CHECK(b.spent() == 80);
  CHECK(b.report() == 90);  // ... is not taken back from the root
  CHECK_FALSE(b.settle(1, std::nan(""), w));
  CHECK(b.settle(0, 50, w));  // a debt: 30 over
  CHECK(b.left(clock.now()) == -30);
  CHECK_FALSE(b.try_acquire(0.5, clock.now()));
  // An allotment answering the report of 90 (sent before the debt) ...
  b.grant({.units = 40, .spent_at_send = 90, .expires = clock.now() + 10s});
  CHECK(b.left(clock.now()) == 0);  // ... covers the debt: 90 + 40 − 130
  b.grant({.units = 40, .spent_at_send = 130, .expires = clock.now() + 10s});
  CHECK(b.left(clock.now()) == 40);
  clock.advance(10s);  // it expires unrenewed
  CHECK_FALSE(b.try_acquire(1, clock.now()));
  CHECK(b.left(clock.now()) == 0);
  // A new window: what was spent since the report it answers (130) counts again.
  b.grant({.units = 40, .spent_at_send = 100, .expires = clock.now() + 10s});
  CHECK(b.left(clock.now()) == 10);
  CHECK(b.report() == 130);
  b.grant({.units = 25, .spent_at_send = 130, .new_window = true, .expires = clock.now() + 10s});
  CHECK(b.spent() == 0);
  CHECK(b.report() == 0);
  CHECK(b.left(clock.now()) == 25);
  CHECK(b.attempted() > 0);
  CHECK(b.refused() == 4);  // the refusals above, not the invalid amounts
  b.close();
  CHECK_FALSE(b.try_acquire(1, clock.now()));
}

TEST_CASE("a call open when the root names a new window refunds nothing into it",
          "[budget][limit]") {
  // An allotment of 20; call A takes 10 and is still open when the report goes out.
  manual_clock clock;
  doorman::budget_counter<manual_clock> b;
  b.grant({.units = 20, .spent_at_send = 0, .expires = clock.now() + 10s});
  const auto old = b.window();
  REQUIRE(b.try_acquire(10, clock.now()));
  const double reported = b.report();
  CHECK(reported == 10);
  const auto new_window = [&](double units) {
    b.grant({.units = units,
             .spent_at_send = reported,
             .new_window = true,
             .expires = clock.now() + 10s});
    CHECK(b.window() != old);
  };
  SECTION("A settles in the new window") {
    new_window(10);
    const auto now = b.window();
    REQUIRE(b.try_acquire(10, clock.now()));  // the new window's 10
    CHECK(b.settle(10, 0, old));              // A cost nothing: its window is over
    CHECK(b.spent() == 10);
    CHECK_FALSE(b.try_acquire(10, clock.now()));  // (was admitted: 20 against 10)
    CHECK(b.settle(10, 4, now));  // a call of this window gives back what it did not use
    CHECK(b.spent() == 4);
    CHECK(b.settle(0, 3, old));  // an old call's debt still counts
    CHECK(b.spent() == 7);
  }
  SECTION("A settles between the report and the new window's answer") {
    REQUIRE(b.try_acquire(10, clock.now()));  // call B, after the report: the root has not seen it
    CHECK(b.settle(10, 0, old));              // A cost nothing, before the answer
    new_window(10);
    CHECK(b.spent() == 10);                      // B counts in the new window
    CHECK_FALSE(b.try_acquire(1, clock.now()));  // (was 0 spent: B's 10 went uncounted)
  }
}

namespace {

// `property` (tests/fuzz/limit_properties.hpp) over 3000 programs of random bytes, each up to
// `longest` long, drawn from `seed`: the first broken bound fails, with its program and words.
// The fuzz target `limits` runs the same properties on what libFuzzer finds.
template <class Property>
void holds_over_random_programs(std::uint64_t seed, std::uint64_t longest, Property property) {
  doorman::detail::splitmix64 draw(seed);
  for (int program = 0; program < 3000; ++program) {
    std::vector<std::uint8_t> bytes(1 + draw.next() % longest);
    for (auto& b : bytes)
      b = static_cast<std::uint8_t>(draw.next());
    const auto broken = property(bytes.data(), bytes.size());
    INFO("program " << program << ": " << broken.value_or(""));
    REQUIRE_FALSE(broken.has_value());
  }
}

}  // namespace

TEST_CASE("a budget window's count is never under what its calls spent, over random programs",
          "[budget][limit][property]") {
  holds_over_random_programs(80, 600, doorman_fuzz::budget_window_property);
}

TEST_CASE(
    "a rate limiter's calls, settled and cancelled, keep to rate x W + burst, over random "
    "programs",
    "[limit][costs][property]") {
  holds_over_random_programs(81, 500, doorman_fuzz::rate_window_property);
}

TEST_CASE("a client's budget counter loses no unit to threads racing its driver",
          "[budget][limit][threads]") {
  using counter = doorman::budget_counter<manual_clock>;
  const manual_clock clock;  // never moves: the allotments do not expire
  counter b;
  b.grant({.units = 50, .spent_at_send = 0, .expires = clock.now() + 1h});
  std::atomic<bool> done{false};
  std::vector<double> taken(4, 0);
  std::vector<std::thread> callers;
  for (std::size_t t = 0; t < taken.size(); ++t) {
    callers.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t));
      while (!done) {
        const double n = 1 + static_cast<double>(random() % 10);
        if (b.try_acquire(n, clock.now())) taken[t] += n;
      }
    });
  }
  double ceiling = 50;
  for (int i = 0; i < 2000; ++i) {
    // The driver's refresh: a report, and an allotment of 20 on top of it.
    const double reported = b.report();
    ceiling = std::max(ceiling, reported + 20);
    b.grant({.units = 20, .spent_at_send = reported, .expires = clock.now() + 1h});
    std::this_thread::yield();
  }
  done = true;
  for (auto& c : callers)
    c.join();
  const double sum = std::accumulate(taken.begin(), taken.end(), 0.0);
  CHECK(b.spent() == sum);      // every admission counted once
  CHECK(b.spent() <= ceiling);  // never past a ceiling
  CHECK(b.report() >= sum);
}

TEST_CASE("a release carries one last report per budget it releases, the latest",
          "[budget][client]") {
  using doorman::resource_spend;
  const std::vector<resource_spend> made = {
      {"tokens", 60, 10}, {"bytes", 60, 5}, {"tokens", 60, 30}, {"gone", 60, 7}};
  const auto out = doorman::spends_for({"bytes", "tokens", "other"}, made);
  REQUIRE(out.size() == 2);
  CHECK(out[0].resource_id == "bytes");
  CHECK(out[1].resource_id == "tokens");
  CHECK(out[1].spent == 30);  // the latest: a resource detached, attached again, detached
  // What the release carries is valid on the wire: every spend names a released resource.
  doorman::release_request r{"c", {"bytes", "tokens", "other"}, out};
  CHECK_FALSE(doorman::validate(r));
  r.spends = made;
  CHECK(doorman::validate(r));
  CHECK(doorman::spends_for({}, made).empty());
}

TEST_CASE("a client's budget counter: a blocked wait takes its units from the next allotment",
          "[budget][limit][threads]") {
  using counter = doorman::budget_counter<manual_clock>;
  const manual_clock clock;
  const auto now = [&] { return clock.now(); };
  counter b;
  b.grant({.units = 10, .spent_at_send = 0, .expires = clock.now() + 1h});
  std::stop_source stop;
  std::promise<bool> first;
  std::thread waiter([&] { first.set_value(b.wait(25, stop.get_token(), now)); });
  auto taken = first.get_future();
  CHECK(taken.wait_for(50ms) == std::future_status::timeout);  // 10 left: not enough
  b.grant({.units = 30, .spent_at_send = 0, .expires = clock.now() + 1h});
  REQUIRE(taken.wait_for(10s) == std::future_status::ready);
  CHECK(taken.get());
  waiter.join();
  CHECK(b.spent() == 25);
  // A stop ends a wait that nothing satisfies, with nothing taken.
  std::promise<bool> second;
  std::thread stopped([&] { second.set_value(b.wait(100, stop.get_token(), now)); });
  auto f = second.get_future();
  CHECK(f.wait_for(50ms) == std::future_status::timeout);
  stop.request_stop();
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  CHECK_FALSE(f.get());
  stopped.join();
  CHECK(b.spent() == 25);
  CHECK_FALSE(b.wait(-1, {}, now));
}

TEST_CASE("a root keeping budget marks allots nothing before its mark is read, never past it",
          "[core][budget][engine]") {
  budget_fixture f(R"("day")", 1000, day_start + 3600.0, 0, 0.1);  // a step of 100
  mark_store etcd;
  const auto used = [&] { return f.budget().spent + f.engine.store("tokens")->sum_held(); };
  // The window's mark is not read yet: nothing is allotted, and the read is asked for, once.
  // The client is asked back as soon as a node waiting for its parent's capacity would (a
  // mark is read and written in milliseconds), not a whole refresh interval later.
  const auto first = f.ask_budget("a", 500).gets;
  CHECK(first.capacity == 0);
  CHECK(first.refresh_interval == Approx(f.engine.options().no_parent_refresh_interval.count()));
  CHECK(first.refresh_interval <
        f.engine.config().find("tokens").algorithm.refresh_interval.count());
  REQUIRE(f.engine.budget_marks_due());
  auto tasks = f.engine.budget_mark_tasks(f.clock.now());
  REQUIRE(tasks.size() == 1);
  CHECK(tasks[0].resource_id == "tokens");
  CHECK(tasks[0].window == day_start);
  CHECK_FALSE(tasks[0].raise);
  CHECK(f.ask_budget("a", 500).gets.capacity == 0);
  CHECK_FALSE(f.engine.budget_marks_due());  // the read is out
  // A failed read comes again; one of a window or a term gone by changes nothing.
  f.engine.budget_mark_done(tasks[0], std::nullopt, f.clock.now());
  auto stale = tasks[0];
  stale.window -= 86400;
  f.engine.budget_mark_done(stale, 900.0, f.clock.now());
  stale = tasks[0];
  stale.term -= 1;
  f.engine.budget_mark_done(stale, 900.0, f.clock.now());
  tasks = f.engine.budget_mark_tasks(f.clock.now());
  REQUIRE(tasks.size() == 1);
  CHECK_FALSE(tasks[0].raise);
  // Nothing stored: the count starts at 0, and the mark is raised a step ahead.
  etcd.answer(f.engine, tasks[0], false, f.clock.now());
  tasks = f.engine.budget_mark_tasks(f.clock.now());
  REQUIRE(tasks.size() == 1);
  CHECK(tasks[0].raise == Approx(100));
  CHECK(f.ask_budget("a", 500).gets.capacity == 0);  // not stored yet: nothing
  etcd.answer(f.engine, tasks[0], false, f.clock.now());
  CHECK(etcd.marks["tokens"] == std::pair<std::int64_t, double>(day_start, 100));
  // Stored: allotted up to it, and raised again as what is out comes near it.
  budget_client a{"a"}, b{"b"};
  for (int i = 0; i < 20 && a.held < 500; ++i) {
    f.clock.advance(5s);  // the minimum refresh interval
    a.ask(f, 500);
    CHECK(used() <= etcd.marks["tokens"].second + 1e-9);
    etcd.serve(f.engine, f.clock.now());
  }
  CHECK(a.held == 500);
  CHECK(etcd.marks["tokens"].second >= 550);  // a step ahead of what is out
  CHECK(etcd.marks["tokens"].second <= 600);
  // Once the mark reaches the budget, it is no more raised.
  for (int i = 0; i < 20 && b.held < 500; ++i) {
    f.clock.advance(5s);
    b.ask(f, 1000);
    CHECK(used() <= etcd.marks["tokens"].second + 1e-9);
    etcd.serve(f.engine, f.clock.now());
  }
  CHECK(b.held == 500);
  CHECK(etcd.marks["tokens"].second == 1000);
  CHECK_FALSE(f.engine.budget_marks_due());
  // A new window is read again before anything of it is allotted.
  f.clock.advance(std::chrono::hours(23));
  CHECK(f.ask_budget("a", 500).gets.capacity == 0);
  tasks = f.engine.budget_mark_tasks(f.clock.now());
  REQUIRE(tasks.size() == 1);
  CHECK(tasks[0].window == day_start + 86400);
  CHECK_FALSE(tasks[0].raise);
  // A read still out when its window ends is not the next window's: that one is read anew.
  f.clock.advance(std::chrono::hours(24));
  CHECK(f.ask_budget("a", 500).gets.capacity == 0);  // the count is in the next window now
  etcd.marks["tokens"] = {day_start + 86400, 900};
  etcd.answer(f.engine, tasks[0], false, f.clock.now());
  CHECK(f.budget().spent == 0);
  tasks = f.engine.budget_mark_tasks(f.clock.now());
  REQUIRE(tasks.size() == 1);
  CHECK(tasks[0].window == day_start + 2 * 86400);
  CHECK_FALSE(tasks[0].raise);
}

TEST_CASE("a new master counts from the budget's mark: a client that died unheard cannot pass it",
          "[core][budget][engine]") {
  // a spends 500 of its 600 and reports it; b spends 300 of its 400 and dies unheard. The
  // master changes. Without marks the new master learns a's 500 and 100 left and nothing of b:
  // it hands out 400 more, and the clients spend 1 300 of 1 000. With marks it starts from
  // what was out (1 000): b's 400 count as spent, a's unconfirmed 100 is free again.
  const double step = GENERATE(0.0, 0.1);
  INFO("mark step " << step);
  budget_fixture f(R"("day")", 1000, day_start + 3600.0, 60, step);
  mark_store etcd;
  f.clock.advance(60s);  // the first master's learning mode is over
  budget_client a{"a"}, b{"b"};
  for (int i = 0; i < 20 && a.held + b.held < 1000; ++i) {
    f.clock.advance(5s);  // the minimum refresh interval
    a.ask(f, 600);
    b.ask(f, 400);
    etcd.serve(f.engine, f.clock.now());
  }
  REQUIRE(a.held == 600);
  REQUIRE(b.held == 400);
  f.clock.advance(5s);
  f.ask_budget("a", 600, holding(100), 500);  // b spends 300 and dies: never heard of again
  etcd.serve(f.engine, f.clock.now());

  f.engine.set_mastership(false, "other:7700", f.clock.now());
  f.engine.set_mastership(true, "self:7700", f.clock.now());
  f.clock.advance(1s);
  const double a_kept = f.ask_budget("a", 600, holding(100), 500).gets.capacity;
  etcd.serve(f.engine, f.clock.now());
  f.clock.advance(61s);  // learning mode over, every earlier allotment ended
  etcd.serve(f.engine, f.clock.now());
  budget_client c{"c"};
  for (int i = 0; i < 5; ++i) {
    f.clock.advance(5s);
    c.ask(f, 1000);
    etcd.serve(f.engine, f.clock.now());
  }
  const double more = c.held;
  const double spendable = 500 + 300 + a_kept + more;
  if (step == 0) {
    CHECK(more == 400);  // b's allotment is handed out again
    CHECK(spendable > 1000);
  } else {
    CHECK(a_kept == 0);  // unconfirmed before the mark is read: a's 100 counts as its part
    CHECK(more == Approx(100));
    CHECK(spendable <= 1000);
    CHECK(f.budget().spent == Approx(900));  // a's 500, and b's 400 unclaimed
  }
}

TEST_CASE("with budget marks, no master change lets clients pass a budget, whoever dies unheard",
          "[core][budget][engine]") {
  // As "what clients spend in a window never exceeds its budget", with master changes, clients
  // that die having spent all they held (heard of or not), and etcd answering late or failing.
  const std::uint32_t seed = GENERATE(1u, 2u, 3u, 4u, 5u);
  std::mt19937 rng(seed);
  INFO("seed " << seed);
  budget_fixture f(R"("hour")", 10'000, day_start + 0.0, 60, 0.05);
  mark_store etcd;
  std::vector<engine_t::budget_mark_task> out;  // tasks etcd has not answered
  spending_clients fleet;
  std::uniform_real_distribution<double> u(0, 1);
  int changes = 0;
  for (int step = 0; step < 3000; ++step) {
    fleet.step(f, rng, 0.4);
    for (auto& t : f.engine.budget_mark_tasks(f.clock.now()))
      out.push_back(std::move(t));
    while (!out.empty() && u(rng) < 0.7) {  // etcd answers, late, or fails
      etcd.answer(f.engine, out.front(), u(rng) < 0.1, f.clock.now());
      out.erase(out.begin());
    }
    if (u(rng) < 0.005) {  // the master changes; its marks' answers to the old one are lost
      f.engine.set_mastership(false, "other:7700", f.clock.now());
      f.engine.set_mastership(true, "self:7700", f.clock.now());
      out.clear();
      ++changes;
    }
    REQUIRE(fleet.real <= 10'000 + 1e-6);
    if (f.engine.store("tokens") != nullptr && f.budget().window != day_start) break;
  }
  CHECK(changes > 0);
  CHECK(fleet.real <= 10'000 + 1e-6);
  CHECK(fleet.real >= 5'000);
}

TEST_CASE("count_hits on a budget draws from its UTC window, whole or nothing",
          "[core][budget][engine][count]") {
  budget_fixture f(R"("day")", 1000, day_start + 3600.0);  // 01:00 UTC
  const auto draw = [&](double hits, double window = 60) {
    auto r = f.engine.count_hits({"rls", {{"tokens", hits, window}}}, f.clock.now());
    REQUIRE(r);
    return r.value().resources[0];
  };
  // The budget's window and limit, whatever the request's window says.
  auto v = draw(600, 86400);
  CHECK(v.admitted);
  CHECK(v.limit == 1000);
  CHECK(v.remaining == 400);
  CHECK(v.reset == Approx(23 * 3600.0));
  CHECK(draw(500, 60).admitted == false);  // refused whole, nothing counted
  v = draw(400);
  CHECK(v.admitted);
  CHECK(v.remaining == 0);
  CHECK(f.budget().spent == 1000);
  // Allotments and draws share the window: nothing is left for a client.
  CHECK(f.ask_budget("a", 100).gets.capacity == 0);
  // The next UTC day starts whole.
  f.clock.advance(std::chrono::hours(23));
  v = draw(1000);
  CHECK(v.admitted);
  CHECK(v.reset == Approx(86400));
  // A rate resource beside it still counts its hits in windows of capacity × window.
  CHECK(
      f.engine.count_hits({"rls", {{"other", 1, 60}}}, f.clock.now()).value().resources[0].limit ==
      0);
}

TEST_CASE("count_hits on a budget with marks waits for the mark, then keeps a draw ahead",
          "[core][budget][engine][count]") {
  budget_fixture f(R"("day")", 10'000, day_start + 3600.0, 0, 0.01);  // a step of 100
  mark_store etcd;
  const auto draw = [&](double hits) {
    auto r = f.engine.count_hits({"rls", {{"tokens", hits, 86400}}}, f.clock.now());
    REQUIRE(r);
    return r.value().resources[0];
  };
  // Before the window's mark is read, a draw is not counted, and says the budget has room
  // for it (a replica takes that as no answer, not as a refusal: window_draws).
  auto v = draw(500);
  CHECK_FALSE(v.admitted);
  CHECK(v.remaining == 10'000);
  CHECK(f.budget().spent == 0);
  CHECK_FALSE(f.budget().mark);  // status shows no mark before it is read
  // (A status call in between keeps what the mark's read is for.) The mark is read, then
  // raised two draws ahead, not a step (100): a draw of 500 was held back by it.
  etcd.serve(f.engine, f.clock.now());
  CHECK(etcd.marks["tokens"].second == Approx(1000));
  CHECK(f.budget().mark == Approx(1000));  // and status shows it
  // From then on each draw of 500 finds room: the mark is raised a draw ahead after each.
  for (int i = 0; i < 10; ++i) {
    v = draw(500);
    CHECK(v.admitted);
    etcd.serve(f.engine, f.clock.now());
    CHECK(f.budget().spent <= etcd.marks["tokens"].second);
  }
  CHECK(f.budget().spent == 5'000);
  // A new master counts the draws from the mark: nothing drawn before is drawn again.
  f.engine.set_mastership(false, "other:7700", f.clock.now());
  f.engine.set_mastership(true, "self:7700", f.clock.now());
  CHECK_FALSE(draw(500).admitted);  // the mark is read first
  etcd.serve(f.engine, f.clock.now());
  double drawn = 5'000;
  for (int i = 0; i < 40; ++i) {
    if (draw(500).admitted) drawn += 500;
    etcd.serve(f.engine, f.clock.now());
  }
  CHECK(drawn <= 10'000);
  CHECK(drawn >= 9'000);
}

TEST_CASE(
    "a budget asked for through a door that cannot report spending gets 0, the rest as always",
    "[core][budget][engine]") {
  // Doorman's gRPC protocol has no report of a spend: its clients would take an allotment for
  // a rate, and the root would count all of it as spent at each request. The budget gets a
  // lease of 0 with a warning; the request's other resources are decided as always (a Go
  // client's, or an intermediate's, rates keep flowing).
  std::vector<std::string> lines;
  doorman::engine_options o = at_utc(day_start + 3600.0);
  o.log = [&](std::string_view l) { lines.emplace_back(l); };
  fixture f(budget_repo(R"("day")", 1000), o);
  doorman::capacity_request asked{
      "go", {{"other", 0, 5, std::nullopt}, {"tokens", 0, 100, std::nullopt}}, false};
  auto r = f.engine.get_capacity(asked, f.clock.now());
  REQUIRE(r);
  REQUIRE(r.value().resources.size() == 2);
  const auto& zero = r.value().resources[1];
  CHECK(zero.resource_id == "tokens");
  CHECK(zero.gets.capacity == 0);
  CHECK(zero.gets.refresh_interval > 0);
  CHECK_FALSE(zero.budget);  // nothing this door could carry
  CHECK(r.value().resources[0].resource_id == "other");
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] ==
        "warning: go asked for budget tokens through Doorman's protocol, which cannot report a "
        "spend: granted 0 (ask for it over JSON-RPC)");
  doorman::server_capacity_request server{
      "mid",
      {{.resource_id = "tokens", .has = std::nullopt, .outstanding = 0, .wants = {{0, 3, 100}}}},
      false};
  auto s = f.engine.get_server_capacity(server, f.clock.now());
  REQUIRE(s);
  CHECK(s.value().resources[0].gets.capacity == 0);
  CHECK(lines.size() == 1);  // one line per 10 s at most
  // Nothing was allotted: the whole budget is left, and the same client asking over JSON-RPC
  // (which reports) is allotted.
  const auto st = f.engine.status({"tokens"}, f.clock.now());
  REQUIRE(st.value().resources[0].budget);
  CHECK(st.value().resources[0].budget->left == 1000);
  CHECK(st.value().resources[0].budget->spent == 0);
  asked.reports_spend = true;
  asked.resources.erase(asked.resources.begin());
  r = f.engine.get_capacity(asked, f.clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets.capacity == 100);

  // An intermediate knows a budget from its parent's answer: 0 from then on.
  fixture mid(budget_repo(R"("day")", 1000), [] {
    doorman::engine_options m = at_utc(day_start + 3600.0);
    m.is_root = false;
    return m;
  }());
  asked.reports_spend = false;
  mid.engine.set_parent_lease("tokens", {500, mid.clock.now() + 60s, 8s}, mid.clock.now(), {},
                              doorman::budget_info{day_start, 82800, 1000, 0, 500, 0.0});
  r = mid.engine.get_capacity(asked, mid.clock.now());
  REQUIRE(r);
  CHECK(r.value().resources[0].gets.capacity == 0);
}
