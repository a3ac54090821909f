#pragma once

/// \file
/// The coroutines of the client's resources, and what spawns them (declared in
/// <doorman/client/resource.hpp>): included by that header when header-only, compiled once by
/// <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION (<doorman/core/linkage.hpp>).

#include "doorman/client/resource.hpp"

namespace doorman {

DOORMAN_DECL asio::awaitable<void> detail::listed_wait::until_woken() {
  w_.blocked = true;
  w_.timer.expires_at(asio::steady_timer::time_point::max());
  std::error_code ec;
  co_await w_.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  w_.blocked = false;
}

DOORMAN_DECL asio::awaitable<std::error_code> rate_resource::wait_op(
    std::shared_ptr<detail::resource_entry> e, double n, std::shared_ptr<detail::pending_wait> w) {
  detail::listed_wait listed(*e, *w);
  if (!e->rate.reserves()) co_return co_await retry_op(*e, n, *w, listed);
  for (;;) {
    if (w->cancelled || e->stopped()) co_return asio::error::operation_aborted;
    const auto at = e->rate.reserve(n);
    if (at == coarse_clock::time_point::max()) {
      if (e->rate.rate() != 0) co_return asio::error::no_buffer_space;  // a full queue
      e->held_back();  // blocked (capacity 0): until it changes
      co_await listed.until_woken();
      continue;
    }
    // coarse_clock and steady_clock count from the same epoch (CLOCK_MONOTONIC*).
    w->timer.expires_at(std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(at.time_since_epoch())));
    std::error_code ec;
    co_await w->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    // Cancelled before its time: the permits go back (after it, they count as used).
    if (w->cancelled && e->rate.cancel_reservation(n, at)) {
      co_return asio::error::operation_aborted;
    }
    co_return std::error_code();
  }
}

DOORMAN_DECL asio::awaitable<std::error_code> rate_resource::retry_op(detail::resource_entry& e,
                                                                      double n,
                                                                      detail::pending_wait& w,
                                                                      detail::listed_wait& listed) {
  for (bool first = true;; first = false) {
    if (w.cancelled || e.stopped()) co_return asio::error::operation_aborted;
    const auto r = first ? e.rate.try_acquire(n) : e.rate.try_again(n);
    if (r) co_return std::error_code();
    if (r.retry_after == any_rate_limiter::duration::max()) {
      if (e.rate.rate() != 0) co_return asio::error::no_buffer_space;  // never fits
      e.held_back();  // blocked (capacity 0): until it changes
      co_await listed.until_woken();
      continue;
    }
    w.timer.expires_after(r.retry_after);
    std::error_code ec;
    co_await w.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
}

DOORMAN_DECL asio::awaitable<std::error_code> gauge_resource::acquire_op(
    std::shared_ptr<detail::resource_entry> e, std::shared_ptr<detail::pending_wait> w) {
  detail::listed_wait listed(*e, *w);
  ++e->gauge_waiters;
  std::error_code result;
  for (;;) {
    if (w->cancelled || e->stopped()) {
      result = asio::error::operation_aborted;
      break;
    }
    if (e->gauge.try_acquire()) break;
    e->held_back();  // (when the capacity is 0)
    co_await listed.until_woken();
  }
  --e->gauge_waiters;
  co_return result;
}

}  // namespace doorman
