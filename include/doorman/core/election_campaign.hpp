#pragma once

/// \file
/// A task's campaign for mastership through a lock service with leases (etcd), sans-I/O: the
/// whole sequence of rounds, renewals, claims, a standby's watch or polling, and the revocation
/// on a stop, as a machine that says what to do next and takes what happened. It reads no
/// clock and does no I/O: `etcd_election` (node/etcd_election.hpp) performs its actions on
/// etcd, and a simulation can perform them on a model of etcd.
///
///     doorman::election_campaign<clock::time_point> c({.advertise = "10.0.0.7:7700"}, ttl);
///     auto a = c.start(now);
///     for (;;) {
///       switch (a.what) {                               // perform it, then report:
///         case kind::grant: a = ok ? c.granted(now, id, ttl) : c.failed(now, why); break;
///         ...
///       }
///       publish(c.valid_until());                       // before any report
///       for (auto& r : c.take_reports()) tell(r);
///       for (auto& line : c.take_log()) log(line);
///     }
///
/// A round renews the lease (or asks for one) and claims the key (a put-if-absent attached to
/// the lease). The task whose lease holds the key is master, until its term ends
/// (`election_term`); the others learn the holder and redirect there. Between rounds a master
/// sleeps a period; a standby watches the key (or, when watching fails, reads it every
/// `standby_poll`) and begins a round at once when the key is freed or changes hands.

#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "doorman/core/election_term.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// What a campaign needs to know of its task.
struct election_campaign_options {
  std::string key = "/doorman/master";  ///< the election key
  std::string advertise;                ///< this task's address, the key's value when it wins
  bool watch = true;                    ///< a standby watches the key between rounds
  seconds standby_poll{0.25};           ///< else reads it this often (0: only the rounds)
  /// The TTL in whole seconds of the lease that holds a master's record (0: no record). A task
  /// that wins puts a key under `record_prefix()` attached to it, in the winning transaction,
  /// after counting the keys there: none means that no earlier master's record is alive, so no
  /// lease it granted can still be out (its grants end before its record does). The record
  /// lease is renewed with the election's, so it must outlast the term by the longest lease.
  std::int64_t record_ttl = 0;
};

/// The TTL of the record lease that covers leases of up to `cover` seconds under an election
/// of `ttl`: the term plus the longest lease, a tenth more for the clocks' rates, whole
/// seconds (0: no record).
[[nodiscard]] inline std::int64_t record_ttl_for(seconds cover, seconds ttl) noexcept {
  if (!(cover.count() > 0)) return 0;
  return static_cast<std::int64_t>(std::ceil(1.1 * (cover.count() + ttl.count()) - 1e-9)) + 1;
}

/// Where the masters' records of `key`'s election are kept: `key + "/leases/"`.
[[nodiscard]] inline std::string record_prefix(const std::string& key) {
  return key + "/leases/";
}

/// The election key's holder: its lease (0: the key is free) and value.
struct election_holder {
  std::int64_t lease = 0;
  std::string value;
};

/// Who is master, as the campaign learnt it.
struct mastership_change {
  bool is_master = false;
  std::optional<std::string> master;  ///< the holder's address, when another task holds it

  friend bool operator==(const mastership_change&, const mastership_change&) = default;
};

template <class TimePoint>
class election_campaign {
 public:
  using time_point = TimePoint;
  using duration = typename TimePoint::duration;

  /// What to do next. Calls to the lock service end by `until` at the latest (their deadline);
  /// `sleep` wakes at `until`; `watch` watches until `until`, for a change after `revision`.
  struct action {
    enum class kind {
      grant,       ///< ask for a lease of `ttl` (whole seconds) → `granted` or `failed`
      keep_alive,  ///< renew `lease` → `kept_alive` or `failed`
      claim,   ///< put-if-absent of the key, attached to `lease` → `claimed`, `claim_lease_gone`
      watch,   ///< watch the key from `revision` until `until` → `watched`
      read,    ///< read the key → `read_key`
      sleep,   ///< wake at `until` → `woke`
      revoke,  ///< revoke `lease` (a stop) → `revoked`
      done,    ///< the campaign is over
    };
    kind what = kind::done;
    time_point until{};
    std::int64_t lease = 0;
    std::int64_t revision = 0;
    /// keep_alive: renew this record lease too; claim: attach the record to it (0: none).
    std::int64_t record_lease = 0;
    /// grant, keep_alive: grant a record lease of this TTL too (0: none).
    std::int64_t record_ttl = 0;

    friend bool operator==(const action&, const action&) = default;
  };
  using kind = typename action::kind;

  /// What came of an action, for `resume`: what the lock service answered, or why the call
  /// failed. Each action reads its own fields.
  struct outcome {
    std::optional<std::string> error{};  ///< the call failed (a watch: it could not watch)
    std::int64_t lease = 0;              ///< grant: the lease granted
    std::int64_t ttl = 0;  ///< grant: its TTL in seconds; keep-alive: the seconds left (<= 0: gone)
    std::int64_t revision = 0;                ///< claim: the store's revision
    std::optional<election_holder> holder{};  ///< claim: the key's holder (none: our lease is gone)
    std::optional<std::string> value{};       ///< read: the key's value (none: the key is free)
    /// grant, keep_alive: the record lease granted or renewed, and its TTL (left).
    std::int64_t record_lease = 0;
    std::int64_t record_ttl = 0;
    /// claim with a record, the key created: how many records were alive before ours.
    std::optional<std::int64_t> records{};
  };

  election_campaign(election_campaign_options options, duration ttl)
      : options_(std::move(options)), term_(ttl) {}

  /// The record lease's TTL (`election_campaign_options::record_ttl`), before `start`.
  void set_record_ttl(std::int64_t ttl) noexcept { options_.record_ttl = ttl; }

  /// This task's address (the key's value when it wins), when it is known only at the start.
  void set_advertise(std::string advertise) { options_.advertise = std::move(advertise); }
  [[nodiscard]] const std::string& advertise() const noexcept { return options_.advertise; }

  /// Begins a round (also after the driver restarted: the lease and the term are kept).
  action start(time_point now) { return begin_round(now); }

  /// Action `done` came to `o`: the event it makes, and what to do next. A driver performs an
  /// action and hands its outcome here, so that what each answer means is said once.
  action resume(time_point now, kind done, const outcome& o) {
    switch (done) {
      case kind::grant:
        if (o.error) return failed(now, *o.error);
        if (auto why = take_record(o)) return failed(now, *why);
        return granted(now, o.lease, o.ttl);
      case kind::keep_alive:
        if (o.error) return failed(now, *o.error);
        if (o.ttl > 0 && record_lost(o)) {
          log("warning: etcd: our record's lease has expired; campaigning with new ones");
          lease_gone();
          return end_round(now, true);
        }
        if (auto why = take_record(o)) return failed(now, *why);
        return kept_alive(now, o.ttl);
      case kind::claim:
        if (o.error) return failed(now, *o.error);
        if (!o.holder) return claim_lease_gone(now);
        return claimed(now, o.revision, o.holder->lease, o.holder->value, o.records);
      case kind::watch:
        return watched(now, o.error);
      case kind::read:
        return read_key(now, !o.error, o.value);
      case kind::sleep:
        return woke(now);
      case kind::revoke:
        return revoked(now, o.error);
      case kind::done:
        break;
    }
    return finish();
  }

  /// The lease asked for: granted, with `ttl` seconds as the lock service granted it.
  action granted(time_point now, std::int64_t lease, std::int64_t ttl_seconds) {
    lease_ = lease;
    term_.set_ttl(std::chrono::duration_cast<duration>(std::chrono::seconds(ttl_seconds)));
    return claim(now);
  }

  /// The lease renewed: `ttl_left` seconds left on it (<= 0: it had expired).
  action kept_alive(time_point now, std::int64_t ttl_left) {
    if (ttl_left <= 0) {
      log("warning: etcd: our lease has expired; campaigning with a new one");
      lease_gone();
      return end_round(now, true);
    }
    if (is_master_) {
      term_.confirmed(sent_);  // our lease holds the key: the term runs on
      leases_out_ = true;      // and this master's own grants may be out
    }
    return claim(now);
  }

  /// The claim answered: the key's revision, and the lease and value of its holder (and with
  /// a record, when it created the key: how many records were alive before ours).
  action claimed(time_point now, std::int64_t revision, std::int64_t holder_lease,
                 const std::string& holder_value, std::optional<std::int64_t> records = {}) {
    if (!last_error_.empty()) {
      log("etcd: reachable again");
      last_error_.clear();
    }
    revision_ = revision;
    if (holder_lease == lease_) {
      // The key is held by our lease, granted or renewed by a message sent at `sent_`.
      term_.confirmed(sent_);
      // "No lease is out" holds at the winning claim only, and only when it created the key
      // and counted no record (an earlier claim of ours that created it, its answer lost, may
      // have counted some); from any later confirmation on, this master's own grants may be.
      leases_out_ = is_master_ || !(records && *records == 0);
      if (!is_master_) log(fmt::format("etcd: won the election on {}", options_.key));
      recorded_ = options_.record_ttl > 0;
      report(true, options_.advertise);
    } else {
      term_.lost();
      abandon_record();
      // A key left by an earlier run of this task (same address, older lease) names no one to
      // redirect to until it expires.
      std::optional<std::string> m;
      if (holder_value != options_.advertise) m = holder_value;
      if (is_master_ || m != master_) {
        log(fmt::format("etcd: {} holds {}", m.value_or("an earlier run of this task"),
                        options_.key));
      }
      report(false, std::move(m));
    }
    return end_round(now, true);
  }

  /// The claim found no lease: it expired between the renewal and the claim.
  action claim_lease_gone(time_point now) {
    lease_gone();
    return end_round(now, true);
  }

  /// A call of the round (grant, renewal, claim) failed: `why`.
  action failed(time_point now, const std::string& why) {
    const auto left = term_.valid(now) ? to_ms(term_.valid_until() - now) : -1;
    if (last_error_.empty()) {
      log(!is_master_ ? fmt::format("warning: etcd: unreachable ({}); retrying", why)
          : left > 0
              ? fmt::format(
                    "warning: etcd: renewal failed ({}); retrying, the term is safe for {} ms", why,
                    left)
              : fmt::format("warning: etcd: renewal failed ({}); the term is over, no decision "
                            "is made as master until a renewal succeeds",
                            why));
    }
    last_error_ = why;
    if (is_master_ && !term_.valid(now)) {
      log("warning: etcd: mastership could not be confirmed before the lease is at risk; "
          "stepping down");
      report(false, std::nullopt);
    }
    return end_round(now, false);
  }

  /// The standby's watch ended: a change, or the round's time (nothing), or it failed (`why`).
  action watched(time_point now, const std::optional<std::string>& why) {
    if (!why) {  // a change: a round now; none before the round: the round is due
      if (watch_failed_) log("etcd: watching " + options_.key + " again");
      watch_failed_ = false;
      return begin_round(now);
    }
    if (!watch_failed_) {
      log(fmt::format("warning: etcd: cannot watch {} ({}); reading it every {} s instead",
                      options_.key, *why, options_.standby_poll.count()));
      watch_failed_ = true;
    }
    return poll(now);
  }

  /// The standby's read of the key: its value (nothing: the key is free), or a failure (`ok`
  /// false). A free key or another holder than the one known begins a round; else it looks
  /// again.
  action read_key(time_point now, bool ok, const std::optional<std::string>& value) {
    if (!ok) return poll(now);
    if (!value) return begin_round(now);
    std::optional<std::string> holder;
    if (*value != options_.advertise) holder = *value;
    if (holder != master_) return begin_round(now);
    return poll(now);
  }

  /// A `sleep` ended.
  action woke(time_point now) {
    if (wake_ < next_round_) return read_at(now);  // a standby's look between two rounds
    return begin_round(now);
  }

  /// The task stops: mastership ends now; the lease, if any, is revoked so that another task
  /// takes over at once.
  action stop(time_point now) {
    stopping_ = true;
    term_.lost();
    if (lease_ == 0) return finish();
    return {kind::revoke, now + std::chrono::duration_cast<duration>(std::chrono::seconds(1)),
            lease_, 0};
  }

  /// The revocation answered (`why` it failed, or nothing).
  action revoked(time_point, const std::optional<std::string>& why) {
    log(!why ? std::string("etcd: lease revoked; another task can take over at once")
             : fmt::format("etcd: could not revoke the lease ({}); it expires by itself", *why));
    lease_ = 0;
    return finish();
  }

  /// Until when this task's mastership is certainly valid (publish it before any report).
  [[nodiscard]] time_point valid_until() const noexcept { return term_.valid_until(); }
  [[nodiscard]] bool is_master() const noexcept { return is_master_; }
  [[nodiscard]] const std::optional<std::string>& master() const noexcept { return master_; }
  [[nodiscard]] std::int64_t lease() const noexcept { return lease_; }
  [[nodiscard]] bool stopping() const noexcept { return stopping_; }
  /// Whether an earlier master's lease, or this one's own, may be out: false only from a
  /// winning claim that counted no record alive (`election_campaign_options::record_ttl`) to
  /// the next confirmation of the term, so that a master told of its win starts without
  /// learning mode, and one that steps down and comes back does not.
  [[nodiscard]] bool leases_may_be_out() const noexcept { return leases_out_; }
  /// The record lease held (0: none).
  [[nodiscard]] std::int64_t record_lease() const noexcept { return record_lease_; }

  /// The changes of mastership since the last call, oldest first (each one a change).
  [[nodiscard]] std::vector<mastership_change> take_reports() {
    return std::exchange(reports_, {});
  }
  /// The log lines since the last call, oldest first.
  [[nodiscard]] std::vector<std::string> take_log() { return std::exchange(log_, {}); }

 private:
  action begin_round(time_point now) {
    if (stopping_) return finish();
    sent_ = now;
    const auto deadline = term_.round_deadline(sent_, is_master_);
    const std::int64_t new_record = record_lease_ == 0 ? options_.record_ttl : 0;
    if (lease_ == 0) return {kind::grant, deadline, 0, 0, 0, options_.record_ttl};
    return {kind::keep_alive, deadline, lease_, 0, record_lease_, new_record};
  }

  action claim(time_point now) {
    return {kind::claim, term_.round_deadline(now, is_master_), lease_, 0, record_lease_, 0};
  }

  // A grant or keep-alive's record lease, when one was asked for: taken, or why not.
  std::optional<std::string> take_record(const outcome& o) {
    if (options_.record_ttl == 0 || record_lease_ != 0) return std::nullopt;
    if (o.record_lease == 0) return std::string("no record lease granted");
    if (o.record_ttl < options_.record_ttl) {
      return fmt::format("a record lease of {} s granted for {} s", o.record_ttl,
                         options_.record_ttl);
    }
    record_lease_ = o.record_lease;
    return std::nullopt;
  }

  // A keep-alive renewed our record lease and found it gone.
  [[nodiscard]] bool record_lost(const outcome& o) const noexcept {
    return options_.record_ttl > 0 && record_lease_ != 0 && o.record_ttl <= 0;
  }

  // Our record (if we won with one) is no longer renewed: it expires a record TTL after its
  // last renewal, after every lease we granted. A new record lease comes with the next round.
  void abandon_record() {
    if (!recorded_) return;
    recorded_ = false;
    record_lease_ = 0;
  }

  action end_round(time_point now, bool answered) {
    next_round_ = term_.next_round(now, answered);
    if (answered && !is_master_) {
      if (options_.watch && revision_ > 0) {
        return {kind::watch, next_round_, 0, revision_ + 1};
      }
      return poll(now);
    }
    wake_ = next_round_;
    return {kind::sleep, wake_, 0, 0};
  }

  // Between a standby's rounds, without a watch: sleep until the next look or the round.
  action poll(time_point now) {
    const auto every = to_duration<duration>(options_.standby_poll.count());
    wake_ = every > duration::zero() ? std::min(next_round_, now + every) : next_round_;
    return {kind::sleep, wake_, 0, 0};
  }

  action read_at(time_point now) {
    const auto every = to_duration<duration>(options_.standby_poll.count());
    return {kind::read, now + every, 0, 0};
  }

  action finish() { return {kind::done, {}, 0, 0}; }

  void lease_gone() {
    lease_ = 0;
    recorded_ = false;
    record_lease_ = 0;
    term_.lost();
    if (is_master_) report(false, std::nullopt);
  }

  void report(bool m, std::optional<std::string> where) {
    if (reported_ && m == is_master_ && where == master_) return;
    reported_ = true;
    is_master_ = m;
    master_ = std::move(where);
    reports_.push_back({is_master_, master_});
  }

  void log(std::string line) { log_.push_back(std::move(line)); }

  static long long to_ms(duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  }

  election_campaign_options options_;
  election_term<time_point> term_;
  time_point sent_{};        // when the round's first call was sent
  time_point next_round_{};  // when the next round begins
  time_point wake_{};        // when the sleep under way ends
  std::int64_t lease_ = 0;
  std::int64_t record_lease_ = 0;  // renewed with lease_; our record is attached when recorded_
  bool recorded_ = false;          // we won with a record: it holds our grants' end
  bool leases_out_ = true;         // when we last won, an earlier master's lease might be out
  std::int64_t revision_ = 0;      // of the last claim's answer: a standby watches after it
  bool is_master_ = false;
  std::optional<std::string> master_;
  bool reported_ = false;
  bool stopping_ = false;
  bool watch_failed_ = false;  // said once until a watch works again
  std::string last_error_;
  std::vector<mastership_change> reports_;
  std::vector<std::string> log_;
};

}  // namespace doorman
