// doorman-http-429: a tiny HTTP service that keeps to its share of a global rate. Every request
// asks the resource's lease for a permit (try_acquire, never blocking): admitted requests get
// 200, the others 429 Too Many Requests with a Retry-After header saying when a permit will be
// there. The demand it reports is measured from all requests, answered or refused.
//
//   doorman-http-429 --server 127.0.0.1:7700 --listen 127.0.0.1:8080 --resource api
//   curl -i http://127.0.0.1:8080/
//
// One request per connection (Connection: close); requests are read up to 8 KiB of headers.

#include <doorman/client.hpp>

#include <fmt/format.h>
#include <asio.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "arguments.hpp"

namespace {

asio::awaitable<void> serve(asio::ip::tcp::socket socket, doorman::rate_resource& api) {
  std::string request;
  std::error_code ec;
  // Read the request head (a client that sends nothing is dropped after 5 s).
  asio::steady_timer deadline(socket.get_executor(), std::chrono::seconds(5));
  deadline.async_wait([&](std::error_code e) {
    if (!e) socket.close();
  });
  co_await asio::async_read_until(socket, asio::dynamic_buffer(request, 8192), "\r\n\r\n",
                                  asio::redirect_error(asio::use_awaitable, ec));
  deadline.cancel();
  if (ec) co_return;
  std::string response;
  if (request.rfind("GET ", 0) != 0 && request.rfind("POST ", 0) != 0) {
    response = "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  } else if (const auto r = api.try_acquire()) {
    response =
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n"
        "Connection: close\r\n\r\nok\n";
  } else {
    // Retry-After is whole seconds, rounded up; while the capacity is 0 the client's next
    // refresh is the earliest a permit can appear, so say 1.
    const double wait = r.retry_after == doorman::rate_limiter::duration::max()
                            ? 1.0
                            : std::ceil(doorman::to_seconds(r.retry_after));
    response = fmt::format(
        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {}\r\nContent-Type: text/plain\r\n"
        "Content-Length: 18\r\nConnection: close\r\n\r\ntoo many requests\n",
        std::max(1.0, wait));
  }
  co_await asio::async_write(socket, asio::buffer(response),
                             asio::redirect_error(asio::use_awaitable, ec));
  socket.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
}

asio::awaitable<void> accept(asio::ip::tcp::acceptor& acceptor, doorman::rate_resource& api) {
  for (;;) {
    std::error_code ec;
    auto socket = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (ec == asio::error::operation_aborted) co_return;
    if (ec) continue;
    asio::co_spawn(acceptor.get_executor(), serve(std::move(socket), api), asio::detached);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:8080";
  doorman_examples::client_flags flags{.resource = "api"};
  try {
    doorman_examples::arguments args(argc, argv);
    const bool go = args.parse(
        "usage: doorman-http-429 [--server HOST:PORT[,...]] [--listen HOST:PORT]"
        " [--resource ID]\n",
        [&](const std::string& flag) {
          if (flag != "--listen") return flags.parse(flag, args);
          listen = args.value();
          return true;
        });
    if (!go) return 0;
    const auto at = doorman::net::parse_address(listen);
    if (!at) throw std::invalid_argument("--listen: expected host:port, got " + listen);

    doorman::client_options options;
    options.addresses = doorman::net::split_list(flags.server);
    options.log = [](std::string_view line) { fmt::print(stderr, "{}\n", line); };
    doorman::client client(options);
    doorman::rate_resource api(client, flags.resource);

    asio::io_context io;
    asio::ip::tcp::acceptor acceptor(io);
    const asio::ip::tcp::endpoint endpoint(asio::ip::make_address(at->host),
                                           static_cast<unsigned short>(std::stoi(at->port)));
    acceptor.open(endpoint.protocol());
    acceptor.set_option(asio::ip::tcp::acceptor::reuse_address(true));
    acceptor.bind(endpoint);
    acceptor.listen();
    fmt::print(stderr, "doorman-http-429 listening on {}:{}\n",
               acceptor.local_endpoint().address().to_string(), acceptor.local_endpoint().port());
    asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](std::error_code, int) {
      acceptor.close();
      io.stop();
    });
    asio::co_spawn(io, accept(acceptor, api), asio::detached);
    io.run();
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "doorman-http-429: {}\n", e.what());
    return 2;
  }
}
