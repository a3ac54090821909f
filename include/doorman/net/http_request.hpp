#pragma once

/// \file
/// The admin endpoint's HTTP/1.1 messages, sans-I/O: the head of a request (request line and
/// headers, up to the blank line) parsed into a method, a decoded path, query parameters and
/// headers, or the status to refuse it with; and an answer (`http_answer`) with its bytes.
/// Nothing else of HTTP is needed: the admin endpoint serves `GET` and `HEAD` only, reads no
/// body, and closes after each answer.
///
///     const auto r = doorman::net::parse_http_request(head);  // head ends with "\r\n\r\n"
///     if (r.status != 0) refuse(r.status, r.reason);
///     else serve(r.method, r.path, r.query("page"));

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace doorman::net {

/// A parsed request head. `status` is 0 when it is well formed; otherwise the HTTP status to
/// answer (400, 414, 431, 505) and `reason` says what was wrong.
struct http_request {
  int status = 0;
  std::string reason;
  std::string method;  ///< e.g. "GET"
  std::string path;    ///< percent-decoded, e.g. "/status/resources/a b"
  std::vector<std::pair<std::string, std::string>> parameters;  ///< the query, decoded
  /// Header lines: names in lower case, values without the blanks around them.
  std::vector<std::pair<std::string, std::string>> headers;

  /// The first query parameter named `name`.
  [[nodiscard]] std::optional<std::string> query(std::string_view name) const {
    for (const auto& [k, v] : parameters)
      if (k == name) return v;
    return std::nullopt;
  }

  /// The first header named `name` (in lower case, e.g. "x-api-key").
  [[nodiscard]] std::optional<std::string> header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return std::nullopt;
  }
};

/// Bounds of a request head.
struct http_request_limits {
  std::size_t max_target = 2048;  ///< longest request target (414 beyond)
  std::size_t max_headers = 64;   ///< most header lines (431 beyond)
};

namespace detail {

inline http_request http_refusal(int status, std::string reason) {
  http_request r;
  r.status = status;
  r.reason = std::move(reason);
  return r;
}

inline int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// `%XX` decoded (and '+' as a space where `plus_is_space`); nothing when an escape is broken.
inline std::optional<std::string> percent_decode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size()) return std::nullopt;
      const int hi = hex_value(s[i + 1]);
      const int lo = hex_value(s[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (s[i] == '+' && plus_is_space) {
      out += ' ';
    } else {
      out += s[i];
    }
  }
  return out;
}

// A method is an RFC 9110 token: visible ASCII other than separators.
inline bool is_token_char(char c) noexcept {
  if (c <= ' ' || c >= 127) return false;
  return std::string_view("\"(),/:;<=>?@[\\]{}").find(c) == std::string_view::npos;
}

inline bool parse_query(std::string_view q, http_request& r) {
  while (!q.empty()) {
    const auto amp = q.find('&');
    const std::string_view pair = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    auto key = percent_decode(pair.substr(0, eq), true);
    auto value = percent_decode(eq == std::string_view::npos ? "" : pair.substr(eq + 1), true);
    if (!key || !value) return false;
    r.parameters.emplace_back(std::move(*key), std::move(*value));
  }
  return true;
}

// One header line into `r.headers` (its name a token, kept in lower case; its value without
// the blanks around it); what is wrong with it, or nothing.
inline std::optional<std::string_view> read_header(std::string_view line, http_request& r) {
  const auto colon = line.find(':');
  if (colon == 0 || colon == std::string_view::npos) return "malformed header line";
  std::string name(line.substr(0, colon));
  for (char& c : name) {
    if (!is_token_char(c)) return "malformed header name";
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  std::string_view value = line.substr(colon + 1);
  const auto first = value.find_first_not_of(" \t");
  value = first == std::string_view::npos ? std::string_view() : value.substr(first);
  value = value.substr(0, value.find_last_not_of(" \t") + 1);
  r.headers.emplace_back(std::move(name), std::string(value));
  return std::nullopt;
}

}  // namespace detail

/// Parses a request head: the request line, then header lines, each ending in CRLF (a bare LF
/// is accepted), up to and including the empty line. Header names must be tokens (kept in lower
/// case); values are kept, not interpreted. Only origin-form targets (`/path?query`) are accepted.
[[nodiscard]] inline http_request parse_http_request(std::string_view head,
                                                     const http_request_limits& limits = {}) {
  using detail::http_refusal;
  auto next_line = [&head]() -> std::optional<std::string_view> {
    const auto eol = head.find('\n');
    if (eol == std::string_view::npos) return std::nullopt;
    std::string_view line = head.substr(0, eol);
    head.remove_prefix(eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
  };
  const auto request_line = next_line();
  if (!request_line) return http_refusal(400, "no request line");
  const std::string_view line = *request_line;
  const auto sp1 = line.find(' ');
  const auto sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return http_refusal(400, "malformed request line");
  }
  http_request r;
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (method.empty()) return http_refusal(400, "empty method");
  for (const char c : method)
    if (!detail::is_token_char(c)) return http_refusal(400, "malformed method");
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    return http_refusal(version.starts_with("HTTP/") ? 505 : 400, "unsupported HTTP version");
  }
  if (target.size() > limits.max_target) return http_refusal(414, "request target too long");
  if (!target.starts_with('/')) return http_refusal(400, "request target must start with /");
  for (const char c : target)
    if (c <= ' ' || c >= 127) return http_refusal(400, "malformed request target");
  const auto question = target.find('?');
  auto path = detail::percent_decode(target.substr(0, question), false);
  if (!path) return http_refusal(400, "malformed percent escape in the path");
  r.path = std::move(*path);
  if (question != std::string_view::npos && !detail::parse_query(target.substr(question + 1), r)) {
    return http_refusal(400, "malformed percent escape in the query");
  }
  r.method = std::string(method);
  for (std::size_t headers = 0;; ++headers) {
    const auto h = next_line();
    if (!h) return http_refusal(400, "request head not terminated by an empty line");
    if (h->empty()) break;
    if (headers >= limits.max_headers) return http_refusal(431, "too many header lines");
    if (const auto bad = detail::read_header(*h, r)) return http_refusal(400, std::string(*bad));
  }
  return r;
}

/// An answer: status, content type and body. `Content-Length` and `Connection: close` are
/// added; `headers` are extra lines ("Name: value", no CRLF).
struct http_answer {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::string> headers{};
};

namespace detail {

inline std::string_view http_reason(int status) noexcept {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 414:
      return "URI Too Long";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

// The bytes of an answer; `head_only` for HEAD (the length of the body it would have had).
inline std::string http_serialize(const http_answer& a, bool head_only) {
  std::string out = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n"
      "Cache-Control: no-store\r\n",
      a.status, http_reason(a.status), a.content_type, a.body.size());
  for (const auto& h : a.headers)
    out += h + "\r\n";
  out += "\r\n";
  if (!head_only) out += a.body;
  return out;
}

inline http_answer http_error(int status, std::string_view why) {
  return {status, "text/plain; charset=utf-8",
          fmt::format("{} {}: {}\n", status, http_reason(status), why)};
}

}  // namespace detail

}  // namespace doorman::net
