// doorman-node: one server of a capacity tree (DESIGN §7).
//
//   doorman-node --listen 127.0.0.1:7700 --config resources.json            # a root
//   doorman-node --listen 127.0.0.1:7701 --parent 127.0.0.1:7700            # an intermediate
//
// Every flag can also come from the environment as DOORMAN_<FLAG> (upper case, '-' -> '_'),
// e.g. DOORMAN_LISTEN=0.0.0.0:7700; a flag on the command line wins. SIGHUP reloads the
// configuration file; SIGTERM and SIGINT stop gracefully (exit 0). Logs go to stderr.

#include <doorman/node.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <asio.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "arguments.hpp"

namespace {

struct flag {
  const char* name;
  const char* value;  // placeholder in --help; null for switches
  const char* help;
  const char* fallback;  // default, as text; null when none
};

constexpr flag flags[] = {
    {"listen", "HOST:PORT", "address to listen on; port 0 picks a free port", "127.0.0.1:7700"},
    {"config", "[file:]PATH",
     "resource configuration (JSON, DESIGN §6); required for a root, optional for an "
     "intermediate (the parent's algorithm is used)",
     nullptr},
    {"parent", "HOST:PORT[,...]", "the parent position's tasks; makes this an intermediate",
     nullptr},
    {"advertise", "HOST:PORT", "address children are redirected to (default: the listen address)",
     nullptr},
    {"id", "ID", "this node's id in status and at its parent (default: the advertised address)",
     nullptr},
    {"decay-factor", "X", "refresh interval factor per tree level, in (0, 1]", "0.5"},
    {"minimum-refresh-interval", "SECONDS", "a client asking sooner gets its lease back", "5"},
    {"max-connections", "N", "connections beyond this are refused", "10000"},
    {"max-message-bytes", "N", "longest request line", "1048576"},
    {"max-in-flight", "N", "unwritten answers per connection before it is not read further",
     "1024"},
    {"idle-timeout", "SECONDS", "a connection completing no request for this long is closed",
     "300"},
    {"parent-timeout", "SECONDS", "deadline of one request to the parent", "5"},
    {"help", nullptr, "print this help and exit", nullptr},
};

void usage() {
  std::string out =
      "usage: doorman-node [--FLAG VALUE]...\n"
      "Serves one position of a doorman capacity tree over JSON-RPC on TCP (one JSON object\n"
      "per line). Every flag may also be given as the environment variable DOORMAN_<FLAG>\n"
      "(upper case, '-' as '_'); the command line wins. SIGHUP reloads --config; SIGTERM or\n"
      "SIGINT stops gracefully.\n\n";
  for (const auto& f : flags) {
    std::string left =
        fmt::format("  --{}{}{}", f.name, f.value ? " " : "", f.value ? f.value : "");
    out += fmt::format("{:<42} {}", left, f.help);
    if (f.fallback) out += fmt::format(" (default {})", f.fallback);
    out += '\n';
  }
  std::fputs(out.c_str(), stdout);
}

void log_line(std::string_view message) {
  const auto now = std::chrono::system_clock::now();
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  fmt::print(stderr, "{:%Y-%m-%dT%H:%M:%S}.{:03}Z doorman-node[{}]: {}\n",
             std::chrono::floor<std::chrono::seconds>(now), ms, ::getpid(), message);
}

std::string env_name(std::string_view flag_name) {
  std::string s = "DOORMAN_";
  for (const char c : flag_name)
    s += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// Flag values: command line over environment over defaults. Throws on an unknown flag.
std::map<std::string, std::string> read_flags(int argc, char** argv) {
  std::map<std::string, std::string> v;
  for (const auto& f : flags) {
    if (f.fallback) v[f.name] = f.fallback;
    if (const char* e = std::getenv(env_name(f.name).c_str()); e && f.value) v[f.name] = e;
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h") arg = "--help";
    if (!arg.starts_with("--")) throw std::invalid_argument(fmt::format("unexpected {}", arg));
    arg.remove_prefix(2);
    std::string name(arg), value;
    if (const auto eq = arg.find('='); eq != std::string_view::npos) {
      name = std::string(arg.substr(0, eq));
      value = std::string(arg.substr(eq + 1));
    }
    const flag* f = nullptr;
    for (const auto& g : flags)
      if (name == g.name) f = &g;
    if (!f) throw std::invalid_argument(fmt::format("unknown flag --{} (see --help)", name));
    if (f->value && value.empty() && arg.find('=') == std::string_view::npos) {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("--{} needs a value", name));
      value = argv[++i];
    }
    v[name] = f->value ? value : "1";
  }
  return v;
}

double number(const std::map<std::string, std::string>& v, const char* name, double lo, double hi) {
  return doorman_examples::parse_number(std::string("--") + name, v.at(name), lo, hi);
}

std::string config_path(const std::string& source) {
  if (source.starts_with("file:")) return source.substr(5);
  if (source.find(':') != std::string::npos && !source.starts_with("/") &&
      !source.starts_with(".")) {
    const auto scheme = source.substr(0, source.find(':'));
    if (scheme.find('/') == std::string::npos) {
      throw std::invalid_argument(
          fmt::format("--config: unknown source \"{}:\" (this build reads file:PATH)", scheme));
    }
  }
  return source;
}

doorman::resource_repository load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cannot read configuration {}", path));
  std::stringstream text;
  text << in.rdbuf();
  return doorman::node::engine_type::parse_config(text.str());
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> v;
  doorman::node_options o;
  std::optional<std::string> config_file;
  doorman::resource_repository config = doorman::intermediate_default_config();
  try {
    v = read_flags(argc, argv);
    if (v.contains("help")) {
      usage();
      return 0;
    }
    o.listen = v.at("listen");
    if (v.contains("parent")) {
      o.parents = doorman::net::split_list(v.at("parent"));
      if (o.parents.empty()) throw std::invalid_argument("--parent: no address given");
    }
    o.engine.decay_factor = number(v, "decay-factor", 1e-3, 1);
    o.engine.minimum_refresh_interval =
        doorman::seconds(number(v, "minimum-refresh-interval", 0, 86400));
    o.server.max_connections = static_cast<std::size_t>(number(v, "max-connections", 1, 1e7));
    o.server.max_message_bytes =
        static_cast<std::size_t>(number(v, "max-message-bytes", 256, 1 << 30));
    o.server.max_in_flight = static_cast<std::size_t>(number(v, "max-in-flight", 1, 1e7));
    o.server.idle_timeout = doorman::seconds(number(v, "idle-timeout", 0.1, 86400 * 7));
    o.parent_timeout = doorman::seconds(number(v, "parent-timeout", 0.01, 3600));
    o.log = log_line;
    if (v.contains("config")) {
      config_file = config_path(v.at("config"));
      config = load_config(*config_file);
    } else if (o.parents.empty()) {
      throw std::invalid_argument("--config is required for a root (no --parent)");
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "doorman-node: {}\n", e.what());
    return 2;
  }

  std::optional<asio::io_context> io_holder;
  std::optional<doorman::node> node_holder;
  try {
    // The node validates the addresses (listen, parent): a bad one is a usage error.
    node_holder.emplace(io_holder.emplace().get_executor(), std::move(config), o);
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "doorman-node: --{}\n", e.what());
    return 2;
  }
  try {
    asio::io_context& io = *io_holder;
    doorman::node& node = *node_holder;
    node.start();
    if (config_file) log_line(fmt::format("configuration loaded from {}", *config_file));

    asio::signal_set hup(io, SIGHUP);
    asio::signal_set stop_signals(io, SIGINT, SIGTERM);
    stop_signals.async_wait([&](std::error_code ec, int signal) {
      if (ec) return;
      log_line(fmt::format("signal {}: stopping gracefully", signal));
      hup.cancel();  // with the node stopped, nothing else is left to run
      node.stop();
    });
    std::function<void(std::error_code, int)> on_hup = [&](std::error_code ec, int) {
      if (ec) return;
      if (!config_file) {
        log_line("SIGHUP: no --config to reload");
      } else {
        try {
          node.reload(load_config(*config_file));
        } catch (const std::exception& e) {
          log_line(fmt::format("SIGHUP: configuration {} rejected, keeping the old one: {}",
                               *config_file, e.what()));
        }
      }
      hup.async_wait(on_hup);
    };
    hup.async_wait(on_hup);
    io.run();
    log_line("stopped");
    return 0;
  } catch (const std::exception& e) {
    log_line(fmt::format("fatal: {}", e.what()));
    return 1;
  }
}
