#pragma once

/// \file
/// Master election through etcd (docs/high-availability.md): every task of a tree position holds an
/// etcd lease and tries to create the election key with its advertised address, attached to that
/// lease (put-if-absent, one transaction on `create_revision == 0`). The task whose lease holds the
/// key is master; the others read the key's value and redirect there. Each task renews its
/// lease and polls the key every `ttl / 5`, so a dead master's key vanishes within the TTL and
/// another task takes it at its next poll.
///
/// A renewal that fails is retried (other endpoints too) until the lease could have expired on
/// etcd's side, less a margin of `ttl / 10`: only then is mastership given up. So a master rides
/// out an etcd outage shorter than its TTL. The same instant, `valid_until()` (from
/// `election_term`), fences the node's every decision, so a master never grants past the moment
/// another task could win, even when it was paused and has not yet heard that its lease is
/// gone. On a graceful stop the lease is revoked so that another task takes over at once.
///
///     doorman::etcd_election election(io.get_executor(),
///                                     {.endpoints = {"127.0.0.1:2379"}, .key = "/doorman/root"});
///     doorman::basic_node<doorman::etcd_election> root(io.get_executor(), config, options,
///                                                      std::move(election));

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>

#include "doorman/core/election_term.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/etcd.hpp"
#include "doorman/net/supervise.hpp"
#include "doorman/node/election.hpp"

namespace doorman {

/// Options of an etcd election, with their defaults.
struct etcd_election_options {
  std::vector<std::string> endpoints;   ///< `host:port` of the etcd members
  std::string key = "/doorman/master";  ///< one key per tree position
  seconds ttl{10};  ///< the lease's TTL (whole seconds; etcd's minimum is about 2)
  /// One line per notable event (won, lost, master changed, etcd unreachable). Null: silent.
  std::function<void(std::string_view)> log{};
  /// CA and client certificate for `https://` endpoints (docs/security.md).
  net::tls_options tls{};
};

class etcd_election {
 public:
  using clock = std::chrono::steady_clock;

  /// Throws `std::invalid_argument` on a malformed endpoint, no endpoint, an empty key or a
  /// TTL below 1 s.
  etcd_election(asio::any_io_executor executor, etcd_election_options options)
      : state_(std::make_shared<state>(std::move(executor), std::move(options))) {
    if (state_->options.key.empty()) throw std::invalid_argument("election key: empty");
    if (!(state_->options.ttl.count() >= 1)) {
      throw std::invalid_argument("election TTL: at least 1 s");
    }
  }

  void start(std::string advertise, mastership_callback cb) {
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

  /// Re-reads the TLS files of its etcd client (thread-safe); throws on a bad one.
  void reload_tls() { state_->etcd.reload_tls(); }

  /// Until when this task's mastership is certainly valid (thread-safe): the end of its term,
  /// `clock::time_point::min()` when it holds none. The node fences every decision with it.
  [[nodiscard]] clock::time_point valid_until() const noexcept {
    return clock::time_point(clock::duration(state_->valid_until.load(std::memory_order_acquire)));
  }

  /// No callback after it returns. The election then revokes its lease (within a second) and
  /// ends.
  void stop() {
    {
      std::lock_guard lock(state_->mutex);
      state_->callback = nullptr;
    }
    asio::post(state_->strand, [s = state_] {
      s->stopping = true;
      s->timer.cancel();
    });
  }

 private:
  struct state {
    state(asio::any_io_executor ex, etcd_election_options o)
        : strand(asio::make_strand(ex)),
          etcd(strand, o.endpoints, o.tls),
          timer(strand),
          options(std::move(o)),
          term(to_duration<clock::duration>(options.ttl.count())) {}
    asio::strand<asio::any_io_executor> strand;
    net::etcd_client etcd;
    asio::steady_timer timer;
    etcd_election_options options;
    std::string advertise;
    std::mutex mutex;  // guards callback
    mastership_callback callback;
    bool stopping = false;
    // The term's end, read by the node's strand (nanoseconds of clock::duration).
    std::atomic<clock::rep> valid_until{clock::time_point::min().time_since_epoch().count()};

    // Only on the strand:
    std::int64_t lease = 0;
    election_term<clock::time_point> term;
    bool is_master = false;
    std::optional<std::string> master;
    bool reported = false;
    std::string last_error;

    void log(const std::string& s) const {
      if (options.log) options.log(s);
    }

    void report(bool m, std::optional<std::string> where) {
      if (reported && m == is_master && where == master) return;
      reported = true;
      is_master = m;
      master = std::move(where);
      std::lock_guard lock(mutex);
      if (callback) callback(is_master, master);
    }

    // The term's news, published to the node before any report that depends on it.
    void confirmed(clock::time_point sent) {
      term.confirmed(sent);
      publish();
    }
    void lost() {
      term.lost();
      publish();
    }
    void publish() {
      valid_until.store(term.valid_until().time_since_epoch().count(), std::memory_order_release);
    }
  };

  static asio::awaitable<void> run(std::shared_ptr<state> s) {
    while (!s->stopping) {
      const bool ok = co_await round(*s);
      if (s->stopping) break;
      s->timer.expires_at(s->term.next_round(clock::now(), ok));
      std::error_code ec;
      co_await s->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    s->lost();
    if (s->lease != 0) {
      const auto r = co_await s->etcd.revoke(s->lease, clock::now() + std::chrono::seconds(1));
      s->log(r ? "etcd: lease revoked; another task can take over at once"
               : fmt::format("etcd: could not revoke the lease ({}); it expires by itself",
                             r.message));
    }
  }

  // One renewal and one claim. False when etcd could not be reached (retry soon).
  static asio::awaitable<bool> round(state& s) {
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

  static void lease_gone(state& s) {
    s.lease = 0;
    s.lost();
    if (s.is_master) s.report(false, std::nullopt);
  }

  static bool unreachable(state& s, const std::string& why) {
    const auto now = clock::now();
    const auto left = s.term.valid(now) ? to_ms(s.term.valid_until() - now) : -1;
    if (s.last_error.empty()) {
      s.log(!s.is_master ? fmt::format("warning: etcd: unreachable ({}); retrying", why)
            : left > 0
                ? fmt::format(
                      "warning: etcd: renewal failed ({}); retrying, the term is safe for {} ms",
                      why, left)
                : fmt::format("warning: etcd: renewal failed ({}); the term is over, no decision "
                              "is made as master until a renewal succeeds",
                              why));
    }
    s.last_error = why;
    if (s.is_master && !s.term.valid(now)) {
      s.log(
          "warning: etcd: mastership could not be confirmed before the lease is at risk; stepping "
          "down");
      s.report(false, std::nullopt);
    }
    return false;
  }

  static long long to_ms(clock::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  }

  std::shared_ptr<state> state_;
};

static_assert(election<etcd_election>);

}  // namespace doorman
