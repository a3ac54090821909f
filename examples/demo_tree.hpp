#pragma once

// A local capacity tree for the demos: a root and two intermediate doorman-node processes on
// free loopback ports, one resource "api" under FAIR_SHARE.

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "process.hpp"

namespace doorman_examples {

// The flags both demos take: --duration SECONDS (from `shortest`) and --capacity N, then `more`.
inline std::vector<flag_action> demo_flags(double shortest, double& duration, double& capacity,
                                           std::vector<flag_action> more) {
  more.push_back(
      {"--duration", [&, shortest](arguments& a) { duration = a.number(shortest, 3600); }});
  more.push_back({"--capacity", [&](arguments& a) { capacity = a.number(0, 1e15); }});
  return more;
}

struct local_tree {
  std::filesystem::path dir;
  std::unique_ptr<process> root;
  std::vector<std::unique_ptr<process>> mids;  // "left", "right"
  std::string root_address;
  std::vector<std::string> mid_addresses;

  // Starts the tree; on failure prints the log of the node that failed and returns nothing.
  static std::optional<local_tree> start(const std::string& node_binary, double capacity,
                                         const std::string& name) {
    local_tree t;
    t.dir = std::filesystem::temp_directory_path() / fmt::format("{}-{}", name, ::getpid());
    std::filesystem::create_directories(t.dir);
    const auto config = t.dir / "resources.json";
    std::ofstream(config) << fmt::format(R"({{"resources": [
  {{"identifier_glob": "api", "capacity": {}, "description": "requests per second",
    "algorithm": {{"kind": "FAIR_SHARE", "lease_length": 6, "refresh_interval": 1,
                  "learning_mode_duration": 0}}}},
  {{"identifier_glob": "*", "capacity": 0,
    "algorithm": {{"kind": "NO_ALGORITHM", "lease_length": 60, "refresh_interval": 16}}}}]}})",
                                         capacity);
    fmt::print("starting the tree (logs in {}):\n", t.dir.string());
    t.root = std::make_unique<process>(
        std::vector<std::string>{node_binary, "--listen", "127.0.0.1:0", "--config",
                                 config.string(), "--minimum-refresh-interval", "0.5"},
        (t.dir / "root.log").string());
    const auto root_address = t.root->listening_address();
    if (!root_address) {
      fmt::print(stderr, "the root did not start:\n{}", t.root->log());
      return std::nullopt;
    }
    t.root_address = *root_address;
    for (const char* mid : {"left", "right"}) {
      t.mids.push_back(std::make_unique<process>(
          std::vector<std::string>{node_binary, "--listen", "127.0.0.1:0", "--parent",
                                   t.root_address, "--id", mid, "--minimum-refresh-interval",
                                   "0.5"},
          (t.dir / fmt::format("{}.log", mid)).string()));
      const auto a = t.mids.back()->listening_address();
      if (!a) {
        fmt::print(stderr, "intermediate {} did not start:\n{}", mid, t.mids.back()->log());
        return std::nullopt;
      }
      t.mid_addresses.push_back(*a);
    }
    fmt::print("  root          {}  capacity {} of resource \"api\", FAIR_SHARE\n", t.root_address,
               capacity);
    fmt::print("  left  (mid)   {}  parent {}\n", t.mid_addresses[0], t.root_address);
    fmt::print("  right (mid)   {}  parent {}\n\n", t.mid_addresses[1], t.root_address);
    return t;
  }

  // SIGTERM to every node; whether all exited 0.
  bool stop() {
    bool clean = true;
    for (auto& m : mids)
      m->signal(SIGTERM);
    for (auto& m : mids)
      clean = m->wait_exit() == 0 && clean;
    root->signal(SIGTERM);
    clean = root->wait_exit() == 0 && clean;
    return clean;
  }
};

}  // namespace doorman_examples
