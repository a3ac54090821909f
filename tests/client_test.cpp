// The asio client against in-process nodes, and the doorman-http-429 example.

#include <asio/experimental/awaitable_operators.hpp>

#include "line_client.hpp"
#include "support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (support.hpp, line_client.hpp)

namespace {

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

TEST_CASE("a call's real cost settles after it: a debt waits, a refund admits at once",
          "[client][net][costs]") {
  running_node root(fast_config(100));
  doorman::client cl(fast_client(root.address()));
  doorman::rate_resource debt(cl, "tokens", {.wants = 10, .burst = 5});
  doorman::rate_resource refund(cl, "bytes", {.wants = 10, .burst = 5});
  REQUIRE(eventually([&] {
    return debt.leased() && debt.capacity() == Approx(10) && refund.leased() &&
           refund.capacity() == Approx(10);
  }));
  REQUIRE(debt.try_acquire(5));  // reserved 5, the whole burst ...
  CHECK(debt.settle(5, 25));     // ... and it cost 25: 20 owed, 2 s at 10/s
  const auto refused = debt.try_acquire(1);
  REQUIRE_FALSE(refused);
  CHECK(refused.retry_after > 1800ms);  // 2.1 s: the debt, then one permit
  CHECK(refused.retry_after < 2400ms);
  const auto call = refund.try_acquire(5);  // reserved 5 ...
  REQUIRE(call);
  CHECK_FALSE(refund.try_acquire(1));
  CHECK(refund.settle(5, 1, call.slot));  // ... and it cost 1: 4 back at once
  CHECK(refund.try_acquire(4));
  CHECK_FALSE(refund.try_acquire(1));
  // Without its slot, a call's refund gives nothing back (its debt still counts).
  CHECK(refund.settle(4, 0));
  CHECK_FALSE(refund.try_acquire(1));
  CHECK_FALSE(refund.settle(1, -1));  // not a cost
  // A window algorithm counts each call at its reservation.
  doorman::rate_resource window(cl, "window",
                                {.wants = 10, .algorithm = doorman::rate_algorithm::fixed_window});
  CHECK_FALSE(window.settle(1, 2));
}

namespace {

// The budget of `resource` as the node's status tells it.
template <class Node>
doorman::budget_info budget_at(Node& node, const std::string& resource) {
  std::promise<doorman::budget_info> p;
  node.node().post([&](auto& eng) {
    const auto now = std::chrono::steady_clock::now();
    const auto st = eng.status({.resource_id = resource}, now, {});
    p.set_value(st && !st.value().resources.empty() && st.value().resources[0].budget
                    ? *st.value().resources[0].budget
                    : doorman::budget_info{});
  });
  return p.get_future().get();
}

// One fixed window of 366 days: a test does not straddle a window's end.
const std::string budget_config = R"({"resources": [
    {"identifier_glob": "tokens", "capacity": 1000, "budget": {"window": 31622400},
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 3, "refresh_interval": 0.4,
                   "learning_mode_duration": 0}},
    {"identifier_glob": "*", "capacity": 0,
     "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 3, "refresh_interval": 0.4}}]})";

}  // namespace

TEST_CASE("a budget resource spends its allotment, settles, reports and frees the rest",
          "[client][net][budget]") {
  running_node root(budget_config);
  doorman::client a(fast_client(root.address()));
  doorman::client b(fast_client(root.address()));
  auto ta = std::make_unique<doorman::budget_resource>(a, "tokens",
                                                       doorman::resource_options{.wants = 400});
  doorman::budget_resource tb(b, "tokens", {.wants = 400});
  REQUIRE(eventually([&] { return ta->left() == Approx(400) && tb.left() == Approx(400); }));
  const auto wa = ta->window();
  CHECK(ta->try_acquire(300));
  CHECK_FALSE(ta->try_acquire(200));  // 100 left
  CHECK_FALSE(ta->try_acquire(-1));
  CHECK(ta->settle(300, 350, wa));  // it cost more: 50 left
  CHECK(ta->left() == Approx(50));
  CHECK(ta->spent() == Approx(350));
  const auto wb = tb.window();
  CHECK(tb.try_acquire(100));
  CHECK(tb.settle(100, 40, wb));  // a refund: back at once
  CHECK(tb.left() == Approx(360));
  // The reports ride on the refreshes: the root counts 350 + 100 (a refund after a report is
  // not taken back; before one, it never reached the root: 40).
  REQUIRE(eventually([&] { return budget_at(root, "tokens").spent >= 390; }));
  auto info = budget_at(root, "tokens");
  CHECK(info.limit == 1000);
  CHECK(info.spent <= 450);
  // Released with its last report: the rest of a's allotment is free at once.
  ta.reset();
  REQUIRE(eventually([&] { return held_at(root, "tokens").second == 1; }));
  info = budget_at(root, "tokens");
  CHECK(info.spent <= 450);
  CHECK(info.left >= 1000 - 450 - 400);  // b's allotment is the rest
  // b asks for more than there is: its allotment grows to what is left of the window.
  tb.set_wants(5000);
  REQUIRE(eventually([&] { return tb.left() > 500; }));
  // What b may spend in all is what a did not: 1000 − 350.
  CHECK(tb.left() + tb.spent() <= 650 + 1e-6);
  CHECK(tb.left() + tb.spent() > 600);
  b.stop();
  CHECK_FALSE(tb.try_acquire(1));  // closed is closed
}

TEST_CASE("a standalone root with a state file continues a budget's window after a restart",
          "[client][net][budget][state]") {
  const std::string dir = scratch_directory("doorman-state");
  doorman::node_options o;
  o.state_file = dir + "/state.json";
  o.engine.budget_mark_step = 0.1;  // marks 100 units ahead: a few writes reach 400
  {
    running_node root(budget_config, o);
    doorman::client a(fast_client(root.address()));
    doorman::budget_resource tokens(a, "tokens", {.wants = 400});
    REQUIRE(eventually([&] { return tokens.left() == Approx(400); }));
    const auto w = tokens.window();
    REQUIRE(tokens.try_acquire(300));
    CHECK(tokens.settle(300, 300, w));
    REQUIRE(eventually([&] { return budget_at(root, "tokens").spent >= 300; }));
    a.stop();
  }
  // Restarted: the window's count starts from the mark the root kept in the file (what was
  // spent and allotted, a step ahead), so what is left is at most the 700 it had.
  running_node root(budget_config, o);
  doorman::client b(fast_client(root.address()));
  doorman::budget_resource tokens(b, "tokens", {.wants = 5000});
  REQUIRE(eventually([&] { return tokens.left() > 0; }));
  const auto info = budget_at(root, "tokens");
  CHECK(info.spent >= 300);
  CHECK(tokens.left() <= 700 + 1e-6);
  b.stop();
  std::filesystem::remove_all(dir);
}

TEST_CASE("a budget's measured wants grow while it refuses, and its allotment ends with its lease",
          "[client][net][budget]") {
  running_node root(budget_config);
  doorman::client c(fast_client(root.address()));
  doorman::budget_resource t(c, "tokens", {.initial_wants = 10});
  REQUIRE(eventually([&] { return t.left() > 0; }));
  // Callers want more than the allotment holds: the wants double until they get it.
  REQUIRE(eventually([&] {
    (void)t.try_acquire(50);
    return t.spent() >= 500;
  }));
  CHECK(t.wants() > 10);
  CHECK(t.spent() <= 1000);
  root.stop();  // the allotment is not renewed: it ends with the lease (3 s)
  REQUIRE(eventually([&] { return !t.try_acquire(1) && t.left() <= 0; }, 6s));
}

TEST_CASE("a budget's waits: blocking, asynchronous, cancelled, woken by a refund or a stop",
          "[client][net][budget]") {
  running_node root(budget_config);
  doorman::client cl(fast_client(root.address()));
  // It wants the whole budget: once it took all, no allotment brings more (only a refund).
  doorman::budget_resource t(cl, "tokens", {.wants = 1000});
  // Before the first answer nothing is allotted: the blocking wait takes the units once it is.
  t.wait(60);
  CHECK(t.spent() == 60);
  CHECK(t.left() <= 940);
  // Units that never come (past the whole budget): cancelled, nothing taken.
  asio::cancellation_signal cancel;
  auto never = t.async_wait(5000, asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
  CHECK(never.wait_for(100ms) == std::future_status::timeout);
  cancel.emit(asio::cancellation_type::terminal);  // on the thread that owns the slot
  REQUIRE(never.wait_for(10s) == std::future_status::ready);
  CHECK_THROWS_AS(never.get(), std::system_error);
  CHECK(t.spent() == 60);
  // All of the budget taken; a waiter for 10 more is woken by a refund.
  REQUIRE(eventually([&] { return t.left() == Approx(940); }));
  REQUIRE(t.try_acquire(940));
  auto more = t.async_wait(10, asio::use_future);
  CHECK(more.wait_for(50ms) == std::future_status::timeout);
  CHECK(t.settle(40, 20, t.window()));  // (a call of this window)
  REQUIRE(more.wait_for(10s) == std::future_status::ready);
  more.get();
  CHECK(t.spent() == Approx(990));  // 1000, 20 back, 10 taken again
  std::error_code ec;
  t.wait(-1, ec);
  CHECK(ec == std::errc::invalid_argument);
  // A blocking wait for units that never come ends when the client stops.
  std::promise<std::error_code> ended;
  std::thread waiter([&] {
    std::error_code e;
    t.wait(5000, e);
    ended.set_value(e);
  });
  auto f = ended.get_future();
  CHECK(f.wait_for(100ms) == std::future_status::timeout);
  cl.stop();
  REQUIRE(f.wait_for(10s) == std::future_status::ready);
  CHECK(f.get() == asio::error::operation_aborted);
  waiter.join();
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

namespace {
// A user's local algorithm, unknown to the compiled client: a fixed window under its own name.
inline constexpr doorman::rate_algorithm strict_name{"strict_window"};
using strict = doorman::window_algorithm<strict_name, doorman::compact_fixed_window_limiter>;
using with_strict = doorman::default_local_algorithms::with<strict>;
}  // namespace

TEST_CASE("a resource that cannot be made leaves nothing behind", "[client][net][algorithms]") {
  running_node root(fast_config(100));
  doorman::client cl(fast_client(root.address()));
  static constexpr doorman::rate_algorithm nowhere{"nowhere"};
  CHECK_THROWS_WITH(doorman::rate_resource(cl, "api", {.algorithm = nowhere}),
                    "unknown local rate algorithm: nowhere");
  // The client goes on and stops cleanly (it once kept an empty entry for the id, which
  // stopping dereferenced); the id is free.
  doorman::gauge_resource g(cl, "db", {.wants = 1});
  CHECK(eventually([&] { return g.leased(); }));
  cl.stop();
  CHECK_FALSE(g.try_acquire());
  doorman::gauge_resource api(cl, "api", {.wants = 1});
  CHECK_FALSE(api.try_acquire());  // made after stop(): admits nothing
}

TEST_CASE("every local algorithm, a user's included, enforces a rate resource's lease",
          "[client][net][algorithms]") {
  running_node root(fast_config(100));
  doorman::client cl(fast_client(root.address()));
  using doorman::rate_algorithm;
  CHECK_THROWS_AS(doorman::rate_resource(cl, "strict", {.algorithm = strict_name}),
                  std::invalid_argument);
  for (const auto algorithm :
       {rate_algorithm::fixed_window, rate_algorithm::sliding_log, rate_algorithm::sliding_window,
        rate_algorithm::leaky_bucket, strict_name}) {
    INFO(doorman::to_string(algorithm));
    const std::string id = fmt::format("algo-{}", doorman::to_string(algorithm));
    doorman::basic_rate_resource<with_strict> r(
        cl, id,
        {.wants = 40, .algorithm = algorithm, .window = 200ms, .sub_windows = 4, .queue = 2});
    CHECK(r.limiter().algorithm() == algorithm);
    CHECK((r.limiter().get_if<doorman::compact_fixed_window_limiter>() != nullptr) ==
          (algorithm == strict_name));
    REQUIRE(eventually([&] { return r.leased() && r.capacity() == Approx(40); }));
    CHECK(r.limiter().rate() == Approx(40));
    if (algorithm != rate_algorithm::leaky_bucket) {
      // A window of 200 ms at 40/s holds 8 permits.
      CHECK(r.limiter().status().limit == Approx(8));
    }
    // Asynchronous and blocking waits are admitted at the lease's rate.
    const auto start = steady::now();
    for (int i = 0; i < 16; ++i) {
      auto f = r.async_wait(1, asio::use_future);
      REQUIRE(f.wait_for(10s) == std::future_status::ready);
      f.get();
    }
    r.wait();
    // 17 permits, 8 per 200 ms: for a fixed window, two window edges, a whole window apart.
    CHECK(steady::now() - start >= 190ms);
    // A request the algorithm can never admit is an error, not a hang.
    if (algorithm != rate_algorithm::leaky_bucket) {
      auto f = r.async_wait(100, asio::use_future);
      REQUIRE(f.wait_for(10s) == std::future_status::ready);
      CHECK_THROWS_AS(f.get(), std::system_error);
      CHECK_THROWS_AS(r.wait(100), std::system_error);
    }
  }
}

TEST_CASE("a keyed rate resource: one Doorman resource per key, bounded, idle keys released",
          "[client][net][algorithms]") {
  CHECK(doorman::resource_id_for("api-key:*", "abc") == "api-key:abc");
  CHECK(doorman::resource_id_for("t/*/x", "a/b*c%") == "t/a%2Fb%2Ac%25/x");
  CHECK(doorman::glob_match("api-key:*", doorman::resource_id_for("api-key:*", "?[/] \xff")));
  CHECK_THROWS_AS(doorman::resource_id_for("api-key", "abc"), std::invalid_argument);
  // The empty key under "*" is a valid id, "%" (no key escapes to it).
  CHECK(doorman::resource_id_for("*", "") == "%");
  CHECK(doorman::resource_id_for("*", "%") == "%25");
  CHECK(doorman::resource_id_for("k:*", "") == "k:");
  // A hostile key: the id stays within the protocol's 256 bytes and still matches.
  const auto long_id = doorman::resource_id_for("api-key:*:v1", std::string(5000, '/'));
  CHECK(long_id.size() <= 256);
  CHECK(long_id.ends_with(":v1"));
  CHECK(doorman::glob_match("api-key:*:v1", long_id));

  running_node root(fast_config(10));
  doorman::client cl(fast_client(root.address()));
  doorman::keyed_rate_resource per_key(cl, "api-key:*", {.wants = 4},
                                       {.max_keys = 2, .idle = std::chrono::hours(1)});
  auto ann = per_key.resource("ann");
  CHECK(ann.id() == "api-key:ann");
  REQUIRE(eventually([&] { return ann.leased() && ann.capacity() == Approx(4); }));
  CHECK(held_at(root, "api-key:ann").first == Approx(4));
  (void)per_key.try_acquire("bob");
  CHECK(per_key.size() == 2);
  // Full, and both keys were used just now: a third shares the overflow resource.
  CHECK(per_key.resource("cat").id() == "api-key:%overflow");
  CHECK(per_key.overflowed() == 1);

  // Keys idle at once make room as new keys come: their leases are released.
  doorman::keyed_rate_resource brief(cl, "api-key:*", {.wants = 1}, {.max_keys = 2, .idle = {}});
  auto dan = brief.resource("dan");
  REQUIRE(eventually([&] { return held_at(root, "api-key:dan").second == 1; }));
  (void)brief.try_acquire("eve");
  (void)brief.try_acquire("fay");
  CHECK(brief.evicted() >= 1);
  CHECK(brief.size() <= 2);
  CHECK(brief.overflowed() == 0);
  REQUIRE(eventually([&] { return held_at(root, "api-key:eve").second == 0; }));
  CHECK(dan.id() == "api-key:dan");  // a handle held outside keeps its resource
  CHECK(held_at(root, "api-key:dan").second == 1);

  // Under "*", the empty key is a resource like any other (it used to throw).
  doorman::keyed_rate_resource any(cl, "*", {.wants = 1});
  CHECK_NOTHROW((void)any.try_acquire(""));
  CHECK(any.resource("").id() == "%");
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

TEST_CASE("measured wants: the demand times the headroom, never under min_wants", "[client][net]") {
  running_node root(fast_config(1000));
  doorman::client cl(fast_client(root.address()));
  doorman::rate_resource idle(cl, "idle", {.min_wants = 7});
  doorman::rate_resource plain(cl, "plain");
  doorman::rate_resource doubled(cl, "doubled", {.headroom = 2});
  // The same attempts on both (refused ones count): sampled together, they decay together.
  for (int i = 0; i < 50; ++i) {
    (void)plain.try_acquire();
    (void)doubled.try_acquire();
  }
  REQUIRE(eventually([&] { return plain.wants() > 0 && idle.wants() > 0; }));
  const auto ratio = [&] { return doubled.wants() / plain.wants(); };
  // Within 10%: a sample may fall between the two calls of one round (49 against 50).
  CHECK(eventually([&] { return plain.wants() > 0 && std::abs(ratio() - 2) < 0.1; }));
  CHECK(idle.wants() == 7);  // never used: the floor
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
  const auto node_address = doorman_test::listening_address(node);
  doorman_examples::process http({DOORMAN_HTTP_BINARY, "--server", node_address, "--listen",
                                  "127.0.0.1:0", "--resource", "api"},
                                 (dir / "http.log").string());
  const auto http_address = doorman_test::listening_address(http);

  // No lease yet (wants are measured from requests): refused, and told when to come back.
  const std::string first = http_get(http_address);
  REQUIRE_THAT(first, Catch::Contains("HTTP/1.1 429"));
  CHECK_THAT(first, Catch::Contains("Retry-After: "));
  // The refused requests are demand: a lease comes, and requests get through.
  REQUIRE(eventually([&] { return http_get(http_address).find("HTTP/1.1 200") == 0; }));
  // A burst far above the lease (5/s): at most the lease's worth in the time it took, + burst.
  const auto start = steady::now();
  int ok = 0;
  int refused = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string a = http_get(http_address);
    ok += a.find("HTTP/1.1 200") == 0 ? 1 : 0;
    refused += a.find("HTTP/1.1 429") == 0 && a.find("Retry-After: 1") != std::string::npos;
  }
  const double took = doorman::to_seconds(steady::now() - start);
  CHECK(ok <= 5 * took + 1 + 1e-9);
  CHECK(ok + refused == 40);  // every other answer is a 429 saying "Retry-After: 1"
  CHECK(refused > 0);
  http.signal(SIGTERM);
  CHECK(http.exits_cleanly());
  node.signal(SIGTERM);
  CHECK(node.exits_cleanly());
  std::filesystem::remove_all(dir);
}
namespace {

// Writes `rules` to DIR/NAME.json and starts doorman-http-429 on them (log DIR/NAME.log).
doorman_examples::process http_429_with_rules(const std::filesystem::path& dir,
                                              const std::string& name, const std::string& rules) {
  const auto file = dir / (name + ".json");
  std::ofstream(file) << rules;
  return doorman_examples::process(
      {DOORMAN_HTTP_BINARY, "--rules", file.string(), "--listen", "127.0.0.1:0"},
      (dir / (name + ".log")).string());
}

}  // namespace

TEST_CASE("doorman-http-429 with rules: RateLimit headers, 429 with Retry-After, elastic waits",
          "[client][process][rules]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("doorman-rules-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto http = http_429_with_rules(dir, "rules", R"({"domain": "web", "descriptors": [
    {"key": "remote_address", "rate_limit": {"unit": "hour", "requests_per_unit": 3}},
    {"key": "path", "value": "/slow", "mode": "elastic", "max_delay": 3,
     "rate_limit": {"unit": "second", "requests_per_unit": 1}}]})");
  const auto address = doorman_test::listening_address(http);
  for (int i = 0; i < 3; ++i) {
    const auto r = http_get(address, "/");
    CHECK(r.status == 200);
    CHECK_THAT(r.head, Catch::Contains("RateLimit-Limit: 3\r\n"));
    CHECK_THAT(r.head, Catch::Contains(fmt::format("RateLimit-Remaining: {}\r\n", 2 - i)));
  }
  const auto refused = http_get(address, "/");
  CHECK(refused.status == 429);
  CHECK_THAT(refused.head, Catch::Contains("RateLimit-Remaining: 0\r\n"));
  CHECK_THAT(refused.head, Catch::Matches("(.|\r|\n)*Retry-After: [0-9]+\r\n(.|\r|\n)*"));
  CHECK_THAT(refused.head, Catch::Matches("(.|\r|\n)*RateLimit-Reset: [0-9]+(.|\r|\n)*"));

  // SIGHUP reloads the rules (and their counts); a broken file keeps the previous ones.
  std::ofstream(dir / "rules.json") << R"({"domain": "web", "descriptors": [
    {"key": "remote_address", "rate_limit": {"unit": "hour", "requests_per_unit": 5}}]})";
  http.signal(SIGHUP);
  REQUIRE(eventually([&] {
    return http_get(address, "/").head.find("RateLimit-Limit: 5\r\n") != std::string::npos;
  }));
  std::ofstream(dir / "rules.json") << R"({"domain": "web", "descriptors": [{"key": 1}]})";
  http.signal(SIGHUP);
  REQUIRE(eventually([&] {
    std::ifstream in(dir / "rules.log");
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return log.find("kept the previous rules: descriptors[0].key: must be a string") !=
           std::string::npos;
  }));
  CHECK_THAT(http_get(address, "/").head, Catch::Contains("RateLimit-Limit: 5\r\n"));

  // A bad rule file: refused at start, naming the field.
  std::ofstream(dir / "bad.json") << R"({"domain": "web", "descriptors": [
    {"key": "path", "rate_limit": {"unit": "fortnight", "requests_per_unit": 3}}]})";
  check_refused_start(
      {DOORMAN_HTTP_BINARY, "--rules", (dir / "bad.json").string(), "--listen", "127.0.0.1:0"},
      (dir / "bad.log").string(),
      "descriptors[0].rate_limit.unit: must be one of second, minute, hour, day");
  http.signal(SIGTERM);
  CHECK(http.exits_cleanly());

  // Elastic: requests over the limit wait for room instead of a 429 (a fresh service, so
  // that the per-address limit above does not apply).
  auto elastic = http_429_with_rules(dir, "elastic", R"({"domain": "web", "descriptors": [
    {"key": "path", "value": "/slow", "mode": "elastic", "max_delay": 3,
     "rate_limit": {"unit": "second", "requests_per_unit": 1}}]})");
  const auto at = doorman_test::listening_address(elastic);
  const auto start = steady::now();
  CHECK(http_get(at, "/slow").status == 200);
  CHECK(http_get(at, "/slow").status == 200);  // held until the next second
  CHECK(steady::now() - start >= 500ms);
  elastic.signal(SIGTERM);
  CHECK(elastic.exits_cleanly());
  std::filesystem::remove_all(dir);
}
#endif

TEST_CASE("a gauge slot outlives moves of its handle", "[client][net][lifecycle]") {
  running_node root(fast_config(10));
  doorman::client cl(fast_client(root.address()));
  std::optional<doorman::gauge_resource> g(std::in_place, cl, "jobs",
                                           doorman::resource_options{.wants = 2});
  REQUIRE(eventually([&] { return g->leased(); }));
  auto slot = g->acquire();
  CHECK(g->in_flight() == 1);
  doorman::gauge_resource moved(std::move(*g));
  g.reset();  // the handle the slot was taken from is gone
  slot.release();
  CHECK(moved.in_flight() == 0);
}

TEST_CASE("stopping or destroying a client ends its pending waits", "[client][net][lifecycle]") {
  running_node root(fast_config(0));  // nothing to grant: waits can only end by the stop
  std::future<void> pending;
  std::future<void> rate_pending;
  std::future<std::error_code> sync_rate;
  std::future<std::error_code> sync_gauge;
  const auto aborted = [](std::future<void>& f) {
    try {
      f.get();
    } catch (const std::system_error& e) {
      return e.code() == asio::error::operation_aborted;
    }
    return false;
  };
  {
    doorman::client cl(fast_client(root.address()));
    doorman::gauge_resource g(cl, "jobs", {.wants = 1, .mode = doorman::fallback::pessimistic});
    doorman::rate_resource r(cl, "api", {.wants = 1, .mode = doorman::fallback::pessimistic});
    pending = g.async_acquire(asio::use_future);
    rate_pending = r.async_wait(1, asio::use_future);
    sync_rate = std::async(std::launch::async, [&] {
      std::error_code ec;
      r.wait(1, ec);
      return ec;
    });
    sync_gauge = std::async(std::launch::async, [&] {
      std::error_code ec;
      auto slot = g.acquire(ec);
      // (Catch's checks belong on the test's thread: a slot where there should be none is
      // reported as success, which the test's check fails.)
      return slot ? std::error_code() : ec;
    });
    CHECK(pending.wait_for(50ms) == std::future_status::timeout);
    SECTION("stop() with the handles alive") {
      cl.stop();
      REQUIRE(pending.wait_for(5s) == std::future_status::ready);
      REQUIRE(rate_pending.wait_for(5s) == std::future_status::ready);
      REQUIRE(sync_rate.wait_for(5s) == std::future_status::ready);
      REQUIRE(sync_gauge.wait_for(5s) == std::future_status::ready);
      std::error_code ec;
      r.wait(1, ec);  // a wait after the stop ends at once
      CHECK(ec == asio::error::operation_aborted);
      CHECK_THROWS_AS(g.acquire(), std::system_error);
    }
    SECTION("the handles, then the client, destroyed") {
      // The synchronous waiters must be done before their handles go.
      REQUIRE(sync_rate.wait_for(0s) == std::future_status::timeout);
      cl.stop();
      REQUIRE(sync_rate.wait_for(5s) == std::future_status::ready);
      REQUIRE(sync_gauge.wait_for(5s) == std::future_status::ready);
    }
  }  // ~client must return, with every wait ended
  REQUIRE(pending.wait_for(5s) == std::future_status::ready);
  REQUIRE(rate_pending.wait_for(5s) == std::future_status::ready);
  CHECK(aborted(pending));
  CHECK(aborted(rate_pending));
  CHECK(sync_rate.get() == asio::error::operation_aborted);
  CHECK(sync_gauge.get() == asio::error::operation_aborted);
}

TEST_CASE("closed is closed: a stopped client's handles admit nothing",
          "[client][net][lifecycle]") {
  running_node root(fast_config(1000));
  doorman::client cl(fast_client(root.address()));
  // The optimistic fallback would admit the wants once the lease runs out: a stop must not.
  doorman::rate_resource r(cl, "api", {.wants = 100, .mode = doorman::fallback::optimistic});
  doorman::gauge_resource g(cl, "jobs", {.wants = 4, .mode = doorman::fallback::optimistic});
  REQUIRE(eventually([&] { return r.leased() && g.leased(); }));
  REQUIRE(r.try_acquire());
  REQUIRE(g.try_acquire());
  g.release();
  cl.stop();  // admits nothing from the moment it returns
  const auto refused = r.try_acquire();
  CHECK_FALSE(refused);
  CHECK(refused.retry_after == doorman::any_rate_limiter::duration::max());
  CHECK_FALSE(g.try_acquire());
  // A handle made after the stop is closed as well.
  doorman::rate_resource late(cl, "late", {.wants = 1, .mode = doorman::fallback::optimistic});
  CHECK_FALSE(late.try_acquire());
  std::error_code ec;
  late.wait(1, ec);
  CHECK(ec == asio::error::operation_aborted);
}

TEST_CASE("a rate resource refuses a number of permits that is negative or not finite",
          "[client][net]") {
  running_node root(fast_config(1000));
  doorman::client cl(fast_client(root.address()));
  doorman::rate_resource r(cl, "api", {.wants = 100, .mode = doorman::fallback::optimistic});
  REQUIRE(eventually([&] { return r.leased(); }));
  const double asked = r.limiter().attempted();
  for (const double n : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    INFO(n);
    CHECK_FALSE(r.try_acquire(n));
    std::error_code ec;
    r.wait(n, ec);
    CHECK(ec == std::errc::invalid_argument);
    CHECK(r.async_wait(n, asio::use_future).wait_for(5s) == std::future_status::ready);
  }
  CHECK_THROWS_WITH(r.wait(-1), "rate resource api: n: must be a finite number >= 0");
  CHECK(r.limiter().attempted() == asked);  // never counted as demand
}

TEST_CASE("async_stop completes once the leases are released", "[client][net][lifecycle]") {
  running_node root(fast_config(10));
  doorman::client cl(fast_client(root.address()));
  doorman::rate_resource r(cl, "api", {.wants = 4});
  REQUIRE(eventually([&] { return r.leased(); }));
  CHECK(held_at(root, "api").first == 4);
  auto stopped = cl.async_stop(asio::use_future);
  REQUIRE(stopped.wait_for(5s) == std::future_status::ready);
  stopped.get();
  CHECK(held_at(root, "api").second == 0);  // released before it completed
  // Once stopped, it completes at once.
  auto again = cl.async_stop(asio::use_future);
  REQUIRE(again.wait_for(5s) == std::future_status::ready);
}

namespace {

// A server that answers the first `answers` get_capacity calls with a lease of `capacity` for
// every resource asked for, then reads on and answers nothing more (a server that hangs); or,
// after `vanish()`, is gone altogether (connections closed, port refusing). It counts the
// calls it read.
class stalling_server {
 public:
  explicit stalling_server(int answers, double capacity = 10)
      : answers_(answers), capacity_(capacity) {
    acceptor_.open(asio::ip::tcp::v4());
    acceptor_.bind({asio::ip::make_address("127.0.0.1"), 0});
    acceptor_.listen();
    address_ = "127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
    asio::co_spawn(io_, accept(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  stalling_server(const stalling_server&) = delete;
  stalling_server& operator=(const stalling_server&) = delete;
  ~stalling_server() {
    vanish();
    thread_.join();
  }

  [[nodiscard]] const std::string& address() const { return address_; }
  [[nodiscard]] int calls() const { return calls_.load(); }
  // The resources of each release_capacity call read so far.
  [[nodiscard]] std::vector<json> released() const {
    const std::lock_guard lock(mutex_);
    return released_;
  }
  // The resources of each get_capacity call read so far.
  [[nodiscard]] std::vector<json> asked() const {
    const std::lock_guard lock(mutex_);
    return asked_;
  }

  // Closes the port and every connection; later connection attempts are refused.
  void vanish() {
    asio::post(io_, [this] {
      std::error_code ec;
      acceptor_.close(ec);
      for (auto& s : sockets_)
        s->close(ec);
    });
  }

 private:
  asio::awaitable<void> accept() {
    for (;;) {
      auto s = std::make_shared<asio::ip::tcp::socket>(io_);
      std::error_code ec;
      co_await acceptor_.async_accept(*s, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      sockets_.push_back(s);
      asio::co_spawn(io_, serve(s), asio::detached);
    }
  }

  asio::awaitable<void> serve(std::shared_ptr<asio::ip::tcp::socket> s) {
    std::string in;
    for (;;) {
      std::error_code ec;
      const auto n = co_await asio::async_read_until(*s, asio::dynamic_buffer(in), '\n',
                                                     asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      const json call = json::parse(in.substr(0, n));
      in.erase(0, n);
      ++calls_;
      if (call["method"] == "release_capacity") {
        const std::lock_guard lock(mutex_);
        released_.push_back(call["params"]["resources"]);
      }
      if (call["method"] == "get_capacity") {
        const std::lock_guard lock(mutex_);
        asked_.push_back(call["params"]["resources"]);
      }
      if (call["method"] != "get_capacity" || answered_ >= answers_) continue;
      ++answered_;
      json grants = json::array();
      for (const auto& r : call["params"]["resources"]) {
        grants.push_back(
            {{"resource_id", r["resource_id"]},
             {"gets", {{"capacity", capacity_}, {"expires_in", 60}, {"refresh_interval", 0.1}}},
             {"safe_capacity", 0}});
      }
      const json answer = {
          {"jsonrpc", "2.0"},
          {"id", call["id"]},
          {"result", {{"resources", grants}, {"mastership", {{"is_master", true}}}}}};
      const std::string line = answer.dump() + "\n";
      co_await asio::async_write(*s, asio::buffer(line),
                                 asio::redirect_error(asio::use_awaitable, ec));
    }
  }

  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_{io_};
  std::vector<std::shared_ptr<asio::ip::tcp::socket>> sockets_;
  std::string address_;
  int answers_;
  double capacity_;
  int answered_ = 0;
  std::atomic<int> calls_{0};
  mutable std::mutex mutex_;
  std::vector<json> released_;
  std::vector<json> asked_;
  std::thread thread_;
};

// Starts an asynchronous operation, `start(handler)`, cancels it at once through the
// handler's cancellation slot, and gives what it completed with (which must be within 3 s).
template <class Start>
std::error_code cancelled_at_once(Start start) {
  asio::cancellation_signal cancel;
  auto done = std::make_shared<std::promise<std::error_code>>();
  auto f = done->get_future();
  start(asio::bind_cancellation_slot(cancel.slot(),
                                     [done](std::error_code ec) { done->set_value(ec); }));
  cancel.emit(asio::cancellation_type::terminal);
  REQUIRE(f.wait_for(3s) == std::future_status::ready);
  return f.get();
}

}  // namespace

TEST_CASE("a client stops within release_timeout when its server has gone away",
          "[client][net][lifecycle]") {
  stalling_server server(1);
  auto options = fast_client(server.address());
  options.call_timeout = doorman::seconds(5);
  options.release_timeout = doorman::seconds(0.3);
  auto cl = std::make_unique<doorman::client>(options);
  auto r =
      std::make_unique<doorman::rate_resource>(*cl, "api", doorman::resource_options{.wants = 5});
  REQUIRE(eventually([&] { return r->leased(); }));
  // The second refresh is in flight, and will never be answered.
  REQUIRE(eventually([&] { return server.calls() >= 2; }));
  SECTION("the server hangs") {}
  SECTION("the server is gone (connection closed, port refusing)") {
    server.vanish();
  }
  const auto started = steady::now();
  auto destroyed = std::async(std::launch::async, [&] {
    r.reset();
    cl.reset();
  });
  // release_timeout, plus slack for a loaded machine; before, the refresh in flight was waited
  // for up to call_timeout (5 s) first.
  REQUIRE(destroyed.wait_for(3s) == std::future_status::ready);
  CHECK(steady::now() - started < 1.5s);
}

TEST_CASE("a refresh carries the answers recorded up to it, not those of the last sample",
          "[client][net][learn]") {
  // Demand is sampled once a minute here; the root's rates of calls divide each report's
  // counts by the time between reports, so the counts must be those at the send.
  stalling_server server(1000);
  auto options = fast_client(server.address());
  options.sample_interval = doorman::seconds(60);
  doorman::client cl(options);
  doorman::rate_resource r(cl, "api", {.wants = 1});
  REQUIRE(eventually([&] { return r.leased(); }));
  r.record_answers(7, 2);
  const auto carried = [&] {
    for (const json& resources : server.asked()) {
      for (const json& item : resources) {
        if (item.contains("signals") && item["signals"]["calls"] == 7 &&
            item["signals"]["overloads"] == 2) {
          return true;
        }
      }
    }
    return false;
  };
  CHECK(eventually(carried));
}

TEST_CASE("a release still unanswered when the client stops goes out again with the final one",
          "[client][net][lifecycle]") {
  // Answers every refresh (both resources are granted, whichever request first carries them)
  // and never a release.
  stalling_server server(1000);
  auto options = fast_client(server.address());
  options.release_timeout = doorman::seconds(0.2);
  auto cl = std::make_unique<doorman::client>(options);
  auto a =
      std::make_unique<doorman::rate_resource>(*cl, "a", doorman::resource_options{.wants = 1});
  doorman::rate_resource b(*cl, "b", {.wants = 1});
  REQUIRE(eventually([&] { return a->leased() && b.leased(); }));
  a.reset();  // its release goes out, and is never answered
  REQUIRE(eventually([&] { return server.released().size() == 1; }));
  cl->stop();
  REQUIRE(eventually([&] { return server.released().size() == 2; }));
  const json last = server.released().back();
  CHECK(std::find(last.begin(), last.end(), "a") != last.end());
  CHECK(std::find(last.begin(), last.end(), "b") != last.end());
}

TEST_CASE(
    "cancelling an asynchronous operation ends it with operation_aborted and consumes "
    "nothing",
    "[client][net][lifecycle]") {
  stalling_server server(1000, 1);  // 1 permit a second, burst 1
  doorman::client cl(fast_client(server.address()));
  // A wait given up gave its reservation back: the next permit is still the one due in ~1 s
  // (it would be 2 s away had the cancelled wait kept its permit).
  const auto next_still_due_in_a_second = [](doorman::rate_resource& r) {
    const auto next = r.try_acquire();
    CHECK_FALSE(next);
    CHECK(next.retry_after < 1.5s);
  };
  SECTION("rate_resource::async_wait") {
    doorman::rate_resource r(cl, "api", {.wants = 1});
    REQUIRE(eventually([&] { return r.capacity() == 1; }));
    REQUIRE(r.try_acquire());  // the burst: the next permit is due in 1 s
    CHECK(cancelled_at_once([&](auto handler) { r.async_wait(1, std::move(handler)); }) ==
          asio::error::operation_aborted);
    next_still_due_in_a_second(r);
  }
  SECTION("a deadline raced against async_wait (awaitable operators)") {
    doorman::rate_resource r(cl, "api", {.wants = 1});
    REQUIRE(eventually([&] { return r.capacity() == 1; }));
    REQUIRE(r.try_acquire());
    asio::io_context io;
    const auto winner = run_coroutine_test(io, [&]() -> asio::awaitable<std::size_t> {
      using namespace asio::experimental::awaitable_operators;
      asio::steady_timer deadline(co_await asio::this_coro::executor, 50ms);
      auto result = co_await (r.async_wait(1, asio::use_awaitable) ||
                              deadline.async_wait(asio::use_awaitable));
      co_return result.index();
    });
    // The wait's completion counted as work on `io` until it was delivered (from the client's
    // thread): `io` runs out of work, and then may be destroyed.
    io.run_for(5s);
    CHECK(io.stopped());
    CHECK(winner == 1);  // the deadline; the wait was cancelled and gave its permit back
    next_still_due_in_a_second(r);
  }
  SECTION("gauge_resource::async_acquire") {
    doorman::gauge_resource g(cl, "jobs", {.wants = 1});
    REQUIRE(eventually([&] { return g.capacity() == 1; }));
    REQUIRE(g.try_acquire());  // the only slot
    CHECK(cancelled_at_once([&](auto handler) { g.async_acquire(std::move(handler)); }) ==
          asio::error::operation_aborted);
    g.release();
    CHECK(g.in_flight() == 0);  // the cancelled acquire took nothing, then or later
    REQUIRE(g.try_acquire());
    g.release();
  }
  SECTION("client::async_stop (the stop goes on)") {
    // Answers refreshes, never a release: once connected, the final release waits its whole
    // release_timeout. (Never connected, a client stops at once, which could beat the cancel.)
    stalling_server silent(1000);
    auto options = fast_client(silent.address());
    options.release_timeout = doorman::seconds(2);  // far beyond the cancel; the test waits it
    doorman::client stopping(options);
    doorman::rate_resource held(stopping, "held", {.wants = 1});
    REQUIRE(eventually([&] { return stopping.connected() && held.leased(); }));
    CHECK(cancelled_at_once([&](auto handler) { stopping.async_stop(std::move(handler)); }) ==
          asio::error::operation_aborted);
  }
}

TEST_CASE("a new client's wait loop gets its first permit at once and the whole capacity soon",
          "[client][net]") {
  running_node root(fast_config(50));
  doorman::client_options options;  // the defaults: 1 s floor, demand sampled each second
  options.addresses = {root.address()};
  doorman::client cl(options);
  doorman::rate_resource api(cl, "api");  // wants measured
  std::atomic<int> admitted{0};
  std::atomic<bool> done{false};
  auto loop = std::async(std::launch::async, [&] {
    while (!done) {
      std::error_code ec;
      api.wait(1, ec);
      if (ec) return;
      ++admitted;
    }
  });
  // Before, nothing came until the first demand sample (1 s), and then only 2 permits a second.
  CHECK(eventually([&] { return admitted.load() > 0; }, 900ms));
  CHECK(eventually([&] { return api.capacity() == 50; }, 900ms));
  // Saturated, it reports what it could use (2 × the lease, throttled), and no more.
  CHECK(eventually([&] { return api.wants() == 100; }));
  CHECK(api.wants() <= 2 * api.capacity());
  done = true;
  cl.stop();  // ends the loop's wait
  REQUIRE(loop.wait_for(5s) == std::future_status::ready);
}
