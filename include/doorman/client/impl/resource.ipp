#pragma once

/// \file
/// The asynchronous waits of the client's resources (declared in
/// <doorman/client/resource.hpp>): included by that header when header-only, compiled once by
/// <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION (<doorman/core/linkage.hpp>).

#include "doorman/client/impl/client_core.hpp"
#include "doorman/client/resource.hpp"

namespace doorman::detail {

/// Lists an asynchronous wait in its resource for its lifetime (so that a capacity change
/// wakes it and a stop cancels it). On the strand.
class listed_wait {
 public:
  listed_wait(resource_entry& e, pending_wait& w) : e_(e), w_(w) { e_.waits.insert(&w_); }
  listed_wait(const listed_wait&) = delete;
  listed_wait& operator=(const listed_wait&) = delete;
  ~listed_wait() { e_.waits.erase(&w_); }

  // Sleeps until the resource wakes its blocked waits (or the wait is cancelled).
  asio::awaitable<void> until_woken() {
    w_.blocked = true;
    w_.timer.expires_at(asio::steady_timer::time_point::max());
    std::error_code ec;
    co_await w_.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    w_.blocked = false;
  }

 private:
  resource_entry& e_;
  pending_wait& w_;
};

// The window algorithms' wait: tried again when the refusal says the permits fit.
inline asio::awaitable<std::error_code> retry_wait(resource_entry& e, double n, pending_wait& w,
                                                   listed_wait& listed) {
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

// A rate's wait: a reservation, slept on (given back when cancelled before its time).
inline asio::awaitable<std::error_code> rate_wait(std::shared_ptr<resource_entry> e, double n,
                                                  std::shared_ptr<pending_wait> w) {
  if (!valid_permits(n)) co_return std::make_error_code(std::errc::invalid_argument);
  listed_wait listed(*e, *w);
  if (!e->rate.reserves()) co_return co_await retry_wait(*e, n, *w, listed);
  for (;;) {
    if (w->cancelled || e->stopped()) co_return asio::error::operation_aborted;
    const auto r = e->rate.reserve(n);
    if (r.at == coarse_clock::time_point::max()) {
      if (e->rate.rate() != 0) co_return asio::error::no_buffer_space;  // a full queue
      e->held_back();  // blocked (capacity 0): until it changes
      co_await listed.until_woken();
      continue;
    }
    // coarse_clock and steady_clock count from the same epoch (CLOCK_MONOTONIC*).
    w->timer.expires_at(std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(r.at.time_since_epoch())));
    std::error_code ec;
    co_await w->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    // Cancelled before its time: the permits go back (after it, they count as used).
    if (w->cancelled && e->rate.cancel_reservation(n, r)) {
      co_return asio::error::operation_aborted;
    }
    co_return std::error_code();
  }
}

// A gauge's wait for a slot. A waiter counts itself in `async_waiters` before it looks at the
// gauge, and a release frees its slot before it reads `async_waiters` (both sequentially
// consistent): either the waiter sees the free slot or the release sees the waiter and wakes
// it. No wake-up is lost.
inline asio::awaitable<std::error_code> gauge_wait(std::shared_ptr<resource_entry> e,
                                                   std::shared_ptr<pending_wait> w) {
  listed_wait listed(*e, *w);
  ++e->async_waiters;
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
  --e->async_waiters;
  co_return result;
}

// A budget's wait for units: they come with an allotment (the client's loop wakes the waits
// when it applies one) or a refund (`budget_resource::settle` wakes them). Counted in
// `async_waiters` before it looks, as a gauge's wait: no wake-up is lost.
inline asio::awaitable<std::error_code> budget_wait(std::shared_ptr<resource_entry> e, double n,
                                                    std::shared_ptr<pending_wait> w) {
  if (!valid_permits(n)) co_return std::make_error_code(std::errc::invalid_argument);
  listed_wait listed(*e, *w);
  ++e->async_waiters;
  std::error_code result;
  for (bool first = true;; first = false) {
    if (w->cancelled || e->stopped()) {
      result = asio::error::operation_aborted;
      break;
    }
    const auto now = coarse_clock::now();
    if (first ? e->budget.try_acquire(n, now) : e->budget.try_again(n, now)) break;
    e->held_back();  // (when the capacity is 0)
    co_await listed.until_woken();
  }
  --e->async_waiters;
  co_return result;
}

DOORMAN_DECL std::function<void()> start_wait(std::shared_ptr<resource_entry> e, double n,
                                              std::function<void(std::error_code)> done) {
  const asio::any_io_executor strand = e->strand;
  auto w = std::make_shared<pending_wait>(strand);
  auto body = e->kind == resource_kind::rate     ? rate_wait(std::move(e), n, w)
              : e->kind == resource_kind::budget ? budget_wait(std::move(e), n, w)
                                                 : gauge_wait(std::move(e), w);
  asio::co_spawn(strand, std::move(body),
                 [done = std::move(done)](const std::exception_ptr& ex, std::error_code ec) {
                   done(ex ? asio::error::no_memory : ec);  // nothing else throws
                 });
  return [weak = std::weak_ptr(w), strand] {
    asio::post(strand, [weak] {
      if (auto pending = weak.lock()) pending->cancel();
    });
  };
}

}  // namespace doorman::detail
