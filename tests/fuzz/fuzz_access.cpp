// libFuzzer target: access files and the decisions they make (docs/security.md). Any text
// either is refused with a `config_error` (nothing else may escape) or parses into rules that
// keep the documented bounds; then the first line of the input is a caller's identity and the
// rest a client id, and every decision on them returns (allowed or refused with a reason)
// without throwing, and a refused caller's bound is never exceeded. Then ownership: no identity
// may use or release a client id another identity owns by default (I, I#NAME), and the client
// ids an identity holds never share a record with a connection's.

#include <doorman/node/access.hpp>

#include <algorithm>
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

// Whether `client` is a client id `identity` owns by default: itself, or itself, '#' and a
// name without '/'.
bool owned_by_default(std::string_view identity, std::string_view client) {
  if (client == identity) return true;
  return client.size() > identity.size() && client.starts_with(identity) &&
         client[identity.size()] == '#' &&
         client.substr(identity.size()).find('/') == std::string_view::npos;
}

// Two identities and a client id from the input's first three lines: under the default policy
// (and under any rule that keeps the default client ids), no identity may use or release a
// client id that another identity owns by default. And client ids held by an identity and by a
// connection are kept apart, however the identity is spelled.
void check_ownership(const doorman::access_policy& file, std::string_view input) {
  std::string_view line[3];
  for (auto& l : line) {
    const auto nl = std::min(input.find('\n'), input.size());
    l = input.substr(0, std::min(nl, std::size_t{200}));
    input.remove_prefix(std::min(nl + 1, input.size()));
  }
  const std::string i(line[0]);
  const std::string j(line[1]);
  const std::string client(line[2]);
  if (i == j || !owned_by_default(j, client) || j.empty() || j.find('#') != std::string::npos)
    return;
  const auto defaults = doorman::access_policy::defaults(0);
  for (const auto* p : {&defaults, &file}) {
    const auto* rule = p->rule_for(i);
    if (rule && rule->client_ids != doorman::access_policy::default_client_ids()) continue;
    doorman::access_control ac(*p, 0, nullptr);
    doorman::capacity_request req;
    req.client_id = client;
    req.resources.emplace_back();
    req.resources.back().resource_id = "r";
    DOORMAN_FUZZ_CHECK(ac.check({i, 1}, req).has_value(), i + " used " + client + " of " + j);
    DOORMAN_FUZZ_CHECK(ac.check({i, 1}, doorman::release_request{client, {"r"}}).has_value(),
                       i + " released " + client + " of " + j);
  }
  doorman::access_control bound(std::nullopt, 1, nullptr);
  doorman::capacity_request req;
  req.resources.emplace_back();
  req.resources.back().resource_id = "r";
  req.client_id = "by-identity";
  DOORMAN_FUZZ_CHECK(!bound.check({i.empty() ? "x" : i, 1}, req), i);
  req.client_id = "by-connection";
  const auto n = static_cast<std::uint64_t>(client.size());
  DOORMAN_FUZZ_CHECK(!bound.check({"", n}, req), "connection record shared with " + i);
  DOORMAN_FUZZ_CHECK(bound.holders() == 2, i);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto p = doorman::access_policy::parse(text);
    check_rules(p);
    check_decisions(p, text);
    check_ownership(p, text);
  } catch (const doorman::config_error&) {
    check_ownership(doorman::access_policy{}, text);
  }
  return 0;
}
