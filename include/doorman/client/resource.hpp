#pragma once

/// \file
/// The kinds of client resource: `rate_resource` (at most L operations per second),
/// `gauge_resource` (at most L operations in flight) and `budget_resource` (at most L units per
/// window, shared by every client). Each is a handle: several handles to one
/// resource id in one client share the lease, the limiter and the demand; the capacity is
/// released at the server when the last handle goes. Handles must not outlive their client.
///
///     doorman::rate_resource api(client, "api");            // wants measured from use
///     api.wait();                                           // blocks until admitted
///     if (auto r = api.try_acquire(); !r) reply_429(r.retry_after);
///
///     doorman::gauge_resource db(client, "db", {.wants = 8});
///     { auto slot = db.acquire(); run_transaction(); }      // released at the end of scope

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <asio/async_result.hpp>
#include <asio/error.hpp>
#include <asio/post.hpp>

#include "doorman/client/client.hpp"
#include "doorman/core/linkage.hpp"

namespace doorman {

/// Options of a resource handle (the first handle to an id decides them), with their defaults.
struct resource_options {
  /// Fixed wants; when absent they are measured from use (see client_options::demand_window).
  std::optional<double> wants{};
  double initial_wants = 0;  ///< sent until the first measurement, when wants are measured
  std::int64_t priority = 0;
  fallback mode = fallback::safe;         ///< what applies once a lease expired unrenewed
  std::optional<double> safe_capacity{};  ///< overrides the server's (−1: unlimited)
  /// Measured wants only: the wants sent are the measured demand × this (values below 1 count
  /// as 1). Above 1, a lease has room for callers that arrive unevenly and for demand that rises
  /// between refreshes while the resource has capacity to spare; the price is that a client
  /// holds that much more than it uses when the resource is contended.
  double headroom = 1;
  /// Measured wants only: the least the wants sent are while the resource is held, however
  /// little it is used. A lease never falls to nothing between a key's sporadic uses, at the
  /// price of that much capacity held by each idle holder.
  double min_wants = 0;
  /// Rate only: the permits an idle limiter admits at once; 0 (the default) follows the lease
  /// as max(1, capacity × 0.1 s), which absorbs the jitter of callers arriving on a schedule.
  double burst = 0;
  /// Rate only: the local algorithm that enforces the lease (see docs/algorithms.md), and its
  /// parameters: a window algorithm's limit is the capacity × `window`.
  rate_algorithm algorithm = rate_algorithm::gcra;
  std::chrono::nanoseconds window = std::chrono::seconds(1);  ///< the window algorithms
  unsigned sub_windows = 1;            ///< sliding_window: sub-windows per window (1–1024)
  std::size_t max_log_entries = 4096;  ///< sliding_log: its bound
  double queue = 10;                   ///< leaky_bucket: permits that may wait
};

namespace detail {

/// Starts an asynchronous wait on `e` for `n` permits (a rate) or a slot (a gauge), on the
/// client's strand: `done(ec)` is called once, when it ends. The function returned cancels it
/// (from any thread; nothing once it ended).
DOORMAN_DECL std::function<void()> start_wait(std::shared_ptr<resource_entry> e, double n,
                                              std::function<void(std::error_code)> done);

/// `start_wait` as an asynchronous operation completing `void(std::error_code)` through
/// `token`: the handler's cancellation slot cancels the wait; the handler runs on its
/// associated executor, which is kept busy meanwhile (work).
template <class Token>
auto async_pending(std::shared_ptr<resource_entry> e, double n, Token&& token) {
  return asio::async_initiate<Token, void(std::error_code)>(
      [](auto handler, std::shared_ptr<resource_entry> entry, double permits) {
        auto done = net::detail::make_completion(std::move(handler), entry->strand);
        auto cancel = start_wait(std::move(entry), permits,
                                 [done](std::error_code ec) { done->complete(ec); });
        done->on_cancel(std::move(cancel));
      },
      token, std::move(e), n);
}

inline std::system_error stopped_error() {
  return {asio::error::operation_aborted, "the client stopped or the resource was released"};
}

class resource_handle {
 public:
  using make_other = decltype(rate_algorithm_options::other);

  resource_handle(client& c, std::string_view id, resource_kind kind, const resource_options& o,
                  make_other other = nullptr)
      : client_(&c),
        entry_(c.attach(id, kind,
                        {o.priority, o.wants.value_or(o.initial_wants), o.mode, o.safe_capacity,
                         std::isnan(o.headroom) ? 1.0 : std::max(1.0, o.headroom),
                         std::isnan(o.min_wants) ? 0.0 : std::max(0.0, o.min_wants),
                         kind == resource_kind::budget},
                        !o.wants.has_value(),
                        {.algorithm = o.algorithm,
                         .burst = o.burst,
                         .window = o.window,
                         .sub_windows = o.sub_windows,
                         .max_log_entries = o.max_log_entries,
                         .queue = o.queue,
                         .other = other})) {}

  resource_handle(const resource_handle& other) : client_(other.client_), entry_(other.entry_) {
    if (entry_) client_->attach(entry_->id, entry_->kind, entry_->options, entry_->estimate, {});
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

  /// Records what the protected service answered `calls` calls, `overloads` of them overloaded
  /// (HTTP 429 or 503, gRPC RESOURCE_EXHAUSTED or UNAVAILABLE, a `Retry-After`, a latency over
  /// its target): sent with the next refresh, for a capacity the root learns
  /// (docs/learned-capacity.md). A second in which more than 0.5 % were overloaded cuts what
  /// this client admits to what got through, at once, until the root's grants come down.
  /// Lock-free; `overloads` above `calls` count as `calls`.
  void record_answers(std::uint64_t calls, std::uint64_t overloads = 0) noexcept {
    entry_->answers.fetch_add(calls, std::memory_order_relaxed);
    entry_->overloads.fetch_add(std::min(overloads, calls), std::memory_order_relaxed);
  }

  /// One answer: `record_answers(1, overloaded ? 1 : 0)`.
  void record_answer(bool overloaded) noexcept { record_answers(1, overloaded ? 1 : 0); }

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
  using acquire_result = any_rate_limiter::acquire_result;

  /// Throws `std::invalid_argument` when `o.algorithm` is not a built-in one (a user's runs
  /// in a `basic_rate_resource`).
  rate_resource(client& c, std::string_view id, const resource_options& o = {})
      : resource_handle(c, id, detail::resource_kind::rate, o) {}

  /// Takes `n` permits if available now (lock-free); else says how long until they would be
  /// (`duration::max()` while the capacity is 0). `n` above the burst is admitted when due
  /// (with `gcra`, the default: once the burst is whole; the limiter then runs in debt). Never
  /// admits once the client is stopped, nor an `n` that is negative or not finite (both
  /// refused with `duration::max()`).
  acquire_result try_acquire(double n = 1) noexcept {
    if (entry_->stopped()) [[unlikely]]
      return {false, any_rate_limiter::duration::max()};
    auto r = entry_->rate.try_acquire(n);
    if (!r && r.retry_after == any_rate_limiter::duration::max() && valid_permits(n))
      entry_->held_back();
    return r;
  }

  /// Blocks until `n` permits are admitted (first come, first served with `gcra` and
  /// `leaky_bucket`; the window algorithms retry when their refusal says). Throws
  /// `std::system_error`: `asio::error::operation_aborted` when the client stops or the
  /// resource is released first (a wait ended so consumes no permit);
  /// `asio::error::no_buffer_space` when the algorithm can never admit it (a leaky bucket's
  /// queue is full, or `n` exceeds a window's limit).
  void wait(double n = 1) {
    std::error_code ec;
    wait(n, ec);
    if (ec == asio::error::operation_aborted) throw detail::stopped_error();
    if (ec == std::errc::invalid_argument)
      throw std::invalid_argument("rate resource " + id() + ": n: must be a finite number >= 0");
    if (ec)
      throw std::system_error(
          ec, "rate resource " + id() + ": cannot wait for " + std::to_string(n) + " permits");
  }

  /// As above, reporting the error in `ec` instead (`std::errc::invalid_argument` when `n` is
  /// negative or not finite; `wait(n)` throws `std::invalid_argument` naming `n` then).
  void wait(double n, std::error_code& ec) {
    if (!valid_permits(n)) {
      ec = std::make_error_code(std::errc::invalid_argument);
      return;
    }
    entry_->held_back();  // (when the capacity is 0)
    const auto stop = entry_->stop_source.get_token();
    if (entry_->rate.wait(n, stop)) {
      ec = {};
    } else {
      ec = stop.stop_requested() ? asio::error::operation_aborted : asio::error::no_buffer_space;
    }
  }

  /// Waits asynchronously for `n` permits, through any asio completion token, completing
  /// `void(std::error_code)`: success once admitted, `asio::error::operation_aborted` when
  /// cancelled (the handler's cancellation slot: terminal, partial or total) or when the client
  /// stops, `asio::error::no_buffer_space` as `wait` says, `std::errc::invalid_argument` for
  /// an `n` that is negative or not finite. A cancelled wait consumes no permit. The handler
  /// runs on its associated executor.
  template <class CompletionToken>
  auto async_wait(double n, CompletionToken&& token) {
    return detail::async_pending(entry_, n, std::forward<CompletionToken>(token));
  }

  /// Settles a call admitted by `try_acquire(reserved)` (its answer's `slot`) whose real
  /// cost, known after it, was `used` (tokens, bytes, money): above the reservation the limiter
  /// runs into debt, admitting nothing more until the rate has repaid it; below, it gives back
  /// the part of the call's time that no other call holds (what of its span is still ahead of
  /// now; see `rate_limiter::settle`). The use above the reservation counts as demand, so the
  /// wants sent grow with the real cost. With `gcra` (the default) and `leaky_bucket`; false,
  /// changing nothing, with a window algorithm, or when either is not a finite number >= 0.
  bool settle(double reserved, double used, std::int64_t slot) noexcept {
    return entry_->rate.settle(reserved, used, slot);
  }
  /// `settle` of a call whose slot is unknown (admitted by `wait` or `async_wait`): the debt
  /// of a use above the reservation; a use below it gives nothing back.
  bool settle(double reserved, double used) noexcept { return entry_->rate.settle(reserved, used); }

  /// The local limiter (e.g. to change its burst), running `resource_options::algorithm`.
  [[nodiscard]] any_rate_limiter& limiter() noexcept { return entry_->rate; }

 protected:
  rate_resource(client& c, std::string_view id, const resource_options& o, make_other other)
      : resource_handle(c, id, detail::resource_kind::rate, o, other) {}
};

/// A rate resource whose local algorithm may be one of `List`'s, as the server's engine takes
/// its algorithm list (`default_local_algorithms::with<mine>`): a built-in algorithm runs as in
/// `rate_resource`; one of yours behind one virtual call, in the same `any_rate_limiter` (so a
/// compiled client runs it too; `limiter().get_if<your_limiter>()` reaches it). Throws
/// `std::invalid_argument` when `o.algorithm` is in neither list.
///
///     using mine = doorman::default_local_algorithms::with<strict>;
///     doorman::basic_rate_resource<mine> api(client, "api", {.algorithm = strict_name});
template <class List>
class basic_rate_resource : public rate_resource {
 public:
  basic_rate_resource(client& c, std::string_view id, const resource_options& o = {})
      : rate_resource(c, id, o, &make_other_rate_limiter<List>) {}
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
    /// Takes over a slot of `g` already held (e.g. after `try_acquire` or `async_acquire`).
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
    friend class gauge_resource;
    explicit slot(std::shared_ptr<detail::resource_entry> e) noexcept : entry_(std::move(e)) {}
    std::shared_ptr<detail::resource_entry> entry_;
  };

  gauge_resource(client& c, std::string_view id, const resource_options& o = {})
      : resource_handle(c, id, detail::resource_kind::gauge, o) {}

  /// Takes a slot if one is free now (lock-free); never once the client is stopped.
  [[nodiscard]] bool try_acquire() noexcept {
    if (entry_->stopped()) [[unlikely]]
      return false;
    if (entry_->gauge.try_acquire()) return true;
    entry_->held_back();  // (when the capacity is 0)
    return false;
  }

  /// Blocks until a slot is free and takes it (then held: `release()` it). Throws
  /// `std::system_error` (`asio::error::operation_aborted`) when the client stops or the
  /// resource is released first, having taken nothing.
  void acquire_blocking() {
    std::error_code ec;
    acquire_blocking(ec);
    if (ec) throw detail::stopped_error();
  }

  /// As above, reporting the stop in `ec` instead.
  void acquire_blocking(std::error_code& ec) {
    if (entry_->stopped()) {
      ec = asio::error::operation_aborted;
      return;
    }
    entry_->held_back();  // (when the capacity is 0)
    ec = entry_->gauge.acquire(entry_->stop_source.get_token())
             ? std::error_code()
             : std::error_code(asio::error::operation_aborted);
  }

  /// Blocks until a slot is free; the returned guard gives it back. Throws as
  /// `acquire_blocking()`.
  [[nodiscard]] slot acquire() {
    acquire_blocking();
    return slot(entry_);
  }

  /// As above; an empty slot, with the reason in `ec`, when stopped first.
  [[nodiscard]] slot acquire(std::error_code& ec) {
    acquire_blocking(ec);
    return ec ? slot() : slot(entry_);
  }

  /// Gives a slot back.
  void release() noexcept { release_slot(entry_); }

  /// Waits asynchronously for a slot and takes it (then held: `release()` it, or adopt it in
  /// a `slot`), through any asio completion token, completing `void(std::error_code)`:
  /// success once taken, `asio::error::operation_aborted` when cancelled (the handler's
  /// cancellation slot) or when the client stops, having taken nothing.
  template <class CompletionToken>
  auto async_acquire(CompletionToken&& token) {
    return detail::async_pending(entry_, 1, std::forward<CompletionToken>(token));
  }

  [[nodiscard]] std::int64_t in_flight() const noexcept { return entry_->gauge.in_flight(); }
  [[nodiscard]] gauge_limiter& limiter() noexcept { return entry_->gauge; }

 private:
  // Gives a slot of `e` back, and wakes the asynchronous waiters (on the client's strand).
  static void release_slot(const std::shared_ptr<detail::resource_entry>& e) noexcept {
    e->gauge.release();
    if (e->async_waiters.load() > 0) asio::post(e->strand, [e] { e->wake(); });
  }
};

inline gauge_resource::slot::slot(gauge_resource* g) noexcept : entry_(g->entry_) {}

/// A budget resource (docs/budgets.md): units per window (a UTC minute, hour, day or month)
/// shared by every client of the root, spent from allotments the root hands out. Nothing is
/// spent without an allotment (a budget has no fallback); what the process spent rides on each
/// refresh and on its release, so the root frees what it did not spend.
///
///     doorman::budget_resource tokens(client, "tokens/day");
///     const auto w = tokens.window();
///     if (!tokens.try_acquire(estimate)) return reply_429();
///     tokens.settle(estimate, call_model(), w);
///
/// Its wants (when measured) are the units its callers asked for at the rate they asked, for
/// two refresh intervals; a refusal raises them to its allotment × `throttled_headroom`.
class budget_resource : public detail::resource_handle {
 public:
  budget_resource(client& c, std::string_view id, const resource_options& o = {})
      : resource_handle(c, id, detail::resource_kind::budget, o) {}

  /// Takes `n` units if the allotment has them now (lock-free). False once the client is
  /// stopped, once the allotment expired unrenewed, while a debt is unpaid, and for an `n`
  /// that is negative or not finite.
  [[nodiscard]] bool try_acquire(double n = 1) noexcept {
    if (entry_->stopped()) [[unlikely]]
      return false;
    if (entry_->budget.try_acquire(n, coarse_clock::now())) return true;
    if (valid_permits(n)) entry_->held_back();  // (when the capacity is 0)
    return false;
  }

  /// The window a call admitted now counts in (it changes when the root names a new one):
  /// read it before `try_acquire` or a wait, and pass it to `settle`.
  [[nodiscard]] std::uint64_t window() const noexcept { return entry_->budget.window(); }

  /// Settles a call admitted in `window` for `reserved` units whose real cost was `used`:
  /// above the reservation the rest is spent too (past the allotment, a debt that admits
  /// nothing until the next allotment covers it); below, the difference is given back, unless
  /// the root has named a new window since (the call's units counted in the old one, so
  /// nothing of them is the new one's to give). False, changing nothing, when either amount
  /// is not a finite number >= 0.
  bool settle(double reserved, double used, std::uint64_t window) noexcept {
    if (!entry_->budget.settle(reserved, used, window)) return false;
    if (used < reserved && entry_->async_waiters.load() > 0)  // a refund: the waits look again
      asio::post(entry_->strand, [e = entry_] { e->wake(); });
    return true;
  }

  /// Blocks until `n` units are taken. Units come with the next allotment (each refresh) or a
  /// refund, so a wait may last until the budget's window ends: give it a deadline with
  /// `async_wait`. Throws `std::system_error` (`asio::error::operation_aborted`) when the
  /// client stops or the resource is released first, having taken nothing, and
  /// `std::invalid_argument` naming `n` when it is negative or not finite.
  void wait(double n = 1) {
    std::error_code ec;
    wait(n, ec);
    if (ec == std::errc::invalid_argument)
      throw std::invalid_argument("budget resource " + id() + ": n: must be a finite number >= 0");
    if (ec) throw detail::stopped_error();
  }

  /// As above, reporting the error in `ec` instead.
  void wait(double n, std::error_code& ec) {
    if (!valid_permits(n)) {
      ec = std::make_error_code(std::errc::invalid_argument);
      return;
    }
    entry_->held_back();  // (when the capacity is 0)
    const bool taken =
        entry_->budget.wait(n, entry_->stop_source.get_token(), [] { return coarse_clock::now(); });
    ec = taken ? std::error_code() : std::error_code(asio::error::operation_aborted);
  }

  /// Waits asynchronously for `n` units and takes them, through any asio completion token,
  /// completing `void(std::error_code)`: success once taken, `asio::error::operation_aborted`
  /// when cancelled (the handler's cancellation slot; nothing taken) or when the client
  /// stops, `std::errc::invalid_argument` for an `n` that is negative or not finite.
  template <class CompletionToken>
  auto async_wait(double n, CompletionToken&& token) {
    return detail::async_pending(entry_, n, std::forward<CompletionToken>(token));
  }

  /// What the allotment has left now (0 without one; negative: a debt).
  [[nodiscard]] double left() const noexcept { return entry_->budget.left(coarse_clock::now()); }

  /// Units this process spent in the root's current window.
  [[nodiscard]] double spent() const noexcept { return entry_->budget.spent(); }
};

}  // namespace doorman

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/client/impl/resource.ipp"
#endif
