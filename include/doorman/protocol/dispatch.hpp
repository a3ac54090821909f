#pragma once

/// \file
/// One JSON-RPC line in, one line (or nothing) out, against an engine: the whole protocol logic
/// of a server session, sans-I/O. The network layer only frames lines and calls this.
///
///     if (auto reply = doorman::handle_line(engine, line, clock.now(), identity))
///       write(*reply + "\n");

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "doorman/core/engine.hpp"
#include "doorman/protocol/codec.hpp"
#include "doorman/protocol/hot_path.hpp"
#include "doorman/protocol/json_rpc.hpp"
#include "doorman/protocol/service.hpp"

namespace doorman {

namespace detail {

inline std::optional<rpc_code> error_of(const nlohmann::json& response) {
  const auto e = response.find("error");
  if (e == response.end()) return std::nullopt;
  return static_cast<rpc_code>(e->value("code", static_cast<int>(rpc_code::server_error)));
}

// One method's DOM answer: decode, the service's call path, encode.
template <class M, class Engine>
nlohmann::json dom_call(Engine& eng, const rpc_request& req, typename Engine::time_point now,
                        const call_context& ctx) {
  typename M::request decoded;
  if (auto err = decode(req.params, decoded)) {
    return make_error(req.id, rpc_code::invalid_params, err->message);
  }
  auto r = call_method<M>(eng, decoded, now, ctx);
  if (!r) return make_error(req.id, r.code(), r.message());
  return make_result(req.id, nlohmann::json(r.value()));
}

// The id of a plain envelope as a JSON value (for an error answer).
inline nlohmann::json id_value(std::string_view written) {
  return written.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(written);
}

// The service's call path, then the answer: the hot path once its request is read. False for
// a notification.
template <class M, class Engine>
bool hot_call(std::string& out, Engine& eng, const plain_envelope& env,
              const typename M::request& request, typename Engine::time_point now,
              dispatch_record& rec, call_guard* guard) {
  auto r = call_method<M>(eng, request, now, {nullptr, guard});
  if (r) {
    if (env.id.empty()) return false;
    write_capacity_answer(out, env.id, r.value());
    return true;
  }
  rec.error = r.code();
  if (env.id.empty()) return false;
  out += to_line(make_error(id_value(env.id), r.code(), r.message()));
  return true;
}

// A hot request read in the plain form (doorman/protocol/hot_path.hpp): its envelope, its
// method and, for that method, its params.
struct hot_request {
  plain_envelope envelope;
  rpc_method method = rpc_method::other;
  capacity_request client;
  server_capacity_request server;
};

// Reads `line` into `out`; false when it is not a hot request in the plain form.
inline bool read_hot_request(std::string_view line, hot_request& out) {
  wire_reader in(line);
  return read_envelope(in, out.envelope, [&](std::string_view name) {
    if (name == methods::get_capacity::name) {
      out.method = rpc_method::get_capacity;
      return read_fields(in, out.client);
    }
    if (name == methods::get_server_capacity::name) {
      out.method = rpc_method::get_server_capacity;
      return read_fields(in, out.server);
    }
    return false;
  });
}

// Decides a hot request read by `read_hot_request`; false for a notification.
template <class Engine>
bool run_hot(std::string& out, Engine& eng, const hot_request& req, typename Engine::time_point now,
             dispatch_record& rec, call_guard* guard) {
  rec.method = req.method;
  if (req.method == rpc_method::get_capacity) {
    return hot_call<methods::get_capacity>(out, eng, req.envelope, req.client, now, rec, guard);
  }
  return hot_call<methods::get_server_capacity>(out, eng, req.envelope, req.server, now, rec,
                                                guard);
}

// Prefetches the engine's lookups for a hot request (`Engine::prefetch`, stage 0 or 1).
template <class Engine>
void prefetch_hot(const Engine& eng, const hot_request& req, int stage) noexcept {
  if (req.method == rpc_method::get_capacity) {
    eng.prefetch(req.client, req.client.client_id, stage);
  } else {
    eng.prefetch(req.server, req.server.server_id, stage);
  }
}

// The DOM path: any line, the reference for every answer.
template <class Engine>
std::optional<nlohmann::json> dom_path(Engine& eng, std::string_view line,
                                       typename Engine::time_point now,
                                       const node_identity& identity, dispatch_record& rec,
                                       call_guard* guard) {
  auto parsed = parse_request(line);
  if (auto* failure = std::get_if<rpc_failure>(&parsed)) {
    rec.error = error_of(failure->response);
    if (!failure->send) return std::nullopt;
    return std::move(failure->response);
  }
  const rpc_request& req = std::get<rpc_request>(parsed);
  nlohmann::json response;
  const call_context ctx{&identity, guard};
  const bool found = for_some_method([&]<class M>() {
    if (req.method != M::name) return false;
    rec.method = M::id;
    response = dom_call<M>(eng, req, now, ctx);
    return true;
  });
  if (!found) {
    rec.method = rpc_method::other;
    response = make_error(req.id, rpc_code::method_not_found, "method not found: " + req.method);
  }
  rec.error = error_of(response);
  if (req.notification) return std::nullopt;
  return response;
}

// Runs `body` (which answers into `out`), turning an exception into a `server_error` answer
// in place of whatever it had written.
template <class Body>
bool guarded_answer(std::string& out, dispatch_record& rec, Body&& body) {
  const std::size_t before = out.size();
  try {
    return body();
  } catch (const std::exception& e) {
    out.resize(before);
    rec.error = rpc_code::server_error;
    out += to_line(
        make_error(nullptr, rpc_code::server_error, std::string("server error: ") + e.what()));
    return true;
  }
}

// The DOM path's answer into `out`.
template <class Engine>
bool dom_answer(std::string& out, Engine& eng, std::string_view line,
                typename Engine::time_point now, const node_identity& identity,
                dispatch_record& rec, call_guard* guard) {
  auto response = dom_path(eng, line, now, identity, rec, guard);
  if (!response) return false;
  out += to_line(*response);
  return true;
}

// `handle_line_to`, with the hot path or (`hot` false, for tests) only the DOM path.
template <class Engine>
bool dispatch(std::string& out, Engine& eng, std::string_view line, typename Engine::time_point now,
              const node_identity& identity, dispatch_record* record, call_guard* guard, bool hot) {
  dispatch_record ignored;
  dispatch_record& rec = record ? *record : ignored;
  rec = {};
  return guarded_answer(out, rec, [&] {
    if (hot) {
      hot_request req;
      if (read_hot_request(line, req)) return run_hot(out, eng, req, now, rec, guard);
    }
    return dom_answer(out, eng, line, now, identity, rec, guard);
  });
}

/// Hot requests read and prefetched together by `handle_lines_to`.
inline constexpr std::size_t hot_batch = 16;

}  // namespace detail

/// Handles one request line, appending the answer (without a newline) to `out`. Returns
/// whether it answered (not for a notification). Never throws: a failure inside the node
/// becomes a `server_error` answer. Invalid input changes no state. `record`, when given,
/// receives the method and outcome; `guard`, when given, may refuse a call (see `call_guard`).
///
/// `get_capacity` and `get_server_capacity` in their plain form (doorman/protocol/hot_path.hpp)
/// are read and answered without a JSON DOM; every other line takes the DOM path, and both
/// write the same bytes.
template <class Engine>
bool handle_line_to(std::string& out, Engine& eng, std::string_view line,
                    typename Engine::time_point now, const node_identity& identity = {},
                    dispatch_record* record = nullptr, call_guard* guard = nullptr) {
  return detail::dispatch(out, eng, line, now, identity, record, guard, true);
}

/// `handle_line_to`, returning the answer line (no newline), or nothing for a notification.
template <class Engine>
[[nodiscard]] std::optional<std::string> handle_line(Engine& eng, std::string_view line,
                                                     typename Engine::time_point now,
                                                     const node_identity& identity = {},
                                                     dispatch_record* record = nullptr,
                                                     call_guard* guard = nullptr) {
  std::string out;
  if (!handle_line_to(out, eng, line, now, identity, record, guard)) return std::nullopt;
  return out;
}

/// Handles the lines of one read, in order, as `handle_line_to` handles each, appending each
/// answer and its newline to `out`; returns how many answers it appended. `done(i, record)` is
/// called as line `i` is answered. The hot requests among up to `detail::hot_batch` lines are
/// read first, and the engine's lookups for all of them prefetched before the first is
/// decided, so that with many clients their cache misses overlap.
template <class Engine, class Done>
std::size_t handle_lines_to(std::string& out, Engine& eng, std::span<const std::string_view> lines,
                            typename Engine::time_point now, const node_identity& identity,
                            call_guard* guard, Done&& done) {
  std::size_t answers = 0;
  std::array<detail::hot_request, detail::hot_batch> reqs;
  std::array<bool, detail::hot_batch> plain{};
  for (std::size_t start = 0; start < lines.size(); start += detail::hot_batch) {
    const std::size_t n = std::min(detail::hot_batch, lines.size() - start);
    for (std::size_t i = 0; i < n; ++i) {
      reqs[i] = {};
      try {
        plain[i] = detail::read_hot_request(lines[start + i], reqs[i]);
      } catch (const std::exception&) {
        plain[i] = false;  // the DOM path answers it (or fails the same way)
      }
    }
    for (const int stage : {0, 1}) {
      for (std::size_t i = 0; i < n; ++i)
        if (plain[i]) detail::prefetch_hot(eng, reqs[i], stage);
    }
    for (std::size_t i = 0; i < n; ++i) {
      dispatch_record rec;
      const bool answered = detail::guarded_answer(out, rec, [&] {
        if (plain[i]) return detail::run_hot(out, eng, reqs[i], now, rec, guard);
        return detail::dom_answer(out, eng, lines[start + i], now, identity, rec, guard);
      });
      if (answered) {
        out += '\n';
        ++answers;
      }
      done(start + i, rec);
    }
  }
  return answers;
}

}  // namespace doorman
