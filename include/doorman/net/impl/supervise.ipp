#pragma once

/// \file
/// The waits of <doorman/net/supervise.hpp>: included by that header when header-only, compiled
/// once by <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION (<doorman/core/linkage.hpp>).

#include "doorman/net/supervise.hpp"

namespace doorman::net {

DOORMAN_DECL asio::awaitable<std::error_code> wait_on(asio::steady_timer& timer) {
  std::error_code ec;
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  co_return ec;
}

DOORMAN_DECL asio::awaitable<void> detail::restart_pause() {
  asio::steady_timer pause(co_await asio::this_coro::executor);
  pause.expires_after(restart_delay);
  co_await wait_on(pause);
}

}  // namespace doorman::net
