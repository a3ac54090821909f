#pragma once

/// \file
/// Following a changing source on an executor: one loop drives the sans-I/O `config_follower`
/// (core/config_follower.hpp) over any source. `config_driver` runs it over an etcd key; a
/// `file_follower` runs it over the files a node reads (its configuration, TLS and access
/// files) or over a directory of rule files (doorman-rls), whose version is a digest of their
/// stamps (node/file_watch.hpp). When to read, what a read means, what is said once and what
/// is applied are the follower's; the loop only reads, applies and logs.
///
///     doorman::file_follower files(executor, "files", doorman::file_watch(paths), seconds(1),
///                                  [&](const auto& changed) { return reload(); }, log);
///     files.start();
///     files.reread();  // SIGHUP: read and apply now
///     files.stop();

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <asio.hpp>

#include "doorman/core/config_follower.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/supervise.hpp"
#include "doorman/node/file_watch.hpp"

namespace doorman {

/// What one read of a followed source found.
struct source_reading {
  std::optional<std::string> error;     ///< it could not be read: why (nothing else is set)
  std::optional<std::int64_t> version;  ///< nothing: the source is gone (an etcd key deleted)
  std::string text;                     ///< what was read, for the applier (an etcd value)
  std::vector<std::string> changed;     ///< the files that changed, for the log line
};

/// The follower's clock.
using follow_clock = std::chrono::steady_clock;

/// Drives `f` until `stopping()`: sleeps on `wake` until the follower's next read (cancel
/// `wake` after `f.wake` or `f.reread` to read at once), reads with `read()` (an awaitable
/// `source_reading`), calls `apply(reading)` (what was wrong with it, or nothing) when the
/// follower says so, and logs the follower's lines.
template <class Stopping, class Read, class Apply>
asio::awaitable<void> follow_source(config_follower<follow_clock::time_point>& f,
                                    asio::steady_timer& wake, Stopping stopping, Read read,
                                    Apply apply, std::function<void(std::string_view)> log) {
  while (!stopping()) {
    wake.expires_at(f.next_read());
    co_await net::wait_on(wake);
    if (stopping()) break;
    if (follow_clock::now() < f.next_read()) continue;
    const source_reading got = co_await read();
    if (got.error) {
      f.failed(follow_clock::now(), *got.error);
    } else if (f.read(follow_clock::now(), got.version).apply) {
      (void)f.applied(apply(got));
    }
    for (const auto& line : f.take_log())
      if (log) log(line);
  }
}

/// Follows a set of files (`file_watch`): every `interval` (0: only when `reread`) their
/// stamps are looked at; when they changed, `"<paths> changed: reloading"` is logged and
/// `apply(changed)` runs (it reports what it applied, or what was wrong, itself). A file that
/// cannot be reached keeps what is applied, said once until it is back. Runs on `executor`
/// (one thread, or a strand); `reread` and `stop` may be called from anywhere.
class file_follower {
 public:
  using apply_type = std::function<void(const std::vector<std::string>& changed)>;

  file_follower(asio::any_io_executor executor, std::string name, file_watch watch,
                seconds interval, apply_type apply, std::function<void(std::string_view)> log)
      : executor_(std::move(executor)),
        watch_(std::move(watch)),
        follower_(std::move(name), interval, watch_.version(), follow_clock::now(), false),
        apply_(std::move(apply)),
        log_(std::move(log)),
        wake_(executor_) {}

  file_follower(const file_follower&) = delete;
  file_follower& operator=(const file_follower&) = delete;

  /// Starts following (until `stop`).
  void start() {
    asio::co_spawn(
        executor_,
        net::supervised(
            "file follower", [this] { return run(); }, [this] { return stopping_; }, log_),
        asio::detached);
  }

  /// Reads the files now, and applies them even if they did not change (SIGHUP).
  void reread() {
    asio::post(executor_, [this] {
      follower_.reread(follow_clock::now());
      wake_.cancel();
    });
  }

  /// Stops following.
  void stop() {
    asio::post(executor_, [this] {
      stopping_ = true;
      wake_.cancel();
    });
  }

 private:
  asio::awaitable<void> run() {
    return follow_source(
        follower_, wake_, [this] { return stopping_; },
        [this]() -> asio::awaitable<source_reading> {
          auto look = watch_.look();
          source_reading r;
          if (look.unreachable) {
            r.error = std::move(look.unreachable);
          } else {
            r.version = look.version;
            r.changed = std::move(look.changed);
          }
          co_return r;
        },
        [this](const source_reading& r) -> std::optional<std::string> {
          if (!r.changed.empty() && log_)
            log_(fmt::format("{} changed: reloading", fmt::join(r.changed, ", ")));
          apply_(r.changed);
          return std::nullopt;
        },
        log_);
  }

  asio::any_io_executor executor_;
  file_watch watch_;
  config_follower<follow_clock::time_point> follower_;
  apply_type apply_;
  std::function<void(std::string_view)> log_;
  asio::steady_timer wake_;
  bool stopping_ = false;
};

}  // namespace doorman
