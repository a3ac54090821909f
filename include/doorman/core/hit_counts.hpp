#pragma once

/// \file
/// Exact hit counting (`count_hits`), the engine's part beside its leases: one fixed window per
/// resource on the engine's clock, counted exactly, in a table of bounded size.
///
///     doorman::hit_counts<std::chrono::steady_clock> counts(1'000'000);
///     auto v = counts.count({"api", 1, 60}, now, [&] { return limit_of("api", 60); }, gen);
///
/// Windows are multiples of their length on the clock. A count asked with another window length
/// than the resource's last keeps the hits of the window under way: a count restarts only once
/// the window it was counted in has ended, so alternating lengths never resets it. The limit is
/// looked up once per window and configuration generation. Ended windows are swept when a new
/// resource finds the table full (at most once per earliest window end), or by `sweep`.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "doorman/core/messages.hpp"
#include "doorman/core/string_hash.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

template <class Clock>
class hit_counts {
 public:
  using duration = typename Clock::duration;
  using time_point = typename Clock::time_point;

  /// A table of at most `max_counters` resources with a live window.
  explicit hit_counts(std::size_t max_counters) : max_(max_counters) {}

  /// Counts `x.hits` more on `x.resource_id` at `now`: admitted whole when they fit in what the
  /// window has left of its limit (`limit()`, called when the window or `generation` is new),
  /// else refused, consuming nothing. Refused too when the table is full of live windows.
  template <class Limit>
  [[nodiscard]] hit_verdict count(const hit_count& x, time_point now, Limit limit,
                                  std::uint64_t generation) {
    hit_verdict v;
    v.resource_id = x.resource_id;
    const auto window = std::max(to_duration<duration>(x.window), duration(1));
    const std::int64_t index = now.time_since_epoch() / window;
    counter* c = counter_for(x.resource_id, now);
    if (c == nullptr) {  // refused: no room to count it
      v.limit = limit();
      v.reset = to_seconds(time_point((index + 1) * window) - now);
      return v;
    }
    const bool same_window = c->index == index && c->window == window;
    if (!same_window || c->generation != generation) {
      const bool live = now < c->end();  // another length keeps the hits under way
      *c = {index, window, limit(), generation, same_window || live ? c->used : 0};
      next_sweep_ = std::min(next_sweep_, c->end());
    }
    v.limit = c->limit;
    v.reset = to_seconds(c->end() - now);
    v.admitted = c->used + x.hits <= v.limit;
    if (v.admitted) c->used += x.hits;
    v.remaining = std::max(0.0, v.limit - c->used);
    return v;
  }

  /// Forgets the counters whose window has ended (at most once per earliest window end).
  void sweep(time_point now) {
    if (now < next_sweep_) return;
    next_sweep_ = time_point::max();
    std::erase_if(counters_, [&](const auto& e) {
      const time_point end = e.second.end();
      if (end <= now) return true;
      next_sweep_ = std::min(next_sweep_, end);
      return false;
    });
  }

  /// Counters held now.
  [[nodiscard]] std::size_t size() const noexcept { return counters_.size(); }

 private:
  // One resource's window: which one (its index on the clock), how long, its limit, the
  // configuration generation it was looked up in, how many hits it has admitted.
  struct counter {
    std::int64_t index = 0;
    duration window{};
    double limit = 0;
    std::uint64_t generation = 0;
    double used = 0;
    [[nodiscard]] time_point end() const { return time_point((index + 1) * window); }
  };

  // The counter of `id` (a new one has no window yet), or null when the table is full.
  counter* counter_for(const std::string& id, time_point now) {
    if (const auto it = counters_.find(std::string_view(id)); it != counters_.end()) {
      return &it->second;
    }
    if (counters_.size() >= max_) sweep(now);
    if (counters_.size() >= max_) return nullptr;
    return &counters_.emplace(id, counter{}).first->second;
  }

  std::size_t max_;
  std::unordered_map<std::string, counter, string_hash, std::equal_to<>> counters_;
  time_point next_sweep_{};  // no counter's window ends before this
};

}  // namespace doorman
