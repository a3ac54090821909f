// libFuzzer target: access files and the decisions they make (docs/security.md). Any text
// either is refused with a `config_error` (nothing else may escape) or parses into rules that
// keep the documented bounds; then the first line of the input is a caller's identity and the
// rest a client id, and every decision on them returns (allowed or refused with a reason)
// without throwing, and a refused caller's bound is never exceeded.

#include <doorman/node/access.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"

namespace {

void check_rules(const doorman::access_policy& p) {
  DOORMAN_FUZZ_CHECK(p.rules().size() <= doorman::access_limits::max_rules, "");
  for (const auto& r : p.rules()) {
    DOORMAN_FUZZ_CHECK(!r.identity.empty() && !doorman::glob_error(r.identity), r.identity);
    DOORMAN_FUZZ_CHECK(r.roles != 0 && r.roles < 8, r.identity);
    DOORMAN_FUZZ_CHECK(
        r.max_client_ids >= 1 && r.max_client_ids <= doorman::access_limits::max_client_ids,
        r.identity);
    for (const auto* list : {&r.resources, &r.client_ids, &r.server_ids}) {
      for (const auto& g : *list)
        DOORMAN_FUZZ_CHECK(!doorman::glob_error(doorman::access_policy::expand(g, "x")), g);
    }
  }
}

void check_decisions(const doorman::access_policy& p, std::string_view input) {
  const auto nl = input.find('\n');
  const std::string identity(input.substr(0, std::min(nl, std::size_t{200})));
  const std::string client(nl == std::string_view::npos ? "" : input.substr(nl + 1, 200));
  doorman::access_control ac(p, 0, [](std::string_view, std::string_view) { return true; });
  const doorman::access_caller caller{identity, 1};
  const doorman::access_rule* rule = p.rule_for(identity);
  doorman::capacity_request req;
  req.client_id = client;
  req.resources.emplace_back();
  req.resources.back().resource_id = "r";
  std::size_t allowed = 0;
  for (int i = 0; i < 3; ++i) {
    req.client_id = client + std::to_string(i);
    const auto why = ac.check(caller, req);
    DOORMAN_FUZZ_CHECK(!why || !why->empty(), identity);
    if (!why) ++allowed;
  }
  // Allowed only with the client role, and never beyond the rule's bound.
  if (allowed > 0) {
    DOORMAN_FUZZ_CHECK(rule && rule->has(doorman::access_role::client), identity);
    DOORMAN_FUZZ_CHECK(allowed <= rule->max_client_ids, identity);
  }
  (void)ac.check(caller, doorman::status_request{});
  (void)ac.admin(caller, "/metrics");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto p = doorman::access_policy::parse(text);
    check_rules(p);
    check_decisions(p, text);
  } catch (const doorman::config_error&) {
  }
  return 0;
}
