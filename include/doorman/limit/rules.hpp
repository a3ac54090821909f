#pragma once

/// \file
/// Rate-limit rules in the style of Lyft's ratelimit service (as Envoy uses it): a `domain`,
/// a tree of `descriptors` (key, optional value, nested descriptors), each with a `rate_limit`
/// of `requests_per_unit` per `unit`, plus this library's `mode` (hard, soft, elastic) and
/// `shadow`. A request names its domain and carries descriptors, each a list of key/value
/// entries; `check` finds the rule each descriptor matches and counts the request against it.
///
///     auto rules = doorman::rule_set::parse(nlohmann::json::parse(R"({
///       "domain": "api",
///       "descriptors": [
///         {"key": "remote_address", "rate_limit": {"unit": "minute", "requests_per_unit": 100}},
///         {"key": "plan", "value": "free",
///          "descriptors": [{"key": "user", "mode": "elastic", "max_delay": 2,
///                           "rate_limit": {"unit": "second", "requests_per_unit": 5}}]}]})"));
///     auto verdict = rules.check("api", {{{"remote_address", ip}}, {{"plan", "free"},
///                                                                   {"user", login}}});
///     if (verdict.code == doorman::rule_code::refused) reply_429(verdict);
///
/// Matching, per descriptor: the first entry is looked up among the domain's descriptors by
/// key and value, else by key alone (a rule without a value: one limit per distinct value);
/// each next entry among the matched rule's nested descriptors. A descriptor whose every entry
/// matched is limited by the last rule's `rate_limit` (a rule without one limits nothing).
///
/// Each rule is a template (`resource_templates()`): its limit applies per distinct request
/// key, `<domain>/<key>=<value>/...` with the entries of the rule's path, each key and value
/// escaped (`append_escaped`: `/`, `=`, `%`, glob bytes and bytes outside printable ASCII as
/// `%XX`), one longer than 256 bytes cut there and followed by `~` and a hash of the whole, so
/// distinct descriptors never share a count. The
/// keys are held by a `keyed_limiter` (bounded memory) of the domain's `algorithm`: one of the
/// window algorithms of the set's list, `sliding_window` (6 sub-windows) by default, or
/// `fixed_window` or `sliding_log`; a user's own window algorithm joins the list with
/// `rule_algorithms<>::with<mine>`. A key of at most 256 bytes is a Doorman
/// resource id matching the rule's path, so a rule can be made global across a fleet by giving
/// each key a `rate_resource` (see `keyed_rate_resource`).

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "doorman/core/config.hpp"
#include "doorman/core/json_reader.hpp"
#include "doorman/limit/any_limiter.hpp"
#include "doorman/limit/keyed_limiter.hpp"
#include "doorman/limit/limiter_base.hpp"
#include "doorman/limit/window_limiter.hpp"

namespace doorman {

/// What a rule does with a request over its limit.
enum class rule_mode {
  hard,     ///< refuse it
  soft,     ///< serve it, up to `overage` × the limit more per unit, reported as over
  elastic,  ///< ask the caller to come back when it fits, if within `max_delay`; else refuse
};

/// The verdict of `check`, worst first.
enum class rule_code {
  ok,       ///< within every limit
  soft,     ///< served, but over a soft limit
  delay,    ///< an elastic limit: come back after `retry_after`
  refused,  ///< over a limit: answer 429
};

/// A descriptor's entry and a descriptor, as a request carries them.
struct descriptor_entry {
  std::string key;
  std::string value;
};
using descriptor = std::vector<descriptor_entry>;

/// The outcome of `check`: the worst code among the descriptors, and for the headers the
/// limit that has the fewest permits left (`limit` < 0 when no rule matched).
struct rule_verdict {
  rule_code code = rule_code::ok;
  double limit = -1;     ///< requests per `window` of the deciding rule
  double remaining = 0;  ///< requests left in it (0 when over)
  std::chrono::nanoseconds window{};
  std::chrono::nanoseconds reset{};        ///< until `remaining` is back to `limit`
  std::chrono::nanoseconds retry_after{};  ///< with `delay` and `refused`: when to come back
  std::string key;               ///< the deciding request key (a resource id), e.g. "api/user=ann"
  bool shadow_exceeded = false;  ///< a shadow rule was over its limit (nothing refused)
};

/// One descriptor's outcome (`check_each`), as Envoy's rate limit service reports each.
struct descriptor_status {
  rule_code code = rule_code::ok;
  double limit = -1;  ///< requests per `window` of the rule that decided; < 0: no limit applied
  std::chrono::nanoseconds window{};
  std::string name;        ///< the rule's `rate_limit.name` (may be empty)
  bool unlimited = false;  ///< matched a rule marked `unlimited`: never limited, not counted
  bool replaced = false;   ///< its rule was replaced by another matched rule: not counted
  bool shadow = false;     ///< a shadow rule: `code` is what it would have been; nothing is refused
  bool quota = false;      ///< a quota rule: over its limit, it refuses only with every quota rule
  double remaining = 0;    ///< requests left in the window (0 when over)
  std::chrono::nanoseconds reset{};        ///< until `remaining` is back to `limit`
  std::chrono::nanoseconds retry_after{};  ///< with `delay` and `refused`
  std::string key;                         ///< the request key counted, e.g. "api/user=ann"
};

/// Whether `s` is over its limit (refused, or delayed), shadow rules aside: the code of its own
/// status in Envoy's answer.
[[nodiscard]] inline bool over_limit(const descriptor_status& s) noexcept {
  return !s.shadow && (s.code == rule_code::refused || s.code == rule_code::delay);
}

/// Whether the quota rules (`quota_mode`) among `statuses` refuse their request: at least one
/// matched, and every one is over its limit. A quota rule over its limit alone lets the
/// request through (its own status still says it is over), as envoyproxy/ratelimit does.
[[nodiscard]] inline bool quota_refuses(std::span<const descriptor_status> statuses) noexcept {
  bool any = false;
  for (const auto& s : statuses) {
    if (!s.quota || s.shadow || s.limit < 0) continue;
    if (!over_limit(s)) return false;
    any = true;
  }
  return any;
}

/// Whether a request whose descriptors fared as `statuses` is refused: a rule that is neither
/// a shadow nor a quota rule is over its limit, or every quota rule is (`quota_refuses`).
[[nodiscard]] inline bool request_refused(std::span<const descriptor_status> statuses) noexcept {
  const bool quota = quota_refuses(statuses);
  return std::any_of(statuses.begin(), statuses.end(), [&](const descriptor_status& s) {
    return over_limit(s) && (!s.quota || quota);
  });
}

/// What one rule has counted since its rules were loaded, as envoyproxy/ratelimit counts per
/// key: hits (`hits_addend` summed), those over the limit, those admitted, those admitted past
/// `near_ratio` (80%) of the window's limit, and those a shadow rule would have refused. A
/// request refused is refused whole (its hits all `over_limit`; nothing is consumed).
struct rule_stats {
  static constexpr double near_ratio = 0.8;
  std::atomic<std::uint64_t> total_hits{0};
  std::atomic<std::uint64_t> over_limit{0};
  std::atomic<std::uint64_t> near_limit{0};
  std::atomic<std::uint64_t> within_limit{0};
  std::atomic<std::uint64_t> shadow_mode{0};
};

/// A limit a request gives for one of its descriptors (Envoy's per-descriptor `limit`): it is
/// counted instead of the matched rule's (as a hard, non-shadow rule), under the descriptor's
/// own key, and applies even where no rule matches.
struct limit_override {
  double requests_per_unit = 0;
  std::chrono::nanoseconds unit{std::chrono::seconds(1)};
};

/// One descriptor of `check_each`: its entries, how many hits it adds (Envoy's
/// `hits_addend`), and an optional limit of its own.
struct descriptor_check {
  descriptor entries;
  double hits = 1;
  std::optional<limit_override> limit{};
};

/// Folds one more limiter's decision into `v` (a resource's limiter checked after the rules,
/// say): a refusal refuses, with its `retry_after` (a limiter blocked at rate 0 says 1 s: the
/// next refresh of its lease is the earliest a permit can appear); the headers report whichever
/// of the two has fewer permits left. Call it only when `v` did not already refuse or delay.
///
///     auto v = rules.check("api", descriptors);
///     if (v.code == doorman::rule_code::ok) doorman::combine(v, api.try_acquire(),
///     api.limiter().status());
template <class Duration>
void combine(rule_verdict& v, const basic_acquire_result<Duration>& r, const limit_status& st) {
  if (!r) {
    v.code = rule_code::refused;
    v.retry_after = r.retry_after == Duration::max()
                        ? std::chrono::nanoseconds(std::chrono::seconds(1))
                        : std::chrono::duration_cast<std::chrono::nanoseconds>(r.retry_after);
  }
  if (v.limit < 0 || st.remaining < v.remaining) {
    v.limit = st.limit;
    v.remaining = st.remaining;
    v.reset = st.reset;
  }
}

/// Whole seconds for a header, rounded up ("never" is 1 s: come back and ask again).
[[nodiscard]] inline long long header_seconds(std::chrono::nanoseconds d) {
  if (d == std::chrono::nanoseconds::max()) return 1;
  return static_cast<long long>(std::ceil(std::chrono::duration<double>(d).count()));
}

/// The headers an HTTP answer carries for `v` ("Name: value", no CRLF): `RateLimit-Limit`,
/// `RateLimit-Remaining` (whole permits) and `RateLimit-Reset` (seconds, rounded up) when a
/// limit decided; `Retry-After` (at least 1 s) when the request is refused or delayed, whose
/// status is then 429.
[[nodiscard]] inline std::vector<std::string> rate_limit_headers(const rule_verdict& v) {
  std::vector<std::string> h;
  if (v.limit >= 0) {
    h.push_back("RateLimit-Limit: " + std::to_string(static_cast<long long>(v.limit)));
    h.push_back("RateLimit-Remaining: " +
                std::to_string(static_cast<long long>(std::floor(v.remaining))));
    h.push_back("RateLimit-Reset: " + std::to_string(header_seconds(v.reset)));
  }
  if (v.code == rule_code::refused || v.code == rule_code::delay) {
    h.push_back("Retry-After: " + std::to_string(std::max(1LL, header_seconds(v.retry_after))));
  }
  return h;
}

/// Limits on what a rule file may hold (a file is input from outside).
struct rule_limits {
  static constexpr std::size_t max_descriptors = 1000;  ///< per level
  static constexpr std::size_t max_depth = 8;
  static constexpr std::size_t max_rules = 10'000;  ///< in all
  static constexpr double max_requests_per_unit = 1e9;
  static constexpr double max_delay = 3600;  ///< seconds
  static constexpr std::size_t max_key_bytes = 256;
  static constexpr std::size_t max_overrides = 1000;  ///< distinct per-request limits kept
};

/// The window algorithms a rules domain may choose by name (`"algorithm"`), the first one the
/// default: the compact limiters (one demand counter: a key costs 88–240 bytes).
template <class Clock = coarse_clock>
using rule_algorithms =
    local_algorithm_list<sliding_window_algorithm<Clock, 1>, fixed_window_algorithm<Clock, 1>,
                         sliding_log_algorithm<Clock, 1>>;

/// Compiled rules, counting per request key with the domain's algorithm, one of `List`'s
/// (window limiters on one clock, built from `window_limiter_options`).
template <class List = rule_algorithms<>>
class basic_rule_set;

template <local_algorithm... Algorithms>
class basic_rule_set<local_algorithm_list<Algorithms...>> {
  using first = std::tuple_element_t<0, std::tuple<Algorithms...>>;
  static_assert((std::same_as<typename Algorithms::limiter::options_type, window_limiter_options> &&
                 ...),
                "a rules algorithm is a window limiter, built from window_limiter_options");
  static_assert((std::same_as<typename Algorithms::limiter::clock_type,
                              typename first::limiter::clock_type> &&
                 ...),
                "a rules algorithm list runs on one clock");

 public:
  using list = local_algorithm_list<Algorithms...>;
  using clock_type = typename first::limiter::clock_type;
  /// One rule's counts, a limiter per request key, of its domain's algorithm.
  using counters = std::variant<std::shared_ptr<keyed_limiter<typename Algorithms::limiter>>...>;

  /// One rule (a node of the descriptor tree).
  struct rule {
    std::string key;
    std::string value;                // empty: any value (a limit per value)
    double requests_per_unit = -1;    // < 0: no rate_limit here
    std::chrono::nanoseconds unit{};  // the window
    rule_mode mode = rule_mode::hard;
    bool shadow = false;
    bool quota = false;                                           // quota_mode
    double overage = 0.5;                                         // soft
    std::chrono::nanoseconds max_delay{std::chrono::seconds(1)};  // elastic
    std::string path;                   // "<domain>/<key>=<value or *>/..."
    std::string name;                   // rate_limit.name, for `replaces`
    std::vector<std::string> replaces;  // names of rules this one replaces when both match
    bool unlimited = false;             // rate_limit.unlimited: matched, never limited
    bool share_threshold = false;       // a wildcard value: every matching value shares a count
    std::vector<rule> children;
    counters limiters;
    std::shared_ptr<rule_stats> stats;  // with a limit
  };

  /// Options of the compiled rules, with their defaults.
  struct options {
    keyed_limiter_options keys{};  ///< per rule
    unsigned sub_windows = 6;      ///< for a sliding window counter
  };

  /// Compiles one domain's rules (an object) or several (an array of them). Throws
  /// `config_error` naming the field (`descriptors[0].rate_limit.unit: must be one of second,
  /// minute, hour, day`).
  static basic_rule_set parse(const nlohmann::json& j, options o = {},
                              clock_type clock = clock_type{}) {
    basic_rule_set set(o, clock);
    read_state state;
    if (j.is_array()) {
      if (j.size() > rule_limits::max_descriptors)
        throw config_error("", "must hold at most 1000 domains");
      for (std::size_t i = 0; i < j.size(); ++i) {
        std::string at = "[";  // appended: GCC 12 at -O3 warns falsely on "[" + std::string
        at += std::to_string(i);
        at += ']';
        set.read_domain(j[i], at, state);
      }
    } else {
      set.read_domain(j, "", state);
    }
    return set;
  }

  /// Counts one request (`n` hits) against the rule each descriptor matches; the verdict is
  /// the worst of `check_each`'s.
  rule_verdict check(std::string_view domain, const std::vector<descriptor>& descriptors,
                     double n = 1) {
    std::vector<descriptor_check> each;
    each.reserve(descriptors.size());
    for (const auto& d : descriptors)
      each.push_back({d, n, std::nullopt});
    rule_verdict verdict;
    const auto statuses = check_each(domain, each);
    const bool quota = quota_refuses(statuses);
    for (const auto& s : statuses)
      if (!s.quota || quota) fold(s, verdict);
    return verdict;
  }

  /// Counts one request against the rule each descriptor matches, and says how each fared (in
  /// the descriptors' order). A rule whose `rate_limit.name` another matched rule `replaces`
  /// is not counted (`replaced`); an `unlimited` one never limits; a descriptor's own `limit`
  /// is counted instead of its rule's. An unknown domain, or a descriptor that matches no
  /// rule with a limit, is `ok` with no limit.
  std::vector<descriptor_status> check_each(std::string_view domain,
                                            const std::vector<descriptor_check>& descriptors) {
    return check_each(domain, descriptors,
                      [](const rule&, const std::string&, double,
                         std::size_t) -> std::optional<descriptor_status> { return std::nullopt; });
  }

  /// As above, with the counting of a rule's keys handed to `count(rule, key, hits,
  /// descriptor_index)` first: it returns the descriptor's status (a lease of the key's
  /// resource decided it, say), or nothing for the rule's own limiters to count it. A
  /// descriptor's own `limit` is always counted here.
  template <class Count>
  std::vector<descriptor_status> check_each(std::string_view domain,
                                            const std::vector<descriptor_check>& descriptors,
                                            Count&& count) {
    std::vector<descriptor_status> out(descriptors.size());
    const auto d = std::find_if(domains_.begin(), domains_.end(),
                                [&](const auto& x) { return x.name == domain; });
    std::vector<const rule*> found(descriptors.size(), nullptr);
    std::vector<std::string> keys(descriptors.size());
    for (std::size_t i = 0; i < descriptors.size(); ++i) {
      if (d != domains_.end()) {
        keys[i] = d->escaped;
        found[i] = match(d->rules, descriptors[i].entries, keys[i]);
      }
    }
    for (std::size_t i = 0; i < descriptors.size(); ++i) {
      const auto& c = descriptors[i];
      if (c.limit) {
        out[i] = decide_override(domain, c, found[i] ? found[i]->name : std::string(),
                                 d != domains_.end() ? d->algorithm : 0);
      } else if (found[i] && found[i]->unlimited) {
        out[i].unlimited = true;
        out[i].name = found[i]->name;
      } else if (found[i] && is_replaced(*found[i], found)) {
        out[i].replaced = true;
      } else if (found[i] && found[i]->requests_per_unit >= 0) {
        auto counted = count(*found[i], keys[i], c.hits, i);
        out[i] =
            counted ? std::move(*counted) : decide(*found[i], found[i]->limiters, keys[i], c.hits);
      }
    }
    return out;
  }

  /// The status of `hits` on `r`'s `key` decided elsewhere (from a root's count): `admitted`, with
  /// `window_limit`, `remaining` and `reset` of the limiter that decided; counted in the rule's
  /// stats as `check_each` counts.
  descriptor_status status_of(const rule& r, const std::string& key, double hits, bool admitted,
                              double window_limit, double remaining, std::chrono::nanoseconds reset,
                              std::chrono::nanoseconds retry_after) {
    descriptor_status s;
    s.code = admitted ? rule_code::ok : rule_code::refused;
    s.limit = r.requests_per_unit;
    s.window = r.unit;
    s.name = r.name;
    s.shadow = r.shadow;
    s.remaining = admitted ? std::max(0.0, remaining) : 0;
    s.reset = reset;
    s.retry_after = admitted ? std::chrono::nanoseconds(0) : retry_after;
    s.key = key;
    count_hits(r, s, hits, window_limit);
    return s;
  }

  /// The rules as resource templates: `identifier_glob` the rule's path, `capacity` its
  /// requests per second. A Doorman node configured with them shares each key's limit
  /// across a fleet (one resource, so one lease per client, per key). With `budgets_from`, a
  /// rule whose unit is that or longer is a budget instead: `capacity` its `requests_per_unit` per
  /// window of its unit, windows of UTC time from the Unix epoch (docs/budgets.md).
  [[nodiscard]] std::vector<resource_template> resource_templates(
      std::optional<std::chrono::seconds> budgets_from = std::nullopt) const {
    std::vector<resource_template> out;
    for (const auto& d : domains_)
      collect(d.rules, budgets_from, out);
    return out;
  }

  /// Calls `f(domain, rule_path, stats)` for every rule with a limit, in the files' order.
  template <class F>
  void for_each_stats(F&& f) const {
    for (const auto& d : domains_)
      each_stats(d.name, d.rules, f);
  }

  /// Requests a shadow rule would have refused, so far.
  [[nodiscard]] std::uint64_t shadow_exceeded() const noexcept { return shadow_total_->load(); }

  /// The domains' names.
  [[nodiscard]] std::vector<std::string> domains() const {
    std::vector<std::string> out;
    for (const auto& d : domains_)
      out.push_back(d.name);
    return out;
  }

 private:
  // What reading a file carries from rule to rule: the rules so far, the domain's algorithm.
  struct read_state {
    std::size_t rules = 0;
    std::size_t algorithm = 0;  // in `list`
  };

  struct domain_rules {
    std::string name;
    std::string escaped;  // as a request key begins
    std::vector<rule> rules;
    std::size_t algorithm = 0;  // in `list`
  };

  basic_rule_set(options o, clock_type clock) : options_(o), clock_(clock) {}

  void read_domain(const nlohmann::json& j, const std::string& path, read_state& state) {
    detail::json_reader r(j, path);
    r.only({"domain", "algorithm", "descriptors"});
    domain_rules d;
    if (r.string("domain", d.name) && (d.name.empty() || d.name.size() > 256))
      r.fail("domain", "must be a string of 1 to 256 bytes");
    std::string algorithm(first::name);
    if (r.string("algorithm", algorithm, false)) {
      const auto i = list::index_of(algorithm);
      if (!i) r.fail("algorithm", "must be one of " + algorithm_names());
      d.algorithm = i.value_or(0);
    }
    state.algorithm = d.algorithm;
    for (const auto& other : domains_) {
      if (!r.error() && other.name == d.name) r.fail("domain", "is already defined");
    }
    append_escaped(d.escaped, d.name, "=");
    read_rules(r, "descriptors", d.escaped, 1, d.rules, state);
    if (r.error()) throw config_error(*r.error());
    domains_.push_back(std::move(d));
  }

  void read_rules(detail::json_reader& r, const char* field, const std::string& parent,
                  std::size_t depth, std::vector<rule>& out, read_state& state) {
    r.array(
        field,
        [&](const nlohmann::json& e, const std::string& path) {
          detail::json_reader er(e, path);
          rule x = read_rule(er, parent, depth, state);
          for (const auto& sibling : out) {
            if (!er.error() && sibling.key == x.key && sibling.value == x.value)
              er.fail("", "repeats the key and value of an earlier descriptor");
          }
          r.absorb(er.error());
          out.push_back(std::move(x));
        },
        rule_limits::max_descriptors, false);
  }

  rule read_rule(detail::json_reader& r, const std::string& parent, std::size_t depth,
                 read_state& state) {
    r.only({"key", "value", "rate_limit", "mode", "shadow", "shadow_mode", "quota_mode", "overage",
            "max_delay", "detailed_metric", "value_to_metric", "share_threshold", "descriptors"});
    rule x;
    if (++state.rules > rule_limits::max_rules) r.fail("", "one rule too many (at most 10000)");
    if (depth > rule_limits::max_depth) r.fail("", "nests too deep (at most 8 levels)");
    r.string("key", x.key);
    r.string("value", x.value, false);
    if (!r.error() && (x.key.empty() || x.key.size() > rule_limits::max_key_bytes))
      r.fail("key", "must be a string of 1 to 256 bytes");
    if (!r.error() && x.value.size() > rule_limits::max_key_bytes)
      r.fail("value", "must be at most 256 bytes");
    bool flag = false;  // envoyproxy/ratelimit's metric options: metrics here are per rule
    r.boolean("detailed_metric", flag, false);
    r.boolean("value_to_metric", flag, false);
    r.boolean("share_threshold", x.share_threshold, false);
    if (!r.error() && x.share_threshold && x.value.find('*') == std::string::npos)
      r.fail("share_threshold", "needs a wildcard value (one with '*')");
    x.path = parent;
    if (x.value.find('*') != std::string::npos) {
      append_wildcard(x.path, x.key, x.value);
    } else {
      append_entry(x.path, x.key, x.value);
      if (x.value.empty()) x.path += '*';
    }
    read_limit(r, x);
    read_rules(r, "descriptors", x.path, depth + 1, x.children, state);
    if (!r.error() && x.requests_per_unit >= 0) {
      x.limiters = make_limiters(x, state.algorithm);
      x.stats = std::make_shared<rule_stats>();
    }
    return x;
  }

  void read_limit(detail::json_reader& r, rule& x) {
    std::string mode = "hard";
    r.string("mode", mode, false);
    if (mode == "soft") {
      x.mode = rule_mode::soft;
    } else if (mode == "elastic") {
      x.mode = rule_mode::elastic;
    } else if (mode != "hard") {
      r.fail("mode", "must be one of hard, soft, elastic");
    }
    r.boolean("shadow", x.shadow, false);
    bool shadow_mode = false;  // envoyproxy/ratelimit's name for it
    if (r.boolean("shadow_mode", shadow_mode, false)) x.shadow = x.shadow || shadow_mode;
    r.boolean("quota_mode", x.quota, false);
    if (r.number("overage", x.overage, false)) r.within("overage", x.overage, 0, 10);
    double delay = 1;
    if (r.number("max_delay", delay, false))
      r.within("max_delay", delay, 0, rule_limits::max_delay);
    x.max_delay = std::chrono::nanoseconds(static_cast<std::int64_t>(delay * 1e9));
    const nlohmann::json* limit = r.object("rate_limit", false);
    if (!limit || r.error()) return;
    detail::json_reader lr(*limit, r.at("rate_limit"));
    lr.only({"unit", "requests_per_unit", "unlimited", "name", "replaces"});
    lr.boolean("unlimited", x.unlimited, false);
    lr.string("name", x.name, false);
    read_replaces(lr, x);
    std::string unit;
    if (lr.string("unit", unit, !x.unlimited)) {
      if (x.unlimited) lr.fail("unit", "must not be given with unlimited");
      // Envoy's units; a month is 30 days and a year 365, as envoyproxy/ratelimit counts them.
      constexpr std::array<std::pair<std::string_view, std::int64_t>, 7> units{
          {{"second", 1},
           {"minute", 60},
           {"hour", 3600},
           {"day", 86400},
           {"week", 604800},
           {"month", 2592000},
           {"year", 31536000}}};
      const auto u = std::find_if(units.begin(), units.end(), [&](const auto& p) {
        return p.first.size() == unit.size() &&
               std::equal(unit.begin(), unit.end(), p.first.begin(),
                          [](char a, char b) { return (a | 0x20) == b; });
      });
      if (u == units.end()) {
        lr.fail("unit", "must be one of second, minute, hour, day, week, month, year");
      } else {
        x.unit = std::chrono::seconds(u->second);
      }
    }
    std::int64_t n = 0;
    if (lr.integer("requests_per_unit", n, !x.unlimited)) {
      lr.within("requests_per_unit", static_cast<double>(n), 0, rule_limits::max_requests_per_unit);
      x.requests_per_unit = static_cast<double>(n);
    }
    if (x.unlimited) x.requests_per_unit = -1;
    r.absorb(lr.error());
  }

  // `rate_limit.replaces`: a list of `{name: NAME}`, none empty nor the rule's own name.
  static void read_replaces(detail::json_reader& lr, rule& x) {
    lr.array(
        "replaces",
        [&](const nlohmann::json& e, const std::string& path) {
          detail::json_reader er(e, path);
          er.only({"name"});
          std::string name;
          if (er.string("name", name) && (name.empty() || name.size() > rule_limits::max_key_bytes))
            er.fail("name", "must be a string of 1 to 256 bytes");
          if (!er.error() && name == x.name) er.fail("name", "must not be the rule's own name");
          lr.absorb(er.error());
          x.replaces.push_back(std::move(name));
        },
        rule_limits::max_descriptors, false);
  }

  static std::string algorithm_names() {
    std::string out;
    for (const auto n : list::names)
      out += (out.empty() ? "" : ", ") + std::string(n);
    return out;
  }

  counters make_limiters(const rule& x, std::size_t algorithm) const {
    // A soft rule counts up to its overage; the verdict reports what is over the limit.
    const double limit = x.mode == rule_mode::soft
                             ? std::floor(x.requests_per_unit * (1 + x.overage))
                             : x.requests_per_unit;
    // A key is cut per value (append_entry), never as a whole.
    keyed_limiter_options keys = options_.keys;
    keys.max_key_bytes = std::numeric_limits<std::size_t>::max();
    const window_limiter_options w{
        .limit = limit, .window = x.unit, .sub_windows = options_.sub_windows};
    return detail::variant_at<counters>(algorithm, [&](auto i) {
      using L =
          typename std::tuple_element_t<decltype(i)::value, std::tuple<Algorithms...>>::limiter;
      return std::make_shared<keyed_limiter<L>>(w, keys, clock_);
    });
  }

  // The rule `desc` matches, extending `key` with its path; null when an entry matched none.
  static const rule* match(const std::vector<rule>& rules, const descriptor& desc,
                           std::string& key) {
    const std::vector<rule>* level = &rules;
    const rule* found = nullptr;
    for (const auto& entry : desc) {
      if (!level) return nullptr;
      const rule* exact = nullptr;
      const rule* wild = nullptr;
      const rule* any = nullptr;
      for (const auto& r : *level) {
        if (r.key != entry.key) continue;
        if (r.value == entry.value) {
          exact = &r;
        } else if (!wild && r.value.find('*') != std::string::npos &&
                   wildcard_match(r.value, entry.value)) {
          wild = &r;
        }
        if (r.value.empty()) any = &r;
      }
      found = exact ? exact : wild ? wild : any;
      if (!found) return nullptr;
      // Values matching a wildcard share one count when the rule says so.
      append_entry(key, entry.key,
                   found == wild && wild->share_threshold ? wild->value : entry.value);
      level = found->children.empty() ? nullptr : &found->children;
    }
    return found;
  }

  // Whether `value` matches `pattern`, whose `*`s stand for any run of bytes (as
  // envoyproxy/ratelimit matches them: the literal pieces in order, the first a prefix and the
  // last a suffix).
  static bool wildcard_match(std::string_view pattern, std::string_view value) {
    const auto first = pattern.find('*');
    const auto last = pattern.rfind('*');
    const auto prefix = pattern.substr(0, first);
    const auto suffix = pattern.substr(last + 1);
    if (value.size() < prefix.size() + suffix.size() || !value.starts_with(prefix) ||
        !value.ends_with(suffix)) {
      return false;
    }
    auto rest = value.substr(prefix.size(), value.size() - prefix.size() - suffix.size());
    for (auto at = first + 1; at <= last;) {
      const auto next = pattern.find('*', at);
      const auto piece = pattern.substr(at, next - at);
      const auto found = rest.find(piece);
      if (found == std::string_view::npos) return false;
      rest.remove_prefix(found + piece.size());
      at = next + 1;
    }
    return true;
  }

  // The glob of the request keys a wildcard value gives: its pieces escaped, joined by `*`.
  static void append_wildcard(std::string& path, std::string_view k, std::string_view pattern) {
    path += '/';
    append_escaped(path, k, "=");
    path += '=';
    for (std::size_t at = 0;;) {
      const auto next = pattern.find('*', at);
      append_escaped(path, pattern.substr(at, next - at), "=");
      if (next == std::string_view::npos) break;
      path += '*';
      at = next + 1;
    }
  }

  static void append_entry(std::string& key, std::string_view k, std::string_view value) {
    append_key_entry(key, k, value, rule_limits::max_key_bytes);
  }
  static void append_piece(std::string& key, std::string_view piece) {
    append_key_piece(key, piece, rule_limits::max_key_bytes);
  }

  // Counts `n` hits of `key` against `r` (with `limiters`, the rule's or an override's).
  descriptor_status decide(const rule& r, const counters& limiters, const std::string& key,
                           double n) {
    const auto [result, st] = std::visit(
        [&](const auto& counts) {
          const auto limiter = counts->get(key);
          const auto admitted = limiter->try_acquire(n);
          return std::pair(admitted, limiter->status());
        },
        limiters);
    const double over = r.mode == rule_mode::soft ? st.limit - r.requests_per_unit : 0;
    descriptor_status s;
    if (!result) {
      s.code = r.mode == rule_mode::elastic && result.retry_after <= r.max_delay
                   ? rule_code::delay
                   : rule_code::refused;
      s.retry_after = std::chrono::duration_cast<std::chrono::nanoseconds>(result.retry_after);
    } else if (st.remaining < over) {
      s.code = rule_code::soft;
    }
    s.limit = r.requests_per_unit;
    s.window = r.unit;
    s.name = r.name;
    s.shadow = r.shadow;
    s.quota = r.quota;
    s.remaining = std::max(0.0, st.remaining - over);
    s.reset = st.reset;
    // A refusal in a window with nothing counted (more hits than the limit) still names the
    // window's end: the limiter's reset is 0 there (nothing to wait for), its retry time is not.
    if (!result && s.reset <= std::chrono::nanoseconds(0)) {
      s.reset = std::min<std::chrono::nanoseconds>(s.retry_after, r.unit);
    }
    s.key = key;
    if (r.stats) count_hits(r, s, n, st.limit - over);
    return s;
  }

  // Counts `hits` decided as `s` says in the rule's stats, the window's limit being
  // `window_limit` (the rule's).
  void count_hits(const rule& r, const descriptor_status& s, double hits, double window_limit) {
    const auto whole = [](double x) { return static_cast<std::uint64_t>(std::llround(x)); };
    auto& st = *r.stats;
    st.total_hits += whole(hits);
    if (s.code == rule_code::refused || s.code == rule_code::delay) {
      st.over_limit += whole(hits);
      if (r.shadow) {
        st.shadow_mode += whole(hits);
        shadow_total_->fetch_add(1);
      }
      return;
    }
    st.within_limit += whole(hits);
    const double used = window_limit - s.remaining;  // after these hits
    const double near = std::floor(window_limit * rule_stats::near_ratio);
    st.near_limit += whole(std::clamp(used - std::max(near, used - hits), 0.0, hits));
  }

  // Folds one descriptor's outcome into the request's verdict (a shadow rule only marks it).
  static void fold(const descriptor_status& s, rule_verdict& v) {
    if (s.limit < 0) return;
    if (s.shadow) {
      if (s.code != rule_code::ok) v.shadow_exceeded = true;
      return;
    }
    if (v.limit < 0 || s.remaining < v.remaining || s.code > v.code) {
      v.limit = s.limit;
      v.remaining = s.remaining;
      v.window = s.window;
      v.reset = s.reset;
      v.key = s.key;
    }
    if (s.code > v.code) v.code = s.code;
    v.retry_after = std::max(v.retry_after, s.retry_after);
  }

  // Whether a rule is named in the `replaces` of another rule matched by the same request.
  static bool is_replaced(const rule& r, const std::vector<const rule*>& matched) {
    if (r.name.empty()) return false;
    return std::any_of(matched.begin(), matched.end(), [&](const rule* m) {
      return m && m != &r &&
             std::find(m->replaces.begin(), m->replaces.end(), r.name) != m->replaces.end();
    });
  }

  // A descriptor's own limit: counted under its entries' key by the limiters of that limit,
  // with the domain's algorithm (at most `max_overrides` distinct limits are kept; past them,
  // one is dropped and its counts start again).
  descriptor_status decide_override(std::string_view domain, const descriptor_check& c,
                                    std::string name, std::size_t algorithm) {
    rule r;
    r.requests_per_unit =
        std::clamp(c.limit->requests_per_unit, 0.0, rule_limits::max_requests_per_unit);
    r.unit = c.limit->unit;
    r.name = std::move(name);
    std::string key;
    append_piece(key, domain);  // a request's domain: up to 1024 bytes
    for (const auto& e : c.entries)
      append_entry(key, e.key, e.value);
    const std::tuple<double, std::int64_t, std::size_t> id{r.requests_per_unit, r.unit.count(),
                                                           algorithm};
    auto it = overrides_.find(id);
    if (it == overrides_.end()) {
      if (overrides_.size() >= rule_limits::max_overrides) overrides_.erase(overrides_.begin());
      it = overrides_.emplace(id, make_limiters(r, algorithm)).first;
    }
    return decide(r, it->second, key, c.hits);
  }

  template <class F>
  static void each_stats(const std::string& domain, const std::vector<rule>& rules, F& f) {
    for (const auto& r : rules) {
      if (r.stats) f(domain, r.path, static_cast<const rule_stats&>(*r.stats));
      each_stats(domain, r.children, f);
    }
  }

  static void collect(const std::vector<rule>& rules,
                      const std::optional<std::chrono::seconds>& budgets_from,
                      std::vector<resource_template>& out) {
    for (const auto& r : rules) {
      if (r.requests_per_unit >= 0) {
        resource_template t;
        t.identifier_glob = r.path;
        t.capacity = r.requests_per_unit / std::chrono::duration<double>(r.unit).count();
        t.description = "rule " + r.path;
        if (budgets_from && r.unit >= *budgets_from) {
          t.capacity = r.requests_per_unit;
          const auto unit = std::chrono::duration_cast<std::chrono::seconds>(r.unit).count();
          t.budget = budget_config{.period = budget_period::fixed, .fixed_seconds = unit};
        }
        out.push_back(std::move(t));
      }
      collect(r.children, budgets_from, out);
    }
  }

  options options_;
  [[no_unique_address]] clock_type clock_;
  std::vector<domain_rules> domains_;
  // Per-request limits' counts, by limit, unit (ns) and algorithm.
  std::map<std::tuple<double, std::int64_t, std::size_t>, counters> overrides_;
  std::shared_ptr<std::atomic<std::uint64_t>> shadow_total_ =
      std::make_shared<std::atomic<std::uint64_t>>(0);
};

using rule_set = basic_rule_set<>;

}  // namespace doorman
