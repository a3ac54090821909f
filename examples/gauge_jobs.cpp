// doorman-gauge-jobs: a job runner whose concurrency follows a gauge lease. --threads worker
// threads each take jobs (a 20–120 ms sleep standing in for a transaction) but start one only
// while holding a slot of the gauge resource, so at most the lease's capacity run at once
// across the process; the wants are the measured peak of jobs running + waiting. Once a second
// it prints the capacity, the most jobs seen running at once, and the jobs done.
//
//   doorman-gauge-jobs --server 127.0.0.1:7700 --resource db --threads 16 [--seconds 10]

#include <doorman/client.hpp>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client_flags.hpp"

int main(int argc, char** argv) {
  doorman_examples::client_flags flags{.resource = "db"};
  int threads = 16;
  double seconds = 10;
  return doorman_examples::run_program(
      argc, argv, "doorman-gauge-jobs",
      "usage: doorman-gauge-jobs [--server HOST:PORT[,...]] [--resource ID]"
      " [--threads N] [--seconds S]\n",
      flags.with({{"--threads", [&](auto& a) { threads = static_cast<int>(a.number(1, 1024)); }},
                  {"--seconds", [&](auto& a) { seconds = a.number(0.001, 86400); }}}),
      [&] {
        doorman::client client(flags.client_options());
        doorman::gauge_resource db(client, flags.resource);

        std::atomic<bool> stop{false};
        std::atomic<int> running{0};
        std::atomic<int> most{0};
        std::atomic<long> done{0};
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) {
          pool.emplace_back([&, t] {
            std::mt19937 random(static_cast<unsigned>(t));
            while (!stop) {
              auto slot = db.acquire();  // blocks until running < the lease's capacity
              if (stop) break;
              const int now = ++running;
              for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
              }
              std::this_thread::sleep_for(std::chrono::milliseconds(20 + random() % 100));
              --running;
              ++done;
            }
          });
        }
        const auto start = std::chrono::steady_clock::now();
        for (int s = 1; s <= static_cast<int>(std::ceil(seconds)); ++s) {
          std::this_thread::sleep_until(start + std::chrono::seconds(s));
          fmt::print("{:>3}s capacity {:>4.0f}  wants {:>4.0f}  most running {:>3}  jobs done {}\n",
                     s, db.capacity(), db.wants(), most.exchange(running.load()), done.exchange(0));
          std::fflush(stdout);
        }
        stop = true;
        db.limiter().set_limit(-1);  // let every waiting thread through, to see `stop`
        for (auto& t : pool)
          t.join();
        return 0;
      });
}
