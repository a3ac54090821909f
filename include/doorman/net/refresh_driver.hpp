#pragma once

/// \file
/// The one asio driver of a refresh machine: it asks the machine what to do, sends its request
/// through a channel, hands the reply back, and sleeps on a timer until the machine's next
/// step. The node drives its upstream with it and the client its state; the simulator drives
/// the same machines through its event queue instead.
///
///     net::refresh_driver<my_requester> driver(strand, requester, channel, "refresh loop", log);
///     driver.async_run([](std::error_code ec) { /* operation_aborted once stopped */ });
///     ...
///     driver.reschedule();  // news: look at the machine again now
///     driver.stop();        // or cancel the run's cancellation slot
///
/// A `Requester` is called on the driver's executor only:
/// - `refresh_step<clock::time_point> next(clock::time_point now)`: send now, or look again at
///   `at` (it may do its own bookkeeping here, e.g. the client measures demand);
/// - `request(clock::time_point now)`: the call to make (the machine marks it in flight), an
///   `outgoing_call<M>` or a `std::variant` of them (a client sends releases and refreshes);
/// - `asio::awaitable<void> on_reply(reply_of<M> reply, clock::time_point now)` for each such
///   `M`: the typed answer, or why there is none (`reply.error`).
///
/// The run never ends by itself: it ends when stopped, completing with `operation_aborted`.
/// Should the requester throw, the loop logs it and starts again (`supervised`).

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>

#include <asio.hpp>

#include "doorman/core/refresh.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/channel.hpp"
#include "doorman/net/completion.hpp"
#include "doorman/net/supervise.hpp"

namespace doorman::net {

/// A call of method `M` a requester wants made: its request, within `timeout` (else the
/// channel's `call_timeout`).
template <class M>
struct outgoing_call {
  using method = M;
  typename M::request request;
  std::optional<seconds> timeout{};
};

namespace detail {
template <class T>
inline constexpr bool is_variant_v = false;
template <class... T>
inline constexpr bool is_variant_v<std::variant<T...>> = true;
}  // namespace detail

template <class Requester>
class refresh_driver {
 public:
  using clock = std::chrono::steady_clock;

  /// `requester` and `channel` must outlive the driver; `name` is for the log
  /// (`"<name> failed (…); restarting"`).
  refresh_driver(asio::any_io_executor executor, Requester& requester, call_channel& ch,
                 std::string name, std::function<void(std::string_view)> log)
      : requester_(requester),
        channel_(ch),
        timer_(std::move(executor)),
        name_(std::move(name)),
        log_(std::move(log)) {}

  refresh_driver(const refresh_driver&) = delete;
  refresh_driver& operator=(const refresh_driver&) = delete;

  /// Runs the loop until `stop` (or a cancellation of the handler's slot); completes with
  /// `asio::error::operation_aborted` then. One run at a time.
  template <class Token>
  auto async_run(Token&& token) {
    return asio::async_initiate<Token, void(std::error_code)>(
        [this](auto handler) {
          auto done = detail::make_completion(std::move(handler), timer_.get_executor());
          done->on_cancel([this] { stop(); });
          stopped_ = false;
          asio::co_spawn(timer_.get_executor(),
                         supervised(
                             name_, [this] { return loop(); }, [this] { return stopped_; }, log_),
                         [done](const std::exception_ptr&) {
                           done->complete(asio::error::operation_aborted);
                         });
        },
        token);
  }

  /// Ends the run at once: a refresh call in flight is cancelled (`channel::cancel`), so a
  /// stop never waits for a server that does not answer. On the driver's executor.
  void stop() {
    stopped_ = true;
    timer_.cancel();
    channel_.cancel();
  }

  /// Looks at the machine again now (something changed that may make a request due sooner).
  /// On the driver's executor.
  void reschedule() { timer_.cancel(); }

  /// When the driver will look again by itself (max: not sleeping).
  [[nodiscard]] clock::time_point wakes_at() const { return timer_.expiry(); }

  [[nodiscard]] bool stopped() const noexcept { return stopped_; }

 private:
  asio::awaitable<void> loop() {
    while (!stopped_) {
      const auto step = requester_.next(clock::now());
      if (step.send) {
        auto call = requester_.request(clock::now());
        if constexpr (detail::is_variant_v<decltype(call)>) {
          co_await std::visit([this](auto& c) { return exchange(std::move(c)); }, call);
        } else {
          co_await exchange(std::move(call));
        }
        continue;
      }
      timer_.expires_at(step.at);
      co_await wait_on(timer_);
    }
  }

  // One typed call and its answer to the requester (none once stopped: a call the stop cut
  // short is no answer).
  template <class Call>
  asio::awaitable<void> exchange(Call call) {
    using M = typename Call::method;
    // Named, not braced inside co_await (GCC 12 destroys such a temporary twice).
    call_options options{.follow_redirects = true, .timeout = call.timeout};
    auto reply = co_await channel_.template call<M>(std::move(call.request), std::move(options));
    if (stopped_) co_return;
    co_await requester_.on_reply(std::move(reply), clock::now());
  }

  Requester& requester_;
  call_channel& channel_;
  asio::steady_timer timer_;
  std::string name_;
  std::function<void(std::string_view)> log_;
  bool stopped_ = false;
};

}  // namespace doorman::net
