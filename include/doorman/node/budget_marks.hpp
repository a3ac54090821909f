#pragma once

/// \file
/// Budget marks in etcd (docs/budgets.md, "When every root is lost"): a root that keeps them
/// (`engine_options::budget_mark_step`) stores, per budget resource, the most that may have
/// been spent and allotted in its window, a step ahead of what is; a new master starts its
/// count from it. This keeper performs the engine's mark tasks (`basic_engine::
/// budget_mark_tasks`) on etcd, on the node's strand: a read per window and term, and raises
/// written only over the revision it last saw (a write of a root that lost its place cannot
/// lower a later master's mark).
///
/// A mark is the key `prefix + resource id`, holding `{"window": <start>, "mark": <units>}`.
/// While etcd cannot be reached, nothing more of a budget is allotted past its last mark.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "doorman/core/log_throttle.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/etcd.hpp"
#include "doorman/net/supervise.hpp"
#include "doorman/node/state_file.hpp"

namespace doorman {

/// Where a root keeps its budget marks.
struct budget_mark_options {
  std::vector<std::string> etcd_endpoints;  ///< `host:port` of the etcd members
  net::tls_options etcd_tls{};              ///< for `https://` endpoints
  std::string prefix;                       ///< key prefix; empty: no marks are kept
  seconds timeout{2};                       ///< deadline of one read or write
};

/// Reads and raises a root's budget marks in etcd, or in a state file (`state_file.hpp`) for a
/// root without an election in etcd.
template <class Engine>
class basic_budget_keeper {
 public:
  using clock = std::chrono::steady_clock;
  using task = typename Engine::budget_mark_task;

  /// Marks in etcd as `options` say, or (`file` not null: the node's) in `file`.
  basic_budget_keeper(const asio::any_io_executor& strand, Engine& target,
                      budget_mark_options options, std::function<void(std::string_view)> log,
                      state_file* file = nullptr)
      : strand_(strand),
        engine_(target),
        options_(std::move(options)),
        log_(std::move(log)),
        backoff_(strand),
        file_(file) {
    if (!options_.prefix.empty())
      etcd_.emplace(strand_, options_.etcd_endpoints, options_.etcd_tls);  // throws
  }

  basic_budget_keeper(const basic_budget_keeper&) = delete;
  basic_budget_keeper& operator=(const basic_budget_keeper&) = delete;

  [[nodiscard]] bool active() const noexcept { return !options_.prefix.empty() || file_; }

  /// After calls (on the strand): performs the marks that came due, unless already at it.
  void after_calls() {
    if (!active() || running_ || stopping_ || !engine_.budget_marks_due()) return;
    running_ = true;
    asio::co_spawn(
        strand_,
        net::supervised(
            "budget marks", [this] { return run(); }, [this] { return stopping_; }, log_),
        asio::detached);
  }

  void stop() {
    stopping_ = true;
    backoff_.cancel();
  }

 private:
  // Until nothing is due: each task on etcd, in turn; after a failure, a pause (0.25 s,
  // doubling up to 4 s) before the next round.
  asio::awaitable<void> run() {
    while (!stopping_ && engine_.budget_marks_due()) {
      if (failures_ > 0) {
        backoff_.expires_after(to_duration<clock::duration>(
            std::min(4.0, 0.25 * std::pow(2.0, std::min(failures_, 5) - 1))));
        std::error_code ec;
        co_await backoff_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        if (stopping_) break;
      }
      for (const auto& t : engine_.budget_mark_tasks(clock::now())) {
        const auto mark = co_await perform(t);
        failures_ = mark ? 0 : failures_ + 1;
        engine_.budget_mark_done(t, mark, clock::now());
      }
    }
    running_ = false;
  }

  // One task: what the key holds for its window now, or nothing when that is not known.
  asio::awaitable<std::optional<double>> perform(const task& t) {
    if (file_ != nullptr) co_return perform_in_file(t);
    const std::string key = options_.prefix + t.resource_id;
    const auto deadline = clock::now() + to_duration<clock::duration>(options_.timeout.count());
    if (!t.raise) {
      auto r = co_await etcd_->get(key, deadline);
      if (!r) co_return failed(key, r.message);
      revisions_[t.resource_id] = r.value ? r.value->mod_revision : 0;
      if (!r.value) co_return 0.0;
      auto stored = read_budget_mark(r.value->value);
      if (const auto* why = std::get_if<std::string>(&stored)) {
        co_return failed(key, fmt::format("a value that is not a mark ({})", *why));
      }
      const auto& m = std::get<stored_budget_mark>(stored);
      co_return m.window == t.window ? m.mark : 0.0;
    }
    const std::string value = nlohmann::json{{"window", t.window}, {"mark", *t.raise}}.dump();
    auto r = co_await etcd_->put_if_revision(key, value, revisions_[t.resource_id], deadline);
    if (!r) co_return failed(key, r.message);
    revisions_[t.resource_id] = r.value.created ? r.value.revision : r.value.holder.mod_revision;
    if (!r.value.created) co_return failed(key, "changed by another writer; writing again");
    co_return *t.raise;
  }

  // One task on the state file, at once (a local file's write is a few milliseconds).
  std::optional<double> perform_in_file(const task& t) {
    const std::string key = file_->path() + ": budgets." + t.resource_id;
    if (!t.raise) {
      const auto& budgets = file_->state().budgets;
      const auto it = budgets.find(t.resource_id);
      return it != budgets.end() && it->second.window == t.window ? it->second.mark : 0.0;
    }
    std::string error;
    if (!file_->write_budget(t.resource_id, {t.window, *t.raise}, error)) return failed(key, error);
    return *t.raise;
  }

  std::optional<double> failed(const std::string& key, const std::string& why) {
    log_throttle_.log(log_,
                      fmt::format("warning: budget mark {}: {}; nothing more of it is allotted "
                                  "until it is stored",
                                  key, why),
                      clock::now());
    return std::nullopt;
  }

  asio::any_io_executor strand_;
  Engine& engine_;
  budget_mark_options options_;
  std::function<void(std::string_view)> log_;
  asio::steady_timer backoff_;
  std::optional<net::etcd_client> etcd_;
  std::unordered_map<std::string, std::int64_t> revisions_;  // each key's, as last seen
  log_throttle<clock::time_point> log_throttle_{seconds(10)};
  int failures_ = 0;
  bool running_ = false;
  bool stopping_ = false;
  state_file* file_;
};

}  // namespace doorman
