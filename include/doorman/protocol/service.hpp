#pragma once

/// \file
/// The service a node offers, whatever door a call comes through: one table of methods (wire
/// name, counter slot, request and answer types, whether access control is asked, how the
/// engine decides it) and one call path (access control, then the engine, then the answer or
/// the error a door turns into its own form). The JSON-RPC door (doorman/protocol/dispatch.hpp)
/// decodes a request, calls `call_method<M>` and encodes what it returns; a new door does the
/// same with its own messages, and gets the same access decisions and the same outcomes to
/// count.
///
///     auto r = doorman::call_method<doorman::methods::get_capacity>(
///         engine, request, now, {&identity, guard});
///     if (r) send(r.value()); else fail(r.code(), r.message());

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "doorman/core/messages.hpp"
#include "doorman/protocol/codec.hpp"
#include "doorman/protocol/json_rpc.hpp"

namespace doorman {

/// What a node says about itself in `status`.
struct node_identity {
  std::string id;             ///< e.g. the listening address
  std::string role = "root";  ///< "root" or "intermediate"
  int level = 0;              ///< 0 at the root, parent's level + 1 below it
  std::optional<std::string> parent;

  /// The deepest level a node reports (a parent's level is checked against it).
  static constexpr int max_level = 999;
};

/// The methods a node serves, for counting requests (`other`: an unknown method, or a line that
/// is not a request). The order is that of `method_table`.
enum class rpc_method : std::uint8_t {
  get_capacity,
  get_server_capacity,
  release_capacity,
  discovery,
  status,
  count_hits,
  other
};

/// The doors a call can come through: the node's JSON-RPC port, and Doorman's gRPC service.
enum class rpc_door : std::uint8_t { json_rpc, grpc };

/// The metrics label of each `rpc_door`.
inline constexpr std::array<const char*, 2> rpc_door_names = {"json-rpc", "grpc"};

/// What a door did with a call, for the node's metrics and logs: the method, the error code it
/// answered with (none: a result, or a notification), and the door. Every door fills one per
/// call.
struct dispatch_record {
  rpc_method method = rpc_method::other;
  std::optional<rpc_code> error;
  rpc_door door = rpc_door::json_rpc;
};

/// Authorization for the service: each `allow` returns why the caller may not make the call
/// (it is then answered `rpc_code::forbidden` and reaches no engine), or nothing.
class call_guard {
 public:
  virtual ~call_guard() = default;
  virtual std::optional<std::string> allow(const capacity_request&) = 0;
  virtual std::optional<std::string> allow(const server_capacity_request&) = 0;
  virtual std::optional<std::string> allow(const release_request&) = 0;
  virtual std::optional<std::string> allow(const status_request&) = 0;
  virtual std::optional<std::string> allow(const count_request&) = 0;

 protected:
  call_guard() = default;
  call_guard(const call_guard&) = default;
  call_guard& operator=(const call_guard&) = default;
};

/// Who is calling and who answers: what a call needs beside its request.
struct call_context {
  const node_identity* identity = nullptr;  ///< for `status` (null: a default identity)
  call_guard* guard = nullptr;              ///< null: every call is allowed
};

/// `discovery` takes no parameters (whatever a request carries there is ignored).
struct discovery_request {};

/// `status` as the node answers it: the engine's state and who the node is.
struct node_status {
  status_response status;
  node_identity identity;
};

/// Ignores `discovery` params, as the protocol always has.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json&,
                                                         discovery_request&) {
  return std::nullopt;
}

/// `discovery` params as a channel sends them: `{}`.
inline void to_json(nlohmann::json& j, const discovery_request&) {
  j = nlohmann::json::object();
}

inline void to_json(nlohmann::json& j, const node_status& s) {
  j = s.status;
  j["id"] = s.identity.id;
  j["role"] = s.identity.role;
  j["level"] = s.identity.level;
  j["parent"] = s.identity.parent ? nlohmann::json(*s.identity.parent) : nullptr;
  j["master"] = j["mastership"]["master"];
}

/// Decodes a node's `status` answer, as a channel reads it: the engine's part as
/// `status_response` reads it, then who the node is (`id`, `role`, `parent` strings, `level`
/// an integer from 0 to `node_identity::max_level`); the error names the field.
[[nodiscard]] inline std::optional<request_error> decode(const nlohmann::json& j,
                                                         node_status& out) {
  out = {};
  if (auto e = decode(j, out.status)) return e;
  detail::field_reader r(j, "result");
  r.string("id", out.identity.id, false);
  r.string("role", out.identity.role, false);
  std::int64_t level = 0;
  if (r.integer("level", level, false)) {
    if (level < 0 || level > node_identity::max_level) {
      r.fail("level", "must be an integer from 0 to " + std::to_string(node_identity::max_level));
    } else {
      out.identity.level = static_cast<int>(level);
    }
  }
  std::string parent;
  if (r.string("parent", parent, false)) out.identity.parent = std::move(parent);
  return r.error();
}

/// A call's outcome: the answer, or the error code and message a door reports.
template <class Answer>
class call_result {
 public:
  call_result(Answer answer) : answer_(std::move(answer)) {}  // NOLINT: implicit by design
  call_result(rpc_code code, std::string message) : code_(code), message_(std::move(message)) {}

  [[nodiscard]] explicit operator bool() const noexcept { return answer_.has_value(); }
  [[nodiscard]] Answer& value() { return *answer_; }
  [[nodiscard]] const Answer& value() const { return *answer_; }
  [[nodiscard]] rpc_code code() const noexcept { return code_; }
  [[nodiscard]] const std::string& message() const noexcept { return message_; }

 private:
  std::optional<Answer> answer_;
  rpc_code code_ = rpc_code::server_error;
  std::string message_;
};

/// The metrics label (and wire name) of each `rpc_method` (the last, `other`, for what is no
/// method).
inline constexpr std::array<const char*, 7> rpc_method_names = {
    "get_capacity", "get_server_capacity", "release_capacity", "discovery", "status", "count_hits",
    "other"};

/// What every row of the table says: `name` (on the wire and in metrics), `id`, `request`,
/// `response` (what the caller receives) and `guarded` (whether the call guard is asked). A row
/// adds `decide`, the engine call, whose answer is the `response` (checked by `call_method`).
template <rpc_method Id, class Request, class Response, bool Guarded = true>
struct method_row {
  static constexpr rpc_method id = Id;
  static constexpr std::string_view name = rpc_method_names[static_cast<std::size_t>(Id)];
  static constexpr bool guarded = Guarded;
  using request = Request;
  using response = Response;
};

/// The methods, one row each. Adding a method is a row here, its place in `method_table`,
/// `rpc_method` and `rpc_method_names`, and a `decode` and `to_json` for its messages (both
/// ways: a node decodes the request, a channel the response).
namespace methods {

template <class Engine>
using time_of = typename Engine::time_point;

struct get_capacity : method_row<rpc_method::get_capacity, capacity_request, capacity_response> {
  template <class E>
  static auto decide(E& e, const request& r, time_of<E> now, const call_context&) {
    return e.get_capacity(r, now);
  }
};

struct get_server_capacity : method_row<rpc_method::get_server_capacity, server_capacity_request,
                                        server_capacity_response> {
  template <class E>
  static auto decide(E& e, const request& r, time_of<E> now, const call_context&) {
    return e.get_server_capacity(r, now);
  }
};

struct release_capacity
    : method_row<rpc_method::release_capacity, release_request, release_response> {
  template <class E>
  static auto decide(E& e, const request& r, time_of<E> now, const call_context&) {
    return e.release_capacity(r, now);
  }
};

// Who the master is: anyone may ask.
struct discovery : method_row<rpc_method::discovery, discovery_request, discovery_response, false> {
  template <class E>
  static result<discovery_response> decide(E& e, const request&, time_of<E> now,
                                           const call_context&) {
    return e.discovery(now);
  }
};

struct status : method_row<rpc_method::status, status_params, node_status> {
  template <class E>
  static result<node_status> decide(E& e, const request& r, time_of<E> now,
                                    const call_context& ctx) {
    auto st = e.status(r.request, now, r.page);
    if (!st) return st.error();
    return node_status{std::move(st).value(), ctx.identity ? *ctx.identity : node_identity{}};
  }
};

// Exact counts at the root, for limits too small to split into leases.
struct count_hits : method_row<rpc_method::count_hits, count_request, count_response> {
  template <class E>
  static auto decide(E& e, const request& r, time_of<E> now, const call_context&) {
    return e.count_hits(r, now);
  }
};

}  // namespace methods

/// Every method, in the order of `rpc_method`.
using method_table =
    std::tuple<methods::get_capacity, methods::get_server_capacity, methods::release_capacity,
               methods::discovery, methods::status, methods::count_hits>;

namespace detail {

template <std::size_t... I>
constexpr bool table_in_order(std::index_sequence<I...>) {
  return ((std::tuple_element_t<I, method_table>::id == static_cast<rpc_method>(I)) && ...);
}
static_assert(table_in_order(std::make_index_sequence<std::tuple_size_v<method_table>>{}) &&
                  std::tuple_size_v<method_table> + 1 == rpc_method_names.size(),
              "method_table, rpc_method and rpc_method_names list the methods in one order");

inline std::optional<std::string> guard_says(call_guard& guard, const status_params& p) {
  return guard.allow(p.request);
}
template <class Request>
std::optional<std::string> guard_says(call_guard& guard, const Request& r) {
  return guard.allow(r);
}

}  // namespace detail

/// The answer type of method `M`.
template <class M, class Engine>
using answer_of =
    std::remove_cvref_t<decltype(M::decide(std::declval<Engine&>(),
                                           std::declval<const typename M::request&>(),
                                           std::declval<typename Engine::time_point>(),
                                           std::declval<const call_context&>())
                                     .value())>;

/// The one call path: asks the guard (a refusal is `rpc_code::forbidden`, "forbidden: <why>",
/// and reaches no engine), then the engine (a request it rejects is `rpc_code::invalid_params`,
/// naming the field as `params.<path>`).
template <class M, class Engine>
call_result<answer_of<M, Engine>> call_method(Engine& eng, const typename M::request& request,
                                              typename Engine::time_point now,
                                              const call_context& ctx) {
  static_assert(std::is_same_v<answer_of<M, Engine>, typename M::response>,
                "a method's decide answers its row's response");
  if constexpr (M::guarded) {
    if (ctx.guard) {
      if (auto why = detail::guard_says(*ctx.guard, request)) {
        return {rpc_code::forbidden, "forbidden: " + *why};
      }
    }
  }
  auto decided = M::decide(eng, request, now, ctx);
  if (!decided) return {rpc_code::invalid_params, "params." + decided.error().message};
  return std::move(decided).value();
}

namespace detail {

template <class Request, class Table>
struct row_of_request;
template <class Request, class... M>
struct row_of_request<Request, std::tuple<M...>> {
  static_assert((std::is_same_v<Request, typename M::request> + ...) == 1,
                "one method per request type");
  using type = std::tuple_element_t<
      ((std::is_same_v<Request, typename M::request> ? static_cast<std::size_t>(M::id) : 0) + ...),
      std::tuple<M...>>;
};

}  // namespace detail

/// The method whose request is `Request` (each request type belongs to one method).
template <class Request>
using method_of_request = typename detail::row_of_request<Request, method_table>::type;

/// Calls `f.template operator()<M>()` for each method `M` of the table, in order, until one
/// returns true; returns whether one did.
template <class F>
bool for_some_method(F&& f) {
  return std::apply([&](auto... m) { return (f.template operator()<decltype(m)>() || ...); },
                    method_table{});
}

}  // namespace doorman
