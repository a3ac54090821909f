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

#include <doorman/core/time.hpp>
#include <doorman/limit/budget_counter.hpp>
#include <doorman/limit/clock.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
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

}  // namespace doorman_fuzz
