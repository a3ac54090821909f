#pragma once

/// \file
/// An order-statistics index over demands, ordered by wants per subclient, with subtree sums:
/// the structure that makes every allocation decision O(log n) in the number of clients.

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

/// A multiset of demands `(wants, subclients)` ordered by `wants / subclients`, answering in
/// O(log n) expected time: the sums of all demands below a ratio (PROPORTIONAL_SHARE), and the
/// water level of a weighted max-min fair split (FAIR_SHARE).
///
/// A randomized balanced tree (treap) over a node pool; the pool's random priorities come from
/// a fixed seed, so the same operations always build the same tree. Handles stay valid until
/// erased.
///
///     doorman::share_index idx;
///     auto a = idx.insert(1000, 6), b = idx.insert(500, 4), c = idx.insert(200, 2);
///     idx.water_level(120);  // 10: shares are 60, 40, 20
class share_index {
 public:
  using handle = std::uint32_t;

  share_index() { nodes_.push_back(node{}); }  // nodes_[0] is the empty sentinel

  /// Adds a demand; `subclients` must be > 0.
  handle insert(double wants, double subclients) {
    assert(subclients > 0);
    handle h;
    if (!free_.empty()) {
      h = free_.back();
      free_.pop_back();
    } else {
      h = static_cast<handle>(nodes_.size());
      nodes_.push_back(node{});
    }
    node& n = nodes_[h];
    n = node{};
    n.ratio = wants / subclients;
    n.wants = wants;
    n.subclients = subclients;
    n.priority = next_priority();
    pull(h);
    root_ = insert_at(root_, h);
    ++size_;
    return h;
  }

  /// Changes the demand behind `h` (the handle stays the same).
  void update(handle h, double wants, double subclients) {
    assert(subclients > 0);
    node& n = nodes_[h];
    if (n.wants == wants && n.subclients == subclients) return;
    root_ = erase_at(root_, h);
    node& m = nodes_[h];
    m.left = m.right = 0;
    m.ratio = wants / subclients;
    m.wants = wants;
    m.subclients = subclients;
    pull(h);
    root_ = insert_at(root_, h);
  }

  /// Removes the demand behind `h`.
  void erase(handle h) {
    root_ = erase_at(root_, h);
    free_.push_back(h);
    --size_;
  }

  /// The demand behind `h`.
  [[nodiscard]] demand_sums get(handle h) const noexcept {
    return {nodes_[h].wants, nodes_[h].subclients};
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  /// Sums over every demand.
  [[nodiscard]] demand_sums totals() const noexcept {
    return {nodes_[root_].sum_wants, nodes_[root_].sum_subclients};
  }

  /// Sums over the demands whose wants per subclient is strictly below `ratio`.
  [[nodiscard]] demand_sums below(double ratio) const noexcept {
    demand_sums acc;
    for (handle t = root_; t != 0;) {
      const node& n = nodes_[t];
      if (n.ratio < ratio) {
        acc.wants += nodes_[n.left].sum_wants + n.wants;
        acc.subclients += nodes_[n.left].sum_subclients + n.subclients;
        t = n.right;
      } else {
        t = n.left;
      }
    }
    return acc;
  }

  /// The level L at which `sum(min(wants_i, L * subclients_i)) == capacity`: weighted
  /// water-filling. Infinity when every demand fits (total wants <= capacity).
  [[nodiscard]] double water_level(double capacity) const noexcept {
    const node& top = nodes_[root_];
    if (top.sum_wants <= capacity) return std::numeric_limits<double>::infinity();
    // Find the longest prefix (by ratio) of demands that are fully satisfied: the prefix ending
    // at element k is satisfied iff g(k) = W(<=k) + r_k * S(>k) <= capacity, and g grows with k.
    double wants_before = 0;      // wants of everything left of the current subtree
    double subclients_after = 0;  // subclients of everything right of the current subtree
    bool found = false;
    double satisfied_wants = 0;
    double unsatisfied_subclients = 0;
    for (handle t = root_; t != 0;) {
      const node& n = nodes_[t];
      const double through = wants_before + nodes_[n.left].sum_wants + n.wants;
      const double after = subclients_after + nodes_[n.right].sum_subclients;
      if (through + n.ratio * after <= capacity) {
        found = true;
        satisfied_wants = through;
        unsatisfied_subclients = after;
        wants_before = through;
        t = n.right;
      } else {
        subclients_after = after + n.subclients;
        t = n.left;
      }
    }
    if (!found) return capacity / top.sum_subclients;
    if (unsatisfied_subclients <= 0) return std::numeric_limits<double>::infinity();
    return (capacity - satisfied_wants) / unsatisfied_subclients;
  }

 private:
  struct node {
    double ratio = 0;
    double wants = 0;
    double subclients = 0;
    double sum_wants = 0;
    double sum_subclients = 0;
    handle left = 0;
    handle right = 0;
    std::uint32_t priority = 0;
  };

  // Strict order by (ratio, handle): handles make equal ratios distinct keys.
  [[nodiscard]] bool before(handle a, handle b) const noexcept {
    const double ra = nodes_[a].ratio;
    const double rb = nodes_[b].ratio;
    return ra < rb || (ra == rb && a < b);
  }

  void pull(handle t) noexcept {
    node& n = nodes_[t];
    n.sum_wants = nodes_[n.left].sum_wants + n.wants + nodes_[n.right].sum_wants;
    n.sum_subclients =
        nodes_[n.left].sum_subclients + n.subclients + nodes_[n.right].sum_subclients;
  }

  // Splits t into keys before h (left) and keys not before h (right).
  void split(handle t, handle h, handle& left, handle& right) {
    if (t == 0) {
      left = right = 0;
      return;
    }
    if (before(t, h)) {
      handle r = 0;
      split(nodes_[t].right, h, r, right);
      nodes_[t].right = r;
      left = t;
    } else {
      handle l = 0;
      split(nodes_[t].left, h, left, l);
      nodes_[t].left = l;
      right = t;
    }
    pull(t);
  }

  handle merge(handle a, handle b) {
    if (a == 0) return b;
    if (b == 0) return a;
    if (nodes_[a].priority > nodes_[b].priority) {
      const handle r = merge(nodes_[a].right, b);
      nodes_[a].right = r;
      pull(a);
      return a;
    }
    const handle l = merge(a, nodes_[b].left);
    nodes_[b].left = l;
    pull(b);
    return b;
  }

  handle insert_at(handle t, handle h) {
    if (t == 0) return h;
    if (nodes_[h].priority > nodes_[t].priority) {
      handle l = 0;
      handle r = 0;
      split(t, h, l, r);
      nodes_[h].left = l;
      nodes_[h].right = r;
      pull(h);
      return h;
    }
    if (before(h, t)) {
      const handle l = insert_at(nodes_[t].left, h);
      nodes_[t].left = l;
    } else {
      const handle r = insert_at(nodes_[t].right, h);
      nodes_[t].right = r;
    }
    pull(t);
    return t;
  }

  handle erase_at(handle t, handle h) {
    assert(t != 0);
    if (t == h) return merge(nodes_[t].left, nodes_[t].right);
    if (before(h, t)) {
      const handle l = erase_at(nodes_[t].left, h);
      nodes_[t].left = l;
    } else {
      const handle r = erase_at(nodes_[t].right, h);
      nodes_[t].right = r;
    }
    pull(t);
    return t;
  }

  std::uint32_t next_priority() noexcept {
    // xorshift32: deterministic, so equal histories give equal trees.
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 17;
    rng_ ^= rng_ << 5;
    return rng_;
  }

  std::vector<node> nodes_;
  std::vector<handle> free_;
  handle root_ = 0;
  std::size_t size_ = 0;
  std::uint32_t rng_ = 0x9e3779b9u;
};

}  // namespace doorman
