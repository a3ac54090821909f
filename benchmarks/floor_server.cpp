// doorman_bench_floor: the least a server of doorman's JSON-RPC traffic can do, as the floor
// that doorman_bench_load compares doorman-node with (benchmarks/README.md).
//
//   doorman_bench_floor [--listen HOST:PORT]
//
// For each connection: reads what has arrived, and for each complete line finds its
// "client_id", looks it up in a hash table of the ids seen (adding it), and appends a fixed
// answer of the size of doorman-node's; then writes the answers of that read in one call. No
// JSON parsing, no decision, no lease: what any server of this traffic pays in the kernel and
// the event loop. Says "listening on HOST:PORT" on stderr; stops on SIGTERM.

#include <fmt/format.h>
#include <asio.hpp>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "arguments.hpp"

namespace {

// As doorman-node answers a get_capacity of one resource (the same bytes on the wire).
constexpr std::string_view answer_head = R"({"jsonrpc":"2.0","id":)";
constexpr std::string_view answer_tail =
    R"(,"result":{"resources":[{"resource_id":"api","gets":{"capacity":29.75,)"
    R"("expires_in":60,"refresh_interval":16},"safe_capacity":0}],)"
    R"("mastership":{"is_master":true}}})"
    "\n";

class floor_server {
 public:
  explicit floor_server(asio::io_context& io, const asio::ip::tcp::endpoint& at)
      : acceptor_(io, at) {}

  [[nodiscard]] std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

  asio::awaitable<void> accept() {
    for (;;) {
      auto socket = co_await acceptor_.async_accept(asio::use_awaitable);
      socket.set_option(asio::ip::tcp::no_delay(true));
      asio::co_spawn(acceptor_.get_executor(), serve(std::move(socket)), asio::detached);
    }
  }

  void stop() { acceptor_.close(); }

 private:
  // The id of a request line (what follows "id":), and its client id's entry in the table.
  void answer(std::string_view line, std::string& out) {
    std::string_view id = "null";
    if (const auto at = line.find("\"id\":"); at != std::string_view::npos) {
      const auto end = line.find(',', at + 5);
      id = line.substr(at + 5, end == std::string_view::npos ? 0 : end - at - 5);
    }
    constexpr std::string_view key = "\"client_id\":\"";
    if (const auto at = line.find(key); at != std::string_view::npos) {
      const auto end = line.find('"', at + key.size());
      const auto client = line.substr(at + key.size(), end - at - key.size());
      auto [it, added] = clients_.try_emplace(std::string(client), clients_.size());
      (void)it, (void)added;
    }
    out += answer_head;
    out += id;
    out += answer_tail;
  }

  asio::awaitable<void> serve(asio::ip::tcp::socket socket) {
    std::string in;
    std::string out;
    char chunk[1 << 16];
    for (;;) {
      std::error_code ec;
      const auto n = co_await socket.async_read_some(asio::buffer(chunk),
                                                     asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      in.append(chunk, n);
      std::size_t start = 0;
      for (std::size_t nl; (nl = in.find('\n', start)) != std::string::npos; start = nl + 1)
        answer(std::string_view(in).substr(start, nl - start), out);
      in.erase(0, start);
      if (out.empty()) continue;
      co_await asio::async_write(socket, asio::buffer(out),
                                 asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
      out.clear();
    }
  }

  asio::ip::tcp::acceptor acceptor_;
  std::unordered_map<std::string, std::uint32_t> clients_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0";
  return doorman_examples::run_program(
      argc, argv, "doorman_bench_floor", "usage: doorman_bench_floor [--listen HOST:PORT]\n",
      {{"--listen", [&](auto& a) { listen = a.value(); }}}, [&] {
        const auto colon = listen.rfind(':');
        asio::io_context io(1);
        floor_server server(io, {asio::ip::make_address(listen.substr(0, colon)),
                                 static_cast<std::uint16_t>(std::stoi(listen.substr(colon + 1)))});
        asio::signal_set stop(io, SIGTERM, SIGINT);
        stop.async_wait([&](std::error_code, int) {
          server.stop();
          io.stop();
        });
        asio::co_spawn(io, server.accept(), asio::detached);
        fmt::print(stderr, "listening on {}:{}\n", listen.substr(0, colon), server.port());
        std::fflush(stderr);
        io.run();
        return 0;
      });
}
