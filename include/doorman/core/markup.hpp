#pragma once

/// \file
/// Text made safe for HTML and SVG (XML) documents: the simulator's charts and the admin
/// endpoint's status pages write names, ids and descriptions through it.

#include <string>
#include <string_view>

namespace doorman::detail {

/// `s` with `<`, `>`, `&`, `"` and `'` as character references: safe in element text and in
/// attribute values of either quote.
[[nodiscard]] inline std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace doorman::detail
