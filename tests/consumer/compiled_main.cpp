// Uses a compiled coroutine (net::channel::call) from a unit that only sees its declaration:
// a call to a closed port fails as unreachable before its deadline.
#include <doorman/client.hpp>

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
  std::puts("consumer_compiled: ok");
  return 0;
}
