#pragma once

/// \file
/// The allocation algorithms (docs/engine.md): an `algorithm` concept, Doorman's four kinds, and
/// `algorithm_list`, the run-time choice among them that a user can extend with their own.

#include <algorithm>
#include <array>
#include <concepts>
#include <limits>
#include <string_view>
#include <type_traits>
#include <variant>

#include <nlohmann/json.hpp>

#include "doorman/core/share_index.hpp"

namespace doorman {

/// A requester's demand at one priority band.
struct demand {
  double wants = 0;
  double subclients = 1;
};

/// What an algorithm sees when it decides one band of one requester.
struct band_context {
  const share_index& band;  ///< every demand at this priority, the requester's included
  double capacity;          ///< the resource's capacity
  double band_capacity;     ///< what higher priorities' wants leave of it for this band
};

/// An allocation algorithm: a small value type that says what one requester's band is
/// entitled to, given every demand in the band (in O(log n) through `share_index`).
///
/// - `kind`: the name used in configuration (upper case, e.g. "FAIR_SHARE").
/// - `shares_capacity`: true if grants must fit in what other holders leave available (the
///   engine then caps the entitlement by capacity minus others' leases); false if the
///   algorithm hands out capacity per client regardless (NO_ALGORITHM, STATIC).
/// - `share(ctx, d)`: the entitlement of demand `d` (already included in `ctx.band`).
///
/// An algorithm may take its configuration `parameters` (a JSON object) in a constructor.
template <class A>
concept algorithm = std::copy_constructible<A> &&
    requires(const A& a, const band_context& ctx, demand d) {
  { A::kind } -> std::convertible_to<std::string_view>;
  { A::shares_capacity } -> std::convertible_to<bool>;
  { a.share(ctx, d) } -> std::convertible_to<double>;
};

/// NO_ALGORITHM: everyone gets what they want, whatever the capacity.
struct no_algorithm {
  static constexpr std::string_view kind = "NO_ALGORITHM";
  static constexpr bool shares_capacity = false;
  [[nodiscard]] double share(const band_context&, demand d) const noexcept { return d.wants; }
};

/// STATIC: the configured capacity is a cap per end client, so a requester gets
/// min(wants, capacity x subclients). Grants are not limited by the sum of others' leases.
struct static_capacity {
  static constexpr std::string_view kind = "STATIC";
  static constexpr bool shares_capacity = false;
  [[nodiscard]] double share(const band_context& ctx, demand d) const noexcept {
    return std::min(d.wants, ctx.capacity * d.subclients);
  }
};

/// PROPORTIONAL_SHARE: when the band's total wants fit, wants; otherwise each subclient's equal
/// share, plus, for those wanting more than it, the capacity left over by those wanting less,
/// in proportion to how much more they want.
struct proportional_share {
  static constexpr std::string_view kind = "PROPORTIONAL_SHARE";
  static constexpr bool shares_capacity = true;
  [[nodiscard]] double share(const band_context& ctx, demand d) const noexcept {
    const demand_sums total = ctx.band.totals();
    if (total.wants <= ctx.band_capacity) return d.wants;
    const double equal = ctx.band_capacity / total.subclients;
    const double entitled = equal * d.subclients;
    if (d.wants <= entitled) return d.wants;
    const demand_sums low = ctx.band.below(equal);
    const double left_over = equal * low.subclients - low.wants;
    const double excess = (total.wants - low.wants) - equal * (total.subclients - low.subclients);
    if (excess <= 0) return entitled;
    return std::min(d.wants, entitled + (d.wants - entitled) * (left_over / excess));
  }
};

/// FAIR_SHARE: max-min fairness weighted by subclients. Everyone gets
/// min(wants, level x subclients), the level chosen so that the shares fill the capacity.
struct fair_share {
  static constexpr std::string_view kind = "FAIR_SHARE";
  static constexpr bool shares_capacity = true;
  [[nodiscard]] double share(const band_context& ctx, demand d) const noexcept {
    const double level = ctx.band.water_level(ctx.band_capacity);
    if (level == std::numeric_limits<double>::infinity()) return d.wants;
    return std::min(d.wants, level * d.subclients);
  }
};

/// A list of algorithms, chosen at run time by `kind` through a `std::variant`.
///
///     struct my_alg { static constexpr std::string_view kind = "MY_ALG"; ... };
///     using my_algorithms = doorman::default_algorithms::with<my_alg>;
///     doorman::basic_engine<std::chrono::steady_clock, my_algorithms> engine(repo);
template <algorithm... Algorithms>
struct algorithm_list {
  using variant = std::variant<Algorithms...>;

  /// Every kind name, for configuration validation.
  static constexpr std::array<std::string_view, sizeof...(Algorithms)> kinds = {
      Algorithms::kind...};

  /// This list with more algorithms appended.
  template <algorithm... More>
  using with = algorithm_list<Algorithms..., More...>;

  /// The algorithm named `kind` (canonical spelling), built from `parameters`; the first
  /// alternative when the kind is unknown (configuration validation prevents that).
  [[nodiscard]] static variant make(std::string_view kind, const nlohmann::json& parameters) {
    variant out;
    (void)((Algorithms::kind == kind ? (out = construct<Algorithms>(parameters), true) : false) ||
           ...);
    return out;
  }

  /// The kind name of the algorithm held by `v`.
  [[nodiscard]] static std::string_view kind_of(const variant& v) noexcept {
    return std::visit(
        [](const auto& a) -> std::string_view { return std::decay_t<decltype(a)>::kind; }, v);
  }

 private:
  template <class A>
  static A construct(const nlohmann::json& parameters) {
    if constexpr (std::is_constructible_v<A, const nlohmann::json&>) {
      return A(parameters);
    } else {
      (void)parameters;
      return A{};
    }
  }
};

/// Doorman's four algorithms.
using default_algorithms =
    algorithm_list<no_algorithm, static_capacity, proportional_share, fair_share>;

}  // namespace doorman
