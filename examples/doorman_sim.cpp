// doorman-sim: runs Doorman's convergence scenarios on the deterministic simulator (the core's
// engine, upstream and client state on a virtual clock) and writes, per run, a CSV time series,
// the events with their re-convergence times, and an SVG chart; prints the summary table.
//
//   doorman-sim --scenario 7 --seed 1 --out sim-out
//   doorman-sim --scenario all --out sim-out
//
// With --campaign, runs the seeded fault campaign instead (random trees and faults, invariant 1
// checked tree-wide whenever a lease changes): one line per seed, exit status 1 on a violation.
//
//   doorman-sim --campaign 1 --seeds 100 --minutes 600

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <doorman/sim.hpp>

#include <unistd.h>

#include "arguments.hpp"

#if defined(__linux__) && defined(__GLIBC__)
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace {

// A run of 100 000 clients visits their state in random order: with 4 KiB pages nearly every
// visit misses the TLB as well as the cache. Where the C library allows it (glibc on Linux),
// grow the heap once by a large reserve (address space: pages are only used as touched) and
// ask for transparent huge pages on it. The scale scenario then runs about a fifth faster.
// Only a hint: if anything is refused, nothing changes but the speed.
void prefer_huge_pages() {
#if defined(__linux__) && defined(__GLIBC__)
  constexpr int reserve = 1 << 30;
  const auto before = reinterpret_cast<std::uintptr_t>(sbrk(0));
  if (mallopt(M_TRIM_THRESHOLD, reserve) == 1 && mallopt(M_MMAP_THRESHOLD, 4 << 20) == 1 &&
      mallopt(M_TOP_PAD, reserve) == 1) {
    static void* volatile grow = nullptr;
    grow = std::malloc(2 << 20);  // more than the heap has free: it grows by this and the pad
    std::free(grow);
  }
  (void)mallopt(M_TOP_PAD, 128 << 10);  // later growth (past the reserve) as by default
  (void)mallopt(M_MMAP_THRESHOLD, 128 << 10);
  const auto after = reinterpret_cast<std::uintptr_t>(sbrk(0));
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::uintptr_t begin = (before + page - 1) & ~(page - 1);
  const std::uintptr_t end = after & ~(page - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
}

// --help: the scenarios listed from the simulator's own table.
std::string usage() {
  std::string out =
      "usage: doorman-sim [--scenario N|all] [--seed S] [--out DIR] [options]\n\n"
      "Runs a capacity tree on a virtual clock: the same engine, upstream and client state as\n"
      "doorman-node and the client library, with an in-memory network.\n\nscenarios:\n";
  for (const auto& s : doorman::sim::scenarios()) {
    char line[200];
    std::snprintf(line, sizeof line, "  %d  %-12s %s (%.0f s)\n", s.number, s.name.c_str(),
                  s.description.c_str(), s.duration);
    out += line;
  }
  return out +
         "\noptions:\n"
         "  --scenario N|all    which scenario (default 7); all runs 1-7\n"
         "  --seed S            random seed (default 1); the same seed gives the same run\n"
         "  --out DIR           write scenario-N-seed-S.{csv,events.csv,svg} and summary.md there\n"
         "  --duration S        simulated seconds (default: the scenario's)\n"
         "  --latency S         one-way network latency in seconds (default 0.001)\n"
         "  --jitter S          extra one-way delay, uniform in [0, S] (default 0)\n"
         "  --loss P            probability that a message is lost, each way (default 0)\n"
         "  --trace S           time-series step in seconds (default 1; 5 for scenario 8)\n"
         "  --fallback MODE     what clients use once a lease expired: pessimistic (default),\n"
         "                      optimistic or safe\n"
         "  --doorman           run without this project's changes to the protocol (the\n"
         "                      behaviour of Doorman's design), for comparison\n"
         "  --check             check the invariants at every decision (slower)\n"
         "  --quiet             no progress lines\n"
         "  --version           print the version and exit\n\n"
         "fault campaign (instead of a scenario):\n"
         "  --campaign S        run the seeded fault campaign from seed S\n"
         "  --seeds N           how many seeds, S to S+N-1 (default 1)\n"
         "  --minutes M         simulated minutes per seed (default 600)\n"
         "  --no-fencing        masters answer past their term: what the campaign must catch\n\n"
         "calls of heavy-tailed cost (instead of a scenario; docs/budgets.md):\n"
         "  --costs S           10 clients settling calls of 100 to 30 000 units against\n"
         "                      300 000 units/s, from seed S (--seeds and --duration apply)\n\n"
         "a learned capacity (instead of a scenario; docs/learned-capacity.md):\n"
         "  --learn S           10 clients calling a protected service whose capacity steps\n"
         "                      -50 % and +50 % and drifts, from seed S (--seeds applies):\n"
         "                      learned by the root (flat, and through an intermediate) and\n"
         "                      each client alone (per-process AIMD), side by side; --out DIR\n"
         "                      writes a chart of each run there\n";
}

// The campaign over `seeds` seeds from `first`: one line each; 1 when any broke an invariant.
int run_campaigns(std::uint64_t first, std::uint64_t seeds, double minutes, bool fencing) {
  std::uint64_t broken = 0;
  double simulated = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::uint64_t seed = first; seed < first + seeds; ++seed) {
    const auto r =
        doorman::sim::run_campaign({.seed = seed, .minutes = minutes, .fencing = fencing});
    std::cout << describe(r) << std::endl;
    simulated += r.minutes;
    if (r.violation) ++broken;
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "campaign: " << seeds << " seeds, " << static_cast<long long>(simulated)
            << " simulated minutes in " << static_cast<long long>(wall) << " s, " << broken
            << (broken == 1 ? " violation" : " violations") << std::endl;
  return broken == 0 ? 0 : 1;
}

// The cost runs over `seeds` seeds from `first`: one line each; 1 when any broke its promise.
int run_costs(std::uint64_t first, std::uint64_t seeds, double duration) {
  int broken = 0;
  for (std::uint64_t seed = first; seed < first + seeds; ++seed) {
    const auto r =
        doorman::sim::run_costs({.seed = seed, .duration = duration > 0 ? duration : 600});
    const bool ok = doorman::sim::kept(r.verdict);
    std::cout << "costs seed " << seed << ": " << doorman::sim::describe(r.verdict)
              << (ok ? "" : " (BROKEN)") << std::endl;
    if (!ok) ++broken;
  }
  return broken == 0 ? 0 : 1;
}

double number(const std::string& flag, const std::string& text) {
  return doorman_examples::parse_number(flag, text, 0, std::numeric_limits<double>::infinity());
}

// The learning runs over `seeds` seeds from `first`: a table of the worst over the seeds, per
// way of learning; with `out`, a chart per run.
int run_learning(std::uint64_t first, std::uint64_t seeds, const std::string& out) {
  struct way {
    const char* name;
    bool intermediate;
    bool alone;
  };
  std::cout << "| way | overloaded | in the 30 s after -50 % | used (least) | within 10 % after "
               "-50 % / +50 % | largest swing | steady seconds over 10 % off |\n"
               "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const way w : {way{"learned by the root, flat", false, false},
                      way{"learned by the root, through an intermediate", true, false},
                      way{"each client alone (AIMD), through an intermediate", true, true}}) {
    doorman::sim::learning_verdict worst{.used = 1};
    for (std::uint64_t seed = first; seed < first + seeds; ++seed) {
      const auto secs = doorman::sim::run_learning(
          {.seed = seed, .alone = w.alone, .intermediate = w.intermediate});
      const auto v = doorman::sim::judge_learning(secs);
      worst = {std::max(worst.reach_down, v.reach_down),
               std::max(worst.reach_up, v.reach_up),
               std::max(worst.step_overloads, v.step_overloads),
               std::max(worst.overloads, v.overloads),
               std::min(worst.used, v.used),
               std::max(worst.swing, v.swing),
               std::max(worst.off, v.off)};
      if (out.empty()) continue;
      const std::string file =
          fmt::format("{}/learn-{}{}-seed-{}.svg", out, w.alone ? "alone" : "root",
                      w.intermediate ? "-tree" : "-flat", seed);
      std::ofstream svg(file);
      doorman::sim::write_learning_svg(svg, secs, fmt::format("{}, seed {}", w.name, seed));
      if (!svg) throw std::runtime_error("cannot write " + file);
    }
    std::cout << fmt::format(
        "| {} | {:.2f} % | {:.2f} % | {:.1f} % | {:.0f} s / {:.0f} s | {:.1f} % | {:.1f} % |\n",
        w.name, 100 * worst.overloads, 100 * worst.step_overloads, 100 * worst.used,
        worst.reach_down, worst.reach_up, 100 * worst.swing, 100 * worst.off);
  }
  return 0;
}

// What the command line asks for.
struct sim_flags {
  std::vector<int> which{7};
  doorman::sim::run_options options;
  std::string out_dir;
  bool quiet = false;
  std::optional<std::uint64_t> campaign;
  std::optional<std::uint64_t> costs;
  std::optional<std::uint64_t> learn;
  std::uint64_t seeds = 1;
  double minutes = 600;
  bool fencing = true;
};

void read_scenarios(sim_flags& f, const std::string& v) {
  f.which.clear();
  if (v == "all") {
    for (int i = 1; i <= 7; ++i)
      f.which.push_back(i);
    return;
  }
  const double n = number("--scenario", v);
  (void)doorman::sim::find_scenario(static_cast<int>(n));
  f.which.push_back(static_cast<int>(n));
}

doorman::fallback read_fallback(const std::string& v) {
  if (v == "pessimistic") return doorman::fallback::pessimistic;
  if (v == "optimistic") return doorman::fallback::optimistic;
  if (v == "safe") return doorman::fallback::safe;
  throw std::invalid_argument("--fallback: expected pessimistic, optimistic or safe, got \"" + v +
                              "\"");
}

std::vector<doorman_examples::flag_action> flags(sim_flags& f) {
  using doorman_examples::arguments;
  auto& o = f.options;
  const auto num = [](arguments& a, const char* name) { return number(name, a.value()); };
  return {
      {"--scenario", [&](arguments& a) { read_scenarios(f, a.value()); }},
      {"--campaign",
       [&](arguments& a) { f.campaign = static_cast<std::uint64_t>(num(a, "--campaign")); }},
      {"--costs", [&](arguments& a) { f.costs = static_cast<std::uint64_t>(num(a, "--costs")); }},
      {"--learn", [&](arguments& a) { f.learn = static_cast<std::uint64_t>(num(a, "--learn")); }},
      {"--seeds", [&](arguments& a) { f.seeds = static_cast<std::uint64_t>(a.number(1, 1e6)); }},
      {"--minutes", [&](arguments& a) { f.minutes = a.number(0.01, 1e7); }},
      {"--no-fencing", [&](arguments&) { f.fencing = false; }},
      {"--seed", [&](arguments& a) { o.seed = static_cast<std::uint64_t>(num(a, "--seed")); }},
      {"--out", [&](arguments& a) { f.out_dir = a.value(); }},
      {"--duration", [&](arguments& a) { o.duration = num(a, "--duration"); }},
      {"--latency", [&](arguments& a) { o.network.latency = num(a, "--latency"); }},
      {"--jitter", [&](arguments& a) { o.network.jitter = num(a, "--jitter"); }},
      {"--loss",
       [&](arguments& a) {
         o.network.loss = num(a, "--loss");
         if (o.network.loss >= 1) throw std::invalid_argument("--loss: must be below 1");
       }},
      {"--trace", [&](arguments& a) { o.trace_interval = num(a, "--trace"); }},
      {"--fallback", [&](arguments& a) { o.client_fallback = read_fallback(a.value()); }},
      {"--doorman", [&](arguments&) { o.engine = doorman::sim::doorman_engine_options(); }},
      {"--check", [&](arguments&) { o.check_invariants = true; }},
      {"--quiet", [&](arguments&) { f.quiet = true; }},
  };
}

// Progress of scenario `n`: on a terminal, one line rewritten in place; elsewhere (a log, a
// pipe, CI), a whole line at each quarter, so no file fills with carriage returns.
std::function<void(double)> progress_of(int n, double duration) {
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  int quarter = 0;
  return [n, duration, terminal, quarter](double f) mutable {
    if (terminal) {
      std::fprintf(stderr, "\rscenario %d: %3.0f%% (%.0f of %.0f s simulated)", n, 100 * f,
                   f * duration, duration);
      if (f >= 1) std::fputc('\n', stderr);
    } else if (f * 4 >= quarter + 1) {
      quarter = static_cast<int>(f * 4);
      std::fprintf(stderr, "scenario %d: %3.0f%% (%.0f of %.0f s simulated)\n", n, 100 * f,
                   f * duration, duration);
    }
  };
}

// The run's time series, events and chart, as out_dir/scenario-N-seed-S.*.
void write_run(const std::string& out_dir, int n, std::uint64_t seed,
               const doorman::sim::run_result& r) {
  const std::string base =
      out_dir + "/scenario-" + std::to_string(n) + "-seed-" + std::to_string(seed);
  std::ofstream csv(base + ".csv");
  doorman::sim::write_csv(csv, r);
  std::ofstream events(base + ".events.csv");
  doorman::sim::write_events_csv(events, r);
  std::ofstream svg(base + ".svg");
  doorman::sim::write_svg(svg, r);
  if (!csv || !events || !svg) throw std::runtime_error("cannot write " + base + ".*");
  std::fprintf(stderr, "wrote %s.csv, %s.events.csv, %s.svg\n", base.c_str(), base.c_str(),
               base.c_str());
}

// The scenarios asked for, one after the other; the summary table.
int run_scenarios(sim_flags& f) {
  auto& options = f.options;
  std::vector<doorman::sim::run_result> results;
  for (const int n : f.which) {
    options.scenario = n;
    const auto& info = doorman::sim::find_scenario(n);
    const double duration = options.duration > 0 ? options.duration : info.duration;
    if (!f.quiet) options.progress = progress_of(n, duration);
    const auto start = std::chrono::steady_clock::now();
    results.push_back(doorman::sim::run_scenario(options));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto& r = results.back();
    std::fprintf(stderr, "scenario %d: %zu clients, %.0f s simulated in %.2f s (%llu events)\n", n,
                 r.clients, duration, wall, static_cast<unsigned long long>(r.events));
    if (!f.out_dir.empty()) write_run(f.out_dir, n, options.seed, r);
  }
  const std::string table = doorman::sim::summary_table(results);
  std::cout << table;
  if (!f.out_dir.empty()) std::ofstream(f.out_dir + "/summary.md") << table;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  prefer_huge_pages();
  sim_flags f;
  const auto text = usage();
  return doorman_examples::run_program(argc, argv, "doorman-sim", text.c_str(), flags(f), [&] {
    if (f.campaign) return run_campaigns(*f.campaign, f.seeds, f.minutes, f.fencing);
    if (f.costs) return run_costs(*f.costs, f.seeds, f.options.duration);
    if (!f.out_dir.empty()) std::filesystem::create_directories(f.out_dir);
    if (f.learn) return run_learning(*f.learn, f.seeds, f.out_dir);
    return run_scenarios(f);
  });
}
