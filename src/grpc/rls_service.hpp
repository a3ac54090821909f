#pragma once

// The rate limit service behind the door (rls_door.hpp), as doorman-rls runs it and as a
// program embeds it: rules read from a directory of envoyproxy/ratelimit files, each request's
// descriptors checked against them, counted in this process, or exactly across the replicas by
// a doorman tree's root (blocks of hits drawn from its count, doorman/client/window_draws.hpp);
// the rules swapped whole on reload; their counts as Prometheus text (docs/envoy.md).
// Compiled once (doorman::grpc); no gRPC or protobuf header shows through.
//
//     auto rules = doorman::rls::load_rules_directory(dir, read_yaml);
//     doorman::rls::rules_service service(rules, root);  // root: nothing, each replica alone
//     doorman::rls::server door({listen, tls}, service, headers);

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <doorman/client/client.hpp>
#include <doorman/client/window_draws.hpp>
#include <doorman/limit/rules.hpp>
#include <nlohmann/json.hpp>

#include "rls_door.hpp"

namespace doorman::rls {

// The doorman tree's root that counts every request key (doorman-rls --server).
struct root_options {
  client_options client;      // its addresses, TLS, client id, log
  seconds call_timeout{1};    // a call to it, as the channel takes it
  window_draw_options draws;  // the blocks drawn, the keys held
};

// The rules behind the door: `check` from any gRPC thread; `replace` swaps them whole (counts
// start afresh); `metrics` their counts.
class rules_service final : public handler {
 public:
  // Counted in this process, or (`root`) by the root.
  explicit rules_service(std::shared_ptr<rule_set> rules,
                         std::optional<root_options> root = std::nullopt);
  ~rules_service() override;
  rules_service(const rules_service&) = delete;
  rules_service& operator=(const rules_service&) = delete;

  void check(const check_request& r, done_type done) override;

  // The rules from here on (a check under way keeps the ones it began with).
  void replace(std::shared_ptr<rule_set> rules);

  // The rules in use.
  [[nodiscard]] std::shared_ptr<const rule_set> rules();

  // Every rule's counts in Prometheus's text format, as envoyproxy/ratelimit counts per key
  // (since the rules were loaded: a reload starts them again).
  [[nodiscard]] std::string metrics();

  // Once every call has been answered (the door stopped first): the root's link closes.
  void stop();

  class root_draws;  // the calls to the root (rls_service.cpp)

 private:
  std::mutex mutex_;
  std::shared_ptr<rule_set> rules_;
  std::unique_ptr<root_draws> draws_;  // null: each replica counts alone
};

// Reads one rule file's `text` (named `path` in errors) into its JSON form, and calls `check`
// on the document (which throws config_error naming the field; the reader adds the line): the
// binaries' YAML reader, or a JSON one.
using rules_file_reader = std::function<nlohmann::json(
    std::string_view text, const std::string& path,
    const std::function<nlohmann::json(const nlohmann::json&)>& check)>;

// The rule files of `dir`: its .yaml and .yml files, sorted by name.
[[nodiscard]] std::vector<std::string> rule_files(const std::string& dir);

// Every rule file of `dir`, each checked alone (its errors name it, with the line), then
// compiled together (a domain defined twice names both files). Counting is a fixed window, as
// envoyproxy/ratelimit counts, unless a file chooses another algorithm. Throws
// std::invalid_argument or config_error saying what is wrong.
[[nodiscard]] std::shared_ptr<rule_set> load_rules_directory(const std::string& dir,
                                                             const rules_file_reader& read);

// The configuration of the doorman tree's root that a --server counts at: each rule a template
// whose glob matches its request keys, with its limit as a rate (requests_per_unit / unit; the
// root counts the rate x the window, the rule's requests_per_unit, in each window).
[[nodiscard]] nlohmann::json root_config(const rule_set& rules);

}  // namespace doorman::rls
