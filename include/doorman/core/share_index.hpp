#pragma once

/// \file
/// An order-statistics index over demands, ordered by wants per subclient, with prefix sums:
/// the structure that makes every allocation decision cost O(log n) in the number of clients.

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace doorman {

/// Sums over a set of demands.
struct demand_sums {
  double wants = 0;
  double subclients = 0;
};

/// A multiset of demands `(wants, subclients)` ordered by `wants / subclients`, answering: the
/// sums of all demands below a ratio (PROPORTIONAL_SHARE), and the water level of a weighted
/// max-min fair split (FAIR_SHARE).
///
/// Layout: the ordered demands are cut into blocks of at most `max_block` entries, each block
/// a contiguous sorted array with its sums; a Fenwick tree over the block sums gives prefix sums
/// of whole blocks. A change costs a binary search over block boundaries, a short move inside
/// one block and O(log blocks) Fenwick updates; a query costs O(log blocks) plus a scan of one
/// block. The top-level arrays are small enough to stay in cache, so the cost grows very little
/// from a thousand to a million demands (a pointer tree pays a cache miss per level there).
/// Deterministic: the same operations always give the same state.
///
///     doorman::share_index idx;
///     idx.insert(1000, 6); idx.insert(500, 4); idx.insert(200, 2);
///     idx.water_level(120);  // 10: the shares are 60, 40 and 20
class share_index {
 public:
  /// Names one demand in the index: its position key. The holder keeps it and passes it back
  /// to `update` (which changes it) and `erase`.
  struct handle {
    double ratio = 0;
    std::uint32_t id = 0;
  };

  /// Adds a demand; `subclients` must be > 0.
  handle insert(double wants, double subclients) {
    assert(subclients > 0);
    std::uint32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = next_id_++;
    }
    add_entry({wants, subclients, id});
    ++size_;
    return {wants / subclients, id};
  }

  /// Changes the demand behind `h`, which is updated to name it.
  void update(handle& h, double wants, double subclients) {
    assert(subclients > 0);
    remove_entry(h);
    add_entry({wants, subclients, h.id});
    h.ratio = wants / subclients;
  }

  /// Removes the demand behind `h`.
  void erase(const handle& h) {
    remove_entry(h);
    free_.push_back(h.id);
    --size_;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  /// Sums over every demand.
  [[nodiscard]] demand_sums totals() const noexcept { return prefix(blocks_.size()); }

  /// Sums over the demands whose wants per subclient is strictly below `ratio`.
  [[nodiscard]] demand_sums below(double ratio) const noexcept {
    // Blocks whose last ratio is below `ratio` are wholly below it.
    const auto it = std::partition_point(last_.begin(), last_.end(),
                                         [&](const key& k) { return k.ratio < ratio; });
    const auto b = static_cast<std::size_t>(it - last_.begin());
    demand_sums acc = prefix(b);
    if (b < blocks_.size()) {
      for (const entry& e : blocks_[b].items) {
        if (!(e.ratio() < ratio)) break;
        acc.wants += e.wants;
        acc.subclients += e.subclients;
      }
    }
    return acc;
  }

  /// The level L at which `sum(min(wants_i, L * subclients_i)) == capacity`: weighted
  /// water-filling. Infinity when every demand fits (total wants <= capacity).
  [[nodiscard]] double water_level(double capacity) const noexcept {
    const demand_sums total = totals();
    if (total.wants <= capacity) return std::numeric_limits<double>::infinity();
    // In ratio order, the prefix ending at element k is fully satisfied iff
    // g(k) = W(<= k) + ratio_k * S(> k) <= capacity, and g never decreases with k. First find
    // the longest run of whole blocks whose last element satisfies it (binary lifting over the
    // Fenwick tree), then continue element by element in the next block.
    std::size_t pos = 0;  // blocks [0, pos) are satisfied
    demand_sums through;
    for (std::size_t step = top_bit(blocks_.size()); step != 0; step >>= 1) {
      const std::size_t next = pos + step;
      if (next > blocks_.size()) continue;
      const demand_sums candidate{through.wants + fenwick_[next].wants,
                                  through.subclients + fenwick_[next].subclients};
      if (candidate.wants + last_[next - 1].ratio * (total.subclients - candidate.subclients) <=
          capacity) {
        pos = next;
        through = candidate;
      }
    }
    bool found = pos > 0;
    demand_sums satisfied = through;
    if (pos < blocks_.size()) {
      demand_sums run = through;
      for (const entry& e : blocks_[pos].items) {
        run.wants += e.wants;
        run.subclients += e.subclients;
        if (run.wants + e.ratio() * (total.subclients - run.subclients) > capacity) break;
        found = true;
        satisfied = run;
      }
    }
    if (!found) return capacity / total.subclients;
    const double unsatisfied = total.subclients - satisfied.subclients;
    if (unsatisfied <= 0) return std::numeric_limits<double>::infinity();
    return (capacity - satisfied.wants) / unsatisfied;
  }

 private:
  static constexpr std::size_t max_block = 128;
  static constexpr std::size_t min_block = max_block / 4;
  // Fenwick tree and block sums are updated by deltas; these bound the rounding they collect.
  static constexpr std::uint32_t exact_every = max_block;
  static constexpr std::uint32_t rebuild_every = 4096;

  // 24 bytes: the ratio is derived (the same division every time, so the order is stable).
  struct entry {
    double wants;
    double subclients;
    std::uint32_t id;
    [[nodiscard]] double ratio() const noexcept { return wants / subclients; }
  };
  using key = handle;
  struct block {
    std::vector<entry> items;
    demand_sums sums;
    std::uint32_t changes = 0;  // delta updates since the sums were last recomputed
  };

  // Strict order by (ratio, handle): handles make equal ratios distinct keys.
  static bool before(const key& a, const key& b) noexcept {
    return a.ratio < b.ratio || (a.ratio == b.ratio && a.id < b.id);
  }
  static bool entry_before(const entry& e, const key& k) noexcept {
    return before({e.ratio(), e.id}, k);
  }

  static std::size_t top_bit(std::size_t n) noexcept {
    std::size_t b = 1;
    while (b <= n / 2)
      b <<= 1;
    return n == 0 ? 0 : b;
  }

  // Sums of blocks [0, count).
  [[nodiscard]] demand_sums prefix(std::size_t count) const noexcept {
    demand_sums s;
    for (std::size_t i = count; i > 0; i -= i & (~i + 1)) {
      s.wants += fenwick_[i].wants;
      s.subclients += fenwick_[i].subclients;
    }
    return s;
  }

  void fenwick_add(std::size_t b, double wants, double subclients) noexcept {
    for (std::size_t i = b + 1; i < fenwick_.size(); i += i & (~i + 1)) {
      fenwick_[i].wants += wants;
      fenwick_[i].subclients += subclients;
    }
  }

  void rebuild_fenwick() {
    fenwick_.assign(blocks_.size() + 1, demand_sums{});
    for (std::size_t i = 1; i <= blocks_.size(); ++i) {
      fenwick_[i].wants += blocks_[i - 1].sums.wants;
      fenwick_[i].subclients += blocks_[i - 1].sums.subclients;
      const std::size_t parent = i + (i & (~i + 1));
      if (parent <= blocks_.size()) {
        fenwick_[parent].wants += fenwick_[i].wants;
        fenwick_[parent].subclients += fenwick_[i].subclients;
      }
    }
    changes_ = 0;
  }

  static void recompute(block& b) noexcept {
    b.sums = {};
    for (const entry& e : b.items) {
      b.sums.wants += e.wants;
      b.sums.subclients += e.subclients;
    }
    b.changes = 0;
  }

  // The block that holds (or would hold) key k.
  [[nodiscard]] std::size_t locate(const key& k) const noexcept {
    const auto it = std::partition_point(last_.begin(), last_.end(),
                                         [&](const key& l) { return before(l, k); });
    const auto b = static_cast<std::size_t>(it - last_.begin());
    return std::min(b, blocks_.size() - 1);
  }

  // Applies a change of `d` to block b's sums, keeping them and the Fenwick tree accurate.
  void account(std::size_t b, double wants, double subclients) {
    block& blk = blocks_[b];
    if (++blk.changes >= exact_every) {
      const demand_sums old = blk.sums;
      recompute(blk);
      fenwick_add(b, blk.sums.wants - old.wants, blk.sums.subclients - old.subclients);
    } else {
      blk.sums.wants += wants;
      blk.sums.subclients += subclients;
      fenwick_add(b, wants, subclients);
    }
    if (++changes_ >= rebuild_every) rebuild_fenwick();
  }

  void add_entry(const entry& e) {
    if (blocks_.empty()) {
      blocks_.push_back(block{{e}, {e.wants, e.subclients}, 0});
      last_.push_back({e.ratio(), e.id});
      rebuild_fenwick();
      return;
    }
    const key k{e.ratio(), e.id};
    const std::size_t b = locate(k);
    auto& items = blocks_[b].items;
    items.insert(std::partition_point(items.begin(), items.end(),
                                      [&](const entry& x) { return entry_before(x, k); }),
                 e);
    last_[b] = {items.back().ratio(), items.back().id};
    account(b, e.wants, e.subclients);
    if (items.size() > max_block) split(b);
  }

  void remove_entry(const key& k) {
    const std::size_t b = locate(k);
    auto& items = blocks_[b].items;
    const auto it = std::partition_point(items.begin(), items.end(),
                                         [&](const entry& x) { return entry_before(x, k); });
    assert(it != items.end() && it->id == k.id);
    const double wants = it->wants;
    const double subclients = it->subclients;
    items.erase(it);
    if (items.empty()) {
      blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(b));
      last_.erase(last_.begin() + static_cast<std::ptrdiff_t>(b));
      rebuild_fenwick();
      return;
    }
    last_[b] = {items.back().ratio(), items.back().id};
    account(b, -wants, -subclients);
    if (items.size() < min_block && blocks_.size() > 1) merge(b);
  }

  void split(std::size_t b) {
    block upper;
    auto& items = blocks_[b].items;
    const auto half = items.begin() + static_cast<std::ptrdiff_t>(items.size() / 2);
    upper.items.assign(half, items.end());
    items.erase(half, items.end());
    recompute(blocks_[b]);
    recompute(upper);
    last_[b] = {items.back().ratio(), items.back().id};
    const key upper_last{upper.items.back().ratio(), upper.items.back().id};
    blocks_.insert(blocks_.begin() + static_cast<std::ptrdiff_t>(b) + 1, std::move(upper));
    last_.insert(last_.begin() + static_cast<std::ptrdiff_t>(b) + 1, upper_last);
    rebuild_fenwick();
  }

  void merge(std::size_t b) {
    // Fold block b into its smaller neighbour, then split again if that made it too big.
    const bool has_left = b > 0;
    const bool has_right = b + 1 < blocks_.size();
    const std::size_t into =
        !has_right || (has_left && blocks_[b - 1].items.size() <= blocks_[b + 1].items.size())
            ? b - 1
            : b + 1;
    const std::size_t lo = std::min(b, into);
    auto& low = blocks_[lo].items;
    auto& high = blocks_[lo + 1].items;
    low.insert(low.end(), high.begin(), high.end());
    blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(lo) + 1);
    last_.erase(last_.begin() + static_cast<std::ptrdiff_t>(lo) + 1);
    last_[lo] = {blocks_[lo].items.back().ratio(), blocks_[lo].items.back().id};
    recompute(blocks_[lo]);
    if (blocks_[lo].items.size() > max_block) {
      split(lo);
    } else {
      rebuild_fenwick();
    }
  }

  std::vector<block> blocks_;
  std::vector<key> last_;             // last key of each block, for binary search
  std::vector<demand_sums> fenwick_;  // 1-based Fenwick tree over block sums
  std::vector<std::uint32_t> free_;  // ids to reuse
  std::uint32_t next_id_ = 0;
  std::size_t size_ = 0;
  std::uint32_t changes_ = 0;
};

}  // namespace doorman
