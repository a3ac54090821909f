// Cost of one allocation decision as the number of clients of one resource grows.
//
// n clients of one resource refresh in turn, each every 16 virtual seconds (the manual clock
// advances 16 s / n per decision), with wants drifting each time (drift.hpp). Capacity is
// scarce (about 60% of total wants), so the algorithm has real work on every call: the
// `contended` counter is the share of timed decisions that granted less than was asked. Learning
// mode is off; the minimum refresh interval (5 s) never short-cuts a decision here.
//
//   build/release/benchmarks/doorman_bench_decision
//       --benchmark_out=decision.json --benchmark_out_format=json

#include <benchmark/benchmark.h>

#include <doorman/core.hpp>
#include <doorman/node/status_page.hpp>
#include <doorman/protocol/hot_path.hpp>

#include "drift.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

using engine_t = doorman::basic_engine<doorman::manual_clock>;

struct workload {
  std::string kind;
  std::size_t clients = 0;
  doorman::manual_clock clock;
  std::unique_ptr<engine_t> engine;
  std::vector<std::string> ids;
  std::vector<double> wants;
  std::mt19937_64 rng{1};
  std::size_t next = 0;
  std::size_t contended = 0;  // decisions that granted less than was asked
  doorman::capacity_request request;

  workload(std::string k, std::size_t n) : kind(std::move(k)), clients(n) {
    auto repo = doorman::resource_repository::parse(R"({"resources": [
      {"identifier_glob": "*", "capacity": )" + std::to_string(30.0 * static_cast<double>(n)) +
                                                    R"(,
       "algorithm": {"kind": ")" + kind + R"(", "lease_length": 60, "refresh_interval": 16,
                     "learning_mode_duration": 0}}]})");
    engine = std::make_unique<engine_t>(std::move(repo));
    engine->set_mastership(true, std::nullopt, clock.now());
    for (std::size_t i = 0; i < n; ++i) {
      ids.push_back("client-" + std::to_string(i));
      wants.push_back(doorman_bench::initial_wants(rng));
    }
    request.resources.push_back({"resource", 0, 0, std::nullopt});
    for (std::size_t i = 0; i < n; ++i)
      decide();  // every client known, with a lease
  }

  // One client's refresh: drift its wants, ask, advance the virtual clock.
  double decide() {
    const std::size_t i = next;
    next = (next + 1) % clients;
    wants[i] = doorman_bench::drift_wants(wants[i], rng);
    request.client_id = ids[i];
    request.resources[0].wants = wants[i];
    auto r = engine->get_capacity(request, clock.now());
    clock.advance(std::chrono::nanoseconds(16'000'000'000LL / static_cast<long long>(clients)));
    const double gets = r.value().resources[0].gets.capacity;
    contended += gets < wants[i] ? 1 : 0;
    return gets;
  }
};

// The workload of the running benchmark; rebuilt when the arguments change, so that only one
// million-client workload is in memory at a time.
workload& workload_for(const std::string& kind, std::size_t n) {
  static std::unique_ptr<workload> current;
  if (!current || current->kind != kind || current->clients != n) {
    current.reset();
    current = std::make_unique<workload>(kind, n);
  }
  return *current;
}

// `count` of the timed iterations, as a share of them.
double share_of_iterations(std::int64_t count, const benchmark::State& state) {
  return static_cast<double>(count) /
         static_cast<double>(std::max<std::int64_t>(1, state.iterations()));
}

void decision(benchmark::State& state, const std::string& kind) {
  auto& w = workload_for(kind, static_cast<std::size_t>(state.range(0)));
  w.contended = 0;
  for (auto _ : state)
    benchmark::DoNotOptimize(w.decide());
  state.counters["clients"] = static_cast<double>(state.range(0));
  state.counters["contended"] = share_of_iterations(static_cast<std::int64_t>(w.contended), state);
  state.counters["decisions_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// For comparison: a server that, like Doorman's Go server, looks at every client on every
// decision. Here: the water level recomputed by scanning all wants (the textbook fixpoint),
// with the same drifting workload but no engine around it.
void fair_share_scan(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::mt19937_64 rng(1);
  std::vector<double> wants(n);
  for (auto& w : wants)
    w = doorman_bench::initial_wants(rng);
  std::vector<char> satisfied(n);
  const double capacity = 30.0 * static_cast<double>(n);
  std::size_t next = 0;
  for (auto _ : state) {
    wants[next] = doorman_bench::drift_wants(wants[next], rng);
    std::fill(satisfied.begin(), satisfied.end(), 0);
    double left = capacity;
    double level = 0;
    for (bool changed = true; changed;) {
      changed = false;
      double unsatisfied = 0;
      for (std::size_t i = 0; i < n; ++i)
        unsatisfied += satisfied[i] ? 0 : 1;
      level = left / unsatisfied;
      for (std::size_t i = 0; i < n; ++i) {
        if (!satisfied[i] && wants[i] <= level) {
          satisfied[i] = 1;
          left -= wants[i];
          changed = true;
        }
      }
    }
    benchmark::DoNotOptimize(std::min(wants[next], level));
    next = (next + 1) % n;
  }
  state.counters["clients"] = static_cast<double>(n);
  state.counters["decisions_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// The share index alone: the update of one demand and the water level after it, with the same
// drifting wants as the decisions above, and no engine, lookup or lease around them. What the
// decision costs beyond this is mostly the client's lookup.
void share_index_update(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  doorman::share_index index;
  std::mt19937_64 rng{1};
  std::vector<double> wants;
  std::vector<doorman::share_index::handle> handles;
  for (std::size_t i = 0; i < n; ++i) {
    wants.push_back(doorman_bench::initial_wants(rng));
    handles.push_back(index.insert(wants.back(), 1));
  }
  const double capacity = 30.0 * static_cast<double>(n);
  std::size_t next = 0;
  std::int64_t contended = 0;  // updates after which the capacity was short of total wants
  for (auto _ : state) {
    wants[next] = doorman_bench::drift_wants(wants[next], rng);
    index.update(handles[next], wants[next], 1);
    const double level = index.water_level(capacity);
    contended += std::isfinite(level) ? 1 : 0;
    benchmark::DoNotOptimize(level);
    next = (next + 1) % n;
  }
  state.counters["clients"] = static_cast<double>(n);
  state.counters["contended"] = share_of_iterations(contended, state);
}

void fair_share(benchmark::State& state) {
  decision(state, "FAIR_SHARE");
}
void proportional_share(benchmark::State& state) {
  decision(state, "PROPORTIONAL_SHARE");
}

// One page (500 leases) of the admin endpoint's /status/resources/<id>, with the workload's n
// leases: what the node's strand spends on it (status paged by the engine, then rendered).
void status_page(benchmark::State& state) {
  auto& w = workload_for("FAIR_SHARE", static_cast<std::size_t>(state.range(0)));
  std::int64_t page = 0;
  const auto pages = static_cast<std::int64_t>(w.clients / doorman::leases_per_page);
  for (auto _ : state) {
    const doorman::lease_page leases{page * static_cast<std::int64_t>(doorman::leases_per_page),
                                     static_cast<std::int64_t>(doorman::leases_per_page)};
    auto st = w.engine->status(doorman::status_request{"resource"}, w.clock.now(), leases);
    doorman::admin_snapshot s;
    s.resources.push_back({st.value().resources.at(0), "", "*", std::nullopt});
    s.lease_count = st.value().lease_count.value_or(0);
    s.leases = std::move(st.value().leases);
    benchmark::DoNotOptimize(doorman::render_resource(s, static_cast<std::size_t>(page) + 1));
    page = (page + 1) % pages;
  }
  state.counters["leases"] = static_cast<double>(state.range(0));
}

// A parent link's request of `n` resources, one band each, with a lease held.
doorman::server_capacity_request upstream_request(std::size_t n) {
  doorman::server_capacity_request r{"intermediate-7", {}};
  for (std::size_t i = 0; i < n; ++i) {
    r.resources.push_back({"resource-" + std::to_string(i),
                           doorman::lease_info{12.5, 41.25, 16},
                           12.5,
                           {{0, 3, 17.75}}});
  }
  return r;
}

// The params of that request as a channel writes them: through the JSON DOM (`to_line`, the
// untyped call), or by the streaming writer (a typed call). The same bytes either way.
void request_params_dom(benchmark::State& state) {
  const auto r = upstream_request(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state)
    benchmark::DoNotOptimize(doorman::to_line(nlohmann::json(r)));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void request_params_stream(benchmark::State& state) {
  const auto r = upstream_request(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    std::string line;
    doorman::detail::write_fields(line, r);
    benchmark::DoNotOptimize(line);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

BENCHMARK(request_params_dom)->RangeMultiplier(100)->Range(1, 10'000)->MinTime(0.5);
BENCHMARK(request_params_stream)->RangeMultiplier(100)->Range(1, 10'000)->MinTime(0.5);
BENCHMARK(fair_share)->RangeMultiplier(10)->Range(1'000, 1'000'000)->MinTime(0.5);
BENCHMARK(proportional_share)->RangeMultiplier(10)->Range(1'000, 1'000'000)->MinTime(0.5);
BENCHMARK(share_index_update)->RangeMultiplier(10)->Range(1'000, 1'000'000)->MinTime(0.5);
BENCHMARK(fair_share_scan)->RangeMultiplier(10)->Range(1'000, 100'000)->MinTime(0.5);
BENCHMARK(status_page)
    ->RangeMultiplier(10)
    ->Range(1'000, 100'000)
    ->MinTime(0.5)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
