// libFuzzer target: the HTTP answer parser (status line, headers, chunked bodies) and etcd's
// answer decoders on what it yields, plus base64 both ways. Nothing throws; a parsed answer
// has a 3-digit status; every base64 encoding decodes back to its input.

#include <doorman/net/etcd.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 64 * 1024) return -1;
  namespace net = doorman::net;
  const std::string_view raw(reinterpret_cast<const char*>(data), size);

  const auto encoded = net::base64_encode(raw);
  const auto decoded = net::base64_decode(encoded);
  DOORMAN_FUZZ_CHECK(decoded && *decoded == raw, encoded);
  (void)net::base64_decode(raw);

  const auto r = net::detail::parse_http_response(raw);
  if (r.error) return 0;
  DOORMAN_FUZZ_CHECK(r.status >= 0 && r.status <= 999, std::to_string(r.status));
  DOORMAN_FUZZ_CHECK(r.body.size() <= raw.size(), "");
  const auto a = net::etcd_decode::read(r);
  if (!a.value) {
    DOORMAN_FUZZ_CHECK(!a.why.empty(), "an error says why");
    return 0;
  }
  (void)net::etcd_decode::grant(*a.value, 10);
  (void)net::etcd_decode::keep_alive(*a.value);
  (void)net::etcd_decode::claim(*a.value, "10.0.0.7:7700", 42);
  const auto recorded = net::etcd_decode::claim_with_record(*a.value, "10.0.0.7:7700", 42);
  DOORMAN_FUZZ_CHECK(!recorded || !recorded.value.records || *recorded.value.records >= 0,
                     "a count of records is never negative");
  (void)net::etcd_decode::first_kv(*a.value);
  return 0;
}
