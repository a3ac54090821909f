#pragma once

/// \file
/// Following a configuration that changes at its source (sans-I/O): when to read it next, and
/// what each read means. One machine for every source: an `etcd:KEY` (its version is the key's
/// mod_revision), the files a node reads and a directory of rule files (their version is a
/// digest of the files' stamps, node/file_watch.hpp); `follow_source` (node/source_follower.hpp)
/// drives it over any of them.
///
///     doorman::config_follower<time_point> f("etcd:/doorman/config", seconds(1), revision);
///     timer.expires_at(f.next_read());                 // then read the source
///     auto step = f.read(now, version_read);           // or f.failed(now, why)
///     if (step.apply) f.applied(now, try_to_apply(text));
///     for (auto& line : f.take_log()) log(line);
///
/// The rules, in one place:
/// - the source is read every `poll_interval` (0: only when asked), and at once when asked
///   (`wake`); `reread` also forgets the version seen, so that the next read applies (SIGHUP);
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
  /// in use (an etcd mod_revision; 0 for none known). `name_versions` false: what is applied
  /// is reported by the applier (a version that is a digest of file stamps means nothing to a
  /// reader), so `applied` says nothing.
  config_follower(std::string name, seconds poll_interval, std::int64_t current,
                  time_point now = time_point{}, bool name_versions = true)
      : name_(std::move(name)),
        poll_interval_(to_duration<typename time_point::duration>(poll_interval.count())),
        version_(current),
        name_versions_(name_versions),
        next_read_(after(now)) {}

  /// When the driver should read the source next.
  [[nodiscard]] time_point next_read() const noexcept { return next_read_; }

  /// Whether the last read failed.
  [[nodiscard]] bool failing() const noexcept { return failing_; }

  /// Read at once (a reload asked for).
  void wake(time_point now) noexcept { next_read_ = now; }

  /// Read at once, and apply what is read even if its version was seen (a reload asked of a
  /// source whose every change is not seen by its version).
  void reread(time_point now) noexcept {
    next_read_ = now;
    forget_ = true;
    asked_ = true;
  }

  /// A read failed (`why`, in words): keep the configuration, read again after the interval.
  /// A reread asked and failed is said every time (the operator asked).
  void failed(time_point now, std::string_view why) {
    const bool said = failing_ && !asked_;  // once in a row, and at every reread asked
    failing_ = true;
    asked_ = false;
    if (!said) {
      log_.push_back(
          fmt::format("warning: configuration {}: cannot read ({}); keeping the "
                      "current one",
                      name_, why));
    }
    next_read_ = after(now);
  }

  /// A read succeeded: the source holds version `found` (nothing: it is gone). Says whether to
  /// apply what was read.
  config_read_step read(time_point now, std::optional<std::int64_t> found) {
    next_read_ = after(now);
    const bool again = std::exchange(forget_, false);
    asked_ = false;
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
    if (*found == version_ && !again) return {};
    version_ = *found;
    return {.apply = true};
  }

  /// What applying the version read gave: nothing (accepted), or why it was rejected (the old
  /// configuration stays). Returns whether it was accepted, for the driver's counters.
  bool applied(std::optional<std::string_view> rejected) {
    if (!name_versions_) return !rejected;
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
  [[nodiscard]] time_point after(time_point now) const noexcept {
    return poll_interval_.count() > 0 ? now + poll_interval_ : time_point::max();
  }

  std::string name_;
  typename time_point::duration poll_interval_;
  std::int64_t version_;
  bool name_versions_;
  time_point next_read_;
  bool failing_ = false;
  bool forget_ = false;  // apply the next version read, even one seen
  bool asked_ = false;   // a reread asked: a failure is said even in a row
  std::vector<std::string> log_;
};

}  // namespace doorman
