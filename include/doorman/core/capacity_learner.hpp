#pragma once

/// \file
/// Learned capacity (docs/learned-capacity.md): the control law that moves a resource's
/// capacity from what its clients' calls to the protected service met (sans-I/O; one step per
/// control interval), the signals that carry those calls up the tree, and a client's own cut
/// while it waits for the root's.
///
///     doorman::capacity_learner learn({.min = 100, .max = 5000}, 1000);
///     // each interval, the clients' calls and overload answers, summed:
///     learn.update({.calls = 5200, .overloads = 600, .seconds = 5, .held = true});
///     // learn.capacity() == 892.4: what got through (920 a second), less 3 %
///     // a client cut itself after a second of overloads; what the clients now call at:
///     learn.cut_to(850);  // learn.capacity() == 850
///
/// The law, chosen in the simulator (`doorman-sim --learn`, docs/learned-capacity.md) on a model
/// of a protected service whose true capacity steps by -50 % and +50 %, with clients that sample
/// their answers each second, cut themselves and tell the root early:
/// - **Follow the clients' own cuts at once.** A client that met more than `overload_ratio`
///   (0.5 %) of overloads in a second cuts itself to what got through, less `margin`, and asks
///   again soon, wanting that. The root then takes what the clients would call at, each the
///   least of its lease and its wants (`cut_to`): fresh, second by second, and already the
///   service's level once every client has cut itself. The root's own numbers are rates over
///   reports that straddle the change.
/// - **Cut to what got through.** When an interval's calls met more than `overload_ratio` of
///   overloads, the capacity goes to the calls that got through, a second, less `margin`, never
///   below `(1 - max_cut)` of itself. Two cases say less than that: the calls cover under half
///   the capacity (only some clients reported), or under `small_share` (3 %) of them were
///   overloaded (the calls lag a capacity that rose, so only the last of them went over). Then
///   the share overloaded says how far over the service the clients went: the capacity goes to
///   what they were moving to call at, times the share that got through, less `margin`. When
///   that is not below the capacity, the overloads are of calls under an earlier, higher one,
///   already cut: nothing changes.
/// - **Hold on a few overloads.** An interval with overloads, too few to cut, holds: the
///   capacity is near the service's (its noise, or the clients' own cuts hiding the rest), and
///   the next rise starts from `first_step` again.
/// - **Rise, led by the calls.** An interval without overload in which some client was held
///   back by its lease (the capacity binds) raises the capacity: back to the last cut's level at
///   once, then by `first_step`, doubling each interval up to `max_step`. A rise never takes
///   the capacity more than `lead` (20 %) above the calls the clients were seen to make without
///   an overload: a rise they have not tried yet is not evidence (leases adopt a change over a
///   refresh, and through a tree over two).
/// - **Hold on silence.** No calls, numbers that are not finite and >= 0, more overloads than
///   calls, or demand below the capacity: nothing changes. Silence never raises a capacity.
/// - Always between `min` and `max`.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "doorman/core/string_hash.hpp"

namespace doorman {

/// The bounds and gains of a learned capacity.
struct learning_options {
  double min = 0;                                        ///< the least it may learn
  double max = std::numeric_limits<double>::infinity();  ///< the most it may learn
  double overload_ratio = 0.005;  ///< the share of calls overloaded above which it is cut
  double margin = 0.03;           ///< a cut goes this share below what got through
  double first_step = 0.02;       ///< the first rise after a cut, a share of the capacity
  double max_step = 0.25;         ///< the most one rise adds, a share of the capacity
  double max_cut = 0.5;           ///< the most one cut takes, a share of the capacity
  double lead = 0.2;  ///< a rise goes at most this share above the calls made without overload
  double small_share = 0.03;  ///< overloads under this share of the calls: the share, not the count
};

/// One control interval's signals, summed over the clients.
struct overload_sample {
  double calls = 0;      ///< calls made to the protected service
  double overloads = 0;  ///< of those, answered overloaded (429, 503, RESOURCE_EXHAUSTED, ...)
  double seconds = 0;    ///< the interval's length
  bool held = false;     ///< some client wanted more than its lease: the capacity binds
  /// What the clients were allowed and wanted to call at, a second: the sum of their leases,
  /// or of their wants when less. Unknown: infinity.
  double offered = std::numeric_limits<double>::infinity();
};

/// What a client's calls to the protected service met, counted since the client started
/// (cumulative, as a budget's spend: a report sent twice counts once). On the wire in a
/// request's `signals` (docs/protocol.md); an intermediate reports its clients' calls as their
/// rates summed over time, and their overloads as they came (`detail::signal_count::report_up`).
struct overload_signals {
  double calls = 0;      ///< calls made to the protected service
  double overloads = 0;  ///< of those, answered overloaded (or slower than their target)

  friend bool operator==(const overload_signals&, const overload_signals&) = default;
};

/// What one step did.
enum class learn_step { hold, cut, rise };

/// The control law of a learned capacity (see the file's comment).
class capacity_learner {
 public:
  /// `start` is clamped to the bounds.
  capacity_learner(learning_options o, double start) : o_(o), step_(o.first_step) {
    capacity_ = clamp(start);
  }

  [[nodiscard]] double capacity() const noexcept { return capacity_; }
  [[nodiscard]] const learning_options& options() const noexcept { return o_; }

  /// Moves the capacity for one interval's signals.
  learn_step update(const overload_sample& s) {
    if (!usable(s)) return learn_step::hold;
    const double share = s.overloads / s.calls;
    const double calls = s.calls / s.seconds;
    if (share > o_.overload_ratio) {
      double target = calls * (1 - share) * (1 - o_.margin);
      if (calls < 0.5 * capacity_ || share < o_.small_share) {
        const double offered = std::max(calls, std::min(capacity_, s.offered));
        target = std::max(target, offered * (1 - share) * (1 - o_.margin));
      }
      // Not below the capacity: overloads of calls under an earlier, higher one.
      if (target >= capacity_) return learn_step::hold;
      cut(std::max(capacity_ * (1 - o_.max_cut), target), target / (1 - o_.margin));
      return learn_step::cut;
    }
    // Some overloads, too few to cut (the clients' own cuts hide most of them): the capacity
    // is near the service's, and a rise would find it too late. Hold, and rise from the first
    // step again (a doubled step from here overshoots).
    if (s.overloads > 0) step_ = o_.first_step;
    if (!s.held || s.overloads > 0) return learn_step::hold;
    const double level = level_ * (1 - o_.margin);
    if (capacity_ < level * (1 - 1e-9)) {  // back to the last cut's level
      capacity_ = clamp(std::min(capacity_ * (1 + o_.max_step), level));
      return learn_step::rise;
    }
    const double led = calls * (1 + o_.lead);
    capacity_ =
        clamp(std::max(capacity_ * (1 + o_.first_step), std::min(capacity_ * (1 + step_), led)));
    step_ = std::min(step_ * 2, o_.max_step);
    return learn_step::rise;
  }

  /// The clients cut themselves after overloads: the capacity goes to what they would call at
  /// now (`limit`: each client's lease, or its wants when less, summed), when that is lower,
  /// never below `(1 - max_cut)` of itself. Returns whether it cut.
  bool cut_to(double limit) {
    if (!std::isfinite(limit) || limit <= 0 || limit >= capacity_) return false;
    cut(std::max(capacity_ * (1 - o_.max_cut), limit), limit);
    return true;
  }

 private:
  static bool usable(const overload_sample& s) noexcept {
    const auto ok = [](double x) { return std::isfinite(x) && x >= 0; };
    return ok(s.calls) && ok(s.overloads) && ok(s.seconds) && s.calls > 0 && s.seconds > 0 &&
           s.overloads <= s.calls;
  }

  // A cut to `to`; `level` is the service's level it found (rises go back to it at once).
  void cut(double to, double level) {
    capacity_ = clamp(to);
    level_ = level;
    step_ = o_.first_step;
  }

  [[nodiscard]] double clamp(double c) const noexcept {
    if (std::isnan(c)) c = o_.min;
    return std::max(o_.min, std::min(o_.max, c));
  }

  learning_options o_;
  double capacity_ = 0;
  double step_;
  double level_ = 0;  // the service's level the last cut found
};

/// The name of a step: `"hold"`, `"cut"` or `"rise"`.
[[nodiscard]] constexpr const char* step_name(learn_step s) noexcept {
  constexpr const char* names[] = {"hold", "cut", "rise"};
  return names[static_cast<int>(s)];
}

/// A root's learned capacity in `status`: its bounds and its last control step (the signals of
/// that interval, what it did).
struct learned_info {
  double min = 0;
  double max = 0;
  double calls = 0;      ///< in the last interval, from every client
  double overloads = 0;  ///< of those
  double seconds = 0;    ///< the last interval's length (0: no step yet)
  std::string step = "hold";
};

/// One control step of a learned capacity, as its history keeps it (the status page's chart).
struct learned_point {
  double at = 0;         ///< seconds on the engine's clock (relative to now in a snapshot)
  double capacity = 0;   ///< the learned capacity after the step
  double wants = 0;      ///< what the clients wanted in all: the demand
  double calls = 0;      ///< calls a second to the protected service in the step's interval
  double overloads = 0;  ///< of those, answered overloaded
  learn_step step = learn_step::hold;
};

/// The control steps a learned capacity's history keeps: half an hour at a 5 s refresh.
inline constexpr std::size_t learned_history_length = 360;

namespace detail {

/// A resource's learned capacity at a root: the law, the interval under way, the last step.
template <class TimePoint>
struct learned_state {
  /// Learning from `start_at` between `min` and `max`.
  learned_state(double min, double max, double start_at)
      : law({.min = min, .max = max}, start_at), start(start_at), last{.min = min, .max = max} {}

  capacity_learner law;
  double start = 0;        ///< the configured capacity it started from (a new one starts again)
  TimePoint from{};        ///< the interval under way started then
  bool seeded = false;     ///< its first step in this term was taken (after learning mode)
  bool cut = false;        ///< it cut in this term
  TimePoint cut_at{};      ///< its last cut
  TimePoint limited_at{};  ///< it last looked at what the clients would call at
  learned_info last{};
  std::deque<learned_point> history{};  ///< the last steps, oldest first
};

/// A resource's signals at a node: each client's last report, and its rate over the reports
/// of the interval under way (or its last one), for the root's control step and for what an
/// intermediate reports to its parent.
///
/// A client's first report at this node only sets where its count starts: a client that ran
/// for hours before (under another master) would otherwise bring its whole history into one
/// interval. A report below the last one comes from a process that started again: its count
/// starts from 0 and the whole report is new.
///
/// Reports reach a root at their senders' pace (each client's refresh, an intermediate's, and
/// sooner after an overload), not at its control step's: an interval may hold two reports of
/// one sender, or none. So a step takes rates: each sender's calls over the time its reports
/// in the interval cover (a sender without one: its last rate), summed.
class signal_count {
 public:
  /// A client's report at `at` (seconds on the node's clock), with what it wants now;
  /// returns what the report added.
  overload_signals report(std::string_view client_id, const overload_signals& s, double at,
                          double wants = 0) {
    auto [it, first] = senders_.try_emplace(std::string(client_id), sender{.last = s, .at = at});
    it->second.wants = wants;
    if (first) return {};
    sender& x = it->second;
    if (s.calls < x.last.calls || s.overloads < x.last.overloads) x.last = {};
    const overload_signals added{s.calls - x.last.calls, s.overloads - x.last.overloads};
    const double span = std::max(0.0, at - x.at);
    x.interval.calls += added.calls;
    x.interval.overloads += added.overloads;
    x.span += span;
    if (x.span > 0) x.rate = {x.interval.calls / x.span, x.interval.overloads / x.span};
    x.last = s;
    x.at = at;
    unsent_overloads_ += added.overloads;
    return added;
  }

  /// What an intermediate reports to its parent at `at`, as its own cumulative count, which
  /// starts another interval: its clients' calls as their rates say (`rate`), summed over
  /// time since its last report (their reports come in bursts, one per refresh each; the
  /// rates make the count grow as their calls did), and the overloads they reported since,
  /// as they came. An overload is an event: a client's last rate of them, summed on while
  /// the client is silent, would count them again (and cut the parent for overloads long
  /// gone, after the service had risen).
  overload_signals report_up(double at, double stale) noexcept {
    const overload_signals r = rate(at, stale);
    const double span = std::max(0.0, at - up_at_);
    if (up_at_ > 0) {
      up_.calls += r.calls * span;
      up_.overloads = std::min(up_.calls, up_.overloads + unsent_overloads_);
    }
    unsent_overloads_ = 0;
    up_at_ = at;
    next_interval();
    return up_;
  }

  /// The calls and overloads a second at `at`: each sender's rate over the interval under way,
  /// or its last one, summed; a sender silent for `stale` seconds counts no more (it is gone,
  /// or cut off), and the overloads of one silent since `since` (a cut that took them into
  /// account) count no more either. O(senders).
  [[nodiscard]] overload_signals rate(double at, double stale, double since = -1) const {
    overload_signals out;
    for (const auto& [id, x] : senders_) {
      if (at - x.at > stale) continue;
      out.calls += x.rate.calls;
      if (x.at > since) out.overloads += x.rate.overloads;
    }
    return out;
  }

  /// What sender `id` wanted at its last report, if that report came at `since` or later.
  [[nodiscard]] std::optional<double> wants_since(std::string_view id, double since) const {
    const auto it = senders_.find(id);
    if (it == senders_.end() || it->second.at < since) return std::nullopt;
    return it->second.wants;
  }

  /// Starts another interval (`rate` keeps each sender's last until it reports again).
  void next_interval() noexcept {
    for (auto& [id, x] : senders_) {
      x.interval = {};
      x.span = 0;
    }
  }

  /// Forgets the clients `known(id)` says are gone (bounded memory), once there are many more
  /// of them than `holders`: one that comes back starts its count again.
  template <class Known>
  void forget_unless(std::size_t holders, Known known) {
    if (senders_.size() > 2 * holders + 1024) {
      std::erase_if(senders_, [&](const auto& kv) { return !known(kv.first); });
    }
  }

 private:
  struct sender {
    overload_signals last{};      // its last report
    double at = 0;                // when it came
    overload_signals interval{};  // what its reports added in the interval under way
    double span = 0;              // the time those reports cover
    overload_signals rate{};      // a second, over the last interval it reported in
    double wants = 0;             // what it wanted at its last report
  };

  std::unordered_map<std::string, sender, string_hash, std::equal_to<>> senders_;
  overload_signals up_{};        // an intermediate's count for its parent (`report_up`)
  double up_at_ = 0;             // when it reported last
  double unsent_overloads_ = 0;  // overloads its clients reported since
};

}  // namespace detail
}  // namespace doorman
