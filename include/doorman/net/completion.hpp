#pragma once

/// \file
/// A completion handler held while an asynchronous operation waits for something that another
/// party signals (a stop finishing, a driver ending): completed exactly once, on the handler's
/// associated executor (which counts it as outstanding work meanwhile), by the event or first
/// by a cancellation of the handler's slot. The client's waits and `async_stop` and the refresh
/// driver's `async_run` complete through it.
///
///     auto done = net::detail::make_completion(std::move(handler), strand);
///     done->on_cancel([...] { /* cancel the work; it completes done later */ });
///     ...
///     done->complete(ec);  // from any thread; the first call wins

#include <atomic>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/error.hpp>
#include <asio/execution/executor.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>

namespace doorman::net::detail {

/// `ex`, counting outstanding work while the result lives (for standard and older executors).
template <class Executor>
auto tracked(const Executor& ex) {
  if constexpr (asio::execution::is_executor<Executor>::value) {
    return asio::prefer(ex, asio::execution::outstanding_work.tracked);
  } else {
    return asio::make_work_guard(ex);
  }
}

template <class Executor>
auto executor_of(const Executor& ex) {
  if constexpr (asio::execution::is_executor<Executor>::value) {
    return ex;
  } else {
    return ex.get_executor();  // a work guard
  }
}

/// A completion handler waiting for an event, completed once — by the event, or earlier by a
/// cancellation of its slot (`operation_aborted`). Completes on the handler's associated
/// executor, which it keeps busy until then.
template <class Handler>
class pending_completion : public std::enable_shared_from_this<pending_completion<Handler>> {
 public:
  pending_completion(Handler h, const asio::any_io_executor& fallback)
      : handler_(std::move(h)),
        executor_(std::in_place, tracked(asio::get_associated_executor(handler_, fallback))) {}

  // Calls `f()` when the handler's cancellation slot is signalled (call once, where the
  // operation starts, so on the thread that owns the slot).
  template <class F>
  void on_cancel(F f) {
    auto slot = asio::get_associated_cancellation_slot(handler_);
    if (slot.is_connected()) slot.assign([f = std::move(f)](asio::cancellation_type) { f(); });
  }

  // A cancellation completes it with `operation_aborted` at once.
  void cancel_completes() {
    on_cancel([weak = this->weak_from_this()] {
      if (auto self = weak.lock()) self->complete(asio::error::operation_aborted);
    });
  }

  // Completes it (the first call only), on the handler's executor.
  void complete(std::error_code ec) {
    if (done_.exchange(true)) return;
    asio::post(executor_of(*executor_), [self = this->shared_from_this(), ec] {
      auto slot = asio::get_associated_cancellation_slot(self->handler_);
      if (slot.is_connected()) slot.clear();
      std::move(self->handler_)(ec);
      self->executor_.reset();  // no more work
    });
  }

 private:
  using executor_type = asio::associated_executor_t<Handler, asio::any_io_executor>;
  Handler handler_;
  // The handler's, counting outstanding work until the handler has run.
  std::optional<decltype(tracked(std::declval<executor_type>()))> executor_;
  std::atomic<bool> done_{false};
};

/// A shared `pending_completion` of `h` (completing on `fallback` if `h` has no executor).
template <class Handler>
auto make_completion(Handler h, const asio::any_io_executor& fallback) {
  return std::make_shared<pending_completion<Handler>>(std::move(h), fallback);
}

}  // namespace doorman::net::detail
