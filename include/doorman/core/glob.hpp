#pragma once

/// \file
/// Shell-style globs for resource templates: `*` matches any run of bytes (also empty), `?` one
/// byte, `[abc]`, `[a-z]` and `[!a-z]` (or `[^a-z]`) one byte of a set, `\x` the byte x itself.
/// Matching is on bytes; `/` has no special meaning (resource ids are opaque).

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace doorman {

namespace detail {

// Reads the class starting at pattern[i] == '[': calls `range(lo, hi)` for each member (a
// single byte has lo == hi) and sets `negate`. Returns the index after the closing ']', or npos
// when the class is not terminated. The one reading of a class: matching and validation both
// use it, so validation checks exactly the ranges the matcher will test.
template <class Range>
std::size_t glob_walk_class(std::string_view p, std::size_t i, bool& negate, Range&& range) {
  ++i;  // past '['
  negate = false;
  if (i < p.size() && (p[i] == '!' || p[i] == '^')) {
    negate = true;
    ++i;
  }
  bool first = true;
  while (i < p.size() && (p[i] != ']' || first)) {
    first = false;
    char lo = p[i];
    if (lo == '\\') {
      if (++i == p.size()) return std::string_view::npos;
      lo = p[i];
    }
    char hi = lo;
    if (i + 2 < p.size() && p[i + 1] == '-' && p[i + 2] != ']') {
      i += 2;
      hi = p[i];
      if (hi == '\\') {
        if (++i == p.size()) return std::string_view::npos;
        hi = p[i];
      }
    }
    range(static_cast<unsigned char>(lo), static_cast<unsigned char>(hi));
    ++i;
  }
  if (i >= p.size()) return std::string_view::npos;
  return i + 1;
}

// Matches the class starting at pattern[i] == '['. Returns the index after the closing ']'
// and sets `matched`, or npos when the class is not terminated.
inline std::size_t glob_match_class(std::string_view p, std::size_t i, char c, bool& matched) {
  const auto byte = static_cast<unsigned char>(c);
  bool found = false;
  bool negate = false;
  const std::size_t end = glob_walk_class(p, i, negate, [&](unsigned char lo, unsigned char hi) {
    if (lo <= byte && byte <= hi) found = true;
  });
  matched = found != negate;
  return end;
}

}  // namespace detail

/// Why `pattern` is not a valid glob, or nothing when it is.
[[nodiscard]] inline std::optional<std::string> glob_error(std::string_view pattern) {
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\') {
      if (i + 1 == pattern.size()) return "ends with an unescaped '\\'";
      ++i;
    } else if (pattern[i] == '[') {
      // A ']' right after '[' (or '[!') is a member, so a class is never empty.
      bool negate = false;
      bool reversed = false;
      const std::size_t end = detail::glob_walk_class(
          pattern, i, negate, [&](unsigned char lo, unsigned char hi) { reversed |= lo > hi; });
      if (end == std::string_view::npos)
        return "'[' at offset " + std::to_string(i) + " is never closed";
      if (reversed) return "reversed range in character class at offset " + std::to_string(i);
      i = end - 1;
    }
  }
  return std::nullopt;
}

/// Whether `text` matches the glob `pattern` (assumed valid: see `glob_error`). Backtracks over
/// the last `*` only: at most O(pattern x text) steps, so hostile ids cannot make it exponential.
[[nodiscard]] inline bool glob_match(std::string_view pattern, std::string_view text) noexcept {
  std::size_t p = 0;
  std::size_t t = 0;
  std::size_t star_p = std::string_view::npos;
  std::size_t star_t = 0;
  while (t < text.size()) {
    if (p < pattern.size()) {
      const char pc = pattern[p];
      if (pc == '*') {
        star_p = p++;
        star_t = t;
        continue;
      }
      if (pc == '?') {
        ++p;
        ++t;
        continue;
      }
      if (pc == '[') {
        bool matched = false;
        const std::size_t end = detail::glob_match_class(pattern, p, text[t], matched);
        if (end != std::string_view::npos && matched) {
          p = end;
          ++t;
          continue;
        }
      } else {
        const bool escaped = pc == '\\' && p + 1 < pattern.size();
        const char lit = escaped ? pattern[p + 1] : pc;
        if (lit == text[t]) {
          p += escaped ? 2 : 1;
          ++t;
          continue;
        }
      }
    }
    if (star_p == std::string_view::npos) return false;
    p = star_p + 1;
    t = ++star_t;
  }
  while (p < pattern.size() && pattern[p] == '*')
    ++p;
  return p == pattern.size();
}

}  // namespace doorman
