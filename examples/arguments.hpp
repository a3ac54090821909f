#pragma once

// Command-line walking shared by the examples: `--flag value` pairs, --help, clear errors.
//
//   doorman_examples::arguments args(argc, argv);
//   while (args.next()) {
//     if (args.help()) { print_usage(); return 0; }
//     else if (args.arg() == "--server") server = args.value();
//     else args.unknown();
//   }

#include <cstdio>
#include <stdexcept>
#include <string>

namespace doorman_examples {

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

  // The value after the current flag (throws std::invalid_argument when there is none).
  std::string value() {
    if (i_ + 1 >= argc_) throw std::invalid_argument(arg_ + " needs a value");
    return argv_[++i_];
  }

  [[noreturn]] void unknown() const {
    throw std::invalid_argument("unknown option " + arg_ + " (see --help)");
  }

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

// The flags every client example takes.
struct client_flags {
  std::string server = "127.0.0.1:7700";  // --server HOST:PORT[,HOST:PORT...]
  std::string resource;                   // --resource ID

  // Takes the current argument if it is one of these flags.
  bool parse(arguments& args) {
    if (args.arg() == "--server") {
      server = args.value();
    } else if (args.arg() == "--resource") {
      resource = args.value();
    } else {
      return false;
    }
    return true;
  }
};

}  // namespace doorman_examples
