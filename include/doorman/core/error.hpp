#pragma once

/// \file
/// Error codes shared by the layers, and the error value that names the offending field.

#include <string>
#include <system_error>
#include <utility>

namespace doorman {

/// Errors of the core and the protocol. Values are stable.
enum class errc {
  invalid_config = 1,  ///< a resource repository failed validation (`config_error::code`)
  invalid_params,      ///< a request's parameters failed validation (JSON-RPC -32602)
};

namespace detail {

class error_category_impl final : public std::error_category {
 public:
  [[nodiscard]] const char* name() const noexcept override { return "doorman"; }
  [[nodiscard]] std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::invalid_config:
        return "invalid configuration";
      case errc::invalid_params:
        return "invalid params";
    }
    return "unknown doorman error";
  }
};

}  // namespace detail

/// The category of `doorman::errc`.
[[nodiscard]] inline const std::error_category& error_category() noexcept {
  static const detail::error_category_impl category;
  return category;
}

[[nodiscard]] inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/// An error with a message that names what was wrong, e.g.
/// `params.resources[0].wants: must be a finite number >= 0`.
struct request_error {
  errc code = errc::invalid_params;
  std::string message;
};

/// Either a value or a `request_error`: what the engine's calls return.
///
///     auto r = engine.get_capacity(request, now);
///     if (!r) log(r.error().message); else use(r.value());
template <class T>
class result {
 public:
  result(T value) : value_(std::move(value)), ok_(true) {}   // NOLINT: implicit by design
  result(request_error error) : error_(std::move(error)) {}  // NOLINT: implicit by design

  [[nodiscard]] explicit operator bool() const noexcept { return ok_; }
  [[nodiscard]] bool has_value() const noexcept { return ok_; }
  [[nodiscard]] T& value() & { return value_; }
  [[nodiscard]] const T& value() const& { return value_; }
  [[nodiscard]] T&& value() && { return std::move(value_); }
  [[nodiscard]] const request_error& error() const noexcept { return error_; }

 private:
  T value_{};
  request_error error_{};
  bool ok_ = false;
};

}  // namespace doorman

template <>
struct std::is_error_code_enum<doorman::errc> : std::true_type {};
