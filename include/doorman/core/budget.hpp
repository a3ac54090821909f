#pragma once

/// \file
/// Budgets (docs/budgets.md): a resource of N units per window of UTC time — a minute, an
/// hour, a day, a month, or a fixed number of seconds counted from the Unix epoch — instead of
/// N per second. The root hands out allotments of what the window has left (leases of units,
/// shared by the resource's algorithm on the clients' wants) and counts what the clients say
/// they spent; this header holds the windows and the root's count, the engine
/// (<doorman/core/engine.hpp>) the rest.
///
///     doorman::budget_config day{.period = doorman::budget_period::day};
///     auto w = doorman::window_at(day, 1764417600.0);  // 2025-11-29 12:00 UTC
///     // w.start == 1764374400 (00:00), w.end == 1764460800

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "doorman/core/string_hash.hpp"

namespace doorman {

/// The windows a budget counts in.
enum class budget_period { minute, hour, day, month, fixed };

/// A budget's window: `period`, and for `fixed` its length in whole seconds (windows start at
/// multiples of it from 1970-01-01 00:00 UTC).
struct budget_config {
  budget_period period = budget_period::day;
  std::int64_t fixed_seconds = 0;

  friend bool operator==(const budget_config&, const budget_config&) = default;
};

/// The window's name in the configuration (`"day"`), or its length in seconds for `fixed`.
[[nodiscard]] inline std::string period_name(const budget_config& b) {
  switch (b.period) {
    case budget_period::minute:
      return "minute";
    case budget_period::hour:
      return "hour";
    case budget_period::day:
      return "day";
    case budget_period::month:
      return "month";
    case budget_period::fixed:
      break;
  }
  return std::to_string(b.fixed_seconds);
}

/// One window: [start, end) in seconds since the Unix epoch, UTC.
struct budget_window {
  std::int64_t start = 0;
  std::int64_t end = 0;

  friend bool operator==(const budget_window&, const budget_window&) = default;
};

/// The window of `b` holding the UTC time `utc` (seconds since the Unix epoch; leap seconds
/// are not counted, as in Unix time). Months are calendar months.
[[nodiscard]] inline budget_window window_at(const budget_config& b, double utc) noexcept {
  const auto t = static_cast<std::int64_t>(std::floor(utc));
  const auto aligned = [t](std::int64_t length) {
    const std::int64_t q = t >= 0 ? t / length : -((-t + length - 1) / length);
    return budget_window{q * length, q * length + length};
  };
  switch (b.period) {
    case budget_period::minute:
      return aligned(60);
    case budget_period::hour:
      return aligned(3600);
    case budget_period::day:
      return aligned(86400);
    case budget_period::fixed:
      return aligned(std::max<std::int64_t>(1, b.fixed_seconds));
    case budget_period::month:
      break;
  }
  namespace c = std::chrono;
  const c::sys_days day = c::floor<c::days>(c::sys_seconds(c::seconds(t)));
  const c::year_month_day ymd(day);
  const c::year_month first = ymd.year() / ymd.month();
  const auto unix_seconds = [](c::sys_days d) {
    return static_cast<std::int64_t>(c::duration_cast<c::seconds>(d.time_since_epoch()).count());
  };
  return {unix_seconds(c::sys_days(first / 1)),
          unix_seconds(c::sys_days((first + c::months(1)) / 1))};
}

/// What a budget's report and answer carry on the wire.
///
/// A client reports, per budget resource, what it has spent in total in the window the root
/// named (`spend`): cumulative, so that a report sent twice (a retry) counts once, and a new
/// master that hears it learns the whole of the client's spend in the window.
struct budget_spend {
  std::int64_t window = 0;  ///< the window's start (Unix seconds), as the root's answer named it
  double spent = 0;         ///< units spent in that window by this client, in all
};

/// A budget's state in a grant and in `status`: the window and what the root counts in it.
struct budget_info {
  std::int64_t window = 0;  ///< the window's start, Unix seconds (UTC)
  double reset = 0;         ///< seconds until it ends
  double limit = 0;         ///< units per window (the resource's capacity)
  double spent = 0;         ///< spent in the window as far as the root knows (see docs)
  double left = 0;          ///< neither spent nor allotted
  /// Only in a grant to a server child: its reports as this node counts them, in all (the
  /// child's allotment comes on top of that; a child that restarted continues from it).
  std::optional<double> counted{};
  /// Only in `status`, at a root keeping budget marks: the window's durable mark, once read
  /// (what is spent and allotted never passes it; docs/budgets.md).
  std::optional<double> mark{};
};

/// A `release_capacity`'s last report for one budget resource: what the client spent in all
/// (its allotment's remainder is then free at once; without it, the remainder counts as spent).
struct resource_spend {
  std::string resource_id;
  std::int64_t window = 0;
  double spent = 0;
};

/// The last reports of `spends` (in the order they were made) that a release of `ids` may
/// carry: one per id, the latest, for the ids it releases (a resource attached again before
/// its release went out is not released: its old report is dropped). In the order of `ids`.
[[nodiscard]] inline std::vector<resource_spend> spends_for(const std::vector<std::string>& ids,
                                                            std::vector<resource_spend> spends) {
  std::vector<resource_spend> out;
  for (const auto& id : ids) {
    const auto last = std::find_if(spends.rbegin(), spends.rend(),
                                   [&](const resource_spend& s) { return s.resource_id == id; });
    const bool listed = std::any_of(out.begin(), out.end(),
                                    [&](const resource_spend& s) { return s.resource_id == id; });
    if (last != spends.rend() && !listed) out.push_back(std::move(*last));
  }
  return out;
}

/// A budget mark's task, for a root that keeps them (`engine_options::budget_mark_step`;
/// docs/budgets.md, "When every root is lost"): read the mark stored for `window` (no
/// `raise`), or store `*raise` as its mark. Either way, report with
/// `basic_engine::budget_mark_done`.
struct budget_mark_task {
  std::string resource_id;
  std::int64_t window = 0;
  std::optional<double> raise{};
  std::uint64_t term = 0;  ///< of which mastership: an answer for another one is ignored
};

namespace detail {

/// A root's durable mark of a budget's window (`engine_options::budget_mark_step`).
struct budget_mark_state {
  std::int64_t window = 0;  ///< the window the rest is about
  bool known = false;       ///< read in this window and term: `durable` holds
  bool busy = false;        ///< a read or a write is out
  double durable = 0;       ///< stored: what is spent and allotted never passes it
  /// The largest `count_hits` draw the mark held back in the window: raises go two such draws
  /// ahead, so that the next draws find room.
  double draw = 0;

  /// Moves to window `w`: another window starts with nothing known.
  void at_window(std::int64_t w) noexcept {
    if (window != w) *this = {.window = w};
  }
};

/// A budget resource's count at a node, in its current window: what its clients reported
/// (cumulative per client, so that a repeated report adds nothing) and what was spent in all —
/// reported spend, plus the allotments that ended unreported (a client that died, or let its
/// lease lapse, may have spent all of it).
class budget_count {
 public:
  /// Moves to the window holding `utc`: a new window starts with nothing spent.
  void roll(const budget_config& b, double utc) {
    if (utc >= static_cast<double>(window_.start) && utc < static_cast<double>(window_.end)) return;
    const budget_window w = window_at(b, utc);
    if (w == window_) return;
    window_ = w;
    spent_ = 0;
    floor_ = vouched_ = 0;
    reported_.clear();
  }

  /// Moves to the window `w` a parent named (an intermediate counts in its root's windows):
  /// another start is a new window, with nothing spent (true); the same start only moves its
  /// end.
  bool roll_to(const budget_window& w) {
    const bool fresh = w.start != window_.start;
    if (fresh) {
      spent_ = 0;
      floor_ = vouched_ = 0;
      reported_.clear();
    }
    window_ = w;
    return fresh;
  }

  [[nodiscard]] const budget_window& window() const noexcept { return window_; }

  /// What is counted as spent: the reports and unreported allotments, or at least what a
  /// restored mark leaves unaccounted for (`restore`).
  [[nodiscard]] double spent() const noexcept { return spent_ + std::max(0.0, floor_ - vouched_); }

  /// A new master's start from its window's durable mark (docs/budgets.md, "When every root
  /// is lost"): at most `mark` was spent or allotted before it. Until the clients say what of
  /// it is theirs, all of it counts as spent; each client's first report in the window (what
  /// it spent, and the allotment it still holds: `report`'s `held`), before the restore or
  /// after, takes its part off that, since it counts on its own from then on. What is never
  /// claimed (a client that died) stays spent.
  void restore(double mark) noexcept { floor_ = std::max(0.0, mark); }

  /// Counts `units` as spent (an allotment that ended unreported).
  void add(double units) noexcept {
    if (units > 0) spent_ += units;
  }

  /// A client's request, with its report if it made one: what it has spent in `s.window` in
  /// all. Returns what is new since its last report in this window: 0 for none, a report of
  /// another window or a repeated one. A request without a report comes from a process that
  /// does not know the window yet (a new one, whatever its id held before): its count starts
  /// from 0. So does a report below the last one (one process's reports only grow). A client's
  /// first request in the window counts its whole report at a root; at an intermediate
  /// (`first_counts` false) it is where the client's count starts, since its root counts what
  /// came before (reported elsewhere, or allotments that ended unreported). Either way the
  /// client is known from then on, so that nothing it spends of an allotment from here goes
  /// uncounted.
  ///
  /// `held`: the allotment (of an earlier master) the client says it still holds, confirmed in
  /// learning mode: with its report, the part of a restored mark that is the client's.
  double report(std::string_view client_id, const std::optional<budget_spend>& s,
                bool first_counts = true, double held = 0) {
    auto it = reported_.find(client_id);
    const bool first = it == reported_.end();
    if (first) it = reported_.emplace(std::string(client_id), 0.0).first;
    if (!s) it->second = 0;
    const bool valid = s && s->window == window_.start && s->spent >= 0;
    if (first) vouched_ += std::max(0.0, held) + (valid ? s->spent : 0.0);
    if (!valid) return 0;
    if (first && !first_counts) {
      it->second = s->spent;
      return 0;
    }
    if (s->spent < it->second) it->second = 0;
    const double added = s->spent - it->second;
    it->second = s->spent;
    spent_ += added;
    return added;
  }

  /// A client's reports as counted in this window (its last one), or 0.
  [[nodiscard]] double counted(std::string_view client_id) const {
    const auto it = reported_.find(client_id);
    return it == reported_.end() ? 0.0 : it->second;
  }

  /// Forgets the reports of the clients `known(id)` says are gone, holding nothing from here
  /// (bounded memory). One that comes back is a first request again: at a root its whole spend
  /// counts twice (never under); at an intermediate, what it spent since its last report here
  /// came from an allotment that ended unreported, already counted.
  template <class Known>
  void forget_unless(Known known) {
    std::erase_if(reported_, [&](const auto& kv) { return !known(kv.first); });
  }

  [[nodiscard]] std::size_t reporters() const noexcept { return reported_.size(); }

 private:
  budget_window window_{};
  double spent_ = 0;
  double floor_ = 0;    // a restored mark
  double vouched_ = 0;  // what clients' first reports in the window said was theirs
  std::unordered_map<std::string, double, string_hash, std::equal_to<>> reported_;
};

/// A root's budget marks across its resources: which are due to be read or raised, and the
/// mastership term that tasks belong to. A mark is read once per window and term (nothing of
/// the window is allotted before: `mark_bound`), and raised a step ahead of what is spent and
/// allotted once that comes within half a step of it (or two draws ahead, within a draw, once
/// a `count_hits` draw was held back by it).
class budget_marks {
 public:
  /// A new term (mastership won or lost): every task out belongs to the old one.
  void new_term() noexcept {
    due_.clear();
    ++term_;
  }

  [[nodiscard]] bool due() const noexcept { return !due_.empty(); }

  /// The resources queued by `mind`, taken.
  [[nodiscard]] std::vector<std::string> take() noexcept { return std::exchange(due_, {}); }

  /// The task for resource `id` (its mark `m`, its count `b`, `held` allotted, `step` units a
  /// raise goes ahead), if one is due.
  [[nodiscard]] std::optional<budget_mark_task> task(std::string_view id, budget_mark_state& m,
                                                     const budget_count& b, double held,
                                                     double limit, double step) const {
    const std::int64_t w = b.window().start;
    m.at_window(w);
    if (!m.known) return budget_mark_task{std::string(id), w, std::nullopt, term_};
    const double used = b.spent() + held;
    // Due within half a step (or a draw) of the mark; raised a step (or two draws) ahead.
    if (m.durable >= limit || used + std::max(step / 2, m.draw) < m.durable) return std::nullopt;
    const double ahead = std::max(step, 2 * m.draw);
    return budget_mark_task{std::string(id), w, std::min(limit, used + ahead), term_};
  }

  /// Queues `id` once if a task is due for it.
  void mind(std::string_view id, budget_mark_state& m, const budget_count& b, double held,
            double limit, double step) {
    if (m.busy || !task(id, m, b, held, limit, step)) return;
    m.busy = true;
    due_.emplace_back(id);
  }

  /// A task's outcome (`basic_engine::budget_mark_done`); false when it is of a term or window
  /// gone by. A read restores the count from the mark; a mark of a window the count has left
  /// (it ended while the task was out) is not this window's: the next one is read instead.
  bool done(const budget_mark_task& t, std::optional<double> mark, budget_mark_state& m,
            budget_count& b) const {
    if (t.term != term_ || m.window != t.window || !m.busy) return false;
    m.busy = false;
    if (mark && b.window().start == t.window) {
      if (!m.known) b.restore(*mark);
      m.known = true;
      m.durable = std::max(m.durable, *mark);
    }
    return true;
  }

  [[nodiscard]] std::uint64_t term() const noexcept { return term_; }

 private:
  std::vector<std::string> due_;  // resources whose mark is to be read or raised
  std::uint64_t term_ = 0;        // mastership changes
};

}  // namespace detail
}  // namespace doorman
