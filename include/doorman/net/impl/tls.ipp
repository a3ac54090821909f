#pragma once

/// \file
/// The coroutines of net::stream, and what spawns them (declared in <doorman/net/tls.hpp>):
/// included by that header when header-only, compiled once by <doorman/src.hpp> under
/// DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/net/tls.hpp"

namespace doorman::net {

DOORMAN_DECL asio::awaitable<void> stream::handshake(tls_side side, const std::string& server_name,
                                                     std::error_code& ec) {
  ec = {};
#ifdef DOORMAN_TLS
  if (!tls_) co_return;
  if (side == tls_side::client && !server_name.empty()) {
    SSL_set_tlsext_host_name(tls_->native_handle(), server_name.c_str());
    tls_->set_verify_callback(asio::ssl::host_name_verification(server_name));
  }
  co_await tls_->async_handshake(
      side == tls_side::server ? asio::ssl::stream_base::server : asio::ssl::stream_base::client,
      asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return;
  if (X509* cert = SSL_get1_peer_certificate(tls_->native_handle())) {
    if (SSL_get_verify_result(tls_->native_handle()) == X509_V_OK)
      identity_ = detail::identity_of(cert);
    X509_free(cert);
  }
#else
  (void)side;
  (void)server_name;
  co_return;
#endif
}

}  // namespace doorman::net
