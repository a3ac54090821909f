#pragma once

/// \file
/// The coroutines of etcd election, and what spawns them (declared in
/// <doorman/node/etcd_election.hpp>): included by that header when header-only, compiled once by
/// <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/node/etcd_election.hpp"

namespace doorman {

DOORMAN_DECL asio::awaitable<void> etcd_election::run(std::shared_ptr<state> s) {
  using kind = action::kind;
  auto& c = s->campaign;
  auto a = s->stopping ? c.stop(clock::now()) : c.start(clock::now());
  for (;;) {
    s->publish();
    if (a.what == kind::done) co_return;
    const bool waits = a.what == kind::watch || a.what == kind::read || a.what == kind::sleep;
    // Stopping: a wait ends without a word; a call to etcd is heard out (it may hold a lease to
    // revoke).
    if (s->stopping && waits && !c.stopping()) {
      a = c.stop(clock::now());
      continue;
    }
    a = co_await perform(*s, a);
    if (s->stopping && !c.stopping()) a = c.stop(clock::now());
  }
}

DOORMAN_DECL asio::awaitable<etcd_election::action> etcd_election::perform(state& s,
                                                                           const action& a) {
  using kind = action::kind;
  auto& c = s.campaign;
  election_campaign<clock::time_point>::outcome o;
  const auto ok = [&o](const auto& r) {  // a failed call's message becomes the outcome's error
    if (!r) o.error = r.message;
    return static_cast<bool>(r);
  };
  switch (a.what) {
    case kind::grant: {
      const auto g = co_await s.etcd.grant(std::llround(s.options.ttl.count()), a.until);
      if (ok(g)) {
        o.lease = g.value.id;
        o.ttl = g.value.ttl;
        co_await renew_record(s, a, o);
      }
      break;
    }
    case kind::keep_alive: {
      const auto k = co_await s.etcd.keep_alive(a.lease, a.until);
      if (ok(k)) {
        o.ttl = k.value;
        if (o.ttl > 0) co_await renew_record(s, a, o);
      }
      break;
    }
    case kind::claim:
      co_await claim(s, a, o);
      break;
    case kind::watch: {
      const auto w = co_await s.etcd.watch(s.options.key, a.revision, a.until,
                                           [&s](std::function<void()> end) { s.end_watch = end; });
      s.end_watch = nullptr;
      ok(w);
      break;
    }
    case kind::read: {
      const auto g = co_await s.etcd.get(s.options.key, a.until);
      if (ok(g) && g.value) o.value = g.value->value;
      break;
    }
    case kind::sleep:
      s.timer.expires_at(a.until);
      co_await net::wait_on(s.timer);
      break;
    case kind::revoke: {
      const auto r = co_await s.etcd.revoke(a.lease, a.until);
      ok(r);
      break;
    }
    case kind::done:
      co_return a;
  }
  co_return c.resume(clock::now(), a.what, o);
}

DOORMAN_DECL asio::awaitable<void> etcd_election::claim(state& s, const action& a, outcome& o) {
  net::etcd_result<net::etcd_claim> r;
  if (a.record_lease == 0) {
    r = co_await s.etcd.put_if_absent(s.options.key, s.campaign.advertise(), a.lease, a.until);
  } else {
    net::etcd_record record;
    record.prefix = record_prefix(s.options.key);
    record.key = fmt::format("{}{:016x}", record.prefix, a.record_lease);
    record.lease = a.record_lease;
    r = co_await s.etcd.put_if_absent(s.options.key, s.campaign.advertise(), a.lease, record,
                                      a.until);
  }
  if (r) {
    o.revision = r.value.revision;
    o.holder = election_holder{r.value.holder.lease, r.value.holder.value};
    o.records = r.value.records;
  } else if (r.error != net::etcd_errc::not_found) {  // not found: a lease is gone
    o.error = r.message;
  }
}

DOORMAN_DECL asio::awaitable<void> etcd_election::renew_record(state& s, const action& a,
                                                               outcome& o) {
  if (a.record_lease != 0) {
    const auto k = co_await s.etcd.keep_alive(a.record_lease, a.until);
    if (!k) {
      o.error = k.message;
    } else {
      o.record_lease = a.record_lease;
      o.record_ttl = k.value;
    }
  } else if (a.record_ttl > 0) {
    const auto g = co_await s.etcd.grant(a.record_ttl, a.until);
    if (!g) {
      o.error = g.message;
    } else {
      o.record_lease = g.value.id;
      o.record_ttl = g.value.ttl;
    }
  }
}

DOORMAN_DECL void etcd_election::start(std::string advertise, mastership_callback cb) {
  state_->campaign.set_advertise(std::move(advertise));
  {
    std::lock_guard lock(state_->mutex);
    state_->callback = std::move(cb);
  }
  auto s = state_;
  asio::co_spawn(state_->strand,
                 net::supervised(
                     "etcd election", [s] { return run(s); }, [s] { return s->stopping; },
                     [s](std::string_view line) { s->log(line); }),
                 asio::detached);
}

}  // namespace doorman
