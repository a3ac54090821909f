#pragma once

// Test support shared by the network and client tests: in-process nodes on 127.0.0.1:0, each on
// its own io_context and thread; the one way a test waits for another thread (`eventually`,
// polling with a deadline); running a coroutine to its end under a deadline
// (`run_coroutine_test`); the doorman-node binary as a child process.

#include <catch2/catch.hpp>

#include <doorman/client.hpp>
#include <doorman/node.hpp>

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace doorman_test {

using namespace std::chrono_literals;
using json = nlohmann::json;
using steady = std::chrono::steady_clock;

// Polls `condition` until it holds or `timeout` passes; whether it held. Polling, not
// synchronization: the period starts at 1 ms and doubles up to 20 ms, and the deadline, not
// the period, bounds the wait.
template <class Condition>
bool eventually(Condition condition, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds period = 1ms;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(period);
    period = std::min(period * 2, std::chrono::milliseconds(20));
  }
  return true;
}

// Runs `io` until `f` is ready; fails the test if it is not within `timeout`.
template <class Future>
void run_until_ready(asio::io_context& io, Future& f, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (f.wait_for(0s) != std::future_status::ready &&
         std::chrono::steady_clock::now() < deadline) {
    if (io.stopped()) io.restart();  // it ran out of work before: new work came since
    io.run_one_for(50ms);
  }
  REQUIRE(f.wait_for(0s) == std::future_status::ready);
}

// Runs the coroutine `make()` returns on `io` to its end and gives its value (rethrowing what
// it threw); fails the test if it has not ended within `timeout`.
template <class Make>
auto run_coroutine_test(asio::io_context& io, Make make, std::chrono::milliseconds timeout = 10s) {
  auto f = asio::co_spawn(io, make(), asio::use_future);
  run_until_ready(io, f, timeout);
  return f.get();
}

// A new directory under /tmp named `/tmp/STEM-XXXXXX`, for a test's files (it removes it).
inline std::string scratch_directory(const std::string& stem) {
  std::string name = "/tmp/" + stem + "-XXXXXX";
  REQUIRE(::mkdtemp(name.data()) != nullptr);
  return name;
}

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

// A client that refreshes fast, for tests.
inline doorman::client_options fast_client(const std::string& address) {
  doorman::client_options o;
  o.addresses = {address};
  o.minimum_refresh_interval = doorman::seconds(0.05);
  o.call_timeout = doorman::seconds(1);
  o.sample_interval = doorman::seconds(0.1);
  o.demand_window = doorman::seconds(1);
  return o;
}

#ifdef DOORMAN_SOURCE_DIR
// The certificates examples/make_certs.sh makes with the openssl CLI, once per test process,
// in a temporary directory removed at exit; the path of NAME (e.g. "ca.pem").
class test_certificates {
 public:
  static const test_certificates& get() {
    static const test_certificates made;
    return made;
  }
  [[nodiscard]] std::string operator()(const std::string& name) const { return dir_ + "/" + name; }
  [[nodiscard]] const std::string& dir() const { return dir_; }

  // TLS options of one side: `name`.pem/.key as its certificate, the test CA as its CA.
  [[nodiscard]] doorman::net::tls_options side(const std::string& name) const {
    doorman::net::tls_options o;
    if (!name.empty()) {
      o.cert_file = (*this)(name + ".pem");
      o.key_file = (*this)(name + ".key");
    }
    o.ca_file = (*this)("ca.pem");
    return o;
  }

  test_certificates(const test_certificates&) = delete;
  test_certificates& operator=(const test_certificates&) = delete;
  ~test_certificates() { std::filesystem::remove_all(dir_); }

 private:
  test_certificates() {
    char dir_template[] = "/tmp/doorman-certs-XXXXXX";
    REQUIRE(::mkdtemp(dir_template));
    dir_ = dir_template;
    const std::string command =
        std::string(DOORMAN_SOURCE_DIR) + "/examples/make_certs.sh " + dir_ + " 2>&1";
    REQUIRE(std::system(command.c_str()) == 0);
  }
  std::string dir_;
};
#endif

}  // namespace doorman_test

#ifdef DOORMAN_NODE_BINARY
#include "process.hpp"

namespace doorman_test {

using doorman_examples::process;

// Starts `args` (a program and its flags), logging to `log`: it must refuse to start, exiting 2
// with `message` in its log.
inline void check_refused_start(const std::vector<std::string>& args, const std::string& log,
                                const std::string& message) {
  std::filesystem::remove(log);
  process p(args, log);
  INFO(message);
  CHECK(p.wait_exit() == 2);
  CHECK_THAT(p.log(), Catch::Contains(message));
}

// The address a child server process says it listens on. By then it must already handle
// SIGTERM (a test that stops it on that line must see a graceful exit, not a kill).
inline std::string listening_address(process& p) {
  const auto a = p.listening_address();
  REQUIRE(a);
  CHECK(p.handles(SIGTERM));
  return *a;
}

}  // namespace doorman_test
#endif
