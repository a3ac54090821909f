#pragma once

// Command-line walking shared by the examples: `--flag value` pairs, --help, clear errors.
//
//   int main(int argc, char** argv) {
//     double seconds = 10;
//     return doorman_examples::run_program(
//         argc, argv, "doorman-x", "usage: doorman-x [--seconds S]\n",
//         {{"--seconds", [&](auto& args) { seconds = args.number(0.001, 86400); }}},
//         [&] { return run(seconds); });  // unknown flags and errors: "doorman-x: ...", exit 2
//   }

#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "doorman/version.hpp"

namespace doorman_examples {

// `--version`'s line: the program's name (as it was called, without its directory) and the
// project's version, e.g. "doorman-node 0.1.0".
inline void print_version(const char* argv0) {
  std::string name = argv0 != nullptr ? argv0 : "doorman";
  if (const auto slash = name.rfind('/'); slash != std::string::npos) name.erase(0, slash + 1);
  std::printf("%s %s\n", name.c_str(), DOORMAN_VERSION_STRING);
}

// A number as short as it can be written ("0.1", "86400", "inf").
inline std::string shortest(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

class arguments {
 public:
  arguments(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next argument; false at the end.
  bool next() {
    if (++i_ >= argc_) return false;
    arg_ = argv_[i_];
    return true;
  }
  [[nodiscard]] const std::string& arg() const noexcept { return arg_; }
  [[nodiscard]] bool help() const noexcept { return arg_ == "--help" || arg_ == "-h"; }
  [[nodiscard]] bool version() const noexcept { return arg_ == "--version"; }
  void print_version() const { doorman_examples::print_version(argv_[0]); }

  // The value after the current flag (throws std::invalid_argument when there is none).
  std::string value() {
    if (i_ + 1 >= argc_) throw std::invalid_argument(arg_ + " needs a value");
    return argv_[++i_];
  }

  [[noreturn]] void unknown() const {
    throw std::invalid_argument("unknown option " + arg_ + " (see --help)");
  }

  // Walks every argument: --help prints `usage` and --version the version, and return false
  // (the program then exits 0);
  // any other flag goes to `on_flag(flag)`, which takes its value (`value`, `number`) and
  // returns whether it knew the flag. An unknown flag throws std::invalid_argument.
  template <class OnFlag>
  bool parse(const char* usage, OnFlag on_flag) {
    while (next()) {
      if (help()) {
        std::fputs(usage, stdout);
        return false;
      }
      if (version()) {
        print_version();
        return false;
      }
      if (!on_flag(arg_)) unknown();
    }
    return true;
  }

  // The value after the current flag, as a number in [lo, hi] (else std::invalid_argument
  // naming the flag).
  double number(double lo, double hi);

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string arg_;
};

// `text` as a number in [lo, hi], or std::invalid_argument naming the flag.
inline double parse_number(const std::string& flag, const std::string& text, double lo, double hi) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(x >= lo && x <= hi)) {
    throw std::invalid_argument(flag + ": expected a number in [" + shortest(lo) + ", " +
                                shortest(hi) + "], got \"" + text + "\"");
  }
  return x;
}

inline double arguments::number(double lo, double hi) {
  const std::string flag = arg_;
  return parse_number(flag, value(), lo, hi);
}

// The program's name in its log lines ("doorman-node" unless `run_program` says otherwise).
inline std::string& program_name() {
  static std::string name = "doorman-node";
  return name;
}

// One flag a program takes: its name, and what reads its value from the arguments.
struct flag_action {
  std::string name;
  std::function<void(arguments&)> read;
};

// The frame of an example's `main`: walks the arguments as `arguments::parse` does (--help
// prints `usage` and exits 0; each of `flags` reads its value; any other flag is refused), then
// returns `body()` as the exit status. Whatever throws, a flag or the body, is printed as
// "PROGRAM: what" and exits 2.
template <class Body>
int run_program(int argc, char** argv, const char* program, const char* usage,
                const std::vector<flag_action>& flags, Body body) {
  program_name() = program;  // for the log lines (flags.hpp's log_line)
  try {
    arguments args(argc, argv);
    const bool go = args.parse(usage, [&](const std::string& name) {
      for (const flag_action& f : flags) {
        if (f.name != name) continue;
        f.read(args);
        return true;
      }
      return false;
    });
    return go ? body() : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 2;
  }
}

}  // namespace doorman_examples
