// doorman-engine-demo: one resource shared by clients that arrive, change their demand and
// leave, decided by the real engine on a virtual clock. Prints one table row per step.
//
//   doorman-engine-demo [--algorithm FAIR_SHARE] [--capacity 100] [--steps 30]
//
// Every client asks for capacity each refresh interval (10 s of virtual time, one step). The
// engine starts in learning mode (20 s), so at first it only confirms what clients say they
// have; then the algorithm divides the capacity. A client that leaves either releases its
// lease at once or just stops refreshing, and then its lease runs out (60 s).

#include <doorman/core.hpp>

#include <fmt/format.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "arguments.hpp"

namespace {

struct options {
  std::string algorithm = "FAIR_SHARE";
  double capacity = 100;
  int steps = 30;
};

constexpr const char* usage =
    "usage: doorman-engine-demo [--algorithm KIND] [--capacity N] [--steps N]\n"
    "  --algorithm KIND  FAIR_SHARE (default), PROPORTIONAL_SHARE, STATIC or NO_ALGORITHM\n"
    "  --capacity N      capacity of the shared resource (default 100)\n"
    "  --steps N         number of 10-second steps to simulate (default 30)\n";

// What one client does over time: its wants from a given step, and when it leaves.
struct script {
  std::string id;
  int arrives;
  std::map<int, double> wants;  // step -> new wants
  int leaves;                   // step at which it stops (a large number: never)
  bool releases;                // on leaving: release the lease (else just go silent)
};

}  // namespace

namespace {

using engine_t = doorman::basic_engine<doorman::manual_clock>;

// The demo: the engine, and the clients' script played step by step.
struct demo {
  const options& opt;
  engine_t engine;
  doorman::manual_clock clock;
  std::vector<script> clients = {
      {"alpha", 0, {{0, 50}}, 12, true},               // leaves at 120 s, releasing
      {"bravo", 0, {{0, 30}, {15, 80}}, 1000, false},  // wants 80 from 150 s
      {"charlie", 4, {{4, 40}}, 18, false},            // goes silent at 180 s
      {"delta", 6, {{6, 10}, {22, 45}}, 1000, false},  // arrives at 60 s
      {"echo", 9, {{9, 200}}, 1000, false},            // a heavy newcomer at 90 s
  };
  std::map<std::string, doorman::lease_info> held;  // what each client believes it has
  std::map<std::string, double> wants;

  // A bad --algorithm throws config_error, naming the field: run_program reports it, exit 2.
  explicit demo(const options& o)
      : opt(o),
        engine(engine_t::parse_config(fmt::format(
            R"({{"resources": [{{"identifier_glob": "*", "capacity": {},
                "description": "queries per second to a shared database",
                "algorithm": {{"kind": "{}", "lease_length": 60, "refresh_interval": 10,
                              "learning_mode_duration": 20}}}}]}})",
            o.capacity, o.algorithm))) {
    engine.set_mastership(true, "demo", clock.now());
  }

  void print_header() const {
    fmt::print("resource \"db\": capacity {} ({}), lease 60 s, refresh 10 s, learning 20 s\n",
               opt.capacity, opt.algorithm);
    fmt::print("each cell: wants/granted; '-' absent; '~' silent (lease still counted)\n\n");
    fmt::print("{:>6} {:>8}", "time", "mode");
    for (const auto& c : clients)
      fmt::print(" {:>13}", c.id);
    fmt::print(" {:>9} {:>9} {:>8}\n", "granted", "wants", "clients");
  }

  // Every client's turn at `step`: it arrives, asks, changes what it wants or leaves.
  void play(int step) {
    const auto now = clock.now();
    for (const auto& c : clients) {
      if (step < c.arrives || step > c.leaves) continue;
      if (auto w = c.wants.upper_bound(step); w != c.wants.begin())
        wants[c.id] = std::prev(w)->second;
      if (step == c.leaves) {
        if (c.releases) (void)engine.release_capacity({c.id, {"db"}}, now);
        held.erase(c.id);
        continue;
      }
      std::optional<doorman::lease_info> has;
      if (auto h = held.find(c.id); h != held.end()) has = h->second;
      auto r = engine.get_capacity({c.id, {{"db", 0, wants[c.id], has}}}, now);
      if (!r) throw std::runtime_error(r.error().message);
      held[c.id] = r.value().resources.at(0).gets;
    }
  }

  // The row of `step`; whether more than the capacity was granted outside learning mode.
  bool print_row(int step, bool learning) {
    const auto now = clock.now();
    auto status = engine.status({"db"}, now);
    const auto& res = status.value().resources.at(0);
    fmt::print("{:>5}s {:>8}", static_cast<int>(doorman::to_seconds(now.time_since_epoch())),
               learning ? "learning" : "normal");
    for (const auto& c : clients) {
      std::string cell = "-";
      if (step >= c.arrives && step < c.leaves) {
        cell = fmt::format("{:g}/{:.1f}", wants[c.id], held[c.id].capacity);
      } else if (step >= c.leaves && !c.releases) {
        for (const auto& l : status.value().leases) {
          if (l.client_id == c.id) cell = fmt::format("~/{:.1f}", l.has.capacity);
        }
      }
      fmt::print(" {:>13}", cell);
    }
    fmt::print(" {:>9.1f} {:>9.1f} {:>8}\n", res.sum_has, res.sum_wants, res.clients);
    return !learning && res.sum_has > opt.capacity * (1 + 1e-9) && opt.algorithm != "STATIC" &&
           opt.algorithm != "NO_ALGORITHM";
  }
};

int run(const options& opt) {
  demo d(opt);
  d.print_header();
  bool over = false;
  for (int step = 0; step < opt.steps; ++step) {
    const bool learning = d.engine.learning("db", d.clock.now());
    d.play(step);
    over = d.print_row(step, learning) || over;
    d.clock.advance(std::chrono::seconds(10));
  }
  fmt::print("\ngranted never exceeded capacity outside learning mode: {}\n", over ? "NO" : "yes");
  return over ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  return doorman_examples::run_program(
      argc, argv, "doorman-engine-demo", usage,
      {{"--algorithm", [&](auto& a) { opt.algorithm = a.value(); }},
       {"--capacity", [&](auto& a) { opt.capacity = a.number(0, 1e15); }},
       {"--steps", [&](auto& a) { opt.steps = static_cast<int>(a.number(1, 1e6)); }}},
      [&] { return run(opt); });
}
