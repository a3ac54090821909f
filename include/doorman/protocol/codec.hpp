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
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
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

inline std::optional<request_error> decode_lease(const json& j, const std::string& path,
                                                 lease_info& out) {
  field_reader r(j, path);
  r.number("capacity", out.capacity);
  r.number("expires_in", out.expires_in);
  r.number("refresh_interval", out.refresh_interval);
  return r.error();
}

// An optional lease object (`has`).
inline void read_lease(field_reader& r, const char* key, std::optional<lease_info>& out) {
  if (const json* v = r.object(key, false)) {
    lease_info l;
    r.absorb(decode_lease(*v, r.at(key), l));
    out = l;
  }
}

inline std::optional<request_error> decode_mastership(const json& j, const std::string& path,
                                                      mastership_info& out) {
  field_reader r(j, path);
  r.boolean("is_master", out.is_master);
  std::string master;
  if (r.string("master", master, false)) out.master = std::move(master);
  return r.error();
}

}  // namespace detail

// ---- lease and mastership ----------------------------------------------------------------

inline void to_json(nlohmann::json& j, const lease_info& l) {
  j = {{"capacity", l.capacity},
       {"expires_in", l.expires_in},
       {"refresh_interval", l.refresh_interval}};
}

inline void to_json(nlohmann::json& j, const mastership_info& m) {
  j = {{"is_master", m.is_master}, {"master", nullptr}};
  if (m.master) j["master"] = *m.master;
}

// ---- requests ------------------------------------------------------------------------------

inline void to_json(nlohmann::json& j, const capacity_request& r) {
  j = {{"client_id", r.client_id}, {"resources", nlohmann::json::array()}};
  for (const auto& x : r.resources) {
    nlohmann::json e = {
        {"resource_id", x.resource_id}, {"priority", x.priority}, {"wants", x.wants}};
    if (x.has) e["has"] = *x.has;
    j["resources"].push_back(std::move(e));
  }
}

inline void to_json(nlohmann::json& j, const server_capacity_request& r) {
  j = {{"server_id", r.server_id}, {"resources", nlohmann::json::array()}};
  for (const auto& x : r.resources) {
    nlohmann::json bands = nlohmann::json::array();
    for (const auto& b : x.wants) {
      bands.push_back(
          {{"priority", b.priority}, {"num_clients", b.num_clients}, {"wants", b.wants}});
    }
    nlohmann::json e = {{"resource_id", x.resource_id},
                        {"outstanding", x.outstanding},
                        {"wants", std::move(bands)}};
    if (x.has) e["has"] = *x.has;
    j["resources"].push_back(std::move(e));
  }
}

inline void to_json(nlohmann::json& j, const release_request& r) {
  j = {{"client_id", r.client_id}, {"resources", r.resources}};
}

inline void to_json(nlohmann::json& j, const status_request& r) {
  j = nlohmann::json::object();
  if (r.resource_id) j["resource_id"] = *r.resource_id;
}

namespace detail {

// A capacity request: the requester's id under `id_key` and its resources, each one's
// `resource_id` read here and its other fields by `more(reader, resource)`.
template <class Request, class More>
std::optional<request_error> decode_resources(const json& j, const char* id_key, std::string& id,
                                              Request& out, More&& more) {
  field_reader r(j, "params");
  r.string(id_key, id);
  r.array(
      "resources",
      [&](const json& e, const std::string& path) {
        field_reader x(e, path);
        typename decltype(out.resources)::value_type res;
        x.string("resource_id", res.resource_id);
        more(x, res);
        r.absorb(x.error());
        out.resources.push_back(std::move(res));
      },
      request_limits::max_resources);
  return r.error();
}

}  // namespace detail

/// Decodes `get_capacity` params; the error names the field (`params.resources[0].wants: ...`).
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         capacity_request& out) {
  out = {};
  return detail::decode_resources(j, "client_id", out.client_id, out,
                                  [](detail::field_reader& x, resource_request& res) {
                                    x.integer("priority", res.priority, false);
                                    x.number("wants", res.wants);
                                    detail::read_lease(x, "has", res.has);
                                  });
}

/// Decodes `get_server_capacity` params.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         server_capacity_request& out) {
  out = {};
  return detail::decode_resources(j, "server_id", out.server_id, out,
                                  [](detail::field_reader& x, server_resource_request& res) {
                                    x.number("outstanding", res.outstanding, false);
                                    detail::read_lease(x, "has", res.has);
                                    x.array(
                                        "wants",
                                        [&](const nlohmann::json& b, const std::string& bpath) {
                                          detail::field_reader y(b, bpath);
                                          priority_band band;
                                          y.integer("priority", band.priority, false);
                                          y.integer("num_clients", band.num_clients);
                                          y.number("wants", band.wants);
                                          x.absorb(y.error());
                                          res.wants.push_back(band);
                                        },
                                        request_limits::max_resources);
                                  });
}

/// Decodes `release_capacity` params.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         release_request& out) {
  out = {};
  detail::field_reader r(j, "params");
  r.string("client_id", out.client_id);
  r.array(
      "resources",
      [&](const nlohmann::json& e, const std::string& path) {
        if (!e.is_string()) {
          r.absorb(request_error{errc::invalid_params, path + ": must be a string", path});
          return;
        }
        out.resources.push_back(e.get<std::string>());
      },
      request_limits::max_resources);
  return r.error();
}

/// Decodes `status` params (absent, `{}` or `{"resource_id": ...}`).
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         status_request& out) {
  out = {};
  if (j.is_null()) return std::nullopt;
  detail::field_reader r(j, "params");
  std::string id;
  if (r.string("resource_id", id, false)) out.resource_id = std::move(id);
  return r.error();
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

// ---- responses -----------------------------------------------------------------------------

inline void to_json(nlohmann::json& j, const capacity_response& r) {
  j = {{"resources", nlohmann::json::array()}, {"mastership", r.mastership}};
  for (const auto& x : r.resources) {
    j["resources"].push_back(
        {{"resource_id", x.resource_id}, {"gets", x.gets}, {"safe_capacity", x.safe_capacity}});
  }
}

inline void to_json(nlohmann::json& j, const server_capacity_response& r) {
  j = {{"resources", nlohmann::json::array()}, {"mastership", r.mastership}};
  for (const auto& x : r.resources) {
    j["resources"].push_back({{"resource_id", x.resource_id},
                              {"gets", x.gets},
                              {"safe_capacity", x.safe_capacity},
                              {"algorithm", x.algorithm}});
  }
}

inline void to_json(nlohmann::json& j, const release_response& r) {
  j = {{"mastership", r.mastership}};
}

inline void to_json(nlohmann::json& j, const discovery_response& r) {
  j = {{"mastership", r.mastership}};
}

inline void to_json(nlohmann::json& j, const status_response& r) {
  j = {{"mastership", r.mastership}, {"resources", nlohmann::json::array()}};
  for (const auto& s : r.resources) {
    j["resources"].push_back({{"resource_id", s.resource_id},
                              {"capacity", s.capacity},
                              {"sum_has", s.sum_has},
                              {"sum_wants", s.sum_wants},
                              {"clients", s.clients},
                              {"subclients", s.subclients},
                              {"learning", s.learning},
                              {"algorithm", s.algorithm}});
  }
  if (!r.leases.empty()) {
    nlohmann::json leases = nlohmann::json::array();
    for (const auto& l : r.leases) {
      nlohmann::json bands = nlohmann::json::array();
      for (const auto& b : l.bands) {
        bands.push_back(
            {{"priority", b.priority}, {"num_clients", b.subclients}, {"wants", b.wants}});
      }
      leases.push_back({{"client_id", l.client_id},
                        {"has", l.has},
                        {"wants", l.wants},
                        {"subclients", l.subclients},
                        {"is_server", l.is_server},
                        {"outstanding", l.outstanding},
                        {"bands", std::move(bands)}});
    }
    j["leases"] = std::move(leases);
  }
  if (r.lease_count) j["lease_count"] = *r.lease_count;
}

namespace detail {

// The `mastership` object of a result, when present.
inline void decode_mastership_field(field_reader& r, mastership_info& out) {
  if (const auto* m = r.object("mastership")) {
    r.absorb(decode_mastership(*m, "result.mastership", out));
  }
}

// A capacity result: mastership and grants, each grant's common fields read here and any others
// by `more(reader, grant)`.
template <class Response, class More>
std::optional<request_error> decode_grants(const json& j, Response& out, More&& more) {
  out = {};
  field_reader r(j, "result");
  decode_mastership_field(r, out.mastership);
  r.array(
      "resources",
      [&](const json& e, const std::string& path) {
        field_reader x(e, path);
        typename decltype(out.resources)::value_type g;
        x.string("resource_id", g.resource_id);
        if (const auto* gets = x.object("gets")) {
          x.absorb(decode_lease(*gets, x.at("gets"), g.gets));
        }
        x.number("safe_capacity", g.safe_capacity, false);
        more(x, g);
        r.absorb(x.error());
        out.resources.push_back(std::move(g));
      },
      request_limits::max_resources);
  return r.error();
}

}  // namespace detail

/// Decodes a `get_capacity` result (from a server: untrusted too).
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         capacity_response& out) {
  return detail::decode_grants(j, out, [](detail::field_reader&, resource_grant&) {});
}

/// Decodes a `get_server_capacity` result. The algorithm is read as the configuration reads it
/// (`detail::read_algorithm`), except that its kind is only checked to be a non-empty string:
/// the engine that adopts it checks it knows the kind.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         server_capacity_response& out) {
  return detail::decode_grants(j, out, [](detail::field_reader& x, server_resource_grant& g) {
    detail::read_algorithm(x, "algorithm", g.algorithm, {}, false);
  });
}

/// Decodes a `discovery` (or `release_capacity`) result.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         discovery_response& out) {
  out = {};
  detail::field_reader r(j, "result");
  detail::decode_mastership_field(r, out.mastership);
  return r.error();
}

namespace detail {

// A count on the wire (clients, lease_count): an integer from 0 to 1e15.
inline void read_count(field_reader& r, const char* key, std::size_t& out) {
  std::int64_t n = 0;
  if (r.integer(key, n, false) && r.within(key, static_cast<double>(n), 0, 1e15))
    out = static_cast<std::size_t>(n);
}

inline std::optional<request_error> decode_resource_status(const json& j, const std::string& path,
                                                           resource_status& s) {
  field_reader x(j, path);
  x.string("resource_id", s.resource_id);
  for (auto [key, out] :
       {std::pair{"capacity", &s.capacity}, std::pair{"sum_has", &s.sum_has},
        std::pair{"sum_wants", &s.sum_wants}, std::pair{"subclients", &s.subclients}}) {
    if (x.number(key, *out, false)) x.within(key, *out, -1, request_limits::max_quantity);
  }
  read_count(x, "clients", s.clients);
  x.boolean("learning", s.learning, false);
  x.string("algorithm", s.algorithm, false);
  return x.error();
}

inline std::optional<request_error> decode_lease_status(const json& j, const std::string& path,
                                                        lease_status& l) {
  field_reader x(j, path);
  x.string("client_id", l.client_id);
  if (const auto* has = x.object("has", false)) x.absorb(decode_lease(*has, x.at("has"), l.has));
  if (x.number("wants", l.wants, false))
    x.within("wants", l.wants, 0, request_limits::max_quantity);
  x.boolean("is_server", l.is_server, false);
  return x.error();
}

}  // namespace detail

/// Decodes a `status` result (from a node: untrusted too): mastership, the resources and, when
/// present, the leases and their count. Numbers are bounded (quantities within ±1e15, counts
/// integers from 0 to 1e15), lists by the protocol's limits; the node's own fields (`id`,
/// `role`, `level`) are the caller's to read.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         status_response& out) {
  out = {};
  detail::field_reader r(j, "result");
  detail::decode_mastership_field(r, out.mastership);
  r.array(
      "resources",
      [&](const nlohmann::json& e, const std::string& path) {
        r.absorb(detail::decode_resource_status(e, path, out.resources.emplace_back()));
      },
      static_cast<std::size_t>(request_limits::max_status_limit), false);
  r.array(
      "leases",
      [&](const nlohmann::json& e, const std::string& path) {
        r.absorb(detail::decode_lease_status(e, path, out.leases.emplace_back()));
      },
      static_cast<std::size_t>(request_limits::max_status_limit), false);
  std::size_t count = 0;
  detail::read_count(r, "lease_count", count);
  if (j.is_object() && j.contains("lease_count") && !r.error()) out.lease_count = count;
  return r.error();
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
