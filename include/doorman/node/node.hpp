#pragma once

/// \file
/// A server process's composition (docs/node.md): the engine, the JSON-RPC server, the upstream
/// loop of an intermediate (its parent's leases become its capacity), the election and config
/// reload. Everything of a node runs on one strand, so the engine is touched by one strand only.
///
///     asio::io_context io;
///     doorman::node root(io.get_executor(), config, {.listen = "127.0.0.1:7700"});
///     root.start();
///     io.run();  // until root.stop()
///
/// A node is embedded: it owns no thread and no signal handler; the `doorman-node` example adds
/// those. Destroy it after its io_context has stopped running.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
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
#include "doorman/net/channel.hpp"
#include "doorman/net/refresh_driver.hpp"
#include "doorman/net/server.hpp"
#include "doorman/net/supervise.hpp"
#include "doorman/node/election.hpp"
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
  /// The node's id in `status` and at its parent; default: the advertised address.
  std::string id;
  net::server_options server;
  /// `is_root` is set from `parents`.
  engine_options engine;
  /// `server_id` defaults to `id`; `decay_factor` follows `engine.decay_factor`.
  upstream_options upstream;
  /// Deadline of one request to the parent.
  seconds parent_timeout{5};
  /// Receives one line per notable event (start, config reload, parent lost and regained,
  /// mastership). Null: silent.
  std::function<void(std::string_view)> log{};
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

  /// Throws `std::invalid_argument` on a malformed address in the options.
  basic_node(asio::any_io_executor executor, resource_repository config, node_options options,
             Election election = {})
      : strand_(asio::make_strand(executor)),
        options_(prepare(std::move(options))),
        engine_(std::move(config), options_.engine),
        server_(
            strand_, options_.server, [this](std::string_view line) { return on_line(line); },
            options_.log),
        upstream_(options_.upstream),
        election_(std::move(election)) {
    if (!net::parse_address(options_.listen)) {
      throw std::invalid_argument("listen: expected host:port, got \"" + options_.listen + "\"");
    }
    if (!options_.parents.empty()) {
      net::channel_options ch;
      ch.addresses = options_.parents;
      ch.call_timeout = options_.parent_timeout;
      ch.log = options_.log;
      parent_.emplace(strand_, std::move(ch));
      driver_.emplace(strand_, upstream_side_, *parent_, "upstream loop", options_.log);
    }
  }

  basic_node(const basic_node&) = delete;
  basic_node& operator=(const basic_node&) = delete;

  /// Binds, then starts serving, the election and, for an intermediate, the upstream loop.
  /// Call before running the io_context, or on it. Throws `std::system_error` when it cannot
  /// bind (e.g. the port is in use), naming the address.
  void start() {
    std::error_code ec;
    start(ec);
    if (ec) throw std::system_error(ec, "listening on " + options_.listen);
  }

  /// As above; `ec` says why it could not bind, and then nothing is started.
  void start(std::error_code& ec) {
    server_.listen(*net::parse_address(options_.listen), ec);
    if (ec) return;
    const auto ep = server_.local_endpoint();
    local_ = net::address{ep.address().to_string(), std::to_string(ep.port())}.to_string();
    if (options_.advertise.empty()) options_.advertise = local_;
    identity_.id = options_.id.empty() ? options_.advertise : options_.id;
    identity_.role = options_.parents.empty() ? "root" : "intermediate";
    identity_.level = options_.parents.empty() ? 0 : 1;
    if (!options_.parents.empty()) identity_.parent = options_.parents[0];
    if (options_.upstream.server_id.empty()) {
      options_.upstream.server_id = identity_.id;
      upstream_ = basic_upstream<engine_type>(options_.upstream);
    }
    server_.start();
    log(fmt::format("{} {} listening on {}", identity_.role, identity_.id, local_));
    election_.start(options_.advertise, [this](bool is_master, std::optional<std::string> m) {
      asio::post(strand_, [this, is_master, m = std::move(m)]() mutable {
        if (stopping_) return;
        const bool changed = is_master != engine_.mastership().is_master;
        engine_.set_mastership(is_master, std::move(m), clock::now());
        if (changed) {
          log(is_master ? std::string("became master; learning mode starts")
                        : fmt::format("not master; redirecting to {}",
                                      engine_.mastership().master.value_or("(unknown)")));
        }
      });
    });
    if (driver_) driver_->async_run(asio::detached);
  }

  /// The address it listens on (after `start`), e.g. "127.0.0.1:40213".
  [[nodiscard]] const std::string& local_address() const noexcept { return local_; }

  /// Replaces the configuration, keeping every lease (thread-safe: posts to the strand).
  void reload(resource_repository config) {
    asio::post(strand_, [this, c = std::move(config)]() mutable {
      engine_.set_config(std::move(c));
      log(fmt::format("configuration reloaded: {} templates", engine_.config().templates().size()));
    });
  }

  /// Graceful stop (thread-safe): stops accepting and reading, writes the answers already
  /// computed, stops the upstream loop and the election. `io.run()` returns once done.
  void stop() {
    asio::post(strand_, [this] {
      if (stopping_) return;
      stopping_ = true;
      log("stopping");
      election_.stop();
      server_.stop();
      if (driver_) driver_->stop();
      if (parent_) parent_->shutdown();
    });
  }

  /// Runs `f(engine)` on the node's strand (for embedding code that wants to look inside).
  template <class F>
  void post(F f) {
    asio::post(strand_, [this, f = std::move(f)]() mutable { f(engine_); });
  }

  [[nodiscard]] const node_options& options() const noexcept { return options_; }
  [[nodiscard]] const net::server& server() const noexcept { return server_; }

 private:
  static node_options prepare(node_options o) {
    o.engine.is_root = o.parents.empty();
    o.upstream.decay_factor = o.engine.decay_factor;
    for (const auto& p : o.parents) {
      if (!net::parse_address(p)) {
        throw std::invalid_argument("parent: expected host:port, got \"" + p + "\"");
      }
    }
    if (!o.engine.log && o.log) o.engine.log = o.log;
    if (!o.upstream.log && o.log) o.upstream.log = o.log;
    return o;
  }

  void log(const std::string& s) const {
    if (options_.log) options_.log(s);
  }

  std::optional<std::string> on_line(std::string_view line) {
    auto reply = handle_line(engine_, line, clock::now(), identity_);
    // A client asked for a resource the node had no state for, or gave back capacity the
    // parent is waiting for: that may make the next request to the parent due sooner.
    if (driver_ && upstream_.next_request(engine_) < driver_->wakes_at()) driver_->reschedule();
    return reply;
  }

  // The node's side of its refresh driver: the upstream machine over the engine.
  struct upstream_requester {
    basic_node& node;

    refresh_step<clock::time_point> next(clock::time_point now) const {
      return node.upstream_.next(node.engine_, now);
    }

    net::outgoing_call request(clock::time_point now) const {
      auto r = node.upstream_.make_request(node.engine_, now);
      node.asked_ = r.resources.size();
      return {"get_server_capacity", nlohmann::json(r)};
    }

    asio::awaitable<void> on_reply(net::call_reply reply, clock::time_point now) const {
      co_await node.on_parent_reply(std::move(reply), now);
    }
  };

  asio::awaitable<void> on_parent_reply(net::call_reply reply, clock::time_point now) {
    server_capacity_response resp;
    net::decode_refresh(reply, resp);
    const refresh_event event =
        reply ? upstream_.on_reply(engine_, resp, now) : upstream_.on_reply(reply.error, now);
    switch (event) {
      case refresh_event::reached:
        log(fmt::format("parent {} reached: {} resources leased", parent_->current(), asked_));
        co_await learn_level();
        break;
      case refresh_event::lost:
        log(fmt::format("parent lost ({}); leases run out as they expire, retrying with backoff",
                        reply.message));
        break;
      case refresh_event::regained:
        log(fmt::format("parent {} regained", parent_->current()));
        break;
      case refresh_event::none:
        if (reply.error && upstream_.failures() == 1) {
          log(fmt::format("parent unreachable: {}", reply.message));  // never reached yet
        }
        break;
    }
  }

  // The deepest tree `status` reports a level for (a parent's level is checked against it).
  static constexpr int max_level = 1000;

  // The parent's level, for `status`.
  asio::awaitable<void> learn_level() {
    const auto reply = co_await parent_->call("status", nlohmann::json::object(), false);
    // A failed call leaves `result` null, where `find` finds nothing.
    if (const auto level = reply.result.find("level"); level != reply.result.end()) {
      // An integer below max_level; anything else is the parent's mistake, not a level.
      if (const auto v = as_int64(*level); v && *v >= 0 && *v < max_level) {
        identity_.level = static_cast<int>(*v) + 1;
      } else {
        log(fmt::format("parent {} reports level {}, not an integer from 0 to {}; ignored",
                        parent_->current(), to_line(*level), max_level - 1));
      }
    }
    identity_.parent = parent_->current();
  }

  asio::strand<asio::any_io_executor> strand_;
  node_options options_;
  engine_type engine_;
  net::server server_;
  basic_upstream<engine_type> upstream_;
  std::optional<net::channel> parent_;
  upstream_requester upstream_side_{*this};
  std::optional<net::refresh_driver<upstream_requester>> driver_;
  std::size_t asked_ = 0;  // resources in the last request to the parent
  Election election_;
  node_identity identity_;
  std::string local_;
  bool stopping_ = false;
};

/// A node with the trivial election and Doorman's algorithms.
using node = basic_node<>;

}  // namespace doorman
