#pragma once

/// \file
/// A node's mastership, on its strand: what the election last reported, the term that fences
/// every answer (docs/high-availability.md), and the master each door names. `basic_node`
/// hands it what the election reports and runs `apply_term` before every call and `fence`
/// after; every door's answer names the master through `name_master`, the same way for each.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "doorman/core/log_throttle.hpp"
#include "doorman/core/time.hpp"
#include "doorman/node/admin.hpp"
#include "doorman/node/election.hpp"
#include "doorman/node/state_file.hpp"
#include "doorman/protocol/service.hpp"

namespace doorman {

template <class Engine, class Election>
class node_mastership {
 public:
  using clock = std::chrono::steady_clock;

  /// Mastership of engine `eng` as election `elect` decides it, counted in `metrics`, logged to
  /// `log` (null: silent).
  node_mastership(Engine& eng, const Election& elect, node_metrics& metrics,
                  std::function<void(std::string_view)> log)
      : engine_(eng), election_(elect), metrics_(metrics), log_(std::move(log)) {}

  /// This task's doors, as it announces them (set once the node is bound; the gRPC one may
  /// come later).
  [[nodiscard]] const advertised_doors& own() const noexcept { return own_; }
  void set_own(advertised_doors doors) { own_ = std::move(doors); }

  /// Keeps the leases' end and the budgets' marks in `file` (a task without an election in
  /// etcd; docs/operations.md, "The state file"): its term lasts only as far as the file says
  /// no lease outlives. Before `start`; the file must outlive the node.
  void use_state(state_file* file) noexcept { state_ = file; }

  /// The election reported at `now` whether this task is master, and what the master announced
  /// (none: unknown).
  void elected(bool is_master, const std::optional<std::string>& announced, clock::time_point now) {
    elected_ = is_master;
    const bool changed = is_master != engine_.mastership().is_master;
    master_ = announced ? advertised_doors::parse(*announced) : advertised_doors{};
    const double learning = longest_learning(engine_.config());
    // A state file that shows every lease this task granted has ended, or an election that
    // found no earlier master's record alive when this task won: no learning mode.
    const bool none_out =
        is_master && ((state_ != nullptr && !outstanding_at_start()) || !election_leases_out());
    engine_.set_mastership(
        is_master, door_address(master_, rpc_door::json_rpc), now,
        none_out ? to_duration<clock::duration>(learning + 1) : clock::duration{});
    apply_term(now);
    if (!changed || engine_.mastership().is_master != is_master) return;
    ++metrics_.master_changes;
    if (!is_master) {
      log(fmt::format("not master; redirecting to {}",
                      engine_.mastership().master.value_or("(unknown)")));
      return;
    }
    if (none_out && learning > 0) {
      log(state_ != nullptr
              ? fmt::format("became master; no lease outstanding (state file {}): learning mode "
                            "is off",
                            state_->path())
              : std::string("became master; no earlier master's record is alive in etcd, so no "
                            "lease is outstanding: learning mode is off"));
    } else {
      log(learning > 0 ? fmt::format("became master; learning mode starts (up to {} s)", learning)
                       : std::string("became master; learning mode is off"));
    }
  }

  /// Fencing: the engine answers as master only inside the election's term (an election with
  /// terms has `valid_until()`). A master whose term ended steps down at its next call; it
  /// takes mastership back (learning mode again: it forgot its leases) once a renewal extends
  /// the term while the election still names it.
  void apply_term(clock::time_point now) {
    if constexpr (requires { election_.valid_until(); }) {
      const auto until = election_.valid_until();
      engine_.set_valid_until(until);
      if (elected_ && !engine_.mastership().is_master && now < until) {
        engine_.set_mastership(true, own_.json_rpc, now);
        log("mastership confirmed again after the term ended; learning mode starts");
      }
    }
    if (state_ != nullptr) keep_state_ahead(now);
    fence(now);
  }

  /// Counts and logs every step-down at a term's end, the engine's own fences included.
  void fence(clock::time_point now) {
    engine_.fence(now);
    if (engine_.fenced() == fenced_seen_) return;
    fenced_seen_ = engine_.fenced();
    ++metrics_.fenced;
    ++metrics_.master_changes;
    if (state_ != nullptr && !(now < state_until_ - lease_span())) {
      log(
          fmt::format("warning: what state file {} covers has run out (its writes failed); "
                      "stepping down before answering anything more",
                      state_->path()));
      return;
    }
    log("warning: the election term ended before a renewal was confirmed (was the process "
        "paused?); stepping down before answering anything more");
  }

  /// An answer through `door` names the master's address at that door (nothing when the
  /// master has none there or is unknown, or the term ended): a client connects to the
  /// address it is given.
  template <class Result>
  void name_master(Result& result, rpc_door door) const {
    if constexpr (requires { result.value().mastership; }) {
      if (!result) return;
      auto& m = result.value().mastership;
      if (m.is_master) {
        m.master = door_address(own_, door);
      } else if (m.master) {  // a fenced engine knows no master: it names none
        m.master = door_address(master_, door);
      }
    }
  }

 private:
  [[nodiscard]] static std::optional<std::string> door_address(const advertised_doors& doors,
                                                               rpc_door door) {
    const std::string& a = door == rpc_door::grpc ? doors.grpc : doors.json_rpc;
    return a.empty() ? std::nullopt : std::optional(a);
  }

  void log(const std::string& s) const {
    if (log_) log_(s);
  }

  // Whether the election says that an earlier master's lease may be out (always, unless it
  // keeps records: `etcd_election::leases_may_be_out`).
  [[nodiscard]] bool election_leases_out() const {
    if constexpr (requires { election_.leases_may_be_out(); }) {
      return election_.leases_may_be_out();
    } else {
      return true;
    }
  }

  // Whether a lease this task granted before it started may still be out: the file says so.
  [[nodiscard]] bool outstanding_at_start() const {
    return !state_->fresh() && state_->state().leases_until > unix_seconds_now();
  }

  // The term a state file gives: grants only while each ends before what the file says (its
  // `leases_until` less the longest lease). With less than a lease length of it left, the file
  // is written three lease lengths ahead first; when that fails, the term runs out and the
  // engine steps down until a write succeeds (then learning mode again, as after a lost term).
  // The longest lease a template grants (at least 1 s), in seconds and as a duration.
  [[nodiscard]] double lease_seconds() const { return longest_lease(engine_.config()); }
  [[nodiscard]] clock::duration lease_span() const {
    return to_duration<clock::duration>(lease_seconds());
  }

  void keep_state_ahead(clock::time_point now) {
    const double lease = lease_seconds();
    const auto span = to_duration<clock::duration>(lease);
    if (!(state_until_ - span > now + span)) {
      std::string error;
      if (state_->write_leases_until(unix_seconds_now() + 3 * lease, error)) {
        state_until_ = now + 3 * span;
      } else {
        state_log_.log(log_,
                       fmt::format("warning: state file {}: {}; granting stops when its term "
                                   "ends",
                                   state_->path(), error),
                       now);
      }
    }
    const auto term = state_until_ - span;
    engine_.set_valid_until(term);
    if (elected_ && !engine_.mastership().is_master && now < term) {
      engine_.set_mastership(true, own_.json_rpc, now);
      log("state file written again after the term ended; learning mode starts");
    }
  }

  Engine& engine_;
  const Election& election_;
  node_metrics& metrics_;
  std::function<void(std::string_view)> log_;
  advertised_doors own_;           // this task's, as announced
  advertised_doors master_;        // the master's, as it announced them (empty: unknown)
  bool elected_ = false;           // what the election last reported
  std::uint64_t fenced_seen_ = 0;  // engine_.fenced() already counted
  state_file* state_ = nullptr;    // a task without an election in etcd may keep one
  clock::time_point state_until_{clock::duration::min() / 2};  // no lease outlives it
  log_throttle<clock::time_point> state_log_{seconds(10)};
};

}  // namespace doorman
