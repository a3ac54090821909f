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

#include <nlohmann/json.hpp>

#include "doorman/core/messages.hpp"
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

inline bool read_lease_member(wire_reader& in, std::optional<lease_info>& out) {
  if (in.null()) return true;  // as absent
  lease_info l;
  unsigned seen = 0;
  const bool ok = in.object([&](std::string_view key) {
    if (key == "capacity") return first_time(seen, 1) && in.number(l.capacity);
    if (key == "expires_in") return first_time(seen, 2) && in.number(l.expires_in);
    if (key == "refresh_interval") return first_time(seen, 4) && in.number(l.refresh_interval);
    return false;
  });
  if (!ok || seen != 7) return false;
  out = l;
  return true;
}

// An optional integer member (null: absent).
inline bool read_optional_integer(wire_reader& in, std::int64_t& out) {
  return in.null() || in.integer(out);
}

// Params of both capacity calls: `{"<id_key>": "...", "resources": [...]}`, each resource read
// by `member(resource, key, seen)` (which marks what it read in `seen`) and complete when
// `seen & required == required`.
template <class Request, class Member>
bool read_capacity_params(wire_reader& in, std::string_view id_key, std::string& id, Request& out,
                          unsigned required, Member&& member) {
  unsigned seen = 0;
  const bool ok = in.object([&](std::string_view key) {
    if (key == id_key) return first_time(seen, 1) && in.string(id);
    if (key != "resources" || !first_time(seen, 2)) return false;
    return in.array(request_limits::max_resources, [&] {
      auto& r = out.resources.emplace_back();
      unsigned got = 0;
      return in.object([&](std::string_view k) { return member(r, k, got); }) &&
             (got & required) == required;
    });
  });
  return ok && seen == 3;
}

/// `get_capacity` params in the plain form.
inline bool read_params(wire_reader& in, capacity_request& out) {
  return read_capacity_params(in, "client_id", out.client_id, out, 3,
                              [&](resource_request& r, std::string_view k, unsigned& got) {
                                if (k == "resource_id")
                                  return first_time(got, 1) && in.string(r.resource_id);
                                if (k == "wants") return first_time(got, 2) && in.number(r.wants);
                                if (k == "priority")
                                  return first_time(got, 4) &&
                                         read_optional_integer(in, r.priority);
                                if (k == "has")
                                  return first_time(got, 8) && read_lease_member(in, r.has);
                                return false;
                              });
}

inline bool read_band(wire_reader& in, priority_band& b) {
  unsigned got = 0;
  return in.object([&](std::string_view k) {
    if (k == "priority") return first_time(got, 1) && read_optional_integer(in, b.priority);
    if (k == "num_clients") return first_time(got, 2) && in.integer(b.num_clients);
    if (k == "wants") return first_time(got, 4) && in.number(b.wants);
    return false;
  }) && (got & 6) == 6;
}

/// `get_server_capacity` params in the plain form.
inline bool read_params(wire_reader& in, server_capacity_request& out) {
  return read_capacity_params(
      in, "server_id", out.server_id, out, 9,
      [&](server_resource_request& r, std::string_view k, unsigned& got) {
        if (k == "resource_id") return first_time(got, 1) && in.string(r.resource_id);
        if (k == "outstanding") {
          return first_time(got, 2) && (in.null() || in.number(r.outstanding));
        }
        if (k == "has") return first_time(got, 4) && read_lease_member(in, r.has);
        if (k != "wants" || !first_time(got, 8)) return false;
        return in.array(request_limits::max_resources,
                        [&] { return read_band(in, r.wants.emplace_back()); });
      });
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

inline void write_mastership(std::string& out, const mastership_info& m) {
  out += m.is_master ? R"({"is_master":true,"master":)" : R"({"is_master":false,"master":)";
  if (m.master) {
    write_string(out, *m.master);
  } else {
    out += "null";
  }
  out += '}';
}

// The members every grant has, in the DOM's (sorted) order after `algorithm`.
template <class Grant>
void write_grant_tail(std::string& out, const Grant& g) {
  out += R"("gets":{"capacity":)";
  write_number(out, g.gets.capacity);
  out += R"(,"expires_in":)";
  write_number(out, g.gets.expires_in);
  out += R"(,"refresh_interval":)";
  write_number(out, g.gets.refresh_interval);
  out += R"(},"resource_id":)";
  write_string(out, g.resource_id);
  out += R"(,"safe_capacity":)";
  write_number(out, g.safe_capacity);
  out += '}';
}

inline void write_grant(std::string& out, const resource_grant& g) {
  out += '{';
  write_grant_tail(out, g);
}

inline void write_grant(std::string& out, const server_resource_grant& g) {
  out += R"({"algorithm":)";
  out += to_line(nlohmann::json(g.algorithm));
  out += ',';
  write_grant_tail(out, g);
}

/// Appends the answer line (without the newline) to a capacity call: `id` is the request's id
/// as written (a plain string with its quotes, an integer, or null).
template <class Response>
void write_capacity_answer(std::string& out, std::string_view id, const Response& r) {
  out += R"({"id":)";
  out += id;
  out += R"(,"jsonrpc":"2.0","result":{"mastership":)";
  write_mastership(out, r.mastership);
  out += R"(,"resources":[)";
  for (std::size_t i = 0; i < r.resources.size(); ++i) {
    if (i) out += ',';
    write_grant(out, r.resources[i]);
  }
  out += "]}}";
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
