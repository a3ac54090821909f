#pragma once

/// \file
/// What a node's admin endpoint shows (docs/operations.md), sans-I/O: the counters a node keeps
/// (`node_metrics`), a snapshot of its state taken on its strand (`admin_snapshot`), and the
/// pages rendered from them: Prometheus text exposition (`render_metrics`), the HTML status
/// pages (`render_status`, `render_resource`) and the health answers.
///
///     node_metrics m;
///     m.observe(record, seconds_taken);          // per request
///     std::string text = render_metrics(snapshot, m);

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "doorman/core/config.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/connection_counts.hpp"
#include "doorman/protocol/dispatch.hpp"
#include "doorman/version.hpp"

namespace doorman {

/// The version the admin endpoint reports in `doorman_build_info` and on the status page.
inline constexpr std::string_view version = DOORMAN_VERSION_STRING;

/// A cumulative latency histogram with fixed bucket bounds (seconds).
struct latency_histogram {
  /// From 1 µs (a decision on the hot path takes a few) to 100 ms.
  static constexpr std::array<double, 16> bounds = {1e-6,   2.5e-6, 5e-6,   10e-6, 25e-6,  50e-6,
                                                    100e-6, 250e-6, 500e-6, 1e-3,  2.5e-3, 5e-3,
                                                    10e-3,  25e-3,  50e-3,  0.1};
  std::array<std::uint64_t, bounds.size()> buckets{};  ///< observations <= bounds[i] (not summed)
  std::uint64_t count = 0;
  double sum = 0;

  void observe(double taken) noexcept {
    const auto it = std::lower_bound(bounds.begin(), bounds.end(), taken);
    if (it != bounds.end()) ++buckets[static_cast<std::size_t>(it - bounds.begin())];
    ++count;
    sum += taken;
  }
};

/// The outcomes a request is counted under: `ok`, or the JSON-RPC error it got (the codes
/// in the order of their names after `ok`).
inline constexpr std::array<const char*, 7> rpc_outcome_names = {
    "ok",           "parse_error", "invalid_request", "method_not_found", "invalid_params",
    "server_error", "forbidden"};
inline constexpr std::array<rpc_code, 6> rpc_outcome_codes = {
    rpc_code::parse_error,    rpc_code::invalid_request, rpc_code::method_not_found,
    rpc_code::invalid_params, rpc_code::server_error,    rpc_code::forbidden};

[[nodiscard]] inline std::size_t outcome_index(const std::optional<rpc_code>& e) noexcept {
  if (!e) return 0;
  const auto it = std::find(rpc_outcome_codes.begin(), rpc_outcome_codes.end(), *e);
  const auto at = it != rpc_outcome_codes.end() ? it : rpc_outcome_codes.begin() + 4;
  return 1 + static_cast<std::size_t>(at - rpc_outcome_codes.begin());  // unknown: server_error
}

/// The counters a node keeps, touched on its strand only.
struct node_metrics {
  /// Requests by door, method and outcome.
  std::array<
      std::array<std::array<std::uint64_t, rpc_outcome_names.size()>, rpc_method_names.size()>,
      rpc_door_names.size()>
      requests{};
  /// Time to handle a request (parse, decide, serialize), by door and method.
  std::array<std::array<latency_histogram, rpc_method_names.size()>, rpc_door_names.size()>
      latency{};
  std::uint64_t master_changes = 0;
  std::uint64_t fenced = 0;  ///< times a master stepped down at the end of its term
  std::uint64_t reloads_ok = 0;
  std::uint64_t reloads_failed = 0;
  double last_reload_unix = 0;  ///< when the configuration was last loaded (Unix seconds)
  std::uint64_t parent_requests_failed = 0;
  std::uint64_t parent_requests_ok = 0;

  void observe(const dispatch_record& r, double taken) noexcept {
    const auto d = static_cast<std::size_t>(r.door);
    const auto m = static_cast<std::size_t>(r.method);
    ++requests[d][m][outcome_index(r.error)];
    latency[d][m].observe(taken);
  }

  /// A configuration loaded (`ok`), or rejected.
  void count_reload(bool ok) {
    if (!ok) {
      ++reloads_failed;
      return;
    }
    ++reloads_ok;
    last_reload_unix = unix_seconds_now();
  }
};

/// One resource as the admin pages show it: its state, and the template that configures it.
struct admin_resource {
  resource_status status;
  std::string description;
  std::string glob;                    ///< the template's identifier_glob
  std::optional<double> parent_lease;  ///< an intermediate's lease from its parent
  /// A learned capacity's last control steps, `at` relative to the snapshot (resource page
  /// only; docs/learned-capacity.md).
  std::vector<learned_point> learned_history{};
};

/// A node's state for the admin pages, taken on its strand.
struct admin_snapshot {
  node_identity identity;
  std::string listen;
  std::string config_source;  ///< where the configuration comes from ("" when given in code)
  mastership_info mastership;
  bool started = false;
  double uptime = 0;  ///< seconds since `start`
  std::size_t connections_open = 0;
  net::connection_counts connections;  ///< of the JSON-RPC server
  bool has_parent = false;
  int parent_failures = 0;                     ///< consecutive
  std::optional<double> since_parent_success;  ///< seconds; none before the first
  std::vector<admin_resource> resources;       ///< with state, sorted by id
  std::vector<resource_template> templates;    ///< the configuration
  std::vector<lease_status> leases;            ///< one page (resource page only)
  std::size_t lease_count = 0;                 ///< all leases of the resource
};

/// Readiness: the configuration is loaded and the node is master or knows who is.
[[nodiscard]] inline std::pair<bool, std::string> readiness(const admin_snapshot& s) {
  if (!s.started) return {false, "not started"};
  if (s.mastership.is_master) return {true, "master"};
  if (s.mastership.master && !s.mastership.master->empty()) {
    return {true, "following master " + *s.mastership.master};
  }
  return {false, "no master known"};
}

namespace detail {

// Prometheus label value escaping: backslash, double quote and newline.
inline std::string prom_escape(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (const char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// A sample value: integers without a fraction, +Inf/-Inf/NaN spelled as Prometheus wants.
inline std::string prom_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    return fmt::format("{}", static_cast<long long>(v));
  return fmt::format("{}", v);
}

// Writes metric families: a HELP and TYPE header, then its samples.
class prom_writer {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(std::string_view name, std::string_view labels, double value) {
    out_ += name;
    if (!labels.empty()) out_ += fmt::format("{{{}}}", labels);
    out_ += ' ';
    out_ += prom_value(value);
    out_ += '\n';
  }
  void histogram(std::string_view name, std::string_view labels, const latency_histogram& h) {
    std::uint64_t cumulative = 0;
    const std::string sep = labels.empty() ? "" : ",";
    for (std::size_t i = 0; i < h.bounds.size(); ++i) {
      cumulative += h.buckets[i];
      sample(fmt::format("{}_bucket", name),
             fmt::format("{}{}le=\"{}\"", labels, sep, prom_value(h.bounds[i])),
             static_cast<double>(cumulative));
    }
    sample(fmt::format("{}_bucket", name), fmt::format("{}{}le=\"+Inf\"", labels, sep),
           static_cast<double>(h.count));
    sample(fmt::format("{}_sum", name), labels, h.sum);
    sample(fmt::format("{}_count", name), labels, static_cast<double>(h.count));
  }
  [[nodiscard]] std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// Whether door `d` shows its series: the JSON-RPC door always (every method's `ok`, at 0
// too), another door once it has had a call.
inline bool door_shown(const node_metrics& m, std::size_t d) {
  if (d == 0) return true;
  for (const auto& method : m.requests[d])
    for (const auto n : method)
      if (n != 0) return true;
  return false;
}

inline void render_requests(prom_writer& w, const node_metrics& m) {
  w.family("doorman_requests_total", "counter",
           "Requests handled, by method, outcome and door (json-rpc, grpc).");
  for (std::size_t d = 0; d < rpc_door_names.size(); ++d) {
    if (!door_shown(m, d)) continue;
    for (std::size_t i = 0; i < rpc_method_names.size(); ++i)
      for (std::size_t o = 0; o < rpc_outcome_names.size(); ++o)
        if (m.requests[d][i][o] != 0 || (o == 0 && d == 0)) {
          w.sample("doorman_requests_total",
                   fmt::format("method=\"{}\",outcome=\"{}\",door=\"{}\"", rpc_method_names[i],
                               rpc_outcome_names[o], rpc_door_names[d]),
                   static_cast<double>(m.requests[d][i][o]));
        }
  }
  w.family("doorman_request_duration_seconds", "histogram",
           "Time to handle one request (parse, decide, answer), by method and door.");
  for (std::size_t d = 0; d < rpc_door_names.size(); ++d) {
    if (!door_shown(m, d)) continue;
    for (std::size_t i = 0; i < rpc_method_names.size(); ++i)
      w.histogram("doorman_request_duration_seconds",
                  fmt::format("method=\"{}\",door=\"{}\"", rpc_method_names[i], rpc_door_names[d]),
                  m.latency[d][i]);
  }
}

inline void render_connections(prom_writer& w, const admin_snapshot& s) {
  w.family("doorman_connections_open", "gauge", "JSON-RPC connections open now.");
  w.sample("doorman_connections_open", "", static_cast<double>(s.connections_open));
  w.family("doorman_connections_accepted_total", "counter", "JSON-RPC connections accepted.");
  w.sample("doorman_connections_accepted_total", "", static_cast<double>(s.connections.accepted));
  w.family("doorman_connections_refused_total", "counter",
           "JSON-RPC connections refused for max_connections.");
  w.sample("doorman_connections_refused_total", "", static_cast<double>(s.connections.refused));
  w.family("doorman_connections_closed_idle_total", "counter",
           "JSON-RPC connections closed for idle_timeout.");
  w.sample("doorman_connections_closed_idle_total", "",
           static_cast<double>(s.connections.closed_idle));
  w.family("doorman_tls_handshakes_failed_total", "counter",
           "TLS handshakes on the JSON-RPC port that failed or timed out.");
  w.sample("doorman_tls_handshakes_failed_total", "",
           static_cast<double>(s.connections.failed_handshakes));
}

// A gauge per resource that has a part (a budget, a learned capacity), read from that part.
template <class Part>
struct part_gauge {
  const char* name;
  const char* help;
  double (*get)(const Part&);
};

// Each of `gauges` for every resource that has `part`, labelled with the resource.
template <class Part, std::size_t N>
void render_part(prom_writer& w, const admin_snapshot& s,
                 std::optional<Part> resource_status::*part, const part_gauge<Part> (&gauges)[N]) {
  for (const auto& g : gauges) {
    w.family(g.name, "gauge", g.help);
    for (const auto& r : s.resources)
      if (const auto& p = r.status.*part) {
        w.sample(g.name, fmt::format("resource=\"{}\"", prom_escape(r.status.resource_id)),
                 g.get(*p));
      }
  }
}

// A root's learned capacities (docs/learned-capacity.md): the calls and overloads a second of
// each one's last control step; its capacity is `doorman_resource_capacity`.
inline void render_learned(prom_writer& w, const admin_snapshot& s) {
  static constexpr part_gauge<learned_info> gauges[] = {
      {"doorman_resource_learned_calls",
       "Calls a second to the protected service in a learned resource's last control step.",
       [](const learned_info& l) { return l.seconds > 0 ? l.calls / l.seconds : 0.0; }},
      {"doorman_resource_learned_overloads", "Of those, answered overloaded, a second.",
       [](const learned_info& l) { return l.seconds > 0 ? l.overloads / l.seconds : 0.0; }}};
  render_part(w, s, &resource_status::learned, gauges);
}

// The budgets (docs/budgets.md), for alerts on what is spent of a window: its limit, what was
// spent and what is left (neither spent nor allotted), when it began and how long until it
// ends.
inline void render_budgets(prom_writer& w, const admin_snapshot& s) {
  static constexpr part_gauge<budget_info> gauges[] = {
      {"doorman_budget_limit", "Units a budget holds per window.",
       [](const budget_info& b) { return b.limit; }},
      {"doorman_budget_spent", "Units spent in the budget's current window, as reported.",
       [](const budget_info& b) { return b.spent; }},
      {"doorman_budget_left", "Units of the current window neither spent nor allotted.",
       [](const budget_info& b) { return b.left; }},
      {"doorman_budget_window_start_timestamp_seconds",
       "When the budget's current window began, Unix seconds.",
       [](const budget_info& b) { return static_cast<double>(b.window); }},
      {"doorman_budget_window_remaining_seconds", "Seconds until the budget's window ends.",
       [](const budget_info& b) { return b.reset; }}};
  render_part(w, s, &resource_status::budget, gauges);
}

inline void render_resources(prom_writer& w, const admin_snapshot& s) {
  struct column {
    const char* name;
    const char* help;
    double (*get)(const admin_resource&);
  };
  static constexpr column columns[] = {
      {"doorman_resource_capacity", "Capacity of the resource at this node.",
       [](const admin_resource& r) { return r.status.capacity; }},
      {"doorman_resource_has", "Sum of the capacity leased to clients.",
       [](const admin_resource& r) { return r.status.sum_has; }},
      {"doorman_resource_wants", "Sum of what the clients ask for.",
       [](const admin_resource& r) { return r.status.sum_wants; }},
      {"doorman_resource_clients", "Clients (and server children) holding a lease.",
       [](const admin_resource& r) { return static_cast<double>(r.status.clients); }},
      {"doorman_resource_subclients", "Clients below, as server children report them.",
       [](const admin_resource& r) { return r.status.subclients; }},
      {"doorman_resource_learning", "1 while the resource is in learning mode.",
       [](const admin_resource& r) { return r.status.learning ? 1.0 : 0.0; }},
  };
  for (const auto& c : columns) {
    w.family(c.name, "gauge", c.help);
    for (const auto& r : s.resources)
      w.sample(c.name, fmt::format("resource=\"{}\"", prom_escape(r.status.resource_id)), c.get(r));
  }
  render_learned(w, s);
  render_budgets(w, s);
  w.family("doorman_resource_info", "gauge", "1 per resource, labelled with its algorithm.");
  for (const auto& r : s.resources)
    w.sample("doorman_resource_info",
             fmt::format("resource=\"{}\",algorithm=\"{}\"", prom_escape(r.status.resource_id),
                         prom_escape(r.status.algorithm)),
             1);
}

inline void render_upstream(prom_writer& w, const admin_snapshot& s, const node_metrics& m) {
  if (!s.has_parent) return;
  w.family("doorman_parent_lease_capacity", "gauge",
           "Capacity leased from the parent, per resource.");
  for (const auto& r : s.resources)
    if (r.parent_lease) {
      w.sample("doorman_parent_lease_capacity",
               fmt::format("resource=\"{}\"", prom_escape(r.status.resource_id)), *r.parent_lease);
    }
  w.family("doorman_parent_requests_total", "counter", "Requests to the parent, by outcome.");
  w.sample("doorman_parent_requests_total", "outcome=\"ok\"",
           static_cast<double>(m.parent_requests_ok));
  w.sample("doorman_parent_requests_total", "outcome=\"failed\"",
           static_cast<double>(m.parent_requests_failed));
  w.family("doorman_parent_consecutive_failures", "gauge",
           "Requests to the parent failed in a row.");
  w.sample("doorman_parent_consecutive_failures", "", s.parent_failures);
  w.family("doorman_parent_last_success_age_seconds", "gauge",
           "Seconds since the parent last answered (absent before it first did).");
  if (s.since_parent_success) {
    w.sample("doorman_parent_last_success_age_seconds", "", *s.since_parent_success);
  }
}

inline void render_node(prom_writer& w, const admin_snapshot& s, const node_metrics& m) {
  w.family("doorman_build_info", "gauge", "1, labelled with the version and the node's role.");
  w.sample("doorman_build_info",
           fmt::format("version=\"{}\",role=\"{}\",id=\"{}\"", version,
                       prom_escape(s.identity.role), prom_escape(s.identity.id)),
           1);
  w.family("doorman_uptime_seconds", "gauge", "Seconds since the node started.");
  w.sample("doorman_uptime_seconds", "", s.uptime);
  w.family("doorman_is_master", "gauge", "1 when this node is its position's master.");
  w.sample("doorman_is_master", "", s.mastership.is_master ? 1 : 0);
  w.family("doorman_master_changes_total", "counter", "Times this node gained or lost mastership.");
  w.sample("doorman_master_changes_total", "", static_cast<double>(m.master_changes));
  w.family("doorman_mastership_fenced_total", "counter",
           "Times a master stepped down because its election term ended before it could renew.");
  w.sample("doorman_mastership_fenced_total", "", static_cast<double>(m.fenced));
  w.family("doorman_config_reloads_total", "counter", "Configuration loads, by outcome.");
  w.sample("doorman_config_reloads_total", "outcome=\"ok\"", static_cast<double>(m.reloads_ok));
  w.sample("doorman_config_reloads_total", "outcome=\"failed\"",
           static_cast<double>(m.reloads_failed));
  w.family("doorman_config_last_reload_timestamp_seconds", "gauge",
           "When the configuration in use was loaded (Unix time).");
  w.sample("doorman_config_last_reload_timestamp_seconds", "", m.last_reload_unix);
  w.family("doorman_config_templates", "gauge", "Resource templates in the configuration.");
  w.sample("doorman_config_templates", "", static_cast<double>(s.templates.size()));
}

}  // namespace detail

/// The Prometheus text exposition (format 0.0.4) of a node's state and counters.
[[nodiscard]] inline std::string render_metrics(const admin_snapshot& s, const node_metrics& m) {
  detail::prom_writer w;
  detail::render_node(w, s, m);
  detail::render_requests(w, m);
  detail::render_connections(w, s);
  detail::render_resources(w, s);
  detail::render_upstream(w, s, m);
  return w.take();
}

}  // namespace doorman
