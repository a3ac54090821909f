// libFuzzer target: the binaries' YAML readers (examples/yaml_config.hpp), for configurations,
// access files and rule files alike. Any text either converts, or is refused with a
// `config_error` naming file and line: nothing else may escape (no yaml-cpp or nlohmann
// exception), and aliases, anchors, merge keys and huge scalars stay within `yaml_limits`
// (libFuzzer's -timeout and -rss_limit_mb catch a bound that does not hold). What converts is
// JSON that dumps (valid UTF-8) and holds at most `max_nodes` values.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "yaml_config.hpp"

namespace {

std::size_t values(const nlohmann::json& j) {
  std::size_t n = 1;
  if (j.is_structured())
    for (const auto& e : j)
      n += values(e);
  return n;
}

template <class F>
void refused_or_read(F read) {
  try {
    read();
  } catch (const doorman::config_error& e) {
    DOORMAN_FUZZ_CHECK(std::string_view(e.what()).find("x.yml") != std::string_view::npos,
                       e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  refused_or_read([&] {
    const auto doc = doorman_examples::yaml_config_json(text, "x.yml");
    DOORMAN_FUZZ_CHECK(values(doc) <= doorman_examples::yaml_limits::max_nodes, "");
    (void)doc.dump();  // throws on invalid UTF-8
  });
  refused_or_read([&] { (void)doorman_examples::parse_yaml_config(text, "x.yml"); });
  refused_or_read([&] { (void)doorman_examples::parse_yaml_access(text, "x.yml"); });
  refused_or_read([&] { (void)doorman_examples::parse_yaml_rules(text, "x.yml"); });
  return 0;
}
