#pragma once

/// \file
/// Where a node's configuration comes from, followed: a file read again when asked (SIGHUP),
/// or an etcd key polled by the sans-I/O `config_follower` (core/config_follower.hpp), which
/// `follow_source` (node/source_follower.hpp) drives, as it drives the files' follower. A
/// configuration that fails validation is logged and the old one kept. It runs on the node's
/// strand.
///
///     basic_config_driver<engine_type> config(strand, engine, options, revision, metrics, log);
///     config.start();   // an etcd key: polls until stopped
///     config.reload();  // a file: read now; an etcd key: polled now
///     config.stop();

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <asio.hpp>

#include "doorman/core/config_follower.hpp"
#include "doorman/net/etcd.hpp"
#include "doorman/net/supervise.hpp"
#include "doorman/node/admin.hpp"
#include "doorman/node/config_source.hpp"
#include "doorman/node/source_follower.hpp"

namespace doorman {

template <class Engine>
class basic_config_driver {
 public:
  using clock = follow_clock;

  /// Follows `options.source` into `target` (an engine), on `strand`. `revision` is the etcd
  /// revision of the configuration already loaded (0: none); reloads are counted in `metrics`.
  basic_config_driver(const asio::any_io_executor& strand, Engine& target, config_options options,
                      std::int64_t revision, node_metrics& metrics,
                      std::function<void(std::string_view)> log)
      : strand_(strand),
        engine_(target),
        options_(std::move(options)),
        location_(config_location::parse(options_.source)),
        revision_(revision),
        metrics_(metrics),
        log_(std::move(log)),
        wake_(strand) {}

  basic_config_driver(const basic_config_driver&) = delete;
  basic_config_driver& operator=(const basic_config_driver&) = delete;

  /// Where the configuration comes from, as the status page names it ("" when given in code).
  [[nodiscard]] std::string source_name() const { return location_.name(); }

  /// For an etcd key: starts polling it (until `stop`).
  void start() {
    if (location_.type != config_location::kind::etcd) return;
    etcd_.emplace(strand_, options_.etcd_endpoints, options_.etcd_tls);
    follower_.emplace(location_.name(), options_.poll_interval, revision_, clock::now());
    asio::co_spawn(strand_,
                   net::supervised(
                       "etcd configuration poll", [this] { return follow_etcd(); },
                       [this] { return stopping_; }, log_),
                   asio::detached);
  }

  /// Reads the source again (on the strand): a file now, an etcd key at its next poll, now.
  void reload() {
    switch (location_.type) {
      case config_location::kind::none:
        log("warning: no configuration source to reload");
        return;
      case config_location::kind::etcd:
        if (follower_) follower_->wake(clock::now());
        wake_.cancel();
        return;
      case config_location::kind::file:
        break;
    }
    try {
      apply(read_config_file(options_, location_.where), location_.where);
    } catch (const std::exception& e) {
      metrics_.count_reload(false);
      log(fmt::format("warning: configuration {} rejected, keeping the old one: {}",
                      location_.where, e.what()));
    }
  }

  /// A check of every configuration before it is applied (after the node's start): what is
  /// wrong with it, or nothing. One refused is logged and the old one kept.
  void set_check(std::function<std::optional<std::string>(const resource_repository&)> check) {
    check_ = std::move(check);
  }

  /// Applies `config`, read from `from` (empty: given by the embedding program), counted and
  /// logged; unless the check refuses it (logged, the old one kept).
  void apply(resource_repository config, std::string_view from) {
    if (auto why = check_ ? check_(config) : std::nullopt) {
      metrics_.count_reload(false);
      log(fmt::format("warning: configuration{}{} rejected, keeping the old one: {}",
                      from.empty() ? "" : " ", from, *why));
      return;
    }
    engine_.set_config(std::move(config));
    metrics_.count_reload(true);
    const auto n = engine_.config().templates().size();
    log(fmt::format("configuration reloaded{}{}: {} template{}", from.empty() ? "" : " from ", from,
                    n, n == 1 ? "" : "s"));
  }

  /// Re-reads the etcd client's certificates; whether there were any to read.
  bool reload_tls() {
    if (!etcd_) return false;
    etcd_->reload_tls();
    return options_.etcd_tls.active();
  }

  /// Stops polling.
  void stop() {
    stopping_ = true;
    wake_.cancel();
  }

 private:
  void log(const std::string& s) const {
    if (log_) log_(s);
  }

  // The follower over the etcd key: one read is one GET; what it holds is applied when the
  // follower says so. `reload()` wakes it.
  asio::awaitable<void> follow_etcd() {
    return follow_source(
        *follower_, wake_, [this] { return stopping_; },
        [this]() -> asio::awaitable<source_reading> {
          const auto got = co_await etcd_->get(
              location_.where,
              clock::now() + to_duration<clock::duration>(options_.etcd_timeout.count()));
          source_reading r;
          if (!got) {
            r.error = got.message;
          } else if (got.value) {  // else: the key is gone
            r.version = got.value->mod_revision;
            r.text = got.value->value;
          }
          co_return r;
        },
        [this](const source_reading& r) -> std::optional<std::string> {
          std::optional<std::string> rejected;
          try {
            auto config = parse_config_text(options_, r.text, location_.name());
            rejected = check_ ? check_(config) : std::nullopt;
            if (!rejected) engine_.set_config(std::move(config));
          } catch (const std::exception& e) {
            rejected = e.what();
          }
          metrics_.count_reload(!rejected);
          return rejected;
        },
        log_);
  }

  asio::any_io_executor strand_;
  Engine& engine_;
  config_options options_;
  config_location location_;
  std::int64_t revision_;  // of the configuration read at the start
  node_metrics& metrics_;
  std::function<void(std::string_view)> log_;
  std::function<std::optional<std::string>(const resource_repository&)> check_;
  asio::steady_timer wake_;
  std::optional<net::etcd_client> etcd_;
  std::optional<config_follower<follow_clock::time_point>> follower_;
  bool stopping_ = false;
};

}  // namespace doorman
