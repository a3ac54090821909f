// How fast a new client reaches the capacity it needs: the README's loop
// (`rate_resource api(client, "api"); for (;;) api.wait();`, wants measured) against an idle
// in-process root with the node's defaults (minimum refresh interval 5 s).
//
//   build/release/benchmarks/doorman_bench_ramp [--capacity N] [--seconds S]
//       [--algorithm FAIR_SHARE|PROPORTIONAL_SHARE] [--refresh-interval S] [--safe-capacity N]
//
// Prints one JSON object: the time of the first permit; when the permits admitted over the
// last second first reached 50% and 90% of the capacity; when the lease did; the steady
// state's wants against its use (the mean over the last 10 s); and the curve, one point per
// second (permits in that second, the lease, the wants). Times count from the handle's
// creation. It uses the public API only, so the same file builds against older headers.

#include <doorman/client.hpp>
#include <doorman/node.hpp>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "arguments.hpp"

namespace {

using steady = std::chrono::steady_clock;

struct settings {
  double capacity = 50;
  double seconds = 60;
  std::string algorithm = "FAIR_SHARE";
  double refresh_interval = 5;
  std::optional<double> safe_capacity;
};

constexpr const char* usage =
    "usage: doorman_bench_ramp [--capacity N] [--seconds S] [--algorithm KIND]\n"
    "                          [--refresh-interval S] [--safe-capacity N]\n"
    "  --capacity N          the resource's capacity, permits a second (default 50)\n"
    "  --seconds S           how long the loop runs (default 60)\n"
    "  --algorithm KIND      FAIR_SHARE (default) or PROPORTIONAL_SHARE\n"
    "  --refresh-interval S  the template's refresh interval (default 5)\n"
    "  --safe-capacity N     the template's safe capacity (default: the server's dynamic one)\n";

std::string config_of(const settings& s) {
  std::string safe;
  if (s.safe_capacity) safe = fmt::format(R"(, "safe_capacity": {})", *s.safe_capacity);
  return fmt::format(
      R"({{"resources": [{{"identifier_glob": "*", "capacity": {}{}, "algorithm": {{"kind": "{}",
      "lease_length": 60, "refresh_interval": {}, "learning_mode_duration": 0}}}}]}})",
      s.capacity, safe, s.algorithm, s.refresh_interval);
}

struct point {
  double permits = 0;  // in this second
  double capacity = 0;
  double wants = 0;
};

// The first second (counted from the start) at whose end `value(second)` reached `level`.
template <class F>
double first_reaching(const std::vector<point>& curve, double level, F value) {
  for (std::size_t i = 0; i < curve.size(); ++i) {
    if (value(curve[i]) >= level) return static_cast<double>(i + 1);
  }
  return -1;
}

int run(const settings& s) {
  asio::io_context io;
  doorman::node_options options;
  options.listen = "127.0.0.1:0";
  doorman::node root(io.get_executor(), doorman::engine::parse_config(config_of(s)), options);
  root.start();
  std::thread server([&] { io.run(); });

  std::vector<point> curve;
  double first_permit = -1;
  {
    doorman::client_options co;
    co.addresses = {root.local_address()};
    doorman::client client(co);
    const auto start = steady::now();
    doorman::rate_resource api(client, "api");
    std::atomic<std::uint64_t> admitted{0};
    std::atomic<bool> done{false};
    std::atomic<double> first{-1};
    std::thread loop([&] {
      while (!done) {
        api.wait();
        if (admitted.fetch_add(1) == 0) {
          first = std::chrono::duration<double>(steady::now() - start).count();
        }
      }
    });
    std::uint64_t seen = 0;
    for (int second = 1; second <= static_cast<int>(s.seconds); ++second) {
      std::this_thread::sleep_until(start + std::chrono::seconds(second));
      const std::uint64_t now = admitted.load();
      curve.push_back({static_cast<double>(now - seen), api.capacity(), api.wants()});
      seen = now;
    }
    done = true;
    api.limiter().set_rate(-1);  // let the loop out
    loop.join();
    first_permit = first.load();
  }
  root.stop();
  server.join();

  const auto permits = [](const point& p) { return p.permits; };
  const auto lease = [](const point& p) { return p.capacity; };
  double use = 0;
  double wants = 0;
  const std::size_t tail = std::min<std::size_t>(10, curve.size());
  for (std::size_t i = curve.size() - tail; i < curve.size(); ++i) {
    use += curve[i].permits / static_cast<double>(tail);
    wants += curve[i].wants / static_cast<double>(tail);
  }
  std::string points;
  for (const auto& p : curve) {
    points +=
        fmt::format("{}[{}, {}, {}]", points.empty() ? "" : ", ", p.permits, p.capacity, p.wants);
  }
  fmt::print(
      "{{\"capacity\": {}, \"algorithm\": \"{}\", \"first_permit_s\": {:.3f}, "
      "\"permits_50_s\": {}, \"permits_90_s\": {}, \"lease_50_s\": {}, \"lease_90_s\": {}, "
      "\"steady_use\": {:.1f}, \"steady_wants\": {:.1f}, \"wants_over_use\": {:.2f},\n"
      " \"curve (permits, lease, wants each second)\": [{}]}}\n",
      s.capacity, s.algorithm, first_permit, first_reaching(curve, 0.5 * s.capacity, permits),
      first_reaching(curve, 0.9 * s.capacity, permits),
      first_reaching(curve, 0.5 * s.capacity, lease),
      first_reaching(curve, 0.9 * s.capacity, lease), use, wants, use > 0 ? wants / use : 0.0,
      points);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    settings s;
    doorman_examples::arguments args(argc, argv);
    const bool go = args.parse(usage, [&](const std::string& flag) {
      if (flag == "--capacity") {
        s.capacity = args.number(1, 1e6);
      } else if (flag == "--seconds") {
        s.seconds = args.number(1, 3600);
      } else if (flag == "--algorithm") {
        s.algorithm = args.value();
      } else if (flag == "--refresh-interval") {
        s.refresh_interval = args.number(0.1, 3600);
      } else if (flag == "--safe-capacity") {
        s.safe_capacity = args.number(0, 1e6);
      } else {
        return false;
      }
      return true;
    });
    return go ? run(s) : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "doorman_bench_ramp: %s\n", e.what());
    return 2;
  }
}
