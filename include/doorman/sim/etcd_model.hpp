#pragma once

/// \file
/// A model of the election store (etcd) that one job's tasks campaign through, on the
/// simulation's clock: leases that expire `ttl` after their last renewal reached the store, the
/// election key (its holder's lease and value, and the revision it last changed at), and the
/// store's revision. It answers the calls `election_campaign` asks for, as etcd does; the
/// simulation carries the calls and answers over its network and wakes the watches.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "doorman/core/election_campaign.hpp"
#include "doorman/core/time.hpp"

namespace doorman::sim {

class etcd_model {
 public:
  using time_point = manual_clock::time_point;  ///< the simulation's

  using holder = election_holder;  ///< the key's holder: its lease (0: free) and value

  /// A lease of `ttl` seconds, from `now`. Returns its id.
  std::int64_t grant(time_point now, std::int64_t ttl) {
    leases_.push_back({++last_lease_, ttl, now + std::chrono::seconds(ttl)});
    return last_lease_;
  }

  /// Renews `lease` from `now`: the seconds it has left, 0 when it is gone.
  std::int64_t keep_alive(time_point now, std::int64_t lease) {
    expire(now);
    for (auto& l : leases_) {
      if (l.id != lease) continue;
      l.expires = now + std::chrono::seconds(l.ttl);
      return l.ttl;
    }
    return 0;
  }

  /// The election's claim: the key becomes `value`'s, attached to `lease`, unless it is held.
  /// Nothing when `lease` is gone; else the store's revision and the key's holder after it.
  std::optional<std::pair<std::int64_t, holder>> put_if_absent(time_point now, std::int64_t lease,
                                                               const std::string& value) {
    expire(now);
    if (!find(lease)) return std::nullopt;
    if (key_.lease == 0) {
      key_ = {lease, value};
      changed_at_ = ++revision_;
    }
    return std::pair{revision_, key_};
  }

  /// `put_if_absent` with a master's record attached to `record_lease`: when it takes the key,
  /// the records alive before it are counted (the answer's third part) and its own is kept.
  std::optional<std::pair<std::int64_t, holder>> put_if_absent(
      time_point now, std::int64_t lease, const std::string& value, std::int64_t record_lease,
      std::optional<std::int64_t>& records) {
    expire(now);
    records.reset();
    if (!find(lease) || !find(record_lease)) return std::nullopt;
    if (key_.lease == 0) {
      records = static_cast<std::int64_t>(records_.size());
      records_.push_back(record_lease);
    }
    return put_if_absent(now, lease, value);
  }

  /// How many masters' records are alive.
  [[nodiscard]] std::size_t records() const noexcept { return records_.size(); }

  /// The key's value, nothing when it is free.
  std::optional<std::string> get(time_point now) {
    expire(now);
    if (key_.lease == 0) return std::nullopt;
    return key_.value;
  }

  /// Ends `lease` now, and frees the key if it held it.
  void revoke(time_point now, std::int64_t lease) {
    expire(now);
    std::erase_if(leases_, [&](const lease_entry& l) { return l.id == lease; });
    std::erase_if(records_, [&](std::int64_t r) { return r == lease; });
    if (key_.lease == lease && lease != 0) free_key();
  }

  /// Ends every lease that ran out by `now`, and frees the key if one of them held it.
  void expire(time_point now) {
    std::erase_if(leases_, [&](const lease_entry& l) { return l.expires <= now; });
    std::erase_if(records_, [&](std::int64_t r) { return !find(r); });
    if (key_.lease != 0 && !find(key_.lease)) free_key();
  }

  /// Whether the key changed at `revision` or later (a watch from `revision` fires).
  [[nodiscard]] bool changed_since(std::int64_t revision) const noexcept {
    return changed_at_ >= revision;
  }

  /// When `lease` runs out as things stand (`time_point::max()` when it is gone).
  [[nodiscard]] time_point expiry(std::int64_t lease) const noexcept {
    const lease_entry* l = find(lease);
    return l ? l->expires : time_point::max();
  }

  [[nodiscard]] const holder& key() const noexcept { return key_; }
  [[nodiscard]] std::int64_t revision() const noexcept { return revision_; }

 private:
  struct lease_entry {
    std::int64_t id = 0;
    std::int64_t ttl = 0;
    time_point expires{};
  };

  [[nodiscard]] const lease_entry* find(std::int64_t lease) const noexcept {
    const auto it =
        std::find_if(leases_.begin(), leases_.end(), [&](const auto& l) { return l.id == lease; });
    return it == leases_.end() ? nullptr : &*it;
  }

  void free_key() {
    key_ = {};
    changed_at_ = ++revision_;
  }

  std::vector<lease_entry> leases_;
  std::vector<std::int64_t> records_;  // the leases that hold a master's record
  std::int64_t last_lease_ = 0;
  std::int64_t revision_ = 1;
  std::int64_t changed_at_ = 0;
  holder key_;
};

}  // namespace doorman::sim
