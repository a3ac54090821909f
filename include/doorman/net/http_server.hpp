#pragma once

/// \file
/// The smallest HTTP/1.1 server the admin endpoint needs: `GET` and `HEAD`, one request per
/// connection (`Connection: close`), no request body. Every connection is bounded: the request
/// head in bytes, header lines and time, the whole exchange in time, and the number of
/// connections open at once, in all and per peer address. A connection that comes when either
/// limit is reached takes the place of the oldest one still waiting for its request head, so a
/// flood of idle connections cannot keep a health check out. The handler is synchronous and
/// runs on the server's executor.
///
///     doorman::net::http_server admin(strand, {}, [&](const doorman::net::http_request& r) {
///       return doorman::net::http_answer{200, "text/plain; charset=utf-8", "ok\n"};
///     });
///     admin.listen(*doorman::net::parse_address("127.0.0.1:7780"));
///     admin.start();

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>

#include "doorman/core/linkage.hpp"
#include "doorman/core/log_throttle.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/framing.hpp"
#include "doorman/net/http_request.hpp"
#include "doorman/net/listener.hpp"
#include "doorman/net/server.hpp"

namespace doorman::net {

/// Limits of an HTTP server, with their defaults.
struct http_server_options {
  /// Longest request head (request line and headers); 431 beyond.
  std::size_t max_head_bytes = 16 * 1024;
  /// Target length and header count (see `http_request_limits`).
  http_request_limits request{};
  /// Connections open at once. One beyond takes the place of the oldest connection still
  /// waiting for its request head; when every connection is past its head, it is answered 503
  /// and closed.
  std::size_t max_connections = 64;
  /// Connections open at once from one peer address (IP), the same way.
  std::size_t max_connections_per_peer = 16;
  /// Deadline of the request head (and the TLS handshake), from the accept.
  seconds head_timeout{2};
  /// Deadline of one whole exchange: reading the head, then writing the answer.
  seconds timeout{10};
};

/// The server: an accept loop and one short-lived coroutine per connection.
class http_server : public detail::accepting<http_server> {
 public:
  /// Called for every well-formed GET or HEAD request, with who sent it.
  using handler_type = std::function<http_answer(const http_request&, const peer_info&)>;
  /// A handler that does not look at the peer.
  using request_handler = std::function<http_answer(const http_request&)>;

  http_server(asio::any_io_executor executor, http_server_options options, handler_type handler,
              log_type log = {})
      : accepting(std::move(executor), "admin accept", std::move(log)),
        options_(options),
        handler_(std::move(handler)) {}

  http_server(asio::any_io_executor executor, http_server_options options, request_handler handler,
              log_type log = {})
      : http_server(std::move(executor), options,
                    handler_type([h = std::move(handler)](const http_request& r, const peer_info&) {
                      return h(r);
                    }),
                    std::move(log)) {}

  ~http_server() { close_all(); }

  /// Stops accepting and closes every connection. Call it on the executor.
  void stop() {
    listener_.stop();
    close_all();
  }

  [[nodiscard]] std::size_t connections() const noexcept { return open_.size(); }
  /// Connections refused for `max_connections`, since the start.
  [[nodiscard]] std::size_t refused() const noexcept { return refused_; }
  /// Connections closed before their request head to make room for a newer one.
  [[nodiscard]] std::size_t evicted() const noexcept { return evicted_; }

 private:
  friend class detail::accepting<http_server>;
  using socket_ptr = std::shared_ptr<stream>;

  struct connection {
    socket_ptr s;
    std::string ip;
    bool head_read = false;
  };
  using connection_ptr = std::shared_ptr<connection>;

  void close_all() {
    for (const auto& [seq, c] : open_)
      c->s->close();
    open_.clear();
  }

  // Makes room for a connection from `ip`: true when there is room (after closing the oldest
  // connection still waiting for its head, of that peer when the peer is at its limit).
  bool make_room(const std::string& ip) {
    std::size_t from_peer = 0;
    for (const auto& [seq, c] : open_)
      from_peer += c->ip == ip ? 1 : 0;
    const bool peer_full = from_peer >= options_.max_connections_per_peer;
    if (!peer_full && open_.size() < options_.max_connections) return true;
    for (auto it = open_.begin(); it != open_.end(); ++it) {
      const connection& c = *it->second;
      if (c.head_read || (peer_full && c.ip != ip)) continue;
      c.s->close();
      open_.erase(it);
      ++evicted_;
      warn(
          fmt::format("admin: closed a connection from {} that sent no request (the connection "
                      "limits are reached; {} closed so far)",
                      c.ip, evicted_));
      return true;
    }
    return false;
  }

  void warn(std::string line) {
    log_throttle_.log(log_, "warning: " + std::move(line), std::chrono::steady_clock::now());
  }

  DOORMAN_DECL void on_accept(asio::ip::tcp::socket socket);

  // Reads one request head (before the head deadline), answers it, closes; all before the
  // exchange's deadline.
  DOORMAN_DECL asio::awaitable<void> exchange(connection_ptr c, std::uint64_t seq);

  http_answer respond(const http_request& r, const peer_info& peer, bool& head_only) {
    if (r.status != 0) return detail::http_error(r.status, r.reason);
    if (r.method != "GET" && r.method != "HEAD") {
      auto a = detail::http_error(405, "only GET and HEAD are served");
      a.headers.push_back("Allow: GET, HEAD");
      return a;
    }
    head_only = r.method == "HEAD";
    try {
      return handler_(r, peer);
    } catch (const std::exception& e) {
      return detail::http_error(500, e.what());
    }
  }

  http_server_options options_;
  handler_type handler_;
  std::map<std::uint64_t, connection_ptr> open_;  // in the order they were accepted
  std::uint64_t next_seq_ = 0;
  std::size_t refused_ = 0;
  std::size_t evicted_ = 0;
  log_throttle<std::chrono::steady_clock::time_point> log_throttle_{seconds(10)};
};

}  // namespace doorman::net

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/net/impl/http_server.ipp"
#endif
