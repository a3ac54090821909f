// libFuzzer target: the line dispatcher in front of a root engine, with state carried from line
// to line. The input is lines; a line "#<n>" advances the clock by n milliseconds, "#m" and "#s"
// make the engine master again (learning mode) or not master. After every line: at most one
// answer, on one line, a JSON-RPC 2.0 response with the request's id and exactly one of result
// and error, never a server error; the engine invariants (fuzz_support.hpp); and the same answer
// and outcome from a second engine fed the same lines through the DOM path only (the hot path
// must answer byte for byte as it does); at the end, the two engines' states compared resource
// by resource, leases included.

#include <doorman/protocol.hpp>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"

using namespace doorman_fuzz;

namespace {

void check_answer(std::string_view line, const std::string& answer) {
  DOORMAN_FUZZ_CHECK(answer.find('\n') == std::string::npos, answer);
  const auto j = nlohmann::json::parse(answer, nullptr, false);
  DOORMAN_FUZZ_CHECK(j.is_object(), answer);
  DOORMAN_FUZZ_CHECK(j.value("jsonrpc", "") == "2.0", answer);
  DOORMAN_FUZZ_CHECK(j.contains("id"), answer);
  DOORMAN_FUZZ_CHECK(j.contains("result") != j.contains("error"), answer);
  if (const auto e = j.find("error"); e != j.end()) {
    DOORMAN_FUZZ_CHECK(
        e->is_object() && (*e)["code"].is_number_integer() && (*e)["message"].is_string(), answer);
    // The node never fails on its own: every error is the caller's.
    DOORMAN_FUZZ_CHECK((*e)["code"] != -32000, answer + " for " + std::string(line));
    return;
  }
  // A result answers a request whose id it repeats.
  const auto request = nlohmann::json::parse(line, nullptr, false);
  DOORMAN_FUZZ_CHECK(request.is_object() && request.contains("id") && request["id"] == j["id"],
                     answer);
}

// The two engines hold the same state: the same resources, each with the same status and
// leases, byte for byte (-0 and 0 differ there).
void same_state(engine_type& hot, engine_type& dom, clock_type::time_point now) {
  std::vector<std::string> ids;
  hot.for_each_resource([&](std::string_view id, const auto&) { ids.emplace_back(id); });
  std::size_t dom_count = 0;
  dom.for_each_resource([&](std::string_view, const auto&) { ++dom_count; });
  DOORMAN_FUZZ_CHECK(ids.size() == dom_count, "resource count");
  for (const auto& id : ids) {
    const auto sa = hot.status(doorman::status_request{id}, now);
    const auto sb = dom.status(doorman::status_request{id}, now);
    DOORMAN_FUZZ_CHECK(sa && sb, id);
    const auto a = nlohmann::json(sa.value()).dump();
    const auto b = nlohmann::json(sb.value()).dump();
    DOORMAN_FUZZ_CHECK(a == b, "hot path state: " + a + "\nDOM path state: " + b);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 16 * 1024) return -1;
  clock_type clock;
  static const auto repo = engine_type::parse_config(config_text());  // parsed once
  engine_type engine(repo);
  engine_type reference(repo);  // the DOM path only
  engine.set_mastership(true, "self:7700", clock.now());
  reference.set_mastership(true, "self:7700", clock.now());
  const doorman::node_identity identity{"self:7700", "root", 0, std::nullopt};
  std::string_view input(reinterpret_cast<const char*>(data), size);
  int lines = 0;
  while (!input.empty() && lines++ < 64) {
    const auto nl = input.find('\n');
    const std::string_view line = input.substr(0, nl);
    input.remove_prefix(nl == std::string_view::npos ? input.size() : nl + 1);
    if (line.starts_with('#')) {
      if (line == "#m") {
        for (auto* e : {&engine, &reference}) {
          e->set_mastership(false, "other:7700", clock.now());
          e->set_mastership(true, "self:7700", clock.now());
        }
      } else if (line == "#s") {
        engine.set_mastership(false, "other:7700", clock.now());
        reference.set_mastership(false, "other:7700", clock.now());
      } else {
        unsigned ms = 0;
        std::from_chars(line.data() + 1, line.data() + line.size(), ms);
        clock.advance(std::chrono::milliseconds(ms % 100'000));
      }
    } else {
      std::string answer;
      std::string expected;
      doorman::dispatch_record record;
      doorman::dispatch_record expected_record;
      const bool answered =
          doorman::handle_line_to(answer, engine, line, clock.now(), identity, &record);
      const bool expected_answer = doorman::detail::dispatch(
          expected, reference, line, clock.now(), identity, &expected_record, nullptr, false);
      DOORMAN_FUZZ_CHECK(answered == expected_answer && answer == expected,
                         "hot path: " + answer + "\nDOM path: " + expected);
      DOORMAN_FUZZ_CHECK(
          record.method == expected_record.method && record.error == expected_record.error,
          std::string(line));
      if (answered) check_answer(line, answer);
    }
    check_engine(engine, clock.now(), clock_type::time_point{});
  }
  same_state(engine, reference, clock.now());
  return 0;
}
