// doorman-client-demo: the quick start. A local capacity tree (a root and two intermediate
// doorman-node processes) and doorman-worker processes of different demand sharing the
// resource "api" through it. Once a second it prints each worker's measured wants, its lease
// and the operations it ran in that second, and the total against the capacity; workers arrive
// and leave, and the shares move.
//
//   doorman-client-demo [--duration 24] [--capacity 200] [--bin-dir DIR]
//
// Script: w1 (20/s) and w2 (60/s) under "left", w3 (100/s) under "right" from the start;
// w4 (150/s) joins "right" at 8 s; w2 stops (and releases its lease) at 16 s.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "arguments.hpp"
#include "demo_tree.hpp"

namespace {

using steady = std::chrono::steady_clock;
using doorman_examples::process;

struct worker {
  std::string name;
  int mid;        // 0 = left, 1 = right
  double demand;  // operations per second arriving
  double start;   // seconds after the start
  double stop;    // < 0: never
  std::unique_ptr<process> proc{};
  bool done = false;
};

struct status {
  double wants = 0;
  double capacity = 0;
  double ops = 0;
  double allowed = -1;  // what the lease admitted in that second (-1: unlimited)
  bool leased = false;
};

// A worker's capacity change, stamped with the machine's monotonic clock.
struct lease_change {
  std::int64_t t = 0;
  std::size_t worker = 0;
  double capacity = 0;  // counted only when leased
};

// Calls `f(key, value)` for every `key=value` word of a worker's line.
template <class F>
void for_each_field(const std::string& line, F f) {
  std::istringstream words(line);
  std::string field;
  while (words >> field) {
    const auto eq = field.find('=');
    if (eq != std::string::npos) f(field.substr(0, eq), field.substr(eq + 1));
  }
}

// The last status line a worker printed.
std::optional<status> last_status(const process& p) {
  const std::string log = p.log();
  const auto at = log.rfind("status name=");
  if (at == std::string::npos) return std::nullopt;
  status s;
  for_each_field(log.substr(at, log.find('\n', at) - at),
                 [&](const std::string& key, const std::string& value) {
                   if (key == "wants") s.wants = std::stod(value);
                   if (key == "capacity") s.capacity = std::stod(value);
                   if (key == "ops") s.ops = std::stod(value);
                   if (key == "allowed") s.allowed = std::stod(value);
                   if (key == "leased") s.leased = value == "1";
                 });
  return s;
}

// Every capacity change worker `index` logged to `file` ("lease name=... t=NS capacity=C
// leased=0|1").
void read_changes(const std::filesystem::path& file, std::size_t index,
                  std::vector<lease_change>& out) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("lease name=")) continue;
    lease_change c;
    c.worker = index;
    bool leased = false;
    for_each_field(line, [&](const std::string& key, const std::string& value) {
      if (key == "t") c.t = std::stoll(value);
      if (key == "capacity") c.capacity = std::stod(value);
      if (key == "leased") leased = value == "1";
    });
    if (!leased) c.capacity = 0;
    out.push_back(c);
  }
}

// The workers' leases summed at each instant: a step function from every change, in time
// order (the monotonic clock is one for every process of the machine).
class lease_sum {
 public:
  explicit lease_sum(std::vector<lease_change> changes) : changes_(std::move(changes)) {
    std::stable_sort(changes_.begin(), changes_.end(),
                     [](const auto& a, const auto& b) { return a.t < b.t; });
  }

  // Each worker's lease at `t` (a worker with no change by then is absent).
  [[nodiscard]] std::map<std::size_t, double> held_at(std::int64_t t) const {
    std::map<std::size_t, double> held;
    for (const auto& c : changes_) {
      if (c.t > t) break;
      held[c.worker] = c.capacity;
    }
    return held;
  }

  struct peak {
    double most = 0;     // the most held at once
    double over = 0;     // seconds above the capacity, in all
    double longest = 0;  // seconds of the longest stretch above it
  };

  [[nodiscard]] peak most(double capacity) const {
    std::map<std::size_t, double> held;
    peak p;
    double stretch = 0;
    for (std::size_t i = 0; i < changes_.size(); ++i) {
      held[changes_[i].worker] = changes_[i].capacity;
      if (i + 1 < changes_.size() && changes_[i + 1].t == changes_[i].t) continue;
      double sum = 0;
      for (const auto& [w, c] : held)
        sum += c;
      p.most = std::max(p.most, sum);
      if (sum <= capacity + 1e-6 || i + 1 == changes_.size()) {
        stretch = 0;
        continue;
      }
      const double d = static_cast<double>(changes_[i + 1].t - changes_[i].t) * 1e-9;
      p.over += d;
      stretch += d;
      p.longest = std::max(p.longest, stretch);
    }
    return p;
  }

 private:
  std::vector<lease_change> changes_;
};

volatile std::sig_atomic_t interrupted = 0;
void on_signal(int) {
  interrupted = 1;
}

// Every cell, header and data, is this wide after its '|'.
constexpr int cell = 18;

// The workers, started and stopped as the script says.
struct crew {
  std::vector<worker> workers;
  int stopped = 0;
  int stopped_cleanly = 0;

  void print_header() const {
    fmt::print("each cell: wants / lease at the second's end / ops run in the last second\n");
    fmt::print("  t  ");
    for (const auto& w : workers) {
      fmt::print(
          "|{:<{}}",
          fmt::format(" {} ({:>3.0f}/s {})", w.name, w.demand, w.mid == 0 ? "left" : "right"),
          cell);
    }
    fmt::print("| total lease  total ops\n");
  }

  // At second `t`: the workers due start, those due stop are stopped.
  void step(double t, const doorman_examples::local_tree& tree, const std::filesystem::path& bin) {
    for (auto& w : workers) {
      if (!w.proc && !w.done && w.start <= t && (w.stop < 0 || w.stop > t)) {
        w.proc = std::make_unique<process>(
            std::vector<std::string>{(bin / "doorman-worker").string(), "--server",
                                     tree.mid_addresses[static_cast<std::size_t>(w.mid)],
                                     "--resource", "api", "--demand", fmt::format("{}", w.demand),
                                     "--name", w.name},
            (tree.dir / (w.name + ".log")).string());
      }
      if (w.proc && w.stop >= 0 && w.stop <= t) {
        stop(w);
        w.done = true;
      }
    }
  }

  void stop(worker& w) {
    w.proc->signal(SIGTERM);
    stopped_cleanly += w.proc->wait_exit() == 0 ? 1 : 0;
    ++stopped;
    w.proc.reset();
  }

  // The row of `second`, from `held` (the leases at its end); `over_lease` is set when a worker
  // ran more than its lease admitted.
  std::string row(int second, const std::map<std::size_t, double>& held, double capacity,
                  bool& over_lease) const {
    std::string out = fmt::format("{:>3}s ", second);
    double total_lease = 0;
    double total_ops = 0;
    for (std::size_t i = 0; i < workers.size(); ++i) {
      const auto& w = workers[i];
      const auto s = w.proc ? last_status(*w.proc) : std::nullopt;
      if (!s) {
        out += fmt::format("|{:{}}", "", cell);
        continue;
      }
      const auto h = held.find(i);
      const double lease = h == held.end() ? 0.0 : h->second;
      total_lease += lease;
      out += fmt::format("|{:<{}}",
                         fmt::format(" {:>4.0f} {:>5.1f} {:>4.0f}", s->wants, lease, s->ops), cell);
      total_ops += s->ops;
      // The worker's operations in a second stay within what its lease admitted over that
      // second (the capacity integrated over it, a cut inside it included, plus the burst);
      // one more for an operation on the second's edge.
      if (s->allowed >= 0 && s->ops > s->allowed + 1) over_lease = true;
    }
    return out + fmt::format("| {:>5.1f} / {:.0f}  {:>5.0f}", total_lease, capacity, total_ops);
  }
};

// Summed at every instant a worker's lease changed, each stamped as the worker's limiter took
// it. A cut takes effect when its answer arrives, so a raise answered to another worker a
// moment before can overlap it for as long as answers take to be delivered (milliseconds); an
// over-grant by a node would last a refresh interval (seconds). Whether it stayed within that.
bool print_peak(const lease_sum::peak& peak, double capacity) {
  const bool within = peak.longest <= 0.5;
  fmt::print("\nmost leased at once (summed at every lease change): {:.2f} of {:.0f} ({})\n",
             peak.most, capacity,
             peak.over == 0 ? std::string("never over capacity")
             : within       ? fmt::format("never over capacity but while answers were in "
                                                "flight: {:.2g} over for {:.0f} ms in all, {:.0f} ms "
                                                "at most",
                                          peak.most - capacity, peak.over * 1e3, peak.longest * 1e3)
                            : fmt::format("OVER CAPACITY for {:.3f} s in all, {:.3f} s at once",
                                          peak.over, peak.longest));
  return within;
}

int run(double duration, double capacity, const std::filesystem::path& bin) {
  auto tree = doorman_examples::local_tree::start((bin / "doorman-node").string(), capacity,
                                                  "doorman-client-demo");
  if (!tree) return 1;
  crew c;
  c.workers.push_back({"w1", 0, 20, 0, -1});
  c.workers.push_back({"w2", 0, 60, 0, 16});
  c.workers.push_back({"w3", 1, 100, 0, -1});
  c.workers.push_back({"w4", 1, 150, 8, -1});
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  c.print_header();

  const auto t0 = steady::now();
  const auto changes = [&] {
    std::vector<lease_change> all;
    for (std::size_t i = 0; i < c.workers.size(); ++i)
      read_changes(tree->dir / (c.workers[i].name + ".log"), i, all);
    return lease_sum(std::move(all));
  };
  bool over_lease = false;
  for (int second = 1; second <= static_cast<int>(duration) && !interrupted; ++second) {
    c.step(second - 1, *tree, bin);
    std::this_thread::sleep_until(t0 + std::chrono::seconds(second));
    // The leases as they stood at the second's end, from every worker's lease changes: the
    // cells and their total are the same numbers.
    const auto held =
        changes().held_at((t0 + std::chrono::seconds(second)).time_since_epoch().count());
    fmt::print("{}\n", c.row(second, held, capacity, over_lease));
  }
  const bool within = print_peak(changes().most(capacity), capacity);
  fmt::print("every worker kept to its lease: {}\n", over_lease ? "no" : "yes");
  for (auto& w : c.workers)
    if (w.proc) c.stop(w);
  fmt::print("stopping: workers exited 0: {} of {}; ", c.stopped_cleanly, c.stopped);
  const bool clean = tree->stop() && c.stopped_cleanly == c.stopped;
  fmt::print("{}\n", clean ? "every node exited 0" : "a process did not exit cleanly");
  if (clean) std::filesystem::remove_all(tree->dir);
  return clean && !over_lease && within ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  double duration = 24;
  double capacity = 200;
  std::filesystem::path bin = std::filesystem::path(argv[0]).parent_path();
  return doorman_examples::run_program(
      argc, argv, "doorman-client-demo",
      "usage: doorman-client-demo [--duration SECONDS] [--capacity N] [--bin-dir DIR]\n"
      "  --duration SECONDS  how long the workers run (default 24)\n"
      "  --capacity N        capacity of the resource \"api\" (default 200)\n"
      "  --bin-dir DIR       where doorman-node and doorman-worker are (default: here)\n",
      doorman_examples::demo_flags(1, duration, capacity,
                                   {{"--bin-dir", [&](auto& args) { bin = args.value(); }}}),
      [&] {
        for (const char* b : {"doorman-node", "doorman-worker"}) {
          if (!std::filesystem::exists(bin / b)) {
            throw std::invalid_argument(
                fmt::format("no {} in {} (build it, or pass --bin-dir)", b, bin.string()));
          }
        }
        return run(duration, capacity, bin);
      });
}
