#pragma once

/// \file
/// The coroutines of etcd election, and what spawns them (declared in
/// <doorman/node/etcd_election.hpp>): included by that header when header-only, compiled once by
/// <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/node/etcd_election.hpp"

namespace doorman {

DOORMAN_DECL asio::awaitable<void> etcd_election::run(std::shared_ptr<state> s) {
  while (!s->stopping) {
    const bool ok = co_await round(*s);
    if (s->stopping) break;
    const auto next = s->term.next_round(clock::now(), ok);
    if (ok && !s->is_master) {
      co_await look_until(*s, next);
    } else {
      s->timer.expires_at(next);
      std::error_code ec;
      co_await s->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }
  s->lost();
  if (s->lease != 0) {
    const auto r = co_await s->etcd.revoke(s->lease, clock::now() + std::chrono::seconds(1));
    s->log(
        r ? "etcd: lease revoked; another task can take over at once"
          : fmt::format("etcd: could not revoke the lease ({}); it expires by itself", r.message));
  }
}

DOORMAN_DECL asio::awaitable<void> etcd_election::look_until(state& s, clock::time_point next) {
  if (s.options.watch && s.revision > 0) {
    const auto w = co_await s.etcd.watch(s.options.key, s.revision + 1, next,
                                         [&s](std::function<void()> end) { s.end_watch = end; });
    s.end_watch = nullptr;
    if (w) {  // a change: a round now; none before `next`: the round is due
      if (s.watch_failed) s.log("etcd: watching " + s.options.key + " again");
      s.watch_failed = false;
      co_return;
    }
    if (s.stopping) co_return;
    if (!s.watch_failed) {
      s.log(fmt::format("warning: etcd: cannot watch {} ({}); reading it every {} s instead",
                        s.options.key, w.message, s.options.standby_poll.count()));
      s.watch_failed = true;
    }
  }
  const auto poll = to_duration<clock::duration>(s.options.standby_poll.count());
  while (!s.stopping) {
    const auto now = clock::now();
    const auto at = poll > clock::duration::zero() ? std::min(next, now + poll) : next;
    s.timer.expires_at(at);
    std::error_code ec;
    co_await s.timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (s.stopping || at >= next) co_return;
    // A free key: campaign now. Another holder than the one known: a round now, to redirect
    // to it. An error or the same holder: look again (the rounds go on).
    const auto g = co_await s.etcd.get(s.options.key, clock::now() + poll);
    if (!g) continue;
    if (!g.value) co_return;
    std::optional<std::string> holder;
    if (g.value->value != s.advertise) holder = g.value->value;
    if (holder != s.master) co_return;
  }
}

DOORMAN_DECL asio::awaitable<bool> etcd_election::round(state& s) {
  const auto sent = clock::now();
  const auto deadline = s.term.round_deadline(sent, s.is_master);
  if (s.lease == 0) {
    const auto g = co_await s.etcd.grant(std::llround(s.options.ttl.count()), deadline);
    if (!g) co_return unreachable(s, g.message);
    s.lease = g.value.id;
    s.term.set_ttl(std::chrono::seconds(g.value.ttl));
  } else {
    const auto k = co_await s.etcd.keep_alive(s.lease, deadline);
    if (!k) co_return unreachable(s, k.message);
    if (k.value <= 0) {
      s.log("warning: etcd: our lease has expired; campaigning with a new one");
      lease_gone(s);
      co_return true;
    }
    if (s.is_master) s.confirmed(sent);  // our lease holds the key: the term runs on
  }
  if (s.stopping) co_return true;
  const auto c = co_await s.etcd.put_if_absent(s.options.key, s.advertise, s.lease,
                                               s.term.round_deadline(clock::now(), s.is_master));
  if (c.error == net::etcd_errc::not_found) {  // the lease expired between renewal and claim
    lease_gone(s);
    co_return true;
  }
  if (!c) co_return unreachable(s, c.message);
  if (!s.last_error.empty()) {
    s.log("etcd: reachable again");
    s.last_error.clear();
  }
  s.revision = c.value.revision;
  const auto& holder = c.value.holder;
  if (holder.lease == s.lease) {
    // The key is held by our lease, granted or renewed by a message sent at `sent`.
    s.confirmed(sent);
    if (!s.is_master) s.log(fmt::format("etcd: won the election on {}", s.options.key));
    s.report(true, s.advertise);
  } else {
    s.lost();
    // A key left by an earlier run of this task (same address, older lease) names no one
    // to redirect to until it expires.
    std::optional<std::string> m;
    if (holder.value != s.advertise) m = holder.value;
    if (s.is_master || m != s.master) {
      s.log(fmt::format("etcd: {} holds {}", m.value_or("an earlier run of this task"),
                        s.options.key));
    }
    s.report(false, std::move(m));
  }
  co_return true;
}
DOORMAN_DECL void etcd_election::start(std::string advertise, mastership_callback cb) {
  state_->advertise = std::move(advertise);
  {
    std::lock_guard lock(state_->mutex);
    state_->callback = std::move(cb);
  }
  auto s = state_;
  asio::co_spawn(state_->strand,
                 net::supervised(
                     "etcd election", [s] { return run(s); }, [s] { return s->stopping; },
                     [s](std::string_view line) { s->log(std::string(line)); }),
                 asio::detached);
}

}  // namespace doorman
