// doorman-worker: a rate-limited worker. Work arrives at --demand operations per second (spread
// evenly); each operation runs only if the resource's lease admits it (try_acquire), else it is
// dropped, as a service would answer 429. Wants are measured from the arrivals. Once a second
// it prints one status line; SIGTERM/SIGINT release the lease and exit 0.
//
//   doorman-worker --server 127.0.0.1:7700 --resource api --demand 50 [--name w1]
//
// Status line: "status name=w1 wants=50.0 capacity=33.3 ops=33 allowed=34.3 leased=1", where
// allowed is what the lease admitted in that second: the integral of the capacity over the
// second (a lease cut inside it counts for the part before the cut) plus the limiter's burst.
// Every capacity change is a line too, stamped with the monotonic clock (shared by every
// process of the machine), for a tree-wide sum at each instant:
// "lease name=w1 t=123456789 capacity=33.3 leased=1" (t in nanoseconds, the capacity exact). The
// last one, as the worker stops admitting, has capacity 0.

#include <doorman/client.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "client_flags.hpp"

namespace {

std::atomic<bool> stopping{false};
void on_signal(int) {
  stopping = true;
}

using steady = std::chrono::steady_clock;

// What the lease admitted since the last report: the capacity integrated over time, from the
// instants it changed (the client calls back right after its limiter took the new rate).
class ledger {
 public:
  ledger(std::string name, double capacity) : name_(std::move(name)), rate_(capacity) {}

  void changed(double capacity, bool leased) {
    const std::lock_guard lock(mutex_);
    if (finished_) return;
    const auto now = steady::now();
    close(now);
    rate_ = capacity;
    most_ = std::max(most_, capacity);
    fmt::print(stderr, "lease name={} t={} capacity={} leased={}\n", name_,
               now.time_since_epoch().count(), rate_, leased ? 1 : 0);
    std::fflush(stderr);
  }

  // Admits nothing more: a last line with capacity 0, and no more after it.
  void finish() {
    changed(0, false);
    const std::lock_guard lock(mutex_);
    finished_ = true;
  }

  // The permits admitted since the last call (-1: unlimited); a new second begins.
  double take() {
    const std::lock_guard lock(mutex_);
    close(steady::now());
    const double burst = std::max(1.0, most_ * 0.1);  // the burst follows the lease
    const double out = unlimited_ ? -1 : allowed_ + burst;
    allowed_ = 0;
    unlimited_ = rate_ < 0;
    most_ = std::max(0.0, rate_);
    return out;
  }

 private:
  void close(steady::time_point now) {
    if (rate_ < 0) unlimited_ = true;
    allowed_ += std::max(0.0, rate_) * std::chrono::duration<double>(now - since_).count();
    since_ = now;
  }

  std::mutex mutex_;
  std::string name_;
  double rate_;
  double most_ = 0;
  double allowed_ = 0;
  bool unlimited_ = false;
  bool finished_ = false;
  steady::time_point since_ = steady::now();
};

}  // namespace

int main(int argc, char** argv) {
  doorman_examples::client_flags flags{.resource = "api"};
  std::string name = "worker";
  double demand = 10;
  return doorman_examples::run_program(
      argc, argv, "doorman-worker",
      "usage: doorman-worker [--server HOST:PORT[,HOST:PORT...]] [--resource ID]\n"
      "                      [--demand OPS_PER_SECOND] [--name NAME]\n",
      flags.with({{"--name", [&](auto& a) { name = a.value(); }},
                  {"--demand", [&](auto& a) { demand = a.number(0.001, 1e7); }}}),
      [&] {
        std::signal(SIGTERM, on_signal);
        std::signal(SIGINT, on_signal);

        ledger admitted(name, 0);  // before the client: its thread calls it until it is gone
        doorman::client client(flags.client_options());
        doorman::rate_resource api(client, flags.resource, {.initial_wants = demand});
        admitted.changed(api.capacity(), api.leased());
        api.on_capacity([&](double c) { admitted.changed(c, api.leased()); });

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
            fmt::print(stderr,
                       "status name={} wants={:.1f} capacity={:.1f} ops={} allowed={:.1f} "
                       "leased={}\n",
                       name, api.wants(), api.capacity(), done, admitted.take(),
                       api.leased() ? 1 : 0);
            std::fflush(stderr);
            done = 0;
            report += std::chrono::seconds(1);
          }
        }
        admitted.finish();  // admits nothing more; the client releases the lease as it goes
        return 0;
      });
}
