#pragma once

/// \file
/// One limiter per key (a user, an IP address, an API key) in one process, with bounded memory.
///
///     doorman::keyed_limiter<doorman::compact_sliding_window_limiter> per_ip(
///         {.limit = 100, .window = 60s, .sub_windows = 12}, {.max_keys = 100'000});
///     if (auto r = per_ip.try_acquire(remote_address); !r) reply_429(r.retry_after);
///
/// Any limiter works; the compact window limiters (`compact_fixed_window_limiter`,
/// `compact_sliding_log_limiter`, `compact_sliding_window_limiter`: one demand counter instead
/// of 16 per-thread stripes) take 88–240 bytes a key (the sliding log, 16 bytes more per
/// admission time in its window), where `rate_limiter` takes 1 216.
///
/// Each key gets its own `Limiter`, made with the same options, on first use. Memory is bounded
/// by `max_keys`:
/// - A key idle for `idle` (by default the limiter's `memory_span()`: the time after which its
///   state is that of a new limiter, so forgetting it changes no decision) is evicted when a new
///   key needs room in its shard (at most 4 per new key, oldest first), so idle keys do not
///   accumulate.
/// - When a shard is full of keys still in use, a new key shares one **overflow** limiter with
///   every other such key until room frees up: a flood of fresh keys (one per request, say)
///   cannot grow memory, nor reset the limits of the keys already held, and shares one limit.
///
/// Keys are spread over 16 shards by hash, each behind its own mutex; the limiter's own
/// decision runs outside the lock. Thread-safe.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "doorman/core/string_hash.hpp"
#include "doorman/limit/limiter_base.hpp"

namespace doorman {

/// Options of a keyed limiter, with their defaults.
struct keyed_limiter_options {
  std::size_t max_keys = 100'000;  ///< keys held at once (at least 16)
  /// How long a key must be unused before it may be evicted; 0: the limiter's memory span
  /// (evicting then changes no decision). A shorter time saves memory and forgets limits.
  std::chrono::nanoseconds idle{0};
  /// Longer keys count by their first `max_key_bytes` bytes (keys often come from outside: a
  /// header, an address); keys that share them share a limit.
  std::size_t max_key_bytes = 256;
};

template <class Limiter>
class keyed_limiter {
 public:
  using limiter_type = Limiter;
  using options_type = typename Limiter::options_type;
  using clock_type = typename Limiter::clock_type;
  using acquire_result = typename Limiter::acquire_result;

  explicit keyed_limiter(options_type limiter_options, keyed_limiter_options options = {},
                         clock_type clock = clock_type{})
      : limiter_options_(limiter_options),
        options_(options),
        per_shard_(std::max<std::size_t>(options.max_keys, shards) / shards),
        clock_(clock),
        overflow_(std::make_shared<Limiter>(limiter_options, clock)) {}

  keyed_limiter(const keyed_limiter&) = delete;
  keyed_limiter& operator=(const keyed_limiter&) = delete;

  /// Takes `n` permits from `key`'s limiter if they are available now; never blocks.
  acquire_result try_acquire(std::string_view key, double n = 1) {
    return get(key)->try_acquire(n);
  }

  /// Blocks until `key`'s limiter admits `n` permits (see the limiter's `wait`).
  bool wait(std::string_view key, double n = 1, std::stop_token stop = {}) {
    return get(key)->wait(n, std::move(stop));
  }

  /// Where `key`'s limiter stands.
  limit_status status(std::string_view key) { return get(key)->status(); }

  /// `key`'s limiter, made if new (or the overflow limiter when its shard is full). Held, the
  /// pointer keeps the key from being evicted.
  std::shared_ptr<Limiter> get(std::string_view key) {
    key = key.substr(0, std::max<std::size_t>(options_.max_key_bytes, 1));
    const std::size_t h = std::hash<std::string_view>{}(key);
    shard& s = shards_[h % shards];
    const std::int64_t now = ticks(clock_.now());
    const std::lock_guard lock(s.mutex);
    if (auto it = s.index.find(key); it != s.index.end()) {
      it->second->last_used = now;
      s.lru.splice(s.lru.begin(), s.lru, it->second);
      return it->second->limiter;
    }
    for (int i = 0; i < 4 && !s.lru.empty() && evictable(s.lru.back(), now); ++i)
      evict(s);
    if (s.lru.size() >= per_shard_) {
      overflowed_.fetch_add(1, std::memory_order_relaxed);
      return overflow_;
    }
    s.lru.push_front({std::string(key), std::make_shared<Limiter>(limiter_options_, clock_), now});
    s.index.emplace(s.lru.front().key, s.lru.begin());
    return s.lru.front().limiter;
  }

  /// Keys held now.
  [[nodiscard]] std::size_t size() const {
    std::size_t n = 0;
    for (auto& s : shards_) {
      const std::lock_guard lock(s.mutex);
      n += s.lru.size();
    }
    return n;
  }

  /// Keys evicted so far, and lookups served by the overflow limiter.
  [[nodiscard]] std::uint64_t evicted() const noexcept {
    return evicted_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t overflowed() const noexcept {
    return overflowed_.load(std::memory_order_relaxed);
  }

  /// An estimate of the bytes held: each key's limiter, key and bookkeeping (list and hash
  /// nodes), and the shards.
  [[nodiscard]] std::size_t memory_bytes() {
    std::size_t bytes = sizeof(*this) + overflow_->memory_bytes();
    for (auto& s : shards_) {
      const std::lock_guard lock(s.mutex);
      bytes += s.index.bucket_count() * sizeof(void*);
      for (auto& e : s.lru)
        bytes += e.limiter->memory_bytes() + e.key.capacity() + per_key_overhead;
    }
    return bytes;
  }

  /// The most keys held at once.
  [[nodiscard]] std::size_t max_keys() const noexcept { return per_shard_ * shards; }

 private:
  static constexpr std::size_t shards = 16;

  struct entry {
    std::string key;
    std::shared_ptr<Limiter> limiter;
    std::int64_t last_used;
  };
  // A list node (two pointers and the entry), a hash node (next, key view, iterator, hash), a
  // shared_ptr control block.
  static constexpr std::size_t per_key_overhead =
      sizeof(entry) + 2 * sizeof(void*) + 4 * sizeof(void*) + 16;

  struct shard {
    mutable std::mutex mutex;
    std::list<entry> lru;  // most recently used first
    std::unordered_map<std::string_view, typename std::list<entry>::iterator, string_hash,
                       std::equal_to<>>
        index;  // views of the keys in `lru`
  };

  bool evictable(const entry& e, std::int64_t now) const noexcept {
    const auto idle = options_.idle.count() > 0 ? options_.idle : e.limiter->memory_span();
    return now - e.last_used >= idle.count() && e.limiter.use_count() == 1;
  }

  void evict(shard& s) {
    s.index.erase(std::string_view(s.lru.back().key));
    s.lru.pop_back();
    evicted_.fetch_add(1, std::memory_order_relaxed);
  }

  static std::int64_t ticks(typename clock_type::time_point t) noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }

  const options_type limiter_options_;
  const keyed_limiter_options options_;
  const std::size_t per_shard_;
  [[no_unique_address]] clock_type clock_;
  std::shared_ptr<Limiter> overflow_;
  shard shards_[shards];
  std::atomic<std::uint64_t> evicted_{0};
  std::atomic<std::uint64_t> overflowed_{0};
};

}  // namespace doorman
