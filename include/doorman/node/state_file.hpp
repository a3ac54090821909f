#pragma once

/// \file
/// A node's state file (`node_options::state_file`; docs/operations.md, "The state file"): what a
/// task without an election in etcd needs to know after a restart. It holds
///
///     {"leases_until": <unix seconds>, "budgets": {"<id>": {"window": <start>, "mark": <units>}}}
///
/// `leases_until`: no lease this task granted lasts past it. It is written ahead, before a
/// grant could pass it, so a task that restarts after it has passed knows that no lease is
/// outstanding and grants at once (no learning mode); one that restarts before it learns as
/// usual. A fresh file (none yet) is a task that never granted. `budgets`: each budget's mark,
/// as a root electing in etcd keeps them there (`budget_marks.hpp`), so that a restarted root's
/// window continues where it was. Every write replaces the file whole (a temporary file,
/// flushed to disk, renamed over it): a crash leaves the old state or the new, never half.

#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

namespace doorman {

/// A budget's mark as a root stores it, in etcd (`budget_marks.hpp`) or in a state file: the
/// window's start and the most that may have been spent and allotted in it.
struct stored_budget_mark {
  std::int64_t window = 0;
  double mark = 0;
};

/// Reads a mark's value: `{"window": <integer>, "mark": <number from 0 to 1e15>}`; else the
/// field at fault, in words.
[[nodiscard]] inline std::variant<stored_budget_mark, std::string> read_budget_mark(
    std::string_view text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return std::string("not a JSON object");
  const auto w = j.find("window");
  if (w == j.end() || !w->is_number_integer()) return std::string("window: must be an integer");
  const auto m = j.find("mark");
  if (m == j.end() || !m->is_number()) return std::string("mark: must be a number");
  const double mark = m->get<double>();
  if (!(mark >= 0 && mark <= 1e15)) return std::string("mark: must be from 0 to 1e15");
  return stored_budget_mark{w->get<std::int64_t>(), mark};
}

/// What a state file holds (see above).
struct node_state {
  double leases_until = 0;  ///< unix seconds; 0: never granted
  std::map<std::string, stored_budget_mark, std::less<>> budgets;
};

/// Reads a state file's text; else the field at fault, in words. At most 100 000 budgets.
[[nodiscard]] inline std::variant<node_state, std::string> read_node_state(std::string_view text) {
  const auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) return std::string("not a JSON object");
  node_state s;
  const auto until = j.find("leases_until");
  if (until == j.end() || !until->is_number() || !(until->get<double>() >= 0) ||
      until->get<double>() > 1e11) {
    return std::string("leases_until: must be unix seconds from 0 to 1e11");
  }
  s.leases_until = until->get<double>();
  const auto budgets = j.find("budgets");
  if (budgets == j.end()) return s;
  if (!budgets->is_object()) return std::string("budgets: must be an object");
  if (budgets->size() > 100000) return std::string("budgets: more than 100000 entries");
  for (const auto& [id, value] : budgets->items()) {
    auto mark = read_budget_mark(value.dump());
    if (const auto* why = std::get_if<std::string>(&mark)) {
      return "budgets." + id + ": " + *why;
    }
    s.budgets.emplace(id, std::get<stored_budget_mark>(mark));
  }
  return s;
}

/// A state file, read when made and written whole at each change. Not thread-safe: a node uses
/// it on its strand.
class state_file {
 public:
  /// Reads `path` (none there: a fresh state). Throws `std::runtime_error` naming the file and
  /// the field at fault when it cannot be read or is not a state; nothing is written then.
  explicit state_file(std::string path) : path_(std::move(path)) {
    std::ifstream in(path_, std::ios::binary);
    if (!in) {
      if (::access(path_.c_str(), F_OK) != 0) return;  // fresh
      throw std::runtime_error("state file " + path_ + ": cannot be read");
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str().size() > 64u << 20) {
      throw std::runtime_error("state file " + path_ + ": larger than 64 MiB");
    }
    auto read = read_node_state(text.str());
    if (const auto* why = std::get_if<std::string>(&read)) {
      throw std::runtime_error("state file " + path_ + ": " + *why);
    }
    state_ = std::move(std::get<node_state>(read));
    fresh_ = false;
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// Whether there was no file: a task that never granted.
  [[nodiscard]] bool fresh() const noexcept { return fresh_; }
  [[nodiscard]] const node_state& state() const noexcept { return state_; }

  /// Stores `until` as `leases_until`; false with `error` set when it could not be written
  /// (the state stays as it was on disk and here).
  bool write_leases_until(double until, std::string& error) {
    node_state next = state_;
    next.leases_until = until;
    return save(std::move(next), error);
  }

  /// Stores a budget's mark.
  bool write_budget(const std::string& id, stored_budget_mark mark, std::string& error) {
    node_state next = state_;
    next.budgets[id] = mark;
    return save(std::move(next), error);
  }

 private:
  bool save(node_state next, std::string& error) {
    nlohmann::json budgets = nlohmann::json::object();
    for (const auto& [id, m] : next.budgets)
      budgets[id] = {{"window", m.window}, {"mark", m.mark}};
    const std::string text =
        nlohmann::json{{"leases_until", next.leases_until}, {"budgets", budgets}}.dump() + "\n";
    const std::string temporary = path_ + ".new";
    const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return failed("cannot create " + temporary, error);
    const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    const bool synced = written && ::fsync(fd) == 0;
    ::close(fd);
    if (!synced) {
      std::remove(temporary.c_str());
      return failed("cannot write " + temporary, error);
    }
    if (std::rename(temporary.c_str(), path_.c_str()) != 0) {
      std::remove(temporary.c_str());
      return failed("cannot rename " + temporary + " to " + path_, error);
    }
    state_ = std::move(next);
    fresh_ = false;
    return true;
  }

  static bool failed(std::string why, std::string& error) {
    error = std::move(why);
    return false;
  }

  std::string path_;
  node_state state_;
  bool fresh_ = true;
};

}  // namespace doorman
