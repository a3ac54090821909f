// The channel (redirects, failover, deadlines) and the refresh driver.

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
  doorman::net::outgoing_call request(clock::time_point) const {
    return {"discovery", json::object(), std::nullopt};
  }
  asio::awaitable<void> on_reply(doorman::net::call_reply reply, clock::time_point) {
    if (reply && reply.result.contains("mastership")) {
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
