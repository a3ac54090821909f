#pragma once

/// \file
/// Following a configuration that changes at its source (sans-I/O): when to read it next, and
/// what each read means. The node drives it for an `etcd:KEY` configuration; a new source (a
/// file watched for changes, another store) is a new driver of the same machine.
///
///     doorman::config_follower<time_point> f("etcd:/doorman/config", seconds(1), revision);
///     timer.expires_at(f.next_read());                 // then read the source
///     auto step = f.read(now, version_read);           // or f.failed(now, why)
///     if (step.apply) f.applied(now, try_to_apply(text));
///     for (auto& line : f.take_log()) log(line);
///
/// The rules, in one place:
/// - the source is read every `poll_interval`, and at once when asked (`wake`);
/// - a version already seen (applied or rejected) is not applied again, so a rejected
///   configuration is reported once, not at every read, and the old one stays;
/// - a source that cannot be read keeps the current configuration; the first failure in a row
///   is logged, and so is the first read after failures;
/// - a source that disappears (an etcd key deleted) keeps the current configuration, logged
///   once; when it comes back, its version is applied, even if it was seen before.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "doorman/core/time.hpp"

namespace doorman {

/// What a read of the source tells the driver to do.
struct config_read_step {
  bool apply = false;  ///< parse the text read and apply it, then call `applied`
};

/// The follower of one configuration source. `TimePoint` is the driver's clock's; it never
/// reads a clock.
template <class TimePoint>
class config_follower {
 public:
  using time_point = TimePoint;

  /// `name` as the operator wrote it (`etcd:KEY`); `current` the version of the configuration
  /// in use (an etcd mod_revision; 0 for none known).
  config_follower(std::string name, seconds poll_interval, std::int64_t current,
                  time_point now = time_point{})
      : name_(std::move(name)),
        poll_interval_(to_duration<typename time_point::duration>(poll_interval.count())),
        version_(current),
        next_read_(now + poll_interval_) {}

  /// When the driver should read the source next.
  [[nodiscard]] time_point next_read() const noexcept { return next_read_; }

  /// Whether the last read failed.
  [[nodiscard]] bool failing() const noexcept { return failing_; }

  /// Read at once (a reload asked for).
  void wake(time_point now) noexcept { next_read_ = now; }

  /// A read failed (`why`, in words): keep the configuration, read again after the interval.
  void failed(time_point now, std::string_view why) {
    if (!failing_) {
      log_.push_back(
          fmt::format("warning: configuration {}: cannot read ({}); keeping the "
                      "current one",
                      name_, why));
    }
    failing_ = true;
    next_read_ = now + poll_interval_;
  }

  /// A read succeeded: the source holds version `found` (nothing: it is gone). Says whether to
  /// apply what was read.
  config_read_step read(time_point now, std::optional<std::int64_t> found) {
    next_read_ = now + poll_interval_;
    if (failing_) log_.push_back(fmt::format("configuration {}: readable again", name_));
    failing_ = false;
    if (!found) {
      if (version_ != -1) {
        log_.push_back(
            fmt::format("warning: configuration {} deleted; keeping the current one", name_));
      }
      version_ = -1;
      return {};
    }
    if (*found == version_) return {};
    version_ = *found;
    return {.apply = true};
  }

  /// What applying the version read gave: nothing (accepted), or why it was rejected (the old
  /// configuration stays). Returns whether it was accepted, for the driver's counters.
  bool applied(std::optional<std::string_view> rejected) {
    if (rejected) {
      log_.push_back(
          fmt::format("warning: configuration {} revision {} rejected, keeping the "
                      "old one: {}",
                      name_, version_, *rejected));
      return false;
    }
    log_.push_back(fmt::format("configuration {} revision {} accepted", name_, version_));
    return true;
  }

  /// The log lines since the last call, oldest first.
  [[nodiscard]] std::vector<std::string> take_log() { return std::exchange(log_, {}); }

 private:
  std::string name_;
  typename time_point::duration poll_interval_;
  std::int64_t version_;
  time_point next_read_;
  bool failing_ = false;
  std::vector<std::string> log_;
};

}  // namespace doorman
