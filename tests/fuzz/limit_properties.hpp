#pragma once

// The bounds the docs state for the client's local limiters, as properties over a program of
// operations read from bytes: the libFuzzer target `limits` runs them on what it finds, and the
// unit tests on seeded random programs (tests/budget_test.cpp). Each returns the first broken
// bound, said in words with the step it broke at, or nothing.
//
// Budget windows (docs/budgets.md, "The promise, and its limits"): a client's calls are
// admitted, settled (below or above their reservations, in the window they were admitted in),
// reported and granted allotments in the same window or a new one, in any order a driver and
// its callers can make. The count a window starts from is what was admitted since the report
// the new window's allotment answers; a refund of a call the root counted in the window that
// ended never lowers the new one's. So at every step the counter's spend is at least the real
// spend of the window under way (each of its calls at its reservation while open, at what it
// used once settled, capped at its reservation: debts are the docs' own excess), and it admits
// nothing past the allotment's ceiling.
//
// Rate windows (docs/client.md, "Real costs"): calls of any size are admitted or reserved,
// used at their time, settled below or above their reservations with their slots, and their
// reservations cancelled, in any order, by GCRA or the leaky bucket, on a manual clock or on a
// two-speed one whose cheap reading lags. Over every window [a, b] of the program, what the
// calls used (each at its reservation while open, at what it used once settled, capped at its
// reservation: debts are the docs' own excess; nothing for a reservation dropped in time) is at
// most rate·(b − a) plus the largest of the burst and the calls used in it, plus rate × lag on
// the lagging clock (a call admitted when the limiter was idle starts its span at the cheap
// reading, which may be up to the lag before now).

#include <doorman/core/time.hpp>
#include <doorman/limit/budget_counter.hpp>
#include <doorman/limit/clock.hpp>
#include <doorman/limit/leaky_bucket.hpp>
#include <doorman/limit/rate_limiter.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace doorman_fuzz {

/// Bytes read one at a time; 0 once they run out.
class byte_source {
 public:
  byte_source(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  [[nodiscard]] bool empty() const noexcept { return at_ >= size_; }
  std::uint8_t next() noexcept { return at_ < size_ ? data_[at_++] : 0; }
  /// One of `n` choices.
  std::size_t pick(std::size_t n) noexcept { return next() % n; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

/// The budget window property over the program in `data` (at most 400 steps).
inline std::optional<std::string> budget_window_property(const std::uint8_t* data,
                                                         std::size_t size) {
  using namespace std::chrono_literals;
  doorman::manual_clock time;
  doorman::budget_counter<doorman::manual_clock> b;
  struct call {
    double reserved = 0;
    std::uint64_t window = 0;   // the ticket: the counter's window read before it was admitted
    std::uint64_t counted = 0;  // the root window it counts in
    bool open = true;
    double used = 0;
  };
  std::vector<call> calls;
  std::uint64_t root_window = 0;  // the window the root counts in
  // The reports made, and the root windows the calls admitted since the last one fall in if
  // the answer to it names a new window.
  bool asked = false;
  double reported = 0;
  std::vector<std::size_t> since_report;  // calls admitted since the last report
  double ceiling = 0;                     // what the counter may admit up to, as the model sees it
  constexpr double amounts[] = {0, 0.5, 1, 2, 5, 10, 40};
  byte_source in(data, size);
  b.grant({.units = 20, .spent_at_send = 0, .expires = time.now() + 1h});
  ceiling = 20;
  for (int step = 0; step < 400 && !in.empty(); ++step) {
    const auto where = [&](const char* what) {
      return "step " + std::to_string(step) + ": " + what;
    };
    switch (in.pick(5)) {
      case 0: {  // a call asks
        const double n = amounts[in.pick(std::size(amounts))];
        const auto w = b.window();
        const double before = b.spent();
        if (b.try_acquire(n, time.now())) {
          if (before + n > ceiling + 1e-9) return where("admitted past the allotment's ceiling");
          calls.push_back({.reserved = n, .window = w, .counted = root_window});
          since_report.push_back(calls.size() - 1);
        }
        break;
      }
      case 1: {  // an open call settles: nothing used, part, all, or more
        if (calls.empty()) break;
        call& c = calls[in.pick(calls.size())];
        if (!c.open) break;
        const double used_of[] = {0, c.reserved / 2, c.reserved, c.reserved + 3};
        c.used = used_of[in.pick(4)];
        c.open = false;
        if (!b.settle(c.reserved, c.used, c.window)) return where("a valid settle refused");
        break;
      }
      case 2:  // the driver reports (a refresh goes out)
        reported = b.report();
        asked = true;
        since_report.clear();
        break;
      case 3: {  // the root answers the last report: the same window, or a new one
        if (!asked) break;
        asked = false;
        const double units = amounts[in.pick(std::size(amounts))] * 2;
        const bool new_window = in.pick(3) == 0;
        if (new_window) {
          ++root_window;
          for (const auto i : since_report)
            calls[i].counted = root_window;
          ceiling = units;
        } else {
          ceiling = reported + units;
        }
        b.grant({.units = units,
                 .spent_at_send = reported,
                 .new_window = new_window,
                 .expires = time.now() + 1h});
        break;
      }
      default:  // time passes (the allotment lasts an hour)
        time.advance(std::chrono::milliseconds(in.next()));
        break;
    }
    // The window under way spent at least this much; the counter must count no less.
    double real = 0;
    for (const auto& c : calls)
      if (c.counted == root_window) real += c.open ? c.reserved : std::min(c.used, c.reserved);
    if (b.spent() + 1e-9 < real)
      return where("the counter's spend under the window's real spend: ") +
             std::to_string(b.spent()) + " < " + std::to_string(real);
  }
  return std::nullopt;
}

/// One call of a rate program: when its permits are used, how many it took and (once settled)
/// used, its slot, and whether it was dropped (a reservation cancelled in time).
struct rate_call {
  std::int64_t at = 0;  // ns on the manual clock
  double reserved = 0;
  double used = 0;
  std::int64_t slot = 0;
  bool reservation = false;  // made by `reserve` (a wait), so it may be cancelled
  bool open = true;
  bool dropped = false;
};

/// The first window of `calls` over which they used more than `rate`·W plus the largest of
/// `burst` and the calls in it (ns rounding allowed), said in words; or nothing.
inline std::optional<std::string> rate_window_broken(std::vector<rate_call> calls, double rate,
                                                     double burst, double lag) {
  std::sort(calls.begin(), calls.end(),
            [](const rate_call& x, const rate_call& y) { return x.at < y.at; });
  for (std::size_t i = 0; i < calls.size(); ++i) {
    double used = 0;
    double largest = burst;
    for (std::size_t j = i; j < calls.size(); ++j) {
      const rate_call& c = calls[j];
      if (!c.dropped) used += c.open ? c.reserved : std::min(c.used, c.reserved);
      largest = std::max(largest, c.reserved);
      const double w = static_cast<double>(c.at - calls[i].at) / 1e9;
      const double bound = rate * (w + lag) + largest + 1e-6 * static_cast<double>(j - i + 1);
      if (used > bound) {
        return "over [" + std::to_string(calls[i].at) + ", " + std::to_string(c.at) +
               "] ns: " + std::to_string(used) + " used, at most " + std::to_string(bound);
      }
    }
  }
  return std::nullopt;
}

/// A program of calls on `lim` (a GCRA or a leaky bucket on `time`), then the bound checked.
template <class Limiter>
std::optional<std::string> rate_window_program(Limiter& lim, doorman::manual_clock& time,
                                               byte_source& in, double rate, double burst,
                                               double lag) {
  using namespace std::chrono_literals;
  constexpr double amounts[] = {0, 0.5, 1, 1, 2, 3, 7, 25};
  const auto ns = [](auto t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  };
  std::vector<rate_call> calls;
  for (int step = 0; step < 300 && !in.empty(); ++step) {
    switch (in.pick(6)) {
      case 0: {  // a call asks now
        const double n = amounts[in.pick(std::size(amounts))];
        const auto r = lim.try_acquire(n);
        if (r) calls.push_back({.at = ns(time.now()), .reserved = n, .slot = r.slot});
        break;
      }
      case 1: {  // a wait reserves
        const double n = amounts[in.pick(std::size(amounts))];
        const auto r = lim.reserve(n);
        if (r.at != Limiter::time_point::max())
          calls.push_back({.at = ns(r.at), .reserved = n, .slot = r.slot, .reservation = true});
        break;
      }
      case 2: {  // a call whose time has come settles: nothing used, part, all, or more
        if (calls.empty()) break;
        rate_call& c = calls[in.pick(calls.size())];
        if (!c.open || c.dropped || c.at > ns(time.now())) break;
        const double used_of[] = {0, c.reserved / 2, c.reserved, c.reserved + 3};
        c.used = used_of[in.pick(4)];
        c.open = false;
        if (!lim.settle(c.reserved, c.used, c.slot)) return "a valid settle refused";
        break;
      }
      case 3: {  // a wait is cancelled
        if (calls.empty()) break;
        rate_call& c = calls[in.pick(calls.size())];
        if (!c.reservation || !c.open || c.dropped) break;
        const bool ahead = c.at > ns(time.now());
        if (lim.cancel_reservation(
                c.reserved,
                {typename Limiter::time_point{std::chrono::nanoseconds{c.at}}, c.slot}) != ahead) {
          return "a cancel answered otherwise than its time says";
        }
        c.dropped = ahead;
        break;
      }
      default:  // time passes: up to a quarter of a second, by a byte's worth of steps
        time.advance(std::chrono::microseconds(1000 * in.next() + in.next()));
        break;
    }
  }
  return rate_window_broken(std::move(calls), rate, burst, lag);
}
/// A two-speed clock over a manual one: `now()` in 4 ms steps behind `precise_now()`, as
/// CLOCK_MONOTONIC_COARSE is behind CLOCK_MONOTONIC.
struct stepped_clock : doorman::manual_clock_ref {
  [[nodiscard]] time_point now() const noexcept {
    using namespace std::chrono_literals;
    return time_point{source->now().time_since_epoch() / 4ms * 4ms};
  }
  [[nodiscard]] time_point precise_now() const noexcept { return source->now(); }
  [[nodiscard]] static duration resolution() noexcept { return std::chrono::milliseconds(4); }
};

/// The rate window property over the program in `data` (at most 300 steps): its first bytes
/// choose the algorithm, the clock, the rate and the burst (or queue).
inline std::optional<std::string> rate_window_property(const std::uint8_t* data, std::size_t size) {
  byte_source in(data, size);
  const bool leaky = in.pick(2) == 1;
  const bool stepped = in.pick(2) == 1;
  constexpr double rates[] = {1, 10, 100, 1000};
  constexpr double bursts[] = {1, 2, 5, 20};
  const double rate = rates[in.pick(std::size(rates))];
  const double burst = bursts[in.pick(std::size(bursts))];
  const auto run = [&](auto& lim, doorman::manual_clock& time) -> std::optional<std::string> {
    // On the lagging clock, a call admitted when the limiter was idle starts its span at the
    // cheap reading, up to its lag before now: the docs' excess of rate × lag.
    const double lag = stepped ? 0.004 : 0.0;
    if (auto broken = rate_window_program(lim, time, in, rate, leaky ? 0.0 : burst, lag)) {
      return std::string(leaky ? "leaky bucket" : "gcra") + (stepped ? " on a lagging clock" : "") +
             ", rate " + std::to_string(rate) + (leaky ? ", queue " : ", burst ") +
             std::to_string(burst) + ": " + *broken;
    }
    return std::nullopt;
  };
  doorman::manual_clock time;
  if (leaky) {
    if (stepped) {
      doorman::basic_leaky_bucket_limiter<stepped_clock> lim({.rate = rate, .queue = burst},
                                                             stepped_clock{{&time}});
      return run(lim, time);
    }
    doorman::basic_leaky_bucket_limiter<doorman::manual_clock_ref> lim(
        {.rate = rate, .queue = burst}, doorman::manual_clock_ref{&time});
    return run(lim, time);
  }
  if (stepped) {
    doorman::basic_rate_limiter<stepped_clock> lim({.rate = rate, .burst = burst},
                                                   stepped_clock{{&time}});
    return run(lim, time);
  }
  doorman::basic_rate_limiter<doorman::manual_clock_ref> lim({.rate = rate, .burst = burst},
                                                             doorman::manual_clock_ref{&time});
  return run(lim, time);
}

}  // namespace doorman_fuzz
