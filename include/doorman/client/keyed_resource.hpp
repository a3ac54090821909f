#pragma once

/// \file
/// Per-key limits shared across a fleet: one Doorman resource per key, named from a template.
///
///     // The server: {"identifier_glob": "api-key:*", "capacity": 100, ...}
///     doorman::keyed_rate_resource per_key(client, "api-key:*", {.wants = 100});
///     if (auto r = per_key.try_acquire(api_key); !r) reply_429(r.retry_after);
///
/// Each key gets a `rate_resource` whose id is the template with its `*` replaced by the key
/// (`resource_id_for`), so every client asking for the key shares the capacity the server
/// configures for the template: a per-key limit that holds across every process.
///
/// The trade-off: each key is a lease per client. A key costs a refresh round trip per
/// client every refresh interval, server memory per (key, client) pair, and its first request
/// in a process waits for the first lease (the capacity is 0 until then; `try_acquire` is
/// refused, `async_wait` waits for it). Use it for keys that are few or long-lived (API keys,
/// tenants); for many short-lived keys (IP addresses), a local `keyed_limiter` per process
/// costs nothing on the network.
///
/// Memory is bounded: at most `max_keys` keys are held; a key unused for `idle` is released
/// (its lease given back) when room is needed, and when every key is in use a new key shares
/// one overflow resource (the template with `%overflow` for the key) until room frees up.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "doorman/client/resource.hpp"
#include "doorman/core/glob.hpp"
#include "doorman/core/limits.hpp"

namespace doorman {

/// The resource id of `key` under `pattern` (which holds one `*`): `api-key:*` and `abc` give
/// `api-key:abc`. The bytes a glob treats specially (`* ? [ ] \ /`), `%`, and bytes outside
/// printable ASCII are written `%XX` (`append_escaped`), so the id always matches the pattern and
/// distinct keys give distinct ids, up to the protocol's 256 bytes: a longer id keeps the key's
/// first bytes that fit (keys sharing them share the id). An id is never empty: the empty key
/// under `*` is `%`. Throws `std::invalid_argument` when `pattern` holds no `*` or more than
/// one, or leaves no room for a key.
inline std::string resource_id_for(std::string_view pattern, std::string_view key) {
  const auto star = pattern.find('*');
  if (star == std::string_view::npos || pattern.find('*', star + 1) != std::string_view::npos)
    throw std::invalid_argument("resource id template must hold exactly one '*': " +
                                std::string(pattern));
  if (pattern.size() + 8 > request_limits::max_id_bytes)
    throw std::invalid_argument("resource id template leaves no room for a key: " +
                                std::string(pattern));
  std::string id(pattern.substr(0, star));
  append_escaped(id, key, {}, request_limits::max_id_bytes - (pattern.size() - 1 - star));
  id += pattern.substr(star + 1);
  if (id.empty()) id = "%";  // no key escapes to a lone '%'
  return id;
}

/// Options of a keyed resource, with their defaults.
struct keyed_resource_options {
  std::size_t max_keys = 1000;  ///< resources held at once (at least 1)
  /// A key unused this long is released when room is needed.
  std::chrono::nanoseconds idle = std::chrono::minutes(5);
};

class keyed_rate_resource {
 public:
  using acquire_result = rate_resource::acquire_result;

  /// Keys under `pattern` (one `*`), each a rate resource with `options`.
  keyed_rate_resource(client& c, std::string pattern, resource_options options = {},
                      keyed_resource_options keyed = {})
      : client_(c),
        pattern_(std::move(pattern)),
        options_(options),
        keyed_(keyed),
        overflow_id_(resource_id_for(pattern_, "")) {
    overflow_id_ = pattern_;
    overflow_id_.replace(pattern_.find('*'), 1, "%overflow");
  }

  keyed_rate_resource(const keyed_rate_resource&) = delete;
  keyed_rate_resource& operator=(const keyed_rate_resource&) = delete;

  /// Takes `n` permits of `key`'s resource if available now.
  acquire_result try_acquire(std::string_view key, double n = 1) {
    return resource(key).try_acquire(n);
  }

  /// A handle to `key`'s resource (made if new; the overflow resource when full): for `wait`,
  /// `async_wait`, `capacity()`. Holding it keeps the resource, even once evicted here.
  rate_resource resource(std::string_view key) {
    return resource_by_id(resource_id_for(pattern_, key));  // at most 256 bytes, whatever the key
  }

  /// The resource with id `id` itself (one the caller formed, e.g. a rule's request key; at
  /// most 256 bytes), held, evicted and overflowing as keys are.
  rate_resource resource_by_id(std::string id) {
    const auto now = std::chrono::steady_clock::now();
    const std::lock_guard lock(mutex_);
    if (auto it = index_.find(id); it != index_.end()) {
      it->second->last_used = now;
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->handle;
    }
    // Up to 4 idle keys go for each new one, so idle keys do not hold leases for long.
    for (int i = 0; i < 4 && !lru_.empty() && now - lru_.back().last_used >= keyed_.idle; ++i) {
      index_.erase(lru_.back().key);
      lru_.pop_back();  // the handle goes: its lease is released
      ++evicted_;
    }
    if (lru_.size() >= std::max<std::size_t>(keyed_.max_keys, 1)) {
      ++overflowed_;
      if (!overflow_) overflow_.emplace(client_, overflow_id_, options_);
      return *overflow_;
    }
    rate_resource handle(client_, id, options_);
    lru_.push_front({std::move(id), std::move(handle), now});
    index_.emplace(lru_.front().key, lru_.begin());
    return lru_.front().handle;
  }

  /// Keys held now; keys released so far; lookups the overflow resource served.
  [[nodiscard]] std::size_t size() const {
    const std::lock_guard lock(mutex_);
    return lru_.size();
  }
  [[nodiscard]] std::uint64_t evicted() const {
    const std::lock_guard lock(mutex_);
    return evicted_;
  }
  [[nodiscard]] std::uint64_t overflowed() const {
    const std::lock_guard lock(mutex_);
    return overflowed_;
  }

 private:
  struct entry {
    std::string key;  // the resource id
    rate_resource handle;
    std::chrono::steady_clock::time_point last_used;
  };

  client& client_;
  const std::string pattern_;
  const resource_options options_;
  const keyed_resource_options keyed_;
  std::string overflow_id_;
  mutable std::mutex mutex_;
  std::list<entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<entry>::iterator> index_;
  std::optional<rate_resource> overflow_;
  std::uint64_t evicted_ = 0;
  std::uint64_t overflowed_ = 0;
};

}  // namespace doorman
