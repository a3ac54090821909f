#pragma once

/// \file
/// The JSON-RPC 2.0 envelope (docs/protocol.md): parsing one request line, building responses, the
/// error codes. Sans-I/O; never throws on bad input.

#include <climits>
#include <cstdint>
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
  forbidden = -32003,         ///< the caller may not make this call (docs/security.md)
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

/// `v` as a 64-bit integer, when it is a JSON integer within that range (never a float: 1e300
/// would not convert). Nothing otherwise.
[[nodiscard]] inline std::optional<std::int64_t> as_int64(const nlohmann::json& v) noexcept {
  if (!v.is_number_integer()) return std::nullopt;
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX) return std::nullopt;
  return v.get<std::int64_t>();
}

/// What a caller makes of one answer object (matched to its call by id): a result, an error,
/// or an answer it cannot use. Read by `read_answer`, which never throws whatever the peer sent.
struct rpc_answer {
  enum class kind { result, error, malformed };
  kind type = kind::malformed;
  nlohmann::json result;  ///< the result object, when `result`
  int code = 0;           ///< the error's code when it is an integer in int's range, else 0
  std::string message;    ///< the error's message (or "error"), or why the answer is malformed
};

/// Reads an answer object: `{"error": {...}}` wins over a result; a result must be an object.
/// Wrongly typed members (`"code": "x"`, `"code": 1e300`, `"message": 5`) are read as absent.
[[nodiscard]] inline rpc_answer read_answer(const nlohmann::json& answer) {
  rpc_answer a;
  if (!answer.is_object()) {
    a.message = "answer is not an object";
    return a;
  }
  if (const auto e = answer.find("error"); e != answer.end()) {
    a.type = rpc_answer::kind::error;
    a.message = "error";
    if (e->is_object()) {
      if (const auto m = e->find("message"); m != e->end() && m->is_string()) {
        a.message = m->get<std::string>();
      }
      if (const auto c = e->find("code"); c != e->end()) {
        if (const auto v = as_int64(*c); v && *v >= INT_MIN && *v <= INT_MAX) {
          a.code = static_cast<int>(*v);
        }
      }
    }
    return a;
  }
  const auto res = answer.find("result");
  if (res == answer.end() || !res->is_object()) {
    a.message = "answer without a result object";
    return a;
  }
  a.type = rpc_answer::kind::result;
  a.result = *res;
  return a;
}

/// Where a result says the master is, when it says this server is not master: the result's
/// `mastership.is_master` is `false` (a boolean; anything else is not a redirect, and the
/// result's decoder names it). `master` is set when it is a string.
struct redirect_hint {
  bool not_master = false;
  std::optional<std::string> master;
};
[[nodiscard]] inline redirect_hint read_redirect(const nlohmann::json& result) {
  redirect_hint h;
  if (!result.is_object()) return h;
  const auto m = result.find("mastership");
  if (m == result.end() || !m->is_object()) return h;
  const auto is = m->find("is_master");
  if (is == m->end() || !is->is_boolean() || is->get<bool>()) return h;
  h.not_master = true;
  if (const auto where = m->find("master"); where != m->end() && where->is_string()) {
    h.master = where->get<std::string>();
  }
  return h;
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
