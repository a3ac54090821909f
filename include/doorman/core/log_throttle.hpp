#pragma once

/// \file
/// Repetitive log lines, summarized (sans-I/O): one line of a kind passes per interval; the
/// ones held back meanwhile are counted, and the next line of that kind to pass says how many
/// there were. After a restart, 10⁵ clients reporting leases the engine does not know give a few
/// lines, not 10⁵.
///
///     doorman::log_throttle<clock::time_point> throttle(doorman::seconds(10));
///     if (auto line = throttle.pass("client reports an unknown lease; ...", now)) log(*line);

#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "doorman/core/time.hpp"

namespace doorman {

template <class TimePoint>
class log_throttle {
 public:
  explicit log_throttle(seconds interval) : interval_(interval) {}

  /// `line` to log now (with the count held back since the last one, if any), or nothing when
  /// a line of this kind passed less than the interval ago.
  [[nodiscard]] std::optional<std::string> pass(std::string line, TimePoint now) {
    if (passed_ && now < next_) {
      ++held_;
      return std::nullopt;
    }
    next_ = now + to_duration<typename TimePoint::duration>(interval_.count());
    passed_ = true;
    if (held_ == 0) return line;
    line += fmt::format(" (and {} more like it since the last such line)", held_);
    held_ = 0;
    return line;
  }

  /// Hands `line` to `sink` when `pass` lets it through; nothing with a null sink.
  template <class Sink>
  void log(const Sink& sink, std::string line, TimePoint now) {
    if (!sink) return;
    if (auto l = pass(std::move(line), now)) sink(*l);
  }

  /// Lines held back since the last one passed.
  [[nodiscard]] std::uint64_t held() const noexcept { return held_; }

 private:
  seconds interval_;
  TimePoint next_{};
  bool passed_ = false;
  std::uint64_t held_ = 0;
};

}  // namespace doorman
