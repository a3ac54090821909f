#pragma once

/// \file
/// One stream of Envoy's rate limit quota service (RLQS, docs/envoy.md) as a sans-I/O machine:
/// the stream is a client of the engine, each of its buckets a resource. Usage reports become
/// the measured wants of their buckets; the engine's leases become quota assignments, pushed
/// when they change or before Envoy's copy runs out; a bucket not reported for
/// `abandon_after` is released and abandoned; the stream's end releases nothing (Envoy keeps
/// each assignment until its time to live, and each lease runs out with it). The gRPC
/// door (src/grpc/rlqs_door.cpp) only moves messages and time:
///
///     doorman::rlqs::session s("rlqs/10.0.0.7/1", {});
///     if (auto ok = s.report(reports, now); !ok) finish(ok.error());  // names the field
///     if (auto ask = s.ask(now)) node.call(*ask, [&](auto answer) {
///       for (auto& action : s.answer(answer, now)) write(action);
///     });
///     // wake at s.next_wake(), call s.expire(now): abandoned buckets, and what to release
///
/// A bucket's resource id is its domain and its key-value pairs, sorted by key, each escaped
/// (`resource_of`): `envoy/name=api/tier=free`; the node's resource templates (a glob on that id)
/// give its capacity and algorithm. Its wants are its requests a second (allowed and denied) over
/// the last report; what it has is the lease behind its assignment on this stream, nothing before.
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
#include "doorman/core/glob.hpp"
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

/// A budget's block: `tokens` drawn from the budget (spent there at once) for Envoy to spend,
/// never refilled. A token bucket of `tokens` that gains one token a year (`fill_interval`
/// `block_fill_seconds`), whose `fill_interval` nanoseconds are the block's `number`, so that
/// Envoy makes a new, full bucket for each block and keeps the one it has when a block is sent
/// again.
struct block {
  std::uint32_t tokens = 0;
  std::uint32_t number = 0;  ///< < 10^9
  friend bool operator==(const block&, const block&) = default;
};

/// A block's `fill_interval`, in seconds: 366 days, longer than any budget window.
inline constexpr std::int64_t block_fill_seconds = 366 * 86'400;

/// What to tell Envoy of one bucket, for `ttl` whole seconds (Envoy reads only the seconds of
/// `assignment_time_to_live`): a quota, a budget's block, or (neither) abandon it.
struct bucket_action {
  bucket_id bucket;
  std::optional<quota> assign;
  std::int64_t ttl = 0;
  std::optional<block> spend{};
};

struct session_options {
  std::size_t max_buckets = 1'000;  ///< buckets on one stream
  std::size_t max_usages = 1'000;   ///< usages in one message
  std::size_t max_pairs = 32;       ///< key-value pairs in one bucket id
  double abandon_after = 60;        ///< seconds a bucket may go unreported
  double retry = 1;                 ///< seconds before asking again after a failed ask
  /// A budget bucket's block: its wants over this many seconds, or over five reporting
  /// intervals if longer; at least one, at most a tenth of the window's budget
  double block_seconds = 10;
  /// A budget bucket draws its next block once its reports say this much of the block is used
  double draw_when_used = 0.8;
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
      b.used += static_cast<double>(u.allowed);
      if (b.budget && b.block > 0 && b.used >= o_.draw_when_used * b.block && now >= b.dry_until) {
        b.draw_at = std::min(b.draw_at, now);
      }
      if (!(elapsed > 0)) continue;  // no rate yet (a new bucket's first report says 0)
      b.wants = std::min(static_cast<double>(u.allowed + u.denied) / elapsed,
                         request_limits::max_quantity);
      if (!(b.gap > 0)) b.ask_at = now;  // its first rate: asked for at once
      b.gap = elapsed;
    }
    return true;
  }

  /// The engine call due at `now`, if any: every bucket that is new or whose refresh is due,
  /// each then waiting for `answer` or `failed`.
  std::optional<capacity_request> ask(double now) {
    // A bucket's first ask wants nothing: its answer says whether it is a budget (drawn in
    // blocks from then on, never asked again), and takes no allotment of one.
    return gather(asking_, capacity_request{client_id_, {}, true},
                  [&](const std::string& res, bucket& b) -> std::optional<resource_request> {
                    if (b.ask_at > now) return std::nullopt;
                    resource_request r{res, 0, b.probed ? b.wants : 0, std::nullopt};
                    if (b.lease_until > now) {
                      r.has = lease_info{b.capacity, b.lease_until - now, b.refresh};
                    }
                    return r;
                  });
  }

  /// The engine's answer to the last `ask`: the assignments to push (a changed quota, or one
  /// whose copy at Envoy is half gone; a first one of 0 only once the bucket is a lease length
  /// old). Not master (no grants): an error, the stream ends.
  result<std::vector<bucket_action>> answer(const capacity_response& a, double now) {
    return settle(asking_, a,
                  [&](bucket& b, const resource_grant& g) { return granted(b, g, now); });
  }

  /// The draws due at `now`, if any (`count_hits` on budget buckets): a bucket whose Envoy has
  /// no block yet, or has used most of it, or whose window ended. Each then waits for `drawn`
  /// or `failed_draw`.
  std::optional<count_request> draw(double now) {
    return gather(drawing_, count_request{client_id_, {}},
                  [&](const std::string& res, bucket& b) -> std::optional<hit_count> {
                    if (!b.budget || b.draw_at > now || !(b.wants > 0)) return std::nullopt;
                    const double seconds = std::max(o_.block_seconds, 5 * b.gap);
                    const double most = std::min(
                        {b.most, request_limits::max_hits, b.limit > 0 ? b.limit / 10 : b.most});
                    b.size = std::floor(std::clamp(b.wants * seconds, 1.0, std::max(1.0, most)));
                    return hit_count{res, b.size, 1};
                  });
  }

  /// The root's answer to the last `draw`: blocks to send. A refused draw is asked again at
  /// once for what is left, if anything is; else the bucket waits for its window's end, and
  /// Envoy, if it holds no block of this window, is told `DENY_ALL` until then. Not master:
  /// an error, the stream ends.
  result<std::vector<bucket_action>> drawn(const count_response& a, double now) {
    return settle(drawing_, a,
                  [&](bucket& b, const hit_verdict& v) -> std::optional<bucket_action> {
                    if (!b.budget) return std::nullopt;
                    return drawn(b, v, now);
                  });
  }

  /// The last `draw` failed (the node shut down; a node that is not a root, which draws
  /// nothing): its buckets try again after `wait` seconds; Envoy keeps what it has.
  void failed_draw(double now, double wait) {
    drawing_ = false;
    for (auto& [res, b] : buckets_)
      if (b.budget && b.draw_at <= now) b.draw_at = now + wait;
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
      if (!drawing_ && b.budget && b.wants > 0) t = std::min(t, b.draw_at);
    }
    return t;
  }

  /// Everything the stream holds: what to release when its client is known to enforce none of
  /// it any more (the gRPC door never does: Envoy keeps its assignments past a stream's end).
  [[nodiscard]] release_request release_all() const {
    release_request r{client_id_, {}};
    for (const auto& [res, b] : buckets_)
      r.resources.push_back(res);
    return r;
  }

  /// The resource id of bucket `id` (sorted by key) in `domain`: `domain/key=value/...`, built
  /// as rule keys are (`append_key_piece`: `/`, `=`, `%`, glob bytes and bytes outside
  /// printable ASCII as `%XX`), so distinct buckets never share a resource
  /// (`{name: "api/tier=free"}` is `edge/name=api%2Ftier%3Dfree`).
  [[nodiscard]] static std::string resource_of(const std::string& domain, const bucket_id& id) {
    constexpr std::size_t whole = request_limits::max_id_bytes;  // longer: refused (`prepare`)
    std::string out;
    append_key_piece(out, domain, whole);
    for (const auto& [k, v] : id)
      append_key_entry(out, k, v, whole);
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
    // A budget bucket (drawn in blocks): the block Envoy holds, its use as reported since, its
    // window's end, when to draw next, the draw's size, the most to ask for, and until when
    // the window has nothing left.
    bool probed = false;  // asked once, wanting nothing: a budget or not
    bool budget = false;
    double block = 0, used = 0, window_end = 0, size = 0, dry_until = 0;
    double gap = 0;    // the time its last report with a time covered (0: no rate yet)
    double limit = 0;  // the budget's, per window
    double draw_at = std::numeric_limits<double>::infinity();
    double most = request_limits::max_quantity;
    std::uint32_t number = 0;
    std::optional<quota> sent;
    double sent_at = 0;
    double sent_until = 0;
  };

  // One call of the due buckets (`entry`: a bucket's part, or none), marked under way in
  // `busy`; none when nothing is due or one is under way.
  template <class Call, class Entry>
  std::optional<Call> gather(bool& busy, Call out, Entry entry) {
    if (busy) return std::nullopt;
    for (auto& [res, b] : buckets_)
      if (auto e = entry(res, b)) out.resources.push_back(std::move(*e));
    if (out.resources.empty()) return std::nullopt;
    busy = true;
    return out;
  }

  // An answer to the call under way in `busy`: each of its buckets' action, if any (`each`);
  // not master, an error.
  template <class Answer, class Each>
  result<std::vector<bucket_action>> settle(bool& busy, const Answer& a, Each each) {
    busy = false;
    if (!a.mastership.is_master) {
      return request_error{errc::invalid_params, "not master", ""};
    }
    std::vector<bucket_action> out;
    for (const auto& x : a.resources) {
      auto it = buckets_.find(x.resource_id);
      if (it == buckets_.end()) continue;  // abandoned while asked
      if (auto act = each(it->second, x)) out.push_back(std::move(*act));
    }
    return out;
  }

  // One bucket's grant: its assignment to push, if any.
  std::optional<bucket_action> granted(bucket& b, const resource_grant& g, double now) const {
    if (!b.probed) {  // a budget, or asked for what it wants at once
      b.probed = true;
      b.budget = g.budget.has_value();
      b.ask_at = b.budget ? std::numeric_limits<double>::infinity() : now;
      if (b.budget) b.draw_at = now, b.limit = g.budget->limit;
      return std::nullopt;
    }
    b.capacity = g.gets.capacity;
    b.lease_until = now + g.gets.expires_in;
    b.refresh = g.gets.refresh_interval;
    b.ask_at = now + std::max(g.gets.refresh_interval, 0.1);
    const quota q = quota_of(g.gets.capacity);
    const auto ttl = static_cast<std::int64_t>(std::floor(g.gets.expires_in));
    if (ttl < 1) return std::nullopt;  // not sayable to Envoy; its copy runs out by itself
    if (!b.sent && q.per_minute == 0 && now - b.first < g.gets.expires_in) return std::nullopt;
    if (b.sent && *b.sent == q && now < b.sent_until - (b.sent_until - b.sent_at) / 2) {
      return std::nullopt;
    }
    b.sent = q;
    b.sent_at = now;
    b.sent_until = now + static_cast<double>(ttl);
    return bucket_action{b.id, q, ttl};
  }

  // One bucket's verdict: its block, `DENY_ALL` when the window has nothing left and Envoy
  // holds no block of it, or nothing.
  std::optional<bucket_action> drawn(bucket& b, const hit_verdict& v, double now) const {
    const auto ttl = static_cast<std::int64_t>(std::floor(v.reset));
    b.limit = v.limit;
    if (v.admitted) {
      b.most = request_limits::max_quantity;
      b.draw_at = now + v.reset;         // the next window's first block
      if (ttl < 1) return std::nullopt;  // the window ends first
      b.block = b.size;
      b.used = 0;
      b.window_end = now + v.reset;
      b.number = (b.number + 1) % 1'000'000'000;
      return bucket_action{b.id, std::nullopt, ttl,
                           block{static_cast<std::uint32_t>(b.size), b.number}};
    }
    if (v.remaining >= 1) {  // less is left: that much, at once
      b.most = std::floor(v.remaining);
      b.draw_at = now;
      return std::nullopt;
    }
    b.most = request_limits::max_quantity;
    b.draw_at = b.dry_until = now + std::max(v.reset, o_.retry);
    if (b.window_end > now || ttl < 1) return std::nullopt;  // Envoy spends what it has
    return bucket_action{b.id, quota{}, ttl};
  }

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
  bool drawing_ = false;
};

}  // namespace doorman::rlqs
