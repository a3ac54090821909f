#pragma once

/// \file
/// The resource repository (docs/configuration.md): a list of resource templates, read from JSON
/// with Doorman's field names (comments allowed), validated with errors that name the field path.
///
///     auto repo = doorman::resource_repository::parse(R"({"resources": [
///       {"identifier_glob": "*", "capacity": 100,
///        "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16}}]})");
///     const auto& t = repo.find("mysql-shard-17");  // exact match, else first matching glob

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "doorman/core/error.hpp"
#include "doorman/core/glob.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// Limits that configuration values must respect. Durations are in seconds.
struct config_limits {
  static constexpr double min_duration = 0.1;         ///< lease_length, refresh_interval
  static constexpr double max_duration = 86'400;      ///< one day, for every duration
  static constexpr std::size_t max_glob_bytes = 256;  ///< as resource ids on the wire
  /// capacity and safe_capacity (and, on the wire, every wants, capacity and outstanding:
  /// `request_limits::max_quantity`).
  static constexpr double max_capacity = 1e15;
};

/// The algorithm kinds every engine knows, in Doorman's spelling. Each is also accepted in
/// lower case (`fair_share`).
inline constexpr std::array<std::string_view, 4> standard_algorithm_kinds = {
    "NO_ALGORITHM", "STATIC", "PROPORTIONAL_SHARE", "FAIR_SHARE"};

/// How a resource's capacity is divided, and the lease parameters of its grants.
struct algorithm_config {
  std::string kind;                    ///< canonical (upper-case) name, e.g. "FAIR_SHARE"
  seconds lease_length{60};            ///< how long a grant is valid
  seconds refresh_interval{16};        ///< when the holder should come back
  seconds learning_mode_duration{60};  ///< defaults to lease_length; 0 turns learning mode off
  nlohmann::json parameters = nlohmann::json::object();  ///< algorithm-specific, name -> scalar

  friend bool operator==(const algorithm_config&, const algorithm_config&) = default;
};

/// A template that configures every resource whose id it matches.
struct resource_template {
  std::string identifier_glob;
  double capacity = 0;
  std::optional<double> safe_capacity;  ///< -1: unlimited; absent: dynamic (capacity / clients)
  std::string description;
  algorithm_config algorithm;

  friend bool operator==(const resource_template&, const resource_template&) = default;
};

/// A configuration that failed validation. `what()` is `path: reason`, e.g.
/// `resources[1].algorithm.lease_length: must be >= refresh_interval (16)`.
class config_error : public std::runtime_error {
 public:
  config_error(std::string path, const std::string& reason)
      : std::runtime_error(path.empty() ? reason : path + ": " + reason), path_(std::move(path)) {}

  /// The field path, e.g. `resources[1].algorithm.lease_length` (empty for the whole document).
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  /// `errc::invalid_config`, for code that reports errors as `std::error_code`.
  [[nodiscard]] std::error_code code() const noexcept {
    return make_error_code(errc::invalid_config);
  }

 private:
  std::string path_;
};

namespace detail {

class config_reader {
 public:
  explicit config_reader(std::span<const std::string_view> kinds) : kinds_(kinds) {}

  std::vector<resource_template> read(const nlohmann::json& doc) const {
    require_object(doc, "");
    reject_unknown(doc, "", {"resources"});
    const auto it = doc.find("resources");
    if (it == doc.end()) fail("resources", "is required");
    if (!it->is_array()) fail("resources", "must be an array");
    if (it->empty()) fail("resources", "must hold at least one template");

    std::vector<resource_template> out;
    out.reserve(it->size());
    for (std::size_t i = 0; i < it->size(); ++i) {
      const std::string path = "resources[" + std::to_string(i) + "]";
      out.push_back(read_template((*it)[i], path));
      for (std::size_t j = 0; j < i; ++j) {
        if (out[j].identifier_glob == out[i].identifier_glob) {
          fail(path + ".identifier_glob", "duplicates resources[" + std::to_string(j) +
                                              "].identifier_glob \"" + out[i].identifier_glob +
                                              "\"");
        }
      }
    }
    if (out.back().identifier_glob != "*") {
      fail("resources[" + std::to_string(out.size() - 1) + "].identifier_glob",
           "the last template must have identifier_glob \"*\" so that every resource id resolves");
    }
    return out;
  }

 private:
  [[noreturn]] static void fail(std::string path, const std::string& reason) {
    throw config_error(std::move(path), reason);
  }

  static void require_object(const nlohmann::json& j, const std::string& path) {
    if (!j.is_object()) fail(path, "must be an object");
  }

  static void reject_unknown(const nlohmann::json& j, const std::string& path,
                             std::initializer_list<std::string_view> known) {
    for (const auto& [key, value] : j.items()) {
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        fail(path.empty() ? key : path + "." + key, "unknown field");
      }
    }
  }

  static std::optional<double> number(const nlohmann::json& obj, const char* key,
                                      const std::string& path, bool required) {
    const auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) fail(path, "is required");
      return std::nullopt;
    }
    if (!it->is_number()) fail(path, "must be a number");
    const double v = it->get<double>();
    if (!std::isfinite(v)) fail(path, "must be finite");
    return v;
  }

  static seconds duration(const nlohmann::json& obj, const char* key, const std::string& path,
                          double min) {
    const double v = *number(obj, key, path, true);
    if (v < min || v > config_limits::max_duration) {
      fail(path, fmt_range(min, config_limits::max_duration));
    }
    return seconds{v};
  }

  static std::string fmt_range(double lo, double hi) {
    auto num = [](double v) {
      std::string s = nlohmann::json(v).dump();
      if (s.size() > 2 && s.ends_with(".0")) s.resize(s.size() - 2);
      return s;
    };
    return "must be between " + num(lo) + " and " + num(hi) + " seconds";
  }

  resource_template read_template(const nlohmann::json& j, const std::string& path) const {
    require_object(j, path);
    reject_unknown(j, path,
                   {"identifier_glob", "capacity", "safe_capacity", "description", "algorithm"});
    resource_template t;

    const auto glob = j.find("identifier_glob");
    if (glob == j.end()) fail(path + ".identifier_glob", "is required");
    if (!glob->is_string()) fail(path + ".identifier_glob", "must be a string");
    t.identifier_glob = glob->get<std::string>();
    if (t.identifier_glob.empty()) fail(path + ".identifier_glob", "must not be empty");
    if (t.identifier_glob.size() > config_limits::max_glob_bytes) {
      fail(path + ".identifier_glob", "must be at most 256 bytes");
    }
    if (auto err = glob_error(t.identifier_glob)) {
      fail(path + ".identifier_glob", "invalid glob \"" + t.identifier_glob + "\": " + *err);
    }

    t.capacity = *number(j, "capacity", path + ".capacity", true);
    if (t.capacity < 0 || t.capacity > config_limits::max_capacity) {
      fail(path + ".capacity", "must be between 0 and 1e15");
    }

    if (auto safe = number(j, "safe_capacity", path + ".safe_capacity", false)) {
      if ((*safe < 0 && *safe != -1) || *safe > config_limits::max_capacity) {
        fail(path + ".safe_capacity", "must be between 0 and 1e15, or -1 for unlimited");
      }
      t.safe_capacity = *safe;
    }

    if (const auto d = j.find("description"); d != j.end()) {
      if (!d->is_string()) fail(path + ".description", "must be a string");
      t.description = d->get<std::string>();
    }

    const auto alg = j.find("algorithm");
    if (alg == j.end()) fail(path + ".algorithm", "is required");
    t.algorithm = read_algorithm(*alg, path + ".algorithm");
    return t;
  }

  algorithm_config read_algorithm(const nlohmann::json& j, const std::string& path) const {
    require_object(j, path);
    reject_unknown(
        j, path,
        {"kind", "lease_length", "refresh_interval", "learning_mode_duration", "parameters"});
    algorithm_config a;

    const auto kind = j.find("kind");
    if (kind == j.end()) fail(path + ".kind", "is required");
    if (!kind->is_string()) fail(path + ".kind", "must be a string");
    const auto name = kind->get<std::string>();
    a.kind = canonical_kind(name, path + ".kind");

    a.lease_length =
        duration(j, "lease_length", path + ".lease_length", config_limits::min_duration);
    a.refresh_interval =
        duration(j, "refresh_interval", path + ".refresh_interval", config_limits::min_duration);
    if (a.lease_length < a.refresh_interval) {
      fail(path + ".lease_length", "must be >= refresh_interval");
    }
    a.learning_mode_duration = a.lease_length;
    if (j.contains("learning_mode_duration")) {
      a.learning_mode_duration =
          duration(j, "learning_mode_duration", path + ".learning_mode_duration", 0);
    }

    if (const auto p = j.find("parameters"); p != j.end()) {
      if (!p->is_object()) fail(path + ".parameters", "must be an object");
      for (const auto& [key, value] : p->items()) {
        if (!value.is_primitive() || value.is_null()) {
          fail(path + ".parameters." + key, "must be a string, number or boolean");
        }
      }
      a.parameters = *p;
    }
    return a;
  }

  std::string canonical_kind(const std::string& name, const std::string& path) const {
    for (const auto k : kinds_) {
      if (name == k) return name;
      std::string lower(k);
      std::transform(lower.begin(), lower.end(), lower.begin(), [](char c) {
        return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
      });
      if (name == lower) return std::string(k);
    }
    std::string known;
    for (const auto k : kinds_)
      known += (known.empty() ? "" : ", ") + std::string(k);
    fail(path, "unknown algorithm kind \"" + name + "\" (known: " + known + ")");
  }

  std::span<const std::string_view> kinds_;
};

}  // namespace detail

/// The validated list of resource templates. Order matters: lookup tries an exact
/// `identifier_glob` match first, then the first glob that matches; the last template is
/// always `*`, so every resource id resolves.
class resource_repository {
 public:
  /// Parses and validates a JSON document (comments allowed). Throws `config_error`.
  /// `kinds` lists the algorithm kinds the engine that will use the repository knows.
  [[nodiscard]] static resource_repository parse(
      std::string_view text, std::span<const std::string_view> kinds = standard_algorithm_kinds) {
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, true, true);
    } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range (1e999)
      throw config_error("", std::string("not valid JSON: ") + e.what());
    }
    return from_json(doc, kinds);
  }

  /// Validates an already parsed document. Throws `config_error`.
  [[nodiscard]] static resource_repository from_json(
      const nlohmann::json& doc,
      std::span<const std::string_view> kinds = standard_algorithm_kinds) {
    resource_repository r;
    r.templates_ = detail::config_reader(kinds).read(doc);
    return r;
  }

  /// The templates in configured order.
  [[nodiscard]] const std::vector<resource_template>& templates() const noexcept {
    return templates_;
  }

  /// The template for `resource_id`: exact match first, then the first matching glob.
  [[nodiscard]] const resource_template& find(std::string_view resource_id) const noexcept {
    for (const auto& t : templates_) {
      if (t.identifier_glob == resource_id) return t;
    }
    for (const auto& t : templates_) {
      if (glob_match(t.identifier_glob, resource_id)) return t;
    }
    return templates_.back();  // "*" matches everything; kept for safety
  }

  /// The JSON form, as `parse` accepts it.
  [[nodiscard]] nlohmann::json to_json() const {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& t : templates_) {
      nlohmann::json alg = {{"kind", t.algorithm.kind},
                            {"lease_length", t.algorithm.lease_length.count()},
                            {"refresh_interval", t.algorithm.refresh_interval.count()},
                            {"learning_mode_duration", t.algorithm.learning_mode_duration.count()},
                            {"parameters", t.algorithm.parameters}};
      nlohmann::json j = {{"identifier_glob", t.identifier_glob},
                          {"capacity", t.capacity},
                          {"algorithm", std::move(alg)}};
      if (t.safe_capacity) j["safe_capacity"] = *t.safe_capacity;
      if (!t.description.empty()) j["description"] = t.description;
      list.push_back(std::move(j));
    }
    return {{"resources", std::move(list)}};
  }

  friend bool operator==(const resource_repository&, const resource_repository&) = default;

 private:
  resource_repository() = default;
  std::vector<resource_template> templates_;
};

}  // namespace doorman
