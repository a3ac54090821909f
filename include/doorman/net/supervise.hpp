#pragma once

/// \file
/// Coroutines that run for the life of an object (a node's upstream loop, a client's refresh
/// loop, a server's accept loop, an election) must never end silently: an exception escaping
/// into `asio::detached` would be swallowed and the loop would stop with nothing said. These
/// run under `supervised`, which reports the failure and starts the loop again.
///
///     asio::co_spawn(strand, net::supervised("upstream loop", [this] { return loop(); },
///                                            [this] { return stopping_; }, log),
///                    asio::detached);

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <asio.hpp>

namespace doorman::net {

/// How long `supervised` waits before starting a failed loop again, so that a failure that
/// repeats does not spin.
inline constexpr std::chrono::milliseconds restart_delay{500};

/// The text of a captured exception, for a log line.
[[nodiscard]] inline std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

/// Runs `make()` (returning `asio::awaitable<void>`) to its end. If it throws, logs
/// `"<name> failed (<what>); restarting"` and, unless `stopping()` is true by then, runs a new
/// `make()` after `restart_delay`. A normal return ends it. `log` may be null.
template <class Make, class Stopping>
asio::awaitable<void> supervised(std::string name, Make make, Stopping stopping,
                                 std::function<void(std::string_view)> log) {
  for (;;) {
    std::exception_ptr failure;
    try {
      co_await make();
      co_return;
    } catch (...) {
      failure = std::current_exception();  // no co_await inside a handler
    }
    if (log) log(fmt::format("error: {} failed ({}); restarting", name, describe(failure)));
    if (stopping()) co_return;
    asio::steady_timer pause(co_await asio::this_coro::executor);
    pause.expires_after(restart_delay);
    std::error_code ec;
    co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping()) co_return;
  }
}

}  // namespace doorman::net
