#pragma once

// The long-running binaries' flags (doorman-node, doorman): a table of flags with their help
// and defaults, read from the command line (`--flag value` or `--flag=value`) over the
// environment (`<PREFIX><FLAG>`, upper case, '-' as '_') over the defaults. An unknown flag is
// an error; an unknown `<PREFIX>*` variable gets a warning (a typo would otherwise be
// silently ignored).

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "arguments.hpp"

extern char** environ;

namespace doorman_examples {

struct flag {
  const char* name;
  const char* value;  // placeholder in --help; null for switches
  const char* help;
  std::string fallback;  // default, as text; empty when none
};

// The log level: lines below it are dropped. A line's level is its prefix: "error: ",
// "warning: ", else info (the library writes problems with those prefixes).
enum class log_level { info, warning, error };

inline log_level& minimum_log_level() {
  static log_level level = log_level::info;
  return level;
}

// `info`, `warning` or `error`; else std::invalid_argument naming the flag.
inline void set_log_level(std::string_view name) {
  if (name == "info") {
    minimum_log_level() = log_level::info;
  } else if (name == "warning") {
    minimum_log_level() = log_level::warning;
  } else if (name == "error") {
    minimum_log_level() = log_level::error;
  } else {
    throw std::invalid_argument(
        fmt::format("--log-level: expected info, warning or error, got \"{}\"", name));
  }
}

inline log_level level_of(std::string_view message) {
  if (message.starts_with("error: ") || message.starts_with("fatal: ")) return log_level::error;
  if (message.starts_with("warning: ")) return log_level::warning;
  return log_level::info;
}

// The whole text of the file at `path`, or nothing when it cannot be read.
inline std::optional<std::string> file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// One line on stderr: time (UTC, ms), program and pid, message; dropped below the log level.
inline void log_line(std::string_view message) {
  if (level_of(message) < minimum_log_level()) return;
  const auto now = std::chrono::system_clock::now();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  fmt::print(stderr, "{:%Y-%m-%dT%H:%M:%S}.{:03}Z {}[{}]: {}\n",
             std::chrono::floor<std::chrono::seconds>(now), ms, program_name(), ::getpid(),
             message);
}

inline std::string env_name(std::string_view prefix, std::string_view flag_name) {
  std::string s(prefix);
  for (const char c : flag_name)
    s += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// The --help text of a flag table.
inline std::string flag_help(const std::vector<flag>& flags) {
  std::string out;
  for (const auto& f : flags) {
    std::string left =
        fmt::format("  --{}{}{}", f.name, f.value ? " " : "", f.value ? f.value : "");
    out += fmt::format("{:<42} {}", left, f.help);
    if (!f.fallback.empty()) out += fmt::format(" (default {})", f.fallback);
    out += '\n';
  }
  return out;
}

// The values of a flag table, after the command line and the environment.
class flag_values {
 public:
  std::map<std::string, std::string> values;
  std::map<std::string, bool> explicit_;  // given (command line or environment)

  [[nodiscard]] bool given(const std::string& name) const { return explicit_.contains(name); }
  [[nodiscard]] const std::string& at(const std::string& name) const { return values.at(name); }
  [[nodiscard]] double number(const std::string& name, double lo, double hi) const {
    return parse_number("--" + name, values.at(name), lo, hi);
  }
};

// Flag values: command line over environment over defaults. Throws on an unknown flag.
inline flag_values read_flags(int argc, char** argv, const std::vector<flag>& flags,
                              std::string_view env_prefix) {
  flag_values v;
  for (const auto& f : flags) {
    v.values[f.name] = f.fallback;
    if (const char* e = std::getenv(env_name(env_prefix, f.name).c_str()); e && f.value) {
      v.values[f.name] = e;
      v.explicit_[f.name] = true;
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h") arg = "--help";
    if (!arg.starts_with("--")) throw std::invalid_argument(fmt::format("unexpected {}", arg));
    arg.remove_prefix(2);
    const auto eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    std::string value = eq == std::string_view::npos ? "" : std::string(arg.substr(eq + 1));
    const flag* f = nullptr;
    for (const auto& g : flags)
      if (name == g.name) f = &g;
    if (!f) throw std::invalid_argument(fmt::format("unknown flag --{} (see --help)", name));
    if (f->value && eq == std::string_view::npos) {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("--{} needs a value", name));
      value = argv[++i];
    }
    v.values[name] = f->value ? value : "1";
    v.explicit_[name] = true;
  }
  return v;
}

// Warns (through log_line) about each `<prefix>*` environment variable that names no flag.
inline void warn_unknown_environment(const std::vector<flag>& flags, std::string_view prefix) {
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    if (!entry.starts_with(prefix)) continue;
    const auto name = entry.substr(0, entry.find('='));
    bool known = false;
    for (const auto& f : flags)
      known |= f.value && env_name(prefix, f.name) == name;
    if (!known) {
      log_line(fmt::format("warning: environment variable {} is not a flag (ignored; see --help)",
                           name));
    }
  }
}

}  // namespace doorman_examples
