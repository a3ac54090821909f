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
/// etcd's side, less a guard of `ttl / 10`: only then is mastership given up. So a master rides
/// out an etcd outage shorter than its TTL, and never keeps granting past the moment another
/// task could win. On a graceful stop the lease is revoked so that another task takes over at
/// once.
///
///     doorman::etcd_election election(io.get_executor(),
///                                     {.endpoints = {"127.0.0.1:2379"}, .key = "/doorman/root"});
///     doorman::basic_node<doorman::etcd_election> root(io.get_executor(), config, options,
///                                                      std::move(election));

#include <algorithm>
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

  /// No callback after it returns. The election then revokes its lease (within a second) and
  /// ends.
  /// Re-reads the TLS files of its etcd client (thread-safe); throws on a bad one.
  void reload_tls() { state_->etcd.reload_tls(); }

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
          options(std::move(o)) {}
    asio::strand<asio::any_io_executor> strand;
    net::etcd_client etcd;
    asio::steady_timer timer;
    etcd_election_options options;
    std::string advertise;
    std::mutex mutex;  // guards callback
    mastership_callback callback;
    bool stopping = false;

    // Only on the strand:
    std::int64_t lease = 0;
    clock::duration ttl{};
    clock::time_point confirmed{};  // when the last successful renewal was sent
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

    [[nodiscard]] clock::duration period() const {
      return std::max<clock::duration>(ttl / 5, std::chrono::milliseconds(50));
    }
    // Past this, the lease could have expired on etcd's side and another task could win.
    [[nodiscard]] clock::time_point at_risk() const {
      return confirmed + ttl - std::max<clock::duration>(ttl / 10, std::chrono::milliseconds(100));
    }
  };

  static asio::awaitable<void> run(std::shared_ptr<state> s) {
    s->ttl = to_duration<clock::duration>(s->options.ttl.count());
    while (!s->stopping) {
      const bool ok = co_await round(*s);
      if (s->stopping) break;
      s->timer.expires_after(ok ? s->period() : s->period() / 4);
      std::error_code ec;
      co_await s->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
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
    const auto deadline =
        s.is_master ? std::min(sent + s.period(), s.at_risk()) : sent + s.period();
    if (s.lease == 0) {
      const auto g = co_await s.etcd.grant(std::llround(s.options.ttl.count()), deadline);
      if (!g) co_return unreachable(s, g.message);
      s.lease = g.value.id;
      s.ttl = std::chrono::seconds(g.value.ttl);
      s.confirmed = sent;
    } else {
      const auto k = co_await s.etcd.keep_alive(s.lease, deadline);
      if (!k) co_return unreachable(s, k.message);
      if (k.value <= 0) {
        s.log("warning: etcd: our lease has expired; campaigning with a new one");
        s.lease = 0;
        if (s.is_master) s.report(false, std::nullopt);
        co_return true;
      }
      s.confirmed = sent;
    }
    if (s.stopping) co_return true;
    const auto c = co_await s.etcd.put_if_absent(s.options.key, s.advertise, s.lease,
                                                 std::min(clock::now() + s.period(), s.at_risk()));
    if (c.error == net::etcd_errc::not_found) {  // the lease expired between renewal and claim
      s.lease = 0;
      if (s.is_master) s.report(false, std::nullopt);
      co_return true;
    }
    if (!c) co_return unreachable(s, c.message);
    if (!s.last_error.empty()) {
      s.log("etcd: reachable again");
      s.last_error.clear();
    }
    const auto& holder = c.value.holder;
    if (holder.lease == s.lease) {
      if (!s.is_master) s.log(fmt::format("etcd: won the election on {}", s.options.key));
      s.report(true, s.advertise);
    } else {
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

  static bool unreachable(state& s, const std::string& why) {
    if (s.last_error.empty()) {
      s.log(s.is_master
                ? fmt::format(
                      "warning: etcd: renewal failed ({}); retrying, the lease is safe for {} ms",
                      why, to_ms(s.at_risk() - clock::now()))
                : fmt::format("warning: etcd: unreachable ({}); retrying", why));
    }
    s.last_error = why;
    if (s.is_master && clock::now() >= s.at_risk()) {
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
