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
/// - `outgoing_call request(clock::time_point now)`: the call to make (the machine marks it in
///   flight);
/// - `asio::awaitable<void> on_reply(call_reply reply, clock::time_point now)`: the answer, or
///   why there is none (`reply.error`).
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

#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "doorman/core/refresh.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/channel.hpp"
#include "doorman/net/completion.hpp"
#include "doorman/net/supervise.hpp"
#include "doorman/protocol/codec.hpp"

namespace doorman::net {

/// A call a requester wants made: `method` with `params`, within `timeout` (else the channel's
/// `call_timeout`).
struct outgoing_call {
  std::string method;
  nlohmann::json params;
  std::optional<seconds> timeout{};
};

/// Decodes the answer of a refresh (`get_capacity`, `get_server_capacity`) into `out`. An
/// answer that does not decode, or a non-master's, turns `reply` into a failure
/// (`errc::bad_answer`, `errc::no_master`) with its reason in `reply.message`.
template <class Response>
void decode_refresh(call_reply& reply, Response& out) {
  if (!reply) return;
  if (auto err = decode(reply.result, out)) {
    reply.error = errc::bad_answer;
    reply.message = "bad answer: " + err->message;
  } else if (!out.mastership.is_master) {
    reply.error = errc::no_master;
    reply.message = "answered as not master";
  }
}

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
        outgoing_call call = requester_.request(clock::now());
        auto reply = co_await channel_.call(std::move(call.method), std::move(call.params), true,
                                            call.timeout);
        if (stopped_) break;
        co_await requester_.on_reply(std::move(reply), clock::now());
        continue;
      }
      timer_.expires_at(step.at);
      co_await wait_on(timer_);
    }
  }

  Requester& requester_;
  call_channel& channel_;
  asio::steady_timer timer_;
  std::string name_;
  std::function<void(std::string_view)> log_;
  bool stopped_ = false;
};

}  // namespace doorman::net
