#pragma once

/// \file
/// The hot path of `handle_line`: `get_capacity` and `get_server_capacity` read straight into
/// the request structs by a streaming reader, and their answers written straight into the
/// output buffer, without a JSON DOM.
///
/// The streaming reader takes only the plain form of these requests: the members it knows, each
/// once; strings of printable ASCII without escapes; integer ids; numbers a double holds. On
/// anything else it gives up before any state is touched, and `handle_line` takes the DOM path,
/// whose answers (every error message included) are the reference: an answer written here is
/// byte for byte what the DOM path writes for the same line (tests/protocol_test.cpp compares
/// the two on generated and mutated lines, and the `dispatch` fuzz target does too).

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "doorman/core/messages.hpp"
#include "doorman/protocol/codec.hpp"
#include "doorman/protocol/json_rpc.hpp"

namespace doorman::detail {

/// A pull reader over one line of JSON, for the plain subset described above. Every read
/// returns false, and the reader stays failed, on anything outside that subset.
class wire_reader {
 public:
  explicit wire_reader(std::string_view text) noexcept
      : p_(text.data()), end_(text.data() + text.size()) {}

  [[nodiscard]] bool at_end() noexcept {
    skip_space();
    return p_ == end_;
  }

  /// The next character after white space (0 at the end).
  [[nodiscard]] char peek() noexcept {
    skip_space();
    return p_ == end_ ? '\0' : *p_;
  }

  bool expect(char c) noexcept {
    if (peek() != c) return false;
    ++p_;
    return true;
  }

  bool null() noexcept {
    if (peek() != 'n' || end_ - p_ < 4 || std::memcmp(p_, "null", 4) != 0) return false;
    p_ += 4;
    return true;
  }

  /// A string of printable ASCII without escapes (its content, without the quotes).
  bool string(std::string_view& out) noexcept {
    if (!expect('"')) return false;
    const char* start = p_;
    for (; p_ != end_; ++p_) {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        out = std::string_view(start, static_cast<std::size_t>(p_ - start));
        ++p_;
        return true;
      }
      if (c < 0x20 || c > 0x7e || c == '\\') return false;
    }
    return false;
  }

  bool string(std::string& out) {
    std::string_view s;
    if (!string(s)) return false;
    out.assign(s);
    return true;
  }

  /// A number token in JSON's grammar; `integral` when it has no fraction and no exponent.
  bool number_token(std::string_view& text, bool& integral) noexcept {
    skip_space();
    const char* start = p_;
    if (p_ != end_ && *p_ == '-') ++p_;
    if (p_ == end_ || !digit(*p_)) return false;
    if (*p_++ != '0') skip_digits();
    integral = true;
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      if (p_ == end_ || !digit(*p_)) return false;
      skip_digits();
      integral = false;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !digit(*p_)) return false;
      skip_digits();
      integral = false;
    }
    text = std::string_view(start, static_cast<std::size_t>(p_ - start));
    return true;
  }

  /// A number as a double; refuses what would overflow or underflow it.
  bool number(double& out) noexcept {
    std::string_view text;
    bool integral = false;
    if (!number_token(text, integral)) return false;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), out);
    if (out == 0) out = 0;  // -0 is read as 0, as the DOM path (json_reader::number) reads it
    return r.ec == std::errc{} && r.ptr == text.data() + text.size();
  }

  /// An integer token of at most 18 digits (so within 64 bits), as written.
  bool integer_token(std::string_view& text) noexcept {
    bool integral = false;
    if (!number_token(text, integral) || !integral) return false;
    return text.size() - (text[0] == '-' ? 1 : 0) <= 18;
  }

  bool integer(std::int64_t& out) noexcept {
    std::string_view text;
    if (!integer_token(text)) return false;
    return std::from_chars(text.data(), text.data() + text.size(), out).ec == std::errc{};
  }

  /// An object: `member(key)` reads each member's value, returning false to give up.
  template <class Member>
  bool object(Member&& member) {
    if (!expect('{')) return false;
    if (expect('}')) return true;
    for (;;) {
      std::string_view key;
      if (!string(key) || !expect(':') || !member(key)) return false;
      if (expect(',')) continue;
      return expect('}');
    }
  }

  /// An array of at most `max` elements: `element()` reads each.
  template <class Element>
  bool array(std::size_t max, Element&& element) {
    if (!expect('[')) return false;
    if (expect(']')) return true;
    for (std::size_t n = 1;; ++n) {
      if (n > max || !element()) return false;
      if (expect(',')) continue;
      return expect(']');
    }
  }

 private:
  static bool digit(char c) noexcept { return c >= '0' && c <= '9'; }
  void skip_digits() noexcept {
    while (p_ != end_ && digit(*p_))
      ++p_;
  }
  void skip_space() noexcept {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r'))
      ++p_;
  }

  const char* p_;
  const char* end_;
};

/// Marks member `bit` of an object as seen; false when it was already (a duplicate, which the
/// DOM path resolves its own way).
inline bool first_time(unsigned& seen, unsigned bit) noexcept {
  if (seen & bit) return false;
  seen |= bit;
  return true;
}

template <described_message T>
bool read_fields(wire_reader& in, T& out);

// Reads one field's value into `out` (its member). An optional field may be null (absent). A
// type the streaming reader does not take, or a number outside the field's range, gives up (the
// DOM path reads it, and names the problem).
template <class F, class M>
bool read_value(wire_reader& in, const F& f, M& out) {
  if (f.when != presence::required && in.null()) return true;
  if constexpr (std::is_same_v<M, std::string>) {
    return in.string(out);
  } else if constexpr (std::is_same_v<M, double>) {
    return in.number(out) && (!f.bounded() || (out >= f.low && out <= f.high));
  } else if constexpr (std::is_same_v<M, std::int64_t>) {
    return in.integer(out) && (!f.bounded() || (static_cast<double>(out) >= f.low &&
                                                static_cast<double>(out) <= f.high));
  } else if constexpr (described_message<M>) {
    return read_fields(in, out);
  } else if constexpr (is_optional_v<M>) {
    if constexpr (described_message<typename M::value_type>) {
      typename M::value_type x;
      if (!read_fields(in, x)) return false;
      out = std::move(x);
      return true;
    } else {
      return false;
    }
  } else if constexpr (is_vector_v<M> && described_message<typename M::value_type>) {
    return in.array(f.most, [&] { return read_fields(in, out.emplace_back()); });
  } else {
    return false;
  }
}

/// Reads a described message (core/messages.hpp's `wire_message`) in the plain form: each
/// member one of its fields, at most once, every required one present. False to give up.
template <described_message T>
bool read_fields(wire_reader& in, T& out) {
  constexpr auto& fields = wire_message<T>::fields;
  unsigned seen = 0;
  const bool ok = in.object([&](std::string_view key) {
    bool known = false;
    bool good = false;
    for_each_field<T>([&](auto i, const auto& f) {
      constexpr std::string_view name = std::get<decltype(i)::value>(fields).name;
      if (known || key != name) return;
      known = true;
      good = first_time(seen, 1u << i()) && read_value(in, f, out.*(f.member));
    });
    return known && good;
  });
  constexpr unsigned required = required_fields<T>();
  return ok && (seen & required) == required;
}

// ---- writing ---------------------------------------------------------------------------------

/// Appends `v` as nlohmann/json writes a double (its own shortest-digits conversion, so that
/// both paths write the same bytes); null when not finite, as it does.
inline void write_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  std::array<char, 64> buffer;
  char* end = nlohmann::detail::to_chars(buffer.data(), buffer.data() + buffer.size(), v);
  out.append(buffer.data(), static_cast<std::size_t>(end - buffer.data()));
}

/// Appends `s` as a JSON string: as is when it needs no escaping, else as nlohmann/json writes
/// it (`to_line`).
inline void write_string(std::string& out, std::string_view s) {
  bool plain = true;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    plain = plain && u >= 0x20 && u <= 0x7e && c != '"' && c != '\\';
  }
  if (!plain) {
    out += to_line(nlohmann::json(s));
    return;
  }
  out += '"';
  out += s;
  out += '"';
}

// `"<name>":` for field `I` of `T`, made at compile time.
template <described_message T, std::size_t I>
inline constexpr auto quoted_key = [] {
  constexpr std::string_view name = std::get<I>(wire_message<T>::fields).name;
  std::array<char, name.size() + 3> out{};
  out[0] = '"';
  for (std::size_t i = 0; i < name.size(); ++i)
    out[i + 1] = name[i];
  out[name.size() + 1] = '"';
  out[name.size() + 2] = ':';
  return out;
}();

template <described_message T>
void write_fields(std::string& out, const T& v);

inline void write_value(std::string& out, const std::string& v) {
  write_string(out, v);
}
inline void write_value(std::string& out, double v) {
  write_number(out, v);
}
inline void write_value(std::string& out, bool v) {
  out += v ? "true" : "false";
}
template <std::integral I>
requires(!std::same_as<I, bool>) void write_value(std::string& out, I v) {
  std::array<char, 24> buffer;
  const auto r = std::to_chars(buffer.data(), buffer.data() + buffer.size(), v);
  out.append(buffer.data(), static_cast<std::size_t>(r.ptr - buffer.data()));
}
inline void write_value(std::string& out, const algorithm_config& v) {
  out += to_line(nlohmann::json(v));
}
template <described_message T>
void write_value(std::string& out, const T& v) {
  write_fields(out, v);
}
template <class T>
void write_value(std::string& out, const std::vector<T>& v) {
  out += '[';
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    write_value(out, v[i]);
  }
  out += ']';
}

// Field `I` of `v`, with the comma before it unless it is the first written.
template <described_message T, std::size_t I>
void write_member(std::string& out, const T& v, bool& first) {
  constexpr auto f = std::get<I>(wire_message<T>::fields);
  const auto& m = v.*(f.member);
  constexpr bool optional = is_optional_v<std::remove_cvref_t<decltype(m)>>;
  if constexpr (optional) {
    if (!m && f.when != presence::null_when_absent) return;
  } else if constexpr (is_vector_v<std::remove_cvref_t<decltype(m)>>) {
    if (m.empty() && f.when != presence::required) return;  // an optional list left empty
  }
  if (!first) out += ',';
  first = false;
  out.append(quoted_key<T, I>.data(), quoted_key<T, I>.size());
  if constexpr (optional) {
    if (m) {
      write_value(out, *m);
    } else {
      out += "null";
    }
  } else {
    write_value(out, m);
  }
}

/// Appends a described message as nlohmann/json writes it (`to_line(json(v))`): its fields
/// sorted by name, numbers and strings as it writes them.
template <described_message T>
void write_fields(std::string& out, const T& v) {
  constexpr auto order = fields_by_name<T>();
  out += '{';
  bool first = true;
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (write_member<T, order[K]>(out, v, first), ...);
  }
  (std::make_index_sequence<order.size()>{});
  out += '}';
}

/// Appends the answer line (without the newline) to a capacity call: `id` is the request's id
/// as written (a plain string with its quotes, an integer, or null).
template <class Response>
void write_capacity_answer(std::string& out, std::string_view id, const Response& r) {
  out += R"({"id":)";
  out += id;
  out += R"(,"jsonrpc":"2.0","result":)";
  write_fields(out, r);
  out += '}';
}

/// A request envelope in the plain form: `id` as written (empty for a notification).
struct plain_envelope {
  std::string_view id;
  std::string_view method;
  bool has_params = false;
};

/// Reads the envelope of a hot-method request, calling `params(method)` at the params member
/// (which must come after the method). False to give up.
template <class Params>
bool read_envelope(wire_reader& in, plain_envelope& env, Params&& params) {
  unsigned seen = 0;
  const bool ok = in.object([&](std::string_view key) {
    if (key == "jsonrpc") {
      std::string_view v;
      return first_time(seen, 1) && in.string(v) && v == "2.0";
    }
    if (key == "id") {
      if (!first_time(seen, 2)) return false;
      const char c = in.peek();
      std::string_view text;
      if (c == 'n') return in.null() && (env.id = "null", true);
      if (c == '"') {
        if (!in.string(text)) return false;
        env.id = std::string_view(text.data() - 1, text.size() + 2);  // with the quotes
        return true;
      }
      return in.integer_token(text) && text != "-0" && (env.id = text, true);
    }
    if (key == "method") return first_time(seen, 4) && in.string(env.method);
    if (key == "params") {
      return first_time(seen, 8) && (seen & 4) && (env.has_params = true, params(env.method));
    }
    return false;
  });
  return ok && (seen & 13) == 13 && in.at_end();
}

}  // namespace doorman::detail
