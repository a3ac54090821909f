#pragma once

/// \file
/// Globs for resource templates, with the semantics of Go's `filepath.Match`, which Doorman uses:
/// `*` matches any run of bytes other than `/` (also empty), `?` one byte other than `/`,
/// `[abc]`, `[a-z]` and `[!a-z]` (or `[^a-z]`) one byte of a set (`/` included, when listed),
/// `\x` the byte x itself. So `fair*` matches `fair-1` but not `fair/shard-1`; `fair/*` does.
/// Matching is on bytes.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

namespace detail {

// The pattern positions a matcher holds, as flags, and the lowest and highest set (`lo > hi`:
// none), so that a step visits only those: a literal pattern (an identity's) holds one.
struct glob_positions {
  unsigned char* at;
  std::size_t lo;
  std::size_t hi;
};

// One step of the matcher: from the pattern positions in `from` (each already past any `*` it
// may skip), the positions after reading byte `c` into `to` (whose flags are clear outside its
// range, and cleared inside it first), closed over `*` again.
inline void glob_step(std::string_view p, const glob_positions& from, glob_positions& to, char c) {
  if (to.lo <= to.hi) std::fill(to.at + to.lo, to.at + to.hi + 1, static_cast<unsigned char>(0));
  to.lo = p.size() + 1;
  to.hi = 0;
  const auto set = [&](std::size_t j) {
    to.at[j] = 1;
    to.lo = std::min(to.lo, j);
    to.hi = std::max(to.hi, j);
  };
  for (std::size_t i = from.lo; i <= from.hi && i < p.size(); ++i) {
    if (!from.at[i]) continue;
    const char pc = p[i];
    if (pc == '*') {
      if (c != '/') set(i);  // the star takes c and stays
    } else if (pc == '?') {
      if (c != '/') set(i + 1);
    } else if (pc == '[') {
      bool matched = false;
      const std::size_t end = glob_match_class(p, i, c, matched);
      if (end != std::string_view::npos && matched) set(end);
    } else {
      const bool escaped = pc == '\\' && i + 1 < p.size();
      if ((escaped ? p[i + 1] : pc) == c) set(i + (escaped ? 2 : 1));
    }
  }
  for (std::size_t i = to.lo; i <= to.hi && i < p.size(); ++i)  // a star may also take nothing
    if (to.at[i] && p[i] == '*') set(i + 1);
}

}  // namespace detail

/// Appends `text` to `out` with the bytes a glob treats specially (`* ? [ ] \ /`), `%`, the
/// bytes of `extra`, and bytes outside printable ASCII written `%XX` (so distinct texts stay
/// distinct, and a `*` of a glob matches the result). Stops before the first byte whose form
/// would take `out` past `max_size` bytes.
inline void append_escaped(std::string& out, std::string_view text, std::string_view extra = {},
                           std::size_t max_size = std::string::npos) {
  constexpr char hex[] = "0123456789ABCDEF";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    const bool special = c == '*' || c == '?' || c == '[' || c == ']' || c == '\\' || c == '/' ||
                         c == '%' || c <= 0x20 || c >= 0x7f ||
                         extra.find(ch) != std::string_view::npos;
    if (out.size() + (special ? 3 : 1) > max_size) return;
    if (special) {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
}

/// One piece of a key made from outside text (a rule's descriptor entry, an RLQS bucket's key
/// or value): escaped whole (`append_escaped`, `=` too) when at most `whole` bytes; a longer
/// one by its first `whole` bytes and `~` with the 16 hex digits of a 64-bit FNV-1a hash of
/// the whole, so pieces that differ past that count apart while a key stays bounded (no piece
/// of at most `whole` bytes can read the same: it would be longer).
inline void append_key_piece(std::string& key, std::string_view piece, std::size_t whole) {
  append_escaped(key, piece.substr(0, whole), "=");
  if (piece.size() <= whole) return;
  std::uint64_t h = 0xcbf2'9ce4'8422'2325;
  for (const char c : piece)
    h = (h ^ static_cast<unsigned char>(c)) * 0x0000'0100'0000'01b3;
  key += '~';
  for (int shift = 60; shift >= 0; shift -= 4)
    key += "0123456789abcdef"[(h >> shift) & 0xf];
}

/// Extends a key with `/<k>=<value>`, each a piece (`append_key_piece`), so that distinct
/// entries, or lists of them, give distinct keys.
inline void append_key_entry(std::string& key, std::string_view k, std::string_view value,
                             std::size_t whole) {
  key += '/';
  append_key_piece(key, k, whole);
  key += '=';
  append_key_piece(key, value, whole);
}

/// Whether `text` matches the glob `pattern` (assumed valid: see `glob_error`), as Go's
/// `filepath.Match` (Doorman's) does: `*` and `?` never match a `/`. Runs the pattern as a
/// set of positions over the text: O(pattern x text) steps at most, so hostile ids cannot make
/// it exponential, and O(text) for a pattern that holds one position at a time (a literal, as
/// an access rule's `{identity}`, with a `*` at its end).
[[nodiscard]] inline bool glob_match(std::string_view pattern, std::string_view text) {
  // The literal head (an access rule's escaped identity), byte by byte.
  std::size_t i = 0;
  std::size_t j = 0;
  while (i < pattern.size() && pattern[i] != '*' && pattern[i] != '?' && pattern[i] != '[') {
    const bool escaped = pattern[i] == '\\' && i + 1 < pattern.size();
    if (j == text.size() || text[j] != pattern[escaped ? i + 1 : i]) return false;
    i += escaped ? 2 : 1;
    ++j;
  }
  pattern.remove_prefix(i);
  text.remove_prefix(j);
  constexpr std::size_t inline_size = 512;
  std::array<unsigned char, 2 * inline_size> fixed;  // set as used
  std::vector<unsigned char> heap;
  unsigned char* cur = fixed.data();
  if (pattern.size() + 1 > inline_size) {
    heap.assign(2 * (pattern.size() + 1), 0);
    cur = heap.data();
  }
  detail::glob_positions from{cur, 0, 0};
  detail::glob_positions to{cur + pattern.size() + 1, 1, 0};
  std::fill(cur, cur + 2 * (pattern.size() + 1), static_cast<unsigned char>(0));
  cur[0] = 1;
  for (std::size_t k = 0; k < pattern.size() && pattern[k] == '*'; ++k) {
    cur[k + 1] = 1;
    from.hi = k + 1;
  }
  for (const char c : text) {
    detail::glob_step(pattern, from, to, c);
    std::swap(from, to);
    if (from.lo > from.hi) return false;  // no position left: nothing more can match
  }
  return from.at[pattern.size()] != 0;
}

}  // namespace doorman
