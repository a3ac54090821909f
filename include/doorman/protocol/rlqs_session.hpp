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
  double elapsed = 0;  ///< seconds since its last report (`time_elapsed`)
  std::uint64_t allowed = 0;
  std::uint64_t denied = 0;
};

/// One message of the stream (`RateLimitQuotaUsageReports`).
struct usage_reports {
  std::string domain;  ///< required in the first; later ones empty or the same
  std::vector<bucket_usage> usages;
};

/// A quota as Envoy's strategies say it: `count` requests per `unit_seconds` (1, 60 or 3600),
/// rounded down so that the stream's quotas never add up to more than its leases.
struct quota {
  std::uint64_t count = 0;
  std::uint64_t unit_seconds = 1;
  friend bool operator==(const quota&, const quota&) = default;
};

/// The quota of `rate` requests a second: per second when that loses under 1 % to rounding,
/// else per minute, else per hour.
[[nodiscard]] inline quota quota_of(double rate) noexcept {
  if (!(rate > 0)) return {0, 1};
  for (const std::uint64_t unit : {std::uint64_t{1}, std::uint64_t{60}}) {
    if (rate * static_cast<double>(unit) >= 100) {
      return {static_cast<std::uint64_t>(std::floor(rate * static_cast<double>(unit))), unit};
    }
  }
  return {static_cast<std::uint64_t>(std::floor(std::min(rate * 3600, 1e15))), 3600};
}

/// What to tell Envoy of one bucket: a quota for `ttl` seconds, or (none) abandon it.
struct bucket_action {
  bucket_id bucket;
  std::optional<quota> assign;
  double ttl = 0;
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
      if (fresh) b.id = std::move(id);
      b.wants = std::min(static_cast<double>(u.allowed + u.denied) / u.elapsed,
                         request_limits::max_quantity);
      b.reported = now;
      if (fresh) b.ask_at = b.first = now;
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
      if (!b.sent && q.count == 0 && now - b.first < g.gets.expires_in) continue;
      if (!b.sent || *b.sent != q || now >= b.sent_until - (b.sent_until - b.sent_at) / 2) {
        b.sent = q;
        b.sent_at = now;
        b.sent_until = b.lease_until;
        out.push_back({b.id, q, g.gets.expires_in});
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
      if (!(u.elapsed > 0) || u.elapsed > request_limits::max_seconds) {
        return fail(at + ".time_elapsed", "must be more than 0 and at most 1e6 seconds");
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
