#pragma once

/// \file
/// `host:port` addresses as they appear on command lines and in `mastership.master`.
///
///     auto a = doorman::net::parse_address("127.0.0.1:7700");   // {"127.0.0.1", "7700"}
///     auto b = doorman::net::parse_address("[::1]:7700");       // {"::1", "7700"}

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace doorman::net {

/// A host (name or literal, IPv6 without brackets) and a port (digits).
struct address {
  std::string host;
  std::string port;

  /// The `host:port` form (`[host]:port` for IPv6 literals).
  [[nodiscard]] std::string to_string() const {
    if (host.find(':') != std::string::npos) return "[" + host + "]:" + port;
    return host + ":" + port;
  }
  friend bool operator==(const address&, const address&) = default;
};

/// Parses `host:port` or `[v6]:port`; nothing when malformed (empty host, port not 0–65535).
[[nodiscard]] inline std::optional<address> parse_address(std::string_view s) {
  address a;
  std::string_view port;
  if (s.starts_with('[')) {
    const auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return std::nullopt;
    }
    a.host = std::string(s.substr(1, close - 1));
    port = s.substr(close + 2);
  } else {
    const auto colon = s.rfind(':');
    if (colon == std::string_view::npos) return std::nullopt;
    a.host = std::string(s.substr(0, colon));
    if (a.host.find(':') != std::string::npos) return std::nullopt;  // v6 needs brackets
    port = s.substr(colon + 1);
  }
  if (a.host.empty() || port.empty() || port.size() > 5) return std::nullopt;
  // Brackets only around the whole of an IPv6 host, never inside one.
  if (a.host.find_first_of("[]") != std::string::npos) return std::nullopt;
  unsigned value = 0;
  for (const char c : port) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) return std::nullopt;
  a.port = std::string(port);
  return a;
}

/// Splits a comma-separated list (`a:1,b:2`), dropping empty items.
[[nodiscard]] inline std::vector<std::string> split_list(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const auto comma = s.find(',');
    const auto item = s.substr(0, comma);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace doorman::net
