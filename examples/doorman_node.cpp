// doorman-node: one server of a capacity tree (docs/node.md), a thin main over doorman::node.
//
//   doorman-node --listen 127.0.0.1:7700 --config resources.json            # a root
//   doorman-node --listen 127.0.0.1:7701 --parent 127.0.0.1:7700            # an intermediate
//   doorman-node --listen 127.0.0.1:7700 --config etcd:/doorman/config --etcd-endpoints
//                127.0.0.1:2379 --election-key /doorman/root   # one task of a replicated root
//
// Every flag can also come from the environment as DOORMAN_<FLAG> (upper case, '-' -> '_'),
// e.g. DOORMAN_LISTEN=0.0.0.0:7700; a flag on the command line wins. SIGHUP reloads the
// configuration (doorman::node::reload_config), the TLS files and the access file, and so does
// a change of one of these files (--reload-interval); SIGTERM and SIGINT stop gracefully
// (exit 0) within --drain-timeout.
// Logs go to stderr.

#include <doorman/node.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <asio.hpp>

#include <cmath>
#include <csignal>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "flags.hpp"
#include "yaml_config.hpp"
#ifdef DOORMAN_HAVE_GRPC
#include "node_door.hpp"
#include "parent_channel.hpp"
#endif

namespace {

using doorman_examples::flag;
using doorman_examples::shortest;

// The flags, with their defaults read from the options structs (each default written once):
// the tree, the election, the bounds.
std::vector<flag> tree_flags() {
  const doorman::node_options o;
  const doorman::etcd_election_options e;
  return {
      {"listen", "HOST:PORT", "address to listen on; port 0 picks a free port", o.listen},
      {"config", "[file:]PATH|etcd:KEY",
       "resource configuration: JSON, or Doorman's YAML for a path ending in .yml/.yaml "
       "(docs/configuration.md); required for a root, optional for an intermediate (the "
       "parent's algorithm is used); etcd:KEY reads it from etcd and applies each valid change",
       ""},
      {"parent", "HOST:PORT[,...]", "the parent position's tasks; makes this an intermediate", ""},
      {"parent-protocol", "json-rpc|grpc",
       "what the parent speaks: doorman's JSON-RPC, or Doorman's gRPC (a Doorman server, or a "
       "doorman node's --grpc-listen port); grpc needs a build with gRPC",
       "json-rpc"},
      {"advertise", "HOST:PORT",
       "address children are redirected to when this task is master (default: the listen "
       "address)",
       ""},
      {"admin", "HOST:PORT|off",
       "admin HTTP endpoint: /metrics, /status, /healthz, /readyz (docs/operations.md); "
       "default: the listen host with its port + 80 (port 0 when listening on port 0)",
       ""},
      {"etcd-endpoints", "HOST:PORT[,...]",
       "etcd members (v3 JSON gateway); with them, the tasks of one position elect a master", ""},
      {"election-key", "KEY", "etcd key of this position's election (one key per position)", e.key},
      {"election-ttl", "SECONDS",
       "TTL of the election lease: a dead master is replaced within it (whole seconds, >= 2)",
       shortest(e.ttl.count())},
      {"budget-mark-step", "X",
       "with an etcd election, a root keeps each budget's spend in etcd (KEY/budgets/ID under "
       "--election-key), with --state-file in that file, stored this fraction of the budget "
       "ahead; 0: not kept",
       "0.01"},
      {"state-file", "FILE",
       "without --etcd-endpoints: where this task keeps the end of the leases it granted (a "
       "restart with none outstanding grants at once, with no learning mode) and a root its "
       "budgets' spend (a window continues where it was); docs/operations.md",
       ""},
      {"id", "ID", "this node's id in status and at its parent (default: the advertised address)",
       ""},
      {"decay-factor", "X", "refresh interval factor per tree level, in [0.001, 1]",
       shortest(o.engine.decay_factor)},
      {"minimum-refresh-interval", "SECONDS", "a client asking sooner gets its lease back",
       shortest(o.engine.minimum_refresh_interval.count())},
      {"max-connections", "N", "connections beyond this are refused",
       std::to_string(o.server.max_connections)},
      {"max-message-bytes", "N", "longest request line",
       std::to_string(o.server.max_message_bytes)},
      {"max-in-flight", "N", "unwritten answers per connection before it is not read further",
       std::to_string(o.server.max_in_flight)},
      {"idle-timeout", "SECONDS", "a connection completing no request for this long is closed",
       shortest(o.server.idle_timeout.count())},
      {"parent-timeout", "SECONDS", "deadline of one request to the parent",
       shortest(o.parent_timeout.count())},
  };
}

// The flags of reloads and stops, TLS, access and logs.
std::vector<flag> operation_flags() {
  const doorman::node_options o;
  return {
      {"reload-interval", "SECONDS",
       "how often the files the node reads (--config, --access, the TLS files) are looked at; "
       "one that changed, a symlink swap included, is read again as on SIGHUP; 0: only on SIGHUP",
       "1"},
      {"drain-timeout", "SECONDS",
       "on SIGTERM, how long the answers already computed may take to be written before their "
       "connections are closed (docs/deployment.md)",
       shortest(o.server.stop_grace.count())},
      {"tls-cert", "FILE",
       "PEM certificate chain of this node: serve the JSON-RPC port and the admin endpoint over "
       "TLS (docs/security.md)",
       ""},
      {"tls-key", "FILE", "PEM private key of --tls-cert", ""},
      {"tls-ca", "FILE", "PEM CAs that client certificates must chain to (default: the system's)",
       ""},
      {"tls-client-auth", "MODE",
       "none, request (verify a client certificate when given) or require (refuse clients "
       "without a valid one)",
       doorman::net::to_string(o.tls.client_auth)},
      {"parent-tls-cert", "FILE",
       "PEM certificate this node shows its parent (mutual TLS); any --parent-tls-* flag makes "
       "the parent link TLS",
       ""},
      {"parent-tls-key", "FILE", "PEM private key of --parent-tls-cert", ""},
      {"parent-tls-ca", "FILE",
       "PEM CAs that the parent's certificate must chain to (default: the system's)", ""},
      {"parent-tls-server-name", "NAME",
       "name the parent's certificate must carry (default: the host of --parent)", ""},
      {"etcd-tls-cert", "FILE", "PEM client certificate for https:// etcd endpoints", ""},
      {"etcd-tls-key", "FILE", "PEM private key of --etcd-tls-cert", ""},
      {"etcd-tls-ca", "FILE", "PEM CAs of https:// etcd endpoints (default: the system's)", ""},
      {"access", "FILE",
       "access file (JSON, or YAML for .yml/.yaml): identity patterns to roles and resources; "
       "needs --tls-client-auth request or require (without it: each identity only its own "
       "client ids, no admin)",
       ""},
      {"max-client-ids", "N",
       "distinct client ids one caller (identity, else connection) may hold per resource; 0: "
       "no bound (access file rules set their own)",
       std::to_string(o.max_client_ids)},
      {"log-level", "LEVEL",
       "info (every line), warning (problems: lines starting \"warning: \" or \"error: \") or "
       "error",
       "info"},
      {"help", nullptr, "print this help and exit", ""},
      {"version", nullptr, "print the version and exit", ""},
  };
}

// The gRPC port's: Doorman's protocol and Envoy's RLQS.
std::vector<flag> grpc_flag_table() {
  return {
      {"grpc-listen", "HOST:PORT",
       "also serve Doorman's gRPC protocol (doorman.Capacity) there, for Doorman's clients and "
       "servers (docs/doorman-compatibility.md), and Envoy's rate limit quota service (RLQS, "
       "docs/envoy.md); needs a build with gRPC",
       ""},
      {"rlqs-max-streams", "N",
       "RLQS streams one identity (else peer host) may hold open at once on the gRPC port", "64"},
      {"rlqs-abandon-after", "SECONDS",
       "an RLQS bucket not reported for this long is abandoned and its lease released", "60"},
      {"grpc-advertise", "HOST:PORT",
       "address of the gRPC port that Doorman's clients are redirected to when this task is "
       "master (default: the --grpc-listen address, with the port it got)",
       ""},
  };
}

std::vector<flag> node_flags() {
  auto all = tree_flags();
  for (auto* more : {&grpc_flag_table, &operation_flags})
    for (auto& f : (*more)())
      all.push_back(std::move(f));
  return all;
}

constexpr const char* about =
    "usage: doorman-node [--FLAG VALUE]...\n"
    "Serves one position of a doorman capacity tree over JSON-RPC on TCP (one JSON object\n"
    "per line). Every flag may also be given as the environment variable DOORMAN_<FLAG>\n"
    "(upper case, '-' as '_'); the command line wins. SIGHUP reloads --config, the TLS\n"
    "certificates and --access, as does a change of one of these files; SIGTERM or SIGINT\n"
    "stops gracefully.\n\n";

// The admin address by default: the listen host, its port + 80 (0 stays 0).
std::string default_admin(const std::string& listen) {
  const auto a = doorman::net::parse_address(listen);
  if (!a) return "";
  const int port = std::stoi(a->port);
  return doorman::net::address{a->host, std::to_string(port == 0 ? 0 : port + 80)}.to_string();
}

// --election-ttl: whole seconds, 2 to 86400.
double election_ttl(const doorman_examples::flag_values& v) {
  const double ttl = v.number("election-ttl", 2, 86400);
  if (ttl != std::floor(ttl)) {
    throw std::invalid_argument(
        fmt::format("--election-ttl: expected whole seconds, got \"{}\"", v.at("election-ttl")));
  }
  return ttl;
}

// The election's own flags, read without etcd too: a bad value is refused whether it applies
// or not (a typo must not wait for the day etcd is added to show).
void check_election_flags(const doorman_examples::flag_values& v) {
  (void)election_ttl(v);
  (void)v.number("budget-mark-step", 0, 1);
}

void read_election(const doorman_examples::flag_values& v, doorman::etcd_election_options& e,
                   doorman::node_options& o) {
  o.config.etcd_endpoints = doorman::net::split_list(v.at("etcd-endpoints"));
  if (o.config.etcd_endpoints.empty()) throw std::invalid_argument("--etcd-endpoints: none given");
  for (const auto& ep : o.config.etcd_endpoints) {
    if (!doorman::net::etcd_client::parse_endpoint(ep)) {
      throw std::invalid_argument(
          fmt::format("--etcd-endpoints: expected host:port, got \"{}\"", ep));
    }
  }
  e.endpoints = o.config.etcd_endpoints;
  e.key = v.at("election-key");
  if (e.key.empty()) throw std::invalid_argument("--election-key: empty");
  e.ttl = doorman::seconds(election_ttl(v));
  e.log = o.log;
  e.tls = o.config.etcd_tls;
  o.engine.budget_mark_step = v.number("budget-mark-step", 0, 1);
  o.budget_marks = {
      .etcd_endpoints = e.endpoints, .etcd_tls = e.tls, .prefix = e.key + "/budgets/"};
}

// --state-file: a task without an election in etcd keeps its state there.
void read_state_file(const doorman_examples::flag_values& v, doorman::node_options& o) {
  if (v.given("etcd-endpoints")) {
    throw std::invalid_argument(
        "--state-file: not with --etcd-endpoints (the election and the budget marks keep their "
        "state in etcd)");
  }
  o.state_file = v.at("state-file");
  if (o.state_file.empty()) throw std::invalid_argument("--state-file: empty");
  o.engine.budget_mark_step = v.number("budget-mark-step", 0, 1);
}

// A file flag's value, checked to be readable now (a clear error before TLS setup).
std::string readable_file(const doorman_examples::flag_values& v, const char* name) {
  if (!v.given(name)) return "";
  const std::string path = v.at(name);
  if (path.empty() || !std::ifstream(path)) {
    throw std::invalid_argument(fmt::format("--{}: cannot read \"{}\"", name, path));
  }
  return path;
}

void read_security(const doorman_examples::flag_values& v, doorman::node_options& o) {
  o.tls.cert_file = readable_file(v, "tls-cert");
  o.tls.key_file = readable_file(v, "tls-key");
  o.tls.ca_file = readable_file(v, "tls-ca");
  const auto auth = doorman::net::parse_client_auth(v.at("tls-client-auth"));
  if (!auth) {
    throw std::invalid_argument(
        fmt::format("--tls-client-auth: expected none, request or require, got \"{}\"",
                    v.at("tls-client-auth")));
  }
  o.tls.client_auth = *auth;
  if (o.tls.active() && o.tls.cert_file.empty()) {
    throw std::invalid_argument("--tls-cert: required with --tls-key or --tls-ca");
  }
  if (*auth != doorman::net::client_auth::none && o.tls.cert_file.empty()) {
    throw std::invalid_argument("--tls-client-auth: needs --tls-cert and --tls-key");
  }
  o.parent_tls.cert_file = readable_file(v, "parent-tls-cert");
  o.parent_tls.key_file = readable_file(v, "parent-tls-key");
  o.parent_tls.ca_file = readable_file(v, "parent-tls-ca");
  o.parent_tls.server_name = v.at("parent-tls-server-name");
  o.parent_tls.enabled = !o.parent_tls.server_name.empty();
  o.config.etcd_tls.cert_file = readable_file(v, "etcd-tls-cert");
  o.config.etcd_tls.key_file = readable_file(v, "etcd-tls-key");
  o.config.etcd_tls.ca_file = readable_file(v, "etcd-tls-ca");
  o.access = readable_file(v, "access");
  o.access_parse = doorman_examples::parse_access_any;
  if (!o.access.empty() && *auth == doorman::net::client_auth::none) {
    throw std::invalid_argument("--access: needs --tls-client-auth request or require");
  }
  o.max_client_ids = static_cast<std::size_t>(v.number("max-client-ids", 0, 1e6));
}

// node_options from the flags; throws std::invalid_argument naming the flag.
void read_options(const doorman_examples::flag_values& v, doorman::node_options& o) {
  o.listen = v.at("listen");
  if (!doorman::net::parse_address(o.listen)) {
    throw std::invalid_argument(fmt::format("--listen: expected host:port, got \"{}\"", o.listen));
  }
  if (v.given("parent")) {
    o.parents = doorman::net::split_list(v.at("parent"));
    if (o.parents.empty()) throw std::invalid_argument("--parent: no address given");
  }
  if (v.given("advertise")) {
    o.advertise = v.at("advertise");
    if (!doorman::net::parse_address(o.advertise)) {
      throw std::invalid_argument(
          fmt::format("--advertise: expected host:port, got \"{}\"", o.advertise));
    }
  }
  o.admin = v.given("admin") ? v.at("admin") : default_admin(o.listen);
  if (o.admin == "off") o.admin.clear();
  if (!o.admin.empty() && !doorman::net::parse_address(o.admin)) {
    throw std::invalid_argument(
        fmt::format("--admin: expected host:port or off, got \"{}\"", o.admin));
  }
  if (v.given("id")) o.id = v.at("id");
  o.engine.decay_factor = v.number("decay-factor", 1e-3, 1);
  o.engine.minimum_refresh_interval =
      doorman::seconds(v.number("minimum-refresh-interval", 0, 86400));
  o.server.max_connections = static_cast<std::size_t>(v.number("max-connections", 1, 1e7));
  o.server.max_message_bytes =
      static_cast<std::size_t>(v.number("max-message-bytes", 256, 1 << 30));
  o.server.max_in_flight = static_cast<std::size_t>(v.number("max-in-flight", 1, 1e7));
  o.server.idle_timeout = doorman::seconds(v.number("idle-timeout", 0.1, 86400 * 7));
  o.parent_timeout = doorman::seconds(v.number("parent-timeout", 0.01, 3600));
  o.server.stop_grace = doorman::seconds(v.number("drain-timeout", 0, 3600));
  read_security(v, o);
  o.config.parse = doorman_examples::parse_config_any;
  if (v.given("config")) {
    o.config.source = v.at("config");
    try {
      (void)doorman::config_location::parse(o.config.source);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("--") + e.what());
    }
  } else if (o.parents.empty()) {
    throw std::invalid_argument("--config is required for a root (no --parent)");
  }
}

// The gRPC port's flags: where (empty: none), and its RLQS streams' bounds.
struct grpc_flags {
  std::string listen;
  std::size_t rlqs_max_streams = 64;
  double rlqs_abandon_after = 60;
};

// Doorman's gRPC door over `node`, when asked for (`--grpc-listen`).
template <class Node>
struct grpc_front {
#ifdef DOORMAN_HAVE_GRPC
  std::optional<doorman::grpc_door::node_handler<Node>> handler;
  std::optional<doorman::grpc_door::server> server;

  // Before the node starts, so that its election announces the gRPC port.
  void start(Node& node, const grpc_flags& flags) {
    const std::string& listen = flags.listen;
    if (listen.empty()) return;
    handler.emplace(node);
    doorman::grpc_door::rlqs_options rlqs;
    rlqs.max_streams_per_identity = flags.rlqs_max_streams;
    rlqs.session.abandon_after = flags.rlqs_abandon_after;
    server.emplace(doorman::grpc_door::server_options{listen, node.options().tls}, *handler, rlqs);
    server->start();
    const auto at = fmt::format("{}:{}", doorman::net::parse_address(listen)->host, server->port());
    if (node.options().advertise_grpc.empty()) node.advertise_grpc(at);
    doorman_examples::log_line(fmt::format("doorman.Capacity (gRPC) listening on {}", at));
    // Not "listening on": tools read the first such line after the gRPC one as the JSON-RPC
    // port's.
    doorman_examples::log_line(
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService (RLQS) served there too");
  }
  // Its calls in flight are answered on the node's strand, which runs meanwhile, for `grace`
  // at most.
  void stop(std::chrono::milliseconds grace) {
    if (server) server->stop(grace);
  }
  // SIGHUP: the certificate files again (as the node's other ports read them).
  void reload_tls() {
    if (!server) return;
    try {
      if (server->reload_tls()) doorman_examples::log_line("gRPC TLS certificates reloaded");
    } catch (const std::exception& e) {
      doorman_examples::log_line(
          fmt::format("error: gRPC TLS certificates rejected, keeping the old: {}", e.what()));
    }
  }
#else
  void start(Node&, const grpc_flags& flags) {
    if (!flags.listen.empty()) throw std::runtime_error("--grpc-listen: this build has no gRPC");
  }
  void stop(std::chrono::milliseconds) {}
  void reload_tls() {}
#endif
};

// The parent link speaks Doorman's gRPC (`--parent-protocol grpc`).
void use_grpc_parent(doorman::node_options& o) {
#ifdef DOORMAN_HAVE_GRPC
  o.parent_channel = doorman::grpc_door::make_parent_channel;
#else
  (void)o;
  throw std::invalid_argument("--parent-protocol grpc: this build has no gRPC");
#endif
}

template <class Node>
int serve(asio::io_context& io, Node& node, doorman::file_watch files,
          const grpc_flags& grpc_listen, double reload_interval) {
  // The signals are caught before anything says "listening": a SIGTERM sent on that line
  // stops the node gracefully instead of killing it.
  asio::signal_set hup(io, SIGHUP);
  asio::signal_set stop_signals(io, SIGINT, SIGTERM);
  grpc_front<Node> grpc;
  grpc.start(node, grpc_listen);
  const auto reload = [&] {
    node.reload_config();
    node.reload_security();
    grpc.reload_tls();
  };
  // The files the node reads, followed: a change (a Kubernetes ConfigMap swaps a symlink and
  // sends no signal) reloads them as SIGHUP does.
  doorman::file_follower follower(
      io.get_executor(), "files", std::move(files), doorman::seconds(reload_interval),
      [&](const auto&) { reload(); },
      [](std::string_view line) { doorman_examples::log_line(line); });
  node.start();
  std::thread stopper;
  if (!node.options().config.source.empty()) {
    doorman_examples::log_line(
        fmt::format("configuration loaded from {}",
                    doorman::config_location::parse(node.options().config.source).name()));
  }
  stop_signals.async_wait([&](std::error_code ec, int signal) {
    if (ec) return;
    doorman_examples::log_line(fmt::format("signal {}: stopping gracefully", signal));
    hup.cancel();  // with the node stopped, nothing else is left to run
    follower.stop();
    stopper = std::thread([&] {
      node.resign();  // another task takes over while this one drains
      grpc.stop(
          std::chrono::duration_cast<std::chrono::milliseconds>(node.options().server.stop_grace));
      node.stop();
    });
  });
  std::function<void(std::error_code, int)> on_hup = [&](std::error_code ec, int) {
    if (ec) return;
    follower.reread();
    hup.async_wait(on_hup);
  };
  hup.async_wait(on_hup);
  follower.start();
  io.run();
  if (stopper.joinable()) stopper.join();
  doorman_examples::log_line("stopped");
  return 0;
}

// Builds the node (reading its configuration) and serves. A bad configuration exits 2; a
// failure to bind, 1.
template <class Node, class... Election>
int build_and_serve(asio::io_context& io, doorman::node_options& o, const grpc_flags& grpc_listen,
                    double reload_interval, Election&&... election) {
  // The files' stamps before the node reads them: a change between the two is seen at the
  // next look.
  std::optional<doorman::file_watch> files;
  std::optional<Node> node;
  try {
    files.emplace(o.files());
    node.emplace(io.get_executor(), std::move(o), std::forward<Election>(election)...);
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "doorman-node: --{}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "doorman-node: {}\n", e.what());
    return 2;
  }
  try {
    return serve(io, *node, std::move(*files), grpc_listen, reload_interval);
  } catch (const std::exception& e) {
    doorman_examples::log_line(fmt::format("fatal: {}", e.what()));
    return 1;
  }
}

// The gRPC flags: the address to listen on (empty: none), the parent's protocol, the address
// advertised, the RLQS streams' bounds.
grpc_flags read_grpc(const doorman_examples::flag_values& v, doorman::node_options& o) {
  grpc_flags flags;
  flags.rlqs_max_streams = static_cast<std::size_t>(v.number("rlqs-max-streams", 1, 1e6));
  flags.rlqs_abandon_after = v.number("rlqs-abandon-after", 1, 86400);
  std::string& listen = flags.listen;
  if (v.given("grpc-listen")) {
    listen = v.at("grpc-listen");
    if (!doorman::net::parse_address(listen)) {
      throw std::invalid_argument(
          fmt::format("--grpc-listen: expected host:port, got \"{}\"", listen));
    }
  }
  if (const auto& p = v.at("parent-protocol"); p == "grpc") {
    use_grpc_parent(o);
  } else if (p != "json-rpc") {
    throw std::invalid_argument(
        fmt::format("--parent-protocol: expected json-rpc or grpc, got \"{}\"", p));
  }
  if (v.given("grpc-advertise")) {
    if (listen.empty()) throw std::invalid_argument("--grpc-advertise needs --grpc-listen");
    o.advertise_grpc = v.at("grpc-advertise");
    if (!doorman::net::parse_address(o.advertise_grpc)) {
      throw std::invalid_argument(
          fmt::format("--grpc-advertise: expected host:port, got \"{}\"", o.advertise_grpc));
    }
  }
  return flags;
}

}  // namespace

int main(int argc, char** argv) {
  doorman::node_options o;
  doorman::etcd_election_options election;
  grpc_flags grpc_listen;
  double reload_interval = 1;
  try {
    const auto table = node_flags();
    const auto v = doorman_examples::read_flags(argc, argv, table, "DOORMAN_");
    if (v.given("help")) {
      std::fputs((about + doorman_examples::flag_help(table)).c_str(), stdout);
      return 0;
    }
    if (v.given("version")) {
      doorman_examples::print_version(argv[0]);
      return 0;
    }
    doorman_examples::set_log_level(v.at("log-level"));
    o.log = doorman_examples::log_line;
    doorman_examples::warn_unknown_environment(table, "DOORMAN_");
    read_options(v, o);
    reload_interval = v.number("reload-interval", 0, 3600);
    grpc_listen = read_grpc(v, o);
    check_election_flags(v);
    if (v.given("etcd-endpoints")) read_election(v, election, o);
    if (v.given("state-file")) read_state_file(v, o);
    if (doorman::config_location::parse(o.config.source).type ==
            doorman::config_location::kind::etcd &&
        o.config.etcd_endpoints.empty()) {
      throw std::invalid_argument("--config etcd:KEY needs --etcd-endpoints");
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "doorman-node: {}\n", e.what());
    return 2;
  }

  // One thread runs the node (the gRPC layer's threads post to it).
  asio::io_context io(1);
  o.single_threaded = true;
  if (election.endpoints.empty()) {
    return build_and_serve<doorman::node>(io, o, grpc_listen, reload_interval);
  }
  return build_and_serve<doorman::basic_node<doorman::etcd_election>>(
      io, o, grpc_listen, reload_interval, doorman::etcd_election(io.get_executor(), election));
}
