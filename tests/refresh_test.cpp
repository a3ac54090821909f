// The refresh schedule shared by the client state and the upstream.

#include "core_support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (core_support.hpp)

TEST_CASE("retries come, and calls end, within half the time left on a lease",
          "[core][upstream][client]") {
  manual_clock clock;
  const doorman::seconds configured(5);
  // The call timeout: the configured one, but a call to a hung peer ends while half the
  // lease is left, so that the next address is asked before the lease runs out.
  const auto check_timeout = [&](doorman::seconds t, manual_clock::time_point expiry) {
    if (clock.now() >= expiry) {
      CHECK(t.count() == configured.count());  // no lease left to protect
    } else {
      const double half = doorman::to_seconds(expiry - clock.now()) / 2;
      CHECK(t.count() <= std::max(half, 0.25) + 1e-9);
      CHECK(t.count() == Approx(std::min(5.0, std::max(half, 0.25))));
    }
  };
  SECTION("upstream") {
    engine_t parent(repo_for("FAIR_SHARE", 100));
    parent.set_mastership(true, "root", clock.now());
    doorman::engine_options o;
    o.is_root = false;
    engine_t node(repo_for("FAIR_SHARE", 100), o);
    node.set_mastership(true, "node", clock.now());
    (void)node.get_capacity({"a", {{"res", 0, 10, std::nullopt}}}, clock.now());
    upstream_t up({.server_id = "node"});
    CHECK(up.call_timeout(clock.now(), configured).count() == 5);  // no lease yet
    auto req = up.make_request(node, clock.now());
    auto resp = parent.get_server_capacity(req, clock.now());
    REQUIRE(resp);
    up.on_reply(node, resp.value(), clock.now());
    const auto expiry = node.parent_lease("res")->expiry;
    for (int i = 0; i < 8; ++i) {  // the backoff alone would reach 15 s
      clock.set(up.next_request(node));
      check_timeout(up.call_timeout(clock.now(), configured), expiry);
      (void)up.make_request(node, clock.now());
      up.on_reply(doorman::errc::timed_out, clock.now());
      if (clock.now() < expiry) {
        CHECK(up.next_request(node) - clock.now() <=
              std::max<manual_clock::duration>((expiry - clock.now()) / 2, 500ms));
      }
    }
  }
  SECTION("client state") {
    doorman::basic_client_state<manual_clock> state({.client_id = "c"});
    state.add("res", {.wants = 10});
    CHECK(state.call_timeout(clock.now(), configured).count() == 5);  // no lease yet
    (void)state.make_request(clock.now());
    doorman::capacity_response resp;
    resp.mastership = {true, "root"};
    resp.resources.push_back({"res", {10, 20, 16}, 1});
    state.on_reply(resp, clock.now());
    const auto expiry = clock.now() + 20s;
    for (int i = 0; i < 8; ++i) {
      clock.set(state.next_request());
      check_timeout(state.call_timeout(clock.now(), configured), expiry);
      (void)state.make_request(clock.now());
      state.on_reply(doorman::errc::timed_out, clock.now());
      if (clock.now() < expiry) {
        CHECK(state.next_request() - clock.now() <=
              std::max<manual_clock::duration>((expiry - clock.now()) / 2, 1s));
      }
    }
  }
}

TEST_CASE("refresh schedule: floor, idle interval, news, backoff and events", "[core][refresh]") {
  using schedule_t = doorman::refresh_schedule<manual_clock::time_point>;
  manual_clock clock;
  schedule_t s({.minimum_interval = doorman::seconds(1),
                .idle_interval = doorman::seconds(16),
                .backoff = {.initial = doorman::seconds(2), .maximum = doorman::seconds(8)},
                .seed = 7});
  const auto t0 = clock.now();
  CHECK(s.due(t0, false));  // nothing sent yet
  s.sent(t0);
  CHECK(s.in_flight());
  CHECK_FALSE(s.due(t0 + 1h, true));  // never while in flight

  SECTION("an answer sets the next request; the floor bounds it below") {
    CHECK(s.answered(t0, 5) == doorman::refresh_event::reached);
    CHECK(s.next_request(false) == t0 + 5s);
    s.sent(t0 + 5s);
    CHECK(s.answered(t0 + 5s, 0.25) == doorman::refresh_event::none);
    CHECK(s.next_request(false) == t0 + 6s);  // the floor, not 0.25 s
    s.sent(t0 + 6s);
    (void)s.answered(t0 + 6s, std::numeric_limits<double>::infinity());
    CHECK(s.next_request(false) == t0 + 22s);  // nothing said: the idle interval
  }
  SECTION("news makes the next request due once the floor has passed") {
    (void)s.answered(t0, 10);
    CHECK(s.next_request(true) == t0 + 1s);
    CHECK_FALSE(s.due(t0 + 500ms, true));
    CHECK(s.due(t0 + 1s, true));
    CHECK_FALSE(s.due(t0 + 1s, false));
  }
  SECTION("failures back off with jitter, within half the time left on a lease") {
    (void)s.answered(t0, 10);
    s.sent(t0 + 10s);
    const auto far = manual_clock::time_point::max();
    CHECK(s.failed(t0 + 10s, far) == doorman::refresh_event::lost);
    const auto first = s.next_request(false) - (t0 + 10s);
    CHECK(first >= 1s);  // [1/2, 1] of the 2 s step
    CHECK(first <= 2s);
    CHECK(s.next_request(true) == s.next_request(false));  // news does not cut a backoff
    for (int i = 0; i < 5; ++i) {
      s.sent(s.next_request(false));
      CHECK(s.failed(s.next_request(false), far) == doorman::refresh_event::none);
    }
    CHECK(s.failures() == 6);
    const auto now = t0 + 100s;
    s.sent(now);
    (void)s.failed(now, now + 6s);  // a lease ends in 6 s: retry within 3 s
    CHECK(s.next_request(false) - now <= 3s);
    CHECK(s.next_request(false) - now >= 1s);  // but never below the floor
    s.sent(now + 3s);
    CHECK(s.answered(now + 3s, 5) == doorman::refresh_event::regained);
    CHECK(s.connected());
    CHECK(s.failures() == 0);
  }
  SECTION("a failure before any answer is no loss") {
    CHECK(s.failed(t0, manual_clock::time_point::max()) == doorman::refresh_event::none);
    CHECK_FALSE(s.connected());
  }
}

TEST_CASE("the client state and the upstream say what to do next", "[core][refresh]") {
  manual_clock clock;
  doorman::basic_client_state<manual_clock> state({.client_id = "c"});
  CHECK_FALSE(state.next(clock.now()).send);  // no resources: nothing to ask
  state.add("res", {.wants = 10});
  REQUIRE(state.next(clock.now()).send);
  (void)state.make_request(clock.now());
  CHECK(state.next(clock.now()).at == manual_clock::time_point::max());  // in flight
  doorman::capacity_response resp;
  resp.mastership = {true, "root"};
  resp.resources.push_back({"res", {10, 20, 4}, 1});
  CHECK(state.on_reply(resp, clock.now()) == doorman::refresh_event::reached);
  const auto step = state.next(clock.now());
  CHECK_FALSE(step.send);
  CHECK(step.at == clock.now() + 4s);
  // A non-master's answer is a failure.
  clock.advance(4s);
  (void)state.make_request(clock.now());
  resp.mastership = {false, "elsewhere"};
  CHECK(state.on_reply(resp, clock.now()) == doorman::refresh_event::lost);
  CHECK(state.failures() == 1);

  engine_t node(repo_for("FAIR_SHARE", 0), [] {
    doorman::engine_options o;
    o.is_root = false;
    return o;
  }());
  node.set_mastership(true, "node", clock.now());
  upstream_t up({.server_id = "node"});
  REQUIRE(up.next(node, clock.now()).send);
  (void)up.make_request(node, clock.now());
  CHECK_FALSE(up.next(node, clock.now()).send);
  CHECK(up.on_reply(doorman::errc::timed_out, clock.now()) == doorman::refresh_event::none);
  CHECK(up.next(node, clock.now()).at > clock.now());
  (void)node.get_capacity({"a", {{"res", 0, 10, std::nullopt}}}, clock.now());
  CHECK(up.has_news(node));  // a new resource; after a failure it still waits out the backoff
}

TEST_CASE(
    "failover: a call's first attempt waits the backoff out only until halfway to its deadline",
    "[core][failover]") {
  using namespace std::chrono_literals;
  using tp = doorman::manual_clock::time_point;
  doorman::failover<tp> f({"a:1"}, {.backoff = {doorman::seconds(4), doorman::seconds(4)}});
  const tp t0 = tp{} + 100s;
  f.failed(t0, doorman::failure::unreachable);  // backing off 2-4 s
  REQUIRE(f.connect_at() >= t0 + 2s);
  // A call of 1 s (half the lease left) at t0: its first attempt at 0.5 s, in time.
  CHECK(f.attempt_at(t0, t0 + 1s, true) == t0 + 500ms);
  // After it: the backoff, which is past the deadline.
  CHECK(f.attempt_at(t0, t0 + 1s, false) == tp::max());
  // A call long enough for the backoff waits it out.
  CHECK(f.attempt_at(t0, t0 + 10s, true) == f.connect_at());
  SECTION("a retry delay the peer asked for is kept") {
    f.failed(t0, doorman::failure::refused, doorman::seconds(0.8));
    CHECK(f.attempt_at(t0, t0 + 1s, true) == t0 + 800ms);
    CHECK(f.attempt_at(t0, t0 + 500ms, true) == tp::max());
  }
}

TEST_CASE("failover: every failure moves on, a failed round backs off, only answers reset",
          "[core][failover]") {
  using namespace std::chrono_literals;
  using tp = doorman::manual_clock::time_point;
  doorman::failover<tp> f({"a:1", "b:1"}, {.backoff = {doorman::seconds(1), doorman::seconds(8)}});
  const tp t0{};
  CHECK(f.current() == "a:1");
  CHECK(f.connect_at() <= t0);

  // a fails: b at once; b fails too: the round is over, wait ½–1 of 1 s.
  f.failed(t0, doorman::failure::unreachable);
  CHECK(f.current() == "b:1");
  CHECK(f.connect_at() == t0);
  f.failed(t0, doorman::failure::closed);  // accepted, then closed before any answer
  CHECK(f.current() == "a:1");
  CHECK(f.connect_at() >= t0 + 500ms);
  CHECK(f.connect_at() <= t0 + 1s);
  // A connection that comes up is not yet a success: closing it is a failure of the next
  // round, which waits 1–2 s.
  f.failed(t0 + 1s, doorman::failure::closed);
  f.failed(t0 + 1s, doorman::failure::closed);
  CHECK(f.connect_at() >= t0 + 2s);
  CHECK(f.connect_at() <= t0 + 3s);
  CHECK(f.failures() == 4);
  // Capped at 8 s however long it goes on.
  for (int i = 0; i < 40; ++i)
    f.failed(t0, doorman::failure::unreachable);
  CHECK(f.connect_at() <= t0 + 8s);
  CHECK(f.connect_at() >= t0 + 4s);

  // An answer resets the rounds; the next failure moves on at once.
  f.answered();
  CHECK(f.failures() == 0);
  const std::string before = f.current();
  f.failed(t0 + 60s, doorman::failure::hung);  // a call's deadline passed: leave that peer
  CHECK(f.current() != before);
  CHECK(f.connect_at() == t0 + 60s);
  CHECK(f.last_failure() == doorman::failure::hung);

  SECTION("a refusal's retry delay is a floor") {
    f.failed(t0 + 60s, doorman::failure::refused, doorman::seconds(3));
    CHECK(f.connect_at() >= t0 + 63s);
    // and an absurd one is capped at 300 s
    f.failed(t0 + 60s, doorman::failure::refused, doorman::seconds(1e9));
    CHECK(f.connect_at() == t0 + 60s + 300s);
  }
  SECTION("a refusal's delay stays a floor for every failure until an answer comes") {
    // A call that connects just before its deadline times out before the next refusal
    // arrives: that failure must not reconnect sooner than the refusal asked.
    f.failed(t0 + 60s, doorman::failure::refused, doorman::seconds(3));
    f.failed(t0 + 63s, doorman::failure::hung);
    CHECK(f.connect_at() >= t0 + 66s);
    f.failed(t0 + 66s, doorman::failure::unreachable);
    CHECK(f.connect_at() >= t0 + 69s);
    f.answered();
    f.failed(t0 + 70s, doorman::failure::hung);
    CHECK(f.connect_at() == t0 + 70s);
  }
  SECTION("a redirect goes to the master at once, adding it when unknown") {
    f.redirected("c:1", t0 + 61s);
    CHECK(f.current() == "c:1");
    CHECK(f.addresses().size() == 3);
    CHECK(f.connect_at() == t0 + 61s);
    f.redirected("a:1", t0 + 61s);
    CHECK(f.current() == "a:1");
    CHECK(f.addresses().size() == 3);
  }
  SECTION("a non-master that names no master is kept when the others hung") {
    const std::string standby = f.current();
    f.no_master(t0 + 60s);
    CHECK(f.failures() == 2);
    CHECK(f.current() == standby);              // the other hung: this one may be the next master
    CHECK(f.connect_at() >= t0 + 60s + 500ms);  // the round's backoff all the same
  }
  SECTION("a non-master that names no master is left for one that has not failed otherwise") {
    f.answered();
    const std::string cut = f.current();
    f.no_master(t0 + 60s);
    CHECK(f.current() != cut);  // it may be cut from the election while another is master
    f.no_master(t0 + 61s);
    CHECK(f.current() == cut);  // both know none: asked in turn, backing off per round
    f.failed(t0 + 62s, doorman::failure::unreachable);
    CHECK(f.current() != cut);
    f.no_master(t0 + 63s);
    CHECK(f.current() != cut);  // the unreachable one is not tried again for it
    f.answered();
    f.no_master(t0 + 64s);
    CHECK(f.current() == cut);  // an answer forgets what failed
  }
}

// ---------------------------------------------------------------------------------------------
// The call machine (doorman/core/call.hpp), driven by plain calls as its drivers drive it.

namespace {

using call_tp = doorman::manual_clock::time_point;
using call_kind = doorman::call_action<call_tp>::kind;

doorman::failover<call_tp> two_tasks() {
  return doorman::failover<call_tp>({"a:1", "b:1"},
                                    {.backoff = {doorman::seconds(1), doorman::seconds(8)}});
}

}  // namespace

namespace {

void lost_and_sent_again(doorman::failover<call_tp>& route, doorman::call_machine<call_tp>& m) {
  using namespace std::chrono_literals;
  const call_tp t0{};
  auto a = m.resume(t0, true);  // connected
  REQUIRE(a.what == call_kind::send);
  a = m.lost(t0 + 1s, "connection lost");  // before the answer: again, at the same address
  REQUIRE(a.what == call_kind::connect);
  CHECK(route.current() == "a:1");
  a = m.resume(t0 + 1s, true);
  REQUIRE(a.what == call_kind::send);
  a = m.answered(t0 + 1s, false);
  CHECK(a.what == call_kind::done);
  CHECK(route.failures() == 0);
  // Lost after the deadline: the call fails with the driver's words.
  doorman::call_machine<call_tp> late(route, t0, t0 + 5s, {});
  a = late.lost(t0 + 5s, "connection lost (last problem: reset)");
  CHECK(a.what == call_kind::fail);
  CHECK(a.error == doorman::errc::unreachable);
  CHECK(a.message == "connection lost (last problem: reset)");
  // Lost before the deadline, with no attempt that fits before it: the machine's words, then
  // the driver's, apart (they once ran together: "in a rowconnection lost").
  route.failed(t0 + 6s, doorman::failure::unreachable);
  route.failed(t0 + 6s, doorman::failure::unreachable);  // a round: backing off 1-2 s
  doorman::call_machine<call_tp> short_one(route, t0 + 6s, t0 + 6s + 500ms, {});
  a = short_one.lost(t0 + 6s + 100ms, "connection lost");
  REQUIRE(a.what == call_kind::wait);  // (a call's first attempt may cut the backoff short)
  a = short_one.resume(a.until, false);
  REQUIRE(a.what == call_kind::connect);
  a = short_one.lost(t0 + 6s + 300ms, "connection lost");
  REQUIRE(a.what == call_kind::fail);
  CHECK(a.message ==
        "no task of the position answered; backing off after 2 failures in a row; "
        "connection lost");
}

void connects_fail(doorman::failover<call_tp>& route, doorman::call_machine<call_tp>& m) {
  using namespace std::chrono_literals;
  const call_tp t0{};
  auto a = m.connect_failed(t0);  // a:1 refused: b:1 at once
  REQUIRE(a.what == call_kind::connect);
  CHECK(route.current() == "b:1");
  a = m.connect_failed(t0);  // the round failed: wait ½–1 s
  REQUIRE(a.what == call_kind::wait);
  CHECK(a.until >= t0 + 500ms);
  CHECK(a.until <= t0 + 1s);
  a = m.resume(a.until, false);
  REQUIRE(a.what == call_kind::connect);
  // An attempt that says nothing of the peer (cut short, cancelled) is not counted.
  const auto failures = route.failures();
  a = m.connect_failed(t0 + 1s, false);
  CHECK(route.failures() == failures);
  REQUIRE(a.what == call_kind::connect);
  // Failures until no attempt fits before the deadline: unreachable, with the driver's words.
  for (int k = 0; k < 30 && a.what != call_kind::fail; ++k) {
    a = a.what == call_kind::wait ? m.resume(a.until, false)
                                  : m.connect_failed(t0 + 2s, true, "; x");
  }
  REQUIRE(a.what == call_kind::fail);
  CHECK(a.error == doorman::errc::unreachable);
  CHECK_THAT(a.message, Catch::StartsWith("no task of the position answered; backing off after"));
  CHECK_THAT(a.message, Catch::EndsWith("; x"));
  // A new call's first attempt may cut a backoff short: halfway to its deadline at the latest.
  const call_tp t1 = t0 + 2s;
  doorman::call_machine<call_tp> next(route, t1, t1 + 2s, {});
  a = next.resume(t1, false);
  if (a.what == call_kind::wait) CHECK(a.until <= t1 + 1s);
}

}  // namespace

TEST_CASE("call machine: connect and send, reconnect, move on, back off, give up", "[core][call]") {
  using namespace std::chrono_literals;
  auto route = two_tasks();
  const call_tp t0{};
  doorman::call_machine<call_tp> m(route, t0, t0 + 5s, {});
  auto a = m.resume(t0, false);
  REQUIRE(a.what == call_kind::connect);
  SECTION("a lost connection is connected and the call sent again") {
    lost_and_sent_again(route, m);
  }
  SECTION("failed connects move through the addresses, back off, then give up") {
    connects_fail(route, m);
  }
}

TEST_CASE("call machine: redirects are followed up to the limit and never past the deadline",
          "[core][call]") {
  using namespace std::chrono_literals;
  const call_tp t0{};
  SECTION("a named master is the next address, at once") {
    auto route = two_tasks();
    doorman::call_machine<call_tp> m(route, t0, t0 + 5s, {});
    (void)m.resume(t0, true);
    auto a = m.answered(t0, true, std::string("c:1"));
    REQUIRE(a.what == call_kind::moved);
    CHECK(m.moved_from() == "a:1");
    CHECK(route.current() == "c:1");  // learned, added to the addresses
    a = m.resume(t0, false);
    CHECK(a.what == call_kind::connect);
    CHECK(m.redirects() == 1);
  }
  SECTION("a non-master that names none is left for the next address") {
    auto route = two_tasks();
    doorman::call_machine<call_tp> m(route, t0, t0 + 5s, {});
    auto a = m.answered(t0, true);
    REQUIRE(a.what == call_kind::moved);
    CHECK(m.moved_from().empty());
    CHECK(route.current() == "b:1");
    CHECK(route.last_failure() == doorman::failure::no_master);
  }
  SECTION("at most max_redirects") {
    auto route = two_tasks();
    doorman::call_machine<call_tp> m(route, t0, t0 + 5s, {.max_redirects = 2});
    CHECK(m.answered(t0, true, std::string("b:1")).what == call_kind::moved);
    CHECK(m.answered(t0, true, std::string("a:1")).what == call_kind::moved);
    const auto a = m.answered(t0, true, std::string("b:1"));
    CHECK(a.what == call_kind::fail);
    CHECK(a.error == doorman::errc::too_many_redirects);
  }
  SECTION("past the deadline: no master") {
    auto route = two_tasks();
    doorman::call_machine<call_tp> m(route, t0, t0 + 5s, {});
    const auto a = m.answered(t0 + 5s, true);
    CHECK(a.what == call_kind::fail);
    CHECK(a.error == doorman::errc::no_master);
    CHECK(a.message == "no master found before the deadline");
  }
  SECTION("not following: a non-master's answer is the answer") {
    auto route = two_tasks();
    doorman::call_machine<call_tp> m(route, t0, t0 + 5s, {.follow_redirects = false});
    CHECK(m.answered(t0, true, std::string("b:1")).what == call_kind::done);
    CHECK(route.current() == "a:1");
  }
  SECTION("no answer by the deadline: the peer is hung, the route moves on") {
    auto route = two_tasks();
    doorman::call_machine<call_tp> m(route, t0, t0 + 5s, {});
    const auto a = m.timed_out(t0 + 5s, "get_capacity: no answer before the deadline");
    CHECK(a.what == call_kind::fail);
    CHECK(a.error == doorman::errc::timed_out);
    CHECK(route.current() == "b:1");
    CHECK(route.last_failure() == doorman::failure::hung);
  }
}
