#pragma once

/// \file
/// The admin endpoint's pages and routes, sans-I/O: `/status` (the node, its master and parent,
/// a row per resource with state, the configuration's templates) and `/status/resources/<id>`
/// (one resource and a page of its leases), in plain HTML and a little CSS, no script: they
/// read the same in a browser, `curl` and a test; and `route_admin`, which answers every path
/// of the endpoint from a node's state.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "doorman/core/markup.hpp"
#include "doorman/core/svg_chart.hpp"
#include "doorman/core/time_text.hpp"
#include "doorman/net/http_request.hpp"
#include "doorman/node/admin.hpp"
#include "doorman/protocol/json_rpc.hpp"

namespace doorman {

/// Leases shown per page of `/status/resources/<id>`.
inline constexpr std::size_t leases_per_page = 500;

namespace detail {

// A path segment percent-encoded (unreserved bytes kept), for links to a resource.
inline std::string url_segment(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      out += fmt::format("%{:02X}", u);
    }
  }
  return out;
}

inline std::string num(double v) {
  return fmt::format("{:.6g}", v);
}

// One cell of a table row: HTML already escaped, and the cell's attributes.
struct cell {
  std::string html;
  std::string_view attributes{};
};
inline cell text(std::string_view s) {
  return {xml_escape(s)};
}
inline cell number(double v) {
  return {num(v), " class=\"n\""};
}
inline cell count(std::size_t v) {
  return {std::to_string(v), " class=\"n\""};
}

inline std::string table_row(std::initializer_list<cell> cells) {
  std::string out = "<tr>";
  for (const cell& c : cells)
    out += fmt::format("<td{}>{}</td>", c.attributes, c.html);
  return out + "</tr>\n";
}

// The opening of table `id` and its row of column names.
inline std::string table_start(std::string_view id, std::initializer_list<std::string_view> names) {
  std::string out = fmt::format("<table id=\"{}\">\n<tr>", id);
  for (const std::string_view n : names)
    out += fmt::format("<th>{}</th>", n);
  return out + "</tr>\n";
}

inline std::string page_head(std::string_view title) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n"
      "<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse;"
      "margin:.5em 0 1.5em}}th,td{{border:1px solid #bbb;padding:.25em .6em;text-align:left}}"
      "th{{background:#eee}}td.n{{text-align:right}}.learning{{color:#a60}}</style></head>"
      "<body>\n<h1>{}</h1>\n",
      xml_escape(title), xml_escape(title));
}

inline std::string identity_table(const admin_snapshot& s) {
  const auto [ready, why] = readiness(s);
  std::string master =
      s.mastership.is_master ? std::string("this node") : s.mastership.master.value_or("(unknown)");
  std::string out = "<table id=\"node\">\n";
  auto row = [&](std::string_view k, const std::string& v) {
    out += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", k, xml_escape(v));
  };
  row("id", s.identity.id);
  row("role", s.identity.role);
  row("level", std::to_string(s.identity.level));
  row("listening on", s.listen);
  row("master", master);
  row("parent", s.identity.parent.value_or("(none: root)"));
  if (s.has_parent) {
    row("parent failures in a row", std::to_string(s.parent_failures));
    row("last parent answer",
        s.since_parent_success ? num(*s.since_parent_success) + " s ago" : std::string("never"));
  }
  row("configuration", !s.config_source.empty() ? s.config_source
                       : s.has_parent           ? std::string("(none: adopted from the parent)")
                                                : std::string("(given in code)"));
  row("ready", ready ? "yes (" + why + ")" : "no (" + why + ")");
  row("uptime", duration_text(s.uptime));
  row("connections", std::to_string(s.connections_open));
  row("version", std::string(version));
  return out + "</table>\n";
}

inline std::string resource_row(const admin_resource& r, bool with_link) {
  const auto& st = r.status;
  cell id = text(st.resource_id);
  if (with_link)
    id.html = fmt::format("<a href=\"/status/resources/{}\">{}</a>", url_segment(st.resource_id),
                          id.html);
  return table_row({id,
                    number(st.capacity),
                    number(st.sum_has),
                    number(st.sum_wants),
                    count(st.clients),
                    number(st.subclients),
                    {st.learning ? "yes" : "no", st.learning ? " class=\"learning\"" : ""},
                    text(st.algorithm),
                    text(r.glob),
                    r.parent_lease ? number(*r.parent_lease) : cell{"-"},
                    text(r.description)});
}

// The opening of a table of resources, `id` its id.
inline std::string resource_table(std::string_view id) {
  return table_start(id, {"resource", "capacity", "has", "wants", "clients", "subclients",
                          "learning", "algorithm", "template", "parent lease", "description"});
}

inline std::string template_table(const admin_snapshot& s) {
  std::string out =
      table_start("templates", {"identifier_glob", "capacity", "safe_capacity", "algorithm",
                                "lease_length", "refresh_interval", "description"});
  for (const auto& t : s.templates) {
    out += table_row({text(t.identifier_glob), number(t.capacity),
                      t.safe_capacity ? number(*t.safe_capacity) : cell{"dynamic", " class=\"n\""},
                      text(t.algorithm.kind), number(t.algorithm.lease_length.count()),
                      number(t.algorithm.refresh_interval.count()), text(t.description)});
  }
  return out + "</table>\n";
}

// The budgets among `resources` (docs/budgets.md): a table, or nothing when there are none.
inline std::string budget_table(const std::vector<admin_resource>& resources) {
  std::string rows;
  for (const auto& r : resources) {
    if (!r.status.budget) continue;
    const auto& b = *r.status.budget;
    rows += table_row({text(r.status.resource_id),
                       text(utc_text(b.window)),
                       number(b.limit),
                       number(b.spent),
                       number(b.left),
                       {duration_text(b.reset), " class=\"n\""},
                       b.mark ? number(*b.mark) : cell{"-", " class=\"n\""}});
  }
  if (rows.empty()) return {};
  return "<h2>Budgets</h2>\n" +
         table_start("budgets", {"resource", "window from", "limit", "spent", "left", "resets in",
                                 "durable mark"}) +
         rows + "</table>\n";
}

// A learned capacity's history (docs/learned-capacity.md): a chart of the learned capacity
// against the demand, the calls and the overloaded calls over its last steps, and a table of
// the last few; nothing for a resource that learns nothing here.
inline std::string learned_history(const admin_resource& r) {
  const auto& h = r.learned_history;
  if (h.empty()) return {};
  double top = 0;
  for (const auto& p : h)
    top = std::max({top, p.capacity, p.wants, p.calls});
  std::ostringstream svg;
  svg_chart chart(svg, 0, top, std::min(-1.0, h.front().at));
  chart.title(fmt::format("learned capacity, its last {} steps (seconds before now)", h.size()));
  chart.axes();
  const auto at = [&](std::size_t i) { return h[i].at; };
  chart.lines(h.size(), at,
              {{[&](std::size_t i) { return h[i].capacity; }, "#d62728", "learned capacity"},
               {[&](std::size_t i) { return h[i].wants; }, "#2ca02c", "demand"},
               {[&](std::size_t i) { return h[i].calls; }, "#1f77b4", "calls/s"},
               {[&](std::size_t i) { return h[i].overloads; }, "#ff7f0e", "overloaded/s"}});
  chart.end();
  std::string out =
      fmt::format("<h2 id=\"learned\">Learned capacity ({} steps)</h2>\n<div>", h.size());
  out += svg.str() + "</div>\n";
  out += table_start("steps",
                     {"seconds ago", "step", "capacity", "demand", "calls/s", "overloaded/s"});
  for (std::size_t i = h.size(); i-- > h.size() - std::min<std::size_t>(h.size(), 12);) {
    const auto& p = h[i];
    out += table_row({number(std::round(-p.at * 10) / 10 + 0.0), text(step_name(p.step)),
                      number(p.capacity), number(p.wants), number(p.calls), number(p.overloads)});
  }
  return out + "</table>\n";
}

}  // namespace detail

/// `/status`: the node, its resources with state, and its configuration.
[[nodiscard]] inline std::string render_status(const admin_snapshot& s) {
  std::string out = detail::page_head("doorman " + s.identity.role + " " + s.identity.id);
  out += detail::identity_table(s);
  out += fmt::format("<h2>Resources ({})</h2>\n", s.resources.size());
  if (s.resources.empty()) {
    out += "<p id=\"no-resources\">No resource has state yet: no client has asked.</p>\n";
  } else {
    out += detail::resource_table("resources");
    for (const auto& r : s.resources)
      out += detail::resource_row(r, true);
    out += "</table>\n";
    out += detail::budget_table(s.resources);
  }
  out += fmt::format("<h2>Configuration ({} templates)</h2>\n", s.templates.size());
  out += detail::template_table(s);
  out +=
      "<p><a href=\"/metrics\">metrics</a> · <a href=\"/healthz\">healthz</a> · "
      "<a href=\"/readyz\">readyz</a></p>\n</body></html>\n";
  return out;
}

/// `/status/resources/<id>?page=N`: one resource and page `page` (from 1) of its leases, sorted
/// by client id. `s.resources` holds the resource, `s.leases` the page, `s.lease_count` all.
[[nodiscard]] inline std::string render_resource(const admin_snapshot& s, std::size_t page) {
  const auto& r = s.resources.at(0);
  std::string out = detail::page_head("resource " + r.status.resource_id);
  out += "<p><a href=\"/status\">back to the node</a></p>\n";
  out += detail::resource_table("resource");
  out += detail::resource_row(r, false);
  out += "</table>\n";
  out += detail::budget_table(s.resources);
  out += detail::learned_history(r);
  const std::size_t pages =
      std::max<std::size_t>(1, (s.lease_count + leases_per_page - 1) / leases_per_page);
  out += fmt::format("<h2>Leases ({}; page {} of {})</h2>\n", s.lease_count, page, pages);
  out += detail::table_start("leases", {"client", "kind", "has", "wants", "subclients",
                                        "expires in (s)", "refresh in (s)"});
  for (const auto& l : s.leases) {
    out += detail::table_row({detail::text(l.client_id),
                              {l.is_server ? "server" : "client"},
                              detail::number(l.has.capacity),
                              detail::number(l.wants),
                              detail::number(l.subclients),
                              detail::number(l.has.expires_in),
                              detail::number(l.has.refresh_interval)});
  }
  out += "</table>\n<p id=\"pages\">";
  const std::string base = "/status/resources/" + detail::url_segment(r.status.resource_id);
  if (page > 1) out += fmt::format("<a href=\"{}?page={}\">previous</a> ", base, page - 1);
  if (page < pages) out += fmt::format("<a href=\"{}?page={}\">next</a>", base, page + 1);
  return out + "</p>\n</body></html>\n";
}

/// What the admin routes read from a node (on its strand): a snapshot of its state, optionally
/// of one resource and a page of its leases; the little `/readyz` needs (whether it started,
/// its mastership); its counters.
template <class Node>
concept admin_source = requires(Node& n, std::optional<std::string> id, std::size_t page) {
  { n.snapshot(std::move(id), page) } -> std::same_as<admin_snapshot>;
  { n.readiness_snapshot() } -> std::same_as<admin_snapshot>;
  { n.metrics() } -> std::convertible_to<const node_metrics&>;
};

namespace detail {

template <admin_source Node>
net::http_answer resource_page(Node& node, std::string id,
                               const std::optional<std::string>& page_text) {
  std::size_t page = 1;
  if (page_text) {
    const auto v = as_int64(nlohmann::json::parse(*page_text, nullptr, false));
    if (!v || *v < 1 || *v > 1'000'000) {
      return net::detail::http_error(400, "page: expected a whole number from 1");
    }
    page = static_cast<std::size_t>(*v);
  }
  if (auto e = validate(status_request{id})) return net::detail::http_error(400, e->message);
  const auto s = node.snapshot(std::move(id), page);
  if (s.resources.empty()) return net::detail::http_error(400, "invalid resource id");
  if (page > 1 && (page - 1) * leases_per_page >= s.lease_count) {
    return net::detail::http_error(404, "no such page of leases");
  }
  return {200, "text/html; charset=utf-8", render_resource(s, page)};
}

}  // namespace detail

/// Answers a request to the admin endpoint: `/healthz` and `/readyz` to anyone; `/metrics`,
/// `/status` (and `/`) and `/status/resources/<id>?page=N` unless `forbid(path)` names why not
/// (403, "forbidden: <why>"); 404 for anything else.
template <admin_source Node, class Forbid>
net::http_answer route_admin(const net::http_request& r, Node& node, Forbid&& forbid) {
  if (r.path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
  if (r.path == "/readyz") {
    const auto [ready, why] = readiness(node.readiness_snapshot());
    return {ready ? 200 : 503, "text/plain; charset=utf-8",
            fmt::format("{}: {}\n", ready ? "ready" : "not ready", why)};
  }
  if (std::optional<std::string> why = forbid(r.path)) {
    return net::detail::http_error(403, "forbidden: " + *why);
  }
  if (r.path == "/metrics") {
    return {200, "text/plain; version=0.0.4; charset=utf-8",
            render_metrics(node.snapshot(std::nullopt, 1), node.metrics())};
  }
  if (r.path == "/" || r.path == "/status") {
    return {200, "text/html; charset=utf-8", render_status(node.snapshot(std::nullopt, 1))};
  }
  constexpr std::string_view prefix = "/status/resources/";
  if (r.path.starts_with(prefix) && r.path.size() > prefix.size()) {
    return detail::resource_page(node, r.path.substr(prefix.size()), r.query("page"));
  }
  return net::detail::http_error(404, "no such page (try /status, /metrics, /healthz, /readyz)");
}

}  // namespace doorman
