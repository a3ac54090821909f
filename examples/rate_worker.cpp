// doorman-worker: a rate-limited worker. Work arrives at --demand operations per second (spread
// evenly); each operation runs only if the resource's lease admits it (try_acquire), else it is
// dropped, as a service would answer 429. Wants are measured from the arrivals. Once a second
// it prints one status line; SIGTERM/SIGINT release the lease and exit 0.
//
//   doorman-worker --server 127.0.0.1:7700 --resource api --demand 50 [--name w1]
//
// Status line: "status name=w1 wants=50.0 capacity=33.3 ops=33.0 leased=1"

#include <doorman/client.hpp>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include "arguments.hpp"

namespace {

std::atomic<bool> stopping{false};

void on_signal(int) {
  stopping = true;
}

}  // namespace

int main(int argc, char** argv) {
  doorman_examples::client_flags flags{.resource = "api"};
  std::string name = "worker";
  double demand = 10;
  try {
    doorman_examples::arguments args(argc, argv);
    const bool go = args.parse(
        "usage: doorman-worker [--server HOST:PORT[,HOST:PORT...]] [--resource ID]\n"
        "                      [--demand OPS_PER_SECOND] [--name NAME]\n",
        [&](const std::string& flag) {
          if (flag == "--name") {
            name = args.value();
          } else if (flag == "--demand") {
            demand = args.number(0.001, 1e7);
          } else {
            return flags.parse(flag, args);
          }
          return true;
        });
    if (!go) return 0;
    std::signal(SIGTERM, on_signal);
    std::signal(SIGINT, on_signal);

    doorman::client_options options;
    options.addresses = doorman::net::split_list(flags.server);
    options.log = [](std::string_view line) { fmt::print(stderr, "{}\n", line); };
    doorman::client client(options);
    doorman::rate_resource api(client, flags.resource, {.initial_wants = demand});

    using steady = std::chrono::steady_clock;
    const auto tick = std::chrono::milliseconds(10);
    const double per_tick = demand * 0.01;
    double owed = 0;
    long done = 0;
    auto next = steady::now();
    auto report = next + std::chrono::seconds(1);
    while (!stopping) {
      owed += per_tick;
      for (; owed >= 1; owed -= 1)
        done += api.try_acquire() ? 1 : 0;
      next += tick;
      std::this_thread::sleep_until(next);
      if (steady::now() >= report) {
        fmt::print(stderr, "status name={} wants={:.1f} capacity={:.1f} ops={} leased={}\n", name,
                   api.wants(), api.capacity(), done, api.leased() ? 1 : 0);
        std::fflush(stderr);
        done = 0;
        report += std::chrono::seconds(1);
      }
    }
    return 0;  // the client releases the lease as it goes
  } catch (const std::exception& e) {
    fmt::print(stderr, "doorman-worker: {}\n", e.what());
    return 2;
  }
}
