#pragma once

/// \file
/// A transparent hash of strings: an unordered map keyed by `std::string` with it (and
/// `std::equal_to<>`) is searched with a `std::string_view`, without making a string.
///
///     std::unordered_map<std::string, int, doorman::string_hash, std::equal_to<>> m;
///     m.find(std::string_view("api"));

#include <cstddef>
#include <functional>
#include <string_view>

namespace doorman {

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

}  // namespace doorman
