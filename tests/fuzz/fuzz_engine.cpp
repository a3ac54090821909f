// libFuzzer target: a structure-aware driver of a root engine. Each input is a program of
// well-formed calls — get_capacity, get_server_capacity, release_capacity, status, count_hits,
// expire —
// with ids from small pools (so that calls meet the same clients and resources), quantities
// from the edges of their bounds as well as ordinary ones, clock steps, mastership changes and
// configuration reloads. After every step the engine invariants hold (fuzz_support.hpp).

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.hpp"

using namespace doorman_fuzz;

namespace {

constexpr const char* resources[] = {"f1", "f2", "p1", "s1", "n1"};
constexpr const char* clients[] = {"c0", "c1", "c2", "c3", "c4", "c5"};
constexpr const char* servers[] = {"leaf-a", "leaf-b"};

double quantity(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return 0;
    case 1:
      return doorman::request_limits::max_quantity;
    case 2:
      return 1e-300;
    case 3:
      return 0.1 + in.ConsumeIntegralInRange(0, 40);  // the residue's ordinary wants
    case 4:
      return in.ConsumeFloatingPointInRange(0.0, doorman::request_limits::max_quantity);
    default:
      return in.ConsumeFloatingPointInRange(0.0, 200.0);
  }
}

std::optional<doorman::lease_info> has(FuzzedDataProvider& in) {
  if (!in.ConsumeBool()) return std::nullopt;
  doorman::lease_info l;
  l.capacity = quantity(in);
  l.expires_in = in.ConsumeFloatingPointInRange(-doorman::request_limits::max_seconds,
                                                doorman::request_limits::max_seconds);
  l.refresh_interval = in.ConsumeFloatingPointInRange(0.0, doorman::request_limits::max_seconds);
  return l;
}

template <std::size_t N>
std::string pick(FuzzedDataProvider& in, const char* const (&pool)[N]) {
  return pool[in.ConsumeIntegralInRange<std::size_t>(0, N - 1)];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  clock_type clock;
  static const auto repo = engine_type::parse_config(config_text());  // parsed once
  engine_type engine(repo);
  engine.set_mastership(true, "self:7700", clock.now());
  // Leases granted under an earlier configuration may exceed a later, smaller capacity: the
  // capacity invariant applies once they have all expired (lease_length 10 s).
  auto checked_from = clock.now();
  for (int step = 0; step < 64 && in.remaining_bytes() > 0; ++step) {
    const auto now = clock.now();
    switch (in.ConsumeIntegralInRange(0, 10)) {
      case 0:
      case 1:
      case 2: {
        doorman::capacity_request req{pick(in, clients), {}};
        const int n = in.ConsumeIntegralInRange(1, 3);
        for (int i = 0; i < n; ++i) {
          const auto id = pick(in, resources);
          bool seen = false;
          for (const auto& r : req.resources)
            seen |= r.resource_id == id;
          if (seen) continue;
          req.resources.push_back(
              {id, in.ConsumeIntegralInRange<std::int64_t>(-1, 2), quantity(in), has(in)});
        }
        const auto r = engine.get_capacity(req, now);
        DOORMAN_FUZZ_CHECK(r.has_value(), r ? "" : r.error().message);
        for (const auto& g : r.value().resources) {
          DOORMAN_FUZZ_CHECK(!doorman::check_grant(g.gets, g.safe_capacity),
                             *doorman::check_grant(g.gets, g.safe_capacity));
        }
        break;
      }
      case 3:
      case 4: {
        doorman::server_resource_request res{pick(in, resources), has(in), quantity(in), {}};
        const int bands = in.ConsumeIntegralInRange(1, 4);
        for (int b = 0; b < bands; ++b) {
          res.wants.push_back(
              {b - 1,
               in.ConsumeIntegralInRange<std::int64_t>(1, doorman::request_limits::max_num_clients),
               quantity(in)});
        }
        const auto r = engine.get_server_capacity({pick(in, servers), {res}}, now);
        DOORMAN_FUZZ_CHECK(r.has_value(), r ? "" : r.error().message);
        for (const auto& g : r.value().resources) {
          DOORMAN_FUZZ_CHECK(!doorman::check_grant(g.gets, g.safe_capacity),
                             *doorman::check_grant(g.gets, g.safe_capacity));
        }
        break;
      }
      case 5:
        DOORMAN_FUZZ_CHECK(engine.release_capacity({pick(in, clients), {pick(in, resources)}}, now),
                           "release");
        break;
      case 6: {
        const auto s = engine.status(in.ConsumeBool() ? doorman::status_request{pick(in, resources)}
                                                      : doorman::status_request{},
                                     now);
        DOORMAN_FUZZ_CHECK(s.has_value(), "status");
        break;
      }
      case 7:
        clock.advance(std::chrono::milliseconds(in.ConsumeIntegralInRange(0, 15'000)));
        engine.expire(clock.now());
        break;
      case 8: {
        const bool master = in.ConsumeBool();
        const auto quiet = std::chrono::milliseconds(in.ConsumeIntegralInRange(0, 20'000));
        engine.set_mastership(!master, "other:7700", now);
        engine.set_mastership(master, master ? "self:7700" : "other:7700", now, quiet);
        break;
      }
      case 9:
        engine.set_config(
            engine_type::parse_config(config_text(in.ConsumeFloatingPointInRange(0.0, 1000.0),
                                                  in.ConsumeFloatingPointInRange(0.0, 1000.0))));
        checked_from = now + std::chrono::seconds(10);
        break;
      case 10: {
        // A count never admits past the limit of its window, and a refusal consumes nothing.
        static constexpr double windows[] = {0.001, 1, 60, 3600, 366 * 86'400.0};
        const doorman::hit_count x{pick(in, resources), in.ConsumeFloatingPointInRange(0.0, 1e9),
                                   windows[in.ConsumeIntegralInRange(0, 4)]};
        const auto r = engine.count_hits({pick(in, clients), {x}}, now);
        DOORMAN_FUZZ_CHECK(r.has_value(), r ? "" : r.error().message);
        for (const auto& v : r.value().resources) {
          DOORMAN_FUZZ_CHECK(v.remaining >= 0 && v.remaining <= v.limit, "remaining");
          DOORMAN_FUZZ_CHECK(!v.admitted || x.hits <= v.limit, "admitted past the limit");
          DOORMAN_FUZZ_CHECK(v.reset > 0 && v.reset <= x.window, "reset");
        }
        break;
      }
    }
    check_engine(engine, clock.now(), checked_from);
  }
  return 0;
}
