// The upstream of an intermediate node: aggregation, refresh, loss of its parent, hostile
// grants, bounds.

#include "core_support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (core_support.hpp)

TEST_CASE("an intermediate aggregates its clients into one bulk request", "[core][upstream]") {
  small_tree t;
  small_tree::ask(t.left, t.clock, "a", 30);
  small_tree::ask(t.left, t.clock, "b", 50);
  (void)t.left.get_capacity({"c", {{"res", 2, 5, std::nullopt}, {"other", 0, 7, std::nullopt}}},
                            t.clock.now());
  REQUIRE(t.left_up.due(t.left, t.clock.now()));
  const auto req = t.left_up.make_request(t.left, t.clock.now());
  CHECK(req.server_id == "left");
  REQUIRE(req.resources.size() == 2);
  CHECK(req.resources[0].resource_id == "other");
  CHECK(req.resources[1].resource_id == "res");
  const auto& res = req.resources[1];
  CHECK_FALSE(res.has);
  CHECK(res.outstanding == 0);  // no parent lease yet: nothing granted
  REQUIRE(res.wants.size() == 2);
  CHECK(res.wants[0].priority == 2);  // highest priority first
  CHECK(res.wants[0].num_clients == 1);
  CHECK(res.wants[0].wants == 5);
  CHECK(res.wants[1].priority == 0);
  CHECK(res.wants[1].num_clients == 2);
  CHECK(res.wants[1].wants == 80);
  CHECK_FALSE(t.left_up.due(t.left, t.clock.now()));  // one request in flight at a time
}

TEST_CASE("a resource whose clients all left is still reported, with no demand",
          "[core][upstream]") {
  small_tree t;
  small_tree::ask(t.left, t.clock, "a", 30);
  t.refresh(t.left, t.left_up);
  CHECK(t.left.capacity("res", t.clock.now()) == 30);
  (void)t.left.release_capacity({"a", {"res"}}, t.clock.now());
  t.clock.set(t.left_up.next_request(t.left));
  const auto req = t.left_up.make_request(t.left, t.clock.now());
  REQUIRE(req.resources.size() == 1);
  REQUIRE(req.resources[0].wants.size() == 1);
  CHECK(req.resources[0].wants[0].wants == 0);
  auto resp = t.root.get_server_capacity(req, t.clock.now());
  REQUIRE(resp);  // a valid request
  t.left_up.on_reply(t.left, resp.value(), t.clock.now());
  CHECK(t.left.capacity("res", t.clock.now()) == 0);  // the capacity went back to the root
}

TEST_CASE("a two-level tree converges to the fair share and keeps the decay rule",
          "[core][upstream]") {
  small_tree t;
  // Left: 3 clients wanting 30 each; right: 1 client wanting 60. Capacity 100, 4 end clients:
  // fair share 25 each, so left gets 75 and right 25.
  for (int step = 0; step < 40; ++step) {
    for (const char* c : {"a", "b", "c"})
      small_tree::ask(t.left, t.clock, c, 30);
    small_tree::ask(t.right, t.clock, "d", 60);
    t.refresh(t.left, t.left_up);
    t.refresh(t.right, t.right_up);
    const auto* s = t.root.store("res");
    if (s) CHECK(s->sum_has() <= 100 + 1e-9);
    t.clock.advance(1s);
  }
  CHECK(t.left.capacity("res", t.clock.now()) == Approx(75));
  CHECK(t.right.capacity("res", t.clock.now()) == Approx(25));
  t.clock.advance(6s);  // past the minimum refresh interval
  CHECK(small_tree::ask(t.left, t.clock, "a", 30) == Approx(25));
  CHECK(small_tree::ask(t.right, t.clock, "d", 60) == Approx(25));

  // The intermediate adopted the root's algorithm and lease parameters.
  const auto tmpl = t.left.template_of("res");
  CHECK(tmpl.algorithm.kind == "FAIR_SHARE");
  CHECK(tmpl.algorithm.refresh_interval.count() == 16);
  // A grant to a server child: refresh × decay; the child asks again after decay × its own
  // clients' refresh interval: 16 × 0.5 = 8 s.
  auto resp =
      t.root.get_server_capacity(t.left_up.make_request(t.left, t.clock.now()), t.clock.now());
  REQUIRE(resp);
  CHECK(resp.value().resources[0].gets.refresh_interval == 8);
  t.left_up.on_reply(t.left, resp.value(), t.clock.now());
  CHECK(t.left_up.next_request(t.left) - t.clock.now() == 8s);
}

TEST_CASE("an intermediate losing its parent backs off and its capacity ends with its lease",
          "[core][upstream]") {
  small_tree t;
  small_tree::ask(t.left, t.clock, "a", 30);
  CHECK(t.refresh(t.left, t.left_up) == doorman::refresh_event::reached);
  CHECK(t.left.capacity("res", t.clock.now()) == 30);
  const auto expiry = t.left.parent_lease("res")->expiry;

  // The parent goes away: failures back off exponentially with jitter, within [½, 1] × step.
  std::vector<double> delays;
  for (int i = 0; i < 8; ++i) {
    t.clock.set(t.left_up.next_request(t.left));
    const auto event = t.refresh(t.left, t.left_up, false);
    CHECK(event == (i == 0 ? doorman::refresh_event::lost : doorman::refresh_event::none));
    delays.push_back(doorman::to_seconds(t.left_up.next_request(t.left) - t.clock.now()));
  }
  for (std::size_t i = 0; i < delays.size(); ++i) {
    const double step = std::min(15.0, 0.5 * std::pow(2.0, static_cast<double>(i)));
    CHECK(delays[i] >= std::max(0.5, step / 2));
    CHECK(delays[i] <= step);
  }
  while (t.clock.now() <= expiry) {
    t.clock.set(t.left_up.next_request(t.left));
    t.refresh(t.left, t.left_up, false);
  }
  // The lease ran out meanwhile: capacity 0, and the children's grants stop at that expiry.
  CHECK(t.clock.now() > expiry);
  CHECK(t.left.capacity("res", t.clock.now()) == 0);
  CHECK(small_tree::ask(t.left, t.clock, "b", 10) == 0);

  // The parent returns; the client keeps asking (its empty lease tells it to come back soon).
  t.clock.set(t.left_up.next_request(t.left));
  CHECK(small_tree::ask(t.left, t.clock, "b", 10) == 0);
  CHECK(t.refresh(t.left, t.left_up) == doorman::refresh_event::regained);
  CHECK(t.left.capacity("res", t.clock.now()) > 0);
}

TEST_CASE("a new resource is asked for at once, a hostile grant is ignored", "[core][upstream]") {
  small_tree t;
  small_tree::ask(t.left, t.clock, "a", 30);
  t.refresh(t.left, t.left_up);
  t.clock.advance(1s);
  CHECK_FALSE(t.left_up.due(t.left, t.clock.now()));  // next refresh is 8 s away
  (void)t.left.get_capacity({"a", {{"new", 0, 5, std::nullopt}}}, t.clock.now());
  CHECK(t.left_up.due(t.left, t.clock.now()));  // a resource appeared: ask now

  doorman::server_capacity_response bad;
  bad.mastership = {true, "root"};
  bad.resources.push_back({"new", {-5, 10, 1}, 0, {}});
  (void)t.left_up.make_request(t.left, t.clock.now());
  t.left_up.on_reply(t.left, bad, t.clock.now());
  CHECK(t.left.capacity("new", t.clock.now()) == 0);
  CHECK_FALSE(t.left.parent_lease("new"));
}

namespace {

// An intermediate under a root, wired directly, on one manual clock.
struct hostile_tree {
  manual_clock clock;
  engine_t root{repo_for("FAIR_SHARE", 100)};
  engine_t leaf;
  std::vector<std::string> logged;
  doorman::basic_upstream<engine_t> up;

  static doorman::engine_options intermediate() {
    doorman::engine_options o;
    o.is_root = false;
    o.minimum_refresh_interval = doorman::seconds(0);
    return o;
  }

  hostile_tree()
      : leaf(repo_for("FAIR_SHARE", 0), intermediate()),
        up({.server_id = "leaf", .log = [this](std::string_view s) { logged.emplace_back(s); }}) {
    root.set_mastership(true, "root", clock.now());
    leaf.set_mastership(true, "leaf", clock.now());
  }
};

}  // namespace

TEST_CASE("an intermediate whose clients' demand cancels out still sends a valid request",
          "[core][bounds][upstream]") {
  hostile_tree t;
  std::mt19937 rng(1);  // a seed whose sequence left -7e-15 in the band total
  std::vector<std::string> clients;
  for (int i = 0; i < 7; ++i) {
    clients.push_back("c" + std::to_string(i));
    REQUIRE(t.leaf.get_capacity(
        {clients.back(), {{"res", 0, 0.1 + static_cast<double>(rng() % 41), std::nullopt}}},
        t.clock.now()));
  }
  std::shuffle(clients.begin(), clients.end(), rng);
  for (std::size_t i = 2; i < clients.size(); ++i)
    REQUIRE(t.leaf.release_capacity({clients[i], {"res"}}, t.clock.now()));
  REQUIRE(t.leaf.get_capacity({clients[0], {{"res", 0, 0, std::nullopt}}}, t.clock.now()));
  REQUIRE(t.leaf.get_capacity({clients[1], {{"res", 0, 0, std::nullopt}}}, t.clock.now()));
  const auto req = t.up.make_request(t.leaf, t.clock.now());
  REQUIRE(req.resources.size() == 1);
  for (const auto& band : req.resources[0].wants)
    CHECK(band.wants >= 0);
  CHECK(req.resources[0].outstanding >= 0);
  CHECK(t.root.get_server_capacity(req, t.clock.now()));  // the parent accepts it
}

TEST_CASE("an intermediate's request stays within bounds whatever its clients sum to",
          "[core][bounds][upstream]") {
  hostile_tree t;
  // 1200 priorities, each wanting the most a client may: more bands than a request may hold,
  // and band sums beyond a band's bound.
  for (int i = 0; i < 1200; ++i) {
    REQUIRE(t.leaf.get_capacity({"c" + std::to_string(i), {{"res", i % 1200, 1e15, std::nullopt}}},
                                t.clock.now()));
    REQUIRE(t.leaf.get_capacity({"d" + std::to_string(i), {{"res", i % 1200, 1e15, std::nullopt}}},
                                t.clock.now()));
  }
  const auto req = t.up.make_request(t.leaf, t.clock.now());
  REQUIRE(req.resources.size() == 1);
  const auto& bands = req.resources[0].wants;
  CHECK(bands.size() == doorman::request_limits::max_bands);
  CHECK(bands.front().priority == 1199);  // highest priority first
  CHECK(bands.back().priority == 200);    // the lowest kept takes 200 ... 0
  CHECK(bands.back().num_clients == 2 * 201);
  for (const auto& b : bands)
    CHECK(b.wants == 1e15);
  CHECK(t.root.get_server_capacity(req, t.clock.now()));
}

TEST_CASE("an intermediate adopts only the grants it asked for, within bounds",
          "[core][bounds][upstream]") {
  hostile_tree t;
  REQUIRE(t.leaf.get_capacity({"a", {{"res", 0, 30, std::nullopt}}}, t.clock.now()));
  const auto req = t.up.make_request(t.leaf, t.clock.now());
  REQUIRE(req.resources.size() == 1);

  doorman::server_capacity_response bad;
  bad.mastership = {true, "root"};
  const doorman::lease_info good{30, 60, 8};
  bad.resources.push_back({"", good, 0, {}});
  bad.resources.push_back({std::string(300, 'x'), good, 0, {}});
  for (int i = 0; i < 10'000; ++i)
    bad.resources.push_back({"bogus-" + std::to_string(i), good, 0, {}});
  bad.resources.push_back({"res", {1e300, 60, 8}, 0, {}});
  bad.resources.push_back({"res", {30, 1e12, 8}, 0, {}});
  bad.resources.push_back({"res", {30, 60, std::nan("")}, 0, {}});
  bad.resources.push_back({"res", {30, 60, 8}, -7, {}});
  (void)t.up.on_reply(t.leaf, bad, t.clock.now());
  CHECK(t.up.invalid_grants() == bad.resources.size());
  REQUIRE(t.logged.size() == 1);
  CHECK_THAT(t.logged[0], Contains("10006 of 10006 grants ignored") &&
                              Contains("(first: resources[0].resource_id: not asked for)"));
  CHECK_FALSE(t.leaf.parent_lease("res"));
  CHECK(t.leaf.store("") == nullptr);
  CHECK(t.leaf.store("bogus-1") == nullptr);
  CHECK_FALSE(t.leaf.parent_lease("bogus-1"));

  // The next request is as before: only the real resource, and the parent takes it.
  t.clock.set(t.up.next_request(t.leaf));
  REQUIRE(t.leaf.get_capacity({"a", {{"res", 0, 30, std::nullopt}}}, t.clock.now()));
  const auto next = t.up.make_request(t.leaf, t.clock.now());
  REQUIRE(next.resources.size() == 1);
  CHECK(next.resources[0].resource_id == "res");
  auto answer = t.root.get_server_capacity(next, t.clock.now());
  REQUIRE(answer);
  // A good grant with a second one for the same resource: the first counts.
  auto twice = answer.value();
  twice.resources.push_back(twice.resources[0]);
  twice.resources.back().gets.capacity = 99;
  (void)t.up.on_reply(t.leaf, twice, t.clock.now());
  REQUIRE(t.leaf.parent_lease("res"));
  CHECK(t.leaf.parent_lease("res")->capacity == 30);
  CHECK_THAT(t.logged.back(), Contains("1 of 2 grants ignored") && Contains("granted twice"));
}
