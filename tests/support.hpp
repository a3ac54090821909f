#pragma once

// Test support shared by the network and client tests: in-process nodes on 127.0.0.1:0, each on
// its own io_context and thread.

#include <doorman/node.hpp>

#include <memory>
#include <string>
#include <thread>

namespace doorman_test {

// A FAIR_SHARE template for every resource, with short leases so that tests run fast.
inline std::string fast_config(double capacity, double learning = 0) {
  return R"({"resources": [{"identifier_glob": "*", "capacity": )" + std::to_string(capacity) +
         R"(, "algorithm": {"kind": "FAIR_SHARE", "lease_length": 3, "refresh_interval": 0.4,
         "learning_mode_duration": )" +
         std::to_string(learning) + "}}]}";
}

template <class Election = doorman::single_election>
class running_node {
 public:
  explicit running_node(const std::string& config, doorman::node_options options = {},
                        Election election = {}) {
    if (options.listen == "127.0.0.1:7700") options.listen = "127.0.0.1:0";
    options.engine.minimum_refresh_interval = doorman::seconds(0);
    options.upstream.refresh.minimum_interval = doorman::seconds(0.05);
    options.upstream.refresh.backoff.initial = doorman::seconds(0.05);
    options.upstream.refresh.backoff.maximum = doorman::seconds(0.4);
    options.parent_timeout = doorman::seconds(1);
    auto repo = options.parents.empty() || !config.empty() ? doorman::engine::parse_config(config)
                                                           : doorman::intermediate_default_config();
    node_ = std::make_unique<doorman::basic_node<Election>>(io_.get_executor(), std::move(repo),
                                                            options, std::move(election));
    node_->start();
    address_ = node_->local_address();
    thread_ = std::thread([this] { io_.run(); });
  }
  running_node(const running_node&) = delete;
  running_node& operator=(const running_node&) = delete;
  ~running_node() { stop(); }

  void stop() {
    if (!thread_.joinable()) return;
    node_->stop();
    thread_.join();
  }

  [[nodiscard]] const std::string& address() const { return address_; }
  doorman::basic_node<Election>& node() { return *node_; }

 private:
  asio::io_context io_;
  std::unique_ptr<doorman::basic_node<Election>> node_;
  std::string address_;
  std::thread thread_;
};

// An election that reports a fixed outcome.
struct fixed_election {
  bool is_master = true;
  std::string master;
  void start(std::string advertise, doorman::mastership_callback cb) {
    cb(is_master, is_master ? advertise : master);
  }
  void stop() {}
};

}  // namespace doorman_test
