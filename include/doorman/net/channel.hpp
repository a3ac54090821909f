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
///     auto reply = co_await ch.call("get_capacity", params);
///     if (reply) use(reply.result); else log(reply.message);
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
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "doorman/core/backoff.hpp"
#include "doorman/core/error.hpp"
#include "doorman/core/failover.hpp"
#include "doorman/core/log_throttle.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/framing.hpp"
#include "doorman/net/tls.hpp"
#include "doorman/protocol/json_rpc.hpp"

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

/// The outcome of a call: a result, or why there is none.
struct call_reply {
  /// Empty when ok; else `errc::unreachable`, `timed_out`, `error_answer` (see `code`),
  /// `bad_answer`, `no_master`, `too_many_redirects`, `shut_down`, or
  /// `asio::error::operation_aborted` (`cancel()`).
  std::error_code error;
  nlohmann::json result;  ///< when ok
  int code = 0;           ///< the JSON-RPC error code, when `error_answer`
  std::string message;    ///< what went wrong, when not ok, in words

  explicit operator bool() const noexcept { return !error; }
};

class channel {
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
  ~channel() {
    *alive_ = nullptr;
    close();
  }

  /// The address calls go to now.
  [[nodiscard]] const std::string& current() const { return policy_.current(); }

  /// Failures in a row since the last answer (each backs off once a round of addresses
  /// failed).
  [[nodiscard]] std::uint32_t failures() const noexcept { return policy_.failures(); }

  /// Re-reads the TLS certificate, key and CA files for the next connections (the open one
  /// stays); throws as `tls_context::reload` does. Nothing without TLS.
  void reload_tls() {
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
  void cancel() {
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
  void shutdown() {
    shut_ = true;
    for (auto* t : sleeping_)
      t->cancel();
    drop();
  }

  /// Calls `method` with `params` on the master: follows `mastership` redirects (when
  /// `follow_redirects`), reconnects and retries other addresses until the call's deadline
  /// (`timeout`, or else the options' `call_timeout`). A call that passes its deadline leaves
  /// its connection (the peer may be hung or cut off): the next call goes to the next address.
  /// A call that finds the channel backing off until after its deadline fails at once.
  asio::awaitable<call_reply> call(std::string method, nlohmann::json params,
                                   bool follow_redirects = true,
                                   std::optional<seconds> timeout = std::nullopt) {
    const auto deadline = clock::now() + to_duration<clock::duration>(
                                             timeout.value_or(options_.call_timeout).count());
    int redirects = 0;
    const std::uint64_t cancels = cancels_;
    for (;;) {
      if (shut_) co_return fail(errc::shut_down, "channel shut down");
      if (cancels_ != cancels) co_return fail(asio::error::operation_aborted, "call cancelled");
      if (!state_->open) {
        // (Not inside the if's condition: GCC 12 miscompiles a co_await there.)
        std::optional<call_reply> refused = co_await reconnect(deadline, cancels);
        if (refused) co_return std::move(*refused);
        continue;
      }
      call_reply reply = co_await send(method, params, deadline);
      if (reply.error == errc::timed_out) {
        abandon(failure::hung, fmt::format("{} did not answer {} in time", current(), method));
        co_return reply;
      }
      if (reply.error == errc::unreachable && clock::now() < deadline) {
        continue;  // the connection broke: reconnect and resend (calls are idempotent)
      }
      if (!reply || !follow_redirects) co_return reply;
      const redirect_hint hint = read_redirect(reply.result);
      if (!hint.not_master) co_return reply;
      // A non-master: go where it says, or try the next address.
      if (++redirects > options_.max_redirects) {
        co_return fail(errc::too_many_redirects, "too many mastership redirects");
      }
      if (hint.master && parse_address(*hint.master)) {
        redirect(*hint.master);
      } else {
        policy_.no_master(clock::now());
        drop();
      }
      if (clock::now() >= deadline) {
        co_return fail(errc::no_master, "no master found before the deadline");
      }
    }
  }

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

  void redirect(const std::string& master) {
    const std::string before = current();
    policy_.redirected(master, clock::now());
    if (master != before || !state_->open) {
      // During a failover several calls may each be redirected: one line per 5 s at most.
      redirect_log_.log(options_.log, fmt::format("following the master to {}", master),
                        clock::now());
      drop();
    }
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

  // Connects when the machine allows, before `deadline`; a failed call's reply when it cannot.
  asio::awaitable<std::optional<call_reply>> reconnect(clock::time_point deadline,
                                                       std::uint64_t cancels) {
    std::optional<call_reply> out;
    if (clock::now() >= deadline || policy_.connect_at() >= deadline) {
      out = fail(errc::unreachable, fmt::format("no task of the position answered; backing off "
                                                "after {} failures in a row{}",
                                                policy_.failures(), last_problem()));
      co_return out;
    }
    if (clock::now() < policy_.connect_at()) {
      co_await sleep_until(policy_.connect_at());
      co_return out;
    }
    connect_problem_.clear();
    if (!co_await connect(deadline) && cancels_ == cancels) {
      policy_.failed(clock::now(), failure::unreachable);
      warn(std::move(connect_problem_));
    }
    co_return out;
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

  asio::awaitable<void> sleep_until(clock::time_point until) {
    asio::steady_timer t(executor_);
    t.expires_at(until);
    sleeping_.insert(&t);
    std::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    sleeping_.erase(&t);
  }

  // One attempt at the current address, bounded by connect_timeout and the deadline.
  asio::awaitable<bool> connect(clock::time_point deadline) {
    const auto addr = parse_address(current());
    auto s = state_;
    std::error_code ec;
    bool timed_out = false;
    {
      const socket_deadline guard(
          executor_,
          std::min(deadline,
                   clock::now() + to_duration<clock::duration>(options_.connect_timeout.count())),
          [s] {
            std::error_code ignored;
            s->stream.socket().close(ignored);
          });
      asio::ip::tcp::resolver resolver(executor_);
      auto endpoints = co_await resolver.async_resolve(
          addr->host, addr->port, asio::redirect_error(asio::use_awaitable, ec));
      if (!ec && !guard.expired()) {
        co_await asio::async_connect(s->stream.socket(), endpoints,
                                     asio::redirect_error(asio::use_awaitable, ec));
      }
      if (!ec && !guard.expired() && s->stream.secure()) {
        const auto& name = options_.tls.server_name.empty() ? addr->host : options_.tls.server_name;
        co_await s->stream.handshake(tls_side::client, name, ec);
        if (ec && !guard.expired()) {
          connect_problem_ = fmt::format("TLS handshake with {} failed: {}", addr->to_string(),
                                         s->stream.failure(ec));
        }
      }
      timed_out = guard.expired();
    }
    if (ec || timed_out || s != state_) {
      if (connect_problem_.empty()) {
        connect_problem_ = fmt::format("cannot connect to {}: {}", addr->to_string(),
                                       timed_out ? "timed out" : ec.message());
      }
      s->stream.close();
      co_return false;
    }
    s->stream.socket().set_option(asio::ip::tcp::no_delay(true), ec);
    s->open = true;
    asio::co_spawn(executor_, read_loop(alive_, s, options_.max_message_bytes), asio::detached);
    co_return true;
  }

  asio::awaitable<call_reply> send(const std::string& method, const nlohmann::json& params,
                                   clock::time_point deadline) {
    auto s = state_;
    const std::int64_t id = next_id_++;
    pending_call p(executor_);
    s->pending.emplace(id, &p);
    s->out += to_line({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}});
    s->out += '\n';
    if (!s->writing) {
      s->writing = true;
      asio::co_spawn(executor_, write_loop(s), asio::detached);
    }
    p.done.expires_at(deadline);
    std::error_code ec;
    co_await p.done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    s->pending.erase(id);
    if (p.answer) {
      rpc_answer a = read_answer(*p.answer);  // never throws, whatever the types
      switch (a.type) {
        case rpc_answer::kind::error: {
          call_reply r = fail(errc::error_answer, std::move(a.message));
          r.code = a.code;
          co_return r;
        }
        case rpc_answer::kind::malformed:
          co_return fail(errc::bad_answer, std::move(a.message));
        case rpc_answer::kind::result:
          break;
      }
      call_reply r;
      r.result = std::move(a.result);
      co_return r;
    }
    if (p.cancelled) co_return fail(asio::error::operation_aborted, "call cancelled");
    if (p.lost) co_return fail(errc::unreachable, "connection lost" + last_problem());
    co_return fail(errc::timed_out, method + ": no answer before the deadline" + last_problem());
  }

  static asio::awaitable<void> write_loop(std::shared_ptr<connection_state> s) {
    std::string buffer;
    while (s->open && !s->out.empty()) {
      std::swap(buffer, s->out);
      std::error_code ec;
      co_await asio::async_write(s->stream, asio::buffer(buffer),
                                 asio::redirect_error(asio::use_awaitable, ec));
      buffer.clear();
      if (ec) break;
    }
    s->writing = false;
  }

  // Reads answers and hands each to its call; on a broken connection fails them all.
  static asio::awaitable<void> read_loop(std::shared_ptr<channel*> alive,
                                         std::shared_ptr<connection_state> s, std::size_t limit) {
    line_buffer in(limit);
    std::array<char, 16384> chunk;
    std::string problem;
    // Nothing below throws on what a peer sends; should anything else throw, the connection
    // is dropped (its calls fail and reconnect) rather than left open with no reader.
    try {
      while (s->open) {
        std::error_code ec;
        const std::size_t n = co_await s->stream.async_read_some(
            asio::buffer(chunk), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) {
          problem = ec.message();
          break;
        }
        in.append(std::string_view(chunk.data(), n));
        while (const auto line = in.next_line()) {
          auto answer = nlohmann::json::parse(line->begin(), line->end(), nullptr, false);
          if (!answer.is_object()) continue;
          const auto id = answer.find("id");
          if (id != answer.end() && id->is_null()) s->retry_after = retry_hint(answer);
          if (id == answer.end() || !id->is_number_integer()) continue;
          answered(alive, *s);
          const auto it = s->pending.find(id->get<std::int64_t>());
          if (it == s->pending.end()) continue;  // a call that timed out meanwhile
          it->second->answer = std::move(answer);
          it->second->done.cancel();
          s->pending.erase(it);
        }
        if (in.too_long()) {
          problem = "answer longer than max_message_bytes";
          break;
        }
        in.compact();
      }
    } catch (const std::exception& e) {
      problem = std::string("reading answers failed: ") + e.what();
    }
    channel* self = *alive;
    if (self && s == self->state_ && s->open) {
      // Closed before any answer: the peer refused us (over its limit, a refused certificate,
      // a protocol mismatch), which backs off like a refused connect.
      const failure why = s->answered                  ? failure::lost
                          : s->retry_after.count() > 0 ? failure::refused
                                                       : failure::closed;
      self->abandon(why,
                    fmt::format("connection to {} {}: {}", self->current(),
                                s->answered ? "lost" : "closed before any answer", problem),
                    s->retry_after);
    }
  }

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

  asio::any_io_executor executor_;
  channel_options options_;
  std::shared_ptr<tls_context> tls_;
  std::shared_ptr<connection_state> state_;
  failover<clock::time_point> policy_;
  std::int64_t next_id_ = 1;
  bool shut_ = false;
  std::uint64_t cancels_ = 0;  // calls begun before the latest cancel() end
  std::unordered_set<asio::steady_timer*> sleeping_;
  std::string problem_;          // the last connection problem, in words
  std::string connect_problem_;  // why the last connection attempt failed
  log_throttle<clock::time_point> problem_log_{seconds(5)};
  log_throttle<std::chrono::steady_clock::time_point> redirect_log_{seconds(5)};
  std::shared_ptr<channel*> alive_ = std::make_shared<channel*>(this);
};

}  // namespace doorman::net
