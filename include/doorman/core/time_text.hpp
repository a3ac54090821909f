#pragma once

/// \file
/// Times as people read them, for the status page and the CLI: a Unix time as a UTC date
/// (`2026-11-29 00:00 UTC`), and a span as the two largest units it holds (`8 h 53 min`,
/// `12 min 5 s`, `42 s`, `3.6 s`), never a raw count of seconds.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <string>

#include <fmt/chrono.h>
#include <fmt/format.h>

namespace doorman {

/// A Unix time (seconds) as `2026-11-29 00:00 UTC`.
[[nodiscard]] inline std::string utc_text(std::int64_t unix_seconds) {
  return fmt::format("{:%Y-%m-%d %H:%M} UTC", fmt::gmtime(static_cast<std::time_t>(unix_seconds)));
}

/// A span of `span` seconds as its two largest units: `2 d 4 h`, `8 h 53 min`, `12 min 5 s`,
/// `42 s`, and under 10 s with a tenth (`3.6 s`); a zero second unit is left out (`1 h`).
/// Negative or not finite: `-`.
[[nodiscard]] inline std::string duration_text(double span) {
  if (!(span >= 0) || !std::isfinite(span)) return "-";
  if (span < 9.95) return fmt::format("{:.1f} s", span);
  const auto s = static_cast<std::int64_t>(std::llround(std::min(span, 1e15)));
  const auto two = [](std::int64_t big, const char* big_unit, std::int64_t small,
                      const char* small_unit) {
    return small == 0 ? fmt::format("{} {}", big, big_unit)
                      : fmt::format("{} {} {} {}", big, big_unit, small, small_unit);
  };
  if (s < 60) return fmt::format("{} s", s);
  if (s < 3600) return two(s / 60, "min", s % 60, "s");
  const std::int64_t m = (s + 30) / 60;  // to the nearest minute
  if (m < 24 * 60) return two(m / 60, "h", m % 60, "min");
  const std::int64_t h = (m + 30) / 60;  // to the nearest hour
  return two(h / 24, "d", h % 24, "h");
}

}  // namespace doorman
