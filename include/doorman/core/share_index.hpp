#pragma once

/// \file
/// An order-statistics index over demands, ordered by wants per subclient, with subtree sums:
/// the structure that makes every allocation decision cost O(log n) in the number of clients.

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ranges>
#include <vector>

#include "doorman/core/prefetch.hpp"

namespace doorman {

/// Sums over a set of demands.
struct demand_sums {
  double wants = 0;
  double subclients = 0;
};

namespace detail {

/// A running sum whose rounding error does not grow with the number of additions (Neumaier's
/// variant of Kahan summation): each addition's rounding error is kept exactly (TwoSum) and
/// added back, so the value is within a few units in the last place of the exact sum of every
/// term added, plus n·ε² of the terms' magnitudes. A sum of terms that cancel exactly (x, −x)
/// reads 0, not a residue.
class compensated_sum {
 public:
  void add(double x) noexcept {
    const double t = sum_ + x;
    if ((sum_ >= 0 ? sum_ : -sum_) >= (x >= 0 ? x : -x)) {
      compensation_ += (sum_ - t) + x;
    } else {
      compensation_ += (x - t) + sum_;
    }
    sum_ = t;
  }
  [[nodiscard]] double value() const noexcept { return sum_ + compensation_; }
  /// The sum without one of its terms `x`: `value() - x`, but computed so that a term that
  /// dominates the sum does not take the others with it in rounding. When x is close to the
  /// running sum, `sum - x` is exact (Sterbenz), and the compensation then holds the rest.
  [[nodiscard]] double without(double x) const noexcept { return (sum_ - x) + compensation_; }
  void reset(double start = 0) noexcept {
    sum_ = start;
    compensation_ = 0;
  }

 private:
  double sum_ = 0;
  double compensation_ = 0;
};

}  // namespace detail

/// A multiset of demands `(wants, subclients)` ordered by `wants / subclients`, answering: the
/// sums of all demands below a ratio (PROPORTIONAL_SHARE), and the water level of a weighted
/// max-min fair split (FAIR_SHARE).
///
/// A B+-tree: leaves hold up to 64 demands, each in a slot it keeps while it stays there, with
/// a byte per demand listing the slots in order; their keys (ratio, id) lie apart from their
/// sums, so that finding a place is a binary search over the ratios. Inner nodes hold up to 16
/// children with each child's largest key and subtree sums. A change walks one path from the
/// root (O(log n)), writes one slot of a leaf and moves the order bytes after it (one cache
/// line), and adds the change to the sums on the path. An update walks the old and the new place
/// together, prefetching the keys of each next node, so the two leaves' cache misses overlap. Every
/// 64th change recomputes its path from the children instead, so rounding cannot accumulate. Nodes
/// are never merged: a node is dropped only when empty, which keeps deletion simple and the height
/// bounded by the largest size the index ever had. Deterministic: the same operations always give
/// the same state.
///
///     doorman::share_index idx;
///     idx.insert(1000, 6); idx.insert(500, 4); idx.insert(200, 2);
///     idx.water_level(120);  // 10: the shares are 60, 40 and 20
class share_index {
 public:
  /// Names one demand in the index: its position key. The holder keeps it and passes it back to
  /// `update` (which changes it) and `erase`.
  struct handle {
    double ratio = 0;
    std::uint32_t id = 0;
  };

  /// Adds a demand; `subclients` must be > 0.
  handle insert(double wants, double subclients) {
    assert(subclients > 0);
    std::uint32_t id;
    if (!free_ids_.empty()) {
      id = free_ids_.back();
      free_ids_.pop_back();
    } else {
      id = next_id_++;
    }
    add({wants, subclients, id});
    ++size_;
    return {wants / subclients, id};
  }

  /// Changes the demand behind `h`, which is updated to name it.
  void update(handle& h, double wants, double subclients) {
    assert(subclients > 0);
    const entry e{wants, subclients, h.id};
    const key to = key_of(e);
    if (height_ > 1) {
      // Both walks at once, a level at a time: the cache misses of the two paths, and of the
      // two leaves, overlap instead of following one another.
      path_type from_path;
      path_type to_path;
      std::uint32_t from_leaf = 0;
      std::uint32_t to_leaf = 0;
      const std::uint32_t depth = descend_both(h, to, from_path, to_path, from_leaf, to_leaf);
      if (remove_at(h, from_path, depth, from_leaf)) {
        add_at(e, to, to_path, depth, to_leaf);
      } else {
        add(e);  // the removal dropped a node: walk again
      }
    } else {
      remove(h);
      add(e);
    }
    h.ratio = to.ratio;
  }

  /// Removes the demand behind `h`.
  void erase(const handle& h) {
    remove(h);
    free_ids_.push_back(h.id);
    --size_;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  /// Sums over every demand. Never negative: the total is kept as a compensated sum of the
  /// changes (no residue builds up as demands come and go), and clamped at 0 in case rounding
  /// still leaves one below what a sum of non-negative numbers can be.
  [[nodiscard]] demand_sums totals() const noexcept {
    return {std::max(0.0, total_wants_.value()), std::max(0.0, total_subclients_.value())};
  }

  /// Sums over the demands whose wants per subclient is strictly below `ratio`.
  [[nodiscard]] demand_sums below(double ratio) const noexcept {
    demand_sums acc;
    if (height_ == 0) return acc;
    std::uint32_t node = root_;
    for (std::uint32_t level = height_; level > 1; --level) {
      const inner_node& n = inners_[node];
      std::uint32_t i = 0;
      // Children whose largest ratio is below `ratio` are wholly below it.
      while (i + 1 < n.count && n.ratios[i] < ratio) {
        acc.wants += n.sums[i].wants;
        acc.subclients += n.sums[i].subclients;
        ++i;
      }
      node = n.children[i];
    }
    const leaf_node& l = leaves_[node];
    for (std::uint32_t i = 0; i < l.count && l.ratios[l.order[i]] < ratio; ++i) {
      acc.wants += l.sums_in_order(i).wants;
      acc.subclients += l.sums_in_order(i).subclients;
    }
    return acc;
  }

  /// The level L at which `sum(min(wants_i, L * subclients_i)) == capacity`: weighted
  /// water-filling. Infinity when every demand fits (total wants <= capacity).
  [[nodiscard]] double water_level(double capacity) const noexcept {
    const demand_sums total = totals();
    if (total.wants <= capacity) return std::numeric_limits<double>::infinity();
    // In ratio order, the prefix ending at element k is fully satisfied iff
    // g(k) = W(<= k) + ratio_k * S(> k) <= capacity, and g never decreases with k. Descend,
    // taking every whole child whose last element satisfies it, into the first that does not.
    demand_sums through;  // sums of everything known to be satisfied
    bool found = false;
    auto satisfied = [&](const demand_sums& run, double ratio) {
      return run.wants + ratio * (total.subclients - run.subclients) <= capacity;
    };
    std::uint32_t node = root_;
    for (std::uint32_t level = height_; level > 1; --level) {
      const inner_node& n = inners_[node];
      std::uint32_t i = 0;
      for (; i + 1 < n.count; ++i) {
        const demand_sums run{through.wants + n.sums[i].wants,
                              through.subclients + n.sums[i].subclients};
        if (!satisfied(run, n.ratios[i])) break;
        through = run;
        found = true;
      }
      node = n.children[i];
    }
    const leaf_node& l = leaves_[node];
    demand_sums run = through;
    for (std::uint32_t i = 0; i < l.count; ++i) {
      run.wants += l.sums_in_order(i).wants;
      run.subclients += l.sums_in_order(i).subclients;
      if (!satisfied(run, l.ratios[l.order[i]])) break;
      through = run;
      found = true;
    }
    if (!found) return capacity / total.subclients;
    const double unsatisfied = total.subclients - through.subclients;
    if (unsatisfied <= 0) return std::numeric_limits<double>::infinity();
    return (capacity - through.wants) / unsatisfied;
  }

 private:
  static constexpr std::uint32_t leaf_capacity = 64;
  static constexpr std::uint32_t fanout = 16;
  static constexpr std::uint32_t max_height = 32;
  static constexpr std::uint32_t exact_every = 64;

  struct entry {
    double wants;
    double subclients;
    std::uint32_t id;
  };
  using key = handle;

  // Entries stay in the slot where they were added; `order` lists the slots in key order. A
  // change moves one byte per entry after it (one cache line), not the entries, so it writes
  // only the lines of the slot it changes. Keys apart from the demands: finding a position
  // reads the order and the ratios (a binary search touches 6 of their 8 lines); the ids are
  // read only to break a tie of ratios.
  struct alignas(64) leaf_node {
    std::array<std::uint8_t, leaf_capacity> order;  // slots, in key order; [0, count) in use
    std::uint32_t count = 0;
    std::uint64_t used = 0;                        // bit s: slot s holds an entry
    std::array<double, leaf_capacity> ratios;      // wants / subclients, computed once
    std::array<demand_sums, leaf_capacity> sums;   // (wants, subclients)
    std::array<std::uint32_t, leaf_capacity> ids;  // with the ratio, the key
    [[nodiscard]] key key_at(std::uint32_t slot) const noexcept {
      return {ratios[slot], ids[slot]};
    }
    // The key at position i of the order.
    [[nodiscard]] key key_in_order(std::uint32_t i) const noexcept { return key_at(order[i]); }
    [[nodiscard]] const demand_sums& sums_in_order(std::uint32_t i) const noexcept {
      return sums[order[i]];
    }
    // The first position whose key is not before k.
    [[nodiscard]] std::uint32_t lower_bound(const key& k) const noexcept {
      return *std::ranges::partition_point(
          std::views::iota(std::uint32_t{0}, count),
          [&](std::uint32_t i) { return before(key_in_order(i), k); });
    }
    // Puts (k, d) at position i of the order, in a free slot (the leaf is not full).
    void insert_at(std::uint32_t i, const key& k, const demand_sums& d) noexcept {
      const auto slot = static_cast<std::uint32_t>(std::countr_one(used));
      ratios[slot] = k.ratio;
      ids[slot] = k.id;
      sums[slot] = d;
      mark(slot, true);
      std::memmove(&order[i + 1], &order[i], count - i);
      order[i] = static_cast<std::uint8_t>(slot);
      ++count;
    }
    void mark(std::uint32_t slot, bool in_use) noexcept {
      const std::uint64_t bit = std::uint64_t{1} << slot;
      used = in_use ? used | bit : used & ~bit;
    }
    // Takes position i out of the order and frees its slot.
    void erase_at(std::uint32_t i) noexcept {
      mark(order[i], false);
      std::memmove(&order[i], &order[i + 1], count - i - 1);
      --count;
    }
  };
  static_assert(leaf_capacity <= 64, "a leaf's slots are the bits of one 64-bit word");
  // Ratios apart from ids, so that choosing a child scans one or two cache lines.
  struct inner_node {
    std::uint32_t count = 0;
    std::array<double, fanout> ratios;      // largest key of each child: ratio...
    std::array<std::uint32_t, fanout> ids;  // ...and id
    std::array<std::uint32_t, fanout> children;
    std::array<demand_sums, fanout> sums;  // each child's subtree sums
    [[nodiscard]] key key_at(std::uint32_t i) const noexcept { return {ratios[i], ids[i]}; }
    void set_key(std::uint32_t i, const key& k) noexcept {
      ratios[i] = k.ratio;
      ids[i] = k.id;
    }
    void move_slot(std::uint32_t to, std::uint32_t from) noexcept {
      ratios[to] = ratios[from];
      ids[to] = ids[from];
      children[to] = children[from];
      sums[to] = sums[from];
    }
  };
  // What a walk reads of a node before it knows which entry it wants: the keys (and, in an
  // inner node, the children), not the sums. Only these lines are prefetched.
  static constexpr std::size_t keys_of_leaf = offsetof(leaf_node, sums);  // order and ratios
  static constexpr std::size_t keys_of_inner = offsetof(inner_node, sums);
  struct step {
    std::uint32_t node;
    std::uint32_t slot;
  };
  using path_type = std::array<step, max_height>;

  // Strict order by (ratio, id): ids make equal ratios distinct keys.
  static bool before(const key& a, const key& b) noexcept {
    return a.ratio < b.ratio || (a.ratio == b.ratio && a.id < b.id);
  }
  static key key_of(const entry& e) noexcept { return {e.wants / e.subclients, e.id}; }

  // The child of inner node n that holds (or would hold) key k.
  static std::uint32_t child_for(const inner_node& n, const key& k) noexcept {
    std::uint32_t i = 0;
    while (i + 1 < n.count &&
           (n.ratios[i] < k.ratio || (n.ratios[i] == k.ratio && n.ids[i] < k.id))) {
      ++i;
    }
    return i;
  }

  // Walks from the root to the leaf for k. Returns the path length (the number of inner nodes).
  std::uint32_t descend(const key& k, path_type& path, std::uint32_t& leaf) const noexcept {
    std::uint32_t depth = 0;
    std::uint32_t node = root_;
    for (std::uint32_t level = height_; level > 1; --level) {
      const std::uint32_t i = child_for(inners_[node], k);
      path[depth++] = {node, i};
      node = inners_[node].children[i];
      // Ask for all of the next node's lines at once: its misses then overlap instead of
      // following one another (count, then the entry it points to, ...).
      if (level == 2) {
        prefetch(&leaves_[node], keys_of_leaf);
      } else {
        prefetch(&inners_[node], keys_of_inner);
      }
    }
    leaf = node;
    return depth;
  }

  // As descend, for two keys together (their paths have the same length).
  std::uint32_t descend_both(const key& a, const key& b, path_type& path_a, path_type& path_b,
                             std::uint32_t& leaf_a, std::uint32_t& leaf_b) const noexcept {
    std::uint32_t depth = 0;
    std::uint32_t node_a = root_;
    std::uint32_t node_b = root_;
    for (std::uint32_t level = height_; level > 1; --level) {
      const std::uint32_t i = child_for(inners_[node_a], a);
      const std::uint32_t j = child_for(inners_[node_b], b);
      path_a[depth] = {node_a, i};
      path_b[depth++] = {node_b, j};
      node_a = inners_[node_a].children[i];
      node_b = inners_[node_b].children[j];
      if (level == 2) {
        prefetch(&leaves_[node_a], keys_of_leaf);
        if (node_b != node_a) prefetch(&leaves_[node_b], keys_of_leaf);
      } else {
        prefetch(&inners_[node_a], keys_of_inner);
        if (node_b != node_a) prefetch(&inners_[node_b], keys_of_inner);
      }
    }
    leaf_a = node_a;
    leaf_b = node_b;
    return depth;
  }

  static void prefetch(const void* p, std::size_t bytes) noexcept { detail::prefetch(p, bytes); }

  // Exact sums of a node at `level` (1: leaf), from its own contents.
  [[nodiscard]] demand_sums sums_of(std::uint32_t node, std::uint32_t level) const noexcept {
    demand_sums s;
    if (level == 1) {
      const leaf_node& l = leaves_[node];
      for (std::uint32_t i = 0; i < l.count; ++i) {
        s.wants += l.sums_in_order(i).wants;
        s.subclients += l.sums_in_order(i).subclients;
      }
    } else {
      const inner_node& n = inners_[node];
      for (std::uint32_t i = 0; i < n.count; ++i) {
        s.wants += n.sums[i].wants;
        s.subclients += n.sums[i].subclients;
      }
    }
    return s;
  }
  [[nodiscard]] key largest_of(std::uint32_t node, std::uint32_t level) const noexcept {
    if (level == 1) return leaves_[node].key_in_order(leaves_[node].count - 1);
    return inners_[node].key_at(inners_[node].count - 1);
  }

  template <class Node>
  static std::uint32_t allocate(std::vector<Node>& pool, std::vector<std::uint32_t>& free) {
    if (!free.empty()) {
      const std::uint32_t i = free.back();
      free.pop_back();
      pool[i] = Node{};
      return i;
    }
    pool.emplace_back();
    return static_cast<std::uint32_t>(pool.size() - 1);
  }

  // Recomputes exactly, from the children, the sums and keys of path[0..depth), where `child`
  // is the node below path[depth-1]; then the total.
  void recompute_above(const path_type& path, std::uint32_t depth, std::uint32_t child) noexcept {
    for (std::uint32_t d = depth; d-- > 0;) {
      const std::uint32_t child_level = height_ - d - 1;
      inner_node& n = inners_[path[d].node];
      n.sums[path[d].slot] = sums_of(child, child_level);
      n.set_key(path[d].slot, largest_of(child, child_level));
      child = path[d].node;
    }
    set_total(sums_of(root_, height_));
  }

  void set_total(const demand_sums& s) noexcept {
    total_wants_.reset(s.wants);
    total_subclients_.reset(s.subclients);
  }

  // After a change in `leaf` (below path[depth-1]) that changed its sums by `delta` and, when
  // `key_changed`, its largest key to `largest`: one cache line per level in the common case.
  // Every `exact_every` changes the path is recomputed from the children instead, which bounds
  // the rounding that deltas collect.
  void propagate(const path_type& path, std::uint32_t depth, std::uint32_t leaf, demand_sums delta,
                 bool key_changed, key largest) noexcept {
    if (++changes_ % exact_every == 0) {
      recompute_above(path, depth, leaf);
      return;
    }
    for (std::uint32_t d = depth; d-- > 0;) {
      inner_node& n = inners_[path[d].node];
      const std::uint32_t i = path[d].slot;
      n.sums[i].wants += delta.wants;
      n.sums[i].subclients += delta.subclients;
      if (key_changed) {
        n.set_key(i, largest);
        key_changed = i + 1 == n.count;  // only the last child's key is the node's own
      }
    }
    total_wants_.add(delta.wants);
    total_subclients_.add(delta.subclients);
  }

  void add(const entry& e) {
    if (height_ == 0) {
      root_ = allocate(leaves_, free_leaves_);
      leaves_[root_].insert_at(0, key_of(e), {e.wants, e.subclients});
      height_ = 1;
      set_total({e.wants, e.subclients});
      return;
    }
    const key k = key_of(e);
    path_type path;
    std::uint32_t leaf = 0;
    const std::uint32_t depth = descend(k, path, leaf);
    add_at(e, k, path, depth, leaf);
  }

  // Adds e (whose key is k) to `leaf`, reached by path[0..depth).
  void add_at(const entry& e, const key& k, const path_type& path, std::uint32_t depth,
              std::uint32_t leaf) {
    leaf_node& l = leaves_[leaf];
    const std::uint32_t pos = l.lower_bound(k);  // a leaf is never full here: it splits on filling
    const bool new_largest = pos == l.count;
    l.insert_at(pos, k, {e.wants, e.subclients});
    if (l.count < leaf_capacity) {
      propagate(path, depth, leaf, {e.wants, e.subclients}, new_largest, k);
      return;
    }
    // Split the full leaf; the upper half joins the parent right after it.
    const std::uint32_t upper = allocate(leaves_, free_leaves_);
    leaf_node& full = leaves_[leaf];  // allocate may have moved the pool
    leaf_node& u = leaves_[upper];
    const std::uint32_t half = full.count / 2;
    for (std::uint32_t i = half; i < full.count; ++i) {
      const std::uint32_t slot = full.order[i];
      u.insert_at(i - half, full.key_at(slot), full.sums[slot]);
      full.mark(slot, false);
    }
    full.count = half;
    insert_child(path, depth, leaf, upper, 1);
  }

  // Node `left` at `level` has just split into itself and `right`: inserts `right` into the
  // parent (path[depth-1]), splitting upwards as needed, then recomputes the path exactly.
  void insert_child(const path_type& path, std::uint32_t depth, std::uint32_t left,
                    std::uint32_t right, std::uint32_t level) {
    while (true) {
      if (depth == 0) {  // the root split: a new root adopts both halves
        const std::uint32_t r = allocate(inners_, free_inners_);
        inner_node& n = inners_[r];
        n.count = 2;
        n.children[0] = left;
        n.children[1] = right;
        n.sums[0] = sums_of(left, level);
        n.sums[1] = sums_of(right, level);
        n.set_key(0, largest_of(left, level));
        n.set_key(1, largest_of(right, level));
        root_ = r;
        ++height_;
        set_total(sums_of(root_, height_));
        return;
      }
      const std::uint32_t parent = path[depth - 1].node;
      const std::uint32_t at = path[depth - 1].slot;
      {
        inner_node& n = inners_[parent];
        for (std::uint32_t j = n.count; j > at + 1; --j)
          n.move_slot(j, j - 1);
        n.children[at + 1] = right;
        n.sums[at] = sums_of(left, level);
        n.sums[at + 1] = sums_of(right, level);
        n.set_key(at, largest_of(left, level));
        n.set_key(at + 1, largest_of(right, level));
        if (++n.count < fanout) break;
      }
      const std::uint32_t sibling = allocate(inners_, free_inners_);
      inner_node& full = inners_[parent];
      inner_node& s = inners_[sibling];
      const std::uint32_t half = full.count / 2;
      for (std::uint32_t j = half; j < full.count; ++j) {
        s.ratios[j - half] = full.ratios[j];
        s.ids[j - half] = full.ids[j];
        s.children[j - half] = full.children[j];
        s.sums[j - half] = full.sums[j];
      }
      s.count = full.count - half;
      full.count = half;
      left = parent;
      right = sibling;
      ++level;
      --depth;
    }
    recompute_above(path, depth - 1, path[depth - 1].node);
  }

  void remove(const key& k) {
    assert(height_ > 0);
    path_type path{};  // (only the first `depth` steps are read)
    std::uint32_t leaf = 0;
    const std::uint32_t depth = descend(k, path, leaf);
    (void)remove_at(k, path, depth, leaf);
  }

  // Removes k from `leaf`, reached by path[0..depth). False when that dropped a node (the
  // leaf was left empty): other paths taken before are then no longer valid.
  bool remove_at(const key& k, const path_type& path, std::uint32_t depth, std::uint32_t leaf) {
    leaf_node& l = leaves_[leaf];
    const std::uint32_t pos = l.lower_bound(k);
    assert(pos < l.count && l.ids[l.order[pos]] == k.id);
    const demand_sums& old = l.sums_in_order(pos);
    const demand_sums delta{-old.wants, -old.subclients};
    l.erase_at(pos);
    if (l.count > 0) {
      const bool was_largest = pos == l.count;
      propagate(path, depth, leaf, delta, was_largest,
                was_largest ? l.key_in_order(l.count - 1) : key{});
      return true;
    }
    // An empty leaf leaves its parent; an inner node left empty leaves its own parent.
    free_leaves_.push_back(leaf);
    while (depth > 0) {
      inner_node& n = inners_[path[depth - 1].node];
      for (std::uint32_t j = path[depth - 1].slot + 1; j < n.count; ++j)
        n.move_slot(j - 1, j);
      if (--n.count > 0) break;
      free_inners_.push_back(path[depth - 1].node);
      --depth;
    }
    if (depth == 0) {  // the tree is empty
      height_ = 0;
      set_total({});
      return false;
    }
    // A node was dropped (rare): exact sums on the way up.
    recompute_above(path, depth - 1, path[depth - 1].node);
    // A root with a single child hands the root to that child.
    while (height_ > 1 && inners_[root_].count == 1) {
      free_inners_.push_back(root_);
      root_ = inners_[root_].children[0];
      --height_;
    }
    return false;
  }

  std::vector<leaf_node> leaves_;
  std::vector<inner_node> inners_;
  std::vector<std::uint32_t> free_leaves_;
  std::vector<std::uint32_t> free_inners_;
  std::vector<std::uint32_t> free_ids_;
  std::uint32_t next_id_ = 0;
  std::uint32_t root_ = 0;
  std::uint32_t height_ = 0;  // 0: empty; 1: the root is a leaf
  std::size_t size_ = 0;
  // The root's sums, kept by adding each change (compensated) and set exactly on a recompute.
  detail::compensated_sum total_wants_;
  detail::compensated_sum total_subclients_;
  std::uint32_t changes_ = 0;
};

}  // namespace doorman
