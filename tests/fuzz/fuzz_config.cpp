// libFuzzer target: configuration parsing. Any text either is refused with a `config_error`
// (nothing else may escape) or parses into templates that satisfy every documented rule
// (docs/configuration.md); a parsed configuration written back with `to_json` parses again to
// the same templates, and every resource id resolves to a template.

#include <doorman/core.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"

namespace {

void check_rules(const doorman::resource_repository& repo) {
  using limits = doorman::config_limits;
  const auto& ts = repo.templates();
  DOORMAN_FUZZ_CHECK(!ts.empty(), "");
  DOORMAN_FUZZ_CHECK(ts.back().identifier_glob == "*", ts.back().identifier_glob);
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto& t = ts[i];
    DOORMAN_FUZZ_CHECK(!t.identifier_glob.empty(), "");
    DOORMAN_FUZZ_CHECK(t.identifier_glob.size() <= limits::max_glob_bytes, t.identifier_glob);
    DOORMAN_FUZZ_CHECK(!doorman::glob_error(t.identifier_glob), t.identifier_glob);
    for (std::size_t j = 0; j < i; ++j)
      DOORMAN_FUZZ_CHECK(ts[j].identifier_glob != t.identifier_glob, t.identifier_glob);
    DOORMAN_FUZZ_CHECK(t.capacity >= 0 && t.capacity <= limits::max_capacity, t.identifier_glob);
    if (t.safe_capacity) {
      DOORMAN_FUZZ_CHECK(*t.safe_capacity == -1 ||
                             (*t.safe_capacity >= 0 && *t.safe_capacity <= limits::max_capacity),
                         t.identifier_glob);
    }
    const auto& a = t.algorithm;
    bool known = false;
    for (const auto k : doorman::standard_algorithm_kinds)
      known |= a.kind == k;
    DOORMAN_FUZZ_CHECK(known, a.kind);
    const double lease = a.lease_length.count();
    const double refresh = a.refresh_interval.count();
    const double learning = a.learning_mode_duration.count();
    DOORMAN_FUZZ_CHECK(lease >= limits::min_duration && lease <= limits::max_duration, "");
    DOORMAN_FUZZ_CHECK(refresh >= limits::min_duration && refresh <= lease, "");
    DOORMAN_FUZZ_CHECK(learning >= 0 && learning <= limits::max_duration, "");
    DOORMAN_FUZZ_CHECK(a.parameters.is_object(), "");
    for (const auto& [key, value] : a.parameters.items()) {
      DOORMAN_FUZZ_CHECK(value.is_string() || value.is_number() || value.is_boolean(), key);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 16 * 1024) return -1;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<doorman::resource_repository> repo;
  try {
    repo = doorman::resource_repository::parse(text);
  } catch (const doorman::config_error&) {
    return 0;  // refused, with a message naming the field
  }
  check_rules(*repo);
  const auto again = doorman::resource_repository::from_json(repo->to_json());
  DOORMAN_FUZZ_CHECK(again == *repo, repo->to_json().dump());
  // Every id resolves, and hostile ids cannot make matching slow (bounded by the target's
  // time limit).
  for (const std::string_view id : {std::string_view("x"), text.substr(0, 256)}) {
    (void)repo->find(id);
  }
  return 0;
}
