// doorman-node: one server of a capacity tree (docs/node.md).
//
//   doorman-node --listen 127.0.0.1:7700 --config resources.json            # a root
//   doorman-node --listen 127.0.0.1:7701 --parent 127.0.0.1:7700            # an intermediate
//   doorman-node --listen 127.0.0.1:7700 --config etcd:/doorman/config --etcd-endpoints
//                127.0.0.1:2379 --election-key /doorman/root   # one task of a replicated root
//
// Every flag can also come from the environment as DOORMAN_<FLAG> (upper case, '-' -> '_'),
// e.g. DOORMAN_LISTEN=0.0.0.0:7700; a flag on the command line wins. SIGHUP reloads the
// configuration (file:PATH, or etcd:KEY which is also polled every second); SIGTERM and SIGINT
// stop gracefully (exit 0). Logs go to stderr.

#include <doorman/node.hpp>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <asio.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
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
    {"config", "[file:]PATH|etcd:KEY",
     "resource configuration (JSON, docs/configuration.md); required for a root, optional for an "
     "intermediate (the parent's algorithm is used); etcd:KEY reads it from etcd and applies "
     "each valid change (polled every second)",
     nullptr},
    {"parent", "HOST:PORT[,...]", "the parent position's tasks; makes this an intermediate",
     nullptr},
    {"advertise", "HOST:PORT",
     "address children are redirected to when this task is master (default: the listen address)",
     nullptr},
    {"etcd-endpoints", "HOST:PORT[,...]",
     "etcd members (v3 JSON gateway); with them, the tasks of one position elect a master",
     nullptr},
    {"election-key", "KEY", "etcd key of this position's election (one key per position)",
     "/doorman/master"},
    {"election-ttl", "SECONDS",
     "TTL of the election lease: a dead master is replaced within it (whole seconds, >= 2)", "10"},
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

// Where the configuration comes from: --config [file:]PATH or etcd:KEY.
struct config_source {
  bool etcd = false;
  std::string where;  // the path, or the key
  [[nodiscard]] std::string name() const { return etcd ? "etcd:" + where : where; }
};

config_source parse_source(const std::string& source) {
  if (source.starts_with("file:")) return {false, source.substr(5)};
  if (source.starts_with("etcd:")) {
    if (source.size() == 5) throw std::invalid_argument("--config: etcd: needs a key");
    return {true, source.substr(5)};
  }
  if (source.find(':') != std::string::npos && !source.starts_with("/") &&
      !source.starts_with(".")) {
    const auto scheme = source.substr(0, source.find(':'));
    if (scheme.find('/') == std::string::npos) {
      throw std::invalid_argument(
          fmt::format("--config: unknown source \"{}:\" (expected file:PATH or etcd:KEY)", scheme));
    }
  }
  return {false, source};
}

doorman::resource_repository load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cannot read configuration {}", path));
  std::stringstream text;
  text << in.rdbuf();
  return doorman::node::engine_type::parse_config(text.str());
}

// Reads etcd:KEY once, before the node starts: the configuration and its revision.
std::pair<doorman::resource_repository, std::int64_t> load_etcd(
    const std::vector<std::string>& endpoints, const std::string& key) {
  asio::io_context io;
  doorman::net::etcd_client etcd(io.get_executor(), endpoints);
  std::optional<doorman::net::etcd_result<std::optional<doorman::net::etcd_kv>>> got;
  asio::co_spawn(io, etcd.get(key, std::chrono::steady_clock::now() + std::chrono::seconds(5)),
                 [&](std::exception_ptr e, auto r) {
                   if (e) std::rethrow_exception(e);
                   got = std::move(r);
                 });
  io.run();
  if (!*got) {
    throw std::runtime_error(
        fmt::format("cannot read configuration etcd:{}: {}", key, got->message));
  }
  if (!got->value) throw std::runtime_error(fmt::format("configuration etcd:{}: no such key", key));
  try {
    return {doorman::node::engine_type::parse_config(got->value->value), got->value->mod_revision};
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("configuration etcd:{}: {}", key, e.what()));
  }
}

// Everything parsed from the flags.
struct settings {
  doorman::node_options node;
  std::optional<config_source> source;
  doorman::resource_repository config = doorman::intermediate_default_config();
  std::int64_t config_revision = 0;
  std::vector<std::string> etcd_endpoints;
  doorman::etcd_election_options election;
};

// Polls etcd:KEY and applies each new valid revision; an invalid one is logged and the old
// configuration kept. `wake` cut short a wait (SIGHUP).
template <class Node>
asio::awaitable<void> follow_etcd_config(Node& node, doorman::net::etcd_client& etcd,
                                         std::string key, std::int64_t revision,
                                         asio::steady_timer& wake, const bool& stopping) {
  using std::chrono::steady_clock;
  bool failing = false;
  while (!stopping) {
    wake.expires_after(std::chrono::seconds(1));
    std::error_code ec;
    co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping) break;
    const auto got = co_await etcd.get(key, steady_clock::now() + std::chrono::seconds(1));
    if (!got) {
      if (!failing) {
        log_line(fmt::format("configuration etcd:{}: cannot read ({}); keeping the current one",
                             key, got.message));
      }
      failing = true;
      continue;
    }
    if (failing) log_line(fmt::format("configuration etcd:{}: readable again", key));
    failing = false;
    if (!got.value) {
      if (revision != -1) {
        log_line(fmt::format("configuration etcd:{} deleted; keeping the current one", key));
      }
      revision = -1;
      continue;
    }
    if (got.value->mod_revision == revision) continue;
    revision = got.value->mod_revision;
    try {
      node.reload(doorman::node::engine_type::parse_config(got.value->value));
      log_line(fmt::format("configuration etcd:{} revision {} accepted", key, revision));
    } catch (const std::exception& e) {
      log_line(fmt::format("configuration etcd:{} revision {} rejected, keeping the old one: {}",
                           key, revision, e.what()));
    }
  }
}

template <class Node>
int serve(asio::io_context& io, Node& node, const settings& st) {
  node.start();
  if (st.source) log_line(fmt::format("configuration loaded from {}", st.source->name()));

  bool stopping = false;
  std::optional<doorman::net::etcd_client> config_etcd;
  asio::steady_timer config_wake(io);
  if (st.source && st.source->etcd) {
    config_etcd.emplace(io.get_executor(), st.etcd_endpoints);
    asio::co_spawn(io,
                   doorman::net::supervised(
                       "etcd configuration poll",
                       [&, revision = st.config_revision] {
                         return follow_etcd_config(node, *config_etcd, st.source->where, revision,
                                                   config_wake, stopping);
                       },
                       [&] { return stopping; }, log_line),
                   asio::detached);
  }
  asio::signal_set hup(io, SIGHUP);
  asio::signal_set stop_signals(io, SIGINT, SIGTERM);
  stop_signals.async_wait([&](std::error_code ec, int signal) {
    if (ec) return;
    log_line(fmt::format("signal {}: stopping gracefully", signal));
    stopping = true;
    hup.cancel();  // with the node stopped, nothing else is left to run
    config_wake.cancel();
    node.stop();
  });
  std::function<void(std::error_code, int)> on_hup = [&](std::error_code ec, int) {
    if (ec) return;
    if (!st.source) {
      log_line("SIGHUP: no --config to reload");
    } else if (st.source->etcd) {
      config_wake.cancel();  // read the key now
    } else {
      try {
        node.reload(load_file(st.source->where));
      } catch (const std::exception& e) {
        log_line(fmt::format("SIGHUP: configuration {} rejected, keeping the old one: {}",
                             st.source->where, e.what()));
      }
    }
    hup.async_wait(on_hup);
  };
  hup.async_wait(on_hup);
  io.run();
  log_line("stopped");
  return 0;
}

// Builds the node (a bad address in the options is a usage error, exit 2) and serves.
template <class Node, class... Election>
int build_and_serve(asio::io_context& io, settings& st, Election&&... election) {
  std::optional<Node> node;
  try {
    node.emplace(io.get_executor(), std::move(st.config), st.node,
                 std::forward<Election>(election)...);
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "doorman-node: --{}\n", e.what());
    return 2;
  }
  try {
    return serve(io, *node, st);
  } catch (const std::exception& e) {
    log_line(fmt::format("fatal: {}", e.what()));
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  settings st;
  doorman::node_options& o = st.node;
  try {
    const auto v = read_flags(argc, argv);
    if (v.contains("help")) {
      usage();
      return 0;
    }
    o.listen = v.at("listen");
    if (v.contains("parent")) {
      o.parents = doorman::net::split_list(v.at("parent"));
      if (o.parents.empty()) throw std::invalid_argument("--parent: no address given");
    }
    if (v.contains("advertise")) {
      o.advertise = v.at("advertise");
      if (!doorman::net::parse_address(o.advertise)) {
        throw std::invalid_argument(
            fmt::format("--advertise: expected host:port, got \"{}\"", o.advertise));
      }
    }
    if (v.contains("id")) o.id = v.at("id");
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
    if (v.contains("etcd-endpoints")) {
      st.etcd_endpoints = doorman::net::split_list(v.at("etcd-endpoints"));
      if (st.etcd_endpoints.empty()) throw std::invalid_argument("--etcd-endpoints: none given");
      for (const auto& e : st.etcd_endpoints) {
        if (!doorman::net::etcd_client::parse_endpoint(e)) {
          throw std::invalid_argument(
              fmt::format("--etcd-endpoints: expected host:port, got \"{}\"", e));
        }
      }
      st.election.endpoints = st.etcd_endpoints;
      st.election.key = v.at("election-key");
      if (st.election.key.empty()) throw std::invalid_argument("--election-key: empty");
      const double ttl = number(v, "election-ttl", 2, 86400);
      if (ttl != std::floor(ttl)) {
        throw std::invalid_argument(fmt::format(
            "--election-ttl: expected whole seconds, got \"{}\"", v.at("election-ttl")));
      }
      st.election.ttl = doorman::seconds(ttl);
      st.election.log = log_line;
    }
    if (v.contains("config")) {
      st.source = parse_source(v.at("config"));
      if (!st.source->etcd) {
        st.config = load_file(st.source->where);
      } else if (st.etcd_endpoints.empty()) {
        throw std::invalid_argument("--config etcd:KEY needs --etcd-endpoints");
      } else {
        std::tie(st.config, st.config_revision) = load_etcd(st.etcd_endpoints, st.source->where);
      }
    } else if (o.parents.empty()) {
      throw std::invalid_argument("--config is required for a root (no --parent)");
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "doorman-node: {}\n", e.what());
    return 2;
  }

  asio::io_context io;
  if (st.etcd_endpoints.empty()) return build_and_serve<doorman::node>(io, st);
  return build_and_serve<doorman::basic_node<doorman::etcd_election>>(
      io, st, doorman::etcd_election(io.get_executor(), st.election));
}
