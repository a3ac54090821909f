#pragma once

/// \file
/// The coroutines of net::http server, and what spawns them (declared in
/// <doorman/net/http_server.hpp>): included by that header when header-only, compiled once by
/// <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/net/http_server.hpp"

namespace doorman::net {

DOORMAN_DECL asio::awaitable<void> http_server::exchange(connection_ptr c, std::uint64_t seq) {
  const socket_ptr s = c->s;
  const auto accepted = std::chrono::steady_clock::now();
  const socket_deadline guard(
      executor_,
      accepted + to_duration<std::chrono::steady_clock::duration>(options_.timeout.count()),
      [s] { s->close(); });
  std::optional<socket_deadline> head_guard;
  head_guard.emplace(executor_,
                     accepted + to_duration<std::chrono::steady_clock::duration>(
                                    std::min(options_.head_timeout, options_.timeout).count()),
                     [s] { s->close(); });
  peer_info peer;
  peer.address = detail::peer_of(s->socket());
  peer.secure = s->secure();
  std::string head;
  std::array<char, 4096> chunk;
  std::error_code ec;
  http_answer answer;
  bool head_only = false;
  co_await s->handshake(tls_side::server, {}, ec);
  peer.identity = s->identity();
  for (; !ec;) {
    const std::size_t n = co_await s->async_read_some(
        asio::buffer(chunk), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;
    const std::size_t scanned_from = head.size() < 3 ? 0 : head.size() - 3;
    head.append(chunk.data(), n);
    const auto end = head.find("\r\n\r\n", scanned_from);
    const auto bare = head.find("\n\n", scanned_from);
    if (end == std::string::npos && bare == std::string::npos) {
      if (head.size() > options_.max_head_bytes) {
        answer = detail::http_error(431, "request head too long");
        break;
      }
      continue;
    }
    const std::size_t stop = std::min(end == std::string::npos ? head.size() : end + 4,
                                      bare == std::string::npos ? head.size() : bare + 2);
    if (stop > options_.max_head_bytes) {
      answer = detail::http_error(431, "request head too long");
      break;
    }
    c->head_read = true;
    head_guard.reset();
    answer = respond(parse_http_request(std::string_view(head).substr(0, stop), options_.request),
                     peer, head_only);
    break;
  }
  if (!ec && !guard.expired()) {
    const std::string bytes = detail::http_serialize(answer, head_only);
    co_await asio::async_write(*s, asio::buffer(bytes),
                               asio::redirect_error(asio::use_awaitable, ec));
    s->socket().shutdown(asio::socket_base::shutdown_send, ec);
  }
  s->close();
  open_.erase(seq);
}
DOORMAN_DECL void http_server::on_accept(asio::ip::tcp::socket socket) {
  std::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  const std::string ip = ec ? std::string() : remote.address().to_string();
  if (!make_room(ip)) {
    ++refused_;
    warn(
        fmt::format("admin: refused a connection from {}: every connection is busy ({} "
                    "refused so far)",
                    ip, refused_));
    // Over TLS the 503 would have to wait for a handshake: the connection is only closed.
    refuse(socket, listener_.secure()
                       ? std::string()
                       : detail::http_serialize(
                             detail::http_error(503, "too many admin connections"), false));
    return;
  }
  auto c = std::make_shared<connection>(
      connection{std::make_shared<stream>(std::move(socket), listener_.tls()), ip});
  const std::uint64_t seq = next_seq_++;
  open_.emplace(seq, c);
  asio::co_spawn(executor_, exchange(c, seq), asio::detached);
}

}  // namespace doorman::net
