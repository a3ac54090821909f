#pragma once

/// \file
/// An intermediate node's link to its parent position: the upstream machine
/// (core/upstream.hpp) over the node's engine, sent through a channel by the refresh driver
/// (net/refresh_driver.hpp). The parent's leases become the engine's capacity; the link counts
/// its calls in the node's metrics, learns its level in the tree and logs what changes. It runs
/// on the node's strand.
///
///     basic_parent_link<engine_type> link(strand, engine, options, metrics, identity, on_answer);
///     link.start();         // refreshes until stopped
///     link.after_calls();   // client calls may have made the next request due sooner
///     link.stop();

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>

#include "doorman/core/upstream.hpp"
#include "doorman/net/channel.hpp"
#include "doorman/net/refresh_driver.hpp"
#include "doorman/node/admin.hpp"
#include "doorman/protocol/codec.hpp"

namespace doorman {

/// Options of a parent link, with their defaults.
struct parent_link_options {
  std::vector<std::string> parents;  ///< the parent position's addresses
  seconds timeout{5};                ///< deadline of one request to the parent
  net::tls_options tls{};            ///< TLS of the link (a certificate identifies this node)
  upstream_options upstream{};       ///< `server_id` is this node's id at the parent
  std::function<void(std::string_view)> log{};
  /// Makes the link's channel from the options above; null: doorman's JSON-RPC
  /// (`net::channel`). The compiled gRPC layer makes one that speaks Doorman's protocol.
  std::function<std::unique_ptr<net::call_channel>(asio::any_io_executor, net::channel_options)>
      channel{};
};

template <class Engine>
class basic_parent_link {
 public:
  using clock = std::chrono::steady_clock;

  /// A link on `strand` (the node's) feeding `target` (the node's engine). It counts its calls in
  /// `metrics` and sets `identity`'s level and parent; `on_answer()` runs before each answer from
  /// the parent reaches the engine (the node applies its election term there).
  basic_parent_link(const asio::any_io_executor& strand, Engine& target,
                    parent_link_options options, node_metrics& metrics, node_identity& identity,
                    std::function<void()> on_answer)
      : engine_(target),
        options_(std::move(options)),
        metrics_(metrics),
        identity_(identity),
        on_answer_(std::move(on_answer)),
        upstream_(options_.upstream),
        channel_(make_channel(strand, options_)),
        driver_(strand, requester_, *channel_, "upstream loop", options_.log) {}

  basic_parent_link(const basic_parent_link&) = delete;
  basic_parent_link& operator=(const basic_parent_link&) = delete;

  /// Refreshes until `stop()`.
  void start() { driver_.async_run(asio::detached); }

  /// Stops refreshing and fails the call in flight.
  void stop() {
    driver_.stop();
    channel_->shutdown();
  }

  /// Re-reads the link's certificates (new connections use them).
  void reload_tls() { channel_->reload_tls(); }

  /// Client calls were answered: a resource the node had no state for, or capacity given back
  /// that the parent waits for, may make the next request due sooner.
  void after_calls() {
    if (upstream_.next_request(engine_) < driver_.wakes_at()) driver_.reschedule();
  }

  /// Failed requests in a row.
  [[nodiscard]] int failures() const noexcept { return upstream_.failures(); }

  /// Seconds since the parent last answered; none if it never did.
  [[nodiscard]] std::optional<double> since_success(clock::time_point now) const {
    if (!success_) return std::nullopt;
    return std::chrono::duration<double>(now - *success_).count();
  }

 private:
  static std::unique_ptr<net::call_channel> make_channel(const asio::any_io_executor& strand,
                                                         const parent_link_options& o) {
    net::channel_options c{
        .addresses = o.parents, .call_timeout = o.timeout, .log = o.log, .tls = o.tls};
    if (o.channel) return o.channel(strand, std::move(c));
    return std::make_unique<net::channel>(strand, std::move(c));
  }

  void log(const std::string& s) const {
    if (options_.log) options_.log(s);
  }

  using refresh_reply = net::reply_of<methods::get_server_capacity>;

  // The link's side of its refresh driver: the upstream machine over the engine.
  struct requester {
    basic_parent_link& link;

    refresh_step<clock::time_point> next(clock::time_point now) const {
      return link.upstream_.next(link.engine_, now);
    }

    net::outgoing_call<methods::get_server_capacity> request(clock::time_point now) const {
      const seconds timeout = link.upstream_.call_timeout(now, link.options_.timeout);
      auto r = link.upstream_.make_request(link.engine_, now);
      link.asked_ = r.resources.size();
      return {std::move(r), timeout};
    }

    asio::awaitable<void> on_reply(refresh_reply reply, clock::time_point now) const {
      co_await link.on_reply(std::move(reply), now);
    }
  };

  asio::awaitable<void> on_reply(refresh_reply reply, clock::time_point now) {
    if (on_answer_) on_answer_();  // the engine decides with the term as it is now
    net::require_master(reply);
    const refresh_event event = reply ? upstream_.on_reply(engine_, reply.result, now)
                                      : upstream_.on_reply(reply.error, now);
    if (reply) {
      ++metrics_.parent_requests_ok;
      success_ = now;
    } else {
      ++metrics_.parent_requests_failed;
    }
    if (event == refresh_event::reached) {
      log(fmt::format("parent {} reached: {} resources leased", channel_->current(), asked_));
      co_await learn_level();
    } else {
      log_event(event, reply);
    }
  }

  void log_event(refresh_event event, const net::call_status& reply) const {
    if (event == refresh_event::lost) {
      log(fmt::format(
          "warning: parent lost ({}); leases run out as they expire, retrying with backoff",
          reply.message));
    } else if (event == refresh_event::regained) {
      log(fmt::format("parent {} regained", channel_->current()));
    } else if (reply.error && upstream_.failures() == 1) {
      log(fmt::format("warning: parent unreachable: {}", reply.message));  // never reached yet
    }
  }

  // The parent's level, for `status`.
  asio::awaitable<void> learn_level() {
    // Named, not braced inside co_await (GCC 12 destroys such a temporary twice).
    status_params all{};
    net::call_options here{.follow_redirects = false, .timeout = std::nullopt};
    const auto reply =
        co_await channel_->template call<methods::status>(std::move(all), std::move(here));
    if (reply) {
      identity_.level = reply.result.identity.level + 1;
    } else if (reply.error == errc::bad_answer) {  // a level out of range among them
      log(fmt::format("warning: parent {} answers status wrongly ({}); its level ignored",
                      channel_->current(), reply.message));
    }
    identity_.parent = channel_->current();
  }

  Engine& engine_;
  parent_link_options options_;
  node_metrics& metrics_;
  node_identity& identity_;
  std::function<void()> on_answer_;
  basic_upstream<Engine> upstream_;
  std::unique_ptr<net::call_channel> channel_;
  requester requester_{*this};
  net::refresh_driver<requester> driver_;
  std::size_t asked_ = 0;  // resources in the last request to the parent
  std::optional<clock::time_point> success_;
};

}  // namespace doorman
