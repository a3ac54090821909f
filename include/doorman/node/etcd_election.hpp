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
/// With `record_cover` (a node sets it to its longest lease), every master also keeps a record,
/// `key + "/leases/<lease>"`, on a second lease that outlives its term by that much: a task
/// that wins where no record is alive knows that no earlier master's lease is out and skips
/// learning mode (`leases_may_be_out`; docs/high-availability.md, "The first minute").
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

#include "doorman/core/election_campaign.hpp"
#include "doorman/core/election_term.hpp"
#include "doorman/core/linkage.hpp"
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
  /// Whether a task that is not master watches the key between its renewal rounds, to
  /// campaign as soon as it is free (and to redirect to a new master as soon as one holds it):
  /// a master that stops revokes its lease, which deletes the key, and a standby takes over
  /// within a few round trips instead of a round period (ttl / 5).
  bool watch = true;
  /// Without a watch (off, or failing), how often a standby reads the key between its rounds
  /// instead, to the same end. At most the round period; 0: only the rounds.
  seconds standby_poll{0.25};
  /// One line per notable event (won, lost, master changed, etcd unreachable). Null: silent.
  std::function<void(std::string_view)> log{};
  /// CA and client certificate for `https://` endpoints (docs/security.md).
  net::tls_options tls{};
  /// The longest lease the node grants, in seconds (0: no record). A master then keeps a
  /// record in etcd that outlives every lease it granted, and a task that wins where no
  /// earlier master's record is alive knows that no lease is out: it grants at once, without
  /// learning mode (`leases_may_be_out`; docs/high-availability.md, "The first minute").
  seconds record_cover{0};
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

  DOORMAN_DECL void start(std::string advertise, mastership_callback cb);

  /// Re-reads the TLS files of its etcd client (thread-safe); throws on a bad one.
  void reload_tls() { state_->etcd.reload_tls(); }

  /// Until when this task's mastership is certainly valid (thread-safe): the end of its term,
  /// `clock::time_point::min()` when it holds none. The node fences every decision with it.
  [[nodiscard]] clock::time_point valid_until() const noexcept {
    return clock::time_point(clock::duration(state_->valid_until.load(std::memory_order_acquire)));
  }

  /// Whether a lease may be out that this task, told it won, must learn (thread-safe; read
  /// when told that this task is master). False only with a record
  /// (`etcd_election_options::record_cover`), none alive at the winning claim, and no renewal
  /// since (`election_campaign::leases_may_be_out`).
  [[nodiscard]] bool leases_may_be_out() const noexcept {
    return state_->leases_out.load(std::memory_order_acquire);
  }

  /// The longest lease the record covers (`etcd_election_options::record_cover`; 0: none).
  [[nodiscard]] seconds record_cover() const noexcept { return state_->options.record_cover; }

  /// Sets `etcd_election_options::record_cover` (before `start`): a node sets it to the
  /// longest lease of its configuration.
  void set_record_cover(seconds cover) {
    state_->options.record_cover = cover;
    state_->campaign.set_record_ttl(record_ttl_for(cover, state_->options.ttl));
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
      if (s->end_watch) s->end_watch();
    });
  }

 private:
  struct state {
    state(asio::any_io_executor ex, etcd_election_options o)
        : strand(asio::make_strand(ex)),
          etcd(strand, o.endpoints, o.tls),
          timer(strand),
          options(std::move(o)),
          campaign({.key = options.key,
                    .advertise = {},
                    .watch = options.watch,
                    .standby_poll = options.standby_poll,
                    .record_ttl = record_ttl_for(options.record_cover, options.ttl)},
                   to_duration<clock::duration>(options.ttl.count())) {}
    asio::strand<asio::any_io_executor> strand;
    net::etcd_client etcd;
    asio::steady_timer timer;
    etcd_election_options options;
    std::mutex mutex;  // guards callback
    mastership_callback callback;
    bool stopping = false;
    // The term's end, read by the node's strand (nanoseconds of clock::duration).
    std::atomic<clock::rep> valid_until{clock::time_point::min().time_since_epoch().count()};
    std::atomic<bool> leases_out{true};  // the campaign's leases_may_be_out()

    // Only on the strand:
    election_campaign<clock::time_point> campaign;  // every decision of the campaign
    std::function<void()> end_watch;                // ends the standby's watch in progress

    // What the campaign learnt, passed on: the term's end first (the node fences with it),
    // then the changes of mastership, then the log lines.
    void publish() {
      valid_until.store(campaign.valid_until().time_since_epoch().count(),
                        std::memory_order_release);
      leases_out.store(campaign.leases_may_be_out(), std::memory_order_release);
      for (auto& r : campaign.take_reports()) {
        std::lock_guard lock(mutex);
        if (callback) callback(r.is_master, std::move(r.master));
      }
      for (const auto& line : campaign.take_log())
        log(line);
    }
    void log(std::string_view line) const {
      if (options.log) options.log(line);
    }
  };

  using action = election_campaign<clock::time_point>::action;
  using outcome = election_campaign<clock::time_point>::outcome;

  // The claim (with the record, when the action carries its lease), into `o`.
  static DOORMAN_DECL asio::awaitable<void> claim(state& s, const action& a, outcome& o);

  // With a record: renews the record lease with the election's, or grants one (`o`'s record
  // fields; a failure is the outcome's error).
  static DOORMAN_DECL asio::awaitable<void> renew_record(state& s, const action& a, outcome& o);

  // Performs the campaign's actions on etcd until it is done.
  static DOORMAN_DECL asio::awaitable<void> run(std::shared_ptr<state> s);

  // Performs one action; what happened, as the campaign's next action.
  static DOORMAN_DECL asio::awaitable<action> perform(state& s, const action& a);

  std::shared_ptr<state> state_;
};

static_assert(election<etcd_election>);

}  // namespace doorman

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/node/impl/etcd_election.ipp"
#endif
