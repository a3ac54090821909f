#pragma once

// Test support for the sans-I/O core: a one-template repository, an engine on a manual clock,
// and a small tree of engines wired directly (no network).

#include <catch2/catch.hpp>

#include <doorman/core.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace doorman_test {

using namespace std::chrono_literals;
using Catch::Matchers::Contains;

using engine_t = doorman::basic_engine<doorman::manual_clock>;
using upstream_t = doorman::basic_upstream<engine_t>;
using doorman::manual_clock;

// A one-template repository (plus the final "*") for tests.
inline doorman::resource_repository repo_for(const std::string& kind, double capacity,
                                             double learning = 0, const std::string& extra = "",
                                             double refresh = 16) {
  return doorman::resource_repository::parse(R"({"resources": [
    {"identifier_glob": "res*", "capacity": )" +
                                             std::to_string(capacity) + extra + R"(,
     "algorithm": {"kind": ")" + kind + R"(", "lease_length": 60, "refresh_interval": )" +
                                             std::to_string(refresh) + R"(,
                   "learning_mode_duration": )" +
                                             std::to_string(learning) + R"(}},
    {"identifier_glob": "*", "capacity": 0,
     "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60, "refresh_interval": 16}}]})");
}

struct fixture {
  manual_clock clock;
  engine_t engine;

  explicit fixture(doorman::resource_repository repo, doorman::engine_options opts = {})
      : engine(std::move(repo), std::move(opts)) {
    engine.set_mastership(true, "self:7700", clock.now());
  }

  double ask(const std::string& client, double wants, const std::string& resource = "res",
             std::int64_t priority = 0) {
    auto r =
        engine.get_capacity({client, {{resource, priority, wants, std::nullopt}}}, clock.now());
    REQUIRE(r);
    REQUIRE(r.value().resources.size() == 1);
    return r.value().resources[0].gets.capacity;
  }

  double ask_server(const std::string& server, std::vector<doorman::priority_band> bands,
                    const std::string& resource = "res") {
    auto r = engine.get_server_capacity({server, {{resource, std::nullopt, 0, std::move(bands)}}},
                                        clock.now());
    REQUIRE(r);
    REQUIRE(r.value().resources.size() == 1);
    return r.value().resources[0].gets.capacity;
  }
};

// A root and two intermediates wired directly (no network), on one manual clock.
struct small_tree {
  manual_clock clock;
  engine_t root;
  engine_t left;
  engine_t right;
  upstream_t left_up{{.server_id = "left"}};
  upstream_t right_up{{.server_id = "right"}};

  static doorman::engine_options intermediate() {
    doorman::engine_options o;
    o.is_root = false;
    return o;
  }
  // Intermediates have only a placeholder "*" template: they learn the rest from the root.
  static doorman::resource_repository placeholder() {
    return doorman::resource_repository::parse(R"({"resources": [{"identifier_glob": "*",
      "capacity": 0, "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60,
      "refresh_interval": 16, "learning_mode_duration": 0}}]})");
  }

  small_tree()
      : root(repo_for("FAIR_SHARE", 100)),
        left(placeholder(), intermediate()),
        right(placeholder(), intermediate()) {
    root.set_mastership(true, "root", clock.now());
    left.set_mastership(true, "left", clock.now());
    right.set_mastership(true, "right", clock.now());
  }

  // Runs one upstream exchange if it is due. Returns the event.
  doorman::refresh_event refresh(engine_t& e, upstream_t& up, bool parent_up = true) {
    if (!up.due(e, clock.now())) return doorman::refresh_event::none;
    auto req = up.make_request(e, clock.now());
    if (!parent_up) return up.on_reply(doorman::errc::timed_out, clock.now());
    auto resp = root.get_server_capacity(req, clock.now());
    REQUIRE(resp);
    return up.on_reply(e, resp.value(), clock.now());
  }

  static double ask(engine_t& e, manual_clock& c, const std::string& client, double wants) {
    auto r = e.get_capacity({client, {{"res", 0, wants, std::nullopt}}}, c.now());
    REQUIRE(r);
    return r.value().resources[0].gets.capacity;
  }
};

}  // namespace doorman_test
