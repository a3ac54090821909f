#pragma once

/// \file
/// Exact per-window limits shared by a fleet, with few calls: each process draws blocks of hits
/// from the root's exact count of the window (`count_hits`) and admits from its block locally.
/// Sans-I/O: it never reads a clock, holds no socket and no thread; its driver sends the draws
/// it asks for and hands back the root's answers.
///
///     doorman::window_draws<std::chrono::steady_clock, my_request> draws({});
///     auto s = draws.take(key, hits, limit, window, now, request);
///     if (s.decided) answer(request, *s.decided);          // from the block, or refused
///     if (s.draw) send_count_hits(*s.draw);                // then: draws.answered(...)
///
/// A block is what the root admitted of a draw: hits counted in the root's window, so whatever
/// every process admits from its blocks stays within the limit of each root window, exactly,
/// from the first request of a key on. A block is sized by the key's recent demand here: the
/// hits asked in about the last twentieth of the window (a decayed count), at least what the
/// waiting requests need and a thousandth of the limit (a key asked rarely under a large limit
/// costs one call a block, not one a request), at most a twentieth of the limit. For a limit
/// under 20 per window a draw is one request's hits, and every request is counted at the root.
///
/// What this costs: hits drawn and not admitted by the window's end are lost to the window
/// (at most a twentieth of the limit per process, and no more than the process was asked for in
/// the last twentieth of the window or a thousandth of the limit, whichever is more); a process
/// with no block left and no answer from the root admits nothing (its driver answers
/// "unavailable").
///
/// One draw is in flight per key; requests that need it wait behind it, first come, first
/// served. When the root refuses with less left than a request needs, the key refuses such
/// requests without a call until its window ends, so the root sees about one refused draw per
/// process, key and window. A refusal that says the draw would fit is no answer: the root
/// cannot count yet (a budget whose durable mark it is reading); the waiting are unavailable.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "doorman/core/messages.hpp"
#include "doorman/core/string_hash.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

struct window_draw_options {
  double block_fraction = 0.05;     ///< of a window: the demand a block covers, and its cap
  double least_fraction = 0.001;    ///< of the limit: the least a block holds (under the cap)
  std::size_t max_keys = 100'000;   ///< keys held; an idle one is forgotten to make room
  std::size_t max_waiting = 4'096;  ///< requests waiting on one key's draw
};

/// What became of a request's hits on one key.
struct draw_outcome {
  enum class kind { admitted, refused, unavailable };
  kind what = kind::unavailable;
  double limit = 0;      ///< the window's limit (the root's, once it answered)
  double remaining = 0;  ///< hits left in the window: this block's and the root's, as last seen
  std::chrono::nanoseconds reset{};  ///< until the window ends (0: not known)
  const char* why = "";              ///< with `unavailable`: why
};

template <class Clock, class Waiter>
class window_draws {
 public:
  using duration = typename Clock::duration;
  using time_point = typename Clock::time_point;

  explicit window_draws(window_draw_options o) : options_(o) {}

  /// What `take` decided: the request's outcome now, or nothing (it waits on `draw`, or on the
  /// draw already in flight), and a draw to send.
  struct step {
    std::optional<draw_outcome> decided;
    std::optional<hit_count> draw;
  };

  /// `hits` on `key` (a fixed window of `window`, whose limit is `limit` until the root says
  /// otherwise) for `waiter`, at `now`.
  [[nodiscard]] step take(const std::string& key, double hits, double limit, duration window,
                          time_point now, Waiter waiter) {
    step out;
    entry* e = entry_for(key, now);
    if (e == nullptr) {
      out.decided = unavailable(limit, "too many keys are waiting on the root");
      return out;
    }
    if (e->waiting.empty()) e->limit = limit;  // a reloaded rule applies from now
    e->window = window;
    expire(*e, now);
    const double tau = seconds(window).count() * options_.block_fraction;
    if (e->last != time_point{} && tau > 0) {
      e->demand *= std::exp(-seconds(now - e->last).count() / tau);
    }
    e->demand += hits;
    e->last = now;
    if (e->waiting.empty()) {
      if (auto d = decide(*e, hits, now)) {
        out.decided = d;
        return out;
      }
    }
    if (e->waiting.size() >= options_.max_waiting) {
      out.decided = unavailable(e->limit, "too many requests are waiting on the key's draw");
      return out;
    }
    e->waiting.push_back({std::move(waiter), hits});
    if (!e->in_flight) out.draw = start_draw(key, *e, now);
    return out;
  }

  /// What the root's answer to `key`'s draw decided.
  struct resolution {
    std::vector<std::pair<Waiter, draw_outcome>> decided;
    std::optional<hit_count> draw;  ///< the next draw, when some still wait
  };

  /// The root answered `key`'s draw with `v` (null: no answer; the waiting are unavailable).
  [[nodiscard]] resolution answered(const std::string& key, const hit_verdict* v, time_point now) {
    resolution out;
    const auto it = keys_.find(std::string_view(key));
    if (it == keys_.end() || !it->second.in_flight) return out;
    entry& e = it->second;
    e.in_flight = false;
    // Refused though the root has room for the draw: it cannot count it yet (a budget's
    // durable mark being read or raised, docs/budgets.md). As no answer, nothing remembered.
    const bool uncounted = v != nullptr && !v->admitted && v->remaining >= e.drawing;
    if (v == nullptr || uncounted) {
      const char* why = v == nullptr ? "the root did not count" : "the root cannot count it yet";
      for (auto& w : e.waiting)
        out.decided.emplace_back(std::move(w.waiter), unavailable(e.limit, why));
      e.waiting.clear();
      return out;
    }
    // The window the root counted in ends `reset` after it counted, which was after the draw
    // was sent: ending the block then is never late.
    const auto end = e.sent + std::chrono::duration_cast<duration>(seconds(v->reset));
    const bool new_window = now >= e.end || end > e.end + e.window / 2;
    if (new_window) {
      e.balance = 0;
      e.end = end;
    } else {
      e.end = std::min(e.end, end);
    }
    e.limit = v->limit;
    e.root_left = v->remaining;
    if (v->admitted) e.balance += e.drawing;
    expire(e, now);
    while (!e.waiting.empty()) {
      auto d = decide(e, e.waiting.front().hits, now);
      if (!d) {
        out.draw = start_draw(key, e, now);
        break;
      }
      out.decided.emplace_back(std::move(e.waiting.front().waiter), *d);
      e.waiting.pop_front();
    }
    return out;
  }

  /// Keys held now.
  [[nodiscard]] std::size_t size() const noexcept { return keys_.size(); }

 private:
  struct queued {
    Waiter waiter;
    double hits;
  };
  struct entry {
    double limit = 0;
    duration window{};
    double balance = 0;  // hits drawn and not yet admitted, in the window ending at `end`
    double root_left = std::numeric_limits<double>::infinity();  // the root's, as last seen
    time_point end{};
    double demand = 0;  // hits asked, decayed over a block's share of the window
    time_point last{};
    bool in_flight = false;
    time_point sent{};
    double drawing = 0;
    std::deque<queued> waiting;
  };

  static draw_outcome unavailable(double limit, const char* why) {
    return {draw_outcome::kind::unavailable, limit, 0, {}, why};
  }

  // A block past its window's end is lost; so is what the root said of that window.
  static void expire(entry& e, time_point now) {
    if (now < e.end) return;
    e.balance = 0;
    e.root_left = std::numeric_limits<double>::infinity();
  }

  // `hits` from the block, refused from what the root said is left, or nothing: a draw decides.
  static std::optional<draw_outcome> decide(entry& e, double hits, time_point now) {
    const auto reset = std::chrono::duration_cast<std::chrono::nanoseconds>(
        now < e.end ? e.end - now : duration::zero());
    if (hits <= e.balance) {
      e.balance -= hits;
      const double left = std::isinf(e.root_left) ? e.limit : e.root_left + e.balance;
      return draw_outcome{draw_outcome::kind::admitted, e.limit, std::min(left, e.limit), reset};
    }
    if (hits > e.balance + e.root_left || hits > e.limit) {
      const double left = std::isinf(e.root_left) ? e.limit : e.root_left + e.balance;
      return draw_outcome{draw_outcome::kind::refused, e.limit, std::min(left, e.limit), reset};
    }
    return std::nullopt;
  }

  // The next draw: what the front request lacks, or the recent demand if more (as much as
  // waits), at most a block's cap (never under the front's need) and what the root has left.
  hit_count start_draw(const std::string& key, entry& e, time_point now) {
    const double need = e.waiting.front().hits - e.balance;
    double all = -e.balance;
    for (const auto& w : e.waiting)
      all += w.hits;
    const double cap = e.limit * options_.block_fraction;
    const double least = e.limit * options_.least_fraction;
    double size = std::min(std::max({e.demand - e.balance, all, least}), cap);
    if (!std::isinf(e.root_left)) size = std::min(size, e.root_left);
    size = std::ceil(std::max(size, need));
    e.in_flight = true;
    e.sent = now;
    e.drawing = size;
    return {key, size, seconds(e.window).count()};
  }

  // `key`'s entry, made when new; null when every key held is waiting on a draw.
  entry* entry_for(const std::string& key, time_point now) {
    if (const auto it = keys_.find(std::string_view(key)); it != keys_.end()) return &it->second;
    if (keys_.size() >= options_.max_keys) {
      std::erase_if(keys_,
                    [&](const auto& k) { return !k.second.in_flight && k.second.end <= now; });
    }
    if (keys_.size() >= options_.max_keys) {  // forget idle blocks: never admits more
      std::erase_if(keys_, [](const auto& k) { return !k.second.in_flight; });
    }
    if (keys_.size() >= options_.max_keys) return nullptr;
    return &keys_.emplace(key, entry{}).first->second;
  }

  window_draw_options options_;
  std::unordered_map<std::string, entry, string_hash, std::equal_to<>> keys_;
};

}  // namespace doorman
