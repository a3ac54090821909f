#pragma once

/// \file
/// A rate limiter whose algorithm is chosen at run time: what a `rate_resource` holds, so that
/// any of the local algorithms can enforce a lease.
///
///     doorman::any_rate_limiter lim({.algorithm = doorman::rate_algorithm::sliding_window,
///                                    .window = 60s, .sub_windows = 12}, 100.0 / 60);
///     lim.set_rate(capacity);  // a new lease: the window limit becomes capacity × 60 s
///
/// The choice, in short (docs/algorithms.md measures them):
/// - `gcra` (the default): a token bucket; rate × W + burst in any window W; the cheapest.
/// - `fixed_window`: a counter per aligned window; cheap; up to 2 × the limit across an edge.
/// - `sliding_log`: exact over any window; memory grows with the limit (bounded).
/// - `sliding_window`: counts per sub-window; within one sub-window's count of exact.
/// - `leaky_bucket`: a shaper; no burst, callers queue (bounded) and leave at the rate.
///
/// The set is open, as the server's algorithms are (`algorithm_list`): a `local_algorithm`
/// names a limiter, and `default_local_algorithms::with<mine>` with `basic_any_rate_limiter`
/// chooses among the built-in ones and yours by name (docs/algorithms.md, "Adding an
/// algorithm").

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <variant>

#include "doorman/limit/clock.hpp"
#include "doorman/limit/leaky_bucket.hpp"
#include "doorman/limit/limiter_base.hpp"
#include "doorman/limit/rate_limiter.hpp"
#include "doorman/limit/window_limiter.hpp"

namespace doorman {

namespace detail {

/// Alternative `index` (below `Count`) of `Variant`, built in place from
/// `make(integral_constant<I>)` (limiters neither copy nor move).
template <class Variant, std::size_t Count = std::variant_size_v<Variant>, std::size_t I = 0,
          class Make>
Variant variant_at(std::size_t index, Make&& make) {
  if constexpr (I + 1 < Count) {
    if (index != I) return variant_at<Variant, Count, I + 1>(index, make);
  }
  return Variant(std::in_place_index<I>, make(std::integral_constant<std::size_t, I>{}));
}

}  // namespace detail

/// A local rate algorithm's name, as configurations spell it. The set is open: the built-in
/// ones are named below, and a user's own algorithm (`local_algorithm`) has its own name.
struct rate_algorithm {
  std::string_view name = "gcra";

  static const rate_algorithm gcra;            ///< a token bucket (the default)
  static const rate_algorithm fixed_window;    ///< a counter per aligned window
  static const rate_algorithm sliding_log;     ///< exact over any window
  static const rate_algorithm sliding_window;  ///< counts per sub-window
  static const rate_algorithm leaky_bucket;    ///< a shaper with a bounded queue

  friend constexpr bool operator==(rate_algorithm a, rate_algorithm b) noexcept {
    return a.name == b.name;
  }
};

inline constexpr rate_algorithm rate_algorithm::gcra{"gcra"};
inline constexpr rate_algorithm rate_algorithm::fixed_window{"fixed_window"};
inline constexpr rate_algorithm rate_algorithm::sliding_log{"sliding_log"};
inline constexpr rate_algorithm rate_algorithm::sliding_window{"sliding_window"};
inline constexpr rate_algorithm rate_algorithm::leaky_bucket{"leaky_bucket"};

/// The algorithm's name.
constexpr std::string_view to_string(rate_algorithm a) noexcept {
  return a.name;
}

class other_rate_limiter;

/// The algorithm and its parameters (each applies to the algorithms it names).
struct rate_algorithm_options {
  rate_algorithm algorithm = rate_algorithm::gcra;
  double burst = 1;  ///< gcra: permits an idle limiter admits at once
  std::chrono::nanoseconds window = std::chrono::seconds(1);  ///< the window algorithms
  unsigned sub_windows = 1;                                   ///< sliding_window
  std::size_t max_log_entries = 4096;                         ///< sliding_log
  double queue = 10;  ///< leaky_bucket: permits that may wait
  /// Where `algorithm` is not in the limiter's own list: a maker of limiters of another list
  /// (`make_other_rate_limiter<List>`), run behind one virtual call. How a compiled client's
  /// `any_rate_limiter` runs a user's algorithm (`basic_rate_resource<List>` sets it).
  std::unique_ptr<other_rate_limiter> (*other)(const rate_algorithm_options&, double) = nullptr;
};

/// What a limiter must offer to run behind `basic_any_rate_limiter`: the surface of
/// `rate_limiter` (`reserve` and `cancel_reservation`, when it serves waits first come, first
/// served, and `try_again` are optional).
template <class L>
concept local_rate_limiter = requires(L& l, const L& cl, double n, std::stop_token stop) {
  typename L::options_type;
  requires std::same_as<typename L::acquire_result, basic_acquire_result<coarse_clock::duration>>;
  { l.try_acquire(n) } -> std::same_as<typename L::acquire_result>;
  { l.wait(n, stop) } -> std::same_as<bool>;
  l.set_rate(n);
  l.set_burst(n);
  { cl.rate() } -> std::convertible_to<double>;
  { l.status() } -> std::same_as<limit_status>;
  { cl.attempted() } -> std::convertible_to<double>;
  { cl.refused() } -> std::convertible_to<std::uint64_t>;
  { cl.delayed() } -> std::convertible_to<std::uint64_t>;
};

/// A local rate algorithm: its `name`, its `limiter`, and the limiter's options for a rate
/// (permits per second; < 0 unlimited, 0 blocked) and the user's options.
///
///     struct my_algorithm {
///       static constexpr std::string_view name = "my_algorithm";
///       using limiter = my_limiter;  // a local_rate_limiter
///       static my_limiter::options_type options(const doorman::rate_algorithm_options&, double);
///     };
template <class A>
concept local_algorithm = local_rate_limiter<typename A::limiter> &&
    requires(const rate_algorithm_options& o, double rate) {
  { A::name } -> std::convertible_to<std::string_view>;
  { A::options(o, rate) } -> std::convertible_to<typename A::limiter::options_type>;
};

/// The window algorithms' options: the window's limit follows the rate (rate × window).
[[nodiscard]] inline window_limiter_options window_options(const rate_algorithm_options& o,
                                                           double rate) noexcept {
  return {.limit = rate > 0 ? rate * std::chrono::duration<double>(o.window).count() : rate,
          .window = o.window,
          .sub_windows = o.sub_windows,
          .max_log_entries = o.max_log_entries};
}

/// `gcra`: `rate_limiter`.
struct gcra_algorithm {
  static constexpr std::string_view name = rate_algorithm::gcra.name;
  using limiter = rate_limiter;
  static rate_limiter_options options(const rate_algorithm_options& o, double rate) noexcept {
    return {.rate = rate, .burst = o.burst};
  }
};

/// A window algorithm (`fixed_window`, `sliding_log`, `sliding_window`) on `Limiter`.
template <const rate_algorithm& Name, class Limiter>
struct window_algorithm {
  static constexpr std::string_view name = Name.name;
  using limiter = Limiter;
  static window_limiter_options options(const rate_algorithm_options& o, double rate) noexcept {
    return window_options(o, rate);
  }
};

/// `leaky_bucket`: `leaky_bucket_limiter`.
struct leaky_bucket_algorithm {
  static constexpr std::string_view name = rate_algorithm::leaky_bucket.name;
  using limiter = leaky_bucket_limiter;
  static leaky_bucket_options options(const rate_algorithm_options& o, double rate) noexcept {
    return {.rate = rate, .queue = o.queue};
  }
};

template <class Clock = coarse_clock, std::size_t Stripes = 16>
using fixed_window_algorithm =
    window_algorithm<rate_algorithm::fixed_window, basic_fixed_window_limiter<Clock, Stripes>>;
template <class Clock = coarse_clock, std::size_t Stripes = 16>
using sliding_log_algorithm =
    window_algorithm<rate_algorithm::sliding_log, basic_sliding_log_limiter<Clock, Stripes>>;
template <class Clock = coarse_clock, std::size_t Stripes = 16>
using sliding_window_algorithm =
    window_algorithm<rate_algorithm::sliding_window, basic_sliding_window_limiter<Clock, Stripes>>;

/// A list of local algorithms, chosen at run time by name, like `algorithm_list` for the
/// server's: `default_local_algorithms::with<my_algorithm>` adds one without editing doorman.
template <class... Algorithms>
struct local_algorithm_list {
  using variant = std::variant<typename Algorithms::limiter...>;

  /// Every name, in order.
  static constexpr std::array<std::string_view, sizeof...(Algorithms)> names = {
      Algorithms::name...};

  /// This list with more algorithms appended.
  template <class... More>
  using with = local_algorithm_list<Algorithms..., More...>;

  /// The algorithm named `name` (with the name's storage, which lives as long as the program).
  [[nodiscard]] static constexpr std::optional<rate_algorithm> find(
      std::string_view name) noexcept {
    if (const auto i = index_of(name)) return rate_algorithm{names[*i]};
    return std::nullopt;
  }

  /// The position of `name` in the list, if it is there.
  [[nodiscard]] static constexpr std::optional<std::size_t> index_of(
      std::string_view name) noexcept {
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return i;
    }
    return std::nullopt;
  }
};

/// The five built-in algorithms.
using default_local_algorithms =
    local_algorithm_list<gcra_algorithm, fixed_window_algorithm<>, sliding_log_algorithm<>,
                         sliding_window_algorithm<>, leaky_bucket_algorithm>;

/// The built-in algorithm named `name`, if any.
constexpr std::optional<rate_algorithm> rate_algorithm_from(std::string_view name) noexcept {
  return default_local_algorithms::find(name);
}

namespace detail {

inline std::invalid_argument unknown_algorithm(rate_algorithm a) {
  return std::invalid_argument("unknown local rate algorithm: " + std::string(a.name));
}

// The optional parts of a `local_rate_limiter`, for one that lacks them: `try_again` is
// `try_acquire`; without `reserve` waits are retried, nothing is reserved or cancelled;
// without `settle` a call stays counted at its reservation.
template <class L>
auto try_again(L& l, double n) noexcept {
  if constexpr (requires { l.try_again(n); }) {
    return l.try_again(n);
  } else {
    return l.try_acquire(n);
  }
}
template <class L>
bool reserves(const L& l) noexcept {
  if constexpr (requires { l.reserves(); }) {
    return l.reserves();
  } else {
    return requires(L & m, double n) {
      m.reserve(n);
    };
  }
}
// A user's limiter may reserve with a time alone (its reservations have no slot), and settle
// without one.
using any_reservation = basic_reservation<coarse_clock::time_point>;
template <class L>
any_reservation reserve(L& l, double n) noexcept {
  if constexpr (requires {
                  { l.reserve(n) } -> std::convertible_to<any_reservation>;
                }) {
    return l.reserve(n);
  } else if constexpr (requires { l.reserve(n); }) {
    return {l.reserve(n)};
  } else {
    return {};
  }
}
template <class L>
bool cancel_reservation(L& l, double n, const any_reservation& r) noexcept {
  if constexpr (requires { l.cancel_reservation(n, r); }) {
    return l.cancel_reservation(n, r);
  } else if constexpr (requires { l.cancel_reservation(n, r.at); }) {
    return l.cancel_reservation(n, r.at);
  } else {
    return false;
  }
}
template <class L>
bool settle(L& l, double reserved, double used, std::int64_t slot) noexcept {
  if constexpr (requires { l.settle(reserved, used, slot); }) {
    return l.settle(reserved, used, slot);
  } else if constexpr (requires { l.settle(reserved, used); }) {
    return l.settle(reserved, used);
  } else {
    return false;
  }
}

}  // namespace detail

/// A limiter of another algorithm list behind virtual calls, with the surface of
/// `basic_any_rate_limiter`: what lets `any_rate_limiter`, built with the built-in list (in a
/// compiled client too), run a user's algorithm. `make_other_rate_limiter<List>` makes one.
class other_rate_limiter {
 public:
  using duration = coarse_clock::duration;
  using time_point = coarse_clock::time_point;
  using acquire_result = basic_acquire_result<duration>;

  other_rate_limiter() = default;
  other_rate_limiter(const other_rate_limiter&) = delete;
  other_rate_limiter& operator=(const other_rate_limiter&) = delete;
  virtual ~other_rate_limiter() = default;

  [[nodiscard]] virtual rate_algorithm algorithm() const noexcept = 0;
  virtual acquire_result try_acquire(double n) noexcept = 0;
  virtual acquire_result try_again(double n) noexcept = 0;
  virtual bool wait(double n, std::stop_token stop) = 0;
  virtual void set_rate(double rate) noexcept = 0;
  virtual void set_burst(double burst) noexcept = 0;
  [[nodiscard]] virtual double rate() const noexcept = 0;
  [[nodiscard]] virtual limit_status status() noexcept = 0;
  [[nodiscard]] virtual double attempted() const noexcept = 0;
  [[nodiscard]] virtual std::uint64_t refused() const noexcept = 0;
  [[nodiscard]] virtual std::uint64_t delayed() const noexcept = 0;
  [[nodiscard]] virtual bool reserves() const noexcept = 0;
  virtual basic_reservation<time_point> reserve(double n) noexcept = 0;
  virtual bool cancel_reservation(double n, const basic_reservation<time_point>& r) noexcept = 0;
  virtual bool settle(double reserved, double used, std::int64_t slot) noexcept = 0;
  /// The limiter when its type is `type`, else null.
  [[nodiscard]] virtual void* target(const std::type_info& type) noexcept = 0;
};

/// A rate limiter whose algorithm, one of `List`'s, is chosen at run time by name: what a
/// `rate_resource` holds (`any_rate_limiter`, the built-in list), so that any local algorithm
/// can enforce a lease. A name not in the list is made by `rate_algorithm_options::other` when
/// it is set (another list's limiter, behind one virtual call); else it throws
/// `std::invalid_argument`.
template <class List>
class basic_any_rate_limiter;

template <local_algorithm... Algorithms>
class basic_any_rate_limiter<local_algorithm_list<Algorithms...>> {
 public:
  using list = local_algorithm_list<Algorithms...>;
  using clock_type = coarse_clock;
  using duration = coarse_clock::duration;
  using time_point = coarse_clock::time_point;
  using acquire_result = basic_acquire_result<duration>;
  using reservation = basic_reservation<time_point>;

  /// A limiter running `options.algorithm` at `rate` permits per second (< 0 unlimited, 0
  /// blocked).
  explicit basic_any_rate_limiter(const rate_algorithm_options& options = {}, double rate = -1)
      : impl_(make(options, rate)) {}

  basic_any_rate_limiter(const basic_any_rate_limiter&) = delete;
  basic_any_rate_limiter& operator=(const basic_any_rate_limiter&) = delete;

  [[nodiscard]] rate_algorithm algorithm() const noexcept {
    if (const auto* other = std::get_if<other_index>(&impl_)) return (*other)->algorithm();
    return rate_algorithm{list::names[impl_.index()]};
  }

  acquire_result try_acquire(double n = 1) noexcept {
    return visit([n](auto& l) { return l.try_acquire(n); });
  }
  /// `try_acquire` again for a caller already counted (a retried wait): the demand counters
  /// do not count it twice.
  acquire_result try_again(double n = 1) noexcept {
    return visit([n](auto& l) { return detail::try_again(l, n); });
  }
  /// Blocks until admitted: true; false when `stop` came first (or, for the window algorithms,
  /// `n` exceeds the limit; for the leaky bucket, its queue is full).
  bool wait(double n, std::stop_token stop) {
    return visit([&](auto& l) { return l.wait(n, stop); });
  }
  void set_rate(double rate) noexcept {
    visit([rate](auto& l) { l.set_rate(rate); });
  }
  void set_burst(double burst) noexcept {
    visit([burst](auto& l) { l.set_burst(burst); });
  }
  [[nodiscard]] double rate() const noexcept {
    return visit([](const auto& l) -> double { return l.rate(); });
  }
  [[nodiscard]] limit_status status() noexcept {
    return visit([](auto& l) { return l.status(); });
  }
  [[nodiscard]] double attempted() const noexcept {
    return visit([](const auto& l) -> double { return l.attempted(); });
  }
  [[nodiscard]] std::uint64_t refused() const noexcept {
    return visit([](const auto& l) -> std::uint64_t { return l.refused(); });
  }
  [[nodiscard]] std::uint64_t delayed() const noexcept {
    return visit([](const auto& l) -> std::uint64_t { return l.delayed(); });
  }

  /// Whether waits are served first come, first served through reservations (`gcra` and
  /// `leaky_bucket`); the others are retried when their refusal says.
  [[nodiscard]] bool reserves() const noexcept {
    return visit([](const auto& l) { return detail::reserves(l); });
  }
  /// With `reserves()`: see `rate_limiter::reserve` and `leaky_bucket_limiter::reserve`.
  /// Otherwise nothing is reserved (`at` is `time_point::max()`).
  reservation reserve(double n) noexcept {
    return visit([n](auto& l) { return detail::reserve(l, n); });
  }
  bool cancel_reservation(double n, const reservation& r) noexcept {
    return visit([&](auto& l) { return detail::cancel_reservation(l, n, r); });
  }

  /// Settles a call admitted for `reserved` permits, its `slot` from `try_acquire` or
  /// `reserve`, that used `used` (see `rate_limiter::settle`): a debt for a use above the
  /// reservation, a refund of what no one else holds below it. False, changing nothing, when
  /// either is not a number of permits or the algorithm cannot settle (the window algorithms:
  /// the call stays counted as reserved).
  bool settle(double reserved, double used, std::int64_t slot) noexcept {
    return visit([&](auto& l) { return detail::settle(l, reserved, used, slot); });
  }
  /// `settle` without a slot: the debt only.
  bool settle(double reserved, double used) noexcept {
    return settle(reserved, used, acquire_result::no_slot);
  }

  /// The limiter, when it runs `L`'s algorithm (one of this list's or, made by
  /// `rate_algorithm_options::other`, of another's).
  template <class L>
  [[nodiscard]] L* get_if() noexcept {
    return static_cast<L*>(target(typeid(L)));
  }
  /// The limiter when its type is `type`, else null: `get_if` across a virtual call.
  [[nodiscard]] void* target(const std::type_info& type) noexcept {
    if (auto* other = std::get_if<other_index>(&impl_)) return (*other)->target(type);
    return std::visit(
        [&](auto& l) -> void* {
          using L = std::remove_cvref_t<decltype(l)>;
          if constexpr (std::is_same_v<L, std::unique_ptr<other_rate_limiter>>) {
            return nullptr;
          } else {
            return typeid(L) == type ? static_cast<void*>(&l) : nullptr;
          }
        },
        impl_);
  }

 private:
  static constexpr std::size_t other_index = sizeof...(Algorithms);
  using variant =
      std::variant<typename Algorithms::limiter..., std::unique_ptr<other_rate_limiter>>;

  static variant make(const rate_algorithm_options& options, double rate) {
    const auto i = list::index_of(options.algorithm.name);
    if (!i && options.other) {
      return variant(std::in_place_index<other_index>, options.other(options, rate));
    }
    if (!i) {
      throw detail::unknown_algorithm(options.algorithm);
    }
    return detail::variant_at<variant, other_index>(*i, [&](auto at) {
      using A = std::tuple_element_t<decltype(at)::value, std::tuple<Algorithms...>>;
      return A::options(options, rate);
    });
  }

  // `f(limiter)` on the limiter held, through the pointer for another list's.
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(
        [&](auto& l) -> decltype(auto) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(l)>,
                                       std::unique_ptr<other_rate_limiter>>) {
            return f(*l);
          } else {
            return f(l);
          }
        },
        impl_);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return const_cast<basic_any_rate_limiter*>(this)->visit(
        [&](const auto& l) -> decltype(auto) { return f(l); });
  }

  variant impl_;
};

namespace detail {

// `A`'s limiter behind `other_rate_limiter`'s virtual calls (one call, no second dispatch).
template <local_algorithm A>
class other_limiter_of final : public other_rate_limiter {
 public:
  other_limiter_of(const rate_algorithm_options& options, double rate)
      : impl_(A::options(options, rate)) {}

  rate_algorithm algorithm() const noexcept override { return rate_algorithm{A::name}; }
  acquire_result try_acquire(double n) noexcept override { return impl_.try_acquire(n); }
  acquire_result try_again(double n) noexcept override { return detail::try_again(impl_, n); }
  bool wait(double n, std::stop_token stop) override { return impl_.wait(n, std::move(stop)); }
  void set_rate(double rate) noexcept override { impl_.set_rate(rate); }
  void set_burst(double burst) noexcept override { impl_.set_burst(burst); }
  double rate() const noexcept override { return impl_.rate(); }
  limit_status status() noexcept override { return impl_.status(); }
  double attempted() const noexcept override { return impl_.attempted(); }
  std::uint64_t refused() const noexcept override { return impl_.refused(); }
  std::uint64_t delayed() const noexcept override { return impl_.delayed(); }
  bool reserves() const noexcept override { return detail::reserves(impl_); }
  basic_reservation<time_point> reserve(double n) noexcept override {
    return detail::reserve(impl_, n);
  }
  bool cancel_reservation(double n, const basic_reservation<time_point>& r) noexcept override {
    return detail::cancel_reservation(impl_, n, r);
  }
  bool settle(double reserved, double used, std::int64_t slot) noexcept override {
    return detail::settle(impl_, reserved, used, slot);
  }
  void* target(const std::type_info& type) noexcept override {
    return typeid(typename A::limiter) == type ? &impl_ : nullptr;
  }

 private:
  typename A::limiter impl_;
};

template <class List>
struct other_limiters;
template <class... Algorithms>
struct other_limiters<local_algorithm_list<Algorithms...>> {
  static std::unique_ptr<other_rate_limiter> make(const rate_algorithm_options& options,
                                                  double rate) {
    std::unique_ptr<other_rate_limiter> made;
    (void)((Algorithms::name == options.algorithm.name
                ? (made = std::make_unique<other_limiter_of<Algorithms>>(options, rate), true)
                : false) ||
           ...);
    if (!made) {
      throw detail::unknown_algorithm(options.algorithm);
    }
    return made;
  }
};

}  // namespace detail

/// Makes a limiter of `List`'s running `options.algorithm`, behind one virtual call (what
/// `rate_algorithm_options::other` takes). Throws `std::invalid_argument` for a name not in
/// `List`.
template <class List>
std::unique_ptr<other_rate_limiter> make_other_rate_limiter(const rate_algorithm_options& options,
                                                            double rate) {
  return detail::other_limiters<List>::make(options, rate);
}

/// The built-in algorithms' run-time choice.
using any_rate_limiter = basic_any_rate_limiter<default_local_algorithms>;

}  // namespace doorman
