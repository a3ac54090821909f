#pragma once

/// \file
/// JSON forms of the wire messages (docs/protocol.md): free `to_json` / `from_json` found by ADL,
/// and `decode`, which never throws and names the offending field. Input from the network goes
/// through `decode`; `from_json` (which throws `protocol_error`) is for trusted data.
///
///     doorman::capacity_request req;
///     if (auto err = doorman::decode(params, req)) reply_error(-32602, err->message);
///
/// Unknown fields are ignored, so that peers may add fields without breaking older nodes.
/// `decode` checks shapes and types; the rules on values (ids, counts, numbers >= 0) are
/// `validate` in core, which the engine applies to every request, so they are checked once. Code
/// that decodes requests without handing them to an engine calls `validate` itself.

#include <cmath>
#include <concepts>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "doorman/core/config.hpp"
#include "doorman/core/json_reader.hpp"
#include "doorman/core/messages.hpp"

namespace doorman {

/// A message that failed to decode (thrown by `from_json` only).
class protocol_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

using json = nlohmann::json;

// The one JSON reader (doorman/core/json_reader.hpp); requests and answers are read with it.
using field_reader = json_reader;

template <class M>
inline constexpr bool is_optional_v = false;
template <class M>
inline constexpr bool is_optional_v<std::optional<M>> = true;
template <class M>
inline constexpr bool is_vector_v = false;
template <class M>
inline constexpr bool is_vector_v<std::vector<M>> = true;

template <described_message T>
std::optional<request_error> decode_fields(const json& j, const std::string& path, T& out);

// Reads field `f` into `out` (its member), as the field's type and presence say.
template <class F, class M>
void decode_field(field_reader& r, const F& f, M& out) {
  const bool required = f.when == presence::required;
  if constexpr (std::is_same_v<M, std::string>) {
    r.string(f.name, out, required);
  } else if constexpr (std::is_same_v<M, double>) {
    if (r.number(f.name, out, required) && f.bounded()) r.within(f.name, out, f.low, f.high);
  } else if constexpr (std::is_same_v<M, std::optional<double>>) {
    double v = 0;
    if (r.number(f.name, v, required) && (!f.bounded() || r.within(f.name, v, f.low, f.high)))
      out = v;
  } else if constexpr (std::is_same_v<M, std::int64_t>) {
    if (r.integer(f.name, out, required) && f.bounded())
      r.within(f.name, static_cast<double>(out), f.low, f.high);
  } else if constexpr (std::is_same_v<M, std::size_t> ||
                       std::is_same_v<M, std::optional<std::size_t>>) {
    std::int64_t n = 0;  // a count on the wire: an integer from 0 to 1e15
    if (r.integer(f.name, n, required) &&
        r.within(f.name, static_cast<double>(n), 0, request_limits::max_quantity))
      out = static_cast<std::size_t>(n);
  } else if constexpr (std::is_same_v<M, bool>) {
    r.boolean(f.name, out, required);
  } else if constexpr (std::is_same_v<M, std::optional<std::string>>) {
    std::string v;
    if (r.string(f.name, v, required)) out = std::move(v);
  } else if constexpr (std::is_same_v<M, std::vector<std::string>>) {
    r.array(
        f.name,
        [&](const json& e, const std::string& path) {
          if (!e.is_string()) {
            r.absorb(request_error{errc::invalid_params, path + ": must be a string", path});
            return;
          }
          out.push_back(e.get<std::string>());
        },
        f.most, required);
  } else if constexpr (std::is_same_v<M, algorithm_config>) {
    // As the configuration reads it, except that the kind is only checked to be a non-empty
    // string: the engine that adopts it checks it knows the kind.
    read_algorithm(r, f.name, out, {}, false);
  } else if constexpr (is_vector_v<M>) {
    r.array(
        f.name,
        [&](const json& e, const std::string& path) {
          typename M::value_type x;
          r.absorb(decode_fields(e, path, x));
          out.push_back(std::move(x));
        },
        f.most, required);
  } else if constexpr (is_optional_v<M>) {
    if (const json* v = r.object(f.name, required)) {
      typename M::value_type x;
      r.absorb(decode_fields(*v, r.at(f.name), x));
      out = std::move(x);
    }
  } else {
    if (const json* v = r.object(f.name, required)) r.absorb(decode_fields(*v, r.at(f.name), out));
  }
}

/// Reads a described message (core/messages.hpp's `wire_message`) at `path`, field by field in
/// the description's order; the first problem, naming its field.
template <described_message T>
std::optional<request_error> decode_fields(const json& j, const std::string& path, T& out) {
  field_reader r(j, path);
  for_each_field<T>([&](auto, const auto& f) { decode_field(r, f, out.*(f.member)); });
  return r.error();
}

}  // namespace detail

// ---- every described message ---------------------------------------------------------------

/// The JSON form of a described message: its fields by name; an absent optional left out, or
/// `null` when the field says `null_when_absent`.
template <described_message T>
void to_json(nlohmann::json& j, const T& v) {
  j = nlohmann::json::object();
  detail::for_each_field<T>([&](auto, const auto& f) {
    const auto& m = v.*(f.member);
    if constexpr (detail::is_optional_v<std::remove_cvref_t<decltype(m)>>) {
      if (m) {
        j[f.name] = *m;
      } else if (f.when == presence::null_when_absent) {
        j[f.name] = nullptr;
      }
    } else if constexpr (detail::is_vector_v<std::remove_cvref_t<decltype(m)>>) {
      if (!m.empty() || f.when == presence::required) j[f.name] = m;
    } else {
      j[f.name] = m;
    }
  });
}

/// Decodes the params of `get_capacity`, `get_server_capacity`, `count_hits` or
/// `release_capacity`, or the result of a capacity call, `count_hits`, `discovery`,
/// `release_capacity` or `status` (a node's own fields, `id`, `role`, `level`, are the caller's
/// to read); the error names the field (`params.resources[0].wants: ...`).
template <described_message T>
requires(std::same_as<T, capacity_request> || std::same_as<T, server_capacity_request> ||
         std::same_as<T, count_request> || std::same_as<T, release_request>)
    [[nodiscard]] std::optional<request_error> decode(const nlohmann::json& j, T& out) {
  out = {};
  return detail::decode_fields(j, "params", out);
}

template <described_message T>
requires(std::same_as<T, capacity_response> || std::same_as<T, server_capacity_response> ||
         std::same_as<T, discovery_response> || std::same_as<T, count_response> ||
         std::same_as<T, status_response> || std::same_as<T, release_response>)
    [[nodiscard]] std::optional<request_error> decode(const nlohmann::json& j, T& out) {
  out = {};
  return detail::decode_fields(j, "result", out);
}

// ---- requests ------------------------------------------------------------------------------

/// Decodes `status` params (absent, `{}` or `{"resource_id": ...}`).
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         status_request& out) {
  out = {};
  if (j.is_null()) return std::nullopt;
  return detail::decode_fields(j, "params", out);
}

/// Decodes `status` params with the page of leases (`offset`, `limit`).
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         status_params& out) {
  out = {};
  if (auto e = decode(j, out.request)) return e;
  if (j.is_null()) return std::nullopt;
  detail::field_reader r(j, "params");
  r.integer("offset", out.page.offset, false);
  std::int64_t limit = 0;
  if (r.integer("limit", limit, false)) out.page.limit = limit;
  return r.error();
}

/// `status` params as a channel sends them: `resource_id`, then `offset` and `limit` when set.
inline void to_json(nlohmann::json& j, const status_params& p) {
  j = p.request;
  if (p.page.offset != 0) j["offset"] = p.page.offset;
  if (p.page.limit) j["limit"] = *p.page.limit;
}

/// Throwing conversion for trusted input: `auto req = json.get<doorman::capacity_request>();`
template <class Message>
requires requires(const nlohmann::json& j, Message& m) {
  { decode(j, m) } -> std::same_as<std::optional<request_error>>;
}
void from_json(const nlohmann::json& j, Message& m) {
  m = Message{};
  if (auto e = decode(j, m)) throw protocol_error(e->message);
}

}  // namespace doorman
