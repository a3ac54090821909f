#pragma once

/// \file
/// The per-resource lease store: every client's demand (wants and subclients per priority
/// band), its lease, running sums, an order-statistics index per priority, and an
/// expiry-ordered queue so that expired leases are removed without scanning.

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "doorman/core/id_table.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/share_index.hpp"

namespace doorman {

/// A demand at one priority: `wants` on behalf of `subclients` end clients (1 for a client,
/// the number of clients a server child aggregates).
struct band_demand {
  std::int64_t priority = 0;
  double wants = 0;
  double subclients = 1;

  friend bool operator==(const band_demand&, const band_demand&) = default;
};

namespace detail {

/// A client's demand bands with their index positions. Almost every client has one band, so
/// the first lives inline: a refresh touches no memory beyond the client record, and the others
/// cost a pointer until there are any.
class band_list {
 public:
  struct slot {
    band_demand demand;
    share_index::handle handle;
  };

  class iterator {
   public:
    using value_type = band_demand;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    iterator(const band_list* l, std::size_t i) : list_(l), i_(i) {}
    const band_demand& operator*() const { return list_->at(i_).demand; }
    const band_demand* operator->() const { return &list_->at(i_).demand; }
    iterator& operator++() {
      ++i_;
      return *this;
    }
    iterator operator++(int) {
      iterator t = *this;
      ++i_;
      return t;
    }
    friend bool operator==(const iterator& a, const iterator& b) { return a.i_ == b.i_; }

   private:
    const band_list* list_ = nullptr;
    std::size_t i_ = 0;
  };

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] iterator begin() const { return {this, 0}; }
  [[nodiscard]] iterator end() const { return {this, size_}; }
  [[nodiscard]] const slot& at(std::size_t i) const { return i == 0 ? first_ : (*rest_)[i - 1]; }
  [[nodiscard]] slot& at(std::size_t i) { return i == 0 ? first_ : (*rest_)[i - 1]; }

  void push_back(const slot& s) {
    if (size_ == 0) {
      first_ = s;
    } else {
      if (!rest_) rest_ = std::make_unique<std::vector<slot>>();
      rest_->push_back(s);
    }
    ++size_;
  }
  void clear() noexcept {
    rest_.reset();
    size_ = 0;
  }
  /// A plain copy of the demands (for status pages).
  [[nodiscard]] std::vector<band_demand> to_vector() const { return {begin(), end()}; }

 private:
  slot first_{};
  std::unique_ptr<std::vector<slot>> rest_;  // the bands after the first, when there are any
  std::uint32_t size_ = 0;
};

}  // namespace detail

/// The leases and demands of one resource's clients.
///
/// Cost: lookups O(1); a demand or lease change O(log n); `expire(now)` O(k log n) for k
/// expired leases. The sums of leases (and of what is held) are compensated and take every
/// change as two terms (old out, new in), so they do not drift over millions of updates and a
/// small lease next to a huge one is not lost; they start again from exactly 0 whenever the
/// store empties.
template <class TimePoint>
class basic_lease_store {
 public:
  using time_point = TimePoint;
  using lease_type = basic_lease<TimePoint>;

  /// What the store knows of one client: about 140 bytes (plus its id beyond 15 bytes, its
  /// index entry, its hash cell and its expiry entry), the fields only a server child needs
  /// kept apart.
  struct client {
    std::string id;
    lease_type lease;            ///< what the client has (capacity 0 until assigned)
    time_point last_decision{};  ///< when the algorithm last ran for this client
    detail::band_list bands;     ///< its demand, one entry per priority
    bool is_server = false;      ///< asked through get_server_capacity
    /// A larger lease the client may still hold: its lease was cut while the larger one was
    /// live, and it has not yet said it has the cut one (the answer may have been lost; a
    /// lease cannot be revoked). 0 when none. Counts as held until `confirm_cut` clears it.
    double uncut = 0;
    time_point uncut_until{};  ///< when that larger lease ends

    /// A server child's own grants, as it reported them.
    [[nodiscard]] double outstanding() const noexcept { return server_ ? server_->outstanding : 0; }
    /// A server child that came back without its lease (a new master, learning) may still
    /// have its predecessor's grants out beneath it: they count as outstanding until then.
    [[nodiscard]] double relearn_floor() const noexcept {
      return server_ ? server_->relearn_floor : 0;
    }
    [[nodiscard]] time_point relearn_until() const noexcept {
      return server_ ? server_->relearn_until : time_point{};
    }

    /// Sum of wants over the bands.
    [[nodiscard]] double wants() const noexcept { return sum_over(bands, &band_demand::wants); }
    /// Sum of subclients over the bands.
    [[nodiscard]] double subclients() const noexcept {
      return sum_over(bands, &band_demand::subclients);
    }

   private:
    friend class basic_lease_store;
    struct server_part {
      double outstanding = 0;
      double relearn_floor = 0;
      time_point relearn_until{};
    };
    server_part& server() {
      if (!server_) server_ = std::make_unique<server_part>();
      return *server_;
    }
    std::unique_ptr<server_part> server_;  // only for a server child
    std::uint32_t slot_ = 0;
  };

  basic_lease_store() = default;
  basic_lease_store(const basic_lease_store&) = delete;  // handles point into this store
  basic_lease_store& operator=(const basic_lease_store&) = delete;
  basic_lease_store(basic_lease_store&&) noexcept = default;
  basic_lease_store& operator=(basic_lease_store&&) noexcept = default;

  /// The client `id`, or null.
  [[nodiscard]] const client* find(std::string_view id) const {
    const std::uint32_t slot = slot_of(id);
    return slot == detail::id_table::npos ? nullptr : &clients_[slot];
  }

  /// Hints for a caller about to decide for several clients (they change nothing):
  /// `prefetch_cell` brings the hash cell of `id` into cache, and `prefetch_client`, once the
  /// cell has had time to arrive, the client's record.
  void prefetch_cell(std::string_view id) const noexcept { slots_.prefetch(id); }
  void prefetch_client(std::string_view id) const noexcept {
    const std::uint32_t slot = slots_.likely_slot(id);
    if (slot != detail::id_table::npos) detail::prefetch(&clients_[slot], sizeof(client));
  }

  /// What `set_demand` returns: the client, and whether the call created it.
  struct demand_result {
    const client& who;
    bool created;
  };

  /// Records `id`'s demand (`id` non-empty), creating the client (with an empty lease) when new.
  /// Bands must have distinct priorities and subclients > 0. The client's lease and last
  /// decision are left as they were. A new client must then get a lease (`set_lease`): that is
  /// what puts it in the expiry order.
  demand_result set_demand(std::string_view id, std::span<const band_demand> bands) {
    assert(!id.empty());
    std::uint32_t slot = slot_of(id);
    const bool created = slot == detail::id_table::npos;
    if (created) {
      if (!free_slots_.empty()) {
        slot = free_slots_.back();
        free_slots_.pop_back();
      } else {
        slot = static_cast<std::uint32_t>(clients_.size());
        clients_.emplace_back();
        generations_.push_back(0);
      }
      clients_[slot].id.assign(id);
      slots_.insert(id, slot);
      ++size_;
    }
    client& c = clients_[slot];
    c.slot_ = slot;
    // Keep positions where the priority is unchanged (the common refresh), move the rest.
    if (c.bands.size() == bands.size() &&
        std::equal(
            bands.begin(), bands.end(), c.bands.begin(),
            [](const band_demand& a, const band_demand& b) { return a.priority == b.priority; })) {
      for (std::size_t i = 0; i < bands.size(); ++i) {
        auto& slot_band = c.bands.at(i);
        if (slot_band.demand == bands[i]) continue;
        index_for(bands[i].priority).update(slot_band.handle, bands[i].wants, bands[i].subclients);
        slot_band.demand = bands[i];
      }
    } else {
      remove_bands(c);
      for (const auto& b : bands) {
        c.bands.push_back({b, index_for(b.priority).insert(b.wants, b.subclients)});
      }
    }
    return {c, created};
  }

  /// Gives client `who` (as returned by `set_demand`) the lease `l`, decided at `now`. With
  /// `keep_cut`, a cut of a live lease keeps the larger one as held (`client::uncut`) until
  /// the client confirms the cut or the larger lease ends; the client stays in the store until
  /// then.
  void set_lease(const client& who, const lease_type& l, time_point now, bool keep_cut = true) {
    client& c = clients_[who.slot_];
    double uncut = now < c.uncut_until ? c.uncut : 0.0;
    time_point until = uncut > 0 ? c.uncut_until : time_point{};
    if (keep_cut && !c.lease.expired(now) && c.lease.capacity > uncut) {
      uncut = c.lease.capacity;
      until = std::max(until, c.lease.expiry);
    }
    if (uncut <= l.capacity) {
      uncut = 0;
      until = {};
    }
    // The old and new values go in as two terms, never as their difference: a difference is
    // rounded before the compensated sum sees it (replacing 1e300 by 33.3 would add -1e300).
    sum_has_.add(-c.lease.capacity);
    sum_has_.add(l.capacity);
    sum_held_.add(-held(c));
    c.lease = l;
    c.uncut = uncut;
    c.uncut_until = until;
    sum_held_.add(held(c));
    c.last_decision = now;
    push_expiry({std::max(l.expiry, until), c.slot_, ++generations_[c.slot_]});
  }

  /// Client `who` says it has `reported` (0: nothing live): a cut it has received, or a larger
  /// lease that has ended by `now`, no longer counts (`client::uncut`).
  void confirm_cut(const client& who, double reported, time_point now) {
    client& c = clients_[who.slot_];
    if (c.uncut <= 0) return;
    if (reported > c.lease.capacity * (1 + 1e-9) + 1e-9 && now < c.uncut_until) return;
    sum_held_.add(-held(c));
    c.uncut = 0;
    c.uncut_until = {};
    sum_held_.add(held(c));
  }

  /// Client `who` spent `units` of what it holds (a budget's allotment): its lease, and a
  /// larger one it may still hold, shrink by them (never below 0).
  void consume(const client& who, double units) {
    client& c = clients_[who.slot_];
    sum_has_.add(-c.lease.capacity);
    sum_held_.add(-held(c));
    c.lease.capacity = std::max(0.0, c.lease.capacity - units);
    c.uncut = std::max(0.0, c.uncut - units);
    sum_has_.add(c.lease.capacity);
    sum_held_.add(held(c));
  }

  /// A server child `who` lost its state: what it held counts as outstanding until `until`.
  void set_relearn(const client& who, double floor, time_point until) {
    client& c = clients_[who.slot_];
    c.server().relearn_floor = floor;
    c.server().relearn_until = until;
  }

  /// Records what server child `who` reports as granted to its own clients.
  void set_server_info(const client& who, double outstanding) {
    client& c = clients_[who.slot_];
    if (!c.is_server) ++servers_;
    c.is_server = true;
    sum_held_.add(-held(c));
    c.server().outstanding = outstanding;
    sum_held_.add(held(c));
  }

  /// Forgets `id`, freeing its capacity and demand. Returns whether it was known.
  bool erase(std::string_view id) {
    const std::uint32_t slot = slot_of(id);
    if (slot == detail::id_table::npos) return false;
    remove_slot(slot);
    return true;
  }

  /// Removes every client whose lease has expired at `now`. Returns how many were removed.
  std::size_t expire(time_point now) {
    std::size_t removed = 0;
    for (;;) {
      expiry_entry e;
      if (!in_order_.empty() &&
          (out_of_order_.empty() || in_order_.front().expiry <= out_of_order_.top().expiry)) {
        e = in_order_.front();
        if (e.expiry > now) break;
        in_order_.pop_front();
      } else if (!out_of_order_.empty()) {
        e = out_of_order_.top();
        if (e.expiry > now) break;
        out_of_order_.pop();
      } else {
        break;
      }
      // Only the entry of the client's current lease counts; older ones are stale.
      if (live(e)) {
        remove_slot(e.slot);
        ++removed;
      }
    }
    return removed;
  }

  /// Number of clients.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  /// Entries in the expiry order, stale ones included: at most 2 `size()` + 64.
  [[nodiscard]] std::size_t expiry_entries() const noexcept {
    return in_order_.size() + out_of_order_.size();
  }

  /// Sum of the capacity of every lease held (never negative: rounding in the running sum is
  /// clamped, since a negative `outstanding` would be refused by a parent).
  [[nodiscard]] double sum_has() const noexcept {
    return size_ == 0 ? 0.0 : std::max(0.0, sum_has_.value());
  }

  /// What `who` holds as far as the capacity is concerned: its lease; a larger lease it may
  /// still hold (`client::uncut`); for a server child whose own grants exceed its lease (its
  /// lease shrank; leases cannot be revoked), those grants, until it reports less.
  [[nodiscard]] static double held(const client& who) noexcept {
    return std::max(who.lease.capacity + excess_of(who), who.uncut);
  }

  /// The sum of `held` over every client.
  [[nodiscard]] double sum_held() const noexcept {
    return size_ == 0 ? 0.0 : std::max(0.0, sum_held_.value());
  }

  /// What every client but `who` holds (`sum_held() - held(who)`), accurate to the others' own
  /// magnitude even when `who` holds far more than all of them together.
  [[nodiscard]] double held_by_others(const client& who) const noexcept {
    return std::max(0.0, sum_held_.without(held(who)));
  }

  /// The leases of every client but `who` (`sum_has() - who's lease`), likewise accurate.
  [[nodiscard]] double leased_by_others(const client& who) const noexcept {
    return std::max(0.0, sum_has_.without(who.lease.capacity));
  }

  /// Sums of wants and subclients over every band of every client.
  [[nodiscard]] demand_sums totals() const noexcept {
    demand_sums t;
    for (const auto& [priority, idx] : bands_) {
      const auto s = idx.totals();
      t.wants += s.wants;
      t.subclients += s.subclients;
    }
    return t;
  }

  /// How many of the clients are server children (asked through get_server_capacity).
  [[nodiscard]] std::size_t servers() const noexcept { return servers_; }

  /// Calls `f(priority, demand_sums)` for every priority band, highest priority first.
  template <class F>
  void for_each_band(F&& f) const {
    for (const auto& [priority, idx] : bands_)
      f(priority, idx.totals());
  }

  /// The index of the demands at `priority`, or null when there are none.
  [[nodiscard]] const share_index* band(std::int64_t priority) const {
    const auto it = bands_.find(priority);
    return it == bands_.end() ? nullptr : &it->second;
  }

  /// What is left of `capacity` for `priority` after every higher priority's wants.
  [[nodiscard]] double band_capacity(std::int64_t priority, double capacity) const noexcept {
    double left = capacity;
    for (const auto& [p, idx] : bands_) {
      if (p <= priority) break;
      left -= idx.totals().wants;
    }
    return std::max(0.0, left);
  }

  /// Calls `f(const client&)` for every client (for status pages; O(n)).
  template <class F>
  void for_each(F&& f) const {
    for (const client& c : clients_) {
      if (!c.id.empty()) f(c);  // freed slots have an empty id
    }
  }

  /// The clients in id order from `offset`, at most `limit` of them (all when none): O(n) to
  /// pick the page (partitions, not a full sort), then O(page × log page).
  [[nodiscard]] std::vector<const client*> page(std::size_t offset,
                                                std::optional<std::size_t> limit) const {
    std::vector<const client*> all;
    all.reserve(size());
    for_each([&](const client& c) { all.push_back(&c); });
    const auto by_id = [](const client* a, const client* b) { return a->id < b->id; };
    const std::size_t from = std::min(all.size(), offset);
    const std::size_t to = limit ? std::min(all.size(), from + *limit) : all.size();
    const auto first = all.begin() + static_cast<std::ptrdiff_t>(from);
    const auto last = all.begin() + static_cast<std::ptrdiff_t>(to);
    if (from > 0) std::nth_element(all.begin(), first, all.end(), by_id);
    if (to < all.size()) std::nth_element(first, last, all.end(), by_id);
    std::sort(first, last, by_id);
    return {first, last};
  }

 private:
  struct expiry_entry {
    time_point expiry{};
    std::uint32_t slot = 0;
    std::uint32_t generation = 0;
  };
  struct later {
    bool operator()(const expiry_entry& a, const expiry_entry& b) const noexcept {
      return a.expiry > b.expiry;
    }
  };

  // Leases of one resource mostly expire in the order they were granted (same lease length),
  // so a FIFO holds them; the rare earlier expiry (a capped lease, a config change) goes to a
  // heap. Both are ordered, so expire() pops only what has expired.
  // A refresh leaves its client's previous entry stale; once stale entries could outnumber
  // live ones, they are dropped (O(entries), after at least size() + 64 pushes: O(1) amortized),
  // so the queue holds at most 2 size() + 64 entries however often clients refresh.
  void push_expiry(const expiry_entry& e) {
    if (expiry_entries() >= 2 * size_ + 64) drop_stale_expiries();
    if (in_order_.empty() || in_order_.back().expiry <= e.expiry) {
      in_order_.push_back(e);
    } else {
      out_of_order_.push(e);
    }
  }

  [[nodiscard]] bool live(const expiry_entry& e) const noexcept {
    return generations_[e.slot] == e.generation;
  }

  void drop_stale_expiries() {
    std::erase_if(in_order_, [this](const expiry_entry& e) { return !live(e); });
    std::vector<expiry_entry> rest;
    rest.reserve(out_of_order_.size());
    for (; !out_of_order_.empty(); out_of_order_.pop()) {
      if (live(out_of_order_.top())) rest.push_back(out_of_order_.top());
    }
    out_of_order_ = decltype(out_of_order_)(later{}, std::move(rest));
  }

  static double excess_of(const client& c) noexcept {
    return c.is_server ? std::max(0.0, c.outstanding() - c.lease.capacity) : 0.0;
  }

  share_index& index_for(std::int64_t priority) { return bands_[priority]; }

  void remove_bands(client& c) {
    for (std::size_t i = 0; i < c.bands.size(); ++i) {
      const auto& b = c.bands.at(i);
      const auto it = bands_.find(b.demand.priority);
      it->second.erase(b.handle);
      if (it->second.empty()) bands_.erase(it);
    }
    c.bands.clear();
  }

  [[nodiscard]] std::uint32_t slot_of(std::string_view id) const noexcept {
    return slots_.find(id, [this](std::uint32_t s) -> std::string_view { return clients_[s].id; });
  }

  void remove_slot(std::uint32_t slot) {
    client& c = clients_[slot];
    sum_has_.add(-c.lease.capacity);
    sum_held_.add(-held(c));
    if (c.is_server) --servers_;
    remove_bands(c);
    slots_.erase(c.id, [this](std::uint32_t s) -> std::string_view { return clients_[s].id; });
    ++generations_[slot];  // invalidates queued expiry entries
    c = client{};
    free_slots_.push_back(slot);
    if (--size_ == 0) {
      sum_has_.reset();
      sum_held_.reset();
    }
  }

  std::deque<client> clients_;  // a deque: references stay valid as it grows
  // Per slot, the generation of its current lease: an expiry entry of another generation is
  // stale. Apart from the records, so that dropping stale entries reads 4 bytes per entry.
  std::vector<std::uint32_t> generations_;
  std::vector<std::uint32_t> free_slots_;
  detail::id_table slots_;
  std::map<std::int64_t, share_index, std::greater<>> bands_;  // highest priority first
  std::deque<expiry_entry> in_order_;
  std::priority_queue<expiry_entry, std::vector<expiry_entry>, later> out_of_order_;
  // Each change goes in as two terms (old value out, new value in), never as a difference.
  detail::compensated_sum sum_has_;   // of leases
  detail::compensated_sum sum_held_;  // of held(): leases, and server children's grants beyond

  std::size_t size_ = 0;
  std::size_t servers_ = 0;
};

}  // namespace doorman
