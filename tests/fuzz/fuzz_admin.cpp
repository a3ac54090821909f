// libFuzzer target: the admin endpoint's HTTP request parser, and the escaping of what its pages
// show. Nothing throws; a refusal has an HTTP status and a reason; an accepted request has a
// token method and a path from '/'; escaped text cannot end an HTML attribute or element, nor a
// Prometheus label value or line.

#include <doorman/net/http_request.hpp>
#include <doorman/node/status_page.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 64 * 1024) return -1;
  const std::string_view raw(reinterpret_cast<const char*>(data), size);

  const auto r = doorman::net::parse_http_request(raw);
  if (r.status != 0) {
    DOORMAN_FUZZ_CHECK(r.status == 400 || r.status == 414 || r.status == 431 || r.status == 505,
                       std::to_string(r.status));
    DOORMAN_FUZZ_CHECK(!r.reason.empty(), "a refusal says why");
  } else {
    DOORMAN_FUZZ_CHECK(!r.method.empty(), "a method");
    DOORMAN_FUZZ_CHECK(r.path.starts_with('/'), r.path);
    DOORMAN_FUZZ_CHECK(r.path.size() <= raw.size(), "decoding never grows the path");
  }

  const auto html = doorman::detail::xml_escape(raw);
  DOORMAN_FUZZ_CHECK(html.find_first_of("<>\"'") == std::string::npos, html);
  const auto label = doorman::detail::prom_escape(raw);
  DOORMAN_FUZZ_CHECK(label.find('\n') == std::string::npos, "no newline in a label value");
  for (std::size_t i = 0; i < label.size(); ++i) {
    if (label[i] == '\\') {
      ++i;  // an escape: the next byte is escaped
      continue;
    }
    DOORMAN_FUZZ_CHECK(label[i] != '"', "every quote escaped");
  }
  const auto segment = doorman::detail::url_segment(raw);
  DOORMAN_FUZZ_CHECK(segment.find_first_of("/?#<>\"' ") == std::string::npos, segment);
  return 0;
}
