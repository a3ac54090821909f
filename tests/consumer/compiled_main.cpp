// Uses compiled definitions from a unit that only sees their declarations: a coroutine
// (net::channel::call), whose call to a closed port fails as unreachable before its deadline,
// and the client, whose loop and channel the unit never sees.
#include <doorman/client.hpp>
#include <doorman/net/channel.hpp>

#include <cstdio>

int main() {
  asio::io_context io;
  doorman::net::channel ch(io.get_executor(), {.addresses = {"127.0.0.1:1"}});
  doorman::net::call_reply reply;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        reply = co_await ch.call("status", nlohmann::json::object(), true, doorman::seconds(0.5));
      },
      asio::detached);
  io.run();
  if (reply || reply.error != doorman::errc::unreachable) {
    std::printf("consumer_compiled: unexpected reply: %s\n", reply.message.c_str());
    return 1;
  }
  doorman::client client({.addresses = {"127.0.0.1:1"}, .call_timeout = doorman::seconds(0.5)});
  doorman::rate_resource api(client, "api", {.mode = doorman::fallback::pessimistic});
  if (api.try_acquire()) {
    std::puts("consumer_compiled: admitted with no lease and a pessimistic fallback");
    return 1;
  }
  std::puts("consumer_compiled: ok");
  return 0;
}
