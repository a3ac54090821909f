#pragma once

/// \file
/// An order-statistics index over demands, ordered by wants per subclient, with subtree sums:
/// the structure that makes every allocation decision cost O(log n) in the number of clients.

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <limits>
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
/// A B+-tree: leaves hold up to 64 demands in order (1.5 KiB); inner nodes hold up to 16
/// children with each child's largest key and subtree sums. A change walks one path from the
/// root (O(log n)), moves entries inside one leaf, and adds the change to the sums on the path:
/// one cache line per level, so the cost at a million demands is close to the two leaves'
/// cache misses (the upper levels stay in cache). Every 64th change recomputes its path from
/// the children instead, so rounding cannot accumulate. Nodes are never merged: a node is
/// dropped only when empty, which keeps deletion simple and the height bounded by the largest
/// size the index ever had.
/// Deterministic: the same operations always give the same state.
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
    if (height_ > 1) {
      // Walk to where the demand will go first: that walk prefetches the leaf, whose cache
      // misses then overlap with those of the removal below.
      path_type path;
      std::uint32_t leaf = 0;
      (void)descend({wants / subclients, h.id}, path, leaf);
    }
    remove(h);
    add({wants, subclients, h.id});
    h.ratio = wants / subclients;
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
    for (std::uint32_t i = 0; i < l.count && l.items[i].ratio() < ratio; ++i) {
      acc.wants += l.items[i].wants;
      acc.subclients += l.items[i].subclients;
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
      run.wants += l.items[i].wants;
      run.subclients += l.items[i].subclients;
      if (!satisfied(run, l.items[i].ratio())) break;
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

  // 24 bytes: the ratio is derived (the same division every time, so the order is stable).
  struct entry {
    double wants;
    double subclients;
    std::uint32_t id;
    [[nodiscard]] double ratio() const noexcept { return wants / subclients; }
  };
  using key = handle;

  struct leaf_node {
    std::uint32_t count = 0;
    std::array<entry, leaf_capacity> items;
  };
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
  struct step {
    std::uint32_t node;
    std::uint32_t slot;
  };
  using path_type = std::array<step, max_height>;

  // Strict order by (ratio, id): ids make equal ratios distinct keys.
  static bool before(const key& a, const key& b) noexcept {
    return a.ratio < b.ratio || (a.ratio == b.ratio && a.id < b.id);
  }
  static key key_of(const entry& e) noexcept { return {e.ratio(), e.id}; }

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
        prefetch(&leaves_[node], sizeof(leaf_node));
      } else {
        prefetch(&inners_[node], sizeof(inner_node));
      }
    }
    leaf = node;
    return depth;
  }

  static void prefetch(const void* p, std::size_t bytes) noexcept { detail::prefetch(p, bytes); }

  // Exact sums of a node at `level` (1: leaf), from its own contents.
  [[nodiscard]] demand_sums sums_of(std::uint32_t node, std::uint32_t level) const noexcept {
    demand_sums s;
    if (level == 1) {
      const leaf_node& l = leaves_[node];
      for (std::uint32_t i = 0; i < l.count; ++i) {
        s.wants += l.items[i].wants;
        s.subclients += l.items[i].subclients;
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
    if (level == 1) return key_of(leaves_[node].items[leaves_[node].count - 1]);
    return inners_[node].key_at(inners_[node].count - 1);
  }

  template <class Node>
  static std::uint32_t allocate(std::vector<Node>& pool, std::vector<std::uint32_t>& free) {
    if (!free.empty()) {
      const std::uint32_t i = free.back();
      free.pop_back();
      pool[i].count = 0;
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
      leaves_[root_].items[0] = e;
      leaves_[root_].count = 1;
      height_ = 1;
      set_total({e.wants, e.subclients});
      return;
    }
    const key k = key_of(e);
    path_type path;
    std::uint32_t leaf = 0;
    const std::uint32_t depth = descend(k, path, leaf);
    leaf_node& l = leaves_[leaf];
    std::uint32_t pos = l.count;  // a leaf is never full here: it splits on filling up
    for (; pos > 0 && before(k, key_of(l.items[pos - 1])); --pos)
      l.items[pos] = l.items[pos - 1];
    l.items[pos] = e;
    const bool new_largest = pos == l.count;
    if (++l.count < leaf_capacity) {
      propagate(path, depth, leaf, {e.wants, e.subclients}, new_largest, k);
      return;
    }
    // Split the full leaf; the upper half joins the parent right after it.
    const std::uint32_t upper = allocate(leaves_, free_leaves_);
    leaf_node& full = leaves_[leaf];  // allocate may have moved the pool
    leaf_node& u = leaves_[upper];
    const std::uint32_t half = full.count / 2;
    std::copy(full.items.begin() + half, full.items.begin() + full.count, u.items.begin());
    u.count = full.count - half;
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
    path_type path;
    std::uint32_t leaf = 0;
    std::uint32_t depth = descend(k, path, leaf);
    leaf_node& l = leaves_[leaf];
    std::uint32_t pos = 0;
    while (pos < l.count && before(key_of(l.items[pos]), k))
      ++pos;
    assert(pos < l.count && l.items[pos].id == k.id);
    const demand_sums delta{-l.items[pos].wants, -l.items[pos].subclients};
    for (std::uint32_t i = pos + 1; i < l.count; ++i)
      l.items[i - 1] = l.items[i];
    --l.count;
    if (l.count > 0) {
      const bool was_largest = pos == l.count;
      propagate(path, depth, leaf, delta, was_largest,
                was_largest ? key_of(l.items[l.count - 1]) : key{});
      return;
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
      return;
    }
    // A node was dropped (rare): exact sums on the way up.
    recompute_above(path, depth - 1, path[depth - 1].node);
    // A root with a single child hands the root to that child.
    while (height_ > 1 && inners_[root_].count == 1) {
      free_inners_.push_back(root_);
      root_ = inners_[root_].children[0];
      --height_;
    }
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
