// libFuzzer target: rule files (docs/algorithms.md, "Rules") and the checks they make. Any text
// either is not JSON, or is refused with a `config_error` (nothing else may escape), or
// compiles into rules; then requests whose descriptors come from the input's last bytes are
// checked on a frozen clock, and every verdict keeps the documented bounds: a code among the
// four, a limit of −1 (no rule) or within 0 to 10^9, remaining within 0 to the limit, and a
// hard rule's key never admitted more than its limit in one window; and distinct descriptors
// (however long their values: a long one is cut with a hash of the whole) never share a key,
// so never a count.

#include <doorman/core/time.hpp>
#include <doorman/limit/rules.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"

namespace {

using clock_ref = doorman::manual_clock_ref;

using rules_type = doorman::basic_rule_set<
    doorman::local_algorithm_list<doorman::fixed_window_algorithm<clock_ref, 1>>>;

// Descriptors from the input's tail: entries "key=value" separated by ';', descriptors by '|'.
std::vector<doorman::descriptor> descriptors_of(std::string_view s) {
  std::vector<doorman::descriptor> out(1);
  std::size_t i = 0;
  while (i < s.size() && out.size() <= 8) {
    const auto end = std::min(s.find_first_of(";|", i), s.size());
    const auto entry = s.substr(i, end - i);
    const auto eq = entry.find('=');
    out.back().push_back({std::string(entry.substr(0, eq)),
                          eq == std::string_view::npos ? "" : std::string(entry.substr(eq + 1))});
    if (end < s.size() && s[end] == '|') out.emplace_back();
    i = end + 1;
  }
  return out;
}

// Each descriptor alone: two descriptors get the same key (so share one count) exactly when
// their entries are the same.
void distinct_counts(rules_type& rules, const std::vector<std::string>& domains,
                     const std::vector<doorman::descriptor>& requests) {
  for (const auto& domain : domains) {
    std::map<std::string, std::vector<std::string>> tuple_of;  // key -> cut entries
    std::map<std::vector<std::string>, std::string> key_of;
    for (const auto& desc : requests) {
      const auto v = rules.check(domain, {desc});
      if (v.limit < 0) continue;
      std::vector<std::string> tuple;
      for (const auto& e : desc) {
        tuple.push_back(e.key);
        tuple.push_back(e.value);
      }
      const auto [t, new_key] = tuple_of.emplace(v.key, tuple);
      DOORMAN_FUZZ_CHECK(t->second == tuple, "two descriptors share the key " + v.key);
      const auto [k, new_tuple] = key_of.emplace(tuple, v.key);
      DOORMAN_FUZZ_CHECK(k->second == v.key, "one descriptor, two keys: " + v.key);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  // The rule file, then after a NUL byte the requests.
  const auto cut = std::min(input.find('\0'), input.size());
  const auto doc = nlohmann::json::parse(input.substr(0, cut), nullptr, false);
  if (doc.is_discarded()) return 0;
  doorman::manual_clock clock;
  try {
    auto rules = rules_type::parse(doc, {}, clock_ref{&clock});
    const auto domains = rules.domains();
    const auto requests = descriptors_of(cut < input.size() ? input.substr(cut + 1) : "");
    std::map<std::string, int> ok;  // per deciding key
    for (const auto& domain : domains) {
      for (int round = 0; round < 4; ++round) {
        const auto v = rules.check(domain, requests);
        DOORMAN_FUZZ_CHECK(
            v.code >= doorman::rule_code::ok && v.code <= doorman::rule_code::refused, domain);
        DOORMAN_FUZZ_CHECK(v.limit == -1 || (v.limit >= 0 && v.limit <= 1e9), domain);
        DOORMAN_FUZZ_CHECK(v.limit == -1 || (v.remaining >= 0 && v.remaining <= v.limit), v.key);
        DOORMAN_FUZZ_CHECK(v.key.size() <= 3 * domain.size() + 9 * (2 * (3 * 256 + 17) + 2), v.key);
        if (v.limit >= 0 && v.code == doorman::rule_code::ok && requests.size() == 1) {
          DOORMAN_FUZZ_CHECK(++ok[v.key] <= static_cast<int>(v.limit), v.key);
        }
      }
    }
    distinct_counts(rules, domains, requests);
    for (const auto& t : rules.resource_templates())
      DOORMAN_FUZZ_CHECK(t.capacity >= 0 && t.capacity <= 1e9, t.identifier_glob);
  } catch (const doorman::config_error& e) {
    DOORMAN_FUZZ_CHECK(std::string_view(e.what()).size() > 0, "");
  }
  return 0;
}
