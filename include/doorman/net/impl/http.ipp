#pragma once

/// \file
/// The HTTP client's coroutines (declared in <doorman/net/http.hpp>): included by that header when
/// header-only, compiled once by <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/net/http.hpp"

namespace doorman::net {

DOORMAN_DECL asio::awaitable<http_response> http_post(
    asio::any_io_executor executor, std::string address, std::string path, std::string body,
    std::chrono::steady_clock::time_point deadline, std::size_t max_bytes, ssl_context_ptr tls,
    http_stream_hooks hooks) {
  const auto a = parse_address(address);
  if (!a) {
    co_return detail::http_failure(std::make_error_code(std::errc::invalid_argument),
                                   fmt::format("expected host:port, got \"{}\"", address));
  }
  auto socket = std::make_shared<stream>(executor, tls);
  const socket_deadline guard(executor, deadline, [socket] { socket->close(); });
  std::error_code ec;
  asio::ip::tcp::resolver resolver(executor);
  const auto endpoints = co_await resolver.async_resolve(
      a->host, a->port, asio::redirect_error(asio::use_awaitable, ec));
  if (!ec && !guard.expired()) {
    co_await asio::async_connect(socket->socket(), endpoints,
                                 asio::redirect_error(asio::use_awaitable, ec));
  }
  if (!ec && !guard.expired()) co_await socket->handshake(tls_side::client, a->host, ec);
  if (!ec && !guard.expired() && hooks.on_open) {
    hooks.on_open([weak = std::weak_ptr<stream>(socket)] {
      if (auto s = weak.lock()) s->close();
    });
  }
  std::string raw;
  if (!ec && !guard.expired()) {
    const std::string request = fmt::format(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n"
        "Content-Length: {}\r\nConnection: close\r\n\r\n{}",
        path, address, body.size(), body);
    co_await asio::async_write(*socket, asio::buffer(request),
                               asio::redirect_error(asio::use_awaitable, ec));
  }
  while (!ec && !guard.expired()) {
    char chunk[8192];
    const std::size_t n = co_await socket->async_read_some(
        asio::buffer(chunk), asio::redirect_error(asio::use_awaitable, ec));
    raw.append(chunk, n);
    if (raw.size() > max_bytes) {
      co_return detail::http_failure(errc::bad_answer,
                                     fmt::format("answer longer than {} bytes", max_bytes));
    }
    if (n > 0 && hooks.stop_when && hooks.stop_when(raw)) {
      socket->close();
      co_return http_response{};  // status 0, no error: the caller has what it needed
    }
  }
  socket->close();
  co_return detail::http_outcome(guard.expired(), ec, raw);
}

}  // namespace doorman::net
