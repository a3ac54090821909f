// Tests of the local limiters (manual clock), the client state (manual clock), and the asio
// client against in-process nodes on 127.0.0.1 (with deadlines).

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

// A handle to a manual clock, so that a limiter and its test share one.
struct clock_ref {
  using duration = manual_clock::duration;
  using rep = manual_clock::rep;
  using period = manual_clock::period;
  using time_point = manual_clock::time_point;
  static constexpr bool is_steady = true;
  const manual_clock* c;
  [[nodiscard]] time_point now() const noexcept { return c->now(); }
};

using test_limiter = doorman::basic_rate_limiter<clock_ref>;

// A coarse clock over a manual one: `now()` moves in 4 ms steps behind `precise_now()`, as
// CLOCK_MONOTONIC_COARSE does behind CLOCK_MONOTONIC.
struct stepped_clock_ref : clock_ref {
  [[nodiscard]] time_point now() const noexcept {
    return time_point{c->now().time_since_epoch() / 4ms * 4ms};
  }
  [[nodiscard]] time_point precise_now() const noexcept { return c->now(); }
  [[nodiscard]] static duration resolution() noexcept { return 4ms; }
};

}  // namespace

TEST_CASE("rate limiter admits at most rate x window + burst over any window", "[limit]") {
  manual_clock clock;
  const double rate = 100;
  const double burst = GENERATE(1.0, 5.0, 50.0);
  test_limiter lim({.rate = rate, .burst = burst}, clock_ref{&clock});
  std::mt19937 random(7);
  std::vector<manual_clock::time_point> admitted;
  // Random arrivals, far faster than the rate, for 20 s.
  while (clock.now().time_since_epoch() < 20s) {
    clock.advance(std::chrono::microseconds(random() % 3000));
    if (lim.try_acquire()) admitted.push_back(clock.now());
  }
  // Every window [admitted[i], admitted[i] + w] for several lengths.
  for (const auto w : {0ms, 10ms, 100ms, 1000ms, 5000ms}) {
    std::size_t j = 0;
    for (std::size_t i = 0; i < admitted.size(); ++i) {
      j = std::max(j, i);
      while (j < admitted.size() && admitted[j] - admitted[i] <= w)
        ++j;
      const double count = static_cast<double>(j - i);
      REQUIRE(count <= rate * doorman::to_seconds(w) + burst + 1e-9);
    }
  }
  CHECK(static_cast<double>(admitted.size()) <= rate * 20 + burst);
  // With room for more than one permit, sparse callers lose nothing: 20 s at 100/s. (With a
  // burst of 1, a permit not taken the moment it is due cannot be saved for later.)
  if (burst > 1) CHECK(static_cast<double>(admitted.size()) >= rate * 20 - 1);
}

TEST_CASE("rate limiter reaches exactly the rate with a coarse clock, never above", "[limit]") {
  // Callers arrive every 50 us; the cheap clock moves in 4 ms steps.
  manual_clock clock;
  doorman::basic_rate_limiter<stepped_clock_ref> lim({.rate = 1000, .burst = 1},
                                                     stepped_clock_ref{{&clock}});
  std::vector<manual_clock::time_point> admitted;
  while (clock.now().time_since_epoch() < 10s) {
    if (lim.try_acquire()) admitted.push_back(clock.now());
    clock.advance(50us);
  }
  CHECK(admitted.size() >= 9999);
  CHECK(admitted.size() <= 10001);
  // In precise time too, no two permits closer than 1 ms (rate 1000, burst 1).
  for (std::size_t i = 1; i < admitted.size(); ++i)
    REQUIRE(admitted[i] - admitted[i - 1] >= 1ms);
}

TEST_CASE("rate limiter: one precise reading serves many calls", "[limit]") {
  // Rate 1e6/s, burst 100 (100 us), callers every 10 us: every call is due, but within one
  // 4 ms step of the cheap clock they use 400 us of permits, more than the burst. The latest
  // precise reading stands in for the time until it too is a burst behind.
  struct counting_clock : stepped_clock_ref {
    std::size_t* reads;
    [[nodiscard]] time_point precise_now() const noexcept {
      ++*reads;
      return c->now();
    }
  };
  manual_clock clock;
  std::size_t reads = 0;
  doorman::basic_rate_limiter<counting_clock> lim({.rate = 1e6, .burst = 100},
                                                  counting_clock{{{&clock}}, &reads});
  std::size_t calls = 0;
  std::size_t admitted = 0;
  while (clock.now().time_since_epoch() < 1s) {
    ++calls;
    if (lim.try_acquire()) ++admitted;
    clock.advance(10us);
  }
  CHECK(admitted == calls);
  CHECK(reads * 50 < calls);
}

TEST_CASE("rate limiter reports when a refused request would be admitted", "[limit]") {
  manual_clock clock;
  test_limiter lim({.rate = 10, .burst = 2}, clock_ref{&clock});
  REQUIRE(lim.try_acquire());
  REQUIRE(lim.try_acquire());
  const auto r = lim.try_acquire();
  REQUIRE_FALSE(r);
  CHECK(r.retry_after == 100ms);
  clock.advance(99ms);
  CHECK_FALSE(lim.try_acquire());
  clock.advance(1ms);
  CHECK(lim.try_acquire());
  SECTION("a request larger than the burst is never admitted at once") {
    clock.advance(10s);
    const auto big = lim.try_acquire(3);
    CHECK_FALSE(big);
    CHECK(big.retry_after == manual_clock::duration::max());
    CHECK(lim.try_acquire(2));
  }
  CHECK(lim.throttled() >= 2);
  CHECK(lim.attempted() >= 4);
}

TEST_CASE("rate limiter: -1 is unlimited, 0 is blocked, and changes apply at once", "[limit]") {
  manual_clock clock;
  test_limiter lim({.rate = -1, .burst = 5}, clock_ref{&clock});
  for (int i = 0; i < 100000; ++i)
    REQUIRE(lim.try_acquire());
  CHECK(lim.rate() == -1);

  lim.set_rate(0);
  CHECK(lim.rate() == 0);
  const auto r = lim.try_acquire();
  CHECK_FALSE(r);
  CHECK(r.retry_after == manual_clock::duration::max());
  CHECK(lim.reserve() == manual_clock::time_point::max());
  clock.advance(1h);
  CHECK_FALSE(lim.try_acquire());

  SECTION("an idle limiter holds no more than the burst after a rate change") {
    lim.set_rate(1);  // after an hour blocked: still only 5 at once
    int n = 0;
    while (lim.try_acquire())
      ++n;
    CHECK(n == 5);
    lim.set_rate(1000);  // faster: the burst is still 5 permits, no stored surplus
    clock.advance(1s);
    n = 0;
    while (lim.try_acquire())
      ++n;
    CHECK(n == 5);
    clock.advance(1ms);
    CHECK(lim.try_acquire());
    CHECK_FALSE(lim.try_acquire());
  }
  SECTION("a lower rate applies to the next request") {
    lim.set_rate(100);
    while (lim.try_acquire()) {
    }
    lim.set_rate(2);
    clock.advance(100ms);  // at 100/s this would be 10 permits; at 2/s none yet
    CHECK_FALSE(lim.try_acquire());
    clock.advance(400ms);
    CHECK(lim.try_acquire());
  }
}

TEST_CASE("rate limiter reservations are served in order", "[limit]") {
  manual_clock clock;
  test_limiter lim({.rate = 10, .burst = 1}, clock_ref{&clock});
  const auto t0 = clock.now();
  CHECK(lim.reserve() == t0);
  CHECK(lim.reserve() == t0 + 100ms);
  CHECK(lim.reserve(5) == t0 + 600ms);
  CHECK(lim.reserve() == t0 + 700ms);
  CHECK_FALSE(lim.try_acquire());  // the reservations are ahead of it
  clock.advance(700ms);
  CHECK_FALSE(lim.try_acquire());
  clock.advance(100ms);
  CHECK(lim.try_acquire());
}

TEST_CASE("rate limiter wait blocks until the permit's time, and across a blocked rate",
          "[limit]") {
  // Real time, bounded below only (a loaded machine makes waits longer, never shorter).
  doorman::basic_rate_limiter<std::chrono::steady_clock> lim({.rate = 200, .burst = 1});
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 21; ++i)
    (void)lim.wait();
  CHECK(std::chrono::steady_clock::now() - start >= 100ms);

  lim.set_rate(0);
  const auto delayed = lim.delayed();
  std::atomic<bool> passed{false};
  std::thread waiter([&] {
    (void)lim.wait();
    passed = true;
  });
  // The waiter stays blocked until the rate changes; its blocked wait is counted.
  while (lim.delayed() == delayed)
    std::this_thread::yield();
  CHECK_FALSE(passed.load());
  lim.set_rate(1000);
  waiter.join();
  CHECK(passed.load());
}

TEST_CASE("rate limiter is exact under concurrent callers", "[limit]") {
  // 4 threads hammer one limiter on a frozen clock: exactly the burst is admitted.
  manual_clock clock;
  test_limiter lim({.rate = 1, .burst = 1000}, clock_ref{&clock});
  std::atomic<int> admitted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i)
        admitted += lim.try_acquire() ? 1 : 0;
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(admitted.load() == 1000);
  CHECK(lim.attempted() == 40000);
}

TEST_CASE("gauge limiter keeps at most L in flight under concurrent use", "[limit]") {
  doorman::gauge_limiter gauge(3);
  std::atomic<int> inside{0};
  std::atomic<int> most{0};
  std::atomic<int> done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        doorman::gauge_guard held(gauge);
        const int now = ++inside;
        int m = most.load();
        while (now > m && !most.compare_exchange_weak(m, now)) {
        }
        --inside;
      }
      ++done;
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(done.load() == 6);
  CHECK(most.load() <= 3);
  CHECK(most.load() >= 1);
  CHECK(gauge.in_flight() == 0);
}

TEST_CASE("gauge limiter: lowering the limit revokes nothing, admits no one until under it",
          "[limit]") {
  doorman::gauge_limiter gauge(4);
  for (int i = 0; i < 4; ++i)
    REQUIRE(gauge.try_acquire());
  CHECK_FALSE(gauge.try_acquire());
  gauge.set_limit(2);
  CHECK(gauge.in_flight() == 4);
  gauge.release();
  gauge.release();
  CHECK_FALSE(gauge.try_acquire());  // 2 in flight, limit 2
  gauge.release();
  CHECK(gauge.try_acquire());
  CHECK(gauge.take_peak() >= 5);  // the refused attempts count as demand

  SECTION("a waiter is admitted when the limit grows") {
    std::atomic<bool> in{false};
    std::thread waiter([&] {
      gauge.acquire();
      in = true;
    });
    while (gauge.waiting() == 0)
      std::this_thread::yield();
    CHECK_FALSE(in.load());
    gauge.set_limit(3);
    waiter.join();
    CHECK(gauge.in_flight() == 3);
  }
  SECTION("0 blocks, -1 is unlimited, a fraction admits its whole part") {
    gauge.set_limit(0);
    CHECK_FALSE(gauge.try_acquire());
    gauge.set_limit(-1);
    for (int i = 0; i < 1000; ++i)
      REQUIRE(gauge.try_acquire());
    for (int i = 0; i < 1002; ++i)
      gauge.release();
    gauge.set_limit(1.9);
    CHECK(gauge.try_acquire());
    CHECK_FALSE(gauge.try_acquire());
  }
}

TEST_CASE("demand estimator averages over its window", "[limit]") {
  doorman::demand_estimator d(10s);
  CHECK(d.estimate() == 0);
  for (int i = 0; i < 10; ++i)
    d.add(100, 1s);
  CHECK(d.estimate() == Approx(100));
  for (int i = 0; i < 5; ++i)
    d.add(200, 1s);
  CHECK(d.estimate() == Approx(150));  // half the window at each
  for (int i = 0; i < 10; ++i)
    d.add(200, 1s);
  CHECK(d.estimate() == Approx(200));  // the old samples left the window
  d.add(-1, 1s);
  d.add(50, 0s);
  CHECK(d.estimate() == Approx(200));  // ignored
  d.add(0, 30s);                       // one long sample is kept alone
  CHECK(d.estimate() == Approx(0));
}

// ---------------------------------------------------------------------------------------------
// Client state

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

// ---------------------------------------------------------------------------------------------
// The asio client against in-process nodes (deadlines, no sleeps standing in for events)

#include <doorman/client.hpp>

#include <future>

#include "support.hpp"

namespace {

using doorman_test::fast_config;
using doorman_test::fixed_election;
using doorman_test::running_node;
using steady = std::chrono::steady_clock;

doorman::client_options fast_client(const std::string& address) {
  doorman::client_options o;
  o.addresses = {address};
  o.minimum_refresh_interval = doorman::seconds(0.05);
  o.call_timeout = doorman::seconds(1);
  o.sample_interval = doorman::seconds(0.1);
  o.demand_window = doorman::seconds(1);
  return o;
}

// Polls `done()` every few milliseconds until it holds or `timeout` passes.
template <class F>
bool eventually(F done, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = steady::now() + timeout;
  while (!done()) {
    if (steady::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// The sum of unexpired grants and the number of clients the node holds for `resource`.
template <class Node>
std::pair<double, std::size_t> held_at(Node& node, const std::string& resource) {
  std::promise<std::pair<double, std::size_t>> p;
  node.node().post([&](auto& eng) {
    eng.expire(std::chrono::steady_clock::now());
    const auto* store = eng.store(resource);
    p.set_value(store ? std::pair{store->sum_has(), store->size()}
                      : std::pair<double, std::size_t>{0, 0});
  });
  return p.get_future().get();
}

}  // namespace

TEST_CASE("clients with different demands converge to the fair shares and keep to them",
          "[client][net]") {
  running_node root(fast_config(100));
  doorman::client small(fast_client(root.address()));
  doorman::client medium(fast_client(root.address()));
  doorman::client large(fast_client(root.address()));
  CHECK(small.id() != medium.id());  // hostname:pid:n, n distinct per client
  doorman::rate_resource a(small, "api", {.wants = 10});
  doorman::rate_resource b(medium, "api", {.wants = 40});
  doorman::rate_resource c(large, "api", {.wants = 100, .burst = 5});
  REQUIRE(eventually([&] {
    return a.capacity() == Approx(10) && b.capacity() == Approx(40) && c.capacity() == Approx(50);
  }));
  CHECK(c.leased());
  CHECK(held_at(root, "api").first <= 100 + 1e-9);

  // The largest one runs flat out for a while: it gets the lease's rate, never more (± burst).
  const auto start = steady::now();
  int admitted = 0;
  while (steady::now() - start < 600ms)
    admitted += c.try_acquire() ? 1 : 0;
  const double elapsed = doorman::to_seconds(steady::now() - start);
  CHECK(admitted <= 50 * elapsed + 5 + 1);
  CHECK(admitted >= 50 * 0.6 * 0.5);  // a loaded machine may lose some, not most

  SECTION("a refused try_acquire says when to retry") {
    while (c.try_acquire()) {
    }
    const auto r = c.try_acquire();
    CHECK_FALSE(r);
    CHECK(r.retry_after > 0ms);
    // One permit at 50/s, overstated by at most the coarse clock's lag when the refusal was
    // decided on the coarse reading.
    CHECK(r.retry_after <= 20ms + doorman::coarse_clock::resolution());
  }
  SECTION("a new client with demand moves the shares") {
    b.set_wants(80);
    REQUIRE(eventually([&] { return b.capacity() == Approx(45) && c.capacity() == Approx(45); }));
  }
}

TEST_CASE("a client's refresh loop keeps running through wrongly typed answers", "[client][net]") {
  // A server that first answers with members of the wrong type (each used to throw out of the
  // channel and end the refresh loop silently), then with a good grant.
  const std::vector<std::string> hostile = {
      R"("error":{"code":"x","message":"busy"})",
      R"("error":{"code":-32000,"message":5})",
      R"("result":{"mastership":{"is_master":"yes","master":null},"resources":[]})",
  };
  std::atomic<std::size_t> calls{0};
  asio::io_context io;
  auto answer = [&](std::string_view line) -> std::optional<std::string> {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("id")) return std::nullopt;
    const std::string id = j["id"].dump();
    if (j.value("method", "") != "get_capacity") {
      return R"({"jsonrpc":"2.0","id":)" + id +
             R"(,"result":{"mastership":{"is_master":true,"master":null}}})";
    }
    const std::size_t n = calls++;
    if (n < hostile.size()) return R"({"jsonrpc":"2.0","id":)" + id + "," + hostile[n] + "}";
    return R"({"jsonrpc":"2.0","id":)" + id +
           R"(,"result":{"mastership":{"is_master":true,"master":null},"resources":[)"
           R"({"resource_id":"api","gets":{"capacity":42,"expires_in":60,"refresh_interval":1},)"
           R"("safe_capacity":0}]}})";
  };
  doorman::net::server server(io.get_executor(), {}, answer);
  server.listen({"127.0.0.1", "0"});
  server.start();
  const std::string address = "127.0.0.1:" + std::to_string(server.local_endpoint().port());
  std::thread thread([&] { io.run(); });
  {
    doorman::client cl(fast_client(address));
    doorman::rate_resource api(cl, "api", {.wants = 10});
    CHECK(eventually([&] { return api.leased() && api.capacity() == 42; }));
    CHECK(calls.load() > hostile.size());
  }
  asio::post(io, [&] { server.stop(); });
  thread.join();
}

TEST_CASE("leases expire when the node goes away, then the fallbacks apply", "[client][net]") {
  auto root = std::make_unique<running_node<>>(fast_config(100));
  doorman::client cl(fast_client(root->address()));
  doorman::rate_resource p(cl, "p", {.wants = 10, .mode = doorman::fallback::pessimistic});
  doorman::rate_resource o(cl, "o", {.wants = 20, .mode = doorman::fallback::optimistic});
  doorman::rate_resource s(cl, "s", {.wants = 30, .mode = doorman::fallback::safe});
  doorman::gauge_resource g(cl, "g",
                            {.wants = 5, .mode = doorman::fallback::safe, .safe_capacity = 2});
  REQUIRE(eventually([&] { return p.leased() && o.leased() && s.leased() && g.leased(); }));
  CHECK(g.capacity() == 5);
  std::atomic<int> changes{0};
  p.on_capacity([&](double) { ++changes; });
  root.reset();  // the node stops; leases are 3 s long
  REQUIRE(eventually([&] { return !p.leased() && !o.leased() && !s.leased() && !g.leased(); }));
  CHECK(p.capacity() == 0);
  CHECK_FALSE(p.try_acquire());
  CHECK(o.capacity() == 20);
  CHECK(s.capacity() == Approx(100));  // the server's last dynamic one: 100 / 1 client
  CHECK(g.capacity() == 2);
  CHECK(changes.load() >= 1);
  CHECK_FALSE(cl.connected());
}

TEST_CASE("a client follows a redirect to the master", "[client][net]") {
  running_node master(fast_config(100));
  running_node<fixed_election> follower(fast_config(100), {},
                                        fixed_election{false, master.address()});
  doorman::client cl(fast_client(follower.address()));
  doorman::rate_resource r(cl, "api", {.wants = 7});
  REQUIRE(eventually([&] { return r.leased() && r.capacity() == 7; }));
  CHECK(held_at(master, "api").second == 1);
  CHECK(held_at(follower, "api").second == 0);
}

TEST_CASE("releasing the last handle releases the capacity on the node", "[client][net]") {
  running_node root(fast_config(100));
  doorman::client cl(fast_client(root.address()));
  auto first =
      std::make_unique<doorman::rate_resource>(cl, "db", doorman::resource_options{.wants = 30});
  auto second = std::make_unique<doorman::rate_resource>(cl, "db");  // shares the first's
  REQUIRE(eventually([&] { return second->capacity() == 30; }));
  CHECK_THROWS_AS(doorman::gauge_resource(cl, "db"), std::invalid_argument);
  first.reset();
  // Still held by the second handle: nothing released.
  CHECK(held_at(root, "db").second == 1);
  CHECK(second->leased());
  second.reset();
  REQUIRE(eventually([&] { return held_at(root, "db").second == 0; }));
  SECTION("stop releases everything") {
    doorman::rate_resource x(cl, "x", {.wants = 3});
    REQUIRE(eventually([&] { return x.leased(); }));
    CHECK(held_at(root, "x").second == 1);
    cl.stop();
    REQUIRE(eventually([&] { return held_at(root, "x").second == 0; }));
  }
}

TEST_CASE("async waits complete through asio completion tokens", "[client][net]") {
  running_node root(fast_config(100));
  doorman::client cl(fast_client(root.address()));
  doorman::rate_resource r(cl, "rate", {.wants = 50});
  doorman::gauge_resource g(cl, "gauge", {.wants = 1, .mode = doorman::fallback::pessimistic});
  // Blocked at first (capacity 0 until the lease): the wait completes once the lease comes.
  doorman::rate_resource blocked(cl, "late", {.wants = 5, .mode = doorman::fallback::pessimistic});
  auto late = blocked.async_wait(1, asio::use_future);
  REQUIRE(late.wait_for(10s) == std::future_status::ready);
  late.get();
  CHECK(blocked.capacity() == 5);

  REQUIRE(eventually([&] { return r.leased() && g.leased(); }));
  for (int i = 0; i < 5; ++i) {
    auto f = r.async_wait(1, asio::use_future);
    REQUIRE(f.wait_for(10s) == std::future_status::ready);
    f.get();
  }
  REQUIRE(g.try_acquire());  // the only slot
  auto slot = g.async_acquire(asio::use_future);
  CHECK(slot.wait_for(50ms) == std::future_status::timeout);  // held elsewhere
  g.release();
  REQUIRE(slot.wait_for(10s) == std::future_status::ready);
  slot.get();
  CHECK(g.in_flight() == 1);
  g.release();
}

TEST_CASE("measured wants follow use", "[client][net]") {
  running_node root(fast_config(1000));
  doorman::client cl(fast_client(root.address()));
  doorman::rate_resource r(cl, "api");  // no wants given: measured
  doorman::gauge_resource g(cl, "jobs");
  std::vector<doorman::gauge_resource::slot> held;
  // Callers refused at capacity 0 make the client ask for more, until a lease lets them in.
  REQUIRE(eventually([&] {
    (void)r.try_acquire();
    if (held.size() < 3 && g.try_acquire()) held.emplace_back(&g);
    return r.capacity() > 0 && held.size() == 3;
  }));
  CHECK(r.wants() > 0);
  REQUIRE(eventually([&] { return g.wants() >= 3; }));
}

#if defined(DOORMAN_NODE_BINARY) && defined(DOORMAN_HTTP_BINARY)
#include "process.hpp"

#include <sys/socket.h>

#include <filesystem>
#include <fstream>

namespace {

// One HTTP request on a fresh connection; the whole answer (the server closes), or "" on error.
std::string http_get(const std::string& address) {
  const auto a = doorman::net::parse_address(address);
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  std::error_code ec;
  s.connect({asio::ip::make_address(a->host), static_cast<unsigned short>(std::stoi(a->port))}, ec);
  if (ec) return "";
  const timeval tv{5, 0};  // a deadline on every read
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET / HTTP/1.1\r\nHost: test\r\n\r\n";
  asio::write(s, asio::buffer(req), ec);
  if (ec) return "";
  std::string answer;
  asio::read(s, asio::dynamic_buffer(answer), ec);  // to EOF
  return answer;
}

}  // namespace

TEST_CASE("doorman-http-429 answers 429 with Retry-After beyond its lease", "[client][process]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("doorman-http-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "conf.json") << R"({"resources": [{"identifier_glob": "*", "capacity": 5,
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 3, "refresh_interval": 0.4,
                  "learning_mode_duration": 0}}]})";
  doorman_examples::process node({DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--config",
                                  (dir / "conf.json").string(), "--minimum-refresh-interval", "0"},
                                 (dir / "node.log").string());
  const auto node_address = node.listening_address();
  REQUIRE(node_address);
  doorman_examples::process http({DOORMAN_HTTP_BINARY, "--server", *node_address, "--listen",
                                  "127.0.0.1:0", "--resource", "api"},
                                 (dir / "http.log").string());
  const auto http_address = http.listening_address();
  REQUIRE(http_address);

  // No lease yet (wants are measured from requests): refused, and told when to come back.
  const std::string first = http_get(*http_address);
  REQUIRE_THAT(first, Catch::Contains("HTTP/1.1 429"));
  CHECK_THAT(first, Catch::Contains("Retry-After: "));
  // The refused requests are demand: a lease comes, and requests get through.
  REQUIRE(eventually([&] { return http_get(*http_address).find("HTTP/1.1 200") == 0; }));
  // A burst far above the lease (5/s): at most the lease's worth in the time it took, + burst.
  const auto start = steady::now();
  int ok = 0;
  int refused = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string a = http_get(*http_address);
    ok += a.find("HTTP/1.1 200") == 0 ? 1 : 0;
    refused += a.find("HTTP/1.1 429") == 0 && a.find("Retry-After: 1") != std::string::npos;
  }
  const double took = doorman::to_seconds(steady::now() - start);
  CHECK(ok <= 5 * took + 1 + 1e-9);
  CHECK(ok + refused == 40);  // every other answer is a 429 saying "Retry-After: 1"
  CHECK(refused > 0);
  http.signal(SIGTERM);
  CHECK(http.wait_exit() == 0);
  node.signal(SIGTERM);
  CHECK(node.wait_exit() == 0);
  std::filesystem::remove_all(dir);
}
#endif
