// The local limiters and the demand estimator.

#include <catch2/catch.hpp>

#include <doorman/core.hpp>
#include <doorman/limit.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <random>
#include <stop_token>
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

TEST_CASE("rate limiter: a cancelled reservation gives its permits back while it is ahead",
          "[limit]") {
  manual_clock clock;
  test_limiter lim({.rate = 10, .burst = 1}, clock_ref{&clock});
  const auto t0 = clock.now();
  REQUIRE(lim.try_acquire());
  const auto at = lim.reserve();
  CHECK(at == t0 + 100ms);
  const auto later = lim.reserve();  // made after it: keeps its time
  CHECK(later == t0 + 200ms);
  CHECK(lim.cancel_reservation(1, at));
  // The next reservation takes the place given back (it would be t0 + 300 ms otherwise).
  CHECK(lim.reserve() == t0 + 200ms);
  // Once its time has come, a reservation counts as used.
  clock.advance(200ms);
  CHECK_FALSE(lim.cancel_reservation(1, later));
  CHECK_FALSE(lim.try_acquire());
}

// GCC 12 warns, at -O1 and above, of a use after free inside libstdc++'s <stop_token> when a
// std::stop_token is destroyed on another thread's stack (a false positive: the state is
// reference-counted).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuse-after-free"
#endif

namespace {

// Runs `wait(token)` on another thread until `waiting()` says it waits, then requests stop;
// what the wait returned (it must return within 5 s).
template <class Wait, class Waiting>
bool stopped_wait(Wait wait, Waiting waiting) {
  std::stop_source stop;
  auto f = std::async(std::launch::async, [&] { return wait(stop.get_token()); });
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!waiting() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  REQUIRE(waiting());
  stop.request_stop();
  REQUIRE(f.wait_for(5s) == std::future_status::ready);
  return f.get();
}

}  // namespace

TEST_CASE("rate limiter and gauge limiter waits end when stop is requested, taking nothing",
          "[limit]") {
  SECTION("rate: blocked at rate 0") {
    doorman::basic_rate_limiter<std::chrono::steady_clock> lim({.rate = 0});
    CHECK_FALSE(stopped_wait([&](std::stop_token t) { return lim.wait(1, t); },
                             [&] { return lim.delayed() > 0; }));
  }
  SECTION("rate: a reservation ahead") {
    doorman::basic_rate_limiter<std::chrono::steady_clock> lim({.rate = 0.1, .burst = 1});
    REQUIRE(lim.try_acquire());  // the next permit is due in 10 s
    CHECK_FALSE(stopped_wait([&](std::stop_token t) { return lim.wait(1, t); },
                             [&] { return lim.delayed() > 0; }));
    // Given back: the next permit is still ~10 s away, not ~20 s.
    const auto next = lim.try_acquire();
    CHECK_FALSE(next);
    CHECK(next.retry_after < 11s);
  }
  SECTION("gauge: no free slot") {
    doorman::gauge_limiter gauge(1);
    REQUIRE(gauge.try_acquire());
    CHECK_FALSE(stopped_wait([&](std::stop_token t) { return gauge.acquire(t); },
                             [&] { return gauge.waiting() > 0; }));
    CHECK(gauge.in_flight() == 1);
    CHECK(gauge.waiting() == 0);
  }
}

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic pop
#endif

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
