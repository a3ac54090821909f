#pragma once

/// \file
/// A server process's composition (docs/node.md): the engine, the JSON-RPC server, the upstream
/// loop of an intermediate (its parent's leases become its capacity), the election and config
/// reload. Everything of a node runs on one strand (or on the one thread of `single_threaded`), so
/// the engine is touched from one place only.
///
///     asio::io_context io;
///     doorman::node root(io.get_executor(), config, {.listen = "127.0.0.1:7700"});
///     root.start();
///     io.run();  // until root.stop()
///
/// A node is embedded: it owns no thread and no signal handler; the `doorman-node` binary adds
/// those (and calls `reload_config()` on SIGHUP). With `node_options::config` it reads its
/// configuration from a file or an etcd key itself; with `node_options::admin` it serves the
/// admin endpoint (`/metrics`, `/status`, `/healthz`, `/readyz`; docs/operations.md). Destroy
/// it after its io_context has stopped running.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "doorman/core/engine.hpp"
#include "doorman/core/upstream.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/http_server.hpp"
#include "doorman/net/server.hpp"
#include "doorman/node/access.hpp"
#include "doorman/node/admin.hpp"
#include "doorman/node/config_driver.hpp"
#include "doorman/node/config_source.hpp"
#include "doorman/node/election.hpp"
#include "doorman/node/parent_link.hpp"
#include "doorman/node/status_page.hpp"
#include "doorman/protocol/codec.hpp"
#include "doorman/protocol/dispatch.hpp"

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

template <election Election = single_election, class Algorithms = default_algorithms>
class basic_node {
 public:
  using engine_type = basic_engine<std::chrono::steady_clock, Algorithms>;
  using clock = std::chrono::steady_clock;

  /// A node with the configuration `config`. Throws `std::invalid_argument` on a malformed
  /// address in the options.
  basic_node(asio::any_io_executor executor, resource_repository config, node_options options,
             Election election = {})
      : basic_node(std::move(executor), loaded_config{std::move(config), 0}, std::move(options),
                   std::move(election)) {}

  /// A node that reads its configuration from `options.config.source` before it returns
  /// (throws `config_error` or `std::runtime_error` when that fails), or, for an intermediate
  /// without a source, `intermediate_default_config()`.
  basic_node(asio::any_io_executor executor, node_options options, Election election = {})
      // `options` is copied, not moved: the arguments are evaluated in no set order.
      : basic_node(std::move(executor), initial_config(options), options, std::move(election)) {}

  basic_node(const basic_node&) = delete;
  basic_node& operator=(const basic_node&) = delete;

  /// Binds, then starts serving, the admin endpoint, the election, the configuration's etcd
  /// poll and, for an intermediate, the upstream loop. Call before running the io_context, or
  /// on it. Throws `std::system_error` when it cannot bind (e.g. the port is in use), naming
  /// the address.
  void start() {
    std::error_code ec;
    start(ec);
    if (ec) throw std::system_error(ec, "listening on " + failed_bind_);
  }

  /// As above; `ec` says why it could not bind, and then nothing is started.
  void start(std::error_code& ec) {
    if (!bind(ec)) return;
    started_at_ = clock::now();
    identity_.id = options_.id.empty() ? options_.advertise : options_.id;
    identity_.role = options_.parents.empty() ? "root" : "intermediate";
    identity_.level = options_.parents.empty() ? 0 : 1;
    if (!options_.parents.empty()) identity_.parent = options_.parents[0];
    if (options_.upstream.server_id.empty()) options_.upstream.server_id = identity_.id;
    server_.start();
    log(fmt::format("{} {} listening on {}", identity_.role, identity_.id, local_));
    if (access_.policy() && access_.policy()->built_in()) {
      log("access: client certificates and no access file: each identity may use only its own "
          "client ids (IDENTITY and IDENTITY#NAME) and report as a server; admin calls are "
          "refused until an access file grants them");
    }
    if (admin_) {
      admin_->start();
      log(fmt::format("admin endpoint on {}://{}/status", tls_ ? "https" : "http", admin_local_));
    }
    election_.start(advertised_doors{options_.advertise, options_.advertise_grpc}.value(),
                    [this](bool is_master, std::optional<std::string> m) {
                      asio::post(strand_, [this, is_master, m = std::move(m)]() mutable {
                        on_mastership(is_master, std::move(m));
                      });
                    });
    if (!options_.parents.empty()) start_parent_link();
    config_.start();
  }

  /// Sets the address announced for the node's gRPC door (`node_options::advertise_grpc`),
  /// for a door that learns its port only when it binds; before `start`.
  void advertise_grpc(std::string address) { options_.advertise_grpc = std::move(address); }

  /// The address it listens on (after `start`), e.g. "127.0.0.1:40213".
  [[nodiscard]] const std::string& local_address() const noexcept { return local_; }

  /// The admin endpoint's address (after `start`; empty without one).
  [[nodiscard]] const std::string& admin_address() const noexcept { return admin_local_; }

  /// Replaces the configuration, keeping every lease (thread-safe: posts to the strand).
  void reload(resource_repository config) {
    asio::post(strand_, [this, c = std::move(config)]() mutable {
      engine_.set_config(std::move(c));
      metrics_.count_reload(true);
      log(fmt::format("configuration reloaded: {} templates", engine_.config().templates().size()));
    });
  }

  /// Re-reads `options().config.source` (thread-safe): a file is read and, when valid, applied
  /// (else the old configuration is kept and the error logged); an etcd key is read at once.
  void reload_config() {
    asio::post(strand_, [this] {
      if (!stopping_) config_.reload();
    });
  }

  /// Re-reads the TLS certificates, keys and CAs (of the listening ports and of the parent
  /// link) and the access file (thread-safe). Connections already open keep the certificates
  /// they started with; new ones get the new. What fails to load is logged and the old kept.
  void reload_security() {
    asio::post(strand_, [this] {
      if (stopping_) return;
      reload_part("TLS certificates", [this] {
        if (tls_) tls_->reload();
        if (parent_) parent_->reload_tls();
        return tls_ || options_.parent_tls.active();
      });
      reload_part("etcd TLS certificates", [this] {
        bool election = false;
        if constexpr (requires { election_.reload_tls(); }) {
          election_.reload_tls();
          election = options_.config.etcd_tls.active();
        }
        return config_.reload_tls() || election;
      });
      reload_part("access file " + options_.access, [this] {
        if (options_.access.empty()) return false;
        access_.set_policy(read_access(options_));
        return true;
      });
    });
  }

  /// Gives mastership up at once (thread-safe): the election stops, and an etcd election
  /// revokes its lease so that another task takes over; the node answers on, as a task that
  /// knows no master, until `stop()`. `stop()` does it first too; a program with other doors
  /// to drain before `stop()` (the gRPC door) calls it before draining them.
  void resign() {
    asio::post(strand_, [this] { election_.stop(); });
  }

  /// Graceful stop (thread-safe): stops accepting and reading, writes the answers already
  /// computed, stops the upstream loop, the election, the configuration poll and the admin
  /// endpoint. `io.run()` returns once done.
  void stop() {
    asio::post(strand_, [this] {
      if (stopping_) return;
      stopping_ = true;
      log("stopping");
      election_.stop();
      server_.stop();
      if (admin_) admin_->stop();
      config_.stop();
      if (parent_) parent_->stop();
    });
  }

  /// One call of method `M` (a row of `method_table`) from a door other than the node's
  /// JSON-RPC port, e.g. Doorman's gRPC service: made on the node's strand exactly as a
  /// JSON-RPC call is (the election term, access control by `peer`'s identity, the metrics by
  /// method and outcome, counted under `door`, the parent link told), then `done(result)` is
  /// called there.
  /// Thread-safe.
  template <class M, class Done>
  void call(typename M::request request, net::peer_info peer, rpc_door door, Done done) {
    asio::post(strand_, [this, request = std::move(request), peer = std::move(peer), door,
                         done = std::move(done)]() mutable {
      const auto start = clock::now();
      apply_term(start);
      auto result = guarded() ? guarded_call<M>(request, peer, start)
                              : call_method<M>(engine_, request, start, {&identity_, nullptr});
      const auto now = clock::now();
      dispatch_record record{M::id, {}, door};
      if (!result) record.error = result.code();
      metrics_.observe(record, std::chrono::duration<double>(now - start).count());
      fence(now);
      if (parent_) parent_->after_calls();
      if (door == rpc_door::grpc) name_grpc_master(result);
      done(std::move(result));
    });
  }

  /// Runs `f(engine)` on the node's strand (for embedding code that wants to look inside).
  template <class F>
  void post(F f) {
    asio::post(strand_, [this, f = std::move(f)]() mutable {
      apply_term(clock::now());
      f(engine_);
    });
  }

  [[nodiscard]] const node_options& options() const noexcept { return options_; }
  [[nodiscard]] const net::server& server() const noexcept { return server_; }

  /// The node's state as the admin pages show it; with `resource`, that resource and page
  /// `page` (from 1) of its leases. Call it on the strand (inside `post`, or an admin handler).
  [[nodiscard]] admin_snapshot snapshot(std::optional<std::string> resource = std::nullopt,
                                        std::size_t page = 1) {
    const auto now = clock::now();
    admin_snapshot s = base_snapshot(now);
    lease_page leases;
    if (resource) {
      leases.offset = static_cast<std::int64_t>((page - 1) * leases_per_page);
      leases.limit = static_cast<std::int64_t>(leases_per_page);
    }
    // Through the service, as a `status` call from any door (the admin's access is by path).
    auto answer = call_method<methods::status>(
        engine_, status_params{status_request{std::move(resource)}, leases}, now,
        {&identity_, nullptr});
    if (!answer) return s;
    auto& st = answer.value().status;
    for (const auto& r : st.resources) {
      const auto& t = engine_.config().find(r.resource_id);
      auto lease = engine_.parent_lease(r.resource_id);
      s.resources.push_back({r, t.description, t.identifier_glob,
                             lease ? std::optional<double>(lease->capacity) : std::nullopt});
    }
    s.lease_count = st.lease_count.value_or(0);
    s.leases = std::move(st.leases);
    return s;
  }

  /// The node's state as `/readyz` needs it: whether it started, and its mastership (on the
  /// strand; a full `snapshot` would copy the configuration).
  [[nodiscard]] admin_snapshot readiness_snapshot() const {
    admin_snapshot s;
    s.started = started_at_ != clock::time_point{};
    s.mastership = engine_.mastership();
    return s;
  }

  /// The node's counters (on the strand).
  [[nodiscard]] const node_metrics& metrics() const noexcept { return metrics_; }

 private:
  basic_node(asio::any_io_executor executor, loaded_config config, node_options options,
             Election election)
      : strand_(options.single_threaded ? executor
                                        : asio::any_io_executor(asio::make_strand(executor))),
        options_(prepare(std::move(options))),
        engine_(std::move(config.config), options_.engine),
        access_(read_access(options_), options_.max_client_ids,
                [this](std::string_view resource, std::string_view client) {
                  const auto* store = engine_.store(resource);
                  return store != nullptr && store->find(client) != nullptr;
                }),
        server_(strand_, options_.server,
                net::server::batch_handler(
                    [this](std::span<const std::string_view> lines, const net::peer_info& peer,
                           std::string& out) { return on_lines(lines, peer, out); }),
                options_.log),
        tls_(options_.tls.active()
                 ? std::make_shared<net::tls_context>(net::tls_side::server, options_.tls)
                 : nullptr),
        election_(std::move(election)),
        config_(strand_, engine_, options_.config, config.revision, metrics_, options_.log) {
    metrics_.count_reload(true);
    if (!options_.admin.empty()) {
      admin_.emplace(
          strand_, options_.admin_server,
          [this](const net::http_request& r, const net::peer_info& peer) {
            return on_admin(r, peer);
          },
          options_.log);
      admin_->use_tls(tls_);
    }
    server_.use_tls(tls_);
    server_.on_disconnect([this](const net::peer_info& p) { access_.disconnected(p.connection); });
  }

  // The access file's policy; with client certificates and no file, the default policy.
  static std::optional<access_policy> read_access(const node_options& o) {
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

  static loaded_config initial_config(const node_options& o) {
    if (o.config.source.empty() && !o.parents.empty()) {
      return {intermediate_default_config(), 0};
    }
    if (o.config.source.empty()) throw std::invalid_argument("config: required for a root");
    return load_config(o.config);
  }

  static node_options prepare(node_options o) {
    o.engine.is_root = o.parents.empty();
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

  // Binds the JSON-RPC port, then the admin port; on failure neither stays bound, and
  // `failed_bind_` names the address.
  bool bind(std::error_code& ec) {
    failed_bind_ = options_.listen;
    server_.listen(*net::parse_address(options_.listen), ec);
    if (ec) return false;
    const auto ep = server_.local_endpoint();
    local_ = net::address{ep.address().to_string(), std::to_string(ep.port())}.to_string();
    if (options_.advertise.empty()) options_.advertise = local_;
    if (admin_) {
      failed_bind_ = options_.admin;
      admin_->listen(*net::parse_address(options_.admin), ec);
      if (ec) {
        server_.stop();
        return false;
      }
      const auto a = admin_->local_endpoint();
      admin_local_ = net::address{a.address().to_string(), std::to_string(a.port())}.to_string();
    }
    return true;
  }

  void log(const std::string& s) const {
    if (options_.log) options_.log(s);
  }

  // An intermediate's link to its parent, once its id is known.
  void start_parent_link() {
    parent_.emplace(
        strand_, engine_,
        parent_link_options{options_.parents, options_.parent_timeout, options_.parent_tls,
                            options_.upstream, options_.log, options_.parent_channel},
        metrics_, identity_, [this] { apply_term(clock::now()); });
    parent_->start();
  }

  void on_mastership(bool is_master, std::optional<std::string> m) {
    if (stopping_) return;
    elected_ = is_master;
    const bool changed = is_master != engine_.mastership().is_master;
    const auto now = clock::now();
    std::optional<std::string> master;
    master_grpc_.reset();
    if (m) {
      auto doors = advertised_doors::parse(*m);
      master = std::move(doors.json_rpc);
      if (!doors.grpc.empty()) master_grpc_ = std::move(doors.grpc);
    }
    engine_.set_mastership(is_master, std::move(master), now);
    apply_term(now);
    if (!changed || engine_.mastership().is_master != is_master) return;
    ++metrics_.master_changes;
    if (!is_master) {
      log(fmt::format("not master; redirecting to {}",
                      engine_.mastership().master.value_or("(unknown)")));
      return;
    }
    double learning = 0;
    for (const auto& t : engine_.config().templates())
      learning = std::max(learning, t.algorithm.learning_mode_duration.count());
    log(learning > 0 ? fmt::format("became master; learning mode starts (up to {} s)", learning)
                     : std::string("became master; learning mode is off"));
  }

  // Fencing (docs/high-availability.md): the engine answers as master only inside the
  // election's term. A master whose term ended steps down at its next call; it takes
  // mastership back (learning mode again: it forgot its leases) once a renewal extends the
  // term while the election still names it.
  void apply_term(clock::time_point now) {
    if constexpr (requires { election_.valid_until(); }) {
      const auto until = election_.valid_until();
      engine_.set_valid_until(until);
      if (elected_ && !engine_.mastership().is_master && now < until) {
        engine_.set_mastership(true, options_.advertise, now);
        log("mastership confirmed again after the term ended; learning mode starts");
      }
    }
    fence(now);
  }

  // An answer through the gRPC door names the master's gRPC door (nothing when the master has
  // none or is unknown): Doorman's clients connect to the address they are given.
  template <class Result>
  void name_grpc_master(Result& result) const {
    if constexpr (requires { result.value().mastership; }) {
      if (!result) return;
      auto& m = result.value().mastership;
      if (m.is_master) {
        m.master =
            options_.advertise_grpc.empty() ? std::nullopt : std::optional(options_.advertise_grpc);
      } else {
        m.master = master_grpc_;
      }
    }
  }

  // Counts and logs every step-down at a term's end, the engine's own fences included.
  void fence(clock::time_point now) {
    engine_.fence(now);
    if (engine_.fenced() == fenced_seen_) return;
    fenced_seen_ = engine_.fenced();
    ++metrics_.fenced;
    ++metrics_.master_changes;
    log("warning: the election term ended before a renewal was confirmed (was the process "
        "paused?); stepping down before answering anything more");
  }

  // Requests that were not valid JSON-RPC (a broken or hostile peer): one line per 10 s.
  void note_refused(rpc_code code, const net::peer_info& peer, clock::time_point now) {
    if (code != rpc_code::parse_error && code != rpc_code::invalid_request) return;
    malformed_log_.log(
        options_.log,
        fmt::format("warning: a malformed request from {} ({}, {})", peer.address,
                    code == rpc_code::parse_error ? "not JSON" : "not a JSON-RPC request",
                    static_cast<int>(code)),
        now);
  }

  // The lines of one read: answered together (`handle_lines_to`), each timed from when the one
  // before it was answered, and each decided inside the term (fenced with the time it ended).
  std::size_t on_lines(std::span<const std::string_view> lines, const net::peer_info& peer,
                       std::string& out) {
    auto since = clock::now();
    apply_term(since);
    const auto done = [&](std::size_t, const dispatch_record& record) {
      const auto now = clock::now();
      metrics_.observe(record, std::chrono::duration<double>(now - since).count());
      if (record.error) note_refused(*record.error, peer, now);
      fence(now);
      since = now;
    };
    const auto start = since;
    std::size_t answers = 0;
    if (guarded()) {
      access_guard guard(access_, {peer.identity, peer.connection});
      answers = handle_lines_to(out, engine_, lines, start, identity_, &guard, done);
    } else {
      answers = handle_lines_to(out, engine_, lines, start, identity_, nullptr, done);
    }
    // A client asked for a resource the node had no state for, or gave back capacity the
    // parent is waiting for: that may make the next request to the parent due sooner.
    if (parent_) parent_->after_calls();
    return answers;
  }

  admin_snapshot base_snapshot(clock::time_point now) const {
    admin_snapshot s;
    s.identity = identity_;
    s.listen = local_;
    s.config_source = config_.source_name();
    s.mastership = engine_.mastership();
    s.started = started_at_ != clock::time_point{};
    s.uptime = s.started ? std::chrono::duration<double>(now - started_at_).count() : 0;
    s.connections_open = server_.connections();
    s.connections = server_.counts();
    s.has_parent = !options_.parents.empty();
    if (parent_) {
      s.parent_failures = parent_->failures();
      s.since_parent_success = parent_->since_success(now);
    }
    s.templates = engine_.config().templates();
    return s;
  }

  template <class F>
  void reload_part(const std::string& what, F f) {
    try {
      if (f()) log(fmt::format("{} reloaded", what));
    } catch (const std::exception& e) {
      log(fmt::format("error: {} rejected, keeping the old: {}", what, e.what()));
    }
  }

  template <class M>
  auto guarded_call(const typename M::request& request, const net::peer_info& peer,
                    clock::time_point now) {
    access_guard guard(access_, {peer.identity, peer.connection});
    return call_method<M>(engine_, request, now, {&identity_, &guard});
  }

  bool guarded() const noexcept {
    return access_.policy().has_value() || options_.max_client_ids > 0;
  }

  net::http_answer on_admin(const net::http_request& r, const net::peer_info& peer) {
    apply_term(clock::now());
    return route_admin(r, *this, [&](const std::string& path) {
      return access_.admin({peer.identity, peer.connection}, path);
    });
  }

  asio::any_io_executor strand_;  // a strand of the executor, or itself (`single_threaded`)
  node_options options_;
  engine_type engine_;
  access_control access_;  // before server_: a closing connection tells it
  net::server server_;
  std::shared_ptr<net::tls_context> tls_;
  Election election_;
  bool elected_ = false;                    // what the election last reported
  std::optional<std::string> master_grpc_;  // the master's gRPC door, when it announced one
  std::uint64_t fenced_seen_ = 0;           // engine_.fenced() already counted
  log_throttle<clock::time_point> malformed_log_{seconds(10)};
  node_identity identity_;
  node_metrics metrics_;
  basic_config_driver<engine_type> config_;
  std::optional<basic_parent_link<engine_type>> parent_;  // an intermediate's, once started
  std::string local_;
  std::string admin_local_;
  std::string failed_bind_;
  std::optional<net::http_server> admin_;
  clock::time_point started_at_{};
  bool stopping_ = false;
};

/// A node with the trivial election and Doorman's algorithms.
using node = basic_node<>;

}  // namespace doorman
