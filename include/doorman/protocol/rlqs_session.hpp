#pragma once

/// \file
/// One stream of Envoy's rate limit quota service (RLQS, docs/envoy.md) as a sans-I/O machine:
/// the stream is a client of the engine, each of its buckets a resource. Usage reports become
/// the measured wants of their buckets; the engine's leases become quota assignments, pushed
/// when they change or before Envoy's copy runs out; a bucket not reported for
/// `abandon_after` is released and abandoned; the stream's end releases everything. The gRPC
/// door (src/grpc/rlqs_door.cpp) only moves messages and time:
///
///     doorman::rlqs::session s("rlqs/10.0.0.7/1", {});
///     if (auto ok = s.report(reports, now); !ok) finish(ok.error());  // names the field
///     if (auto ask = s.ask(now)) node.call(*ask, [&](auto answer) {
///       for (auto& action : s.answer(answer, now)) write(action);
///     });
///     // wake at s.next_wake(), call s.expire(now): abandoned buckets, and what to release
///
/// A bucket's resource id is its domain and its key-value pairs, sorted by key:
/// `envoy/name=api/tier=free`; the node's resource templates (a glob on that id) give its
/// capacity and algorithm. Its wants are its requests a second (allowed and denied) over the
/// last report; what it has is the lease behind its assignment on this stream, nothing before.
/// Envoy reports a new bucket at once, with no time elapsed: that makes the bucket known, and
/// it is asked for at its first report with a time (Envoy applies its `no_assignment_behavior`
/// until then). Quotas are token buckets (`quota`), the strategy Envoy enforces.
///
/// After a master change Envoy opens a new stream, still holding its old assignment, which the
/// new master does not know of and which stays valid until it runs out (within a lease
/// length). The new master grants nothing in its learning mode (a lease length), so a bucket's
/// first assignment of 0 is held back for a lease length: Envoy keeps its old assignment
/// meanwhile, and no assignment replaces it with nothing. Claiming the old rate instead would
/// be taken at its word by an intermediate without capacity yet.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "doorman/core/error.hpp"
#include "doorman/core/limits.hpp"
#include "doorman/core/messages.hpp"

namespace doorman::rlqs {

/// A bucket's id: its key-value pairs (on the wire a map; here sorted by key).
using bucket_id = std::vector<std::pair<std::string, std::string>>;

/// One bucket's usage since its last report.
struct bucket_usage {
  bucket_id bucket;
  double elapsed = 0;  ///< seconds since its last report (`time_elapsed`; Envoy: whole seconds)
  std::uint64_t allowed = 0;
  std::uint64_t denied = 0;
};

/// One message of the stream (`RateLimitQuotaUsageReports`).
struct usage_reports {
  std::string domain;  ///< required in the first; later ones empty or the same
  std::vector<bucket_usage> usages;
};

/// A quota as Envoy enforces it. Its filter implements two strategies, blanket rules and token
/// buckets (it ignores `requests_per_time_unit`), so a quota is a token bucket that gains
/// `per_minute` tokens a minute (`fill_interval` 60 s, always the same: Envoy keeps a bucket it
/// already has only when the new one is equal, and it compares `fill_interval` by its nanos)
/// and holds at most `burst`, a second's worth. It starts full: Envoy makes a new one whenever a
/// quota changes. `per_minute` 0 is `DENY_ALL`. Rounded down, so that the stream's quotas never
/// add up to more than its leases.
struct quota {
  std::uint32_t per_minute = 0;
  std::uint32_t burst = 0;
  friend bool operator==(const quota&, const quota&) = default;
  [[nodiscard]] double rate() const noexcept { return per_minute / 60.0; }
};

/// The token bucket's `fill_interval`, in seconds.
inline constexpr std::uint32_t fill_seconds = 60;

/// The quota of `rate` requests a second: `DENY_ALL` below one a minute, at most 2^32 - 1 a
/// minute.
[[nodiscard]] inline quota quota_of(double rate) noexcept {
  if (!(rate > 0)) return {};
  const double per_minute = std::floor(std::min(rate * fill_seconds, 4294967295.0));
  if (per_minute < 1) return {};
  return {static_cast<std::uint32_t>(per_minute),
          static_cast<std::uint32_t>(std::max(1.0, std::floor(per_minute / fill_seconds)))};
}

/// What to tell Envoy of one bucket: a quota for `ttl` whole seconds (Envoy reads only the
/// seconds of `assignment_time_to_live`), or (none) abandon it.
struct bucket_action {
  bucket_id bucket;
  std::optional<quota> assign;
  std::int64_t ttl = 0;
};

struct session_options {
  std::size_t max_buckets = 1'000;  ///< buckets on one stream
  std::size_t max_usages = 1'000;   ///< usages in one message
  std::size_t max_pairs = 32;       ///< key-value pairs in one bucket id
  double abandon_after = 60;        ///< seconds a bucket may go unreported
  double retry = 1;                 ///< seconds before asking again after a failed ask
};

/// One stream's buckets (see the file's comment). Times are seconds on one steady clock.
class session {
 public:
  session(std::string client_id, session_options o) : client_id_(std::move(client_id)), o_(o) {}

  [[nodiscard]] const std::string& client_id() const noexcept { return client_id_; }
  [[nodiscard]] const std::string& domain() const noexcept { return domain_; }
  [[nodiscard]] std::size_t buckets() const noexcept { return buckets_.size(); }

  /// Takes one message: all of it, or (an error naming the field) none of it.
  result<bool> report(const usage_reports& r, double now) {
    auto ready = prepare(r);
    if (!ready) return ready.error();
    if (domain_.empty()) domain_ = r.domain;
    for (std::size_t i = 0; i < r.usages.size(); ++i) {
      const auto& u = r.usages[i];
      auto& [id, res] = ready.value()[i];
      auto [it, fresh] = buckets_.try_emplace(std::move(res));
      bucket& b = it->second;
      if (fresh) b.id = std::move(id), b.first = now;
      const double elapsed = fresh ? u.elapsed : elapsed_since(b.reported, u.elapsed, now);
      b.reported = now;
      if (!(elapsed > 0)) continue;  // no rate yet (a new bucket's first report says 0)
      b.wants = std::min(static_cast<double>(u.allowed + u.denied) / elapsed,
                         request_limits::max_quantity);
      if (!b.measured) b.measured = true, b.ask_at = now;
    }
    return true;
  }

  /// The engine call due at `now`, if any: every bucket that is new or whose refresh is due,
  /// each then waiting for `answer` or `failed`.
  std::optional<capacity_request> ask(double now) {
    if (asking_) return std::nullopt;
    // Envoy says what it allowed, not what a budget's window spent: a budget bucket gets 0.
    capacity_request out{client_id_, {}, false};
    for (auto& [res, b] : buckets_) {
      if (b.ask_at > now) continue;
      resource_request r{res, 0, b.wants, std::nullopt};
      if (b.lease_until > now) r.has = lease_info{b.capacity, b.lease_until - now, b.refresh};
      out.resources.push_back(std::move(r));
    }
    if (out.resources.empty()) return std::nullopt;
    asking_ = true;
    return out;
  }

  /// The engine's answer to the last `ask`: the assignments to push (a changed quota, or one
  /// whose copy at Envoy is half gone; a first one of 0 only once the bucket is a lease length
  /// old). Not master (no grants): an error, the stream ends.
  result<std::vector<bucket_action>> answer(const capacity_response& a, double now) {
    asking_ = false;
    if (!a.mastership.is_master) {
      return request_error{errc::invalid_params, "not master", ""};
    }
    std::vector<bucket_action> out;
    for (const auto& g : a.resources) {
      auto it = buckets_.find(g.resource_id);
      if (it == buckets_.end()) continue;  // abandoned while asked
      bucket& b = it->second;
      b.capacity = g.gets.capacity;
      b.lease_until = now + g.gets.expires_in;
      b.refresh = g.gets.refresh_interval;
      b.ask_at = now + std::max(g.gets.refresh_interval, 0.1);
      const quota q = quota_of(g.gets.capacity);
      const auto ttl = static_cast<std::int64_t>(std::floor(g.gets.expires_in));
      if (ttl < 1) continue;  // not sayable to Envoy; its copy runs out by itself
      if (!b.sent && q.per_minute == 0 && now - b.first < g.gets.expires_in) continue;
      if (!b.sent || *b.sent != q || now >= b.sent_until - (b.sent_until - b.sent_at) / 2) {
        b.sent = q;
        b.sent_at = now;
        b.sent_until = now + static_cast<double>(ttl);
        out.push_back({b.id, q, ttl});
      }
    }
    return out;
  }

  /// The last `ask` failed (the node shut down, a refusal): its buckets ask again later.
  void failed(double now) {
    asking_ = false;
    for (auto& [res, b] : buckets_)
      if (b.ask_at <= now) b.ask_at = now + o_.retry;
  }

  /// The buckets not reported for `abandon_after`: abandoned (their actions) and released
  /// (their resource ids, for a `release_request`).
  std::pair<std::vector<bucket_action>, std::vector<std::string>> expire(double now) {
    std::vector<bucket_action> actions;
    std::vector<std::string> ids;
    std::erase_if(buckets_, [&](auto& kv) {
      if (now - kv.second.reported < o_.abandon_after) return false;
      actions.push_back({kv.second.id, std::nullopt, 0});
      ids.push_back(kv.first);
      return true;
    });
    return {std::move(actions), std::move(ids)};
  }

  /// The time a usage covers. Envoy says `time_elapsed` in whole seconds, cut down (so a new
  /// bucket's first report, sent at once, says 0): the time since the bucket's last report here,
  /// held within [said, said + 1), says it better. A time with a fraction is taken as said.
  [[nodiscard]] static double elapsed_since(double last, double said, double now) noexcept {
    if (said != std::floor(said)) return said;
    return std::clamp(now - last, said, said + 1);
  }

  /// When `ask` or `expire` has something to do next.
  [[nodiscard]] double next_wake() const noexcept {
    double t = std::numeric_limits<double>::infinity();
    for (const auto& [res, b] : buckets_) {
      t = std::min(t, b.reported + o_.abandon_after);
      if (!asking_) t = std::min(t, b.ask_at);
    }
    return t;
  }

  /// Everything the stream holds, for its end.
  [[nodiscard]] release_request release_all() const {
    release_request r{client_id_, {}};
    for (const auto& [res, b] : buckets_)
      r.resources.push_back(res);
    return r;
  }

  /// The resource id of bucket `id` (sorted by key) in `domain`.
  [[nodiscard]] static std::string resource_of(const std::string& domain, const bucket_id& id) {
    std::string out = domain;
    for (const auto& [k, v] : id) {
      out += '/';
      out += k;
      out += '=';
      out += v;
    }
    return out;
  }

 private:
  struct bucket {
    bucket_id id;
    double wants = 0;
    double first = 0;  // when it was first reported
    double reported = 0;
    double ask_at = std::numeric_limits<double>::infinity();
    double capacity = 0;
    double lease_until = 0;
    double refresh = 0;
    bool measured = false;  // a report with a time came: wants is a rate
    std::optional<quota> sent;
    double sent_at = 0;
    double sent_until = 0;
  };

  static bucket_id sorted(bucket_id id) {
    std::sort(id.begin(), id.end());
    return id;
  }

  static request_error fail(std::string path, const std::string& why) {
    return {errc::invalid_params, path + ": " + why, path};
  }

  // Every bound of one message, before any of it is taken; each usage's bucket id, sorted,
  // and its resource id.
  using prepared = std::vector<std::pair<bucket_id, std::string>>;
  [[nodiscard]] result<prepared> prepare(const usage_reports& r) const {
    if (domain_.empty() && r.domain.empty()) {
      return fail("domain", "must be given in the stream's first message");
    }
    if (!domain_.empty() && !r.domain.empty() && r.domain != domain_) {
      return fail("domain", "must not change on a stream (\"" + domain_ + "\")");
    }
    if (r.domain.size() > request_limits::max_id_bytes) {
      return fail("domain", "must be at most 256 bytes");
    }
    if (r.usages.empty()) return fail("bucket_quota_usages", "must not be empty");
    if (r.usages.size() > o_.max_usages) {
      return fail("bucket_quota_usages",
                  "must hold at most " + std::to_string(o_.max_usages) + " usages");
    }
    const std::string& domain = domain_.empty() ? r.domain : domain_;
    prepared out;
    out.reserve(r.usages.size());
    std::vector<std::string_view> fresh;  // new resource ids, each once
    for (std::size_t i = 0; i < r.usages.size(); ++i) {
      const auto& u = r.usages[i];
      const std::string at = "bucket_quota_usages[" + std::to_string(i) + "]";
      if (u.bucket.empty()) return fail(at + ".bucket_id.bucket", "must not be empty");
      if (u.bucket.size() > o_.max_pairs) {
        return fail(at + ".bucket_id.bucket",
                    "must hold at most " + std::to_string(o_.max_pairs) + " pairs");
      }
      bucket_id id = sorted(u.bucket);
      for (std::size_t k = 0; k < id.size(); ++k) {
        if (id[k].first.empty() || id[k].second.empty()) {
          return fail(at + ".bucket_id.bucket", "keys and values must not be empty");
        }
        if (k > 0 && id[k].first == id[k - 1].first) {
          return fail(at + ".bucket_id.bucket", "key \"" + id[k].first + "\" is given twice");
        }
      }
      std::string res = resource_of(domain, id);
      if (res.size() > request_limits::max_id_bytes) {
        return fail(at + ".bucket_id",
                    "makes a resource id longer than 256 bytes (domain/key=value/...)");
      }
      if (!(u.elapsed >= 0) || u.elapsed > request_limits::max_seconds) {
        return fail(at + ".time_elapsed", "must be at least 0 and at most 1e6 seconds");
      }
      const auto most = static_cast<std::uint64_t>(request_limits::max_quantity);
      if (u.allowed > most || u.denied > most - u.allowed) {
        return fail(at + ".num_requests_allowed", "with num_requests_denied, at most 1e15");
      }
      out.emplace_back(std::move(id), std::move(res));
    }
    for (const auto& [id, res] : out)
      if (!buckets_.contains(res)) fresh.push_back(res);
    std::sort(fresh.begin(), fresh.end());
    fresh.erase(std::unique(fresh.begin(), fresh.end()), fresh.end());
    if (buckets_.size() + fresh.size() > o_.max_buckets) {
      return fail("bucket_quota_usages", "would make more than " + std::to_string(o_.max_buckets) +
                                             " buckets on one stream");
    }
    return out;
  }

  std::string client_id_;
  session_options o_;
  std::string domain_;
  std::map<std::string, bucket> buckets_;  // by resource id
  bool asking_ = false;
};

}  // namespace doorman::rlqs
