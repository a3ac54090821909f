#pragma once

/// \file
/// The smallest HTTP/1.1 client the etcd gateway needs: one POST of a JSON body per
/// connection (`Connection: close`), the whole answer read until the peer closes, within a
/// deadline, over plaintext or TLS. Chunked answers are decoded; answers longer than a limit
/// are refused.
///
///     auto r = co_await doorman::net::http_post(executor, "127.0.0.1:2379", "/v3/kv/range",
///                                               R"({"key":"Zm9v"})", deadline);
///     if (!r.error && r.status == 200) use(r.body);

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include <fmt/format.h>
#include <asio.hpp>

#include "doorman/core/error.hpp"
#include "doorman/core/linkage.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/framing.hpp"
#include "doorman/net/tls.hpp"

namespace doorman::net {

/// An HTTP answer, or why there is none: `error` (`errc::bad_answer`, `timed_out`,
/// `unreachable` or a socket error) with `message` in words.
struct http_response {
  int status = 0;
  std::string body;
  std::error_code error;
  std::string message;
};

namespace detail {

inline http_response http_failure(std::error_code error, std::string message) {
  http_response r;
  r.error = error;
  r.message = std::move(message);
  return r;
}

// A chunked body ("<hex size>[;ext]\r\n<data>\r\n" ... "0\r\n\r\n") joined, or why not.
inline http_response dechunk(std::string_view body, int status) {
  http_response r;
  r.status = status;
  for (;;) {
    const auto eol = body.find("\r\n");
    if (eol == std::string_view::npos)
      return http_failure(errc::bad_answer, "truncated chunked HTTP answer");
    std::size_t size = 0;
    std::size_t digits = 0;
    for (const char c : body.substr(0, eol)) {
      int v = -1;
      if (c >= '0' && c <= '9') v = c - '0';
      if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
      if (v < 0) break;
      if (++digits > 8) return http_failure(errc::bad_answer, "HTTP chunk too long");
      size = size * 16 + static_cast<std::size_t>(v);
    }
    if (digits == 0) return http_failure(errc::bad_answer, "malformed HTTP chunk size");
    body.remove_prefix(eol + 2);
    if (size == 0) return r;
    if (body.size() < size + 2)
      return http_failure(errc::bad_answer, "truncated chunked HTTP answer");
    r.body.append(body.substr(0, size));
    body.remove_prefix(size + 2);
  }
}

// Splits a raw answer (status line, headers, body) into an http_response.
inline http_response parse_http_response(std::string_view raw) {
  const auto head_end = raw.find("\r\n\r\n");
  if (head_end == std::string_view::npos || !raw.starts_with("HTTP/1.")) {
    return http_failure(errc::bad_answer, "malformed HTTP answer");
  }
  const std::string_view head = raw.substr(0, head_end);
  const std::string_view body = raw.substr(head_end + 4);
  const auto sp = head.find(' ');
  if (sp == std::string_view::npos || head.size() < sp + 4) {
    return http_failure(errc::bad_answer, "malformed HTTP status line");
  }
  int status = 0;
  for (std::size_t i = sp + 1; i < sp + 4; ++i) {
    const char c = head[i];
    if (c < '0' || c > '9') return http_failure(errc::bad_answer, "malformed HTTP status line");
    status = status * 10 + (c - '0');
  }
  std::string lower(head);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.find("\r\ntransfer-encoding: chunked") != std::string::npos)
    return dechunk(body, status);
  http_response r;
  r.status = status;
  r.body = std::string(body);
  return r;
}

// The answer once the exchange ended: `expired` at the deadline, else the socket's last error
// (the peer's close is how the answer ends), else what `raw` holds.
inline http_response http_outcome(bool expired, std::error_code ec, std::string_view raw) {
#ifdef DOORMAN_TLS
  if (ec == asio::ssl::error::stream_truncated) ec = asio::error::eof;  // no close_notify
#endif
  if (expired) return http_failure(errc::timed_out, "no answer before the deadline");
  if (ec && ec != asio::error::eof) return http_failure(ec, ec.message());
  return parse_http_response(raw);
}

}  // namespace detail

/// For an answer that streams (etcd's watch): `stop_when(raw)` is asked after each read with
/// every byte read so far (status line and headers included) and ends the exchange when it
/// says so; `on_open(close)` gets, once connected, a function that closes the connection (any
/// thread of the executor), for a caller that must be able to end a long read early.
struct http_stream_hooks {
  std::function<bool(std::string_view raw)> stop_when{};
  std::function<void(std::function<void()> close)> on_open{};
};

/// POSTs `body` (JSON) to `http://address/path` (`https://` with `tls`, checking that the
/// server's certificate names the address's host); the answer, or an error at `deadline`, when
/// the peer is unreachable, or when the answer exceeds `max_bytes`. With `hooks.stop_when`
/// saying stop: an answer with status 0, no error and no body (the caller read what it needed).
DOORMAN_DECL asio::awaitable<http_response> http_post(
    asio::any_io_executor executor, std::string address, std::string path, std::string body,
    std::chrono::steady_clock::time_point deadline, std::size_t max_bytes = std::size_t{1} << 20,
    ssl_context_ptr tls = {}, http_stream_hooks hooks = {});

}  // namespace doorman::net

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/net/impl/http.ipp"
#endif
