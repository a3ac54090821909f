#pragma once

/// \file
/// A flat hash table from ids to slots, for the lease store's per-request lookup.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "doorman/core/prefetch.hpp"

namespace doorman::detail {

/// Maps string ids to 32-bit slots with open addressing (linear probing, backward-shift
/// deletion, no tombstones). The table holds only `(hash, slot)` pairs; the ids live with the
/// caller, who passes a function that returns the id stored at a slot. A lookup touches one
/// table line and the caller's record, instead of a node-based map's chain of pointers.
class id_table {
 public:
  static constexpr std::uint32_t npos = 0xffffffffu;

  /// The slot of `id`, or npos. `id_at(slot)` returns the id stored at a slot.
  template <class IdAt>
  [[nodiscard]] std::uint32_t find(std::string_view id, IdAt&& id_at) const noexcept {
    if (cells_.empty()) return npos;
    const std::uint32_t h = hash(id);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const cell& c = cells_[i];
      if (c.slot == npos) return npos;
      if (c.hash == h && id_at(c.slot) == id) return c.slot;
    }
  }

  /// Brings the cell where a lookup of `id` starts into cache (a hint; changes nothing).
  void prefetch(std::string_view id) const noexcept {
    if (!cells_.empty()) detail::prefetch(&cells_[hash(id) & mask_]);
  }

  /// The slot of the first cell whose hash matches `id`'s, or npos: `find` without comparing
  /// ids (so without reading the caller's records), for prefetching the record it will read.
  [[nodiscard]] std::uint32_t likely_slot(std::string_view id) const noexcept {
    if (cells_.empty()) return npos;
    const std::uint32_t h = hash(id);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const cell& c = cells_[i];
      if (c.slot == npos || c.hash == h) return c.slot;
    }
  }

  /// Adds `id` -> `slot`; `id` must not be present.
  void insert(std::string_view id, std::uint32_t slot) {
    if ((size_ + 1) * 8 > cells_.size() * 5) grow();  // load factor <= 5/8
    place({hash(id), slot});
    ++size_;
  }

  /// Removes `id`, which must be present.
  template <class IdAt>
  void erase(std::string_view id, IdAt&& id_at) noexcept {
    const std::uint32_t h = hash(id);
    std::size_t i = h & mask_;
    while (!(cells_[i].hash == h && id_at(cells_[i].slot) == id))
      i = (i + 1) & mask_;
    // Backward shift: pull later cells of the probe run into the hole.
    for (std::size_t j = (i + 1) & mask_; cells_[j].slot != npos; j = (j + 1) & mask_) {
      const std::size_t home = cells_[j].hash & mask_;
      // Move j into i if its home is not in the cyclic range (i, j].
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        cells_[i] = cells_[j];
        i = j;
      }
    }
    cells_[i] = cell{};
    --size_;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  // 8 bytes: the low 32 bits of the hash place a cell (slots are 32-bit, so a table never
  // needs more) and spare most id comparisons.
  struct cell {
    std::uint32_t hash = 0;
    std::uint32_t slot = npos;
  };

  static std::uint32_t hash(std::string_view id) noexcept {
    // std::hash of a string_view, mixed so that linear probing sees well-spread low bits.
    std::uint64_t h = std::hash<std::string_view>{}(id);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return static_cast<std::uint32_t>(h);
  }

  void place(const cell& c) noexcept {
    std::size_t i = c.hash & mask_;
    while (cells_[i].slot != npos)
      i = (i + 1) & mask_;
    cells_[i] = c;
  }

  void grow() {
    std::vector<cell> old = std::move(cells_);
    cells_.assign(old.empty() ? 16 : old.size() * 2, cell{});
    mask_ = cells_.size() - 1;
    for (const cell& c : old) {
      if (c.slot != npos) place(c);
    }
  }

  std::vector<cell> cells_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace doorman::detail
