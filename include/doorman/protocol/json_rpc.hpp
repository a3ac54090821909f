#pragma once

/// \file
/// The JSON-RPC 2.0 envelope (DESIGN §5): parsing one request line, building responses, the
/// error codes. Sans-I/O; never throws on bad input.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <nlohmann/json.hpp>

namespace doorman {

/// JSON-RPC 2.0 error codes used by doorman.
enum class rpc_code : int {
  parse_error = -32700,       ///< not valid JSON
  invalid_request = -32600,   ///< valid JSON, but not a JSON-RPC 2.0 request object
  method_not_found = -32601,  ///< no such method
  invalid_params = -32602,    ///< the message names the offending field
  server_error = -32000,      ///< the node failed (never the caller's fault)
};

/// A well-formed request envelope.
struct rpc_request {
  nlohmann::json id;          ///< string, number or null; meaningless for a notification
  bool notification = false;  ///< no "id" member: the caller wants no answer
  std::string method;
  nlohmann::json params;  ///< object, or null when absent
};

/// An error response to send (when `send` is false, the request was a notification and
/// nothing is sent).
struct rpc_failure {
  nlohmann::json response;
  bool send = true;
};

/// `{"jsonrpc":"2.0","id":id,"result":result}`
[[nodiscard]] inline nlohmann::json make_result(const nlohmann::json& id, nlohmann::json result) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

/// `{"jsonrpc":"2.0","id":id,"error":{"code":code,"message":message}}`
[[nodiscard]] inline nlohmann::json make_error(const nlohmann::json& id, rpc_code code,
                                               std::string message) {
  return {{"jsonrpc", "2.0"},
          {"id", id},
          {"error", {{"code", static_cast<int>(code)}, {"message", std::move(message)}}}};
}

/// Serializes a message as one compact line (without the newline). Never throws: strings that
/// are not valid UTF-8 have their bad bytes replaced.
[[nodiscard]] inline std::string to_line(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// Parses one line into a request envelope, or the error response it deserves.
///
/// Batches (JSON arrays) are not supported and get `invalid_request`. A request with an
/// unusable envelope gets an answer with id null, as JSON-RPC 2.0 asks.
[[nodiscard]] inline std::variant<rpc_request, rpc_failure> parse_request(std::string_view line) {
  using json = nlohmann::json;
  json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return rpc_failure{make_error(nullptr, rpc_code::parse_error, "parse error: not valid JSON")};
  }
  if (j.is_array()) {
    return rpc_failure{
        make_error(nullptr, rpc_code::invalid_request, "batch requests are not supported")};
  }
  if (!j.is_object()) {
    return rpc_failure{
        make_error(nullptr, rpc_code::invalid_request, "a request must be a JSON object")};
  }
  rpc_request r;
  const auto id = j.find("id");
  r.notification = id == j.end();
  if (!r.notification) {
    if (!(id->is_string() || id->is_number() || id->is_null())) {
      return rpc_failure{
          make_error(nullptr, rpc_code::invalid_request, "id: must be a string, a number or null")};
    }
    r.id = *id;
  }
  auto fail = [&](rpc_code code, std::string message) -> std::variant<rpc_request, rpc_failure> {
    return rpc_failure{make_error(r.id, code, std::move(message)), !r.notification};
  };
  const auto version = j.find("jsonrpc");
  if (version == j.end() || !version->is_string() ||
      version->get_ref<const std::string&>() != "2.0") {
    return fail(rpc_code::invalid_request, "jsonrpc: must be \"2.0\"");
  }
  const auto method = j.find("method");
  if (method == j.end() || !method->is_string()) {
    return fail(rpc_code::invalid_request, "method: must be a string");
  }
  r.method = method->get<std::string>();
  if (const auto params = j.find("params"); params != j.end()) {
    if (!params->is_object() && !params->is_null()) {
      return fail(rpc_code::invalid_params, "params: must be an object");
    }
    r.params = std::move(*params);
  }
  return r;
}

}  // namespace doorman
