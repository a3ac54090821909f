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
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "doorman/core/algorithm.hpp"
#include "doorman/core/budget.hpp"
#include "doorman/core/error.hpp"
#include "doorman/core/glob.hpp"
#include "doorman/core/json_reader.hpp"
#include "doorman/core/limits.hpp"
#include "doorman/core/time.hpp"

namespace doorman {

/// The algorithm kinds every engine knows, in Doorman's spelling: those of
/// `default_algorithms`. Each is also accepted in lower case (`fair_share`).
inline constexpr const auto& standard_algorithm_kinds = default_algorithms::kinds;

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
/// The bounds of a learned capacity: `"learn": {"min": 100, "max": 5000}`.
struct learn_config {
  double min = 0;
  double max = 0;

  friend bool operator==(const learn_config&, const learn_config&) = default;
};

struct resource_template {
  std::string identifier_glob;
  double capacity = 0;
  std::optional<double> safe_capacity;  ///< -1: unlimited; absent: dynamic (capacity / clients)
  std::string description;
  algorithm_config algorithm;
  /// A budget: `capacity` units per window (docs/budgets.md), not per second. Absent: a rate.
  std::optional<budget_config> budget;
  /// A learned capacity (docs/learned-capacity.md): the root moves it between these bounds
  /// from the clients' overload signals, starting at `capacity`. Absent: `capacity` holds.
  std::optional<learn_config> learn;

  friend bool operator==(const resource_template&, const resource_template&) = default;
};

/// A configuration that failed validation. `what()` is `path: reason`, e.g.
/// `resources[1].algorithm.lease_length: must be >= refresh_interval (16)`.
class config_error : public std::runtime_error {
 public:
  config_error(std::string path, std::string reason)
      : std::runtime_error(detail::printable_text(path.empty() ? reason : path + ": " + reason)),
        path_(std::move(path)),
        reason_(detail::printable_text(reason)) {}

  /// The problem a `detail::json_reader` found.
  explicit config_error(const request_error& e)
      : std::runtime_error(detail::printable_text(e.message)),
        path_(e.path),
        reason_(detail::printable_text(reason_of(e))) {}

  /// The field path, e.g. `resources[1].algorithm.lease_length` (empty for the whole document).
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  /// What is wrong, without the path (e.g. "must be between 0 and 1e15"). It and `what()` write
  /// control bytes as `\xNN` (`path()` keeps them).
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }

  /// `errc::invalid_config`, for code that reports errors as `std::error_code`.
  [[nodiscard]] std::error_code code() const noexcept {
    return make_error_code(errc::invalid_config);
  }

 private:
  // The message without its "path: " (written as `detail::printable_text` writes it).
  static std::string reason_of(const request_error& e) {
    const std::string prefix = detail::printable_text(e.path) + ": ";
    if (!e.path.empty() && e.message.starts_with(prefix)) return e.message.substr(prefix.size());
    return e.message;
  }

  std::string path_;
  std::string reason_;
};

/// The JSON form of an algorithm's settings, as the configuration and a server's grant write
/// it.
inline void to_json(nlohmann::json& j, const algorithm_config& a) {
  j = {{"kind", a.kind},
       {"lease_length", a.lease_length.count()},
       {"refresh_interval", a.refresh_interval.count()},
       {"learning_mode_duration", a.learning_mode_duration.count()},
       {"parameters", a.parameters}};
}

namespace detail {

// `name` in its canonical spelling among `kinds` (each also accepted in lower case), or
// nothing.
inline std::optional<std::string_view> canonical_kind(std::string_view name,
                                                      std::span<const std::string_view> kinds) {
  for (const auto k : kinds) {
    if (name == k) return k;
    if (name.size() != k.size()) continue;
    bool lower = true;
    for (std::size_t i = 0; i < k.size() && lower; ++i) {
      const char c = k[i];
      lower = name[i] == ((c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c);
    }
    if (lower) return k;
  }
  return std::nullopt;
}

/// Reads an algorithm's settings at field `key` of `parent`, as the configuration and a
/// server's grant both write them: a kind (one of `kinds`, canonicalised; with no `kinds`, any
/// non-empty name, which the engine that adopts it checks), lease_length and refresh_interval
/// within the duration limits with lease_length >= refresh_interval, learning_mode_duration
/// (default: lease_length), and scalar parameters. `strict`: unknown fields are refused.
inline void read_algorithm(json_reader& parent, const char* key, algorithm_config& out,
                           std::span<const std::string_view> kinds, bool strict) {
  const nlohmann::json* j = parent.object(key);
  if (j == nullptr) return;
  json_reader r(*j, parent.at(key));
  if (strict) {
    r.only({"kind", "lease_length", "refresh_interval", "learning_mode_duration", "parameters"});
  }
  std::string name;
  if (r.string("kind", name)) {
    if (kinds.empty()) {
      if (name.empty()) r.fail("kind", "must not be empty");
      out.kind = std::move(name);
    } else if (const auto k = canonical_kind(name, kinds)) {
      out.kind = std::string(*k);
    } else {
      std::string known;
      for (const auto kind : kinds)
        known += (known.empty() ? "" : ", ") + std::string(kind);
      r.fail("kind", "unknown algorithm kind \"" + name + "\" (known: " + known + ")");
    }
  }
  constexpr std::string_view unit = " seconds";
  double lease = 0, refresh = 0, learning = 0;
  if (r.number("lease_length", lease)) {
    r.within("lease_length", lease, config_limits::min_duration, config_limits::max_duration, unit);
  }
  if (r.number("refresh_interval", refresh)) {
    r.within("refresh_interval", refresh, config_limits::min_duration, config_limits::max_duration,
             unit);
  }
  if (!r.error() && lease < refresh) r.fail("lease_length", "must be >= refresh_interval");
  learning = lease;
  if (r.number("learning_mode_duration", learning, false)) {
    r.within("learning_mode_duration", learning, 0, config_limits::max_duration, unit);
  }
  if (const auto* p = r.object("parameters", false)) {
    for (const auto& [name_of, value] : p->items()) {
      if (!value.is_primitive() || value.is_null()) {
        r.fail("parameters." + name_of, "must be a string, number or boolean");
        break;
      }
    }
    out.parameters = *p;
  }
  out.lease_length = seconds(lease);
  out.refresh_interval = seconds(refresh);
  out.learning_mode_duration = seconds(learning);
  parent.absorb(r.error());
}

class config_reader {
 public:
  explicit config_reader(std::span<const std::string_view> kinds) : kinds_(kinds) {}

  std::vector<resource_template> read(const nlohmann::json& doc) const {
    json_reader r(doc, "");
    r.only({"resources"});
    std::vector<resource_template> out;
    const bool listed = r.array(
        "resources",
        [&](const nlohmann::json& t, const std::string& path) {
          if (auto problem = read_template(t, path, out)) r.absorb(problem);
        },
        std::numeric_limits<std::size_t>::max());
    if (r.error()) throw config_error(*r.error());
    if (!listed || out.empty()) throw config_error("resources", "must hold at least one template");
    if (out.back().identifier_glob != "*") {
      throw config_error(
          "resources[" + std::to_string(out.size() - 1) + "].identifier_glob",
          "the last template must have identifier_glob \"*\" so that every resource id resolves");
    }
    return out;
  }

 private:
  // Reads one template into `out`; the problem, if any.
  std::optional<request_error> read_template(const nlohmann::json& j, const std::string& path,
                                             std::vector<resource_template>& out) const {
    json_reader r(j, path);
    r.only({"identifier_glob", "capacity", "safe_capacity", "description", "algorithm", "budget",
            "learn"});
    resource_template t;
    if (r.string("identifier_glob", t.identifier_glob)) check_glob(r, t.identifier_glob, out);
    if (r.number("capacity", t.capacity)) {
      r.within("capacity", t.capacity, 0, config_limits::max_capacity);
    }
    if (double safe = 0; r.number("safe_capacity", safe, false)) {
      if (safe != -1 && !(safe >= 0 && safe <= config_limits::max_capacity)) {
        r.fail("safe_capacity", "must be between 0 and " +
                                    number_text(config_limits::max_capacity) +
                                    ", or -1 for unlimited");
      }
      t.safe_capacity = safe;
    }
    r.string("description", t.description, false);
    read_algorithm(r, "algorithm", t.algorithm, kinds_, true);
    read_budget(r, t);
    read_learn(r, t);
    if (!r.error()) out.push_back(std::move(t));
    return r.error();
  }

  // `"budget": {"window": "day"}`: a name (minute, hour, day, month) or a whole number of
  // seconds from 1 to 31622400 (366 days). A budget is shared: not with NO_ALGORITHM.
  static void read_budget(json_reader& r, resource_template& t) {
    const nlohmann::json* j = r.object("budget", false);
    if (j == nullptr) return;
    json_reader b(*j, r.at("budget"));
    b.only({"window"});
    budget_config out;
    const nlohmann::json* w = j->contains("window") ? &(*j)["window"] : nullptr;
    constexpr std::string_view names[] = {"minute", "hour", "day", "month"};
    constexpr const char* which = "must be minute, hour, day, month or a number of seconds";
    if (w == nullptr) {
      b.fail("window", "is required");
    } else if (!w->is_string() && !w->is_number()) {
      b.fail("window", which);
    } else if (w->is_string()) {
      const auto at = std::find(std::begin(names), std::end(names), w->get<std::string>());
      if (at == std::end(names)) {
        b.fail("window", which);
      } else {
        out.period = static_cast<budget_period>(at - std::begin(names));
      }
    } else if (std::int64_t n = 0; b.integer("window", n)) {
      if (n < 1 || n > 31'622'400) b.fail("window", "must be between 1 and 31622400 seconds");
      out.period = budget_period::fixed;
      out.fixed_seconds = n;
    }
    if (!b.error() && t.algorithm.kind == "NO_ALGORITHM") {
      b.fail("window", "a budget is shared: its algorithm must not be NO_ALGORITHM");
    }
    r.absorb(b.error());
    if (!b.error()) t.budget = out;
  }

  // `"learn": {"min": 100, "max": 5000}`: bounds around the starting `capacity`. A rate's
  // (a budget's window is spent, not served) and a shared one (not NO_ALGORITHM).
  static void read_learn(json_reader& r, resource_template& t) {
    const nlohmann::json* j = r.object("learn", false);
    if (j == nullptr || r.error()) return;
    json_reader b(*j, r.at("learn"));
    b.only({"min", "max"});
    learn_config out;
    if (b.number("min", out.min)) b.within("min", out.min, 0, config_limits::max_capacity);
    if (b.number("max", out.max)) b.within("max", out.max, 0, config_limits::max_capacity);
    if (!b.error() && out.min > out.max) b.fail("max", "must be at least min");
    if (!b.error() && !(t.capacity >= out.min && t.capacity <= out.max)) {
      b.fail("", "capacity (" + number_text(t.capacity) + ", where learning starts) must be " +
                     "between min and max");
    }
    if (!b.error() && t.budget) b.fail("", "a budget cannot be learned: only a rate");
    if (!b.error() && t.algorithm.kind == "NO_ALGORITHM") {
      b.fail("", "a learned capacity is shared: its algorithm must not be NO_ALGORITHM");
    }
    r.absorb(b.error());
    if (!b.error()) t.learn = out;
  }

  static void check_glob(json_reader& r, const std::string& glob,
                         const std::vector<resource_template>& earlier) {
    if (glob.empty()) {
      r.fail("identifier_glob", "must not be empty");
    } else if (glob.size() > config_limits::max_glob_bytes) {
      r.fail("identifier_glob",
             "must be at most " + std::to_string(config_limits::max_glob_bytes) + " bytes");
    } else if (auto err = glob_error(glob)) {
      r.fail("identifier_glob", "invalid glob \"" + glob + "\": " + *err);
    }
    for (std::size_t j = 0; j < earlier.size(); ++j) {
      if (earlier[j].identifier_glob == glob) {
        r.fail("identifier_glob",
               "duplicates resources[" + std::to_string(j) + "].identifier_glob \"" + glob + "\"");
      }
    }
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
    r.has_budgets_ = std::any_of(r.templates_.begin(), r.templates_.end(),
                                 [](const resource_template& t) { return t.budget.has_value(); });
    return r;
  }

  /// Whether any template is a budget (so that paths that only budgets concern cost nothing
  /// otherwise).
  [[nodiscard]] bool has_budgets() const noexcept { return has_budgets_; }

  /// The templates in configured order.
  [[nodiscard]] const std::vector<resource_template>& templates() const noexcept {
    return templates_;
  }

  /// The template for `resource_id`: exact match first, then the first matching glob, else the
  /// last template (whose glob is `*`): the default also for ids that `*` does not match
  /// because they hold a `/`.
  [[nodiscard]] const resource_template& find(std::string_view resource_id) const noexcept {
    for (const auto& t : templates_) {
      if (t.identifier_glob == resource_id) return t;
    }
    for (const auto& t : templates_) {
      if (glob_match(t.identifier_glob, resource_id)) return t;
    }
    return templates_.back();
  }

  /// The JSON form, as `parse` accepts it.
  [[nodiscard]] nlohmann::json to_json() const {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& t : templates_) {
      nlohmann::json j = {{"identifier_glob", t.identifier_glob},
                          {"capacity", t.capacity},
                          {"algorithm", nlohmann::json(t.algorithm)}};
      if (t.safe_capacity) j["safe_capacity"] = *t.safe_capacity;
      if (!t.description.empty()) j["description"] = t.description;
      if (t.budget) {
        j["budget"]["window"] = t.budget->period == budget_period::fixed
                                    ? nlohmann::json(t.budget->fixed_seconds)
                                    : nlohmann::json(period_name(*t.budget));
      }
      if (t.learn) j["learn"] = {{"min", t.learn->min}, {"max", t.learn->max}};
      list.push_back(std::move(j));
    }
    return {{"resources", std::move(list)}};
  }

  friend bool operator==(const resource_repository&, const resource_repository&) = default;

 private:
  resource_repository() = default;
  std::vector<resource_template> templates_;
  bool has_budgets_ = false;  // derived from templates_ when read
};

/// The longest lease `config`'s templates grant, in seconds (at least 1).
[[nodiscard]] inline double longest_lease(const resource_repository& config) {
  double most = 1;
  for (const auto& t : config.templates())
    most = std::max(most, t.algorithm.lease_length.count());
  return most;
}

/// The longest learning mode of `config`'s templates, in seconds.
[[nodiscard]] inline double longest_learning(const resource_repository& config) {
  double most = 0;
  for (const auto& t : config.templates())
    most = std::max(most, t.algorithm.learning_mode_duration.count());
  return most;
}

}  // namespace doorman
