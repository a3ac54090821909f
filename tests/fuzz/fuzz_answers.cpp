// libFuzzer target: what a client and an intermediate do with a server's answer, from the
// channel's reading of the answer line to the state that adopts it. The first byte picks the
// side (client state or upstream); the rest is the answer line. Whatever it holds, nothing
// throws, no state goes out of bounds, and the next request the state builds is one a server
// accepts (a bad answer must not poison later requests).

#include <doorman/protocol.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_support.hpp"

using namespace doorman_fuzz;

namespace {

using upstream_type = doorman::basic_upstream<engine_type>;
using client_state_type = doorman::basic_client_state<clock_type>;

// The client side: a state holding three resources, one request in flight.
void client_side(const nlohmann::json& result, clock_type& clock) {
  client_state_type state({.client_id = "c1"});
  for (const char* id : {"api", "db", "q"})
    state.add(id, {.wants = 10});
  (void)state.make_request(clock.now());
  doorman::capacity_response resp;
  if (doorman::decode(result, resp)) return;  // refused by the decoder: a failure
  state.on_reply(resp, clock.now());
  state.for_each([&](std::string_view id, const auto& r) {
    if (!r.lease) return;
    DOORMAN_FUZZ_CHECK(
        r.lease->capacity >= 0 && r.lease->capacity <= doorman::request_limits::max_quantity,
        std::string(id));
    DOORMAN_FUZZ_CHECK(r.lease->expiry - clock.now() <= std::chrono::seconds(static_cast<long>(
                                                            doorman::request_limits::max_seconds)),
                       std::string(id));
  });
  DOORMAN_FUZZ_CHECK(state.next_request() > clock.now(), "no request storm");
  clock.set(state.next_request());
  const auto next = state.make_request(clock.now());
  if (const auto e = doorman::validate(next)) fail("client request refused", e->message);
}

// The intermediate side: a leaf engine with demand on two resources, its request in flight.
void upstream_side(const nlohmann::json& result, clock_type& clock) {
  static const auto repo = engine_type::parse_config(config_text());  // parsed once
  engine_type leaf(repo, [] {
    doorman::engine_options o;
    o.is_root = false;
    return o;
  }());
  leaf.set_mastership(true, "leaf", clock.now());
  for (const char* id : {"f1", "p1"}) {
    if (!leaf.get_capacity({"c1", {{id, 0, 20, std::nullopt}}}, clock.now())) fail("setup");
  }
  upstream_type up({.server_id = "leaf"});
  (void)up.make_request(leaf, clock.now());
  doorman::server_capacity_response resp;
  if (doorman::decode(result, resp)) return;
  (void)up.on_reply(leaf, resp, clock.now());
  leaf.for_each_resource([&](std::string_view id, const auto&) {
    DOORMAN_FUZZ_CHECK(id == "f1" || id == "p1", std::string(id));  // nothing adopted unasked
    if (const auto l = leaf.parent_lease(id)) {
      DOORMAN_FUZZ_CHECK(l->capacity >= 0 && l->capacity <= doorman::request_limits::max_quantity,
                         std::string(id));
    }
  });
  check_engine(leaf, clock.now(), clock.now());
  clock.set(up.next_request(leaf));
  const auto next = up.make_request(leaf, clock.now());
  if (const auto e = doorman::validate(next)) fail("upstream request refused", e->message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1 || size > 64 * 1024) return -1;
  const bool client = data[0] % 2 == 0;
  const std::string_view line(reinterpret_cast<const char*>(data) + 1, size - 1);
  // The channel's reading of the line: parse, then read_answer and read_redirect, which must
  // not throw whatever the types.
  const auto answer = nlohmann::json::parse(line, nullptr, false);
  if (answer.is_discarded()) return 0;
  const auto a = doorman::read_answer(answer);
  if (a.type != doorman::rpc_answer::kind::result) return 0;
  const auto hint = doorman::read_redirect(a.result);
  if (hint.not_master) return 0;  // the channel follows the redirect
  clock_type clock;
  if (client) {
    client_side(a.result, clock);
  } else {
    upstream_side(a.result, clock);
  }
  return 0;
}
