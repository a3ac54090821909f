// The local limiters and the demand estimator.

#include <catch2/catch.hpp>

#include <doorman/core.hpp>
#include <doorman/limit.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using doorman::manual_clock;

namespace {

using clock_ref = doorman::manual_clock_ref;

using test_limiter = doorman::basic_rate_limiter<clock_ref>;

// A coarse clock over a manual one: `now()` moves in 4 ms steps behind `precise_now()`, as
// CLOCK_MONOTONIC_COARSE does behind CLOCK_MONOTONIC.
struct stepped_clock_ref : clock_ref {
  [[nodiscard]] time_point now() const noexcept {
    return time_point{source->now().time_since_epoch() / 4ms * 4ms};
  }
  [[nodiscard]] time_point precise_now() const noexcept { return source->now(); }
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
      return source->now();
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
  SECTION("a request larger than the burst is admitted when the burst is whole, in debt") {
    const auto early = lim.try_acquire(3);  // the burst is not whole yet: 200 ms until it is
    CHECK_FALSE(early);
    CHECK(early.retry_after == 200ms);
    clock.advance(200ms);
    CHECK(lim.try_acquire(3));  // 3 permits against a burst of 2: one borrowed
    const auto next = lim.try_acquire();
    CHECK_FALSE(next);
    CHECK(next.retry_after == 200ms);  // the debt (100 ms), then one permit (100 ms)
    clock.advance(200ms);
    CHECK(lim.try_acquire());
  }
  SECTION("negative and non-finite requests are refused, and not counted") {
    const double before = lim.attempted();
    for (const double n : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
      const auto refused = lim.try_acquire(n);
      CHECK_FALSE(refused);
      CHECK(refused.retry_after == manual_clock::duration::max());
      CHECK(lim.reserve(n).at == manual_clock::time_point::max());
      CHECK_FALSE(lim.wait(n, std::stop_token{}));
    }
    CHECK(lim.attempted() == before);
  }
  CHECK(lim.throttled() >= 2);
  CHECK(lim.attempted() >= 4);
}

TEST_CASE(
    "rate limiter: calls of any cost are admitted when due, and within rate x W + burst "
    "plus one call over any window",
    "[limit]") {
  manual_clock clock;
  const double rate = 10;
  const double burst = GENERATE(1.0, 3.0);
  test_limiter lim({.rate = rate, .burst = burst}, clock_ref{&clock});
  std::mt19937 random(11);
  struct admission {
    manual_clock::time_point at;
    double n;
  };
  std::vector<admission> admitted;
  double largest = 0;
  while (clock.now().time_since_epoch() < 60s) {
    // Costs from 0.5 to 8 permits, some above the burst; each caller tries until admitted,
    // as often as it likes: the refusal's retry_after is when it is admitted, exactly.
    const double n = 0.5 + static_cast<double>(random() % 16) * 0.5;
    largest = std::max(largest, n);
    auto r = lim.try_acquire(n);
    if (!r) {
      REQUIRE(r.retry_after != manual_clock::duration::max());
      clock.advance(r.retry_after - 1ns);
      REQUIRE_FALSE(lim.try_acquire(n));
      clock.advance(1ns);
      r = lim.try_acquire(n);
      REQUIRE(r);
    }
    admitted.push_back({clock.now(), n});
    clock.advance(std::chrono::microseconds(random() % 300'000));
  }
  // Waiting for a reservation agrees: a call above the burst on an idle limiter is due at once.
  clock.advance(10s);
  CHECK(lim.reserve(burst + 4).at == clock.now());
  for (const auto w : {0ms, 100ms, 1000ms, 10000ms}) {
    for (std::size_t i = 0; i < admitted.size(); ++i) {
      double sum = 0;
      for (std::size_t j = i; j < admitted.size() && admitted[j].at - admitted[i].at <= w; ++j)
        sum += admitted[j].n;
      REQUIRE(sum <= rate * doorman::to_seconds(w) + burst + largest + 1e-6);
    }
  }
  double total = 0;
  for (const auto& a : admitted)
    total += a.n;
  CHECK(total >= rate * 60 * 0.9);  // and the rate is used, not lost to large calls
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
  CHECK(lim.reserve().at == manual_clock::time_point::max());
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
  CHECK(lim.reserve().at == t0);
  CHECK(lim.reserve().at == t0 + 100ms);
  CHECK(lim.reserve(5).at == t0 + 200ms);  // due when the burst is whole; it borrows the rest
  CHECK(lim.reserve().at == t0 + 700ms);   // after the debt
  CHECK_FALSE(lim.try_acquire());          // the reservations are ahead of it
  clock.advance(700ms);
  CHECK_FALSE(lim.try_acquire());
  clock.advance(100ms);
  CHECK(lim.try_acquire());
}

TEST_CASE("rate limiter: a cancelled reservation gives its place back while it is ahead and last",
          "[limit][costs]") {
  manual_clock clock;
  test_limiter lim({.rate = 10, .burst = 1}, clock_ref{&clock});
  const auto t0 = clock.now();
  REQUIRE(lim.try_acquire());
  const auto first = lim.reserve();
  CHECK(first.at == t0 + 100ms);
  const auto later = lim.reserve();  // made after it: keeps its time
  CHECK(later.at == t0 + 200ms);
  // Dropped, but its place is held by the one behind it, which may use its permits as soon as
  // 100 ms from now: given back as well, 3 permits would be due within 100 ms where 2 may be.
  CHECK(lim.cancel_reservation(1, first));
  const auto last = lim.reserve();
  CHECK(last.at == t0 + 300ms);
  // The last one's place is nobody else's: the next reservation takes it.
  CHECK(lim.cancel_reservation(1, last));
  CHECK(lim.reserve().at == t0 + 300ms);
  // Once its time has come, a reservation counts as used.
  clock.advance(200ms);
  CHECK_FALSE(lim.cancel_reservation(1, later));
  CHECK_FALSE(lim.try_acquire());
}

TEST_CASE("rate limiter: a refund gives back only time that no later call holds",
          "[limit][costs]") {
  manual_clock clock;
  SECTION("the issue's sequence: a refund of a call whose time has passed gives nothing") {
    // Rate 1/s, burst 1: calls at 0 and 5; the first settles (1, 0) at 5.1. Given back, the
    // call at 5.1 would be admitted: 2 permits within 0.1 s, where rate·W + burst = 1.1.
    test_limiter lim({.rate = 1, .burst = 1}, clock_ref{&clock});
    const auto a = lim.try_acquire();
    REQUIRE(a);
    clock.advance(5s);
    REQUIRE(lim.try_acquire());
    clock.advance(100ms);
    CHECK(lim.settle(1, 0, a.slot));
    const auto r = lim.try_acquire();
    CHECK_FALSE(r);
    CHECK(r.retry_after == 900ms);
  }
  SECTION("from the middle of the schedule, the part still ahead") {
    test_limiter lim({.rate = 10, .burst = 10}, clock_ref{&clock});
    const auto a = lim.try_acquire(5);  // holds 0-500 ms
    REQUIRE(a);
    REQUIRE(lim.try_acquire(3));  // holds 500-800 ms
    clock.advance(100ms);
    CHECK(lim.settle(5, 1, a.slot));  // 4 unused, all of them ahead: given back
    CHECK(lim.try_acquire(7));        // 3 + 7 from 100 ms: the burst of 10, exactly
    CHECK_FALSE(lim.try_acquire(1));
    // A refund moves every later call's span back: a call behind the one refunded ends
    // earlier than it did when admitted, and gives back only what is ahead of its new end.
    clock.advance(2s);                   // 2.1 s: the burst whole again
    const auto c1 = lim.try_acquire(5);  // 2.1-2.6 s
    const auto c2 = lim.try_acquire(3);  // 2.6-2.9 s
    REQUIRE((c1 && c2));
    clock.advance(100ms);
    CHECK(lim.settle(5, 1, c1.slot));  // 4 back: c2 now holds 2.2-2.5 s
    clock.advance(150ms);
    REQUIRE(lim.try_acquire(1));  // 2.35 s: holds 2.5-2.6 s
    clock.advance(50ms);
    CHECK(lim.settle(3, 0, c2.slot));  // 2.4 s: 100 ms of its span is ahead, not 500 ms
    // 1 permit at 2.35 s and 9 at 2.4 s: 10 within 50 ms, where 10.5 may be (given back from
    // its old end, 11 would have been).
    CHECK(lim.try_acquire(9));
    CHECK_FALSE(lim.try_acquire(1));
  }
  SECTION("with a reservation waiting, only from the tail") {
    test_limiter lim({.rate = 10, .burst = 1}, clock_ref{&clock});
    const auto t0 = clock.now();
    const auto a = lim.try_acquire();  // 0-100 ms
    REQUIRE(a);
    REQUIRE(lim.reserve().at == t0 + 100ms);  // due at 100 ms, holds 100-200 ms
    CHECK(lim.settle(1, 0, a.slot));          // the reservation may run at 100 ms: nothing back
    CHECK(lim.reserve().at == t0 + 200ms);
  }
  SECTION("a call open across a change of rate gives nothing back") {
    test_limiter lim({.rate = 10, .burst = 10}, clock_ref{&clock});
    const auto a = lim.try_acquire(5);  // 0-500 ms at 10/s
    REQUIRE(a);
    lim.set_rate(20);                 // the same 5 permits now hold 0-250 ms
    CHECK(lim.settle(5, 0, a.slot));  // its end when admitted (500 ms) is not trusted
    CHECK(lim.try_acquire(5));        // what the new rate leaves: a burst of 500 ms, 250 held
    CHECK_FALSE(lim.try_acquire(1));
  }
  SECTION("without a slot, a settle only runs debts") {
    test_limiter lim({.rate = 10, .burst = 10}, clock_ref{&clock});
    REQUIRE(lim.try_acquire(10));
    CHECK(lim.settle(10, 0));
    CHECK_FALSE(lim.try_acquire(1));
    CHECK(lim.settle(0, 1));  // a debt of 1
    clock.advance(1s);
    CHECK(lim.try_acquire(9));
    CHECK_FALSE(lim.try_acquire(1));
  }
}

TEST_CASE(
    "rate limiter: settling a call's real cost runs into debt or gives back, within the "
    "burst",
    "[limit][costs]") {
  manual_clock clock;
  test_limiter lim({.rate = 10, .burst = 5}, clock_ref{&clock});
  // Reserved 2, used 9: 7 more taken, so the whole burst is spent and 4 permits are owed.
  REQUIRE(lim.try_acquire(2));
  CHECK(lim.settle(2, 9));
  auto r = lim.try_acquire(1);
  REQUIRE_FALSE(r);
  CHECK(r.retry_after == 500ms);  // the debt of 4 repaid and one permit due: 5 / 10 per second
  clock.advance(500ms);
  CHECK(lim.try_acquire(1));
  // Reserved 5, used 3: 2 given back at once.
  clock.advance(1s);  // the burst whole again
  const auto five = lim.try_acquire(5);
  REQUIRE(five);
  CHECK_FALSE(lim.try_acquire(2));
  CHECK(lim.settle(5, 3, five.slot));
  CHECK(lim.try_acquire(2));
  CHECK_FALSE(lim.try_acquire(1));
  // A refund never makes more than the burst: a limiter idle since gets nothing back.
  clock.advance(10s);
  const auto idle = lim.try_acquire(5);
  REQUIRE(idle);
  clock.advance(10s);
  CHECK(lim.settle(5, 0, idle.slot));
  CHECK(lim.try_acquire(5));
  CHECK_FALSE(lim.try_acquire(1));
  // The demand measured is what was asked and the use beyond it: 2 + 7 + 1 + 1 + 5 + 2 + 2 +
  // 1 + 5 + 5 + 1 (refusals count as attempts; refunds lower nothing).
  CHECK(lim.attempted() == Approx(32));
  // Not numbers of permits: refused, nothing moved, nothing counted.
  CHECK_FALSE(lim.settle(-1, 3));
  CHECK_FALSE(lim.settle(1, std::nan("")));
  CHECK(lim.attempted() == Approx(32));
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

// ---- The window algorithms and the leaky bucket, against exact references ----

namespace {

using fixed_window = doorman::basic_fixed_window_limiter<clock_ref>;
using sliding_log = doorman::basic_sliding_log_limiter<clock_ref>;
using sliding_window = doorman::basic_sliding_window_limiter<clock_ref>;
using leaky = doorman::basic_leaky_bucket_limiter<clock_ref>;

constexpr std::int64_t ns_of(manual_clock::time_point t) {
  return t.time_since_epoch().count();
}

// Admissions (time in ns, permits), oldest first, and exact counts over them.
struct history {
  std::vector<std::pair<std::int64_t, int>> admitted;
  // Permits admitted in (t - w, t].
  [[nodiscard]] int in_window(std::int64_t t, std::int64_t w) const {
    int n = 0;
    for (auto it = admitted.rbegin(); it != admitted.rend() && it->first > t - w; ++it)
      if (it->first <= t) n += it->second;
    return n;
  }
  // The most permits admitted in any window of length w (windows ending at an admission).
  [[nodiscard]] int most_in_any(std::int64_t w) const {
    int most = 0;
    int sum = 0;
    std::size_t tail = 0;
    for (std::size_t i = 0; i < admitted.size(); ++i) {
      sum += admitted[i].second;
      while (admitted[tail].first <= admitted[i].first - w)
        sum -= admitted[tail++].second;
      most = std::max(most, sum);
    }
    return most;
  }
};

// Random traffic against `lim` on `clock`: gaps drawn around `mean_gap`, with bursts; each
// refusal's retry_after is checked sometimes: 1 ns before it, refused; at it, admitted.
// `on_decision(t, n, admitted)` sees every decision before it is recorded.
template <class Limiter, class OnDecision>
history drive(Limiter& lim, manual_clock& clock, std::int64_t mean_gap, int events, unsigned seed,
              OnDecision on_decision) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(1.0 / static_cast<double>(mean_gap));
  std::uniform_int_distribution<int> size(1, 3);
  std::uniform_int_distribution<int> pick(0, 99);
  history h;
  auto decide = [&](int n) {
    const auto r = lim.try_acquire(n);
    on_decision(ns_of(clock.now()), n, r.admitted);
    if (r) h.admitted.emplace_back(ns_of(clock.now()), n);
    return r;
  };
  for (int i = 0; i < events; ++i) {
    const int roll = pick(rng);
    if (roll >= 10) clock.advance(std::chrono::nanoseconds(static_cast<std::int64_t>(gap(rng))));
    const int n = roll < 70 ? 1 : size(rng);
    const auto r = decide(n);
    if (!r && roll % 7 == 0 && r.retry_after != manual_clock::duration::max()) {
      if (r.retry_after > 1ns) {
        clock.advance(r.retry_after - 1ns);
        INFO("1 ns before retry_after, at " << ns_of(clock.now()));
        CHECK_FALSE(decide(n));
        clock.advance(1ns);
      } else {
        clock.advance(r.retry_after);
      }
      INFO("at retry_after, " << ns_of(clock.now()));
      CHECK(decide(n));
    }
  }
  return h;
}

constexpr std::int64_t minute = 60'000'000'000;

}  // namespace

TEST_CASE("fixed window: at most N per aligned window, 2N in any window, exact otherwise",
          "[limit][algorithms]") {
  for (const double load : {0.8, 1.2, 3.0}) {
    manual_clock clock;
    fixed_window lim({.limit = 100, .window = 60s}, clock_ref{&clock});
    std::map<std::int64_t, int> per_window;
    const auto h = drive(lim, clock, static_cast<std::int64_t>(minute / 100 / load), 4000, 7,
                         [&](std::int64_t t, int n, bool admitted) {
                           int& count = per_window[t / minute];
                           // Exactly a fixed window: refused only when the window is full.
                           CHECK(admitted == (count + n <= 100));
                           if (admitted) count += n;
                         });
    INFO("load " << load);
    CHECK(h.most_in_any(minute) <= 200);
    for (const auto& [w, count] : per_window)
      CHECK(count <= 100);
    if (load > 1) CHECK(h.most_in_any(minute) > 100);  // the edge lets more through
  }
}

TEST_CASE("sliding log: never more than N in any window, and refuses only when it must",
          "[limit][algorithms]") {
  for (const double load : {0.8, 1.2, 3.0}) {
    manual_clock clock;
    sliding_log lim({.limit = 100, .window = 60s}, clock_ref{&clock});
    history exact;
    const auto h = drive(lim, clock, static_cast<std::int64_t>(minute / 100 / load), 4000, 11,
                         [&](std::int64_t t, int n, bool admitted) {
                           CHECK(admitted == (exact.in_window(t, minute) + n <= 100));
                           if (admitted) exact.admitted.emplace_back(t, n);
                         });
    INFO("load " << load);
    CHECK(h.most_in_any(minute) <= 100);
    CHECK(lim.memory_bytes() <= sizeof(lim) + 100 * 16);
  }
  SECTION("a full log merges entries: it refuses early, never admits more") {
    manual_clock clock;
    sliding_log lim({.limit = 1000, .window = 60s, .max_log_entries = 16}, clock_ref{&clock});
    const auto h = drive(lim, clock, minute / 1000, 5000, 13, [](auto...) {});
    CHECK(h.most_in_any(minute) <= 1000);
    CHECK(lim.memory_bytes() <= sizeof(lim) + 16 * 16);
  }
}

TEST_CASE("sliding window counter: the documented estimate, within one sub-window of exact",
          "[limit][algorithms]") {
  for (const unsigned k : {1u, 4u, 12u}) {
    for (const double load : {0.8, 1.2, 3.0}) {
      manual_clock clock;
      sliding_window lim({.limit = 100, .window = 60s, .sub_windows = k}, clock_ref{&clock});
      const std::int64_t sub = minute / k;
      std::map<std::int64_t, int> per_sub;
      const auto h = drive(lim, clock, static_cast<std::int64_t>(minute / 100 / load), 3000, 17 + k,
                           [&](std::int64_t t, int n, bool admitted) {
                             // The reference: the newest k sub-windows plus the oldest one weighted
                             // by the part of it still in the window.
                             const std::int64_t s = t / sub;
                             double estimate = 0;
                             for (std::int64_t j = 0; j < static_cast<std::int64_t>(k); ++j)
                               estimate += per_sub[s - j];
                             const double covered =
                                 static_cast<double>(t - s * sub) / static_cast<double>(sub);
                             estimate += per_sub[s - k] * (1.0 - covered);
                             CHECK(admitted == (estimate + n <= 100.0));
                             if (admitted) per_sub[s] += n;
                           });
      int busiest = 0;
      for (const auto& [s, count] : per_sub)
        busiest = std::max(busiest, count);
      INFO("k " << k << ", load " << load);
      CHECK(h.most_in_any(minute) <= 100 + busiest);
      CHECK(lim.memory_bytes() <= sizeof(lim) + (k + 1) * 8);
    }
  }
}

TEST_CASE("leaky bucket: admissions spaced by 1/rate, a bounded queue served in order",
          "[limit][algorithms]") {
  manual_clock clock;
  SECTION("try_acquire") {
    leaky lim({.rate = 100.0 / 60.0, .queue = 0}, clock_ref{&clock});
    const auto h = drive(lim, clock, minute / 100, 3000, 23, [](auto...) {});
    const std::int64_t interval = minute / 100;
    for (std::size_t i = 1; i < h.admitted.size(); ++i) {
      CHECK(h.admitted[i].first - h.admitted[i - 1].first >=
            h.admitted[i - 1].second * interval - 1);
    }
    CHECK(h.most_in_any(minute) <= 100 + 3);
  }
  SECTION("reservations") {
    leaky lim({.rate = 10, .queue = 2}, clock_ref{&clock});
    const auto start = clock.now();
    CHECK(lim.reserve().at == start);
    const auto second = lim.reserve();
    CHECK(second.at == start + 100ms);
    const auto third = lim.reserve();
    CHECK(third.at == start + 200ms);
    CHECK(lim.reserve().at == manual_clock::time_point::max());  // two wait already: full
    CHECK_FALSE(lim.try_acquire());                              // nobody jumps the queue
    CHECK(lim.status().remaining == 0);
    CHECK(lim.cancel_reservation(1, third));  // the last: its place goes back
    CHECK(lim.reserve().at == start + 200ms);
    // From the middle of the queue: dropped, its place lost (the one behind leaves on time).
    CHECK(lim.cancel_reservation(1, second));
    CHECK(lim.reserve().at == manual_clock::time_point::max());
    clock.advance(300ms);
    CHECK(lim.try_acquire());
    CHECK(lim.refused() == 3);
  }
  SECTION("settling a call's real cost") {
    leaky lim({.rate = 10, .queue = 5}, clock_ref{&clock});
    const auto start = clock.now();
    REQUIRE(lim.try_acquire(1));  // leaves now; the next at +100 ms
    CHECK(lim.settle(1, 4));      // it cost 4: the next at +400 ms
    const auto next = lim.reserve();
    CHECK(next.at == start + 400ms);     // (the next after it at +500 ms)
    CHECK(lim.settle(1, 0, next.slot));  // that one cost nothing: +400 ms again
    const auto again = lim.reserve();
    CHECK(again.at == start + 400ms);
    CHECK(lim.attempted() == Approx(1 + 3 + 1 + 1));
    clock.advance(10s);  // idle: a refund makes no room before now
    CHECK(lim.settle(5, 0, again.slot));
    CHECK(lim.reserve().at == clock.now());
    CHECK(lim.reserve().at == clock.now() + 100ms);
    CHECK_FALSE(lim.settle(1, -2));
    CHECK_FALSE(lim.settle(std::numeric_limits<double>::infinity(), 1));
  }
}

TEST_CASE("window limiters and the leaky bucket are exact under concurrent callers",
          "[limit][algorithms]") {
  manual_clock clock;  // frozen: exactly the limit is admitted
  fixed_window fixed({.limit = 1000, .window = 60s}, clock_ref{&clock});
  sliding_log log({.limit = 1000, .window = 60s}, clock_ref{&clock});
  sliding_window counter({.limit = 1000, .window = 60s, .sub_windows = 6}, clock_ref{&clock});
  leaky shaper({.rate = 1, .queue = 0}, clock_ref{&clock});
  std::atomic<int> admitted[4]{};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) {
        admitted[0] += fixed.try_acquire() ? 1 : 0;
        admitted[1] += log.try_acquire() ? 1 : 0;
        admitted[2] += counter.try_acquire() ? 1 : 0;
        admitted[3] += shaper.try_acquire() ? 1 : 0;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  CHECK(admitted[0] == 1000);
  CHECK(admitted[1] == 1000);
  CHECK(admitted[2] == 1000);
  CHECK(admitted[3] == 1);
  CHECK(fixed.attempted() == 20000);
  CHECK(fixed.refused() == 19000);
}

TEST_CASE("window limiters: limits, rates, status and waits", "[limit][algorithms]") {
  manual_clock clock;
  clock.advance(30s);  // halfway through the first minute
  fixed_window fixed({.limit = 3, .window = 60s}, clock_ref{&clock});
  for (int i = 0; i < 3; ++i)
    REQUIRE(fixed.try_acquire());
  auto r = fixed.try_acquire();
  CHECK_FALSE(r);
  CHECK(r.retry_after == 30s);  // the window's end
  CHECK(fixed.status().limit == 3);
  CHECK(fixed.status().remaining == 0);
  CHECK(fixed.status().reset == 30s);
  CHECK(fixed.try_acquire(4).retry_after == manual_clock::duration::max());  // never fits

  fixed.set_rate(0.1);  // per second: 6 per minute
  CHECK(fixed.limit() == 6);
  CHECK(fixed.rate() == Approx(0.1));
  CHECK(fixed.try_acquire(3));
  fixed.set_limit(-1);
  CHECK(fixed.try_acquire(1e6));
  CHECK(fixed.status().limit == -1);
  fixed.set_limit(0);
  CHECK(fixed.try_acquire().retry_after == manual_clock::duration::max());

  sliding_log log({.limit = 2, .window = 10s}, clock_ref{&clock});
  REQUIRE(log.try_acquire());
  clock.advance(4s);
  REQUIRE(log.try_acquire());
  CHECK(log.try_acquire().retry_after == 6s);  // the oldest leaves at 10 s
  CHECK(log.status().reset == 10s);            // the newest at 14 s

  SECTION("a blocked window limiter's wait ends on stop, taking nothing") {
    doorman::basic_sliding_log_limiter<std::chrono::steady_clock> blocked({.limit = 0});
    CHECK_FALSE(stopped_wait([&](std::stop_token t) { return blocked.wait(1, t); },
                             [&] { return blocked.delayed() > 0; }));
    blocked.set_limit(1);
    CHECK(blocked.try_acquire());
  }
  SECTION("a wait is admitted once the window moves on") {
    doorman::basic_fixed_window_limiter<std::chrono::steady_clock> real(
        {.limit = 1, .window = 20ms});
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 4; ++i)
      REQUIRE(real.wait());
    CHECK(std::chrono::steady_clock::now() - start >= 40ms);  // three window edges, at least
    CHECK_FALSE(real.wait(2));                                // never fits
  }
}

TEST_CASE("keyed limiter: a limiter per key, idle keys evicted, a flood of keys bounded",
          "[limit][algorithms]") {
  manual_clock clock;
  doorman::keyed_limiter<fixed_window> per_key({.limit = 2, .window = 60s}, {.max_keys = 64},
                                               clock_ref{&clock});
  CHECK(per_key.try_acquire("alice"));
  CHECK(per_key.try_acquire("alice"));
  CHECK_FALSE(per_key.try_acquire("alice"));
  CHECK(per_key.try_acquire("bob"));
  CHECK(per_key.status("bob").remaining == 1);
  // Keys from outside count by their first 256 bytes: a megabyte key costs no more.
  CHECK(per_key.try_acquire(std::string(1 << 20, 'k') + "1"));
  CHECK(per_key.try_acquire(std::string(1 << 20, 'k') + "2"));
  CHECK_FALSE(per_key.try_acquire(std::string(1 << 20, 'k') + "3"));  // the same 256 bytes

  // A flood of fresh keys: memory stays bounded, and alice's limit is not reset.
  for (int i = 0; i < 10000; ++i)
    (void)per_key.try_acquire(fmt::format("flood-{}", i));
  CHECK(per_key.size() <= per_key.max_keys());
  CHECK(per_key.max_keys() == 64);
  CHECK(per_key.overflowed() > 0);
  CHECK_FALSE(per_key.try_acquire("alice"));
  const auto full = per_key.memory_bytes();

  // A minute on, every key is idle: new keys evict them (and alice starts afresh, losslessly).
  clock.advance(61s);
  for (int i = 0; i < 32; ++i)
    (void)per_key.try_acquire(fmt::format("later-{}", i));
  CHECK(per_key.evicted() > 0);
  CHECK(per_key.size() <= per_key.max_keys());
  CHECK(per_key.memory_bytes() <= full + 64 * 16);
  CHECK(per_key.try_acquire("alice"));

  SECTION("a key held by a caller is not evicted") {
    clock.advance(61s);
    auto held = per_key.get("carol");
    REQUIRE(per_key.size() <= per_key.max_keys());
    REQUIRE(held->try_acquire(2));
    clock.advance(120s);
    for (int i = 0; i < 10000; ++i)
      (void)per_key.try_acquire(fmt::format("again-{}", i));
    CHECK(per_key.get("carol") == held);
  }
}

// ---- Rules ----

namespace {

using test_rules = doorman::basic_rule_set<
    doorman::local_algorithm_list<doorman::fixed_window_algorithm<clock_ref>>>;

const char* const rules_text = R"({
  "domain": "api",
  "descriptors": [
    {"key": "remote_address", "rate_limit": {"unit": "minute", "requests_per_unit": 3}},
    {"key": "remote_address", "value": "10.0.0.1",
     "rate_limit": {"unit": "minute", "requests_per_unit": 1}},
    {"key": "plan", "value": "free",
     "descriptors": [
       {"key": "user", "mode": "soft", "overage": 0.5,
        "rate_limit": {"unit": "second", "requests_per_unit": 2}},
       {"key": "report", "mode": "elastic", "max_delay": 2,
        "rate_limit": {"unit": "second", "requests_per_unit": 1}}]},
    {"key": "path", "value": "/beta", "shadow": true,
     "rate_limit": {"unit": "hour", "requests_per_unit": 1}}]})";

}  // namespace

TEST_CASE("rules: descriptors match by key and value, else by key, each value its own limit",
          "[limit][rules]") {
  manual_clock clock;
  auto rules = test_rules::parse(nlohmann::json::parse(rules_text), {}, clock_ref{&clock});
  using doorman::rule_code;
  const auto ip = [](std::string a) {
    return std::vector<doorman::descriptor>{{{"remote_address", std::move(a)}}};
  };
  for (int i = 0; i < 3; ++i) {
    const auto v = rules.check("api", ip("10.0.0.2"));
    CHECK(v.code == rule_code::ok);
    CHECK(v.limit == 3);
    CHECK(v.remaining == 2 - i);
    CHECK(v.key == "api/remote_address=10.0.0.2");
  }
  auto v = rules.check("api", ip("10.0.0.2"));
  CHECK(v.code == rule_code::refused);
  CHECK(v.remaining == 0);
  CHECK(v.retry_after == 60s);
  CHECK(v.reset == 60s);
  CHECK(rules.check("api", ip("10.0.0.3")).code == rule_code::ok);  // another value
  CHECK(rules.check("api", ip("10.0.0.1")).code == rule_code::ok);  // the value's own rule
  CHECK(rules.check("api", ip("10.0.0.1")).code == rule_code::refused);
  CHECK(rules.check("api", {{{"plan", "paid"}, {"user", "ann"}}}).limit == -1);  // no rule
  CHECK(rules.check("api", {{{"plan", "free"}}}).limit == -1);  // no rate_limit there
  CHECK(rules.check("other", ip("10.0.0.2")).code == rule_code::ok);
  CHECK(rules.check("other", ip("10.0.0.2")).limit == -1);

  SECTION("several descriptors: the worst code, the fewest remaining") {
    clock.advance(60s);
    v = rules.check("api", {{{"remote_address", "10.0.0.9"}}, {{"remote_address", "10.0.0.1"}}});
    CHECK(v.code == rule_code::ok);
    CHECK(v.limit == 1);
    CHECK(v.remaining == 0);
    v = rules.check("api", {{{"remote_address", "10.0.0.9"}}, {{"remote_address", "10.0.0.1"}}});
    CHECK(v.code == rule_code::refused);
    CHECK(v.key == "api/remote_address=10.0.0.1");
  }
  SECTION("soft: served beyond the limit up to the overage, then refused") {
    const std::vector<doorman::descriptor> ann{{{"plan", "free"}, {"user", "ann"}}};
    CHECK(rules.check("api", ann).code == rule_code::ok);
    CHECK(rules.check("api", ann).code == rule_code::ok);
    v = rules.check("api", ann);
    CHECK(v.code == rule_code::soft);  // 3 of 2 (+50%)
    CHECK(v.remaining == 0);
    CHECK(v.limit == 2);
    CHECK(rules.check("api", ann).code == rule_code::refused);
  }
  SECTION("elastic: come back within max_delay, then admitted") {
    const std::vector<doorman::descriptor> rep{{{"plan", "free"}, {"report", "q3"}}};
    CHECK(rules.check("api", rep).code == rule_code::ok);
    v = rules.check("api", rep);
    CHECK(v.code == rule_code::delay);
    CHECK(v.retry_after == 1s);
    clock.advance(v.retry_after);
    CHECK(rules.check("api", rep).code == rule_code::ok);
  }
  SECTION("shadow: counted and reported, never refused") {
    const std::vector<doorman::descriptor> beta{{{"path", "/beta"}}};
    for (int i = 0; i < 5; ++i)
      CHECK(rules.check("api", beta).code == rule_code::ok);
    CHECK(rules.check("api", beta).shadow_exceeded);
    CHECK(rules.shadow_exceeded() == 5);
  }
  SECTION("compiled to resource templates") {
    const auto t = rules.resource_templates();
    REQUIRE(t.size() == 5);
    CHECK(t[0].identifier_glob == "api/remote_address=*");
    CHECK(t[0].capacity == Approx(3.0 / 60));
    CHECK(t[2].identifier_glob == "api/plan=free/user=*");
    CHECK(t[2].capacity == Approx(2));
    CHECK(doorman::glob_match(t[2].identifier_glob, "api/plan=free/user=ann"));
  }
}

TEST_CASE(
    "rules: envoyproxy/ratelimit's fields: unlimited, replaces, shadow_mode, wildcards, "
    "per-descriptor statuses and limits",
    "[limit][rules]") {
  manual_clock clock;
  auto rules = test_rules::parse(nlohmann::json::parse(R"({"domain": "rl", "descriptors": [
    {"key": "user", "rate_limit": {"unit": "minute", "requests_per_unit": 2, "name": "per-user"}},
    {"key": "user", "value": "robot", "rate_limit": {"unlimited": true}},
    {"key": "path", "value": "/api/*/items",
     "rate_limit": {"unit": "second", "requests_per_unit": 1}},
    {"key": "file", "value": "docs/*", "share_threshold": true,
     "rate_limit": {"unit": "second", "requests_per_unit": 1}},
    {"key": "vip", "detailed_metric": true,
     "rate_limit": {"unit": "MINUTE", "requests_per_unit": 5, "replaces": [{"name": "per-user"}]}},
    {"key": "beta", "shadow_mode": true, "rate_limit": {"unit": "hour", "requests_per_unit": 0}}
  ]})"),
                                 {}, clock_ref{&clock});
  using doorman::descriptor_check;
  using doorman::rule_code;
  const auto one = [&](std::string k, std::string v, double hits = 1) {
    return rules.check_each("rl", {descriptor_check{{{std::move(k), std::move(v)}}, hits}})[0];
  };
  // Per-descriptor statuses: limit, name, what is left, until when.
  auto s = one("user", "ann");
  CHECK(s.code == rule_code::ok);
  CHECK(s.limit == 2);
  CHECK(s.name == "per-user");
  CHECK(s.remaining == 1);
  CHECK(s.window == std::chrono::minutes(1));
  CHECK(one("user", "ann", 2).code == rule_code::refused);  // hits count: 1 + 2 > 2
  // More hits than the limit, in a window with nothing counted yet: refused, and the answer
  // still says when the window ends (never a reset of 0 with a refusal).
  s = one("user", "cat", 3);
  CHECK(s.code == rule_code::refused);
  CHECK(s.reset > std::chrono::seconds(0));
  CHECK(s.reset <= std::chrono::minutes(1));

  // unlimited: matched, never limited, not counted.
  for (int i = 0; i < 10; ++i) {
    s = one("user", "robot");
    CHECK(s.unlimited);
    CHECK(s.limit < 0);
    CHECK(s.code == rule_code::ok);
  }

  // A wildcard value: its pieces in order; each matching value has its own count...
  CHECK(one("path", "/api/v1/items").code == rule_code::ok);
  CHECK(one("path", "/api/v1/items").code == rule_code::refused);
  CHECK(one("path", "/api/v2/items").code == rule_code::ok);
  CHECK(one("path", "/api/v2/other").limit < 0);  // no match: no limit
  // ...unless share_threshold: every matching value shares one.
  CHECK(one("file", "docs/a.pdf").code == rule_code::ok);
  CHECK(one("file", "docs/b.csv").code == rule_code::refused);

  // replaces: a request that matches both only counts the replacing rule.
  const auto both = rules.check_each(
      "rl", {descriptor_check{{{"user", "bob"}}}, descriptor_check{{{"vip", "bob"}}}});
  CHECK(both[0].replaced);
  CHECK(both[0].limit < 0);
  CHECK(both[1].limit == 5);
  CHECK(one("user", "bob").remaining == 1);  // bob's per-user count was left alone

  // shadow_mode: reported, never refused.
  s = one("beta", "x");
  CHECK(s.shadow);
  CHECK(s.code == rule_code::refused);
  CHECK(rules.check("rl", {{{"beta", "x"}}}).code == rule_code::ok);
  CHECK(rules.check("rl", {{{"beta", "x"}}}).shadow_exceeded);

  // quota_mode: a quota rule over its limit refuses only when every quota rule is.
  {
    auto q = test_rules::parse(nlohmann::json::parse(R"({"domain": "q", "descriptors": [
      {"key": "m", "quota_mode": true, "rate_limit": {"unit": "minute", "requests_per_unit": 1}},
      {"key": "d", "quota_mode": true, "rate_limit": {"unit": "day", "requests_per_unit": 2}},
      {"key": "h", "rate_limit": {"unit": "hour", "requests_per_unit": 5}}]})"),
                               {}, clock_ref{&clock});
    const std::vector<doorman::descriptor> md = {{{"m", "x"}}, {{"d", "x"}}};
    CHECK(q.check("q", md).code == rule_code::ok);
    auto each = q.check_each("q", {descriptor_check{{{"m", "x"}}}, descriptor_check{{{"d", "x"}}}});
    CHECK(each[0].quota);
    CHECK(doorman::over_limit(each[0]));
    CHECK_FALSE(doorman::quota_refuses(each));
    CHECK_FALSE(doorman::request_refused(each));
    CHECK(q.check("q", md).code == rule_code::refused);  // both over now
    const std::vector<doorman::descriptor> alone = {{{"h", "x"}}};
    CHECK(q.check("q", alone).code == rule_code::ok);
  }

  // A descriptor's own limit replaces its rule's, and applies where no rule matches.
  const doorman::limit_override three{3, std::chrono::seconds(60)};
  for (int i = 0; i < 3; ++i)
    CHECK(rules.check_each("rl", {descriptor_check{{{"nobody", "x"}}, 1, three}})[0].code ==
          rule_code::ok);
  s = rules.check_each("rl", {descriptor_check{{{"nobody", "x"}}, 1, three}})[0];
  CHECK(s.code == rule_code::refused);
  CHECK(s.limit == 3);

  // The window passes: counts start again.
  clock.advance(61s);
  CHECK(one("user", "ann").remaining == 1);
}

TEST_CASE("rules: ratelimit's fields are checked, naming the field", "[limit][rules]") {
  const auto error_of = [](const char* text) {
    try {
      (void)doorman::rule_set::parse(nlohmann::json::parse(text));
    } catch (const doorman::config_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of(R"({"domain": "d", "descriptors": [{"key": "k",
      "rate_limit": {"unlimited": true, "unit": "second", "requests_per_unit": 1}}]})"),
             Catch::Contains("descriptors[0].rate_limit.unit: must not be given with unlimited"));
  CHECK_THAT(error_of(R"({"domain": "d", "descriptors": [{"key": "k", "value": "v",
      "share_threshold": true, "rate_limit": {"unit": "second", "requests_per_unit": 1}}]})"),
             Catch::Contains("descriptors[0].share_threshold: needs a wildcard value"));
  CHECK_THAT(error_of(R"({"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"unit":
      "second", "requests_per_unit": 1, "name": "a", "replaces": [{"name": "a"}]}}]})"),
             Catch::Contains("descriptors[0].rate_limit.replaces[0].name: must not be the rule's"));
  CHECK_THAT(error_of(R"({"domain": "d", "descriptors": [{"key": "k", "quota_mode": 1}]})"),
             Catch::Contains("descriptors[0].quota_mode: must be a boolean"));
  CHECK_THAT(error_of(R"({"domain": "d", "descriptors": [{"key": "k",
      "rate_limit": {"unit": "fortnight", "requests_per_unit": 1}}]})"),
             Catch::Contains("one of second, minute, hour, day, week, month, year"));
}

TEST_CASE("rules: distinct descriptors never share a count, however long their values",
          "[limit][rules]") {
  manual_clock clock;
  auto rules = test_rules::parse(nlohmann::json::parse(R"({"domain": "d", "descriptors": [
      {"key": "a", "descriptors": [
        {"key": "b", "rate_limit": {"unit": "minute", "requests_per_unit": 1}}]}]})"),
                                 {}, clock_ref{&clock});
  using doorman::rule_code;
  const auto pair = [](std::string a, std::string b) {
    return std::vector<doorman::descriptor>{{{"a", std::move(a)}, {"b", std::move(b)}}};
  };
  // Values that would join to the same text: two keys, two counts.
  auto v = rules.check("d", pair("x/b=x", "x"));
  CHECK(v.code == rule_code::ok);
  CHECK(v.key == "d/a=x%2Fb%3Dx/b=x");
  v = rules.check("d", pair("x", "x/b=x"));
  CHECK(v.code == rule_code::ok);
  CHECK(v.key == "d/a=x/b=x%2Fb%3Dx");
  CHECK(rules.check("d", pair("x", "x/b=x")).code == rule_code::refused);
  CHECK(rules.check("d", pair("%", "")).code == rule_code::ok);
  CHECK(rules.check("d", pair("%25", "")).code == rule_code::ok);
  // A long first value does not make the nested values share one count.
  const std::string long_a(300, 'a');
  CHECK(rules.check("d", pair(long_a, "1")).code == rule_code::ok);
  CHECK(rules.check("d", pair(long_a, "2")).code == rule_code::ok);
  CHECK(rules.check("d", pair(long_a, "2")).code == rule_code::refused);
  // Values that differ past byte 256 count apart (the key holds a hash of a long value).
  const std::string cut(256, 'c');
  CHECK(rules.check("d", pair(cut + "1", "z")).code == rule_code::ok);
  CHECK(rules.check("d", pair(cut + "2", "z")).code == rule_code::ok);
  CHECK(rules.check("d", pair(cut + "2", "z")).code == rule_code::refused);
  CHECK(rules.check("d", pair(cut.substr(1) + "1", "z")).code == rule_code::ok);
  CHECK(rules.check("d", pair(cut + "1", "z")).key.size() == 1 + 3 + 256 + 17 + 4);
  // So do descriptors' own limits of domains that differ past byte 256.
  const doorman::limit_override one{1, std::chrono::seconds(60)};
  const std::string domain(300, 'd');
  const auto own = [&](const std::string& dom) {
    return rules.check_each(dom, {doorman::descriptor_check{{{"k", "v"}}, 1, one}})[0].code;
  };
  CHECK(own(domain + "1") == rule_code::ok);
  CHECK(own(domain + "2") == rule_code::ok);
  CHECK(own(domain + "2") == rule_code::refused);
  // A short key is a resource id that the rule's template matches.
  const auto t = rules.resource_templates();
  REQUIRE(t.size() == 1);
  CHECK(t[0].identifier_glob == "d/a=*/b=*");
  CHECK(doorman::glob_match(t[0].identifier_glob, rules.check("d", pair("x/y", "?*")).key));
}

TEST_CASE("rules: a limiter's decision folds into a verdict, and the verdict into headers",
          "[limit][rules]") {
  using doorman::rule_code;
  using ns = std::chrono::nanoseconds;
  doorman::rule_verdict v;
  CHECK(doorman::rate_limit_headers(v).empty());  // no limit decided, nothing refused
  // An admitted request: the limiter's status fills the headers.
  doorman::combine(v, doorman::basic_acquire_result<ns>{true, {}}, {10, 4.5, 1500ms});
  CHECK(v.code == rule_code::ok);
  CHECK(doorman::rate_limit_headers(v) == std::vector<std::string>{"RateLimit-Limit: 10",
                                                                   "RateLimit-Remaining: 4",
                                                                   "RateLimit-Reset: 2"});
  // A limiter with more left does not replace the one with fewer.
  doorman::combine(v, doorman::basic_acquire_result<ns>{true, {}}, {100, 50, 1s});
  CHECK(v.limit == 10);
  // A refusal refuses, with its retry delay rounded up to whole seconds.
  doorman::combine(v, doorman::basic_acquire_result<ns>{false, 2100ms}, {10, 0, 3s});
  CHECK(v.code == rule_code::refused);
  CHECK(v.remaining == 0);
  CHECK(doorman::rate_limit_headers(v) ==
        std::vector<std::string>{"RateLimit-Limit: 10", "RateLimit-Remaining: 0",
                                 "RateLimit-Reset: 3", "Retry-After: 3"});
  // A limiter blocked at rate 0 ("never"): come back in 1 s, when a refresh may have come.
  doorman::rule_verdict blocked;
  doorman::combine(blocked, doorman::basic_acquire_result<ns>{false, ns::max()}, {0, 0, ns::max()});
  CHECK(blocked.retry_after == 1s);
  CHECK(doorman::rate_limit_headers(blocked).back() == "Retry-After: 1");
  CHECK(doorman::rate_limit_headers(blocked)[2] == "RateLimit-Reset: 1");
  // A delay asks to come back too, never sooner than 1 s.
  doorman::rule_verdict delayed;
  delayed.code = rule_code::delay;
  delayed.retry_after = 10ms;
  CHECK(doorman::rate_limit_headers(delayed) == std::vector<std::string>{"Retry-After: 1"});
}

TEST_CASE("rules: a bad rule file is refused with the field named", "[limit][rules]") {
  const auto problem = [](const char* text) -> std::string {
    try {
      (void)doorman::rule_set::parse(nlohmann::json::parse(text));
    } catch (const doorman::config_error& e) {
      return e.what();
    }
    return "accepted";
  };
  CHECK(problem(R"({"domain": "a", "descriptors": [{"key": "k", "rate_limit": {"unit": "fortnight",
        "requests_per_unit": 1}}]})") ==
        "descriptors[0].rate_limit.unit: must be one of second, minute, hour, day, week, month, "
        "year");
  CHECK(problem(R"({"domain": "a", "descriptors": [{"key": "k", "rate_limit": {"unit": "second",
        "requests_per_unit": -1}}]})") ==
        "descriptors[0].rate_limit.requests_per_unit: must be between 0 and 1e9");
  CHECK(problem(R"({"domain": "a", "descriptors": [{"key": "k", "mode": "strict"}]})") ==
        "descriptors[0].mode: must be one of hard, soft, elastic");
  CHECK(problem(R"({"domain": "a", "descriptors": [{"key": "k", "limit": 3}]})") ==
        "descriptors[0].limit: unknown field");
  CHECK(problem(
            R"({"domain": "a", "descriptors": [{"key": "k", "descriptors": [{"value": "v"}]}]})") ==
        "descriptors[0].descriptors[0].key: is required");
  CHECK(problem(R"({"domain": "a", "descriptors": [{"key": "k"}, {"key": "k"}]})") ==
        "descriptors[1]: repeats the key and value of an earlier descriptor");
  CHECK(problem(R"([{"domain": "a"}, {"domain": "a"}])") == "[1].domain: is already defined");
  CHECK(problem(R"({"domain": "a", "descriptors": [{"key": "k", "max_delay": 1e9}]})") ==
        "descriptors[0].max_delay: must be between 0 and 3600");
  std::string deep = R"({"key": "k"})";
  for (int i = 0; i < 8; ++i)
    deep = R"({"key": "k", "descriptors": [)" + deep + "]}";
  CHECK(problem((R"({"domain": "a", "descriptors": [)" + deep + "]}").c_str())
            .ends_with("nests too deep (at most 8 levels)"));
  CHECK(problem(R"({"domain": "a", "descriptors": []})") == "accepted");
  CHECK(problem(R"({"domain": "a", "algorithm": "gcra", "descriptors": []})") ==
        "algorithm: must be one of sliding_window, fixed_window, sliding_log");
  CHECK(problem(R"({"domain": "a", "algorithm": 7, "descriptors": []})") ==
        "algorithm: must be a string");
}

namespace {

// A user's own local algorithm, added without editing the library: a fixed window that
// admits nothing above half its limit (the name's storage must outlive the program's use).
inline constexpr doorman::rate_algorithm half_name{"half_window"};
template <class Clock>
class half_window_limiter : public doorman::basic_fixed_window_limiter<Clock, 1> {
 public:
  using base = doorman::basic_fixed_window_limiter<Clock, 1>;
  explicit half_window_limiter(doorman::window_limiter_options o, Clock clock = Clock{})
      : base(halved(o), clock) {}

 private:
  static doorman::window_limiter_options halved(doorman::window_limiter_options o) {
    if (o.limit > 0) o.limit = std::floor(o.limit / 2);
    return o;
  }
};
template <class Clock>
using half_window = doorman::window_algorithm<half_name, half_window_limiter<Clock>>;

}  // namespace

TEST_CASE("local algorithms are an open list: a user's joins by name, in a limiter and in rules",
          "[limit][algorithms][rules]") {
  static_assert(doorman::local_algorithm<doorman::gcra_algorithm>);
  static_assert(doorman::local_algorithm<doorman::leaky_bucket_algorithm>);
  static_assert(doorman::local_algorithm<half_window<doorman::coarse_clock>>);
  static_assert(!doorman::local_rate_limiter<int>);

  SECTION("the built-in names, and a run-time choice among them") {
    CHECK(doorman::default_local_algorithms::names.size() == 5);
    CHECK(doorman::rate_algorithm_from("sliding_log") == doorman::rate_algorithm::sliding_log);
    CHECK_FALSE(doorman::rate_algorithm_from("half_window"));
    doorman::any_rate_limiter gcra({}, 10);
    CHECK(gcra.algorithm() == doorman::rate_algorithm::gcra);
    CHECK(gcra.reserves());
    doorman::any_rate_limiter log({.algorithm = doorman::rate_algorithm::sliding_log}, 10);
    CHECK(log.algorithm() == doorman::rate_algorithm::sliding_log);
    CHECK_FALSE(log.reserves());
    CHECK_THROWS_AS(doorman::any_rate_limiter({.algorithm = half_name}, 10), std::invalid_argument);
  }
  SECTION("a user's algorithm in a run-time limiter") {
    using mine = doorman::default_local_algorithms::with<half_window<doorman::coarse_clock>>;
    CHECK(mine::find("half_window") == half_name);
    doorman::basic_any_rate_limiter<mine> lim(
        {.algorithm = half_name, .window = std::chrono::seconds(3600)}, 10.0 / 3600);
    CHECK(lim.algorithm() == half_name);
    CHECK_FALSE(lim.reserves());
    int admitted = 0;
    while (lim.try_acquire(1) && admitted < 100)
      ++admitted;
    CHECK(admitted == 5);  // half of 10 per hour
  }
  SECTION("a user's algorithm in the built-in limiter, behind one virtual call") {
    using mine = doorman::default_local_algorithms::with<half_window<doorman::coarse_clock>>;
    const auto other = &doorman::make_other_rate_limiter<mine>;
    doorman::any_rate_limiter lim(
        {.algorithm = half_name, .window = std::chrono::seconds(3600), .other = other},
        10.0 / 3600);
    CHECK(lim.algorithm() == half_name);
    CHECK_FALSE(lim.reserves());
    CHECK(lim.reserve(1).at == doorman::any_rate_limiter::time_point::max());
    auto* half = lim.get_if<half_window_limiter<doorman::coarse_clock>>();
    REQUIRE(half != nullptr);
    CHECK(lim.get_if<doorman::rate_limiter>() == nullptr);
    CHECK(half->status().limit == Approx(5));
    int admitted = 0;
    while (lim.try_acquire(1) && admitted < 100)
      ++admitted;
    CHECK(admitted == 5);
    CHECK(lim.attempted() == Approx(6));
    CHECK(lim.refused() == 1);
    CHECK_FALSE(lim.settle(1, 2));  // a window algorithm cannot settle: nothing changes
    CHECK(lim.attempted() == Approx(6));
    lim.set_rate(20.0 / 3600);  // a new lease reaches the limiter behind the pointer
    CHECK(lim.rate() == Approx(20.0 / 3600));
    CHECK(lim.status().limit == Approx(20));  // (this one halves only its first options)
    // A built-in name with the maker set runs the built-in limiter itself.
    doorman::any_rate_limiter gcra({.other = other}, 10);
    CHECK(gcra.get_if<doorman::rate_limiter>() != nullptr);
    CHECK(gcra.reserves());
    // A name in neither list throws once, naming it.
    static constexpr doorman::rate_algorithm nowhere{"nowhere"};
    CHECK_THROWS_WITH(doorman::any_rate_limiter({.algorithm = nowhere, .other = other}, 10),
                      "unknown local rate algorithm: nowhere");
  }
  SECTION("a rules domain chooses its algorithm, a user's included") {
    using list = doorman::rule_algorithms<clock_ref>::with<half_window<clock_ref>>;
    manual_clock clock;
    clock.advance(59s);  // one second before a minute's edge
    auto rules = doorman::basic_rule_set<list>::parse(nlohmann::json::parse(R"([
      {"domain": "sliding", "descriptors": [{"key": "k", "rate_limit": {"unit": "minute", "requests_per_unit": 10}}]},
      {"domain": "fixed", "algorithm": "fixed_window", "descriptors": [{"key": "k", "rate_limit": {"unit": "minute", "requests_per_unit": 10}}]},
      {"domain": "half", "algorithm": "half_window", "descriptors": [{"key": "k", "rate_limit": {"unit": "minute", "requests_per_unit": 10}}]}])"),
                                                      {}, clock_ref{&clock});
    const std::vector<doorman::descriptor> k{{{"k", "v"}}};
    const auto admitted = [&](const char* domain) {
      int n = 0;
      while (rules.check(domain, k).code == doorman::rule_code::ok && n < 100)
        ++n;
      return n;
    };
    CHECK(admitted("sliding") == 10);
    CHECK(admitted("fixed") == 10);
    CHECK(admitted("half") == 5);
    clock.advance(2s);  // past the edge: a fixed window starts again, a sliding one remembers
    CHECK(admitted("fixed") == 10);
    CHECK(admitted("sliding") < 3);
    CHECK(admitted("half") == 5);
  }
}

TEST_CASE("rate limiter status: the burst, what is left of it, and when it is whole again",
          "[limit][algorithms]") {
  manual_clock clock;
  test_limiter lim({.rate = 1, .burst = 3}, clock_ref{&clock});
  CHECK(lim.status().remaining == 3);
  REQUIRE(lim.try_acquire(2));
  auto s = lim.status();
  CHECK(s.limit == 3);
  CHECK(s.remaining == Approx(1));
  CHECK(s.reset == 2s);
  clock.advance(1500ms);
  CHECK(lim.status().remaining == Approx(2.5));
  CHECK(lim.memory_span() == 3s);  // after 3 s unused it is as new
  lim.set_rate(-1);
  CHECK(lim.status().limit == -1);
  lim.set_rate(0);
  CHECK(lim.status().reset == std::chrono::nanoseconds::max());
}
