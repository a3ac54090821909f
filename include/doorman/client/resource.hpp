#pragma once

/// \file
/// The two kinds of client resource: `rate_resource` (at most L operations per second) and
/// `gauge_resource` (at most L operations in flight). Each is a handle: several handles to one
/// resource id in one client share the lease, the limiter and the demand; the capacity is
/// released at the server when the last handle goes. Handles must not outlive their client.
///
///     doorman::rate_resource api(client, "api");            // wants measured from use
///     api.wait();                                           // blocks until admitted
///     if (auto r = api.try_acquire(); !r) reply_429(r.retry_after);
///
///     doorman::gauge_resource db(client, "db", {.wants = 8});
///     { auto slot = db.acquire(); run_transaction(); }      // released at the end of scope

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <asio.hpp>

#include "doorman/client/client.hpp"

namespace doorman {

/// Options of a resource handle (the first handle to an id decides them), with their defaults.
struct resource_options {
  /// Fixed wants; when absent they are measured from use (see client_options::demand_window).
  std::optional<double> wants{};
  double initial_wants = 0;  ///< sent until the first measurement, when wants are measured
  std::int64_t priority = 0;
  fallback mode = fallback::safe;         ///< what applies once a lease expired unrenewed
  std::optional<double> safe_capacity{};  ///< overrides the server's (−1: unlimited)
  /// Rate only: the permits an idle limiter admits at once; 0 (the default) follows the lease
  /// as max(1, capacity × 0.1 s), which absorbs the jitter of callers arriving on a schedule.
  double burst = 0;
};

namespace detail {

class resource_handle {
 public:
  resource_handle(client& c, std::string_view id, resource_kind kind, const resource_options& o)
      : client_(&c),
        entry_(c.attach(id, kind,
                        {o.priority, o.wants.value_or(o.initial_wants), o.mode, o.safe_capacity},
                        !o.wants.has_value(), o.burst)) {}

  resource_handle(const resource_handle& other) : client_(other.client_), entry_(other.entry_) {
    if (entry_) client_->attach(entry_->id, entry_->kind, entry_->options, entry_->estimate, 1);
  }
  resource_handle(resource_handle&& other) noexcept
      : client_(other.client_), entry_(std::move(other.entry_)) {}
  resource_handle& operator=(resource_handle other) noexcept {
    std::swap(client_, other.client_);
    std::swap(entry_, other.entry_);
    return *this;
  }
  ~resource_handle() {
    if (entry_) client_->detach(entry_);
  }

  /// The resource id.
  [[nodiscard]] const std::string& id() const noexcept { return entry_->id; }
  /// The capacity the limiter enforces now: the lease, or the fallback (−1: unlimited).
  [[nodiscard]] double capacity() const noexcept { return entry_->capacity.load(); }
  /// Whether an unexpired lease backs `capacity()` (else a fallback does).
  [[nodiscard]] bool leased() const noexcept { return entry_->leased.load(); }
  /// The wants sent with the next refresh (measured, or fixed).
  [[nodiscard]] double wants() const noexcept { return entry_->wants.load(); }

  /// Fixes the wants (thread-safe); measurement continues to run only if they were never set.
  void set_wants(double wants) { client_->set_wants(entry_, wants); }

  /// Calls `f(capacity)` on the client's thread whenever the capacity changes.
  void on_capacity(std::function<void(double)> f) { client_->on_change(entry_, std::move(f)); }

 protected:
  client* client_;
  std::shared_ptr<resource_entry> entry_;
};

}  // namespace detail

/// A rate resource: at most `capacity()` operations per second, following the lease.
class rate_resource : public detail::resource_handle {
 public:
  using acquire_result = rate_limiter::acquire_result;

  rate_resource(client& c, std::string_view id, const resource_options& o = {})
      : resource_handle(c, id, detail::resource_kind::rate, o) {}

  /// Takes `n` permits if available now (lock-free); else says how long until they would be
  /// (`duration::max()` while the capacity is 0).
  acquire_result try_acquire(double n = 1) noexcept { return entry_->rate.try_acquire(n); }

  /// Blocks until `n` permits are admitted (first come, first served).
  void wait(double n = 1) { (void)entry_->rate.wait(n); }

  /// Waits asynchronously for `n` permits; completes with `void(std::exception_ptr)` through
  /// any asio completion token (`asio::use_awaitable`, `asio::use_future`, a callback...).
  template <class CompletionToken>
  auto async_wait(double n, CompletionToken&& token) {
    return asio::co_spawn(client_->executor(), wait_op(entry_, n),
                          std::forward<CompletionToken>(token));
  }

  /// The local limiter (e.g. to change its burst).
  [[nodiscard]] rate_limiter& limiter() noexcept { return entry_->rate; }

 private:
  static asio::awaitable<void> wait_op(std::shared_ptr<detail::resource_entry> e, double n) {
    for (;;) {
      const auto at = e->rate.reserve(n);
      if (at != coarse_clock::time_point::max()) {
        // coarse_clock and steady_clock count from the same epoch (CLOCK_MONOTONIC*).
        asio::steady_timer timer(co_await asio::this_coro::executor);
        timer.expires_at(std::chrono::steady_clock::time_point(
            std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                at.time_since_epoch())));
        std::error_code ec;
        co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        co_return;
      }
      // Blocked (capacity 0): sleep until the client changes the capacity, or stops.
      if (e->stopped) {
        throw std::system_error(asio::error::operation_aborted, "the client stopped");
      }
      std::error_code ec;
      co_await e->changed.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }
};

/// A gauge resource: at most `capacity()` operations in flight, following the lease.
class gauge_resource : public detail::resource_handle {
 public:
  /// Holds one slot until destroyed (or `release()`d). It shares the resource's state with
  /// the handles, so it stays valid when the handle it came from is moved or destroyed; like
  /// the handles, it must not outlive the client.
  class slot {
   public:
    slot() = default;
    explicit slot(std::shared_ptr<detail::resource_entry> e) noexcept : entry_(std::move(e)) {}
    /// Takes over a slot of `g` already held (e.g. after `try_acquire`).
    explicit slot(gauge_resource* g) noexcept;
    slot(slot&& o) noexcept = default;
    slot& operator=(slot&& o) noexcept {
      if (this != &o) {
        release();
        entry_ = std::move(o.entry_);
      }
      return *this;
    }
    ~slot() { release(); }
    void release() noexcept {
      if (entry_) release_slot(std::exchange(entry_, nullptr));
    }
    explicit operator bool() const noexcept { return entry_ != nullptr; }

   private:
    std::shared_ptr<detail::resource_entry> entry_;
  };

  gauge_resource(client& c, std::string_view id, const resource_options& o = {})
      : resource_handle(c, id, detail::resource_kind::gauge, o) {}

  /// Takes a slot if one is free now (lock-free).
  [[nodiscard]] bool try_acquire() noexcept { return entry_->gauge.try_acquire(); }
  /// Blocks until a slot is free and takes it.
  void acquire_blocking() { entry_->gauge.acquire(); }
  /// Blocks until a slot is free; the returned guard gives it back.
  [[nodiscard]] slot acquire() {
    entry_->gauge.acquire();
    return slot(entry_);
  }
  /// Gives a slot back.
  void release() noexcept { release_slot(entry_); }

  /// Waits asynchronously for a slot (then held: `release()` it); completes with
  /// `void(std::exception_ptr)` through any asio completion token.
  template <class CompletionToken>
  auto async_acquire(CompletionToken&& token) {
    return asio::co_spawn(client_->executor(), acquire_op(entry_),
                          std::forward<CompletionToken>(token));
  }

  [[nodiscard]] std::int64_t in_flight() const noexcept { return entry_->gauge.in_flight(); }
  [[nodiscard]] gauge_limiter& limiter() noexcept { return entry_->gauge; }

 private:
  // Gives a slot of `e` back, and wakes the asynchronous waiters (on the client's strand).
  static void release_slot(const std::shared_ptr<detail::resource_entry>& e) noexcept {
    e->gauge.release();
    if (e->async_waiters.load() > 0) {
      asio::post(e->changed.get_executor(), [e] { e->changed.cancel(); });
    }
  }

  static asio::awaitable<void> acquire_op(std::shared_ptr<detail::resource_entry> e) {
    ++e->async_waiters;
    while (!e->gauge.try_acquire()) {
      if (e->stopped) {
        --e->async_waiters;
        throw std::system_error(asio::error::operation_aborted, "the client stopped");
      }
      std::error_code ec;
      co_await e->changed.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    --e->async_waiters;
  }
};

inline gauge_resource::slot::slot(gauge_resource* g) noexcept : entry_(g->entry_) {}

}  // namespace doorman
