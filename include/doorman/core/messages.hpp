#pragma once

/// \file
/// The requests and responses of the engine (docs/protocol.md) as plain values, in the wire's terms
/// (relative seconds), and their validation. The protocol layer maps them to and from JSON;
/// the engine validates again, so that an embedding that calls it directly is as safe.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "doorman/core/budget.hpp"
#include "doorman/core/capacity_learner.hpp"
#include "doorman/core/config.hpp"
#include "doorman/core/error.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/lease_store.hpp"
#include "doorman/core/limits.hpp"

namespace doorman {

// The messages below name these limits in words ("at most 10000 resources"), which the hot
// path builds without formatting; these assertions keep the words and the numbers one.
static_assert(request_limits::max_id_bytes == 256 && config_limits::max_glob_bytes == 256);
static_assert(request_limits::max_resources == 10'000 && request_limits::max_bands == 1'000);
static_assert(request_limits::max_num_clients == 1'000'000'000);
static_assert(request_limits::max_quantity == 1e15 && request_limits::max_seconds == 1e6);

/// Who is master: `{"is_master": true, "master": "10.0.0.7:7700"}`.
struct mastership_info {
  bool is_master = false;
  std::optional<std::string> master;  ///< address of the master, when known

  friend bool operator==(const mastership_info&, const mastership_info&) = default;
};

/// One resource of a client's `get_capacity`.
struct resource_request {
  std::string resource_id;
  std::int64_t priority = 0;
  double wants = 0;
  std::optional<lease_info> has{};
  /// A budget resource: what the client has spent in the window, in all. Its `has` is then
  /// what it has left of its allotment (docs/budgets.md).
  std::optional<budget_spend> spend{};
  /// What its calls to the protected service met, in all (docs/learned-capacity.md).
  std::optional<overload_signals> signals{};
};

/// `get_capacity`: a client asks for capacity on one or more resources.
struct capacity_request {
  std::string client_id;
  std::vector<resource_request> resources;
  /// Whether the requester can say what it spent of a budget (not on the wire): false from a
  /// door whose protocol cannot (Doorman's gRPC): a budget resource then grants it 0.
  bool reports_spend = true;
};

/// One resource of a `get_capacity` answer.
struct resource_grant {
  std::string resource_id;
  lease_info gets;
  double safe_capacity = 0;             ///< -1: unlimited
  std::optional<budget_info> budget{};  ///< a budget resource: its window, as the root counts
};

struct capacity_response {
  std::vector<resource_grant> resources;  ///< empty when not master
  mastership_info mastership;
};

/// One priority band of a server child's demand.
struct priority_band {
  std::int64_t priority = 0;
  std::int64_t num_clients = 1;
  double wants = 0;
};

/// One resource of a `get_server_capacity`.
struct server_resource_request {
  std::string resource_id;
  std::optional<lease_info> has;
  double outstanding = 0;  ///< what the child has granted to its own clients
  std::vector<priority_band> wants;
  /// A budget resource: what the child's clients spent in the window, in all, as the child
  /// counts it. Its `has` is then what the child has left of its allotments (docs/budgets.md).
  std::optional<budget_spend> spend{};
  /// What its clients' calls to the protected service met, in all, as the child counts them.
  std::optional<overload_signals> signals{};
};

/// `get_server_capacity`: a server child asks on behalf of its clients.
struct server_capacity_request {
  std::string server_id;
  std::vector<server_resource_request> resources;
  bool reports_spend = true;  ///< as `capacity_request::reports_spend`
};

struct server_resource_grant {
  std::string resource_id;
  lease_info gets;
  double safe_capacity = 0;
  algorithm_config algorithm;           ///< so that a child learns the template's parameters
  std::optional<budget_info> budget{};  ///< a budget resource: its window, as the root counts
};

struct server_capacity_response {
  std::vector<server_resource_grant> resources;
  mastership_info mastership;
};

/// `release_capacity`: a client gives back its leases on the listed resources.
struct release_request {
  std::string client_id;
  std::vector<std::string> resources;
  /// For budget resources among `resources`: what the client spent in all, so that the rest
  /// of its allotment is free at once (without it, the rest counts as spent).
  std::vector<resource_spend> spends{};
};

struct release_response {
  mastership_info mastership;
};

struct discovery_response {
  mastership_info mastership;
};

/// One resource of a `count_hits`: `hits` more in the resource's current fixed window of
/// `window` seconds.
struct hit_count {
  std::string resource_id;
  double hits = 1;
  double window = 1;  ///< seconds
};

/// `count_hits`: a client has the root count hits exactly, one fixed window per resource, with
/// the resource's capacity × the window as the limit (a limit too small to split into leases;
/// docs/protocol.md).
struct count_request {
  std::string client_id;
  std::vector<hit_count> resources;
};

/// How the root counted one resource of a `count_hits`. A refused count consumes nothing.
struct hit_verdict {
  std::string resource_id;
  bool admitted = false;
  double limit = 0;      ///< hits per window: the capacity × the window, rounded down
  double remaining = 0;  ///< hits left in the window, after these
  double reset = 0;      ///< seconds until the window ends
};

struct count_response {
  std::vector<hit_verdict> resources;
  mastership_info mastership;
};

/// `status`: all resources, or one with its leases.
struct status_request {
  std::optional<std::string> resource_id;
};

/// Which of a resource's leases `status` lists: in client id order, from `offset`, at most
/// `limit` (none: all).
struct lease_page {
  std::int64_t offset = 0;            ///< leases skipped, 0 to `max_status_offset`
  std::optional<std::int64_t> limit;  ///< at most this many leases, 1 to `max_status_limit`
};

/// `status` params as the wire carries them: `resource_id`, `offset`, `limit`.
struct status_params {
  status_request request;
  lease_page page;
};

struct resource_status {
  std::string resource_id;
  double capacity = 0;
  double sum_has = 0;
  double sum_wants = 0;
  std::size_t clients = 0;
  double subclients = 0;
  bool learning = false;
  std::string algorithm;
  std::optional<budget_info> budget{};
  std::optional<learned_info> learned{};  ///< a root's learned capacity
};

struct lease_status {
  std::string client_id;
  lease_info has;
  double wants = 0;
  double subclients = 0;
  bool is_server = false;
  double outstanding = 0;
  std::vector<band_demand> bands;
};

struct status_response {
  mastership_info mastership;
  std::vector<resource_status> resources;
  std::vector<lease_status> leases;        ///< only when a resource_id was asked for
  std::optional<std::size_t> lease_count;  ///< all the resource's leases (with a resource_id)
};

// ---- the wire description ------------------------------------------------------------------

/// Whether a field of a wire message must be present. An optional field may also be `null`,
/// which reads as absent; an absent `std::optional` member is left out when written, unless the
/// field says `null_when_absent`.
enum class presence { required, optional, null_when_absent };

/// One field of a wire message: its name on the wire, the member it is, whether it must be
/// present, and for a number the range it must be in (`within`) or for a list how many
/// elements it may hold (`at_most`; by default `request_limits::max_resources`). `validate`
/// applies the bounds that depend on more than one field. An optional list left empty is left
/// out when written.
template <class T, class M>
struct wire_field {
  const char* name;
  M T::*member;
  presence when = presence::required;
  double low = -std::numeric_limits<double>::infinity();
  double high = std::numeric_limits<double>::infinity();
  std::size_t most = request_limits::max_resources;

  /// This field, read only within [lo, hi] (an error naming the field otherwise).
  [[nodiscard]] constexpr wire_field within(double lo, double hi) const noexcept {
    auto f = *this;
    f.low = lo;
    f.high = hi;
    return f;
  }
  /// This list, read with at most `n` elements.
  [[nodiscard]] constexpr wire_field at_most(std::size_t n) const noexcept {
    auto f = *this;
    f.most = n;
    return f;
  }
  [[nodiscard]] constexpr bool bounded() const noexcept {
    return low != -std::numeric_limits<double>::infinity() ||
           high != std::numeric_limits<double>::infinity();
  }
};

template <class T, class M>
constexpr wire_field<T, M> field(const char* name, M T::*member,
                                 presence when = presence::required) noexcept {
  return {name, member, when};
}

/// The fields of a wire message, specialised once per message (below): its JSON decoding (with
/// errors naming the field), `to_json`, and the hot path's streaming reader and writer all
/// follow this one list, so a field is added in one place (plus its tests). Fields are listed in
/// the order they are checked (the first problem is the one a request is told about); writers
/// sort them by name, as nlohmann/json does.
template <class T>
struct wire_message;

/// A message with a wire description.
template <class T>
concept described_message = requires {
  wire_message<T>::fields;
};

template <>
struct wire_message<lease_info> {
  static constexpr auto fields = std::tuple{
      field("capacity", &lease_info::capacity), field("expires_in", &lease_info::expires_in),
      field("refresh_interval", &lease_info::refresh_interval)};
};

template <>
struct wire_message<mastership_info> {
  static constexpr auto fields =
      std::tuple{field("is_master", &mastership_info::is_master),
                 field("master", &mastership_info::master, presence::null_when_absent)};
};

template <>
struct wire_message<budget_spend> {
  static constexpr auto fields =
      std::tuple{field("window", &budget_spend::window).within(0, request_limits::max_window_start),
                 field("spent", &budget_spend::spent).within(0, request_limits::max_quantity)};
};

template <>
struct wire_message<overload_signals> {
  static constexpr auto fields = std::tuple{
      field("calls", &overload_signals::calls).within(0, request_limits::max_quantity),
      field("overloads", &overload_signals::overloads).within(0, request_limits::max_quantity)};
};

template <>
struct wire_message<resource_request> {
  static constexpr auto fields =
      std::tuple{field("resource_id", &resource_request::resource_id),
                 field("priority", &resource_request::priority, presence::optional),
                 field("wants", &resource_request::wants),
                 field("has", &resource_request::has, presence::optional),
                 field("spend", &resource_request::spend, presence::optional),
                 field("signals", &resource_request::signals, presence::optional)};
};

template <>
struct wire_message<capacity_request> {
  static constexpr auto fields = std::tuple{field("client_id", &capacity_request::client_id),
                                            field("resources", &capacity_request::resources)};
};

template <>
struct wire_message<priority_band> {
  static constexpr auto fields = std::tuple{
      field("priority", &priority_band::priority, presence::optional),
      field("num_clients", &priority_band::num_clients), field("wants", &priority_band::wants)};
};

template <>
struct wire_message<server_resource_request> {
  static constexpr auto fields =
      std::tuple{field("resource_id", &server_resource_request::resource_id),
                 field("outstanding", &server_resource_request::outstanding, presence::optional),
                 field("has", &server_resource_request::has, presence::optional),
                 field("wants", &server_resource_request::wants),
                 field("spend", &server_resource_request::spend, presence::optional),
                 field("signals", &server_resource_request::signals, presence::optional)};
};

template <>
struct wire_message<server_capacity_request> {
  static constexpr auto fields =
      std::tuple{field("server_id", &server_capacity_request::server_id),
                 field("resources", &server_capacity_request::resources)};
};

// What the two grants and the two capacity answers share: they differ only in their types.
// A budget's state as a node writes it (read by clients and the CLI: bounded as it is read).
template <>
struct wire_message<budget_info> {
  using B = budget_info;
  static constexpr double most = request_limits::max_quantity;
  static constexpr auto fields =
      std::tuple{field("window", &B::window).within(0, request_limits::max_window_start),
                 field("reset", &B::reset).within(0, request_limits::max_window_seconds),
                 field("limit", &B::limit).within(0, most),
                 field("spent", &B::spent).within(0, most),
                 field("left", &B::left).within(0, most),
                 field("counted", &B::counted, presence::optional).within(0, most),
                 field("mark", &B::mark, presence::optional).within(0, most)};
};

template <class Grant>
constexpr auto grant_fields() noexcept {
  return std::tuple{field("resource_id", &Grant::resource_id), field("gets", &Grant::gets),
                    field("safe_capacity", &Grant::safe_capacity, presence::optional)};
}
template <class Answer>
constexpr auto mastership_field() noexcept {
  return std::tuple{field("mastership", &Answer::mastership)};
}
template <class Answer>
constexpr auto capacity_answer_fields() noexcept {
  return std::tuple_cat(mastership_field<Answer>(),
                        std::tuple{field("resources", &Answer::resources)});
}

template <>
struct wire_message<resource_grant> {
  static constexpr auto fields =
      std::tuple_cat(grant_fields<resource_grant>(),
                     std::tuple{field("budget", &resource_grant::budget, presence::optional)});
};

template <>
struct wire_message<server_resource_grant> {
  static constexpr auto fields = std::tuple_cat(
      grant_fields<server_resource_grant>(),
      std::tuple{field("algorithm", &server_resource_grant::algorithm),
                 field("budget", &server_resource_grant::budget, presence::optional)});
};

template <>
struct wire_message<capacity_response> {
  static constexpr auto fields = capacity_answer_fields<capacity_response>();
};

template <>
struct wire_message<server_capacity_response> {
  static constexpr auto fields = capacity_answer_fields<server_capacity_response>();
};

template <>
struct wire_message<release_response> {
  static constexpr auto fields = mastership_field<release_response>();
};

template <>
struct wire_message<discovery_response> {
  static constexpr auto fields = mastership_field<discovery_response>();
};

template <>
struct wire_message<hit_count> {
  static constexpr auto fields =
      std::tuple{field("resource_id", &hit_count::resource_id), field("hits", &hit_count::hits),
                 field("window", &hit_count::window)};
};

template <>
struct wire_message<count_request> {
  static constexpr auto fields = std::tuple{field("client_id", &count_request::client_id),
                                            field("resources", &count_request::resources)};
};

template <>
struct wire_message<hit_verdict> {
  static constexpr auto fields =
      std::tuple{field("resource_id", &hit_verdict::resource_id),
                 field("admitted", &hit_verdict::admitted), field("limit", &hit_verdict::limit),
                 field("remaining", &hit_verdict::remaining), field("reset", &hit_verdict::reset)};
};

template <>
struct wire_message<count_response> {
  static constexpr auto fields = capacity_answer_fields<count_response>();
};

template <>
struct wire_message<resource_spend> {
  static constexpr auto fields = std::tuple{
      field("resource_id", &resource_spend::resource_id),
      field("window", &resource_spend::window).within(0, request_limits::max_window_start),
      field("spent", &resource_spend::spent).within(0, request_limits::max_quantity)};
};

template <>
struct wire_message<release_request> {
  static constexpr auto fields =
      std::tuple{field("client_id", &release_request::client_id),
                 field("resources", &release_request::resources),
                 field("spends", &release_request::spends, presence::optional)};
};

template <>
struct wire_message<status_request> {
  static constexpr auto fields =
      std::tuple{field("resource_id", &status_request::resource_id, presence::optional)};
};

// A status answer comes from a node (never trusted by the CLI): its quantities are bounded as
// they are read (-1: unlimited), its counts are integers from 0 to 1e15.
template <>
struct wire_message<learned_info> {
  using L = learned_info;
  static constexpr double most = request_limits::max_quantity;
  static constexpr auto fields = std::tuple{field("min", &L::min).within(0, most),
                                            field("max", &L::max).within(0, most),
                                            field("calls", &L::calls).within(0, most),
                                            field("overloads", &L::overloads).within(0, most),
                                            field("seconds", &L::seconds).within(0, most),
                                            field("step", &L::step)};
};

template <>
struct wire_message<resource_status> {
  using S = resource_status;
  static constexpr double most = request_limits::max_quantity;
  static constexpr auto fields =
      std::tuple{field("resource_id", &S::resource_id),
                 field("capacity", &S::capacity, presence::optional).within(-1, most),
                 field("sum_has", &S::sum_has, presence::optional).within(-1, most),
                 field("sum_wants", &S::sum_wants, presence::optional).within(-1, most),
                 field("clients", &S::clients, presence::optional),
                 field("subclients", &S::subclients, presence::optional).within(-1, most),
                 field("learning", &S::learning, presence::optional),
                 field("algorithm", &S::algorithm, presence::optional),
                 field("budget", &S::budget, presence::optional),
                 field("learned", &S::learned, presence::optional)};
};

template <>
struct wire_message<band_demand> {
  static constexpr auto fields =
      std::tuple{field("priority", &band_demand::priority, presence::optional),
                 field("num_clients", &band_demand::subclients, presence::optional)
                     .within(0, request_limits::max_quantity),
                 field("wants", &band_demand::wants, presence::optional)
                     .within(0, request_limits::max_quantity)};
};

template <>
struct wire_message<lease_status> {
  using L = lease_status;
  static constexpr double most = request_limits::max_quantity;
  static constexpr auto fields =
      std::tuple{field("client_id", &L::client_id),
                 field("has", &L::has, presence::optional),
                 field("wants", &L::wants, presence::optional).within(0, most),
                 field("subclients", &L::subclients, presence::optional).within(0, most),
                 field("is_server", &L::is_server, presence::optional),
                 field("outstanding", &L::outstanding, presence::optional).within(0, most),
                 field("bands", &L::bands, presence::optional)
                     .at_most(static_cast<std::size_t>(request_limits::max_bands))};
};

template <>
struct wire_message<status_response> {
  using S = status_response;
  static constexpr auto most = static_cast<std::size_t>(request_limits::max_status_limit);
  static constexpr auto fields = std::tuple{
      field("mastership", &S::mastership), field("resources", &S::resources).at_most(most),
      field("leases", &S::leases, presence::optional).at_most(most),
      field("lease_count", &S::lease_count, presence::optional)};
};

namespace detail {

/// Calls `f(std::integral_constant<std::size_t, I>{}, field_I)` for each field of `T`, in order.
template <described_message T, class F>
constexpr void for_each_field(F&& f) {
  constexpr auto& fields = wire_message<T>::fields;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (f(std::integral_constant<std::size_t, I>{}, std::get<I>(fields)), ...);
  }
  (std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<decltype(fields)>>>{});
}

/// The fields of `T` that must be present, as a mask of their positions.
template <described_message T>
constexpr unsigned required_fields() {
  unsigned mask = 0;
  for_each_field<T>([&](auto i, const auto& f) {
    if (f.when == presence::required) mask |= 1u << i();
  });
  return mask;
}

/// The positions of `T`'s fields sorted by name (the order nlohmann/json writes an object in).
template <described_message T>
constexpr auto fields_by_name() {
  constexpr auto& fields = wire_message<T>::fields;
  constexpr std::size_t n = std::tuple_size_v<std::remove_cvref_t<decltype(fields)>>;
  std::array<std::string_view, n> names{};
  for_each_field<T>([&](auto i, const auto& f) { names[i()] = f.name; });
  std::array<std::size_t, n> order{};
  for (std::size_t i = 0; i < n; ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return names[a] < names[b]; });
  return order;
}

inline request_error invalid(std::string path, std::string_view reason) {
  std::string message = path + ": " + std::string(reason);
  return {errc::invalid_params, std::move(message), std::move(path)};
}

// Paths are only built when something is wrong: validation of a good request allocates nothing.
inline std::string element(std::string_view list, std::size_t i, std::string_view field = {}) {
  return std::string(list) + "[" + std::to_string(i) + "]" + std::string(field);
}

inline const char* id_problem(std::string_view id) noexcept {
  if (id.empty()) return "must be a non-empty string";
  if (id.size() > request_limits::max_id_bytes) return "must be at most 256 bytes";
  return nullptr;
}

inline std::optional<request_error> check_id(std::string_view id, std::string_view path) {
  if (const char* problem = id_problem(id)) return invalid(std::string(path), problem);
  return std::nullopt;
}

/// A quantity (wants, capacity, outstanding): finite, in [0, max_quantity]. (NaN fails both.)
inline bool valid_quantity(double v) noexcept {
  return v >= 0 && v <= request_limits::max_quantity;
}
inline constexpr const char* quantity_problem = "must be a finite number between 0 and 1e15";

/// `v` brought within [0, max_quantity] (NaN and negatives to 0): for what a node computes and
/// then sends (a grant, an intermediate's demand) or measures (a client's wants).
inline double bounded_quantity(double v) noexcept {
  return v > 0 ? std::min(v, request_limits::max_quantity) : 0.0;
}

/// Throws `std::invalid_argument` ("wants must be ...") unless `v` is a valid quantity: for a
/// user's own arguments, which the protocol would refuse later.
inline void require_quantity(double v, std::string_view what) {
  if (!valid_quantity(v)) {
    throw std::invalid_argument(std::string(what) + " " + quantity_problem);
  }
}

/// What is wrong with a lease on the wire (the field and why), or null: capacity a quantity,
/// `expires_in` within ±max_seconds, `refresh_interval` within [0, max_seconds].
struct lease_problem {
  const char* field;
  const char* reason;
};
inline std::optional<lease_problem> check_lease_values(const lease_info& l) noexcept {
  constexpr double limit = request_limits::max_seconds;
  if (!valid_quantity(l.capacity)) return lease_problem{".capacity", quantity_problem};
  if (!(l.expires_in >= -limit && l.expires_in <= limit)) {
    return lease_problem{".expires_in", "must be a finite number between -1e6 and 1e6"};
  }
  if (!(l.refresh_interval >= 0 && l.refresh_interval <= limit)) {
    return lease_problem{".refresh_interval", "must be a finite number between 0 and 1e6"};
  }
  return std::nullopt;
}

inline std::optional<request_error> check_lease(const lease_info& l, std::string_view list,
                                                std::size_t i) {
  if (const auto p = check_lease_values(l)) {
    return invalid(element(list, i, std::string(".has") + p->field), p->reason);
  }
  return std::nullopt;
}

// A budget report at `path`: its window a start in Unix seconds, its spend a quantity.
inline std::optional<request_error> check_spend(const budget_spend& s, const std::string& path) {
  if (!(s.window >= 0 && static_cast<double>(s.window) <= request_limits::max_window_start)) {
    return invalid(path + ".window", "must be an integer between 0 and 1e11");
  }
  if (!valid_quantity(s.spent)) return invalid(path + ".spent", quantity_problem);
  return std::nullopt;
}

// Overload signals at `path`: counts, of which the overloads are some of the calls.
inline std::optional<request_error> check_signals(const overload_signals& s,
                                                  const std::string& path) {
  if (!valid_quantity(s.calls)) return invalid(path + ".calls", quantity_problem);
  if (!valid_quantity(s.overloads)) return invalid(path + ".overloads", quantity_problem);
  if (s.overloads > s.calls) return invalid(path + ".overloads", "must be at most calls");
  return std::nullopt;
}

// The first element (in order) whose key an earlier element has: {earlier, later}. Keys are
// compared pairwise for a few elements and sorted beyond that, so a long list costs
// O(n log n); nothing is allocated for a short one.
template <class KeyOf>
std::optional<std::pair<std::size_t, std::size_t>> first_duplicate(std::size_t n, KeyOf key_of) {
  std::optional<std::pair<std::size_t, std::size_t>> found;
  if (n <= 16) {
    for (std::size_t j = 1; j < n; ++j) {
      for (std::size_t k = 0; k < j; ++k) {
        if (key_of(k) == key_of(j)) return std::pair{k, j};
      }
    }
    return found;
  }
  using key = std::decay_t<decltype(key_of(std::size_t{}))>;
  std::vector<std::pair<key, std::size_t>> order;
  order.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    order.emplace_back(key_of(i), i);
  std::sort(order.begin(), order.end());
  // In a run of equal keys (sorted by index), the run's second element is its earliest
  // duplicate, and the first is what it duplicates.
  for (std::size_t i = 1; i < n; ++i) {
    const bool run_starts_before =
        order[i].first == order[i - 1].first && (i < 2 || order[i - 2].first != order[i].first);
    if (run_starts_before && (!found || order[i].second < found->second)) {
      found = {order[i - 1].second, order[i].second};
    }
  }
  return found;
}

// Checks the count, each id (at `resources[i]` + `suffix`) and uniqueness.
template <class Range, class IdOf>
std::optional<request_error> check_resource_ids(const Range& resources, IdOf id_of,
                                                std::string_view suffix) {
  constexpr std::string_view list = "resources";
  const std::size_t n = resources.size();
  if (n > request_limits::max_resources) {
    return invalid(std::string(list), "must hold at most 10000 resources");
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (const char* problem = id_problem(id_of(resources[i]))) {
      return invalid(element(list, i, suffix), problem);
    }
  }
  const auto duplicate =
      first_duplicate(n, [&](std::size_t i) -> std::string_view { return id_of(resources[i]); });
  if (duplicate) {
    return invalid(
        element(list, duplicate->second),
        "duplicate resource id \"" + std::string(id_of(resources[duplicate->second])) + "\"");
  }
  return std::nullopt;
}

// What every request of resources checks: its caller's id (`id`, the field `id_name`), the
// resources' ids (how many, each, unique), then `check_one(item, i)` for each item in order.
template <class Items, class CheckOne>
std::optional<request_error> check_items(std::string_view id, std::string_view id_name,
                                         const Items& items, CheckOne check_one) {
  if (auto e = check_id(id, id_name)) return e;
  if (auto e = check_resource_ids(
          items, [](const auto& x) -> std::string_view { return x.resource_id; }, ".resource_id")) {
    return e;
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (auto e = check_one(items[i], i)) return e;
  }
  return std::nullopt;
}

}  // namespace detail

/// What is wrong with a grant in a server's answer (`gets.capacity: must be ...`), or nothing:
/// the checks a client and an intermediate apply before adopting it. `gets` as a lease on the
/// wire, with `expires_in` >= 0; `safe_capacity` in [0, max_quantity] or -1 (unlimited).
[[nodiscard]] inline std::optional<std::string> check_grant(const lease_info& gets,
                                                            double safe_capacity) {
  if (const auto p = detail::check_lease_values(gets)) {
    return std::string("gets") + p->field + ": " + p->reason;
  }
  if (gets.expires_in < 0) return std::string("gets.expires_in: must be >= 0");
  if (!detail::valid_quantity(safe_capacity) && safe_capacity != -1) {
    return std::string("safe_capacity: must be between 0 and 1e15, or -1 for unlimited");
  }
  return std::nullopt;
}

/// Which grants of a server's answer to adopt (`adopt[i]` for `grants[i]`): those for a resource
/// the request asked for (`asked`, sorted), the first for each, and passing `check_grant`. The
/// rest are counted, with the first one's problem for the log line.
struct screened_grants {
  std::vector<bool> adopt;
  std::size_t ignored = 0;
  std::string first_problem;  ///< e.g. `resources[3].resource_id: not asked for`

  /// `"<who>: 2 of 5 grants ignored (first: ...)"`.
  [[nodiscard]] std::string log_line(std::string_view who) const {
    return "warning: " + std::string(who) + ": " + std::to_string(ignored) + " of " +
           std::to_string(adopt.size()) + " grants ignored (first: " + first_problem + ")";
  }
};

template <class Grant>
[[nodiscard]] screened_grants screen_grants(const std::vector<Grant>& grants,
                                            const std::vector<std::string>& asked) {
  screened_grants out;
  out.adopt.assign(grants.size(), false);
  std::vector<bool> granted(asked.size(), false);
  for (std::size_t i = 0; i < grants.size(); ++i) {
    const auto& g = grants[i];
    const auto at = std::lower_bound(asked.begin(), asked.end(), g.resource_id);
    const auto k = static_cast<std::size_t>(at - asked.begin());
    std::optional<std::string> problem;
    if (at == asked.end() || *at != g.resource_id) {
      problem = "resource_id: not asked for";
    } else if (granted[k]) {
      problem = "resource_id: granted twice";
    } else {
      problem = check_grant(g.gets, g.safe_capacity);
    }
    if (problem) {
      if (out.ignored++ == 0) {
        out.first_problem = "resources[" + std::to_string(i) + "]." + *problem;
      }
      continue;
    }
    granted[k] = true;
    out.adopt[i] = true;
  }
  return out;
}

/// Screens `grants` (`screen_grants`) and calls `adopt(grant)` for each one adopted, in order;
/// the others are added to `ignored` and, if there are any, `log` (when set) receives one line
/// naming `who` answered ("parent's answer: 2 of 3 grants ignored (first: ...)").
template <class Grant, class Adopt, class Log>
void adopt_screened(const std::vector<Grant>& grants, const std::vector<std::string>& asked,
                    std::uint64_t& ignored, const Log& log, std::string_view who, Adopt&& adopt) {
  const auto screen = screen_grants(grants, asked);
  for (std::size_t i = 0; i < grants.size(); ++i) {
    if (screen.adopt[i]) adopt(grants[i]);
  }
  if (screen.ignored > 0) {
    ignored += screen.ignored;
    if (log) log(screen.log_line(who));
  }
}

/// Why `r` is invalid (the message names the field), or nothing.
[[nodiscard]] inline std::optional<request_error> validate(const capacity_request& r) {
  return detail::check_items(
      r.client_id, "client_id", r.resources,
      [](const resource_request& x, std::size_t i) -> std::optional<request_error> {
        if (!detail::valid_quantity(x.wants)) {
          return detail::invalid(detail::element("resources", i, ".wants"),
                                 detail::quantity_problem);
        }
        if (x.has) {
          if (auto e = detail::check_lease(*x.has, "resources", i)) return e;
        }
        if (x.signals) {
          if (auto e =
                  detail::check_signals(*x.signals, detail::element("resources", i, ".signals"))) {
            return e;
          }
        }
        if (x.spend)
          return detail::check_spend(*x.spend, detail::element("resources", i, ".spend"));
        return std::nullopt;
      });
}

/// Why `r` is invalid (the message names the field), or nothing.
[[nodiscard]] inline std::optional<request_error> validate(const server_capacity_request& r) {
  return detail::check_items(
      r.server_id, "server_id", r.resources,
      [](const server_resource_request& x, std::size_t i) -> std::optional<request_error> {
        auto at = [i](std::string_view field) { return detail::element("resources", i, field); };
        if (x.has) {
          if (auto e = detail::check_lease(*x.has, "resources", i)) return e;
        }
        if (!detail::valid_quantity(x.outstanding)) {
          return detail::invalid(at(".outstanding"), detail::quantity_problem);
        }
        if (x.wants.empty()) return detail::invalid(at(".wants"), "must hold at least one band");
        if (x.wants.size() > request_limits::max_bands) {
          return detail::invalid(at(".wants"), "must hold at most 1000 bands");
        }
        for (std::size_t j = 0; j < x.wants.size(); ++j) {
          const auto& b = x.wants[j];
          auto band_at = [&](std::string_view field) {
            return at(".wants[" + std::to_string(j) + "]" + std::string(field));
          };
          if (b.num_clients < 1 || b.num_clients > request_limits::max_num_clients) {
            return detail::invalid(band_at(".num_clients"),
                                   "must be an integer between 1 and 1000000000");
          }
          if (!detail::valid_quantity(b.wants)) {
            return detail::invalid(band_at(".wants"), detail::quantity_problem);
          }
        }
        if (const auto dup = detail::first_duplicate(
                x.wants.size(), [&](std::size_t k) { return x.wants[k].priority; })) {
          return detail::invalid(at(".wants[" + std::to_string(dup->second) + "].priority"),
                                 "duplicates wants[" + std::to_string(dup->first) + "].priority");
        }
        if (x.signals) {
          if (auto e = detail::check_signals(*x.signals, at(".signals"))) return e;
        }
        if (x.spend) return detail::check_spend(*x.spend, at(".spend"));
        return std::nullopt;
      });
}

/// Why `r` is invalid (the message names the field), or nothing.
[[nodiscard]] inline std::optional<request_error> validate(const release_request& r) {
  if (auto e = detail::check_id(r.client_id, "client_id")) return e;
  if (auto e = detail::check_resource_ids(
          r.resources, [](const std::string& x) -> std::string_view { return x; }, "")) {
    return e;
  }
  if (r.spends.empty()) return std::nullopt;
  std::vector<std::string_view> listed(r.resources.begin(), r.resources.end());
  std::sort(listed.begin(), listed.end());
  for (std::size_t i = 0; i < r.spends.size(); ++i) {
    const auto at = [i](std::string_view f) { return detail::element("spends", i, f); };
    if (!std::binary_search(listed.begin(), listed.end(), r.spends[i].resource_id)) {
      return detail::invalid(at(".resource_id"), "must be one of resources");
    }
    if (auto e = detail::check_spend({r.spends[i].window, r.spends[i].spent}, at(""))) return e;
  }
  if (const auto dup = detail::first_duplicate(r.spends.size(), [&](std::size_t k) {
        return std::string_view(r.spends[k].resource_id);
      })) {
    return detail::invalid(detail::element("spends", dup->second, ".resource_id"),
                           "duplicates spends[" + std::to_string(dup->first) + "].resource_id");
  }
  return std::nullopt;
}

/// Why `r` is invalid (the message names the field), or nothing.
[[nodiscard]] inline std::optional<request_error> validate(const count_request& r) {
  return detail::check_items(r.client_id, "client_id", r.resources,
                             [](const hit_count& x, std::size_t i) -> std::optional<request_error> {
                               if (!(x.hits >= 0 && x.hits <= request_limits::max_hits)) {
                                 return detail::invalid(detail::element("resources", i, ".hits"),
                                                        "must be a number between 0 and 1e9");
                               }
                               if (!(x.window >= request_limits::min_window_seconds &&
                                     x.window <= request_limits::max_window_seconds)) {
                                 return detail::invalid(
                                     detail::element("resources", i, ".window"),
                                     "must be between 0.001 and 31622400 seconds (366 days)");
                               }
                               return std::nullopt;
                             });
}

/// Why `r` is invalid (the message names the field), or nothing.
[[nodiscard]] inline std::optional<request_error> validate(const status_request& r,
                                                           const lease_page& page = {}) {
  if (!r.resource_id) {
    if (page.offset != 0 || page.limit) {
      return detail::invalid(page.limit ? "limit" : "offset", "only with resource_id");
    }
    return std::nullopt;
  }
  if (page.offset < 0 || page.offset > request_limits::max_status_offset) {
    return detail::invalid("offset", "must be between 0 and 1000000000");
  }
  if (page.limit && (*page.limit < 1 || *page.limit > request_limits::max_status_limit)) {
    return detail::invalid("limit", "must be between 1 and 1000000");
  }
  return detail::check_id(*r.resource_id, "resource_id");
}

}  // namespace doorman
