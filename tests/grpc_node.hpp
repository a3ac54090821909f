#pragma once

// A doorman-node with its gRPC port on a free port, for the gRPC suites (grpc_test.cpp,
// rlqs_door_test.cpp).

#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "doorman.grpc.pb.h"
#include "process.hpp"
#include "support.hpp"

namespace doorman_test {

using doorman_examples::process;

inline const char* config_text = R"({"resources": [
  {"identifier_glob": "*", "capacity": 100, "safe_capacity": 5,
   "algorithm": {"kind": "FAIR_SHARE", "lease_length": 20, "refresh_interval": 4,
                 "learning_mode_duration": 0}}]})";

// A doorman-node with Doorman's gRPC service on a free port.
struct grpc_node {
  std::filesystem::path dir;
  std::unique_ptr<process> node;
  std::string address;  // the gRPC port's
  std::unique_ptr<::doorman::Capacity::Stub> stub;

  std::string json_address;  // the JSON-RPC port's

  explicit grpc_node(const std::string& name = "node", std::vector<std::string> flags = {},
                     const char* config = config_text) {
    dir = std::filesystem::temp_directory_path() /
          ("doorman-grpc-test-" + std::to_string(::getpid()) + "-" + name);
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << config;
    std::vector<std::string> args{
        DOORMAN_NODE_BINARY,          "--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0",
        "--minimum-refresh-interval", "0"};
    if (std::find(flags.begin(), flags.end(), "--parent") == flags.end()) {
      args.insert(args.end(), {"--config", (dir / "config.json").string()});
    }
    if (std::find(flags.begin(), flags.end(), "--admin") == flags.end()) {
      flags.insert(flags.end(), {"--admin", "off"});
    }
    args.insert(args.end(), flags.begin(), flags.end());
    node = std::make_unique<process>(args, (dir / "node.log").string());
    // The gRPC port binds first (the election announces it), then the JSON-RPC one.
    const auto line = node->wait_for("doorman.Capacity (gRPC) listening on ");
    REQUIRE(line);
    address = line->substr(line->find("listening on ") + 13);
    json_address = doorman_test::listening_address(*node);
    stub = ::doorman::Capacity::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  ~grpc_node() {
    node->signal(SIGTERM);
    CHECK(node->exits_cleanly());
    std::filesystem::remove_all(dir);
  }

  static std::unique_ptr<grpc::ClientContext> context() {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return c;
  }
};

}  // namespace doorman_test
