#pragma once

/// \file
/// The accept loop of net::listener (declared in <doorman/net/listener.hpp>): included by that
/// header when header-only, compiled once by <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/net/listener.hpp"

namespace doorman::net {

DOORMAN_DECL asio::awaitable<void> listener::accept_loop() {
  while (!stopping_) {
    std::error_code ec;
    auto socket = co_await acceptor_.async_accept(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping_) co_return;
    if (ec) {
      if (ec == asio::error::operation_aborted) co_return;
      // Out of descriptors or a transient failure: pause instead of spinning.
      if (log_) {
        log_(fmt::format("warning: {} failed: {}; retrying in 100 ms", what_, ec.message()));
      }
      retry_.expires_after(std::chrono::milliseconds(100));
      co_await retry_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    detail::close_on_exec(socket);
    on_accept_(std::move(socket));
  }
}
DOORMAN_DECL void listener::start(accept_handler on_accept) {
  on_accept_ = std::move(on_accept);
  asio::co_spawn(
      executor_,
      supervised(
          what_ + " loop", [this] { return accept_loop(); }, [this] { return stopping_; }, log_),
      asio::detached);
}

}  // namespace doorman::net
