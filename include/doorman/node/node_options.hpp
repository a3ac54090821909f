#pragma once

/// \file
/// A node's options, and what the node makes of them before it starts: the options checked
/// and completed, its access policy, its first configuration.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>

#include "doorman/core/engine.hpp"
#include "doorman/core/time.hpp"
#include "doorman/core/upstream.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/channel.hpp"
#include "doorman/net/http_server.hpp"
#include "doorman/net/server.hpp"
#include "doorman/node/access.hpp"
#include "doorman/node/budget_marks.hpp"
#include "doorman/node/config_source.hpp"
#include "doorman/protocol/service.hpp"

namespace doorman {

/// Options of a node, with their defaults.
struct node_options {
  /// Where to listen, `host:port`; port 0 picks a free one (see `local_address`).
  std::string listen = "127.0.0.1:7700";
  /// The parent position's addresses; empty for a root.
  std::vector<std::string> parents;
  /// The address children are redirected to when this node is master; default: the address
  /// it listens on.
  std::string advertise;
  /// The address of the node's gRPC door (Doorman's protocol, served by the compiled layer
  /// doorman::grpc), announced with the election so that a non-master's gRPC answers name the
  /// master's gRPC door; empty: the node has none (see `advertised_doors`).
  std::string advertise_grpc;
  /// The node's id in `status` and at its parent; default: the advertised address.
  std::string id;
  net::server_options server;
  /// Whether one thread only runs the executor given to the node (an io_context whose `run`
  /// one thread calls, as in doorman-node). The node then works on that executor directly, not
  /// on a strand of it, which saves a hand-off on every completion of its I/O. Calls that post
  /// to the node from other threads (`stop`, `reload_config`, the gRPC layer) stay safe.
  bool single_threaded = false;
  /// `is_root` is set from `parents`.
  engine_options engine;
  /// `server_id` defaults to `id`; `decay_factor` follows `engine.decay_factor`.
  upstream_options upstream;
  /// Deadline of one request to the parent.
  seconds parent_timeout{5};
  /// Where the configuration comes from, for the constructor without one and for
  /// `reload_config()`.
  config_options config{};

  /// Where a root keeps its budgets' marks, with `engine.budget_mark_step` (docs/budgets.md,
  /// "When every root is lost"). Without a prefix and etcd endpoints, none are kept (the step
  /// is then 0).
  budget_mark_options budget_marks{};
  /// A task without an election in etcd: the file where it keeps the end of the leases it
  /// granted (so that after a restart with none outstanding it grants at once) and, at a root,
  /// its budgets' marks, with `engine.budget_mark_step` (so that a window continues where it
  /// was); docs/operations.md, "The state file". Empty: none (every start is in learning
  /// mode; a standalone root's budgets start from 0).
  std::string state_file;
  /// Where the admin endpoint listens, `host:port` (port 0: a free one; see `admin_address`);
  /// empty: no admin endpoint.
  std::string admin;
  /// Limits of the admin endpoint.
  net::http_server_options admin_server{};
  /// Receives one line per notable event (start, config reload, parent lost and regained,
  /// mastership). Null: silent.
  std::function<void(std::string_view)> log{};
  /// TLS of the JSON-RPC port and the admin endpoint (docs/security.md); all empty: plaintext.
  net::tls_options tls{};
  /// TLS of the link to the parent (a certificate here identifies this node to its parent).
  net::tls_options parent_tls{};
  /// Makes the parent link's channel; null: doorman's JSON-RPC (see `parent_link_options`).
  std::function<std::unique_ptr<net::call_channel>(asio::any_io_executor, net::channel_options)>
      parent_channel{};
  /// The access file (docs/security.md). Needs client certificates (`tls.client_auth` request
  /// or require). Empty: with client certificates, `access_policy::defaults()` (each identity
  /// a client of its own client ids and a server; no admin); without, every caller may make
  /// every call.
  std::string access;
  /// Turns the access file's text into a policy; null: JSON (`access_policy::parse`).
  std::function<access_policy(std::string_view text, const std::string& name)> access_parse{};
  /// Distinct client ids one caller (an identity, else a connection) may hold on one resource
  /// at once; 0: no bound. Rules of an access file set their own (`max_client_ids`).
  std::size_t max_client_ids = 0;

  /// The files the node reads and reads again on `reload_config` and `reload_security`: the
  /// configuration (when a file), the access file and every certificate, key and CA file.
  [[nodiscard]] std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (const auto c = config_location::parse(config.source); c.type == config_location::kind::file)
      out.push_back(c.where);
    out.push_back(access);
    for (const net::tls_options* t : {&tls, &parent_tls, &config.etcd_tls}) {
      out.insert(out.end(), {t->cert_file, t->key_file, t->ca_file});
    }
    std::erase_if(out, [](const std::string& f) { return f.empty(); });
    return out;
  }
};

/// The placeholder configuration of an intermediate without one: every resource has capacity 0
/// until the parent's lease says otherwise, and the parent's algorithm is adopted.
[[nodiscard]] inline resource_repository intermediate_default_config() {
  return resource_repository::parse(R"({"resources": [{"identifier_glob": "*", "capacity": 0,
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16}}]})");
}

namespace detail {

// The access file's policy; with client certificates and no file, the default policy.
inline std::optional<access_policy> node_access_policy(const node_options& o) {
  if (o.access.empty() && o.tls.active() && o.tls.client_auth != net::client_auth::none)
    return access_policy::defaults(o.max_client_ids);
  if (o.access.empty()) return std::nullopt;
  if (o.tls.client_auth == net::client_auth::none) {
    throw std::invalid_argument(
        "access: an access file needs client certificates (tls client_auth request or "
        "require)");
  }
  const std::string text = read_config_file_text(o.access);
  try {
    return o.access_parse ? o.access_parse(text, o.access) : access_policy::parse(text);
  } catch (const std::exception& e) {
    throw config_error("", fmt::format("access file {}: {}", o.access, e.what()));
  }
}

// The configuration a node starts with: from its source, or an intermediate's placeholder.
inline loaded_config initial_node_config(const node_options& o) {
  if (o.config.source.empty() && !o.parents.empty()) {
    return {intermediate_default_config(), 0};
  }
  if (o.config.source.empty()) throw std::invalid_argument("config: required for a root");
  return load_config(o.config);
}

// The options as the node runs them: checked (an address that is not host:port throws
// `std::invalid_argument` naming it), with what follows from them filled in.
inline node_options prepare_node_options(node_options o) {
  o.engine.is_root = o.parents.empty();
  if (o.engine.utc_offset == 0) {  // budgets count in UTC windows: the steady clock's zero in it
    using namespace std::chrono;
    o.engine.utc_offset =
        unix_seconds_now() - duration<double>(steady_clock::now().time_since_epoch()).count();
  }
  const bool in_etcd = !o.budget_marks.prefix.empty() && !o.budget_marks.etcd_endpoints.empty();
  if (in_etcd && !o.state_file.empty()) {
    throw std::invalid_argument(
        "state_file: only for a task without an election in etcd (budget marks are kept there)");
  }
  if (!in_etcd) o.budget_marks.prefix.clear();
  if (!in_etcd && (o.state_file.empty() || !o.engine.is_root)) {
    o.engine.budget_mark_step = 0;  // nowhere to keep marks: none
  }
  o.upstream.decay_factor = o.engine.decay_factor;
  if (!net::parse_address(o.listen)) {
    throw std::invalid_argument("listen: expected host:port, got \"" + o.listen + "\"");
  }
  if (!o.admin.empty() && !net::parse_address(o.admin)) {
    throw std::invalid_argument("admin: expected host:port, got \"" + o.admin + "\"");
  }
  for (const auto& p : o.parents) {
    if (!net::parse_address(p)) {
      throw std::invalid_argument("parent: expected host:port, got \"" + p + "\"");
    }
  }
  if (!o.engine.log && o.log) o.engine.log = o.log;
  if (!o.upstream.log && o.log) o.upstream.log = o.log;
  return o;
}

// What a started node says of itself: its id (`id`, or the advertised address once bound), its
// role and level, its first parent.
inline node_identity identity_of(const node_options& o) {
  const bool root = o.parents.empty();
  return {.id = o.id.empty() ? o.advertise : o.id,
          .role = root ? "root" : "intermediate",
          .level = root ? 0 : 1,
          .parent = root ? std::nullopt : std::optional<std::string>(o.parents[0])};
}

}  // namespace detail
}  // namespace doorman
