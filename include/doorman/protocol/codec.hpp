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

#include "doorman/core/messages.hpp"

namespace doorman {

/// A message that failed to decode (thrown by `from_json` only).
class protocol_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

using json = nlohmann::json;

// Reads one JSON object field by field; the first problem wins and names its path.
class field_reader {
 public:
  field_reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) fail("", "must be an object");
  }

  [[nodiscard]] const std::optional<request_error>& error() const noexcept { return error_; }
  [[nodiscard]] std::string at(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  // Each returns whether the field was present and well typed (false on a problem, which is
  // recorded, or when an optional field is absent).
  bool string(const char* key, std::string& out, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_string()) return fail(key, "must be a string");
    out = v->get_ref<const std::string&>();
    return true;
  }
  bool number(const char* key, double& out, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_number()) return fail(key, "must be a number");
    out = v->get<double>();
    if (!std::isfinite(out)) return fail(key, "must be a finite number");
    return true;
  }
  bool integer(const char* key, std::int64_t& out, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (v->is_number_integer()) {
      if (v->is_number_unsigned() && v->get<std::uint64_t>() > INT64_MAX) {
        return fail(key, "must be an integer in the 64-bit range");
      }
      out = v->get<std::int64_t>();
      return true;
    }
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
        out = static_cast<std::int64_t>(d);
        return true;
      }
    }
    return fail(key, "must be an integer");
  }
  bool boolean(const char* key, bool& out, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_boolean()) return fail(key, "must be a boolean");
    out = v->get<bool>();
    return true;
  }
  // An array field: calls f(element, path_of_element) for each until one fails.
  template <class F>
  bool array(const char* key, F&& f, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_array()) return fail(key, "must be an array");
    if (v->size() > request_limits::max_resources) {
      return fail(key, "must hold at most 10000 elements");
    }
    for (std::size_t i = 0; i < v->size() && !error_; ++i) {
      f((*v)[i], at(key) + "[" + std::to_string(i) + "]");
    }
    return !error_;
  }
  const json* object(const char* key, bool required = true) {
    const json* v = find(key, required);
    if (!v) return nullptr;
    if (!v->is_object()) {
      fail(key, "must be an object");
      return nullptr;
    }
    return v;
  }
  void absorb(const std::optional<request_error>& e) {
    if (e && !error_) error_ = e;
  }
  // An optional lease object (`has`).
  void lease(const char* key, std::optional<lease_info>& out);

 private:
  const json* find(const char* key, bool required) {
    if (error_) return nullptr;
    const auto it = j_.find(key);
    if (it == j_.end() || (it->is_null() && !required)) {
      if (required) fail(key, "is required");
      return nullptr;
    }
    return &*it;
  }
  bool fail(std::string_view key, std::string_view reason) {
    if (!error_) {
      const std::string where = key.empty() ? path_ : at(key);
      error_ = request_error{errc::invalid_params, where + ": " + std::string(reason)};
    }
    return false;
  }

  const json& j_;
  std::string path_;
  std::optional<request_error> error_;
};

inline std::optional<request_error> decode_lease(const json& j, const std::string& path,
                                                 lease_info& out) {
  field_reader r(j, path);
  r.number("capacity", out.capacity);
  r.number("expires_in", out.expires_in);
  r.number("refresh_interval", out.refresh_interval);
  return r.error();
}

inline void field_reader::lease(const char* key, std::optional<lease_info>& out) {
  if (const json* v = object(key, false)) {
    lease_info l;
    absorb(decode_lease(*v, at(key), l));
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

inline void to_json(nlohmann::json& j, const algorithm_config& a) {
  j = {{"kind", a.kind},
       {"lease_length", a.lease_length.count()},
       {"refresh_interval", a.refresh_interval.count()},
       {"learning_mode_duration", a.learning_mode_duration.count()},
       {"parameters", a.parameters}};
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

/// Decodes `get_capacity` params; the error names the field (`params.resources[0].wants: ...`).
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         capacity_request& out) {
  out = {};
  detail::field_reader r(j, "params");
  r.string("client_id", out.client_id);
  r.array("resources", [&](const nlohmann::json& e, const std::string& path) {
    detail::field_reader x(e, path);
    resource_request res;
    x.string("resource_id", res.resource_id);
    x.integer("priority", res.priority, false);
    x.number("wants", res.wants);
    x.lease("has", res.has);
    r.absorb(x.error());
    out.resources.push_back(std::move(res));
  });
  return r.error();
}

/// Decodes `get_server_capacity` params.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         server_capacity_request& out) {
  out = {};
  detail::field_reader r(j, "params");
  r.string("server_id", out.server_id);
  r.array("resources", [&](const nlohmann::json& e, const std::string& path) {
    detail::field_reader x(e, path);
    server_resource_request res;
    x.string("resource_id", res.resource_id);
    x.number("outstanding", res.outstanding, false);
    x.lease("has", res.has);
    x.array("wants", [&](const nlohmann::json& b, const std::string& bpath) {
      detail::field_reader y(b, bpath);
      priority_band band;
      y.integer("priority", band.priority, false);
      y.integer("num_clients", band.num_clients);
      y.number("wants", band.wants);
      x.absorb(y.error());
      res.wants.push_back(band);
    });
    r.absorb(x.error());
    out.resources.push_back(std::move(res));
  });
  return r.error();
}

/// Decodes `release_capacity` params.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         release_request& out) {
  out = {};
  detail::field_reader r(j, "params");
  r.string("client_id", out.client_id);
  r.array("resources", [&](const nlohmann::json& e, const std::string& path) {
    if (!e.is_string()) {
      r.absorb(request_error{errc::invalid_params, path + ": must be a string"});
      return;
    }
    out.resources.push_back(e.get<std::string>());
  });
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
  r.array("resources", [&](const json& e, const std::string& path) {
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
  });
  return r.error();
}

}  // namespace detail

/// Decodes a `get_capacity` result (from a server: untrusted too).
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         capacity_response& out) {
  return detail::decode_grants(j, out, [](detail::field_reader&, resource_grant&) {});
}

/// Decodes a `get_server_capacity` result. The algorithm's kind is only checked to be a
/// non-empty string (the engine that adopts it checks it knows the kind); its durations must be
/// within `config_limits`, with lease_length >= refresh_interval.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         server_capacity_response& out) {
  return detail::decode_grants(j, out, [](detail::field_reader& x, server_resource_grant& g) {
    if (const auto* alg = x.object("algorithm")) {
      detail::field_reader a(*alg, x.at("algorithm"));
      double lease = 0, refresh = 0, learning = -1;
      a.string("kind", g.algorithm.kind);
      a.number("lease_length", lease);
      a.number("refresh_interval", refresh);
      a.number("learning_mode_duration", learning, false);
      if (const auto* p = a.object("parameters", false)) g.algorithm.parameters = *p;
      x.absorb(a.error());
      const auto bad = [&](const char* field, const char* why) {
        x.absorb(request_error{errc::invalid_params, a.at(field) + ": " + why});
      };
      if (g.algorithm.kind.empty()) bad("kind", "must not be empty");
      if (lease < config_limits::min_duration || lease > config_limits::max_duration) {
        bad("lease_length", "must be within the configuration's duration limits");
      }
      if (refresh < config_limits::min_duration || refresh > lease) {
        bad("refresh_interval", "must be within the limits and <= lease_length");
      }
      if (learning > config_limits::max_duration) {
        bad("learning_mode_duration", "must be within the configuration's duration limits");
      }
      g.algorithm.lease_length = seconds(lease);
      g.algorithm.refresh_interval = seconds(refresh);
      g.algorithm.learning_mode_duration = seconds(learning < 0 ? lease : learning);
    }
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
