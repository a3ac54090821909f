#pragma once

// The CLI's reading of a node's answers (examples/doorman_cli.cpp): each answer decoded as the
// channel decodes one (typed, bounded, never trusted), then formatted for a terminal. A
// malformed answer is a `failure` naming the field ("status: the node's answer is malformed:
// result.level: must be between 0 and 1000"), never an exception from the JSON library or an
// out-of-range conversion. Kept apart from main() so the fuzz target reads answers as the CLI
// does (tests/fuzz/fuzz_cli.cpp).

#include <doorman/core/time_text.hpp>
#include <doorman/protocol.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace doorman_examples::cli {

// A failure to report (exit 1).
struct failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A `status` answer: the node's own fields and the status proper.
struct node_status {
  std::string id = "?";
  std::string role = "?";
  std::int64_t level = 0;
  doorman::status_response status;
};

inline constexpr std::int64_t max_level = 1000;

// `answer` (the result of `method`) decoded as `Message`; throws `failure` naming the field.
template <class Message>
Message read_answer(const std::string& method, const nlohmann::json& answer) {
  Message m;
  if (const auto e = doorman::decode(answer, m)) {
    throw failure(fmt::format("{}: the node's answer is malformed: {}", method, e->message));
  }
  return m;
}

inline node_status read_status(const nlohmann::json& answer) {
  node_status n;
  n.status = read_answer<doorman::status_response>("status", answer);
  doorman::detail::json_reader r(answer, "result");
  r.string("id", n.id, false);
  r.string("role", n.role, false);
  if (r.integer("level", n.level, false))
    r.within("level", static_cast<double>(n.level), 0, max_level);
  if (r.error()) {
    throw failure(fmt::format("status: the node's answer is malformed: {}", r.error()->message));
  }
  for (std::size_t i = 0; i < n.status.resources.size(); ++i) {
    const auto& l = n.status.resources[i].learned;
    const auto known = [&](doorman::learn_step s) { return l->step == doorman::step_name(s); };
    if (l && !known(doorman::learn_step::hold) && !known(doorman::learn_step::cut) &&
        !known(doorman::learn_step::rise)) {
      throw failure(
          fmt::format("status: the node's answer is malformed: "
                      "result.resources[{}].learned.step: must be hold, cut or rise",
                      i));
    }
  }
  return n;
}

// `s` as a terminal may show it: control bytes (an escape sequence from a hostile node) as '?'.
inline std::string shown(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return s;
}

inline std::string num(double v) {
  return fmt::format("{:.6g}", v);
}

// Left-aligned columns, two spaces apart.
inline std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], r[i].size());
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i)
      line += i + 1 == r.size() ? r[i] : fmt::format("{:<{}}  ", r[i], width[i]);
    out += line + "\n";
  }
  return out;
}

inline std::string node_line(const node_status& st) {
  const auto& m = st.status.mastership;
  return fmt::format("node {}  role {}  level {}  master {}{}\n", shown(st.id), shown(st.role),
                     st.level, shown(m.master.value_or("(unknown)")),
                     m.is_master ? " (this node)" : "");
}

inline std::string resources_table(const node_status& st) {
  std::vector<std::vector<std::string>> rows = {
      {"RESOURCE", "CAPACITY", "HAS", "WANTS", "CLIENTS", "LEARNING", "ALGORITHM"}};
  for (const auto& r : st.status.resources) {
    rows.push_back({shown(r.resource_id), num(r.capacity), num(r.sum_has), num(r.sum_wants),
                    std::to_string(r.clients), r.learning ? "yes" : "no", shown(r.algorithm)});
  }
  if (rows.size() == 1) return "no resource has state yet\n";
  return table(rows);
}

// A table of the resources that have `part` (a budget, a learned capacity), after a blank
// line, a row each by `row(resource, part)`; nothing when none has it.
template <class Part, class Row>
std::string part_table(const node_status& st, std::optional<Part> doorman::resource_status::*part,
                       std::vector<std::string> header, Row row) {
  std::vector<std::vector<std::string>> rows = {std::move(header)};
  for (const auto& r : st.status.resources)
    if (r.*part) rows.push_back(row(r, *(r.*part)));
  return rows.size() == 1 ? std::string() : "\n" + table(rows);
}

// The budgets among the resources (docs/budgets.md), or nothing when there are none.
inline std::string budgets_table(const node_status& st) {
  return part_table(st, &doorman::resource_status::budget,
                    {"BUDGET", "WINDOW", "LIMIT", "SPENT", "LEFT", "RESETS IN", "MARK"},
                    [](const doorman::resource_status& r, const doorman::budget_info& b) {
                      return std::vector<std::string>{shown(r.resource_id),
                                                      doorman::utc_text(b.window),
                                                      num(b.limit),
                                                      num(b.spent),
                                                      num(b.left),
                                                      doorman::duration_text(b.reset),
                                                      b.mark ? num(*b.mark) : "-"};
                    });
}

// The learned capacities among the resources (docs/learned-capacity.md): the capacity the root
// learned, its bounds, and its last control step (the calls and overloads a second in that
// step's interval, and what it did); nothing when there are none. `-` before the first step.
inline std::string learned_table(const node_status& st) {
  return part_table(st, &doorman::resource_status::learned,
                    {"LEARNED", "CAPACITY", "MIN", "MAX", "CALLS/S", "OVERLOADED/S", "STEP"},
                    [](const doorman::resource_status& r, const doorman::learned_info& l) {
                      const bool stepped = l.seconds > 0;
                      const auto per_second = [&](double n) {
                        return stepped ? num(n / l.seconds) : "-";
                      };
                      return std::vector<std::string>{shown(r.resource_id),
                                                      num(r.capacity),
                                                      num(l.min),
                                                      num(l.max),
                                                      per_second(l.calls),
                                                      per_second(l.overloads),
                                                      stepped ? shown(l.step) : "-"};
                    });
}

inline std::string leases_table(const node_status& st) {
  std::vector<std::vector<std::string>> rows = {
      {"CLIENT", "KIND", "HAS", "WANTS", "EXPIRES IN", "REFRESH IN"}};
  for (const auto& l : st.status.leases) {
    rows.push_back({shown(l.client_id), l.is_server ? "server" : "client", num(l.has.capacity),
                    num(l.wants), num(l.has.expires_in) + " s",
                    num(l.has.refresh_interval) + " s"});
  }
  return table(rows);
}

// One line per grant of a `get_capacity` answer.
inline std::string grant_lines(const doorman::capacity_response& answer, double wants,
                               const std::string& client_id) {
  std::string out;
  for (const auto& g : answer.resources) {
    out += fmt::format("{}: {} of {} wanted for {}; expires in {} s, refresh in {} s\n",
                       shown(g.resource_id), num(g.gets.capacity), num(wants), client_id,
                       num(g.gets.expires_in), num(g.gets.refresh_interval));
  }
  return out;
}

}  // namespace doorman_examples::cli
