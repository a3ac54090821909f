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

#include "doorman/core/linkage.hpp"

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

/// Waits for `timer` to expire: its error code (`asio::error::operation_aborted` when
/// cancelled), never thrown. Compiled once (a coroutine template instantiated here would be
/// compiled again in every unit that includes this header).
DOORMAN_DECL asio::awaitable<std::error_code> wait_on(asio::steady_timer& timer);

namespace detail {
/// Sleeps `restart_delay` on the calling coroutine's executor.
DOORMAN_DECL asio::awaitable<void> restart_pause();
}  // namespace detail

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
    co_await detail::restart_pause();
    if (stopping()) co_return;
  }
}

}  // namespace doorman::net

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/net/impl/supervise.ipp"
#endif
