#pragma once

/// \file
/// TLS for every link (docs/security.md): the settings of one side (`tls_options`), a context
/// built from them and rebuilt on demand (`tls_context`; certificates rotate without dropping
/// connections), and `stream`, a TCP socket that is plaintext or TLS, which the server, the
/// channel, the admin endpoint and the etcd client all read and write through.
///
/// TLS is optional at build time. It is compiled in when `DOORMAN_TLS` is defined and OpenSSL
/// is linked: the CMake target `doorman::tls` does both (define it for the whole program, not
/// per file). Without it, `stream` is a plain socket with no extra cost, and asking for TLS
/// throws `std::invalid_argument` saying that the build has none.
///
///     doorman::net::tls_options tls{.cert_file = "node.pem", .key_file = "node.key",
///                                   .ca_file = "ca.pem",
///                                   .client_auth = doorman::net::client_auth::require};
///     auto context = std::make_shared<doorman::net::tls_context>(
///         doorman::net::tls_side::server, tls);  // throws, naming the file, on a bad one
///     server.use_tls(context);
///
/// The policy: TLS 1.2 and 1.3 only; for TLS 1.2 only forward-secret AEAD suites (ECDHE with
/// AES-GCM or ChaCha20-Poly1305); TLS 1.3 with OpenSSL's default suites; no compression, no
/// renegotiation.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <asio.hpp>

#ifdef DOORMAN_TLS
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <asio/ssl.hpp>
#endif

#include "doorman/core/linkage.hpp"
#include "doorman/net/tls_options.hpp"

namespace doorman::net {

/// Which end of a connection a context serves.
enum class tls_side : std::uint8_t { server, client };

/// Whether this build has TLS (`DOORMAN_TLS` defined, OpenSSL linked).
inline constexpr bool tls_available =
#ifdef DOORMAN_TLS
    true;
#else
    false;
#endif

#ifdef DOORMAN_TLS
using ssl_context_ptr = std::shared_ptr<asio::ssl::context>;
#else
struct no_ssl_context {};
using ssl_context_ptr = std::shared_ptr<no_ssl_context>;
#endif

namespace detail {

#ifdef DOORMAN_TLS
// OpenSSL's last error, in words, or `fallback`.
inline std::string ssl_error_text(std::string_view fallback) {
  const unsigned long e = ERR_get_error();  // NOLINT(google-runtime-int): OpenSSL's type
  ERR_clear_error();
  if (e == 0) return std::string(fallback);
  char text[256];
  ERR_error_string_n(e, text, sizeof text);
  return text;
}

inline constexpr const char* tls12_ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

inline void load_identity(asio::ssl::context& ctx, const tls_options& o, std::string_view what) {
  std::error_code ec;
  if (o.cert_file.empty() != o.key_file.empty()) {
    throw std::invalid_argument(
        fmt::format("{}: a certificate and its key go together (cert \"{}\", key \"{}\")", what,
                    o.cert_file, o.key_file));
  }
  if (o.cert_file.empty()) return;
  ctx.use_certificate_chain_file(o.cert_file, ec);
  if (ec) {
    throw std::invalid_argument(fmt::format("{} cert: cannot use \"{}\": {}", what, o.cert_file,
                                            ssl_error_text(ec.message())));
  }
  ctx.use_private_key_file(o.key_file, asio::ssl::context::pem, ec);
  if (ec) {
    throw std::invalid_argument(fmt::format("{} key: cannot use \"{}\" with \"{}\": {}", what,
                                            o.key_file, o.cert_file, ssl_error_text(ec.message())));
  }
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
    ERR_clear_error();
    throw std::invalid_argument(
        fmt::format("{} key: \"{}\" is not the key of \"{}\"", what, o.key_file, o.cert_file));
  }
}

// A context for `side` with the policy of this file; throws naming the file at fault.
inline ssl_context_ptr make_ssl_context(tls_side side, const tls_options& o,
                                        std::string_view what) {
  auto ctx = std::make_shared<asio::ssl::context>(
      side == tls_side::server ? asio::ssl::context::tls_server : asio::ssl::context::tls_client);
  SSL_CTX* native = ctx->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  SSL_CTX_set_options(
      native, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_cipher_list(native, tls12_ciphers);
  if (side == tls_side::server && o.cert_file.empty()) {
    throw std::invalid_argument(
        fmt::format("{} cert: a TLS server needs a certificate and key", what));
  }
  load_identity(*ctx, o, what);
  std::error_code ec;
  if (o.ca_file.empty()) {
    ctx->set_default_verify_paths(ec);
  } else {
    ctx->load_verify_file(o.ca_file, ec);
  }
  if (ec) {
    throw std::invalid_argument(
        fmt::format("{} ca: cannot use \"{}\": {}", what, o.ca_file, ssl_error_text(ec.message())));
  }
  int mode = asio::ssl::verify_peer;
  if (side == tls_side::server) {
    if (o.client_auth == client_auth::none) mode = asio::ssl::verify_none;
    if (o.client_auth == client_auth::require) mode |= asio::ssl::verify_fail_if_no_peer_cert;
    // Sessions are not resumed: every connection shows its certificate (and is checked).
    SSL_CTX_set_session_cache_mode(native, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(native, 0);
  }
  ctx->set_verify_mode(mode);
  return ctx;
}

// True for printable ASCII without '#': identities go into log lines and error messages, and
// '#' separates an identity from the names of its client ids (docs/security.md).
inline bool printable(std::string_view s) noexcept {
  for (const char c : s)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e || c == '#')
      return false;
  return !s.empty();
}

inline std::string asn1_text(const ASN1_STRING* s) {
  const auto* data = ASN1_STRING_get0_data(s);
  return std::string(reinterpret_cast<const char*>(data),
                     static_cast<std::size_t>(ASN1_STRING_length(s)));
}

// The first URI SAN, else the first DNS SAN, else the subject's CN; empty when that one is
// not printable (or holds a '#').
inline std::string identity_of(X509* cert) {
  std::string uri;
  std::string dns;
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type == GEN_URI && uri.empty()) uri = asn1_text(n->d.uniformResourceIdentifier);
    if (n->type == GEN_DNS && dns.empty()) dns = asn1_text(n->d.dNSName);
  }
  GENERAL_NAMES_free(names);
  if (!uri.empty()) return printable(uri) ? uri : std::string();
  if (!dns.empty()) return printable(dns) ? dns : std::string();
  X509_NAME* subject = X509_get_subject_name(cert);
  const int at = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (at < 0) return {};
  std::string cn = asn1_text(X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at)));
  return printable(cn) ? cn : std::string();
}
#endif

}  // namespace detail

/// The TLS context of one side of a link, rebuilt from its files by `reload()`: connections
/// made before keep the context they started with, new ones get the new one. Thread-safe.
class tls_context {
 public:
  /// Builds the context; throws `std::invalid_argument` naming the file (`what cert: cannot
  /// use "node.pem": ...`) or saying that this build has no TLS.
  tls_context(tls_side side, tls_options options, std::string what = "tls")
      : side_(side), options_(std::move(options)), what_(std::move(what)) {
    current_ = build();
  }

  /// Re-reads the files; on failure throws as the constructor does and keeps the context it
  /// had.
  void reload() {
    auto fresh = build();
    const std::scoped_lock lock(mutex_);
    current_ = std::move(fresh);
    ++reloads_;
  }

  /// The context new connections use.
  [[nodiscard]] ssl_context_ptr current() const {
    const std::scoped_lock lock(mutex_);
    return current_;
  }

  [[nodiscard]] tls_side side() const noexcept { return side_; }
  [[nodiscard]] const tls_options& options() const noexcept { return options_; }
  /// Successful reloads so far.
  [[nodiscard]] std::uint64_t reloads() const {
    const std::scoped_lock lock(mutex_);
    return reloads_;
  }

 private:
  ssl_context_ptr build() const {
#ifdef DOORMAN_TLS
    return detail::make_ssl_context(side_, options_, what_);
#else
    throw std::invalid_argument(fmt::format(
        "{}: TLS was asked for, but this build of doorman has no TLS (build with OpenSSL and "
        "link doorman::tls)",
        what_));
#endif
  }

  tls_side side_;
  tls_options options_;
  std::string what_;
  mutable std::mutex mutex_;
  ssl_context_ptr current_;
  std::uint64_t reloads_ = 0;
};

/// A TCP connection, plaintext or TLS: an asio AsyncReadStream and AsyncWriteStream. Made
/// from an accepted socket (server side) or an executor (client side: connect `socket()`,
/// then `handshake`). Not movable: TLS state refers to it.
class stream {
 public:
  using executor_type = asio::any_io_executor;

  /// A stream over an accepted socket; TLS with `tls`, plaintext without.
  explicit stream(asio::ip::tcp::socket socket, const ssl_context_ptr& tls = {})
      : socket_(std::move(socket)) {
    wrap(tls);
  }

  /// A stream with a fresh socket, to connect.
  explicit stream(const asio::any_io_executor& executor, const ssl_context_ptr& tls = {})
      : socket_(executor) {
    wrap(tls);
  }

  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  [[nodiscard]] executor_type get_executor() noexcept { return socket().get_executor(); }

  /// The TCP socket underneath.
  [[nodiscard]] asio::ip::tcp::socket& socket() noexcept {
#ifdef DOORMAN_TLS
    if (tls_) return tls_->next_layer();
#endif
    return socket_;
  }
  [[nodiscard]] const asio::ip::tcp::socket& socket() const noexcept {
#ifdef DOORMAN_TLS
    if (tls_) return tls_->next_layer();
#endif
    return socket_;
  }

  /// Whether the stream is TLS.
  [[nodiscard]] bool secure() const noexcept {
#ifdef DOORMAN_TLS
    return tls_ != nullptr;
#else
    return false;
#endif
  }

  /// The peer's verified identity (see `identity_of`): set by a successful handshake with a
  /// peer that showed a certificate; empty otherwise.
  [[nodiscard]] const std::string& identity() const noexcept {
    return identity_;
  }

  template <class Buffers, class Token>
  auto async_read_some(const Buffers& buffers, Token&& token) {
    return on_layer(
        [&](auto& layer) { return layer.async_read_some(buffers, std::forward<Token>(token)); });
  }

  template <class Buffers, class Token>
  auto async_write_some(const Buffers& buffers, Token&& token) {
    return on_layer(
        [&](auto& layer) { return layer.async_write_some(buffers, std::forward<Token>(token)); });
  }

  /// The TLS handshake (nothing for plaintext). A client checks that the server's certificate
  /// names `server_name` (also sent as SNI). On success `identity()` names the peer.
  DOORMAN_DECL asio::awaitable<void> handshake(tls_side side, const std::string& server_name,
                                               std::error_code& ec);

  /// `ec` in words, with the certificate check's reason when that is what failed (e.g.
  /// "certificate verify failed: certificate has expired").
  [[nodiscard]] std::string failure(const std::error_code& ec) const {
#ifdef DOORMAN_TLS
    if (tls_) {
      const long v = SSL_get_verify_result(tls_->native_handle());  // NOLINT: OpenSSL's type
      if (v != X509_V_OK)
        return fmt::format("certificate verify failed: {}", X509_verify_cert_error_string(v));
    }
#endif
    return ec.message();
  }

  /// Closes the connection at once (no TLS close_notify).
  void close() noexcept {
    std::error_code ec;
    socket().shutdown(asio::socket_base::shutdown_both, ec);
    socket().close(ec);
  }

 private:
  // `f(layer)` on the layer that reads and writes: the TLS stream, or the plain socket.
  template <class F>
  decltype(auto) on_layer(F&& f) {
#ifdef DOORMAN_TLS
    if (tls_) return f(*tls_);
#endif
    return f(socket_);
  }

  void wrap(const ssl_context_ptr& tls) {
#ifdef DOORMAN_TLS
    if (!tls) return;
    context_ = tls;
    tls_ = std::make_unique<asio::ssl::stream<asio::ip::tcp::socket>>(std::move(socket_), *tls);
#else
    (void)tls;
#endif
  }

  asio::ip::tcp::socket socket_;  // plaintext; moved into tls_ for TLS
#ifdef DOORMAN_TLS
  ssl_context_ptr context_;  // kept alive for the connection's life
  std::unique_ptr<asio::ssl::stream<asio::ip::tcp::socket>> tls_;
#endif
  std::string identity_;
};

}  // namespace doorman::net

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/net/impl/tls.ipp"
#endif
