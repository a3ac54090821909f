#pragma once

/// \file
/// The TLS settings of one side of a link (docs/security.md), apart from the TLS machinery
/// (`net/tls.hpp`), so that what only holds settings (the client's options) needs neither
/// asio nor OpenSSL.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace doorman::net {

/// Whether a server asks its clients for a certificate.
enum class client_auth : std::uint8_t {
  none,     ///< no client certificate asked for
  request,  ///< asked for and verified when given; a client without one is anonymous
  require,  ///< a client without a valid certificate fails the handshake
};

/// The modes' names, in the enum's order.
inline constexpr std::array<const char*, 3> client_auth_names = {"none", "request", "require"};

/// `none`, `request` or `require`; nothing for another word.
[[nodiscard]] inline std::optional<client_auth> parse_client_auth(std::string_view s) noexcept {
  for (std::size_t i = 0; i < client_auth_names.size(); ++i)
    if (s == client_auth_names[i]) return static_cast<client_auth>(i);
  return std::nullopt;
}

[[nodiscard]] inline const char* to_string(client_auth a) noexcept {
  return client_auth_names[static_cast<std::size_t>(a)];
}

/// TLS settings of one side of a link; files are PEM. All empty: plaintext.
struct tls_options {
  /// This side's certificate chain (leaf first). Required for a server; a client with one
  /// authenticates itself (mutual TLS).
  std::string cert_file;
  /// The private key of `cert_file`.
  std::string key_file;
  /// The CAs the peer's certificate must chain to; empty: the system's default CAs.
  std::string ca_file;
  /// For a server: whether clients must present a certificate.
  net::client_auth client_auth = net::client_auth::none;
  /// For a client: the name the server's certificate must carry (DNS or IP SAN), also sent
  /// as SNI; empty: the host of the address dialled.
  std::string server_name;
  /// For a client: use TLS even without a certificate or CA file (the system's CAs).
  bool enabled = false;

  /// Whether this asks for TLS at all.
  [[nodiscard]] bool active() const noexcept {
    return enabled || !cert_file.empty() || !key_file.empty() || !ca_file.empty();
  }
};

}  // namespace doorman::net
