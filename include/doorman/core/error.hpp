#pragma once

/// \file
/// The error vocabulary shared by the layers: `doorman::errc` values as `std::error_code`s
/// (what a call failed with, on the network and hot paths), and the error value that names
/// the offending field of a request (`request_error`, in a `result<T>`). Exceptions are kept
/// for the startup edges (a configuration or option that cannot be used).

#include <cstddef>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace doorman {

/// Errors of the core and the protocol. Values are stable.
enum class errc {
  invalid_config = 1,  ///< a resource repository failed validation (`config_error::code`)
  invalid_params,      ///< a request's parameters failed validation (JSON-RPC -32602)
  no_master,           ///< no server answered as master (none known, or an answer said not)
  too_many_redirects,  ///< servers kept naming another master
  timed_out,           ///< no answer before the call's deadline
  unreachable,         ///< no server could be connected to, or the connection was lost
  error_answer,        ///< the server answered with an error (its message says which)
  bad_answer,          ///< an answer that is not what the protocol says
  shut_down,           ///< the object was stopped; nothing more is sent
};

namespace detail {

/// An error category named `Name` whose messages come from a table: `messages[v - 1]` for
/// value `v` (values start at 1), else `unknown`. Every enum of error values in the library
/// is one of these; its table sits next to the enum.
template <const char* Name, const char* const* Messages, std::size_t Count>
class table_category final : public std::error_category {
 public:
  [[nodiscard]] const char* name() const noexcept override { return Name; }
  [[nodiscard]] std::string message(int ev) const override {
    if (ev >= 1 && static_cast<std::size_t>(ev) <= Count) return Messages[ev - 1];
    return std::string("unknown ") + Name + " error";
  }

  /// The one instance.
  [[nodiscard]] static const std::error_category& get() noexcept {
    static const table_category category;
    return category;
  }
};

inline constexpr char errc_name[] = "doorman";
inline constexpr const char* errc_messages[] = {"invalid configuration",
                                                "invalid params",
                                                "no master found",
                                                "too many mastership redirects",
                                                "no answer before the deadline",
                                                "server unreachable",
                                                "error answer",
                                                "bad answer",
                                                "shut down"};
static_assert(std::size(errc_messages) == static_cast<std::size_t>(errc::shut_down));

}  // namespace detail

/// The category of `doorman::errc`.
[[nodiscard]] inline const std::error_category& error_category() noexcept {
  return detail::table_category<detail::errc_name, detail::errc_messages,
                                std::size(detail::errc_messages)>::get();
}

[[nodiscard]] inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

namespace detail {

/// A text as an error message writes it: control bytes (a key or a value from a file may hold
/// any) as `\xNN`, so that a message is one printable line and its C string is all of it.
[[nodiscard]] inline std::string printable_text(std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
    } else {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  return out;
}

}  // namespace detail

/// An error with a message that names what was wrong, e.g.
/// `resources[0].wants: must be a finite number between 0 and 1e15`. Paths are relative to the
/// message checked (the JSON-RPC layer puts `params.` in front).
struct request_error {
  errc code = errc::invalid_params;
  std::string message;  ///< `path: reason` (the path as `detail::printable_text` writes it)
  std::string path{};   ///< the field's path alone (may be empty)
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
