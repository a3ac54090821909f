#pragma once

/// \file
/// One JSON-RPC line in, one line (or nothing) out, against an engine: the whole protocol logic
/// of a server session, sans-I/O. The network layer only frames lines and calls this.
///
///     if (auto reply = doorman::handle_line(engine, line, clock.now(), identity))
///       write(*reply + "\n");

#include <exception>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "doorman/core/engine.hpp"
#include "doorman/protocol/codec.hpp"
#include "doorman/protocol/json_rpc.hpp"

namespace doorman {

/// What a node says about itself in `status`.
struct node_identity {
  std::string id;             ///< e.g. the listening address
  std::string role = "root";  ///< "root" or "intermediate"
  int level = 0;              ///< 0 at the root, parent's level + 1 below it
  std::optional<std::string> parent;
};

namespace detail {

template <class Request, class Call>
nlohmann::json call_engine(const rpc_request& req, Call&& call) {
  Request decoded;
  if (auto err = decode(req.params, decoded)) {
    return make_error(req.id, rpc_code::invalid_params, err->message);
  }
  auto result = call(decoded);
  if (!result) {  // the engine names fields within the params
    return make_error(req.id, rpc_code::invalid_params, "params." + result.error().message);
  }
  return make_result(req.id, nlohmann::json(result.value()));
}

}  // namespace detail

/// Handles one request line. Returns the response line (no newline), or nothing for a
/// notification. Never throws: a failure inside the node becomes a `server_error` answer.
/// Invalid input changes no state.
template <class Engine>
[[nodiscard]] std::optional<std::string> handle_line(Engine& eng, std::string_view line,
                                                     typename Engine::time_point now,
                                                     const node_identity& identity = {}) {
  try {
    auto parsed = parse_request(line);
    if (auto* failure = std::get_if<rpc_failure>(&parsed)) {
      if (!failure->send) return std::nullopt;
      return to_line(failure->response);
    }
    const rpc_request& req = std::get<rpc_request>(parsed);
    nlohmann::json response;
    if (req.method == "get_capacity") {
      response = detail::call_engine<capacity_request>(
          req, [&](const capacity_request& r) { return eng.get_capacity(r, now); });
    } else if (req.method == "get_server_capacity") {
      response = detail::call_engine<server_capacity_request>(
          req, [&](const server_capacity_request& r) { return eng.get_server_capacity(r, now); });
    } else if (req.method == "release_capacity") {
      response = detail::call_engine<release_request>(
          req, [&](const release_request& r) { return eng.release_capacity(r, now); });
    } else if (req.method == "discovery") {
      response = make_result(req.id, nlohmann::json(eng.discovery()));
    } else if (req.method == "status") {
      response = detail::call_engine<status_request>(
          req, [&](const status_request& r) { return eng.status(r, now); });
      if (auto result = response.find("result"); result != response.end()) {
        (*result)["id"] = identity.id;
        (*result)["role"] = identity.role;
        (*result)["level"] = identity.level;
        (*result)["parent"] = identity.parent ? nlohmann::json(*identity.parent) : nullptr;
        (*result)["master"] = (*result)["mastership"]["master"];
      }
    } else {
      response = make_error(req.id, rpc_code::method_not_found, "method not found: " + req.method);
    }
    if (req.notification) return std::nullopt;
    return to_line(response);
  } catch (const std::exception& e) {
    return to_line(
        make_error(nullptr, rpc_code::server_error, std::string("server error: ") + e.what()));
  }
}

}  // namespace doorman
