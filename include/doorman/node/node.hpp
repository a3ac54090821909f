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
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <asio.hpp>

#include "doorman/core/engine.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/http_server.hpp"
#include "doorman/net/server.hpp"
#include "doorman/node/access.hpp"
#include "doorman/node/admin.hpp"
#include "doorman/node/budget_marks.hpp"
#include "doorman/node/config_driver.hpp"
#include "doorman/node/config_source.hpp"
#include "doorman/node/election.hpp"
#include "doorman/node/mastership.hpp"
#include "doorman/node/node_options.hpp"
#include "doorman/node/parent_link.hpp"
#include "doorman/node/status_page.hpp"
#include "doorman/protocol/codec.hpp"
#include "doorman/protocol/dispatch.hpp"

namespace doorman {

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
      : basic_node(std::move(executor), detail::initial_node_config(options), options,
                   std::move(election)) {}

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
    identity_ = detail::identity_of(options_);
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
    mastership_.set_own({options_.advertise, options_.advertise_grpc});
    keep_election_record();
    election_.start(mastership_.own().value(),
                    [this](bool is_master, std::optional<std::string> m) {
                      asio::post(strand_, [this, is_master, m = std::move(m)] {
                        if (!stopping_) mastership_.elected(is_master, m, clock::now());
                      });
                    });
    if (!options_.parents.empty()) start_parent_link();
    config_.start();
  }

  /// Sets the address announced for the node's gRPC door (`node_options::advertise_grpc`),
  /// for a door that learns its port only when it binds; before `start`.
  void advertise_grpc(std::string address) {
    options_.advertise_grpc = std::move(address);
    mastership_.set_own({options_.advertise, options_.advertise_grpc});
  }

  /// The address it listens on (after `start`), e.g. "127.0.0.1:40213".
  [[nodiscard]] const std::string& local_address() const noexcept { return local_; }

  /// The admin endpoint's address (after `start`; empty without one).
  [[nodiscard]] const std::string& admin_address() const noexcept { return admin_local_; }

  /// Replaces the configuration, keeping every lease (thread-safe: posts to the strand).
  void reload(resource_repository config) {
    asio::post(strand_,
               [this, c = std::move(config)]() mutable { config_.apply(std::move(c), {}); });
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
        access_.set_policy(detail::node_access_policy(options_));
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
      marks_.stop();
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
      mastership_.apply_term(start);
      auto result = under_guard(peer, [&](access_guard* guard) {
        return call_method<M>(engine_, request, start, {&identity_, guard});
      });
      dispatch_record record{M::id, {}, door};
      if (!result) record.error = result.code();
      (void)served(record, start, peer);
      after_calls();
      mastership_.name_master(result, door);
      done(std::move(result));
    });
  }

  /// Runs `f(engine)` on the node's strand (for embedding code that wants to look inside).
  template <class F>
  void post(F f) {
    asio::post(strand_, [this, f = std::move(f)]() mutable {
      mastership_.apply_term(clock::now());
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
      s.resources.push_back(
          {r, t.description, t.identifier_glob,
           lease ? std::optional<double>(lease->capacity) : std::nullopt,
           resource ? engine_.learned_history(r.resource_id, now) : std::vector<learned_point>{}});
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
  // An election that keeps a master's record (etcd's) covers the longest lease of the
  // configuration the node starts with; a later one with longer leases is refused, since the
  // record could end before them (docs/high-availability.md, "The first minute").
  void keep_election_record() {
    if constexpr (requires { election_.set_record_cover(seconds{}); }) {
      const double cover = longest_lease(engine_.config());
      election_.set_record_cover(seconds(cover));
      config_.set_check([cover](const resource_repository& c) -> std::optional<std::string> {
        const double longest = longest_lease(c);
        if (longest <= cover) return std::nullopt;
        return fmt::format(
            "lease_length: {} s is longer than the leases the election's record "
            "in etcd covers ({} s, the longest when the node started); restart "
            "the node to lengthen them",
            longest, cover);
      });
    }
  }

  basic_node(asio::any_io_executor executor, loaded_config config, node_options options,
             Election election)
      : strand_(options.single_threaded ? executor
                                        : asio::any_io_executor(asio::make_strand(executor))),
        options_(detail::prepare_node_options(std::move(options))),
        engine_(std::move(config.config), options_.engine),
        access_(detail::node_access_policy(options_), options_.max_client_ids,
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
        state_(options_.state_file.empty() ? nullptr
                                           : std::make_unique<state_file>(options_.state_file)),
        config_(strand_, engine_, options_.config, config.revision, metrics_, options_.log),
        marks_(strand_, engine_, options_.budget_marks, options_.log,
               options_.engine.is_root ? state_.get() : nullptr) {
    mastership_.use_state(state_.get());
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

  // Binds the JSON-RPC port, then the admin port; on failure neither stays bound, and
  // `failed_bind_` names the address.
  bool bind(std::error_code& ec) {
    failed_bind_ = options_.listen;
    server_.listen(*net::parse_address(options_.listen), ec);
    if (ec) return false;
    local_ = net::address_of(server_.local_endpoint());
    if (options_.advertise.empty()) options_.advertise = local_;
    if (admin_) {
      failed_bind_ = options_.admin;
      admin_->listen(*net::parse_address(options_.admin), ec);
      if (ec) {
        server_.stop();
        return false;
      }
      admin_local_ = net::address_of(admin_->local_endpoint());
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
        metrics_, identity_, [this] { mastership_.apply_term(clock::now()); });
    parent_->start();
  }

  // The lines of one read: answered together (`handle_lines_to`), each timed from when the one
  // before it was answered, and each decided inside the term (fenced with the time it ended).
  std::size_t on_lines(std::span<const std::string_view> lines, const net::peer_info& peer,
                       std::string& out) {
    const auto start = clock::now();
    mastership_.apply_term(start);
    auto since = start;
    const auto done = [&](std::size_t, const dispatch_record& record) {
      since = served(record, since, peer);
    };
    const std::size_t answers = under_guard(peer, [&](access_guard* guard) {
      return handle_lines_to(out, engine_, lines, start, identity_, guard, done);
    });
    after_calls();
    return answers;
  }

  // After a batch of calls: the next request to the parent may be due sooner (a resource the
  // node had no state for, capacity given back that the parent waits for), or a budget's mark
  // may be due to be read or raised.
  void after_calls() {
    if (parent_) parent_->after_calls();
    marks_.after_calls();
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

  // `f(guard)` with the caller's access guard, or with null when no call is guarded.
  template <class F>
  auto under_guard(const net::peer_info& peer, F f) {
    if (!access_.policy() && options_.max_client_ids == 0) return f(nullptr);
    access_guard guard(access_, {peer.identity, peer.connection});
    return f(&guard);
  }

  // After every call, whatever its door: its metrics (timed from `since`), a request that was
  // not valid JSON-RPC logged, the term's end applied. Returns when it was answered.
  clock::time_point served(const dispatch_record& record, clock::time_point since,
                           const net::peer_info& peer) {
    const auto now = clock::now();
    metrics_.observe(record, std::chrono::duration<double>(now - since).count());
    if (const auto e = record.error; e == rpc_code::parse_error || e == rpc_code::invalid_request) {
      malformed_log_.log(
          options_.log,  // a broken or hostile peer: one line per 10 s
          fmt::format("warning: a malformed request from {} ({}, {})", peer.address,
                      e == rpc_code::parse_error ? "not JSON" : "not a JSON-RPC request",
                      static_cast<int>(*e)),
          now);
    }
    mastership_.fence(now);
    return now;
  }

  net::http_answer on_admin(const net::http_request& r, const net::peer_info& peer) {
    mastership_.apply_term(clock::now());
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
  log_throttle<clock::time_point> malformed_log_{seconds(10)};
  node_identity identity_;
  node_metrics metrics_;
  std::unique_ptr<state_file> state_;  // `node_options::state_file`, read when made
  node_mastership<engine_type, Election> mastership_{engine_, election_, metrics_, options_.log};
  basic_config_driver<engine_type> config_;
  basic_budget_keeper<engine_type> marks_;
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
