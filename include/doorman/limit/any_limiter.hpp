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
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "doorman/limit/clock.hpp"
#include "doorman/limit/leaky_bucket.hpp"
#include "doorman/limit/limiter_base.hpp"
#include "doorman/limit/rate_limiter.hpp"
#include "doorman/limit/window_limiter.hpp"

namespace doorman {

namespace detail {

/// Alternative `index` of `Variant`, built in place from `make(integral_constant<I>)` (limiters
/// neither copy nor move).
template <class Variant, std::size_t I = 0, class Make>
Variant variant_at(std::size_t index, Make&& make) {
  if constexpr (I + 1 < std::variant_size_v<Variant>) {
    if (index != I) return variant_at<Variant, I + 1>(index, make);
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

/// The algorithm and its parameters (each applies to the algorithms it names).
struct rate_algorithm_options {
  rate_algorithm algorithm = rate_algorithm::gcra;
  double burst = 1;  ///< gcra: permits an idle limiter admits at once
  std::chrono::nanoseconds window = std::chrono::seconds(1);  ///< the window algorithms
  unsigned sub_windows = 1;                                   ///< sliding_window
  std::size_t max_log_entries = 4096;                         ///< sliding_log
  double queue = 10;  ///< leaky_bucket: permits that may wait
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

/// A rate limiter whose algorithm, one of `List`'s, is chosen at run time by name: what a
/// `rate_resource` holds (`any_rate_limiter`, the built-in list), so that any local algorithm
/// can enforce a lease. Throws `std::invalid_argument` for a name not in the list.
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

  /// A limiter running `options.algorithm` at `rate` permits per second (< 0 unlimited, 0
  /// blocked).
  explicit basic_any_rate_limiter(const rate_algorithm_options& options = {}, double rate = -1)
      : impl_(detail::variant_at<variant>(checked(options.algorithm), [&](auto i) {
          using A = std::tuple_element_t<decltype(i)::value, std::tuple<Algorithms...>>;
          return A::options(options, rate);
        })) {}

  basic_any_rate_limiter(const basic_any_rate_limiter&) = delete;
  basic_any_rate_limiter& operator=(const basic_any_rate_limiter&) = delete;

  [[nodiscard]] rate_algorithm algorithm() const noexcept {
    return rate_algorithm{list::names[impl_.index()]};
  }

  acquire_result try_acquire(double n = 1) noexcept {
    return std::visit([n](auto& l) { return l.try_acquire(n); }, impl_);
  }
  /// `try_acquire` again for a caller already counted (a retried wait): the demand counters
  /// do not count it twice.
  acquire_result try_again(double n = 1) noexcept {
    return std::visit(
        [n](auto& l) {
          if constexpr (requires { l.try_again(n); }) {
            return l.try_again(n);
          } else {
            return l.try_acquire(n);
          }
        },
        impl_);
  }
  /// Blocks until admitted: true; false when `stop` came first (or, for the window algorithms,
  /// `n` exceeds the limit; for the leaky bucket, its queue is full).
  bool wait(double n, std::stop_token stop) {
    return std::visit([&](auto& l) { return l.wait(n, stop); }, impl_);
  }
  void set_rate(double rate) noexcept {
    std::visit([rate](auto& l) { l.set_rate(rate); }, impl_);
  }
  void set_burst(double burst) noexcept {
    std::visit([burst](auto& l) { l.set_burst(burst); }, impl_);
  }
  [[nodiscard]] double rate() const noexcept {
    return std::visit([](const auto& l) { return l.rate(); }, impl_);
  }
  [[nodiscard]] limit_status status() noexcept {
    return std::visit([](auto& l) { return l.status(); }, impl_);
  }
  [[nodiscard]] double attempted() const noexcept {
    return std::visit([](const auto& l) { return l.attempted(); }, impl_);
  }
  [[nodiscard]] std::uint64_t refused() const noexcept {
    return std::visit([](const auto& l) { return l.refused(); }, impl_);
  }
  [[nodiscard]] std::uint64_t delayed() const noexcept {
    return std::visit([](const auto& l) { return l.delayed(); }, impl_);
  }

  /// Whether waits are served first come, first served through reservations (`gcra` and
  /// `leaky_bucket`); the others are retried when their refusal says.
  [[nodiscard]] bool reserves() const noexcept {
    return std::visit(
        [](const auto& l) {
          return requires(std::remove_cvref_t<decltype(l)> & m, double n) {
            m.reserve(n);
          };
        },
        impl_);
  }
  /// With `reserves()`: see `rate_limiter::reserve` and `leaky_bucket_limiter::reserve`. Otherwise
  /// `time_point::max()`.
  time_point reserve(double n) noexcept {
    return std::visit(
        [n](auto& l) {
          if constexpr (requires { l.reserve(n); }) {
            return l.reserve(n);
          } else {
            return time_point::max();
          }
        },
        impl_);
  }
  bool cancel_reservation(double n, time_point at) noexcept {
    return std::visit(
        [&](auto& l) {
          if constexpr (requires { l.cancel_reservation(n, at); }) {
            return l.cancel_reservation(n, at);
          } else {
            return false;
          }
        },
        impl_);
  }

  /// The limiter, when it runs `L`'s algorithm.
  template <class L>
  [[nodiscard]] L* get_if() noexcept {
    return std::get_if<L>(&impl_);
  }

 private:
  using variant = typename list::variant;

  static std::size_t checked(rate_algorithm a) {
    const auto i = list::index_of(a.name);
    if (!i) throw std::invalid_argument("unknown local rate algorithm: " + std::string(a.name));
    return *i;
  }

  variant impl_;
};

/// The built-in algorithms' run-time choice.
using any_rate_limiter = basic_any_rate_limiter<default_local_algorithms>;

}  // namespace doorman
