// The channel (redirects, failover, deadlines) and the refresh driver.

#include <doorman/sim.hpp>

#include "etcd_server.hpp"
#include "line_client.hpp"
#include "support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (support.hpp, line_client.hpp)

TEST_CASE("a channel follows a mastership redirect", "[net][channel]") {
  running_node master(fast_config(10));
  running_node<fixed_election> follower(fast_config(10), {},
                                        fixed_election{false, master.address()});
  {
    line_client c(follower.address());
    const json r = c.call("get_capacity", capacity_params("a", "db", 5));
    CHECK(r["result"]["resources"].empty());
    CHECK(r["result"]["mastership"]["is_master"] == false);
    CHECK(r["result"]["mastership"]["master"] == master.address());
  }
  asio::io_context io;
  doorman::net::channel ch(io.get_executor(), {.addresses = {follower.address()}});
  const auto reply = run_coroutine_test(
      io, [&] { return ch.call("get_capacity", capacity_params("a", "db", 5)); });
  REQUIRE(reply);
  CHECK(reply.result["resources"][0]["gets"]["capacity"] == 5);
  CHECK(ch.current() == master.address());
}

TEST_CASE("a change to the call machine changes the channel and the simulator alike",
          "[net][channel][sim][call]") {
  // Both drive core/call.hpp's machine, and neither keeps a rule of its own: its redirect limit
  // at 0 ends a call at the first non-master's answer (too_many_redirects) in net::channel and
  // in the simulator; at 1 both follow it to the master.
  for (const int max : {0, 1}) {
    INFO("max_redirects " << max);
    running_node master(fast_config(10));
    running_node<fixed_election> follower(fast_config(10), {},
                                          fixed_election{false, master.address()});
    asio::io_context io;
    doorman::net::channel ch(io.get_executor(),
                             {.addresses = {follower.address()}, .max_redirects = max});
    const auto reply = run_coroutine_test(
        io, [&] { return ch.call("get_capacity", capacity_params("a", "db", 5)); });
    CHECK(static_cast<bool>(reply) == (max > 0));
    if (max == 0) CHECK(reply.error == doorman::errc::too_many_redirects);

    // The simulator: the root's master (task 0) is cut from etcd; task 1 wins at about 4.8 s.
    // A client arriving at 10 s asks task 0 first, which answers that it knows no master.
    doorman::sim::simulation s(
        {.config = R"({"resources": [{"identifier_glob": "*", "capacity": 100,
             "algorithm": {"kind": "FAIR_SHARE", "lease_length": 8, "refresh_interval": 2,
                           "learning_mode_duration": 0}}]})",
         .tasks = 2,
         .election_ttl = 4,
         .call = {.max_redirects = max}});
    const auto root = s.add_job("root", std::nullopt);
    s.cut_election(root, 100);
    s.run_until(doorman::sim::at(10));
    REQUIRE(s.jobs()[root].master_task == 1);
    const auto c = s.add_client("c", root, 10);
    s.run_until(doorman::sim::at(10.5));
    CHECK(s.leased(c) == (max > 0));
  }
}

TEST_CASE("typed calls: each method's request in, its row's response out",
          "[net][channel][typed]") {
  namespace m = doorman::methods;
  running_node root(fast_config(10));
  asio::io_context io;
  doorman::net::channel ch(io.get_executor(), {.addresses = {root.address()}});
  const auto got = run_coroutine_test(io, [&] {
    return ch.call<m::get_capacity>({"a", {{.resource_id = "db", .wants = 4}}});
  });
  REQUIRE(got);
  REQUIRE(got.result.resources.size() == 1);
  CHECK(got.result.resources[0].resource_id == "db");
  CHECK(got.result.resources[0].gets.capacity == 4);
  CHECK(got.result.mastership.is_master);

  const auto st = run_coroutine_test(io, [&] { return ch.call<m::status>({{"db"}, {}}); });
  REQUIRE(st);
  CHECK(st.result.identity.role == "root");
  CHECK(st.result.identity.level == 0);
  REQUIRE(st.result.status.resources.size() == 1);
  CHECK(st.result.status.resources[0].sum_has == 4);
  REQUIRE(st.result.status.leases.size() == 1);
  CHECK(st.result.status.leases[0].client_id == "a");

  const auto d = run_coroutine_test(io, [&] { return ch.call<m::discovery>({}); });
  REQUIRE(d);
  CHECK(d.result.mastership.is_master);
  const auto rel = run_coroutine_test(io, [&] {
    return ch.call<m::release_capacity>({"a", {"db"}});
  });
  REQUIRE(rel);
  const auto after = run_coroutine_test(io, [&] { return ch.call<m::status>({{"db"}, {}}); });
  REQUIRE(after);
  CHECK(after.result.status.leases.empty());

  // A request the node refuses is its error answer, code and message.
  const auto bad = run_coroutine_test(io, [&] {
    return ch.call<m::get_capacity>({"a", {{.resource_id = "db", .wants = -1}}});
  });
  CHECK(bad.error == doorman::errc::error_answer);
  CHECK(bad.code == -32602);
  CHECK_THAT(bad.message, Catch::Contains("params.resources[0].wants"));
}

TEST_CASE(
    "typed calls: what is sent is the request's wire form, a wrongly typed answer a bad "
    "answer naming the field",
    "[net][channel][typed][bounds]") {
  // A peer that records each request and answers status with a level out of range, and
  // get_capacity with a capacity that is a string.
  std::vector<json> seen;
  std::vector<std::string> lines;
  asio::io_context io;
  auto answer = [&](std::string_view line) -> std::optional<std::string> {
    const auto j = json::parse(line);
    seen.push_back(j);
    lines.emplace_back(line);
    const std::string id = j["id"].dump();
    if (j["method"] == "status") {
      return R"({"jsonrpc":"2.0","id":)" + id +
             R"(,"result":{"mastership":{"is_master":true},"resources":[],"level":1000}})";
    }
    return R"({"jsonrpc":"2.0","id":)" + id +
           R"(,"result":{"mastership":{"is_master":true},"resources":[{"resource_id":"db",)"
           R"("gets":{"capacity":"x","expires_in":1,"refresh_interval":1}}]}})";
  };
  doorman::net::server server(io.get_executor(), {}, answer);
  server.listen({"127.0.0.1", "0"});
  server.start();
  doorman::net::channel ch(
      io.get_executor(),
      {.addresses = {"127.0.0.1:" + std::to_string(server.local_endpoint().port())}});
  const auto st = run_coroutine_test(io, [&] {
    return ch.call<doorman::methods::status>({{"db"}, {2, 5}});
  });
  CHECK(st.error == doorman::errc::bad_answer);
  CHECK(st.message == "bad answer: result.level: must be an integer from 0 to 999");
  const auto got = run_coroutine_test(io, [&] {
    return ch.call<doorman::methods::get_capacity>({"a", {{.resource_id = "db", .wants = 4}}});
  });
  CHECK(got.error == doorman::errc::bad_answer);
  CHECK_THAT(got.message, Catch::Contains("result.resources[0].gets.capacity"));
  REQUIRE(seen.size() == 2);
  CHECK(seen[0]["method"] == "status");
  CHECK(seen[0]["params"] == json{{"resource_id", "db"}, {"offset", 2}, {"limit", 5}});
  CHECK(seen[1]["method"] == "get_capacity");
  CHECK(seen[1]["params"] ==
        json{{"client_id", "a"},
             {"resources", {{{"resource_id", "db"}, {"priority", 0}, {"wants", 4.0}}}}});
  // Written without a DOM, byte for byte what the DOM writes.
  const doorman::capacity_request asked{"a", {{.resource_id = "db", .wants = 4}}};
  CHECK(lines[1] ==
        doorman::to_line(
            json{{"jsonrpc", "2.0"}, {"id", 2}, {"method", "get_capacity"}, {"params", asked}}));
  server.stop();
}

TEST_CASE("calls made together on a fresh channel share one connection attempt",
          "[net][channel][fault]") {
  running_node root(fast_config(10));
  asio::io_context io;
  doorman::net::channel ch(io.get_executor(), {.addresses = {root.address()}});
  std::vector<doorman::net::call_reply> replies;
  constexpr int calls = 32;
  for (int i = 0; i < calls; ++i) {
    asio::co_spawn(
        io,
        [&, i]() -> asio::awaitable<void> {
          replies.push_back(co_await ch.call("get_capacity",
                                             capacity_params("c" + std::to_string(i), "db", 0.1)));
          if (replies.size() == calls) io.stop();
        },
        asio::detached);
  }
  io.run_for(std::chrono::seconds(10));  // a deadline: it stops once every call is answered
  REQUIRE(replies.size() == calls);
  for (const auto& r : replies) {
    INFO(r.message);
    CHECK(r);
  }
  CHECK(ch.failures() == 0);
}

TEST_CASE("a channel fails over to the next address and times out when none answers",
          "[net][channel]") {
  running_node root(fast_config(10));
  asio::io_context io;
  // The first address refuses connections (nothing listens on port 1).
  doorman::net::channel ch(io.get_executor(), {.addresses = {"127.0.0.1:1", root.address()}});
  CHECK(run_coroutine_test(io, [&] { return ch.call("discovery", json::object()); }));
  CHECK(ch.current() == root.address());

  asio::io_context io2;
  doorman::net::channel dead(io2.get_executor(),
                             {.addresses = {"127.0.0.1:1"}, .call_timeout = doorman::seconds(0.3)});
  const auto reply =
      run_coroutine_test(io2, [&] { return dead.call("discovery", json::object()); });
  CHECK_FALSE(reply);
  CHECK(reply.error == doorman::errc::unreachable);
}

namespace {

// A peer on its own thread that accepts connections and then either holds them without ever
// answering (`hang`) or closes each at once (`refuse`), counting them.
class faulty_peer {
 public:
  enum class mode { hang, refuse };
  explicit faulty_peer(mode m)
      : mode_(m), acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  faulty_peer(const faulty_peer&) = delete;
  faulty_peer& operator=(const faulty_peer&) = delete;
  ~faulty_peer() {
    asio::post(io_, [this] {
      acceptor_.close();
      held_.clear();
    });
    io_.stop();
    thread_.join();
  }
  [[nodiscard]] std::string address() const {
    return "127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
  }
  [[nodiscard]] int accepted() const { return accepted_.load(); }

 private:
  void accept() {
    acceptor_.async_accept([this](std::error_code ec, asio::ip::tcp::socket s) {
      if (ec) return;
      ++accepted_;
      if (mode_ == mode::hang) held_.push_back(std::move(s));  // else closed as it goes
      accept();
    });
  }
  mode mode_;
  asio::io_context io_;
  asio::ip::tcp::acceptor acceptor_;
  std::vector<asio::ip::tcp::socket> held_;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("a call that passes its deadline leaves a hung peer: the next goes to the next address",
          "[net][channel][fault]") {
  faulty_peer hung(faulty_peer::mode::hang);
  running_node root(fast_config(10));
  asio::io_context io;
  doorman::net::channel ch(io.get_executor(), {.addresses = {hung.address(), root.address()},
                                               .call_timeout = doorman::seconds(0.3)});
  const auto first = run_coroutine_test(io, [&] { return ch.call("discovery", json::object()); });
  CHECK(first.error == doorman::errc::timed_out);
  CHECK(ch.current() == root.address());  // left the hung peer
  CHECK_FALSE(ch.connected());
  const auto second = run_coroutine_test(io, [&] { return ch.call("discovery", json::object()); });
  CHECK(second);
  CHECK(ch.failures() == 0);
  CHECK(hung.accepted() == 1);
}

#ifdef DOORMAN_TLS
TEST_CASE("a channel reports why it failed, not the attempt its own deadline cut short",
          "[net][channel][fault]") {
  // The first address refuses; the second accepts and never answers the TLS handshake, which
  // the call's deadline (shorter than connect_timeout) cuts short.
  faulty_peer hung(faulty_peer::mode::hang);
  asio::io_context io;
  doorman::net::tls_options tls;
  tls.enabled = true;
  doorman::net::channel ch(io.get_executor(), {.addresses = {"127.0.0.1:1", hung.address()},
                                               .call_timeout = doorman::seconds(0.4),
                                               .tls = tls});
  const auto r = run_coroutine_test(io, [&] { return ch.call("discovery", json::object()); });
  CHECK(r.error == doorman::errc::unreachable);
  CHECK(hung.accepted() == 1);
  CHECK_THAT(r.message, Catch::Contains("cannot connect to 127.0.0.1:1"));
  CHECK_THAT(r.message, !Catch::Contains("timed out"));
}
#endif

TEST_CASE("a refused channel backs off instead of reconnecting at once", "[net][channel][fault]") {
  using clock = std::chrono::steady_clock;
  // Calls one after another for `span`, as a refresh loop or a retrying CLI would.
  std::string said;  // the first failed call's message
  const auto hammer = [&said](const std::string& address, std::chrono::milliseconds span) {
    asio::io_context io;
    doorman::net::channel ch(io.get_executor(),
                             {.addresses = {address}, .call_timeout = doorman::seconds(0.5)});
    int calls = 0;
    const auto until = clock::now() + span;
    while (clock::now() < until) {
      const auto r = run_coroutine_test(io, [&] { return ch.call("discovery", json::object()); });
      CHECK_FALSE(r);
      if (said.empty()) said = r.message;
      ++calls;
    }
    return calls;
  };
  SECTION("accepted, then closed before any answer") {
    faulty_peer refuser(faulty_peer::mode::refuse);
    hammer(refuser.address(), 2s);
    // Backoff from 50 ms doubling (jittered ½–1): about 6 attempts in 2 s, thousands without.
    INFO("connections in 2 s: " << refuser.accepted());
    CHECK(refuser.accepted() >= 3);
    CHECK(refuser.accepted() <= 12);
  }
  SECTION("over the connection limit, with a retry hint") {
    doorman::node_options options;
    options.server.max_connections = 0;
    options.server.refused_retry_after = doorman::seconds(0.8);
    running_node full(fast_config(10), options);
    hammer(full.address(), 2s);
    full.stop();
    const std::size_t refused = full.node().server().refused();
    INFO("connections in 2 s: " << refused);
    CHECK(refused >= 2);
    CHECK(refused <= 4);  // one per 0.8 s at most
    // The refusal is said as the node said it, not as an end of file.
    CHECK_THAT(said, Catch::Contains("refused (-32000 too many connections; try again later; "
                                     "retry after 0.8 s)"));
  }
}

TEST_CASE("a call bounded by a lease reaches a peer back within the channel's backoff",
          "[net][channel][fault]") {
  // A peer restarts: its port refuses for a while, and the channel backs off (2-4 s here). A
  // refresh whose lease has 2 s left calls with a deadline of 1 s (half of it); the peer is
  // back. The call must try it within its deadline, not fail because the backoff runs longer
  // than the lease.
  using clock = std::chrono::steady_clock;
  running_node root(fast_config(10));
  link_proxy restarting(root.address());
  asio::io_context io;
  doorman::net::channel ch(io.get_executor(), {.addresses = {restarting.address()},
                                               .initial_backoff = doorman::seconds(4),
                                               .maximum_backoff = doorman::seconds(4)});
  const auto call = [&](double timeout) {
    return run_coroutine_test(
        io, [&] { return ch.call("discovery", json::object(), true, doorman::seconds(timeout)); });
  };
  REQUIRE(call(1));
  restarting.refuse();
  const auto down = call(1);
  CHECK(down.error == doorman::errc::unreachable);
  CHECK(ch.failures() >= 1);  // backing off now, 2-4 s
  restarting.accept_again();
  const auto start = clock::now();
  const auto back = call(1);
  INFO(back.message);
  CHECK(back);
  CHECK(clock::now() - start < 1s);
  CHECK(ch.failures() == 0);
  // A call that has already made its attempt waits the backoff out: one early attempt a call.
  restarting.refuse();
  (void)call(1);
  const auto failures = ch.failures();
  const auto again = call(0.2);  // its early attempt, at 0.1 s: refused, then no more
  CHECK_FALSE(again);
  CHECK(ch.failures() == failures + 1);
}

namespace {

// A requester that sends `calls` discovery requests, then sleeps for a day.
struct counting_requester {
  using clock = std::chrono::steady_clock;
  int calls = 0;
  int answered = 0;
  int failed = 0;
  doorman::refresh_step<clock::time_point> next(clock::time_point now) const {
    if (answered + failed < calls) return {true, now};
    return {false, now + 24h};
  }
  doorman::net::outgoing_call<doorman::methods::discovery> request(clock::time_point) const {
    return {};
  }
  asio::awaitable<void> on_reply(doorman::net::reply_of<doorman::methods::discovery> reply,
                                 clock::time_point) {
    if (reply && reply.result.mastership.is_master) {
      ++answered;
    } else {
      ++failed;
    }
    co_return;
  }
};

}  // namespace

TEST_CASE("the refresh driver sends what its machine asks and stops when cancelled",
          "[net][refresh]") {
  running_node root(fast_config(10));
  asio::io_context io;
  doorman::net::channel ch(io.get_executor(), {.addresses = {root.address()}});
  counting_requester r{.calls = 3};
  doorman::net::refresh_driver<counting_requester> driver(io.get_executor(), r, ch, "test loop",
                                                          nullptr);
  asio::cancellation_signal cancel;
  std::promise<std::error_code> done;
  auto result = done.get_future();
  driver.async_run(
      asio::bind_cancellation_slot(cancel.slot(), [&](std::error_code ec) { done.set_value(ec); }));
  REQUIRE(eventually([&] {
    io.run_for(10ms);
    return r.answered == 3;
  }));
  CHECK(r.failed == 0);
  CHECK(driver.wakes_at() > steady::now() + 23h);  // asleep until its machine's time
  r.calls = 4;
  driver.reschedule();  // news: looks again at once
  REQUIRE(eventually([&] {
    io.run_for(10ms);
    return r.answered == 4;
  }));
  cancel.emit(asio::cancellation_type::terminal);
  run_until_ready(io, result);
  CHECK(result.get() == asio::error::operation_aborted);
  CHECK(driver.stopped());
}
