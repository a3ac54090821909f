#pragma once

/// \file
/// The one way doorman reads JSON it did not write (a configuration, a request's params, a
/// server's answer): field by field, each check naming the field's path, the first problem
/// kept (`request_error`), never a throw. The configuration turns that problem into a
/// `config_error` at its edge; the protocol answers it as a JSON-RPC error.
///
///     detail::json_reader r(j, "resources[0]");
///     r.only({"identifier_glob", "capacity"});        // the configuration refuses unknown fields
///     r.string("identifier_glob", t.identifier_glob);
///     r.number("capacity", t.capacity);
///     r.at_most("capacity", t.capacity, 0, config_limits::max_capacity);
///     if (r.error()) ... // "resources[0].capacity: must be between 0 and 1e15"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "doorman/core/error.hpp"

namespace doorman::detail {

/// A limit as messages write it: 86400, 0.1, 1e15 (a power of ten from 1e6 up).
[[nodiscard]] inline std::string number_text(double v) {
  if (v >= 1e6 && v <= 1e300) {
    const double e = std::round(std::log10(v));
    if (std::pow(10.0, e) == v) return "1e" + std::to_string(static_cast<int>(e));
  }
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<std::int64_t>(v));
  }
  return nlohmann::json(v).dump();
}

class json_reader {
 public:
  using json = nlohmann::json;

  /// Reads `j`, the value at `path` ("" for a whole document).
  json_reader(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    if (!j_.is_object()) fail("", "must be an object");
  }

  [[nodiscard]] const std::optional<request_error>& error() const noexcept { return error_; }

  /// The path of field `key`.
  [[nodiscard]] std::string at(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  // Each returns whether the field was present and well typed (false on a problem, which is
  // recorded, or when an optional field is absent or null).

  bool string(const char* key, std::string& out, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_string()) return fail(key, "must be a string");
    out = v->get_ref<const std::string&>();
    return true;
  }

  bool number(const char* key, double& out, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_number()) return fail(key, "must be a number");
    out = v->get<double>();
    if (!std::isfinite(out)) return fail(key, "must be a finite number");
    if (out == 0) out = 0;  // -0 (and -0.0) is 0: the hot path reads it so too
    return true;
  }

  bool integer(const char* key, std::int64_t& out, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (v->is_number_integer()) {
      if (v->is_number_unsigned() && v->get<std::uint64_t>() > INT64_MAX) {
        return fail(key, "must be an integer in the 64-bit range");
      }
      out = v->get<std::int64_t>();
      return true;
    }
    if (v->is_number_float()) {
      const double d = v->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
        out = static_cast<std::int64_t>(d);
        return true;
      }
    }
    return fail(key, "must be an integer");
  }

  bool boolean(const char* key, bool& out, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_boolean()) return fail(key, "must be a boolean");
    out = v->get<bool>();
    return true;
  }

  /// An array field of at most `max_elements`: calls `f(element, path_of_element)` for each
  /// until one fails.
  template <class F>
  bool array(const char* key, F&& f, std::size_t max_elements, bool required = true) {
    const json* v = find(key, required);
    if (!v) return false;
    if (!v->is_array()) return fail(key, "must be an array");
    if (v->size() > max_elements) {
      return fail(
          key, "must hold at most " + number_text(static_cast<double>(max_elements)) + " elements");
    }
    for (std::size_t i = 0; i < v->size() && !error_; ++i) {
      f((*v)[i], at(key) + "[" + std::to_string(i) + "]");
    }
    return !error_;
  }

  const json* object(const char* key, bool required = true) {
    const json* v = find(key, required);
    if (!v) return nullptr;
    if (!v->is_object()) {
      fail(key, "must be an object");
      return nullptr;
    }
    return v;
  }

  /// Refuses any field not in `known` ("unknown field"), for documents written by hand.
  void only(std::initializer_list<std::string_view> known) {
    if (error_ || !j_.is_object()) return;
    for (const auto& [key, value] : j_.items()) {
      bool listed = false;
      for (const auto k : known)
        listed = listed || k == key;
      if (!listed) {
        fail(key, "unknown field");
        return;
      }
    }
  }

  /// Checks a value read from `key` against [lo, hi]: "must be between lo and hi" + `unit`.
  bool within(const char* key, double v, double lo, double hi, std::string_view unit = {}) {
    if (error_ || (v >= lo && v <= hi)) return !error_;
    return fail(
        key, "must be between " + number_text(lo) + " and " + number_text(hi) + std::string(unit));
  }

  /// Records a problem with field `key` ("" for the value itself), unless one is recorded.
  bool fail(std::string_view key, std::string_view reason) {
    if (!error_) {
      std::string where = key.empty() ? path_ : at(key);
      std::string message =
          where.empty() ? std::string(reason) : printable_text(where) + ": " + std::string(reason);
      error_ = request_error{errc::invalid_params, std::move(message), std::move(where)};
    }
    return false;
  }

  /// Keeps `e` as the problem unless one is recorded.
  void absorb(const std::optional<request_error>& e) {
    if (e && !error_) error_ = e;
  }

 private:
  const json* find(const char* key, bool required) {
    if (error_ || !j_.is_object()) return nullptr;
    const auto it = j_.find(key);
    if (it == j_.end() || (it->is_null() && !required)) {
      if (required) fail(key, "is required");
      return nullptr;
    }
    return &*it;
  }

  const json& j_;
  std::string path_;
  std::optional<request_error> error_;
};

}  // namespace doorman::detail
