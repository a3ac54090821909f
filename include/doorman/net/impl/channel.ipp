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
  call_options options{.follow_redirects = follow_redirects, .timeout = timeout};
  co_return co_await call_written(std::move(method), to_line(params), std::move(options));
}

DOORMAN_DECL asio::awaitable<call_reply> channel::call_written(std::string method,
                                                               std::string params,
                                                               call_options options) {
  const auto start = clock::now();
  const auto deadline =
      start + to_duration<clock::duration>(options.timeout.value_or(options_.call_timeout).count());
  call_fsm m(policy_, start, deadline, {options_.max_redirects, options.follow_redirects});
  const std::uint64_t cancels = cancels_;
  call_reply reply;
  call_step a = m.resume(start, state_->open, last_problem());
  for (;;) {
    if (shut_) co_return fail(errc::shut_down, "channel shut down");
    if (cancels_ != cancels) co_return fail(asio::error::operation_aborted, "call cancelled");
    switch (a.what) {
      case call_step::kind::wait:
        co_await sleep_until(a.until);
        a = m.resume(clock::now(), state_->open, last_problem());
        break;
      case call_step::kind::connect:
        a = co_await connect_step(m, cancels);
        break;
      case call_step::kind::send:
        a = co_await send_step(m, method, params, reply);
        break;
      case call_step::kind::moved:
        follow(m);
        a = m.resume(clock::now(), state_->open, last_problem());
        break;
      case call_step::kind::done:
        co_return std::move(reply);
      case call_step::kind::fail:
        co_return fail(a.error, std::move(a.message));
    }
  }
}

DOORMAN_DECL asio::awaitable<call_status> channel::call_any(any_request request,
                                                            any_response response,
                                                            call_options options) {
  std::string method;
  std::string params;
  std::visit(
      [&](const auto* r) {
        using request_type = std::remove_cvref_t<decltype(*r)>;
        method = method_of_request<request_type>::name;
        if constexpr (described_message<request_type>) {
          doorman::detail::write_fields(params, *r);
        } else {
          params = to_line(nlohmann::json(*r));
        }
      },
      request);
  call_reply reply =
      co_await call_written(std::move(method), std::move(params), std::move(options));
  if (reply) {
    std::visit(
        [&](auto* out) {
          if (auto err = decode(reply.result, *out)) {
            reply.error = errc::bad_answer;
            reply.message = "bad answer: " + err->message;
          }
        },
        response);
  }
  co_return std::move(static_cast<call_status&>(reply));
}

DOORMAN_DECL asio::awaitable<channel::call_step> channel::connect_step(call_fsm& m,
                                                                       std::uint64_t cancels) {
  if (state_->open) co_return m.resume(clock::now(), true);
  if (connecting_) {  // another call's attempt: its outcome is this call's too
    co_await sleep_until(m.deadline(), true);
    co_return m.resume(clock::now(), state_->open, last_problem());
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
    a = co_await connect(m.deadline());
  }
  if (a == attempt::connected) co_return m.resume(clock::now(), true);
  // An attempt the call's own deadline cut short says nothing new of the peer: the problem
  // that made the call retry stays the one reported.
  const bool counted = cancels_ == cancels;
  if (counted && (a == attempt::failed || problem_.empty())) warn(std::move(connect_problem_));
  co_return m.connect_failed(clock::now(), counted, last_problem());
}

DOORMAN_DECL asio::awaitable<channel::call_step> channel::send_step(call_fsm& m,
                                                                    const std::string& method,
                                                                    std::string_view params,
                                                                    call_reply& reply) {
  reply = co_await send(method, params, m.deadline());
  if (reply.error == errc::timed_out) {
    // The peer is hung or cut off: the route moves on (the machine), the connection is closed.
    std::string problem = fmt::format("{} did not answer {} in time", current(), method);
    auto next = m.timed_out(clock::now(), reply.message);
    warn(std::move(problem));
    drop();
    co_return next;
  }
  // The connection broke: connect and send again (calls are idempotent) while time is left.
  if (reply.error == errc::unreachable) co_return m.lost(clock::now(), reply.message);
  if (!reply) co_return m.error_answer();  // an error answer is the call's answer
  const redirect_hint hint = read_redirect(reply.result);
  std::optional<std::string> master;
  if (hint.master && parse_address(*hint.master)) master = hint.master;
  co_return m.answered(clock::now(), hint.not_master, master);
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
                                                       std::string_view params,
                                                       clock::time_point deadline) {
  auto s = state_;
  const std::int64_t id = next_id_++;
  pending_call p(executor_);
  s->pending.emplace(id, &p);
  // The envelope as to_line writes it (members by name): {"id":..,"jsonrpc":..,"method":..,
  // "params":..}.
  s->out += R"({"id":)";
  doorman::detail::write_value(s->out, id);
  s->out += R"(,"jsonrpc":"2.0","method":)";
  doorman::detail::write_string(s->out, method);
  s->out += R"(,"params":)";
  s->out += params;
  s->out += "}\n";
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
