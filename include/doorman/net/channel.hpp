#pragma once

/// \file
/// A client connection to a tree position: several addresses, the master found through
/// `mastership` answers (and redirects followed), pipelined calls each with a deadline. Where
/// and when to connect is decided by the sans-I/O `failover` machine (doorman/core/failover.hpp):
/// a call that passes its deadline abandons its connection and the next goes to the next
/// address; every way of failing (refused, reset, closed after accept, a TLS failure, an
/// over-limit refusal) backs off, jittered and capped. Used by intermediate nodes and clients.
///
///     doorman::net::channel ch(io.get_executor(), {.addresses = {"10.0.0.7:7700"}});
///     auto reply = co_await ch.call<doorman::methods::get_capacity>(request);
///     if (reply) use(reply.result); else log(reply.message);  // a capacity_response
///     auto any = co_await ch.call("status", nlohmann::json::object());  // untyped: JSON
///
/// All of a channel's work runs on its executor; call it from there (a strand if the
/// io_context has several threads). Destroy it only once the io_context has stopped.

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "doorman/core/backoff.hpp"
#include "doorman/core/call.hpp"
#include "doorman/core/error.hpp"
#include "doorman/core/failover.hpp"
#include "doorman/core/linkage.hpp"
#include "doorman/core/log_throttle.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/framing.hpp"
#include "doorman/net/tls.hpp"
#include "doorman/protocol/hot_path.hpp"
#include "doorman/protocol/json_rpc.hpp"
#include "doorman/protocol/service.hpp"

namespace doorman::net {

/// Options of a channel, with their defaults.
struct channel_options {
  std::vector<std::string> addresses;  ///< `host:port` of every task of the position
  seconds call_timeout{5};             ///< a call's deadline, redirects and retries included
  seconds connect_timeout{2};          ///< one connection attempt
  seconds initial_backoff{0.05};       ///< after a whole round of addresses failed
  seconds maximum_backoff{5};          ///< ceiling of the exponential backoff (jittered)
  std::size_t max_message_bytes = std::size_t{1} << 20;  ///< longest answer accepted
  int max_redirects = 4;                                 ///< per call
  std::function<void(std::string_view)> log{};  ///< one line per notable event; null: silent
  /// TLS to the servers (docs/security.md); all empty: plaintext.
  tls_options tls{};
};

/// How a call ended: well (then the reply holds the result), or why not.
struct call_status {
  /// Empty when ok; else `errc::unreachable`, `timed_out`, `error_answer` (see `code`),
  /// `bad_answer`, `no_master`, `too_many_redirects`, `shut_down`, or
  /// `asio::error::operation_aborted` (`cancel()`).
  std::error_code error;
  int code = 0;         ///< the JSON-RPC error code, when `error_answer`
  std::string message;  ///< what went wrong, when not ok, in words

  explicit operator bool() const noexcept { return !error; }
};

/// The outcome of a call: a result of type `T`, or why there is none.
template <class T>
struct reply : call_status {
  T result{};  ///< when ok
};

/// The outcome of an untyped call (`channel::call(method, params)`): the answer's `result`.
using call_reply = reply<nlohmann::json>;

/// The outcome of a call of method `M` (a row of doorman/protocol/service.hpp's table).
template <class M>
using reply_of = reply<typename M::response>;

/// How to make one call.
struct call_options {
  bool follow_redirects = true;      ///< follow `mastership` answers to the master
  std::optional<seconds> timeout{};  ///< the call's deadline; none: the channel's `call_timeout`
};

namespace detail {

template <class Table>
struct any_call_of;
template <class... M>
struct any_call_of<std::tuple<M...>> {
  using request = std::variant<const typename M::request*...>;
  using response = std::variant<typename M::response*...>;
};

}  // namespace detail

/// A request of any method of the table, by address (what `call_channel::call_any` takes).
using any_request = detail::any_call_of<method_table>::request;
/// Where its answer goes: the response of the same method.
using any_response = detail::any_call_of<method_table>::response;

/// What a refresh driver and a client call through: `channel` (doorman's JSON-RPC lines), or a
/// channel of another protocol (the compiled gRPC layer has one that speaks Doorman's, for a
/// parent that is a Doorman server). Calls are typed: each channel maps the method's request
/// and response to its own wire. Each call is on the channel's executor.
///
///     auto r = co_await ch.call<doorman::methods::get_capacity>(request);
///     if (r) use(r.result); else log(r.message);  // r.result: a capacity_response
class call_channel {
 public:
  virtual ~call_channel() = default;

  /// Calls method `M` with `request` on the master (following redirects unless told not to)
  /// within the call's deadline; the answer decoded, or why there is none (an answer that does
  /// not decode is `errc::bad_answer`, naming the field).
  template <class M>
  asio::awaitable<reply_of<M>> call(typename M::request request, call_options options = {}) {
    reply_of<M> out;
    call_status s = co_await call_any(&request, &out.result, std::move(options));
    static_cast<call_status&>(out) = std::move(s);
    co_return out;
  }

  /// The typed call's work: `request` and `response` are of one method (`call<M>` sees to it).
  /// A method the channel's protocol lacks fails at once (`errc::error_answer`).
  virtual asio::awaitable<call_status> call_any(any_request request, any_response response,
                                                call_options options) = 0;
  /// Ends the calls in flight at once with `asio::error::operation_aborted`.
  virtual void cancel() = 0;
  /// Closes for good: pending and later calls fail at once.
  virtual void shutdown() = 0;
  /// The address calls go to now.
  [[nodiscard]] virtual const std::string& current() const = 0;
  /// Re-reads the TLS files for the next connections; throws naming the file that fails.
  virtual void reload_tls() = 0;

 protected:
  call_channel() = default;
  call_channel(const call_channel&) = default;
  call_channel& operator=(const call_channel&) = default;
};

/// A refresh answer that is not the master's (`mastership.is_master` false) as a failure,
/// `errc::no_master`: the caller's machine counts it so.
template <class T>
void require_master(reply<T>& r) {
  if (r && !r.result.mastership.is_master) {
    r.error = errc::no_master;
    r.message = "answered as not master";
  }
}

class channel final : public call_channel {
 public:
  channel(asio::any_io_executor executor, channel_options options)
      : executor_(std::move(executor)),
        options_(std::move(options)),
        tls_(options_.tls.active()
                 ? std::make_shared<tls_context>(tls_side::client, options_.tls, "channel tls")
                 : nullptr),
        state_(fresh_state()),
        policy_(checked(options_.addresses),
                {{options_.initial_backoff, options_.maximum_backoff}, std::random_device{}()}) {}

  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;
  ~channel() override {
    *alive_ = nullptr;
    close();
  }

  /// The address calls go to now.
  [[nodiscard]] const std::string& current() const override { return policy_.current(); }

  /// Failures in a row since the last answer (each backs off once a round of addresses
  /// failed).
  [[nodiscard]] std::uint32_t failures() const noexcept { return policy_.failures(); }

  /// Re-reads the TLS certificate, key and CA files for the next connections (the open one
  /// stays); throws as `tls_context::reload` does. Nothing without TLS.
  void reload_tls() override {
    if (tls_) tls_->reload();
  }

  /// The identity the server's certificate showed on the open connection (empty without TLS).
  [[nodiscard]] const std::string& server_identity() const noexcept {
    return state_->stream.identity();
  }

  /// Whether a connection is open.
  [[nodiscard]] bool connected() const noexcept { return state_->open; }

  /// Closes the connection; pending calls fail. Later calls reconnect.
  void close() { drop(); }

  /// Ends the calls in flight at once with `asio::error::operation_aborted` (a connection
  /// attempt under way is abandoned; an open connection stays open, and an answer that comes
  /// later is dropped). Later calls proceed as usual.
  void cancel() override {
    ++cancels_;
    for (auto* t : sleeping_)
      t->cancel();
    if (!state_->open) {
      std::error_code ignored;
      state_->stream.socket().close(ignored);  // a connect under way
    }
    for (auto& [id, p] : state_->pending) {
      p->cancelled = true;
      p->done.cancel();
    }
    state_->pending.clear();
  }

  /// Closes for good: pending and later calls fail at once (for a graceful stop).
  void shutdown() override {
    shut_ = true;
    for (auto* t : sleeping_)
      t->cancel();
    drop();
  }

  using call_channel::call;

  /// Calls `method` with `params` on the master: follows `mastership` redirects (when
  /// `follow_redirects`), reconnects and retries other addresses until the call's deadline
  /// (`timeout`, or else the options' `call_timeout`). A call that passes its deadline leaves
  /// its connection (the peer may be hung or cut off): the next call goes to the next address.
  /// A call that finds the channel backing off until after its deadline fails at once.
  DOORMAN_DECL asio::awaitable<call_reply> call(std::string method, nlohmann::json params,
                                                bool follow_redirects = true,
                                                std::optional<seconds> timeout = std::nullopt);

  /// A typed call as JSON-RPC: the request written straight into its line by the streaming
  /// writer the server answers with (doorman/protocol/hot_path.hpp: the bytes `to_line` would
  /// write, without a DOM), sent as `call` sends params; the answer's `result` decoded.
  DOORMAN_DECL asio::awaitable<call_status> call_any(any_request request, any_response response,
                                                     call_options options) override;

 private:
  using clock = std::chrono::steady_clock;

  struct pending_call {
    explicit pending_call(const asio::any_io_executor& ex) : done(ex) {}
    asio::steady_timer done;
    std::optional<nlohmann::json> answer;
    bool lost = false;
    bool cancelled = false;
  };

  // Shared with the connection's reader coroutine, which may outlive a reconnect.
  struct connection_state {
    connection_state(const asio::any_io_executor& ex, const ssl_context_ptr& tls)
        : stream(ex, tls) {}
    net::stream stream;
    bool open = false;
    std::map<std::int64_t, pending_call*> pending;
    std::string out;
    bool writing = false;
    bool answered = false;   // an answer came on this connection
    seconds retry_after{0};  // a refusal's retry hint (an error answer with id null)
    std::string refusal;     // that refusal, as it reads (its code, message and retry hint)
  };

  static call_reply fail(std::error_code e, std::string message) {
    call_reply r;
    r.error = e;
    r.message = std::move(message);
    return r;
  }

  // The last connection problem, for a call's failure message ("" when none).
  std::string last_problem() const {
    return problem_.empty() ? std::string() : " (last problem: " + problem_ + ")";
  }

  static std::vector<std::string> checked(const std::vector<std::string>& addresses) {
    if (addresses.empty()) throw std::invalid_argument("channel: no addresses");
    for (const auto& a : addresses) {
      if (!parse_address(a)) throw std::invalid_argument("channel: bad address " + a);
    }
    return addresses;
  }

  // A connection problem, in words, for the calls' failures and (throttled) the log.
  void warn(std::string problem) {
    problem_ = std::move(problem);
    problem_log_.log(options_.log, "warning: " + problem_, clock::now());
  }

  // The connection failed for `why`: the machine moves on (backing off once a round failed),
  // and the connection is closed.
  void abandon(failure why, std::string problem, seconds retry_after = seconds(0)) {
    policy_.failed(clock::now(), why, retry_after);
    warn(std::move(problem));
    drop();
  }

  using call_fsm = call_machine<clock::time_point>;
  using call_step = call_action<clock::time_point>;

  // The machine's `connect`: one attempt at the current address before the call's deadline
  // (or, while another call's attempt is under way, its outcome); the machine's next step.
  DOORMAN_DECL asio::awaitable<call_step> connect_step(call_fsm& m, std::uint64_t cancels);

  // A call with its params already written (JSON text): the machine's loop.
  DOORMAN_DECL asio::awaitable<call_reply> call_written(std::string method, std::string params,
                                                        call_options options);

  // The machine's `send`: the call on the connection; the machine's next step, with the
  // reply in `reply` (an error answer ends the call as it is: `done`).
  DOORMAN_DECL asio::awaitable<call_step> send_step(call_fsm& m, const std::string& method,
                                                    std::string_view params, call_reply& reply);

  // The machine's `moved`: the route left this address (for the master it names, or past a
  // non-master that names none); the connection is closed unless it already is the master's.
  void follow(const call_fsm& m) {
    if (m.moved_from().empty()) {
      drop();
    } else if (current() != m.moved_from() || !state_->open) {
      // During a failover several calls may each be redirected: one line per 5 s at most.
      redirect_log_.log(options_.log, fmt::format("following the master to {}", current()),
                        clock::now());
      drop();
    }
  }

  // Closes the connection; every pending call fails as lost.
  void drop() {
    auto s = state_;
    if (!s->open && s->pending.empty()) return;
    std::error_code ec;
    s->stream.close();
    s->open = false;
    for (auto& [id, p] : s->pending) {
      p->lost = true;
      p->done.cancel();
    }
    s->pending.clear();
    state_ = fresh_state();
  }

  std::shared_ptr<connection_state> fresh_state() const {
    return std::make_shared<connection_state>(executor_, tls_ ? tls_->current() : nullptr);
  }

  DOORMAN_DECL asio::awaitable<void> sleep_until(clock::time_point until,
                                                 bool until_connected = false);

  // How a connection attempt ended: `cut_short` when the call's own deadline, before
  // connect_timeout, ended it (which says nothing new about the peer).
  enum class attempt { connected, failed, cut_short };

  // One attempt at the current address, bounded by connect_timeout and the deadline.
  DOORMAN_DECL asio::awaitable<attempt> connect(clock::time_point deadline);

  DOORMAN_DECL asio::awaitable<call_reply> send(const std::string& method, std::string_view params,
                                                clock::time_point deadline);

  static DOORMAN_DECL asio::awaitable<void> write_loop(std::shared_ptr<connection_state> s);

  // Reads answers and hands each to its call; on a broken connection fails them all.
  static DOORMAN_DECL asio::awaitable<void> read_loop(std::shared_ptr<channel*> alive,
                                                      std::shared_ptr<connection_state> s,
                                                      std::size_t limit);

  static void answered(const std::shared_ptr<channel*>& alive, connection_state& s) {
    s.answered = true;
    channel* self = *alive;
    if (self && self->state_.get() == &s) self->policy_.answered();
  }

  // The retry delay a refusal asks for: `error.data.retry_after` seconds, if a sane number.
  static seconds retry_hint(const nlohmann::json& answer) {
    const auto e = answer.find("error");
    if (e == answer.end() || !e->is_object()) return seconds(0);
    const auto d = e->find("data");
    if (d == e->end() || !d->is_object()) return seconds(0);
    const auto r = d->find("retry_after");
    if (r == d->end() || !r->is_number()) return seconds(0);
    const double v = r->get<double>();
    return seconds(v > 0 && v <= 300 ? v : 0);
  }

  // A refusal as the log and the failed calls say it: `refused (-32000 too many connections;
  // try again later; retry after 1 s)`. The peer's message is untrusted: cut to 200 bytes of
  // printable ASCII.
  static std::string refusal_text(const nlohmann::json& answer, seconds retry_after) {
    std::string out = "refused (";
    const auto e = answer.find("error");
    if (e != answer.end() && e->is_object()) {
      if (const auto c = e->find("code"); c != e->end() && c->is_number_integer()) {
        out += std::to_string(c->get<std::int64_t>()) + " ";
      }
      if (const auto m = e->find("message"); m != e->end() && m->is_string()) {
        for (const char ch : m->get_ref<const std::string&>().substr(0, 200))
          out += ch >= 0x20 && ch < 0x7f ? ch : '?';
      }
    }
    if (retry_after.count() > 0) out += fmt::format("; retry after {:g} s", retry_after.count());
    return out + ")";
  }

  asio::any_io_executor executor_;
  channel_options options_;
  std::shared_ptr<tls_context> tls_;
  std::shared_ptr<connection_state> state_;
  failover<clock::time_point> policy_;
  std::int64_t next_id_ = 1;
  bool shut_ = false;
  std::uint64_t cancels_ = 0;  // calls begun before the latest cancel() end
  std::unordered_set<asio::steady_timer*> sleeping_;
  // One connection attempt at a time: calls made meanwhile wait for it (they are woken when it
  // ends, whatever its outcome), instead of each connecting the one socket.
  bool connecting_ = false;
  std::unordered_set<asio::steady_timer*> awaiting_connect_;
  std::string problem_;          // the last connection problem, in words
  std::string connect_problem_;  // why the last connection attempt failed
  log_throttle<clock::time_point> problem_log_{seconds(5)};
  log_throttle<std::chrono::steady_clock::time_point> redirect_log_{seconds(5)};
  std::shared_ptr<channel*> alive_ = std::make_shared<channel*>(this);
};

}  // namespace doorman::net

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/net/impl/channel.ipp"
#endif
