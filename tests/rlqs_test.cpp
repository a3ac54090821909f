// Envoy's rate limit quota service (docs/envoy.md): one stream's machine
// (protocol/rlqs_session.hpp) driving the engine with a manual clock: reports become wants,
// leases become assignments that converge to the fair shares and never add up to more than the
// capacity, hostile reports name their field and change nothing, idle buckets are abandoned.

#include <catch2/catch.hpp>

#include <doorman/protocol/rlqs_session.hpp>

#include "core_support.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace {

using namespace doorman_test;  // NOLINT: the tests' own helpers (core_support.hpp)
using doorman::rlqs::bucket_action;
using doorman::rlqs::quota;
using doorman::rlqs::session;
using doorman::rlqs::usage_reports;

// Buckets of domain "res" named by one key: `res/name=...`, 300 a second, FAIR_SHARE, a 60 s
// lease refreshed every 5 s, learning mode for `learning` seconds; `first`: templates before it.
doorman::resource_repository rlqs_repo(int learning = 0, const std::string& first = "") {
  return doorman::resource_repository::parse(R"({"resources": [)" + first + R"(
    {"identifier_glob": "res/name=*", "capacity": 300,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 5,
                   "learning_mode_duration": )" +
                                             std::to_string(learning) + R"(}},
    {"identifier_glob": "*", "capacity": 0,
     "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60, "refresh_interval": 16}}]})");
}

double seconds(const manual_clock& c) {
  return doorman::to_seconds(c.now().time_since_epoch());
}

// A session's first ask of its buckets (wanting nothing: is it a budget?), answered.
void probe(session& s, engine_t& e, const manual_clock& c, double now) {
  auto ask = s.ask(now);
  REQUIRE(ask);
  for (const auto& r : ask->resources)
    CHECK(r.wants == 0);
  CHECK(ask->reports_spend);
  auto a = e.get_capacity(*ask, c.now());
  REQUIRE(a);
  auto pushed = s.answer(a.value(), now);
  REQUIRE(pushed);
  CHECK(pushed.value().empty());  // nothing to push from it
}

// One Envoy: a stream's session, its bucket's last assignment, and the engine it asks.
struct envoy {
  session s;
  std::optional<quota> assigned;
  std::int64_t ttl = 0;
  double assigned_at = 0;  // when it took its last assignment

  // Reports `rate` requests a second over `elapsed` seconds (all allowed up to its quota).
  void report(double rate, double elapsed, double now) {
    const double allowed = assigned ? std::min(rate, assigned->rate()) : rate;
    auto ok = s.report({"res",
                        {{{{"name", "api"}},
                          elapsed,
                          static_cast<std::uint64_t>(allowed * elapsed),
                          static_cast<std::uint64_t>((rate - allowed) * elapsed)}}},
                       now);
    REQUIRE(ok);
  }

  // Asks the engine when due, and takes what it pushes.
  void drive(engine_t& e, manual_clock& c) {
    auto ask = s.ask(seconds(c));
    if (!ask) return;
    auto a = e.get_capacity(*ask, c.now());
    REQUIRE(a);
    auto pushed = s.answer(a.value(), seconds(c));
    REQUIRE(pushed);
    for (const bucket_action& act : pushed.value()) {
      REQUIRE(act.assign);
      assigned = act.assign;
      ttl = act.ttl;
      assigned_at = seconds(c);
    }
  }

  [[nodiscard]] double rate() const { return assigned ? assigned->rate() : 0; }
};

}  // namespace

TEST_CASE("rlqs: a quota is a token bucket a minute, rounded down, with a second's burst",
          "[rlqs]") {
  using doorman::rlqs::quota_of;
  CHECK(quota_of(1234.9) == quota{74'094, 1234});
  CHECK(quota_of(100) == quota{6000, 100});
  CHECK(quota_of(33.34) == quota{2000, 33});
  CHECK(quota_of(0.5) == quota{30, 1});  // a token every 2 s, one at a time
  CHECK(quota_of(1.0 / 60) == quota{1, 1});
  CHECK(quota_of(0.016) == quota{});  // under one a minute: DENY_ALL
  CHECK(quota_of(1e12) == quota{4'294'967'295, 71'582'788});
  CHECK(quota_of(0) == quota{});
  CHECK(quota_of(-1) == quota{});
  CHECK(quota_of(std::numeric_limits<double>::quiet_NaN()) == quota{});
  // Never more than the rate, burst included (a second's worth).
  for (const double r : {0.02, 0.7, 1.0, 59.99, 100.0, 12'345.678}) {
    INFO(r);
    CHECK(quota_of(r).rate() <= r);
    CHECK(static_cast<double>(quota_of(r).burst) <= std::max(1.0, r));
  }
}

TEST_CASE("rlqs: Envoy's times in whole seconds: a new bucket's report of 0, and cut-down ones",
          "[rlqs]") {
  fixture f(rlqs_repo());
  session s("rlqs/a/1", {});
  const auto usage = [](double elapsed, std::uint64_t allowed) {
    return usage_reports{"res", {{{{"name", "api"}}, elapsed, allowed, 0}}};
  };
  // Envoy reports a bucket at once when it first sees it: one request, no time. Known, but no
  // rate to ask for yet.
  REQUIRE(s.report(usage(0, 1), 0));
  CHECK(s.buckets() == 1);
  CHECK_FALSE(s.ask(0));
  CHECK_FALSE(s.ask(1000));
  // Its next, 1.9 s later, says 1 s (cut down): the time between the two here is taken.
  REQUIRE(s.report(usage(1, 190), 1.9));
  probe(s, f.engine, f.clock, 1.9);
  auto ask = s.ask(1.9);
  REQUIRE(ask);
  CHECK(ask->resources.at(0).wants == Approx(100));
  s.failed(1.9);
  // Reports every half second say 0 s each: still a rate.
  REQUIRE(s.report(usage(0, 60), 2.4));
  ask = s.ask(3);
  REQUIRE(ask);
  CHECK(ask->resources.at(0).wants == Approx(120));
  s.failed(3);
  // A report soon after another cannot make its time shorter than it says (nor longer by a
  // second or more).
  REQUIRE(s.report(usage(5, 500), 2.5));
  CHECK(s.ask(4).value().resources.at(0).wants == Approx(100));
  s.failed(4);
  REQUIRE(s.report(usage(2, 300), 40));
  CHECK(s.ask(40).value().resources.at(0).wants == Approx(100));
  s.failed(40);
  // A time with a fraction is taken as said.
  REQUIRE(s.report(usage(0.25, 50), 41));
  CHECK(s.ask(41).value().resources.at(0).wants == Approx(200));
}

TEST_CASE("rlqs: uneven Envoys converge to their fair shares, never over the capacity", "[rlqs]") {
  fixture f(rlqs_repo());
  std::vector<envoy> envoys;
  const std::vector<double> demand{40, 200, 400};  // a second
  for (std::size_t i = 0; i < demand.size(); ++i)
    envoys.push_back({session("rlqs/10.0.0." + std::to_string(i) + "/1", {}), {}, 0});
  for (int step = 0; step < 60; ++step) {  // a minute, reports every second
    f.clock.advance(1s);
    double sum = 0;
    for (std::size_t i = 0; i < envoys.size(); ++i) {
      envoys[i].report(demand[i], 1, seconds(f.clock));
      envoys[i].drive(f.engine, f.clock);
      sum += envoys[i].rate();
    }
    CHECK(sum <= 300);
  }
  // 40 wanted is granted whole; the rest (260) shared evenly between the two that want more.
  CHECK(envoys[0].rate() == Approx(40).margin(1));
  CHECK(envoys[1].rate() == Approx(130).margin(1));
  CHECK(envoys[2].rate() == Approx(130).margin(1));
  CHECK(envoys[2].ttl > 0);
  CHECK(envoys[2].ttl <= 60);
  // A stream that ends releases nothing: its Envoy enforces its assignment until its time to
  // live (`ttl`), and the others take its share only once that has run out.
  const double ended_rate = envoys[2].rate();
  const double enforced_until = envoys[2].assigned_at + static_cast<double>(envoys[2].ttl);
  envoys.pop_back();
  bool moved_early = false;
  for (int step = 0; step < 80; ++step) {
    f.clock.advance(1s);
    double sum = seconds(f.clock) < enforced_until ? ended_rate : 0;
    for (std::size_t i = 0; i < envoys.size(); ++i) {
      envoys[i].report(demand[i], 1, seconds(f.clock));
      envoys[i].drive(f.engine, f.clock);
      sum += envoys[i].rate();
    }
    CHECK(sum <= 300 + 1e-9);
    moved_early = moved_early || (seconds(f.clock) < enforced_until && envoys[1].rate() > 131);
  }
  CHECK_FALSE(moved_early);
  CHECK(envoys[1].rate() == Approx(200).margin(1));
}

TEST_CASE("rlqs: an assignment is pushed when it changes or half its time is gone", "[rlqs]") {
  fixture f(rlqs_repo());
  session s("rlqs/a/1", {});
  const auto usage = [](double elapsed) {  // 100 a second
    return usage_reports{
        "res", {{{{"name", "api"}}, elapsed, static_cast<std::uint64_t>(100 * elapsed), 0}}};
  };
  REQUIRE(s.report(usage(1), seconds(f.clock)));
  probe(s, f.engine, f.clock, seconds(f.clock));
  auto ask = s.ask(seconds(f.clock));
  REQUIRE(ask);
  CHECK(ask->resources.at(0).resource_id == "res/name=api");
  CHECK(ask->resources.at(0).wants == 100);
  CHECK_FALSE(s.ask(seconds(f.clock)));  // one ask at a time
  auto a = f.engine.get_capacity(*ask, f.clock.now());
  REQUIRE(a);
  auto pushed = s.answer(a.value(), seconds(f.clock));
  REQUIRE(pushed);
  REQUIRE(pushed.value().size() == 1);
  CHECK(pushed.value()[0].assign == quota{6000, 100});
  CHECK(pushed.value()[0].ttl == 60);
  CHECK(s.next_wake() == Approx(seconds(f.clock) + 5));
  // The same grant again: nothing to push until half the lease is gone.
  int pushes = 0;
  for (int i = 0; i < 12; ++i) {
    f.clock.advance(5s);
    REQUIRE(s.report(usage(5), seconds(f.clock)));
    auto again = s.ask(seconds(f.clock));
    REQUIRE(again);
    auto b = f.engine.get_capacity(*again, f.clock.now());
    REQUIRE(b);
    auto p = s.answer(b.value(), seconds(f.clock));
    REQUIRE(p);
    pushes += static_cast<int>(p.value().size());
    if (i == 3) CHECK(pushes == 0);
  }
  CHECK(pushes == 2);  // at 30 s and 60 s: Envoy's copy never runs out
  // A node that is not master ends the stream.
  doorman::capacity_response not_master;
  (void)s.ask(seconds(f.clock) + 100);
  CHECK_FALSE(s.answer(not_master, seconds(f.clock)));
}

TEST_CASE("rlqs: a hostile report names its field and changes nothing", "[rlqs][bounds]") {
  fixture f(rlqs_repo());
  session s("rlqs/a/1", {.max_buckets = 2, .max_usages = 3});
  REQUIRE(s.report({"res", {{{{"name", "api"}}, 1, 5, 0}}}, 0));
  probe(s, f.engine, f.clock, 0);
  const auto ask = s.ask(0);
  REQUIRE(ask);
  s.failed(0);
  struct hostile {
    usage_reports r;
    std::string says;
  };
  const std::string long_value(300, 'x');
  const std::vector<hostile> cases{
      {{"other", {{{{"a", "b"}}, 1, 1, 0}}}, "domain: must not change on a stream (\"res\")"},
      {{"res", {}}, "bucket_quota_usages: must not be empty"},
      {{"res", {{{{"a", "b"}}, 1, 1, 0}, {{{"a", "c"}}, 1, 1, 0}, {{{"a", "d"}}, 1, 1, 0}}},
       "bucket_quota_usages: would make more than 2 buckets on one stream"},
      {{"res", std::vector<doorman::rlqs::bucket_usage>(4, {{{"a", "b"}}, 1, 1, 0})},
       "bucket_quota_usages: must hold at most 3 usages"},
      {{"res", {{{}, 1, 1, 0}}}, "bucket_quota_usages[0].bucket_id.bucket: must not be empty"},
      {{"res", {{{{"a", "b"}}, 1, 1, 0}, {{{"", "b"}}, 1, 1, 0}}},
       "bucket_quota_usages[1].bucket_id.bucket: keys and values must not be empty"},
      {{"res", {{{{"a", long_value}}, 1, 1, 0}}},
       "bucket_quota_usages[0].bucket_id: makes a resource id longer than 256 bytes"},
      {{"res", {{{{"a", "b"}}, -1, 1, 0}}},
       "bucket_quota_usages[0].time_elapsed: must be at least 0 and at most 1e6 seconds"},
      {{"res", {{{{"a", "b"}}, std::numeric_limits<double>::quiet_NaN(), 1, 0}}},
       "bucket_quota_usages[0].time_elapsed: must be at least 0"},
      {{"res", {{{{"a", "b"}}, 2e6, 1, 0}}},
       "bucket_quota_usages[0].time_elapsed: must be at least 0 and at most 1e6 seconds"},
      {{"res", {{{{"a", "b"}}, 1, ~std::uint64_t{0}, 1}}},
       "bucket_quota_usages[0].num_requests_allowed: with num_requests_denied, at most 1e15"},
  };
  double t = 1;
  for (const auto& c : cases) {
    INFO(c.says);
    t += 2;
    auto r = s.report(c.r, t);
    REQUIRE_FALSE(r);
    CHECK_THAT(r.error().message, Contains(c.says));
    CHECK(s.buckets() == 1);
    CHECK(s.domain() == "res");
    const auto again = s.ask(t);
    REQUIRE(again);
    CHECK(again->resources.at(0).wants == 5);  // the last good report's
    s.failed(t);
  }
  // One new bucket twice in a message is one bucket: within the bound of 2.
  REQUIRE(s.report({"res", {{{{"a", "b"}}, 1, 1, 0}, {{{"a", "b"}}, 1, 1, 0}}}, t + 2));
  CHECK(s.buckets() == 2);
  session fresh("rlqs/b/1", {});
  auto r = fresh.report({"", {{{{"a", "b"}}, 1, 1, 0}}}, 0);
  REQUIRE_FALSE(r);
  CHECK(r.error().message == "domain: must be given in the stream's first message");
  CHECK(fresh.buckets() == 0);
  // The most a report can say, over a microsecond: wants within the engine's bound.
  session big("rlqs/c/1", {});
  REQUIRE(big.report({"res", {{{{"name", "api"}}, 1e-6, 1'000'000'000'000'000, 0}}}, 0));
  probe(big, f.engine, f.clock, 0);
  CHECK(big.ask(0).value().resources.at(0).wants == 1e15);
}

TEST_CASE("rlqs: a bucket not reported is abandoned and released, and release_all names them all",
          "[rlqs]") {
  session s("rlqs/a/1", {.abandon_after = 30});
  REQUIRE(s.report({"res", {{{{"name", "a"}}, 1, 5, 0}, {{{"name", "b"}}, 1, 5, 0}}}, 0));
  CHECK(s.release_all().resources == std::vector<std::string>{"res/name=a", "res/name=b"});
  REQUIRE(s.report({"", {{{{"name", "a"}}, 20, 5, 0}}}, 20));
  auto [none, kept] = s.expire(29);
  CHECK(none.empty());
  auto [actions, ids] = s.expire(30);
  REQUIRE(actions.size() == 1);
  CHECK(actions[0].bucket == doorman::rlqs::bucket_id{{"name", "b"}});
  CHECK_FALSE(actions[0].assign);
  CHECK(ids == std::vector<std::string>{"res/name=b"});
  CHECK(s.buckets() == 1);
  CHECK(s.release_all().client_id == "rlqs/a/1");
  // Keys in any order are one bucket.
  REQUIRE(s.report({"", {{{{"z", "1"}, {"a", "2"}}, 1, 5, 0}, {{{"a", "2"}, {"z", "1"}}, 1, 5, 0}}},
                   21));
  CHECK(s.buckets() == 2);
  CHECK(s.release_all().resources.front() == "res/a=2/z=1");
}

TEST_CASE("rlqs: a first assignment of 0 waits a lease length (a new master's learning mode)",
          "[rlqs]") {
  // A new master learning for 30 s: it grants a newcomer nothing meanwhile. Envoy keeps the
  // assignment the old master gave it (valid for up to a lease length): nothing replaces it.
  fixture f(rlqs_repo(30, R"(
    {"identifier_glob": "res/name=off", "capacity": 0,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 5,
                   "learning_mode_duration": 0}},)"));
  envoy e{session("rlqs/a/1", {}), doorman::rlqs::quota_of(100), 60};  // from the old master
  for (int step = 0; step < 28; ++step) {
    f.clock.advance(1s);
    e.report(100, 1, seconds(f.clock));
    e.drive(f.engine, f.clock);
    CHECK(e.assigned == doorman::rlqs::quota_of(100));
  }
  for (int step = 0; step < 10; ++step) {
    f.clock.advance(1s);
    e.report(100, 1, seconds(f.clock));
    e.drive(f.engine, f.clock);
  }
  CHECK(e.assigned == doorman::rlqs::quota_of(100));  // now granted by the new master
  CHECK(e.ttl == 60);
  // A bucket with nothing to give (capacity 0): its 0 goes out once it is a lease length old.
  session off("rlqs/b/1", {});
  int pushed_at = -1;
  for (int step = 0; step < 70 && pushed_at < 0; ++step) {
    f.clock.advance(1s);
    REQUIRE(off.report({"res", {{{{"name", "off"}}, 1, 0, 10}}}, seconds(f.clock)));
    auto ask = off.ask(seconds(f.clock));
    if (!ask) continue;
    auto a = f.engine.get_capacity(*ask, f.clock.now());
    REQUIRE(a);
    auto p = off.answer(a.value(), seconds(f.clock));
    REQUIRE(p);
    if (!p.value().empty()) {
      CHECK(p.value()[0].assign == quota{});  // DENY_ALL
      pushed_at = step;
    }
  }
  CHECK(pushed_at >= 59);
  CHECK(pushed_at <= 65);
}

namespace {

// Buckets `res/name=*` as a budget of 1000 a minute (UTC minutes; the clock starts on one).
doorman::resource_repository rlqs_budget_repo() {
  return doorman::resource_repository::parse(R"({"resources": [
    {"identifier_glob": "res/name=*", "capacity": 1000, "budget": {"window": "minute"},
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 5}},
    {"identifier_glob": "*", "capacity": 0,
     "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60, "refresh_interval": 16}}]})");
}

// One Envoy on a budget bucket: the token bucket of its last block (or DENY_ALL, or nothing:
// its no_assignment_behavior, here DENY_ALL, as docs/envoy.md says to set for a budget).
struct budget_envoy {
  session s;
  double tokens = 0;
  double allowed = 0, denied = 0;  // since the last report
  double spent = 0;                // in all
  int blocks = 0, deny_all = 0;
  std::optional<doorman::rlqs::block> last;

  void take(const bucket_action& a) {
    if (a.spend) {
      if (last != a.spend) tokens = a.spend->tokens;  // a new block: a new, full bucket
      last = a.spend;
      ++blocks;
    } else if (a.assign && a.assign->per_minute == 0) {
      tokens = 0;
      ++deny_all;
    }
  }

  // `n` requests, through its bucket.
  void serve(double n) {
    const double a = std::min(n, std::floor(tokens));
    tokens -= a;
    allowed += a;
    denied += n - a;
    spent += a;
  }

  void report(double elapsed, double now) {
    REQUIRE(s.report({"res",
                      {{{{"name", "api"}},
                        elapsed,
                        static_cast<std::uint64_t>(allowed),
                        static_cast<std::uint64_t>(denied)}}},
                     now));
    allowed = denied = 0;
  }

  // What the session asks and draws, answered by the engine.
  void drive(engine_t& e, manual_clock& c) {
    const double now = seconds(c);
    const auto take_all = [&](const auto& answer, auto settle) {
      REQUIRE(answer);
      auto pushed = settle(answer.value());
      REQUIRE(pushed);
      for (const auto& act : pushed.value())
        take(act);
    };
    if (auto ask = s.ask(now)) {
      take_all(e.get_capacity(*ask, c.now()), [&](const auto& a) { return s.answer(a, now); });
    }
    if (auto draw = s.draw(now)) {
      take_all(e.count_hits(*draw, c.now()), [&](const auto& a) { return s.drawn(a, now); });
    }
  }
};

}  // namespace

TEST_CASE("rlqs: a budget bucket is spent in blocks drawn from the budget, never over it",
          "[rlqs][budget]") {
  // The clock's zero is the start of a UTC minute.
  doorman::engine_options o;
  o.utc_offset = 1764374400;
  fixture f(rlqs_budget_repo(), o);
  std::vector<budget_envoy> envoys;
  const std::vector<double> demand{10, 30};  // a second: 2400 a minute against 1000
  for (std::size_t i = 0; i < demand.size(); ++i)
    envoys.push_back(
        {session("rlqs/10.0.0." + std::to_string(i) + "/1", {}), 0, 0, 0, 0, 0, 0, std::nullopt});
  double window_spent = 0, root_spent = 0;
  for (int step = 0; step < 3 * 60; ++step) {  // three minutes: three windows
    if (step % 60 == 0 && step > 0) {
      // Each minute the budget is spent, less what blocks held when the next replaced them.
      INFO("minute " << step / 60);
      CHECK(window_spent >= 850);
    }
    if (step % 60 == 0) window_spent = 0;
    f.clock.advance(1s);
    for (std::size_t i = 0; i < envoys.size(); ++i) {
      auto& e = envoys[i];
      const double before = e.spent;
      e.serve(demand[i]);
      window_spent += e.spent - before;
      e.report(step == 0 ? 0 : 1, seconds(f.clock));
      e.drive(f.engine, f.clock);
    }
    INFO("step " << step);
    CHECK(window_spent <= 1000);  // never over the minute's budget
    if (step == 178) {            // the root counts every block as spent at once
      const auto st = f.engine.status({"res/name=api"}, f.clock.now());
      REQUIRE(st);
      REQUIRE(st.value().resources.at(0).budget);
      root_spent = st.value().resources.at(0).budget->spent;
    }
  }
  CHECK(window_spent >= 850);  // the third minute
  // Both Envoys had blocks, in proportion to their demand.
  CHECK(envoys[0].blocks >= 3);
  CHECK(envoys[1].blocks >= 3);
  CHECK(envoys[1].spent > 2 * envoys[0].spent);
  CHECK(root_spent >= window_spent);
  CHECK(root_spent <= 1000);
  // A newcomer once the minute's budget is gone: DENY_ALL until the minute ends.
  budget_envoy late{session("rlqs/10.0.0.9/1", {}), 0, 0, 0, 0, 0, 0, std::nullopt};
  for (int step = 0; step < 55; ++step) {  // the fourth minute, its budget gone by 50 s
    f.clock.advance(1s);
    for (std::size_t i = 0; i < envoys.size(); ++i) {
      envoys[i].serve(demand[i]);
      envoys[i].report(1, seconds(f.clock));
      envoys[i].drive(f.engine, f.clock);
    }
    if (step < 50) continue;
    late.serve(20);
    late.report(step == 50 ? 0 : 1, seconds(f.clock));
    late.drive(f.engine, f.clock);
  }
  CHECK(late.blocks == 0);
  CHECK(late.deny_all == 1);
  CHECK(late.spent == 0);
  // However much an Envoy wants, a block is at most a tenth of the window's budget: the first
  // one included.
  fixture g(rlqs_budget_repo(), o);
  budget_envoy greedy{session("rlqs/10.0.0.8/1", {}), 0, 0, 0, 0, 0, 0, std::nullopt};
  for (int step = 0; step < 3; ++step) {
    g.clock.advance(1s);
    greedy.serve(1e9);
    greedy.report(1, seconds(g.clock));
    greedy.drive(g.engine, g.clock);
  }
  REQUIRE(greedy.last);
  CHECK(greedy.last->tokens == 100);
}

TEST_CASE("rlqs: distinct buckets are distinct resources, whatever their keys and values hold",
          "[rlqs][bounds]") {
  using doorman::rlqs::bucket_id;
  // A value taken from a request header cannot name another bucket ...
  const auto joined = session::resource_of("edge", {{"name", "api/tier=free"}});
  const auto apart = session::resource_of("edge", {{"name", "api"}, {"tier", "free"}});
  CHECK(apart == "edge/name=api/tier=free");
  CHECK(joined == "edge/name=api%2Ftier%3Dfree");
  CHECK(session::resource_of("a/b=c", {{"x", "1"}}) != session::resource_of("a", {{"b", "c/x=1"}}));
  // ... nor another template: `res/name=*` does not cross the escaped `/`.
  fixture f(rlqs_repo(0, R"({"identifier_glob": "res/name=api/tier=free", "capacity": 1000,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 5}},)"));
  session s("rlqs/a/1", {});
  REQUIRE(s.report({"res", {{{{"name", "api/tier=free"}}, 1, 5, 0}}}, 0));
  probe(s, f.engine, f.clock, 0);
  const auto st = f.engine.status({"res/name=api%2Ftier%3Dfree"}, f.clock.now());
  REQUIRE(st);
  CHECK(st.value().resources.at(0).capacity == 300);  // (1000 when joined unescaped)

  // Over random buckets drawn from the bytes that could join them: equal ids, equal buckets.
  doorman::detail::splitmix64 draw(7);
  const std::string alphabet = "a=/%2F3D";
  const auto text = [&] {
    std::string t(1 + draw.next() % 4, 'a');
    for (auto& ch : t)
      ch = alphabet[draw.next() % alphabet.size()];
    return t;
  };
  std::map<std::string, std::pair<std::string, bucket_id>> seen;
  for (int i = 0; i < 20000; ++i) {
    const std::string domain = text();
    bucket_id id;
    for (std::uint64_t k = 0, n = 1 + draw.next() % 3; k < n; ++k)
      id.emplace_back(text(), text());
    std::sort(id.begin(), id.end());
    const auto rid = session::resource_of(domain, id);
    const auto [at, fresh] = seen.try_emplace(rid, domain, id);
    INFO(rid);
    REQUIRE((fresh || at->second == std::pair(domain, id)));
  }
}
