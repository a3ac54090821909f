#pragma once

/// \file
/// Authorization by identity (docs/security.md). An access file maps identity patterns (globs
/// over the names that TLS client certificates carry) to roles and resource globs:
///
///     {"rules": [
///       {"identity": "admin.example", "roles": ["admin"]},
///       {"identity": "spiffe://example.org/app/*", "roles": ["client"],
///        "resources": ["api/*"], "max_client_ids": 16},
///       {"identity": "leaf-*.example", "roles": ["server"], "server_ids": ["{identity}"]}]}
///
/// The first rule whose `identity` matches decides. `client` may call `get_capacity` and
/// `release_capacity` with client ids matching `client_ids` (default: the identity itself, or
/// the identity followed by `#` and a name) on resources matching `resources` (default: all);
/// `server` may call `get_server_capacity` with a server id matching `server_ids` (default: the
/// identity) and `status` without a resource id (to learn its level); `admin` may call `status`
/// and read the admin pages. `{identity}` in `client_ids`
/// and `server_ids` stands for the caller's identity, taken literally (in a bracket class too).
/// `discovery` is open to everyone. `max_client_ids` (default 100) bounds the distinct client
/// ids one identity holds on one resource at once.
///
/// Why `#`: identities never contain one (a certificate naming one gives no identity), so the
/// client ids an identity owns by default, `I` and `I#name`, are never another identity's:
/// `spiffe://td/a` does not own `spiffe://td/a/w1`, the default id of another identity.
///
/// With client certificates and no access file, a node applies `access_policy::defaults()`:
/// every identity is a `client` of its own client ids and a `server`, nobody is `admin`.
/// `access_control` also enforces the bound on client ids without any policy (`max_client_ids`
/// of the node; per connection for callers without an identity). It is sans-I/O: the node asks
/// it about each decoded request, on its strand.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "doorman/core/config.hpp"
#include "doorman/core/glob.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/protocol/dispatch.hpp"

namespace doorman {

/// What an identity may do; a rule holds any combination.
enum class access_role : std::uint8_t { client = 1, server = 2, admin = 4 };

/// Each role with its name in an access file (the one place the names are written).
inline constexpr std::array<std::pair<access_role, std::string_view>, 3> access_role_names = {{
    {access_role::client, "client"},
    {access_role::server, "server"},
    {access_role::admin, "admin"},
}};

[[nodiscard]] inline std::string_view to_string(access_role r) noexcept {
  for (const auto& [role, name] : access_role_names)
    if (role == r) return name;
  return "?";
}

/// One rule of an access file.
struct access_rule {
  std::string identity;                 ///< glob over identities
  bool any_identity = false;            ///< matches every identity (the default policy)
  unsigned roles = 0;                   ///< `access_role` bits
  std::vector<std::string> resources;   ///< globs over resource ids
  bool all_resources = false;           ///< none given: every resource id (`/` included)
  std::vector<std::string> client_ids;  ///< globs; `{identity}` is the caller's identity
  std::vector<std::string> server_ids;  ///< globs; `{identity}` is the caller's identity
  std::size_t max_client_ids = 100;     ///< distinct client ids per resource, at once

  [[nodiscard]] bool has(access_role r) const noexcept {
    return (roles & static_cast<unsigned>(r)) != 0;
  }
};

/// Bounds of an access file.
struct access_limits {
  static constexpr std::size_t max_rules = 10'000;
  static constexpr std::size_t max_patterns = 1'000;  ///< per list of a rule
  static constexpr std::size_t max_client_ids = 1'000'000;
};

/// A parsed, validated access file.
class access_policy {
 public:
  access_policy() = default;

  /// Parses the JSON text; throws `config_error` naming the field (`rules[2].roles[0]: ...`).
  [[nodiscard]] static access_policy parse(std::string_view text) {
    auto doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
    if (doc.is_discarded()) throw config_error("", "not valid JSON");
    return from_json(doc);
  }

  /// Validates an access document already parsed (e.g. from YAML).
  [[nodiscard]] static access_policy from_json(const nlohmann::json& doc) {
    if (!doc.is_object()) throw config_error("", "expected an object with \"rules\"");
    for (const auto& [key, value] : doc.items()) {
      if (key != "rules") throw config_error(key, "unknown field");
    }
    const auto rules = doc.find("rules");
    if (rules == doc.end() || !rules->is_array()) throw config_error("rules", "expected a list");
    if (rules->size() > access_limits::max_rules) {
      throw config_error("rules", fmt::format("more than {} rules", access_limits::max_rules));
    }
    access_policy p;
    for (std::size_t i = 0; i < rules->size(); ++i)
      p.rules_.push_back(rule_from((*rules)[i], fmt::format("rules[{}]", i)));
    return p;
  }

  /// The policy of a node that requires client certificates but was given no access file:
  /// every identity is a `client` of its own client ids (`{identity}`, `{identity}#*`) on every
  /// resource, at most `max_client_ids` per resource (0: no bound), and a `server` with any
  /// server id; nobody is `admin`, so `status` with a resource id and the admin pages are
  /// refused. Callers without an identity may only call `discovery`.
  [[nodiscard]] static access_policy defaults(std::size_t max_client_ids) {
    access_rule r;
    r.identity = "(any identity)";
    r.any_identity = true;
    r.roles =
        static_cast<unsigned>(access_role::client) | static_cast<unsigned>(access_role::server);
    r.all_resources = true;
    r.client_ids = default_client_ids();
    r.max_client_ids = max_client_ids;
    access_policy p;
    p.rules_.push_back(std::move(r));
    p.built_in_ = true;
    return p;
  }

  /// The client ids an identity owns unless its rule says otherwise.
  [[nodiscard]] static std::vector<std::string> default_client_ids() {
    return {"{identity}", "{identity}#*"};
  }

  /// The rule that decides for `identity` (the first that matches), or none.
  [[nodiscard]] const access_rule* rule_for(std::string_view identity) const {
    if (identity.empty() || identity.find('#') != std::string_view::npos) return nullptr;
    for (const auto& r : rules_)
      if (r.any_identity || glob_match(r.identity, identity)) return &r;
    return nullptr;
  }

  [[nodiscard]] const std::vector<access_rule>& rules() const noexcept { return rules_; }

  /// Whether this is `defaults()`, not an access file.
  [[nodiscard]] bool built_in() const noexcept { return built_in_; }

 private:
  static std::vector<std::string> patterns(const nlohmann::json& rule, const char* key,
                                           const std::string& at,
                                           std::vector<std::string> fallback) {
    const auto it = rule.find(key);
    if (it == rule.end()) return fallback;
    const std::string path = fmt::format("{}.{}", at, key);
    if (!it->is_array()) throw config_error(path, "expected a list of globs");
    if (it->size() > access_limits::max_patterns) {
      throw config_error(path, fmt::format("more than {} globs", access_limits::max_patterns));
    }
    std::vector<std::string> out;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const auto& g = (*it)[i];
      const std::string gp = fmt::format("{}[{}]", path, i);
      if (!g.is_string() || g.get_ref<const std::string&>().empty())
        throw config_error(gp, "expected a non-empty glob");
      std::string text = g.get<std::string>();
      if (auto e = glob_error(expand(text, "x"))) throw config_error(gp, *e);
      out.push_back(std::move(text));
    }
    return out;
  }

  static unsigned roles_from(const nlohmann::json& rule, const std::string& at) {
    const auto it = rule.find("roles");
    const std::string path = at + ".roles";
    if (it == rule.end() || !it->is_array() || it->empty())
      throw config_error(path, "expected a list of roles (client, server, admin)");
    unsigned roles = 0;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const auto& r = (*it)[i];
      const std::string word = r.is_string() ? r.get<std::string>() : r.dump();
      const auto* known =
          std::find_if(access_role_names.begin(), access_role_names.end(),
                       [&](const auto& role_name) { return role_name.second == word; });
      if (known == access_role_names.end()) {
        throw config_error(fmt::format("{}[{}]", path, i),
                           fmt::format("expected client, server or admin, got {}", word));
      }
      roles |= static_cast<unsigned>(known->first);
    }
    return roles;
  }

  static access_rule rule_from(const nlohmann::json& rule, const std::string& at) {
    if (!rule.is_object()) throw config_error(at, "expected an object");
    static constexpr std::array<std::string_view, 6> known = {
        "identity", "roles", "resources", "client_ids", "server_ids", "max_client_ids"};
    for (const auto& [key, value] : rule.items()) {
      if (std::find(known.begin(), known.end(), key) == known.end())
        throw config_error(at + "." + key, "unknown field");
    }
    access_rule r;
    const auto id = rule.find("identity");
    if (id == rule.end() || !id->is_string() || id->get_ref<const std::string&>().empty())
      throw config_error(at + ".identity", "expected a non-empty glob");
    r.identity = id->get<std::string>();
    if (auto e = glob_error(r.identity)) throw config_error(at + ".identity", *e);
    r.roles = roles_from(rule, at);
    r.all_resources = !rule.contains("resources");
    r.resources = patterns(rule, "resources", at, {});
    r.client_ids = patterns(rule, "client_ids", at, default_client_ids());
    r.server_ids = patterns(rule, "server_ids", at, {"{identity}"});
    if (const auto m = rule.find("max_client_ids"); m != rule.end()) {
      if (!m->is_number_integer() || m->get<std::int64_t>() < 1 ||
          m->get<std::int64_t>() > static_cast<std::int64_t>(access_limits::max_client_ids)) {
        throw config_error(at + ".max_client_ids", fmt::format("must be an integer from 1 to {}",
                                                               access_limits::max_client_ids));
      }
      r.max_client_ids = m->get<std::size_t>();
    }
    return r;
  }

 public:
  /// `pattern` with `{identity}` replaced by `identity`, every byte of it escaped, so that it
  /// is taken literally everywhere, in a bracket class too (`]`, `-`, `!` included).
  [[nodiscard]] static std::string expand(std::string_view pattern, std::string_view identity) {
    std::string literal;
    literal.reserve(2 * identity.size());
    for (const char c : identity) {
      literal += '\\';
      literal += c;
    }
    return shown(pattern, literal);
  }

  /// Whether `id` matches `pattern` with `{identity}` standing for `identity` taken literally:
  /// `glob_match(expand(pattern, identity), id)`, without building the expanded pattern for a
  /// pattern that starts with `{identity}` (the built-in rules': every call of an identity
  /// checks its client ids so).
  [[nodiscard]] static bool matches(std::string_view pattern, std::string_view identity,
                                    std::string_view id) {
    constexpr std::string_view token = "{identity}";
    if (pattern.starts_with(token)) {
      if (!id.starts_with(identity)) return false;
      pattern.remove_prefix(token.size());
      id.remove_prefix(identity.size());
    }
    if (pattern.find(token) == std::string_view::npos) return glob_match(pattern, id);
    return glob_match(expand(pattern, identity), id);
  }

  /// `pattern` with `{identity}` replaced by `text` as it is (for messages).
  [[nodiscard]] static std::string shown(std::string_view pattern, std::string_view text) {
    std::string out;
    constexpr std::string_view token = "{identity}";
    for (std::size_t i = 0; i < pattern.size();) {
      if (pattern.substr(i, token.size()) == token) {
        out += text;
        i += token.size();
      } else {
        out += pattern[i++];
      }
    }
    return out;
  }

 private:
  std::vector<access_rule> rules_;
  bool built_in_ = false;
};

/// The caller of one request, as the node's server saw it.
struct access_caller {
  std::string_view identity;     ///< from its certificate; empty: none
  std::uint64_t connection = 0;  ///< the server's connection number
};

/// Decides whether a caller may make a call, and keeps the client ids each caller holds per
/// resource (for `max_client_ids`). Without a policy every call is allowed, and only the bound
/// applies (when `max_client_ids` is not 0).
class access_control {
 public:
  /// Whether the engine still holds a lease for (resource, client id); used to forget client
  /// ids whose leases expired when a caller reaches its bound.
  using holds_type = std::function<bool(std::string_view resource, std::string_view client)>;

  access_control(std::optional<access_policy> policy, std::size_t max_client_ids, holds_type holds)
      : policy_(std::move(policy)), max_client_ids_(max_client_ids), holds_(std::move(holds)) {}

  void set_policy(std::optional<access_policy> policy) { policy_ = std::move(policy); }
  [[nodiscard]] const std::optional<access_policy>& policy() const noexcept { return policy_; }

  /// Why `caller` may not make the call, or nothing. Allowed `get_capacity` calls record
  /// their client id; `release_capacity` forgets it.
  std::optional<std::string> check(const access_caller& caller, const capacity_request& r) {
    const access_rule* rule = nullptr;
    if (policy_) {
      if (auto why = need(caller, access_role::client, "get_capacity", rule)) return why;
      if (auto why = owns(caller, rule->client_ids, "client_id", r.client_id)) return why;
      for (std::size_t i = 0; i < r.resources.size(); ++i) {
        if (auto why = resource_allowed(caller, *rule, r.resources[i].resource_id, i)) return why;
      }
    }
    const std::size_t bound = rule ? rule->max_client_ids : max_client_ids_;
    if (bound == 0) return std::nullopt;
    auto& held = held_[holder(caller)];
    for (const auto& res : r.resources) {
      if (auto why = room(caller, held[res.resource_id], res.resource_id, r.client_id, bound))
        return why;
    }
    for (const auto& res : r.resources)
      held[res.resource_id].insert(r.client_id);
    return std::nullopt;
  }

  /// `count_hits`: a client's call, on resources it may use (no lease is held).
  std::optional<std::string> check(const access_caller& caller, const count_request& r) const {
    if (!policy_) return std::nullopt;
    const access_rule* rule = nullptr;
    if (auto why = need(caller, access_role::client, "count_hits", rule)) return why;
    if (auto why = owns(caller, rule->client_ids, "client_id", r.client_id)) return why;
    for (std::size_t i = 0; i < r.resources.size(); ++i) {
      if (auto why = resource_allowed(caller, *rule, r.resources[i].resource_id, i)) return why;
    }
    return std::nullopt;
  }

  std::optional<std::string> check(const access_caller& caller, const release_request& r) {
    if (policy_) {
      const access_rule* rule = nullptr;
      if (auto why = need(caller, access_role::client, "release_capacity", rule)) return why;
      if (auto why = owns(caller, rule->client_ids, "client_id", r.client_id)) return why;
    }
    if (const auto h = held_.find(holder(caller)); h != held_.end()) {
      for (const auto& res : r.resources) {
        if (const auto it = h->second.find(res); it != h->second.end())
          it->second.erase(r.client_id);
      }
    }
    return std::nullopt;
  }

  std::optional<std::string> check(const access_caller& caller,
                                   const server_capacity_request& r) const {
    if (!policy_) return std::nullopt;
    const access_rule* rule = nullptr;
    if (auto why = need(caller, access_role::server, "get_server_capacity", rule)) return why;
    if (!rule->any_identity) {  // the default policy takes any server id
      if (auto why = owns(caller, rule->server_ids, "server_id", r.server_id)) return why;
    }
    for (std::size_t i = 0; i < r.resources.size(); ++i) {
      if (auto why = resource_allowed(caller, *rule, r.resources[i].resource_id, i)) return why;
    }
    return std::nullopt;
  }

  /// `status` needs `admin`; a `server` may also read the node's own part (no `resource_id`,
  /// so no leases), which is how an intermediate learns its level in the tree.
  std::optional<std::string> check(const access_caller& caller, const status_request& r) const {
    if (policy_ && !r.resource_id) {
      const access_rule* rule = policy_->rule_for(caller.identity);
      if (rule && rule->has(access_role::server)) return std::nullopt;
    }
    return admin(caller, "status");
  }

  /// Why `caller` may not read an admin page (`what`, e.g. "/metrics"), or nothing.
  [[nodiscard]] std::optional<std::string> admin(const access_caller& caller,
                                                 std::string_view what) const {
    if (!policy_) return std::nullopt;
    const access_rule* rule = nullptr;
    return need(caller, access_role::admin, what, rule);
  }

  /// Forgets what a connection held (its client ids stay leased until they expire).
  void disconnected(std::uint64_t connection) { held_.erase(connection_holder(connection)); }

  /// Callers with client ids recorded (identities, and connections without one).
  [[nodiscard]] std::size_t holders() const noexcept { return held_.size(); }

 private:
  // The record of a caller's client ids: "i" and its identity, or "c" and its connection
  // (an identity spelled like a connection's record never shares it).
  static std::string holder(const access_caller& c) {
    return c.identity.empty() ? connection_holder(c.connection) : "i" + std::string(c.identity);
  }
  static std::string connection_holder(std::uint64_t connection) {
    return fmt::format("c{}", connection);
  }

  static std::string who(const access_caller& c) {
    return c.identity.empty() ? "this connection (no client certificate)"
                              : fmt::format("identity \"{}\"", c.identity);
  }

  static std::string role_names(unsigned roles) {
    std::string out;
    for (const auto& [bit, name] : access_role_names) {
      if ((roles & static_cast<unsigned>(bit)) == 0) continue;
      if (!out.empty()) out += ", ";
      out += name;
    }
    return out;
  }

  std::optional<std::string> need(const access_caller& caller, access_role role,
                                  std::string_view what, const access_rule*& rule) const {
    rule = policy_->rule_for(caller.identity);
    const auto name = to_string(role);
    if (policy_->built_in()) {
      if (rule && rule->has(role)) return std::nullopt;
      return fmt::format(
          "{} needs the {} role; with client certificates and no access file {} (give the node "
          "an access file to grant it)",
          what, name,
          rule ? fmt::format("{} has {}", who(caller), role_names(rule->roles))
               : who(caller) + " has no role");
    }
    if (rule == nullptr) {
      return fmt::format("{} needs the {} role; {} matches no rule of the access file", what, name,
                         who(caller));
    }
    if (!rule->has(role)) {
      return fmt::format("{} needs the {} role; {} has {}", what, name, who(caller),
                         role_names(rule->roles));
    }
    return std::nullopt;
  }

  static std::optional<std::string> owns(const access_caller& caller,
                                         const std::vector<std::string>& globs,
                                         std::string_view field, std::string_view id) {
    for (const auto& g : globs)
      if (access_policy::matches(g, caller.identity, id)) return std::nullopt;
    std::string allowed;  // as written, the identity put in
    for (const auto& g : globs)
      allowed += (allowed.empty() ? "" : ", ") + access_policy::shown(g, caller.identity);
    return fmt::format("{} \"{}\" is not one that {} may use (allowed: {})", field, id, who(caller),
                       allowed);
  }

  static std::optional<std::string> resource_allowed(const access_caller& caller,
                                                     const access_rule& rule,
                                                     std::string_view resource, std::size_t i) {
    if (rule.all_resources) return std::nullopt;
    for (const auto& g : rule.resources)
      if (glob_match(g, resource)) return std::nullopt;
    return fmt::format("resources[{}].resource_id \"{}\" is not allowed for {}", i, resource,
                       who(caller));
  }

  // Whether `client` fits in `held` (pruning client ids whose leases are gone when full).
  std::optional<std::string> room(const access_caller& caller, std::set<std::string>& held,
                                  const std::string& resource, const std::string& client,
                                  std::size_t bound) {
    if (held.contains(client) || held.size() < bound) return std::nullopt;
    if (holds_) std::erase_if(held, [&](const std::string& c) { return !holds_(resource, c); });
    if (held.size() < bound) return std::nullopt;
    return fmt::format("{} already holds {} client ids on resource \"{}\" (max_client_ids {})",
                       who(caller), held.size(), resource, bound);
  }

  std::optional<access_policy> policy_;
  std::size_t max_client_ids_;
  holds_type holds_;
  std::map<std::string, std::map<std::string, std::set<std::string>, std::less<>>, std::less<>>
      held_;
};

/// Binds `access_control` to one caller, for `handle_line`.
class access_guard final : public call_guard {
 public:
  access_guard(access_control& control, access_caller caller)
      : control_(control), caller_(caller) {}
  std::optional<std::string> allow(const capacity_request& r) override {
    return control_.check(caller_, r);
  }
  std::optional<std::string> allow(const server_capacity_request& r) override {
    return control_.check(caller_, r);
  }
  std::optional<std::string> allow(const release_request& r) override {
    return control_.check(caller_, r);
  }
  std::optional<std::string> allow(const status_request& r) override {
    return control_.check(caller_, r);
  }
  std::optional<std::string> allow(const count_request& r) override {
    return control_.check(caller_, r);
  }

 private:
  access_control& control_;
  access_caller caller_;
};

}  // namespace doorman
