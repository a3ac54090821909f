// libFuzzer target: the CLI reading a node's answers (examples/cli_answers.hpp) as `doorman
// status`, `get`, `discovery` and `watch` do. Any JSON either decodes, or is refused with a
// `failure` naming the field: nothing else may escape (no nlohmann type_error), no undefined
// behaviour on numbers (UBSan aborts on an out-of-range conversion), and what is printed holds
// no control byte but the line ends.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cli_answers.hpp"
#include "fuzz_support.hpp"

namespace {

void printable(const std::string& out) {
  for (const char c : out)
    DOORMAN_FUZZ_CHECK(c == '\n' || (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f), out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace cli = doorman_examples::cli;
  const auto answer =
      nlohmann::json::parse(reinterpret_cast<const char*>(data),
                            reinterpret_cast<const char*>(data) + size, nullptr, false);
  if (answer.is_discarded()) return 0;
  try {
    const auto st = cli::read_status(answer);
    DOORMAN_FUZZ_CHECK(st.level >= 0 && st.level <= cli::max_level, "");
    printable(cli::node_line(st) + cli::resources_table(st) + cli::leases_table(st));
  } catch (const cli::failure&) {
  }
  try {
    const auto grants = cli::read_answer<doorman::capacity_response>("get_capacity", answer);
    printable(cli::grant_lines(grants, 1, "c"));
  } catch (const cli::failure&) {
  }
  try {
    (void)cli::read_answer<doorman::discovery_response>("discovery", answer);
  } catch (const cli::failure&) {
  }
  return 0;
}
