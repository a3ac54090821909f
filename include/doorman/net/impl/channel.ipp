#pragma once

/// \file
/// The coroutines of net::channel, and what spawns them (declared in <doorman/net/channel.hpp>):
/// included by that header when header-only, compiled once by <doorman/src.hpp> under
/// DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/net/channel.hpp"

namespace doorman::net {

DOORMAN_DECL asio::awaitable<call_reply> channel::call(std::string method, nlohmann::json params,
                                                       bool follow_redirects,
                                                       std::optional<seconds> timeout) {
  const auto start = clock::now();
  const auto deadline =
      start + to_duration<clock::duration>(timeout.value_or(options_.call_timeout).count());
  bool first_attempt = true;  // the one that may cut the backoff short (`attempt_at`)
  int redirects = 0;
  const std::uint64_t cancels = cancels_;
  for (;;) {
    if (shut_) co_return fail(errc::shut_down, "channel shut down");
    if (cancels_ != cancels) co_return fail(asio::error::operation_aborted, "call cancelled");
    if (!state_->open) {
      // (Not inside the if's condition: GCC 12 miscompiles a co_await there.)
      std::optional<call_reply> refused =
          co_await reconnect(start, deadline, cancels, first_attempt);
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

DOORMAN_DECL asio::awaitable<std::optional<call_reply>> channel::reconnect(
    clock::time_point start, clock::time_point deadline, std::uint64_t cancels, bool& first) {
  std::optional<call_reply> out;
  const auto at = policy_.attempt_at(start, deadline, first);
  if (clock::now() >= deadline || at == clock::time_point::max()) {
    out = fail(errc::unreachable, fmt::format("no task of the position answered; backing off "
                                              "after {} failures in a row{}",
                                              policy_.failures(), last_problem()));
    co_return out;
  }
  if (clock::now() < at) {
    co_await sleep_until(at);
    co_return out;
  }
  first = false;
  if (connecting_) {  // another call's attempt: its outcome is this call's too
    co_await sleep_until(deadline, true);
    co_return out;
  }
  connect_problem_.clear();
  connecting_ = true;
  attempt a = attempt::failed;
  {
    // However the attempt ends (an exception included), the calls waiting for it go on.
    const auto woken = [this](void*) {
      connecting_ = false;
      for (auto* t : awaiting_connect_)
        t->cancel();
    };
    const std::unique_ptr<void, decltype(woken)> wake(this, woken);
    a = co_await connect(deadline);
  }
  if (a != attempt::connected && cancels_ == cancels) {
    policy_.failed(clock::now(), failure::unreachable);
    // An attempt the call's own deadline cut short says nothing new of the peer: the problem
    // that made the call retry stays the one reported.
    if (a == attempt::failed || problem_.empty()) warn(std::move(connect_problem_));
  }
  co_return out;
}

DOORMAN_DECL asio::awaitable<void> channel::sleep_until(clock::time_point until,
                                                        bool until_connected) {
  asio::steady_timer t(executor_);
  t.expires_at(until);
  sleeping_.insert(&t);
  if (until_connected) awaiting_connect_.insert(&t);
  std::error_code ec;
  co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  sleeping_.erase(&t);
  awaiting_connect_.erase(&t);
}

DOORMAN_DECL asio::awaitable<channel::attempt> channel::connect(clock::time_point deadline) {
  const auto addr = parse_address(current());
  auto s = state_;
  std::error_code ec;
  bool timed_out = false;
  const auto own_deadline =
      clock::now() + to_duration<clock::duration>(options_.connect_timeout.count());
  {
    const socket_deadline guard(executor_, std::min(deadline, own_deadline), [s] {
      std::error_code ignored;
      s->stream.socket().close(ignored);
    });
    asio::ip::tcp::resolver resolver(executor_);
    auto endpoints = co_await resolver.async_resolve(addr->host, addr->port,
                                                     asio::redirect_error(asio::use_awaitable, ec));
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
    co_return timed_out&& deadline < own_deadline ? attempt::cut_short : attempt::failed;
  }
  s->stream.socket().set_option(asio::ip::tcp::no_delay(true), ec);
  s->open = true;
  asio::co_spawn(executor_, read_loop(alive_, s, options_.max_message_bytes), asio::detached);
  co_return attempt::connected;
}

DOORMAN_DECL asio::awaitable<call_reply> channel::send(const std::string& method,
                                                       const nlohmann::json& params,
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

DOORMAN_DECL asio::awaitable<void> channel::write_loop(std::shared_ptr<connection_state> s) {
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

DOORMAN_DECL asio::awaitable<void> channel::read_loop(std::shared_ptr<channel*> alive,
                                                      std::shared_ptr<connection_state> s,
                                                      std::size_t limit) {
  line_buffer in(limit);
  std::string problem;
  // Nothing below throws on what a peer sends; should anything else throw, the connection
  // is dropped (its calls fail and reconnect) rather than left open with no reader.
  try {
    while (s->open) {
      std::error_code ec;
      const std::size_t n = co_await s->stream.async_read_some(
          in.prepare(), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        problem = ec.message();
        break;
      }
      in.commit(n);
      while (const auto line = in.next_line()) {
        auto answer = nlohmann::json::parse(line->begin(), line->end(), nullptr, false);
        if (!answer.is_object()) continue;
        const auto id = answer.find("id");
        if (id != answer.end() && id->is_null()) {
          s->retry_after = retry_hint(answer);
          s->refusal = refusal_text(answer, s->retry_after);
        }
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
                  !s->answered && !s->refusal.empty()
                      ? fmt::format("connection to {} {}", self->current(), s->refusal)
                      : fmt::format("connection to {} {}: {}", self->current(),
                                    s->answered ? "lost" : "closed before any answer", problem),
                  s->retry_after);
  }
}

}  // namespace doorman::net
