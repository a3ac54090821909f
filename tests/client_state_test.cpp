// The client state: requests, fallbacks, refresh timing, hostile grants.

#include <catch2/catch.hpp>

#include <doorman/core.hpp>
#include <doorman/limit.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using doorman::manual_clock;

namespace {

using state_t = doorman::basic_client_state<manual_clock>;

doorman::capacity_response grant(const std::string& id, double capacity, double expires_in = 60,
                                 double refresh = 16, double safe = 10) {
  doorman::capacity_response r;
  r.mastership.is_master = true;
  r.resources.push_back({id, {capacity, expires_in, refresh}, safe});
  return r;
}

}  // namespace

TEST_CASE("client state builds one bulk request with wants, priority and held leases", "[client]") {
  manual_clock clock;
  state_t s({.client_id = "c1"});
  CHECK_FALSE(s.due(clock.now()));  // nothing to ask for
  s.add("b", {.priority = 2, .wants = 20});
  s.add("a", {.wants = 10});
  REQUIRE(s.due(clock.now()));
  auto req = s.make_request(clock.now());
  CHECK(req.client_id == "c1");
  REQUIRE(req.resources.size() == 2);
  CHECK(req.resources[0].resource_id == "a");
  CHECK(req.resources[1].resource_id == "b");
  CHECK(req.resources[1].priority == 2);
  CHECK(req.resources[1].wants == 20);
  CHECK_FALSE(req.resources[0].has);
  CHECK_FALSE(s.due(clock.now()));  // in flight

  auto resp = grant("a", 10, 60, 16);
  resp.resources.push_back({"b", {15, 60, 8}, 5});
  clock.advance(100ms);
  s.on_reply(resp, clock.now());
  CHECK(s.capacity("a", clock.now()) == 10);
  CHECK(s.capacity("b", clock.now()) == 15);
  // The shortest refresh interval (8 s) decides the next request.
  CHECK(s.next_request() == clock.now() + 8s);
  clock.advance(8s);
  REQUIRE(s.due(clock.now()));
  s.set_wants("a", 12);
  req = s.make_request(clock.now());
  REQUIRE(req.resources[0].has);
  CHECK(req.resources[0].has->capacity == 10);
  // Expiry counted from the request sent at 0: 60 − 8.1 s left.
  CHECK(req.resources[0].has->expires_in == Approx(51.9));
  CHECK(req.resources[0].wants == 12);

  SECTION("bad input is refused") {
    CHECK_THROWS_AS(s.add("", {}), std::invalid_argument);
    CHECK_THROWS_AS(s.add(std::string(300, 'x'), {}), std::invalid_argument);
    CHECK_THROWS_AS(s.set_wants("a", -1), std::invalid_argument);
    CHECK_THROWS_AS(s.set_wants("a", std::nan("")), std::invalid_argument);
  }
}

TEST_CASE("client state applies the fallback when its lease expires", "[client]") {
  manual_clock clock;
  state_t s({.client_id = "c1"});
  s.add("p", {.wants = 50, .mode = doorman::fallback::pessimistic});
  s.add("o", {.wants = 50, .mode = doorman::fallback::optimistic});
  s.add("s", {.wants = 50, .mode = doorman::fallback::safe});
  s.add("c", {.wants = 50, .mode = doorman::fallback::safe, .safe_capacity = 7});
  s.add("u", {.wants = 50, .mode = doorman::fallback::safe, .safe_capacity = -1});
  // Before any answer the fallback applies already (the safe capacity is unknown: 0).
  CHECK(s.capacity("p", clock.now()) == 0);
  CHECK(s.capacity("o", clock.now()) == 50);
  CHECK(s.capacity("s", clock.now()) == 0);
  CHECK(s.capacity("c", clock.now()) == 7);
  CHECK(s.capacity("u", clock.now()) == -1);

  (void)s.make_request(clock.now());
  doorman::capacity_response resp;
  resp.mastership.is_master = true;
  for (const char* id : {"p", "o", "s", "c", "u"})
    resp.resources.push_back({id, {30, 20, 5}, 9});
  s.on_reply(resp, clock.now());
  for (const char* id : {"p", "o", "s", "c", "u"})
    CHECK(s.capacity(id, clock.now()) == 30);
  CHECK(s.next_change(clock.now()) == clock.now() + 5s);

  // The server goes away: every refresh fails until the leases run out.
  while (clock.now().time_since_epoch() < 20s) {
    clock.set(std::max(clock.now() + 1ms, s.next_change(clock.now())));
    if (s.due(clock.now())) {
      (void)s.make_request(clock.now());
      s.on_reply(doorman::errc::timed_out, clock.now());
    }
  }
  CHECK(s.failures() >= 3);
  CHECK_FALSE(s.leased("p", clock.now()));
  CHECK(s.capacity("p", clock.now()) == 0);
  CHECK(s.capacity("o", clock.now()) == 50);
  CHECK(s.capacity("s", clock.now()) == 9);  // the server's last safe capacity
  CHECK(s.capacity("c", clock.now()) == 7);  // configured wins
  CHECK(s.capacity("u", clock.now()) == -1);
}

TEST_CASE("client state refresh timing: floor, new resources, backoff, expiry", "[client]") {
  manual_clock clock;
  state_t s({.client_id = "c1", .refresh = {.minimum_interval = 2s}});
  s.add("a", {.wants = 1});
  (void)s.make_request(clock.now());
  s.on_reply(grant("a", 1, 60, 0.5), clock.now());
  // The server asked for 0.5 s; the floor is 2 s.
  CHECK(s.next_request() == clock.now() + 2s);

  SECTION("a new resource is asked for at once, past the floor") {
    clock.advance(1s);
    s.add("b", {.wants = 1});
    CHECK(s.next_request() == manual_clock::time_point{} + 2s);
  }
  SECTION("a lease shorter than its refresh interval is refreshed before it expires") {
    clock.advance(2s);
    (void)s.make_request(clock.now());
    s.on_reply(grant("a", 1, 5, 30), clock.now());
    CHECK(s.next_request() == clock.now() + 5s);
  }
  SECTION("failures back off exponentially with jitter") {
    clock.advance(2s);
    (void)s.make_request(clock.now());
    s.on_reply(grant("a", 1, 60, 30), clock.now());  // a longer interval: no cap below 15 s
    clock.advance(61s);                              // and no lease left to hurry for
    for (int i = 1; i <= 6; ++i) {
      (void)s.make_request(clock.now());
      s.on_reply(doorman::errc::timed_out, clock.now());
      const double wait = doorman::to_seconds(s.next_request() - clock.now());
      const double step = std::min(15.0, 0.5 * std::pow(2, i - 1));
      CHECK(wait >= std::max(2.0, step / 2) - 1e-9);
      CHECK(wait <= std::max(2.0, step) + 1e-9);
      clock.set(s.next_request());
    }
  }
  SECTION("a failing client asks no more often than a served one, and no less") {
    clock.advance(2s);
    for (int i = 1; i <= 8; ++i) {
      (void)s.make_request(clock.now());
      s.on_reply(doorman::errc::timed_out, clock.now());
      // The last answer's interval (2 s, the floor) caps the backoff: a healed link is used
      // within one interval.
      CHECK(s.next_request() - clock.now() <= 2s);
      clock.set(s.next_request());
    }
  }
  SECTION("a non-master answer counts as a failure") {
    clock.advance(2s);
    (void)s.make_request(clock.now());
    doorman::capacity_response r;
    r.mastership = {false, "10.0.0.1:1"};
    s.on_reply(r, clock.now());
    CHECK(s.failures() == 1);
  }
}

TEST_CASE("client state ignores hostile grants and grants for removed resources", "[client]") {
  manual_clock clock;
  state_t s({.client_id = "c1"});
  s.add("a", {.wants = 5});
  s.add("b", {.wants = 5});
  (void)s.make_request(clock.now());
  CHECK(s.remove("b"));
  CHECK_FALSE(s.remove("b"));
  auto r = grant("a", -3);
  r.resources.push_back({"b", {4, 60, 16}, 1});
  r.resources.push_back({"zzz", {4, 60, 16}, 1});
  s.on_reply(r, clock.now());
  CHECK_FALSE(s.leased("a", clock.now()));
  CHECK(s.find("b") == nullptr);
  CHECK(s.find("zzz") == nullptr);
  CHECK(s.take_releases() == std::vector<std::string>{"b"});
  CHECK(s.take_releases().empty());
  SECTION("adding it back cancels the release") {
    s.remove("a");
    s.add("a", {});
    CHECK(s.take_releases().empty());
  }
}

TEST_CASE("client state adopts only grants it asked for, within bounds, and says so", "[client]") {
  manual_clock clock;
  std::vector<std::string> logged;
  state_t s({.client_id = "c1", .log = [&](std::string_view l) { logged.emplace_back(l); }});
  s.add("a", {.wants = 5});
  (void)s.make_request(clock.now());
  s.add("late", {.wants = 5});  // added after the request went out: not asked for yet
  doorman::capacity_response r;
  r.mastership.is_master = true;
  r.resources.push_back({"late", {4, 60, 16}, 1});
  r.resources.push_back({"a", {1e300, 60, 16}, 1});
  r.resources.push_back({"a", {4, 1e12, 16}, 1});
  r.resources.push_back({"a", {4, 60, 2e6}, 1});
  r.resources.push_back({"a", {4, 60, 16}, 1e300});
  r.resources.push_back({"a", {4, 60, 16}, 1});  // the one good grant
  r.resources.push_back({"a", {7, 60, 16}, 1});  // a second grant for it
  s.on_reply(r, clock.now());
  CHECK(s.capacity("a", clock.now()) == 4);
  CHECK_FALSE(s.leased("late", clock.now()));
  CHECK(s.invalid_grants() == 6);
  REQUIRE(logged.size() == 1);
  CHECK_THAT(logged[0], Catch::Contains("6 of 7 grants ignored") &&
                            Catch::Contains("resources[0].resource_id: not asked for"));
  CHECK_THROWS_WITH(s.add("b", {.wants = 2e15}),
                    "wants must be a finite number between 0 and 1e15");
}

TEST_CASE("client state: a resource held back at capacity 0 asks for its start wants at once",
          "[client]") {
  manual_clock clock;
  state_t s({.client_id = "c1"});  // floor 1 s
  s.add("api", {.wants = 0});      // measured wants, none measured yet
  REQUIRE(s.due(clock.now()));
  (void)s.make_request(clock.now());
  // A caller is held back before the answer: nothing to do until it comes.
  s.hold_back("api", clock.now());
  CHECK_FALSE(s.due(clock.now()));
  clock.advance(2ms);
  s.on_reply(grant("api", 0, 60, 5, /*safe=*/50), clock.now());  // nothing asked, nothing got
  // Due at once, ahead of the 1 s floor and the 5 s interval, asking for the equal share.
  REQUIRE(s.due(clock.now()));
  s.set_wants("api", 2);  // a measurement meanwhile does not lower the start wants
  auto req = s.make_request(clock.now());
  REQUIRE(req.resources.size() == 1);
  CHECK(req.resources[0].wants == 50);
  clock.advance(2ms);
  s.on_reply(grant("api", 50, 60, 5, 50), clock.now());
  CHECK(s.capacity("api", clock.now()) == 50);
  CHECK(s.next_request() == clock.now() + 5s);  // the usual schedule again
  s.set_wants("api", 2);                        // no longer held back: measurements rule
  CHECK(s.find("api")->options.wants == 2);

  SECTION("a later stretch at 0 asks past the floor only, once") {
    clock.advance(5s);
    (void)s.make_request(clock.now());
    clock.advance(2ms);
    s.on_reply(grant("api", 0, 60, 5, 50), clock.now());
    s.hold_back("api", clock.now());
    CHECK_FALSE(s.due(clock.now()));
    CHECK(s.next_request() == s.find("api")->lease->expiry - 60s + 1s);  // the floor
    clock.advance(1s);
    REQUIRE(s.due(clock.now()));
    CHECK(s.make_request(clock.now()).resources[0].wants == 50);
    clock.advance(2ms);
    s.on_reply(grant("api", 0, 60, 5, 50), clock.now());  // still nothing: no hammering
    s.hold_back("api", clock.now());
    CHECK(s.next_request() == clock.now() + 5s);
  }
  SECTION("an unlimited or tiny safe capacity starts at 1") {
    state_t t({.client_id = "c2"});
    t.add("x", {.wants = 0});
    (void)t.make_request(clock.now());
    t.on_reply(grant("x", 0, 60, 5, -1), clock.now());
    t.hold_back("x", clock.now());
    REQUIRE(t.due(clock.now()));
    CHECK(t.make_request(clock.now()).resources[0].wants == 1);
  }
  SECTION("nothing while the resource has capacity") {
    s.hold_back("api", clock.now());
    CHECK_FALSE(s.due(clock.now()));
    CHECK(s.find("api")->options.wants == 2);
  }
}
