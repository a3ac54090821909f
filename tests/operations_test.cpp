// Operating a node: the admin endpoint (its HTTP request parser, the pages it renders, a node
// serving them to real tools: promtool, a Prometheus server, headless Chromium) and Doorman's
// YAML configurations.

#include <catch2/catch.hpp>

#include <doorman/node.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_answers.hpp"
#include "line_client.hpp"
#include "support.hpp"

using namespace doorman_test;
namespace fs = std::filesystem;

namespace {

// The exit status of a shell command, and its output (stderr too unless `quiet`).
std::pair<int, std::string> run_command(const std::string& command, bool quiet = false) {
  std::string out;
  FILE* p = ::popen((command + (quiet ? " 2>/dev/null" : " 2>&1")).c_str(), "r");
  REQUIRE(p);
  char buf[4096];
  while (const auto n = std::fread(buf, 1, sizeof buf, p))
    out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

bool have(const std::string& program) {
  return run_command("command -v " + program).first == 0;
}

// The full path of a program on PATH.
std::string path_of(const std::string& program) {
  auto out = run_command("command -v " + program).second;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' '))
    out.pop_back();
  return out;
}

fs::path scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / fmt::format("doorman-test-{}-{}", name, ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

doorman::node_options with_admin() {
  doorman::node_options o;
  o.admin = "127.0.0.1:0";
  return o;
}

}  // namespace

// ---- the request parser -------------------------------------------------------------------

TEST_CASE("http request parser: a well-formed GET, decoded", "[admin]") {
  const auto r = doorman::net::parse_http_request(
      "GET /status/resources/a%20b%2Fc?page=2&x=%41+b HTTP/1.1\r\nHost: h\r\nAccept: */*\r\n\r\n");
  REQUIRE(r.status == 0);
  CHECK(r.method == "GET");
  CHECK(r.path == "/status/resources/a b/c");
  CHECK(r.query("page") == "2");
  CHECK(r.query("x") == "A b");
  CHECK(!r.query("y"));
  // Header names in lower case, values without the blanks around them.
  CHECK(r.header("host") == "h");
  CHECK(r.header("accept") == "*/*");
  CHECK(!r.header("Host"));
  const auto k = doorman::net::parse_http_request(
      "GET / HTTP/1.1\r\nX-Api-Key: \t key 1 \r\nX-Empty:\r\n\r\n");
  CHECK(k.header("x-api-key") == "key 1");
  CHECK(k.header("x-empty") == "");
  // A bare LF ends lines too.
  CHECK(doorman::net::parse_http_request("HEAD / HTTP/1.0\n\n").status == 0);
}

TEST_CASE("http request parser: each malformed head gets its status and reason", "[admin]") {
  using doorman::net::parse_http_request;
  struct bad {
    std::string head;
    int status;
    std::string reason;
  };
  const bad cases[] = {
      {"", 400, "no request line"},
      {"GET /\r\n\r\n", 400, "malformed request line"},
      {"GET  / HTTP/1.1\r\n\r\n", 400, "malformed request line"},
      {"G(T / HTTP/1.1\r\n\r\n", 400, "malformed method"},
      {"GET / HTTP/2.0\r\n\r\n", 505, "unsupported HTTP version"},
      {"GET / SPDY\r\n\r\n", 400, "unsupported HTTP version"},
      {"GET http://x/ HTTP/1.1\r\n\r\n", 400, "must start with /"},
      {"GET /" + std::string(3000, 'a') + " HTTP/1.1\r\n\r\n", 414, "too long"},
      {"GET /%zz HTTP/1.1\r\n\r\n", 400, "percent escape in the path"},
      {"GET /%4 HTTP/1.1\r\n\r\n", 400, "percent escape in the path"},
      {"GET /?a=%G1 HTTP/1.1\r\n\r\n", 400, "percent escape in the query"},
      {"GET / HTTP/1.1\r\nno colon\r\n\r\n", 400, "malformed header line"},
      {"GET / HTTP/1.1\r\n: v\r\n\r\n", 400, "malformed header line"},
      {"GET / HTTP/1.1\r\nBad Name: v\r\n\r\n", 400, "malformed header name"},
      {"GET / HTTP/1.1\r\nHost: h\r\n", 400, "not terminated"},
  };
  for (const auto& c : cases) {
    INFO(c.head.substr(0, 60));
    const auto r = parse_http_request(c.head);
    CHECK(r.status == c.status);
    CHECK_THAT(r.reason, Catch::Contains(c.reason));
  }
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 65; ++i)
    many += fmt::format("h{}: v\r\n", i);
  CHECK(parse_http_request(many + "\r\n").status == 431);
}

// ---- rendering ----------------------------------------------------------------------------

TEST_CASE("metrics: a learned capacity's last step, a second", "[admin][learn]") {
  doorman::admin_snapshot s;
  s.started = true;
  doorman::admin_resource r;
  r.status.resource_id = "provider";
  r.status.capacity = 582;
  r.status.learned = doorman::learned_info{100, 2000, 3000, 250, 5, "cut"};
  s.resources.push_back(r);
  r.status.resource_id = "fixed";
  r.status.learned.reset();
  s.resources.push_back(r);
  const auto text = doorman::render_metrics(s, doorman::node_metrics{});
  CHECK_THAT(text, Catch::Contains(R"(doorman_resource_learned_calls{resource="provider"} 600)"));
  CHECK_THAT(text,
             Catch::Contains(R"(doorman_resource_learned_overloads{resource="provider"} 50)"));
  CHECK_THAT(text, !Catch::Contains(R"(doorman_resource_learned_calls{resource="fixed"})"));
}

TEST_CASE("metrics: a budget's limit, spend, what is left and its window", "[admin][budget]") {
  doorman::admin_snapshot s;
  s.started = true;
  doorman::admin_resource r;
  r.status.resource_id = "tokens";
  r.status.budget = doorman::budget_info{1764374400, 600, 1000, 850, 100};
  s.resources.push_back(r);
  r.status.resource_id = "rate";
  r.status.budget.reset();
  s.resources.push_back(r);
  const auto text = doorman::render_metrics(s, doorman::node_metrics{});
  CHECK_THAT(text, Catch::Contains("# TYPE doorman_budget_spent gauge"));
  CHECK_THAT(text, Catch::Contains(R"(doorman_budget_limit{resource="tokens"} 1000)"));
  CHECK_THAT(text, Catch::Contains(R"(doorman_budget_spent{resource="tokens"} 850)"));
  CHECK_THAT(text, Catch::Contains(R"(doorman_budget_left{resource="tokens"} 100)"));
  CHECK_THAT(text,
             Catch::Contains(
                 R"(doorman_budget_window_start_timestamp_seconds{resource="tokens"} 1764374400)"));
  CHECK_THAT(text,
             Catch::Contains(R"(doorman_budget_window_remaining_seconds{resource="tokens"} 600)"));
  CHECK_THAT(text, !Catch::Contains(R"(doorman_budget_limit{resource="rate"})"));
}

TEST_CASE("metrics: label values are escaped, histograms are cumulative", "[admin]") {
  doorman::admin_snapshot s;
  s.identity.id = "a\"b\\c\nd";
  s.started = true;
  doorman::admin_resource r;
  r.status.resource_id = "quote\"d";
  r.status.capacity = 12.5;
  s.resources.push_back(r);
  doorman::node_metrics m;
  doorman::dispatch_record ok{doorman::rpc_method::get_capacity, std::nullopt};
  m.observe(ok, 30e-6);
  m.observe(ok, 2e-3);
  m.observe(ok, 3e-6);  // a hot-path decision takes a few microseconds
  m.observe({doorman::rpc_method::other, doorman::rpc_code::parse_error}, 1.0);
  const auto text = doorman::render_metrics(s, m);
  CHECK_THAT(text, Catch::Contains(R"(id="a\"b\\c\nd")"));
  CHECK_THAT(text, Catch::Contains(R"(doorman_resource_capacity{resource="quote\"d"} 12.5)"));
  CHECK_THAT(
      text, Catch::Contains(
                R"(doorman_requests_total{method="get_capacity",outcome="ok",door="json-rpc"} 3)"));
  CHECK_THAT(
      text,
      Catch::Contains(
          R"(doorman_requests_total{method="other",outcome="parse_error",door="json-rpc"} 1)"));
  CHECK_THAT(
      text,
      Catch::Contains(
          R"(doorman_request_duration_seconds_bucket{method="get_capacity",door="json-rpc",le="5e-05"} 2)"));
  CHECK_THAT(
      text,
      Catch::Contains(
          R"(doorman_request_duration_seconds_bucket{method="get_capacity",door="json-rpc",le="2.5e-06"} 0)"));
  CHECK_THAT(
      text,
      Catch::Contains(
          R"(doorman_request_duration_seconds_bucket{method="get_capacity",door="json-rpc",le="5e-06"} 1)"));
  CHECK_THAT(
      text,
      Catch::Contains(
          R"(doorman_request_duration_seconds_bucket{method="get_capacity",door="json-rpc",le="0.0025"} 3)"));
  CHECK_THAT(
      text,
      Catch::Contains(
          R"(doorman_request_duration_seconds_bucket{method="other",door="json-rpc",le="0.1"} 0)"));
  CHECK_THAT(
      text,
      Catch::Contains(
          R"(doorman_request_duration_seconds_bucket{method="other",door="json-rpc",le="+Inf"} 1)"));
  if (have("promtool")) {
    const auto dir = scratch("promtool-escape");
    std::ofstream(dir / "m.txt") << text;
    const auto [status, out] = run_command("promtool check metrics < " + (dir / "m.txt").string());
    INFO(out);
    CHECK(status == 0);
    fs::remove_all(dir);
  }
}

TEST_CASE("status pages escape what clients and the configuration wrote", "[admin]") {
  doorman::admin_snapshot s;
  s.identity.id = "<node>";
  s.started = true;
  s.mastership.is_master = true;
  doorman::admin_resource r;
  r.status.resource_id = "<script>alert(1)</script>";
  r.description = "a & b";
  s.resources.push_back(r);
  const auto page = doorman::render_status(s);
  CHECK_THAT(page, !Catch::Contains("<script>"));
  CHECK_THAT(page, Catch::Contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
  CHECK_THAT(page, Catch::Contains("/status/resources/%3Cscript%3Ealert%281%29%3C%2Fscript%3E"));
  CHECK_THAT(page, Catch::Contains("a &amp; b"));
  CHECK_THAT(page, Catch::Contains("&lt;node&gt;"));
}

namespace {

// A started node's snapshot with one resource, `id`, and nothing else.
doorman::admin_snapshot one_resource(const std::string& id) {
  doorman::admin_snapshot s;
  s.started = true;
  s.resources.emplace_back();
  s.resources.back().status.resource_id = id;
  return s;
}

}  // namespace

TEST_CASE("a resource's page charts its learned capacity against demand and overloads",
          "[admin][learn]") {
  auto s = one_resource("provider");
  CHECK_THAT(doorman::render_resource(s, 1), !Catch::Contains("Learned capacity"));
  using step = doorman::learn_step;
  for (int i = 0; i < 20; ++i) {
    s.resources[0].learned_history.push_back({.at = -5.0 * (19 - i),
                                              .capacity = 1000 + 10.0 * i,
                                              .wants = 2000,
                                              .calls = 990 + 10.0 * i,
                                              .overloads = i == 19 ? 42.0 : 0.0,
                                              .step = i == 19 ? step::cut : step::rise});
  }
  const auto page = doorman::render_resource(s, 1);
  CHECK_THAT(page, Catch::Contains("<h2 id=\"learned\">Learned capacity (20 steps)</h2>"));
  CHECK_THAT(page, Catch::Contains("<svg"));
  // Four lines: the learned capacity, the demand, the calls and the overloaded calls, each
  // with its 20 points, from 95 s before now (the left edge) to now.
  std::size_t lines = 0;
  for (auto at = page.find("<polyline"); at != std::string::npos;
       at = page.find("<polyline", at + 1)) {
    ++lines;
  }
  CHECK(lines == 4);
  CHECK_THAT(page, Catch::Contains(">learned capacity</text>"));
  CHECK_THAT(page, Catch::Contains(">overloaded/s</text>"));
  CHECK_THAT(page, Catch::Contains(">-95 s</text>"));
  CHECK_THAT(page, Catch::Contains(">0 s</text>"));
  // The last 12 steps as a table, newest first.
  CHECK_THAT(page, Catch::Contains("<tr><td class=\"n\">0</td><td>cut</td><td class=\"n\">1190</td>"
                                   "<td class=\"n\">2000</td><td class=\"n\">1180</td>"
                                   "<td class=\"n\">42</td></tr>"));
  std::size_t rows = 0;
  const auto table = page.substr(page.find("<table id=\"steps\">"));
  for (auto at = table.find("<tr><td"); at != std::string::npos && at < table.find("</table>");
       at = table.find("<tr><td", at + 1)) {
    ++rows;
  }
  CHECK(rows == 12);
}

TEST_CASE("the status page shows each budget: its window, limit, spend and what is left",
          "[admin]") {
  auto s = one_resource("tokens");
  CHECK_THAT(doorman::render_status(s), !Catch::Contains("Budgets"));
  s.resources[0].status.budget = doorman::budget_info{1764374400, 600, 1000, 250, 700};
  const auto page = doorman::render_status(s);
  CHECK_THAT(page, Catch::Contains("<h2>Budgets</h2>"));
  // The window as a date and its end as a span, never raw seconds.
  CHECK_THAT(page, Catch::Contains("<tr><td>tokens</td><td>2025-11-29 00:00 UTC</td><td "
                                   "class=\"n\">1000</td><td class=\"n\">250</td><td "
                                   "class=\"n\">700</td><td class=\"n\">10 min</td><td "
                                   "class=\"n\">-</td></tr>"));
  CHECK_THAT(page, !Catch::Contains("1764374400"));
  // At a root keeping budget marks: the window's durable mark, once read.
  s.resources[0].status.budget->mark = 960;
  CHECK_THAT(doorman::render_status(s),
             Catch::Contains("<td class=\"n\">10 min</td><td class=\"n\">960</td></tr>"));
}

TEST_CASE("the status page says uptime as people read it", "[admin]") {
  CHECK(doorman::duration_text(18.2584) == "18 s");
  CHECK(doorman::duration_text(3.64) == "3.6 s");
  CHECK(doorman::duration_text(3600) == "1 h");
  CHECK(doorman::duration_text(3599.7) == "1 h");
  CHECK(doorman::duration_text(-1) == "-");
  CHECK(doorman::duration_text(185) == "3 min 5 s");
  CHECK(doorman::duration_text(2 * 3600 + 14 * 60 + 9) == "2 h 14 min");
  CHECK(doorman::duration_text(3 * 86400 + 4 * 3600 + 59) == "3 d 4 h");
  doorman::admin_snapshot s;
  s.started = true;
  s.uptime = 18.2584;
  CHECK_THAT(doorman::render_status(s), Catch::Contains(">18 s<"));
}

// ---- a node serving them ------------------------------------------------------------------

namespace {

// A node as the admin routes see it: a snapshot of one resource with 3 leases.
struct fake_admin_node {
  bool started = true;
  int snapshots = 0;
  doorman::node_metrics counters;
  doorman::admin_snapshot snapshot(std::optional<std::string> id, std::size_t) {
    ++snapshots;
    doorman::admin_snapshot s;
    s.started = started;
    if (id && *id != "api") return s;
    s.resources.push_back({});
    s.resources.back().status.resource_id = "api";
    s.lease_count = 3;
    return s;
  }
  doorman::admin_snapshot readiness_snapshot() const {
    doorman::admin_snapshot s;
    s.started = started;
    s.mastership.is_master = true;
    return s;
  }
  const doorman::node_metrics& metrics() const { return counters; }
};

}  // namespace

TEST_CASE("admin routes: health and readiness to anyone, the rest as access allows", "[admin]") {
  fake_admin_node node;
  std::vector<std::string> asked;
  const auto get = [&](const std::string& target, bool allowed = true) {
    const auto r = doorman::net::parse_http_request("GET " + target + " HTTP/1.1\r\n\r\n");
    REQUIRE(r.status == 0);
    return doorman::route_admin(r, node, [&](const std::string& path) {
      asked.push_back(path);
      return allowed ? std::nullopt : std::optional<std::string>("not an admin");
    });
  };
  CHECK(get("/healthz", false).status == 200);
  CHECK(get("/readyz", false).body == "ready: master\n");
  CHECK(asked.empty());        // neither asks access control
  CHECK(node.snapshots == 0);  // nor reads the node's whole state
  node.started = false;
  CHECK(get("/readyz").status == 503);
  const auto refused = get("/metrics", false);
  CHECK(refused.status == 403);
  CHECK_THAT(refused.body, Catch::Contains("forbidden: not an admin"));
  CHECK(node.snapshots == 0);                // refused before any work
  CHECK(get("/nope", false).status == 403);  // what exists is not told to a stranger
  CHECK(get("/nope").status == 404);
  CHECK_THAT(get("/metrics").body, Catch::Contains("doorman_requests_total"));
  CHECK(get("/").status == 200);
  CHECK(get("/status/resources/api").status == 200);
  CHECK(get("/status/resources/api?page=2").status == 404);  // 3 leases: one page
  CHECK(get("/status/resources/api?page=x").status == 400);
  CHECK(get("/status/resources/other").status == 400);
  CHECK(asked.back() == "/status/resources/other");
}

TEST_CASE("admin endpoint: health, readiness, metrics and status of a live root", "[admin][net]") {
  running_node<> root(fast_config(100), with_admin());
  const std::string admin = root.node().admin_address();
  REQUIRE(!admin.empty());
  line_client a(root.address());
  CHECK(gets(a.call("get_capacity", capacity_params("a", "db<1>", 30))) == 30);
  (void)a.call("nonsense", json::object());

  const auto health = http_get(admin, "/healthz");
  CHECK(health.status == 200);
  CHECK(health.body == "ok\n");
  const auto ready = http_get(admin, "/readyz");
  CHECK(ready.status == 200);
  CHECK(ready.body == "ready: master\n");

  const auto metrics = http_get(admin, "/metrics");
  REQUIRE(metrics.status == 200);
  CHECK_THAT(metrics.head, Catch::Contains("Content-Type: text/plain; version=0.0.4"));
  CHECK_THAT(
      metrics.body,
      Catch::Contains(
          R"(doorman_requests_total{method="get_capacity",outcome="ok",door="json-rpc"} 1)"));
  CHECK_THAT(
      metrics.body,
      Catch::Contains(
          R"(doorman_requests_total{method="other",outcome="method_not_found",door="json-rpc"} 1)"));
  CHECK_THAT(metrics.body, Catch::Contains(R"(doorman_resource_has{resource="db<1>"} 30)"));
  CHECK_THAT(metrics.body, Catch::Contains(R"(doorman_resource_clients{resource="db<1>"} 1)"));
  CHECK_THAT(metrics.body, Catch::Contains("doorman_connections_open 1"));
  CHECK_THAT(metrics.body, Catch::Contains("doorman_is_master 1"));
  if (have("promtool")) {
    const auto dir = scratch("promtool-node");
    std::ofstream(dir / "m.txt") << metrics.body;
    const auto [status, out] = run_command("promtool check metrics < " + (dir / "m.txt").string());
    INFO(out);
    CHECK(status == 0);
    fs::remove_all(dir);
  }

  const auto status = http_get(admin, "/status");
  REQUIRE(status.status == 200);
  CHECK_THAT(status.body, Catch::Contains("<td>root</td>"));
  CHECK_THAT(status.body, Catch::Contains("href=\"/status/resources/db%3C1%3E\">db&lt;1&gt;</a>"));
  const auto one = http_get(admin, "/status/resources/db%3C1%3E");
  REQUIRE(one.status == 200);
  CHECK_THAT(one.body, Catch::Contains("<td>a</td><td>client</td><td class=\"n\">30</td>"));
  CHECK_THAT(one.body, Catch::Contains("Leases (1; page 1 of 1)"));
}

TEST_CASE("admin endpoint: bad requests are refused and change nothing", "[admin][net]") {
  doorman::node_options o = with_admin();
  o.admin_server.max_connections = 2;
  o.admin_server.timeout = doorman::seconds(0.3);
  running_node<> root(fast_config(100), o);
  const std::string admin = root.node().admin_address();

  CHECK(http_get(admin, "/nothing").status == 404);
  CHECK(http_get(admin, "/status/resources/x?page=0").status == 400);
  CHECK(http_get(admin, "/status/resources/x?page=abc").status == 400);
  CHECK(http_get(admin, "/status/resources/x?page=2").status == 404);
  CHECK(http_get(admin, "/status/resources/" + std::string(300, 'x')).status == 400);
  const auto post = http_exchange(admin, "POST /status HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  CHECK(post.status == 405);
  CHECK_THAT(post.head, Catch::Contains("Allow: GET, HEAD"));
  const auto head = http_exchange(admin, "HEAD /healthz HTTP/1.1\r\n\r\n");
  CHECK(head.status == 200);
  CHECK(head.body.empty());
  CHECK_THAT(head.head, Catch::Contains("Content-Length: 3"));
  const auto huge = http_exchange(admin, "GET / HTTP/1.1\r\nX: " + std::string(20000, 'a'));
  CHECK(huge.status == 431);

  // Two slow peers hold both connections: a third request takes the place of the oldest (which
  // is closed) and is served; the other is closed at its deadline.
  line_client slow1(admin), slow2(admin);
  slow1.send("GET / HTTP/1.1\r\n");
  slow2.send("GET / HTTP/1.1\r\n");
  CHECK(http_get(admin, "/healthz").status == 200);
  CHECK(slow1.closed_by_peer());
  CHECK(slow2.closed_by_peer());
  CHECK(http_get(admin, "/healthz").status == 200);
  CHECK(gets(line_client(root.address()).call("get_capacity", capacity_params("a", "r", 5))) == 5);
}

TEST_CASE("admin endpoint: leases are paged", "[admin][net]") {
  running_node<> root(fast_config(1e6), with_admin());
  const std::string admin = root.node().admin_address();
  line_client a(root.address());
  for (int i = 0; i < 1200; ++i)
    a.send(request_line(i, "get_capacity", capacity_params(fmt::format("c{:04}", i), "big", 1)));
  for (int i = 0; i < 1200; ++i)
    REQUIRE(a.read_line());
  const auto p1 = http_get(admin, "/status/resources/big");
  REQUIRE(p1.status == 200);
  CHECK_THAT(p1.body, Catch::Contains("Leases (1200; page 1 of 3)"));
  CHECK_THAT(p1.body, Catch::Contains("<td>c0000</td>"));
  CHECK_THAT(p1.body, !Catch::Contains("<td>c0500</td>"));
  CHECK_THAT(p1.body, Catch::Contains("href=\"/status/resources/big?page=2\">next</a>"));
  const auto p3 = http_get(admin, "/status/resources/big?page=3");
  REQUIRE(p3.status == 200);
  CHECK_THAT(p3.body, Catch::Contains("<td>c1199</td>"));
  CHECK_THAT(p3.body, !Catch::Contains("<td>c0999</td>"));
  CHECK_THAT(p3.body, Catch::Contains("?page=2\">previous</a>"));
  CHECK_THAT(p3.body, !Catch::Contains(">next</a>"));
}

TEST_CASE("admin endpoint: floods of idle connections cannot keep health checks out",
          "[admin][net][fault]") {
  running_node<> root(fast_config(10), with_admin());
  const std::string admin = root.node().admin_address();
  // Far more idle connections than the endpoint takes (64 in all, 16 per peer), all from the
  // address the health checks come from, held open without a byte sent.
  std::vector<std::unique_ptr<line_client>> held;
  for (int i = 0; i < 100; ++i) {
    held.push_back(std::make_unique<line_client>(admin));
    REQUIRE(held.back()->connected());
  }
  for (int round = 0; round < 3; ++round) {
    CHECK(http_get(admin, "/healthz").status == 200);
    CHECK(http_get(admin, "/readyz").status == 200);
    CHECK(http_get(admin, "/metrics").status == 200);
  }
  // The held connections were closed to make room, or at their head deadline (2 s).
  CHECK(held.front()->closed_by_peer(4s));
  CHECK(held.back()->closed_by_peer(4s));
}

TEST_CASE("attacks on the JSON-RPC port leave throttled summaries in the log", "[net][fault]") {
  std::mutex mutex;
  std::vector<std::string> lines;
  doorman::node_options o;
  o.server.max_message_bytes = 512;
  o.log = [&](std::string_view line) {
    const std::lock_guard lock(mutex);
    lines.emplace_back(line);
  };
  running_node<> root(fast_config(10), o);
  for (int i = 0; i < 100; ++i) {
    line_client c(root.address());
    REQUIRE(c.send("not json\n"));
    CHECK(c.read_line());
  }
  for (int i = 0; i < 100; ++i) {
    line_client c(root.address());
    REQUIRE(c.send(std::string(1000, 'x')));
    CHECK(c.read_line());
  }
  root.stop();
  const auto count = [&](std::string_view what) {
    return std::count_if(lines.begin(), lines.end(),
                         [&](const std::string& l) { return l.find(what) != std::string::npos; });
  };
  // Each kind is logged, named, and summarized: one line per 10 s, not one per event.
  CHECK(count("warning: a malformed request from 127.0.0.1:") == 1);
  CHECK(count("a line longer than max_message_bytes (512)") == 1);
}

TEST_CASE("admin endpoint: an intermediate reports its parent", "[admin][net]") {
  running_node<> root(fast_config(100));
  doorman::node_options o = with_admin();
  o.parents = {root.address()};
  running_node<> mid("", o);
  line_client c(mid.address());
  CHECK(eventually(
      [&] { return gets(c.call("get_capacity", capacity_params("a", "db", 40))) == 40; }));
  const std::string admin = mid.node().admin_address();
  CHECK(eventually([&] {
    const auto m = http_get(admin, "/metrics").body;
    return m.find(R"(doorman_parent_lease_capacity{resource="db"} 40)") != std::string::npos &&
           m.find("doorman_parent_consecutive_failures 0") != std::string::npos &&
           m.find("doorman_parent_last_success_age_seconds") != std::string::npos;
  }));
  const auto status = http_get(admin, "/status").body;
  CHECK_THAT(status, Catch::Contains("<td>intermediate</td>"));
  CHECK_THAT(status, Catch::Contains("<tr><th>parent</th><td>" + root.address() + "</td></tr>"));
}

TEST_CASE("admin endpoint: readiness waits for a master", "[admin][net]") {
  fixed_election nobody{false, ""};
  running_node<fixed_election> follower(fast_config(10), with_admin(), nobody);
  const auto r = http_get(follower.node().admin_address(), "/readyz");
  CHECK(r.status == 503);
  CHECK(r.body == "not ready: no master known\n");
  fixed_election other{false, "10.0.0.9:7700"};
  running_node<fixed_election> knows(fast_config(10), with_admin(), other);
  const auto k = http_get(knows.node().admin_address(), "/readyz");
  CHECK(k.status == 200);
  CHECK(k.body == "ready: following master 10.0.0.9:7700\n");
}

TEST_CASE("admin endpoint: the admin port in use fails start, naming it", "[admin][net]") {
  running_node<> first(fast_config(10), with_admin());
  asio::io_context io;
  doorman::node_options o;
  o.listen = "127.0.0.1:0";
  o.admin = first.node().admin_address();
  doorman::node second(io.get_executor(), doorman::engine::parse_config(fast_config(10)), o);
  std::error_code ec;
  second.start(ec);
  CHECK(ec == asio::error::address_in_use);
  try {
    second.start();
    FAIL("start did not throw");
  } catch (const std::system_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("listening on " + o.admin));
  }
}

TEST_CASE("node log: learning mode named only when there is one, the admin address given",
          "[admin][net][log]") {
  struct lines {
    std::mutex m;
    std::vector<std::string> v;
    bool has(const std::string& s) {
      std::lock_guard lock(m);
      return std::any_of(v.begin(), v.end(),
                         [&](const auto& l) { return l.find(s) != std::string::npos; });
    }
  };
  auto off = std::make_shared<lines>();
  doorman::node_options o = with_admin();
  o.log = [off](std::string_view l) {
    std::lock_guard lock(off->m);
    off->v.emplace_back(l);
  };
  {
    running_node<> root(fast_config(10, 0), o);
    CHECK(eventually([&] { return off->has("became master; learning mode is off"); }));
    CHECK(off->has("admin endpoint on http://" + root.node().admin_address() + "/status"));
    CHECK_FALSE(off->has("learning mode starts"));
  }
  auto on = std::make_shared<lines>();
  o.log = [on](std::string_view l) {
    std::lock_guard lock(on->m);
    on->v.emplace_back(l);
  };
  running_node<> root(fast_config(10, 2.5), o);
  CHECK(eventually([&] { return on->has("became master; learning mode starts (up to 2.5 s)"); }));
}

// ---- real tools ---------------------------------------------------------------------------

#ifdef DOORMAN_NODE_BINARY

TEST_CASE("admin endpoint: a real Prometheus server scrapes a node", "[admin][net][tools]") {
  if (!have("prometheus")) {
    WARN("prometheus is not installed (Debian package prometheus); skipped");
    return;
  }
  // Leases long enough to outlast Prometheus's start.
  running_node<> root(R"({"resources": [{"identifier_glob": "*", "capacity": 100,
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 300, "refresh_interval": 60,
                  "learning_mode_duration": 0}}]})",
                      with_admin());
  line_client a(root.address());
  CHECK(gets(a.call("get_capacity", capacity_params("a", "scraped", 25))) == 25);
  const auto dir = scratch("prometheus");
  std::ofstream(dir / "prometheus.yml")
      << "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: doorman\n"
         "    static_configs: [{targets: ['"
      << root.node().admin_address() << "']}]\n";
  // Prometheus listens on a port picked here: bind port 0, read it, let it go.
  running_node<> probe(fast_config(1), with_admin());
  const std::string web = probe.node().admin_address();
  probe.stop();
  doorman_examples::process prom(
      {path_of("prometheus"), "--config.file=" + (dir / "prometheus.yml").string(),
       "--storage.tsdb.path=" + (dir / "data").string(), "--web.listen-address=" + web},
      (dir / "prometheus.log").string());
  std::string answer;
  const bool found = eventually(
      [&] {
        const auto r =
            http_get(web, "/api/v1/query?query=doorman_resource_has%7Bresource%3D%22scraped%22%7D");
        answer = r.body;
        return r.status == 200 && r.body.find("\"25\"") != std::string::npos;
      },
      30s);
  INFO(answer);
  CHECK(found);
  prom.signal(SIGTERM);
  CHECK(prom.exits_cleanly());
  fs::remove_all(dir);
}
#endif

namespace {

// The DOM headless Chromium builds from `path` on the admin endpoint at `address`, and its exit
// status (a profile of its own, removed after).
std::pair<int, std::string> chromium_dom(const std::string& address, const std::string& path) {
  const auto dir = scratch("chromium");
  auto out =
      run_command("timeout 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir=" +
                      (dir / "profile").string() + " --dump-dom http://" + address + path,
                  true);
  fs::remove_all(dir);
  return out;
}

}  // namespace

TEST_CASE("admin endpoint: headless Chromium renders the status page", "[admin][net][tools]") {
  if (!have("chromium")) {
    WARN("chromium is not installed (Debian package chromium); skipped");
    return;
  }
  // The lease must outlive Chromium's start, which took over 3 s on a busy CI machine (the
  // page then showed no resource): 300 s.
  running_node<> root(R"({"resources": [{"identifier_glob": "*", "capacity": 100,
    "description": "the default",
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 300, "refresh_interval": 0.4,
                  "learning_mode_duration": 0}}]})",
                      with_admin());
  line_client a(root.address());
  CHECK(gets(a.call("get_capacity", capacity_params("alice", "orders", 30))) == 30);
  const auto [status, dom] = chromium_dom(root.node().admin_address(), "/status");
  INFO(dom.substr(0, 2000));
  CHECK(status == 0);
  // The DOM the browser built: the resources table with its row, in order.
  CHECK_THAT(dom, Catch::Contains("<table id=\"resources\">"));
  CHECK_THAT(dom, Catch::Contains("<a href=\"/status/resources/orders\">orders</a></td>"
                                  "<td class=\"n\">100</td><td class=\"n\">30</td>"));
  CHECK_THAT(dom, Catch::Contains("<td>the default</td>"));
}

namespace {

// A root learning `provider` from 100 between 10 and 1000, a control step every `refresh`
// seconds (no learning mode); any other resource at 100.
std::string learned_root_config(double refresh) {
  return R"({"resources": [{"identifier_glob": "provider", "capacity": 100,
    "learn": {"min": 10, "max": 1000},
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 300, "refresh_interval": )" +
         std::to_string(refresh) + R"(, "learning_mode_duration": 0}},
    {"identifier_glob": "*", "capacity": 100,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 300, "refresh_interval": 5}}]})";
}

// `alice` wants 500 of `provider` and reports `calls` calls in all, none overloaded.
void report_calls(line_client& a, double calls) {
  auto params = capacity_params("alice", "provider", 500);
  params["resources"][0]["signals"] = {{"calls", calls}, {"overloads", 0}};
  REQUIRE(a.call("get_capacity", params).contains("result"));
}

}  // namespace

TEST_CASE("admin endpoint: a live root charts its learned capacity, in Chromium too",
          "[admin][net][learn]") {
  running_node<> root(learned_root_config(0.2), with_admin());
  line_client a(root.address());
  // Calls reported, 40 a report, none overloaded, while wanting more than the capacity: the
  // root steps (a rise each refresh interval) until three steps are kept.
  const auto steps = [&] {
    const auto st = status_of(root.address(), "provider").at("resources").at(0);
    return st.contains("learned") ? st.at("learned").at("seconds").get<double>() : 0.0;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  double calls = 0;
  int stepped = 0;
  while (stepped < 3 && std::chrono::steady_clock::now() < deadline) {
    report_calls(a, calls);
    calls += 40;
    const auto page = http_get(root.node().admin_address(), "/status/resources/provider").body;
    const auto at = page.find("Learned capacity (");
    stepped = at == std::string::npos ? 0 : std::atoi(page.c_str() + at + 18);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the next report, later
  }
  REQUIRE(stepped >= 3);
  CHECK(steps() > 0);
  const auto page = http_get(root.node().admin_address(), "/status/resources/provider");
  CHECK(page.status == 200);
  CHECK_THAT(page.body, Catch::Contains("<svg"));
  CHECK_THAT(page.body, Catch::Contains("<td>rise</td>"));
  if (!have("chromium")) {
    WARN("chromium is not installed (Debian package chromium); skipped");
    return;
  }
  const auto [status, dom] =
      chromium_dom(root.node().admin_address(), "/status/resources/provider");
  INFO(dom.substr(0, 3000));
  CHECK(status == 0);
  // The DOM the browser built: the chart, its four lines and their legend, and the steps.
  CHECK_THAT(dom, Catch::Contains("<h2 id=\"learned\">Learned capacity ("));
  CHECK_THAT(dom, Catch::Contains("<polyline"));
  CHECK_THAT(dom, Catch::Contains(">learned capacity</text>"));
  CHECK_THAT(dom, Catch::Contains(">demand</text>"));
  CHECK_THAT(dom, Catch::Contains("<table id=\"steps\">"));
}

// ---- Doorman's YAML -----------------------------------------------------------------------

#if defined(DOORMAN_NODE_BINARY) && defined(DOORMAN_HAVE_YAML)
#include "yaml_config.hpp"

namespace {

// Doorman's own example (doc/simplecluster/config.yml in its repository), as it is.
constexpr const char* doorman_example_yaml = R"(resources:
  - identifier_glob: proportional
    capacity: 100
    safe_capacity: 10
    description: proportional example
    algorithm:
      kind: PROPORTIONAL_SHARE
      lease_length: 15
      refresh_interval: 5
  - identifier_glob: fair
    capacity: 1000
    safe_capacity: 10
    description: fair share example
    algorithm:
      kind: FAIR_SHARE
      lease_length: 15
      refresh_interval: 5
  - identifier_glob: "*"
    capacity: 1000
    safe_capacity: 10
    description: default
    algorithm:
      kind: FAIR_SHARE
      lease_length: 60
      refresh_interval: 15
)";

std::string yaml_error(const std::string& text) {
  try {
    (void)doorman_examples::parse_yaml_config(text, "x.yml");
  } catch (const doorman::config_error& e) {
    return e.what();
  } catch (const std::exception& e) {  // anything else escaping is a defect
    return std::string("not a config_error: ") + e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("yaml: Doorman's example configuration loads as it is", "[yaml]") {
  const auto repo = doorman_examples::parse_yaml_config(doorman_example_yaml, "config.yml");
  REQUIRE(repo.templates().size() == 3);
  const auto& p = repo.find("proportional");
  CHECK(p.capacity == 100);
  CHECK(p.safe_capacity == 10);
  CHECK(p.description == "proportional example");
  CHECK(p.algorithm.kind == "PROPORTIONAL_SHARE");
  CHECK(p.algorithm.lease_length.count() == 15);
  CHECK(repo.find("anything").description == "default");
  // The same configuration as JSON parses to the same repository.
  const auto json_form = doorman_examples::yaml_config_json(doorman_example_yaml, "config.yml");
  CHECK(doorman::resource_repository::parse(json_form.dump()).templates() == repo.templates());
}

TEST_CASE("yaml: Doorman's forms without a JSON twin are converted", "[yaml]") {
  const auto repo = doorman_examples::parse_yaml_config(R"(resources:
- identifier_glob: "*"
  capacity: 10
  algorithm:
    kind: 3
    lease_length: 604800
    refresh_interval: 60
    parameters:
      - name: spread
        value: "0.5"
      - name: flag
)",
                                                        "x.yml");
  const auto& t = repo.templates().at(0);
  CHECK(t.algorithm.kind == "FAIR_SHARE");
  CHECK(t.algorithm.lease_length.count() == 604800);
  CHECK(t.algorithm.parameters == json({{"spread", "0.5"}, {"flag", ""}}));
  CHECK(doorman_examples::parse_yaml_config(
            "resources: [{identifier_glob: '*', capacity: 1, algorithm: {kind: 1, lease_length: "
            "60, refresh_interval: 5}}]",
            "x.yml")
            .templates()
            .at(0)
            .algorithm.kind == "STATIC");
}

TEST_CASE("yaml: errors name the field and the line", "[yaml]") {
  CHECK(yaml_error(R"(resources:
  - identifier_glob: "*"
    capacity: -5
    algorithm: {kind: FAIR_SHARE, lease_length: 60, refresh_interval: 15}
)") == "resources[0].capacity: must be between 0 and 1e15 (line 3 of x.yml)");
  CHECK(yaml_error(R"(resources:
  - identifier_glob: "*"
    capacity: 5
    algorithm:
      kind: 7
      lease_length: 60
      refresh_interval: 15
)") == "resources[0].algorithm.kind: must be a string (line 5 of x.yml)");
  CHECK(yaml_error("resources:\n  - identifier_glob: \"*\"\n    capacity: [1\n") ==
        "x.yml:4: not valid YAML: end of sequence flow not found");
  // Found by the yaml fuzz target: a key holding NUL bytes is written escaped in the message
  // and raw in the path, so the reason could not be cut out of the message by the path's
  // length (std::out_of_range escaped).
  const std::string nul_key = "res  capacity: 10\n' !algorithm" + std::string(28, '\0') +
                              ": &fair {kind: F@IR_SHARE0\n/ algorithm: *fair\n";
  CHECK_THAT(yaml_error(nul_key), !Catch::StartsWith("not a config_error"));
  // The key (a quoted scalar over two lines) is written with its NUL bytes as \x00.
  std::string key = " !algorithm";
  for (int i = 0; i < 28; ++i)
    key += "\\x00";
  key += ": &fair {kind: F@IR_SHARE0 / algorithm: *fair ";
  CHECK(yaml_error(nul_key) == key + ": unknown field (line 2 of x.yml)");
  // The same for a value quoted in a message (found by the same target next): "\0" in a double
  // quoted YAML scalar is a NUL byte.
  const auto glob = yaml_error("resources:\n- identifier_glob: \"[\\0\"\n  capacity: 1\n");
  CHECK_THAT(glob, Catch::Contains("\\x00"));
  CHECK_THAT(glob, Catch::EndsWith("(line 2 of x.yml)"));
  // Quoted numbers stay strings, and are refused where a number is needed.
  CHECK(yaml_error(R"(resources:
- identifier_glob: "*"
  capacity: "5"
  algorithm: {kind: FAIR_SHARE, lease_length: 60, refresh_interval: 15})") ==
        "resources[0].capacity: must be a number (line 3 of x.yml)");
}

TEST_CASE("yaml: hostile files are refused within bounds, naming the field and the line",
          "[yaml]") {
  // An alias chain: ~300 bytes that would expand to 10^9 values. Refused at the bound, for
  // every reader (configuration, access file, rules).
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i <= 9; ++i) {
    bomb += fmt::format("a{}: &a{} [", i, i);
    for (int k = 0; k < 10; ++k)
      bomb += fmt::format("{}*a{}", k ? ", " : "", i - 1);
    bomb += "]\n";
  }
  const std::string expands = "the document expands to more than 100000 values";
  CHECK_THAT(yaml_error(bomb), Catch::Contains(expands));
  CHECK_THROWS_WITH(doorman_examples::parse_yaml_access(bomb, "a.yml"), Catch::Contains(expands));
  CHECK_THROWS_WITH(doorman_examples::parse_yaml_rules(bomb, "r.yml"), Catch::Contains(expands));
  CHECK_THROWS_WITH(doorman_examples::parse_config_any(bomb, "etcd:/doorman/config"),
                    Catch::Contains(expands));
  // Wide values through aliases count by their bytes.
  std::string wide = "s: &s " + std::string(100'000, 'w') + "\nl: &l [";
  for (int k = 0; k < 200; ++k)
    wide += fmt::format("{}*s", k ? ", " : "");
  wide += "]\n";
  CHECK_THAT(yaml_error(wide), Catch::Contains("more than 16777216 bytes of keys and scalars"));
  // Nesting, aliases inside their own anchor, keys that are not scalars, bytes that are not
  // UTF-8: each a config_error naming the field and the line.
  std::string deep_path;
  for (int i = 0; i < 64; ++i)
    deep_path += "[0]";
  CHECK(yaml_error(std::string(100, '[') + std::string(100, ']')) ==
        deep_path + ": nests deeper than 64 levels (line 1 of x.yml)");
  CHECK_THAT(yaml_error("r: &r [*r]\n"), Catch::Contains("of x.yml"));
  CHECK(yaml_error("resources:\n  ? [a, b]\n  : 1\n") ==
        "resources: a key must be a scalar (a string) (line 2 of x.yml)");
  CHECK(yaml_error("resources:\n  - identifier_glob: \"\xff\xfe\"\n") ==
        "resources[0].identifier_glob: not valid UTF-8 (line 2 of x.yml)");
  CHECK(yaml_error("\xc3: 1\n") == "\xc3: not valid UTF-8 (line 1 of x.yml)");
  // A configuration that uses aliases as Doorman's users do still loads.
  const auto repo = doorman_examples::parse_yaml_config(R"(resources:
- identifier_glob: "a*"
  capacity: 10
  algorithm: &fair {kind: FAIR_SHARE, lease_length: 60, refresh_interval: 15}
- identifier_glob: "*"
  capacity: 20
  algorithm: *fair
)",
                                                        "x.yml");
  CHECK(repo.templates().at(1).algorithm.kind == "FAIR_SHARE");
}

TEST_CASE("yaml: a learned capacity's bounds beside capacity, errors naming the field and line",
          "[yaml][learn]") {
  const auto repo = doorman_examples::parse_yaml_config(R"(resources:
- identifier_glob: provider
  capacity: 1000
  learn: {min: 100, max: 5000}
  algorithm: {kind: FAIR_SHARE, lease_length: 60, refresh_interval: 5}
- identifier_glob: "*"
  capacity: 20
  algorithm: {kind: 2, lease_length: 60, refresh_interval: 15}
)",
                                                        "x.yml");
  REQUIRE(repo.templates().at(0).learn);
  CHECK(repo.templates().at(0).learn->min == 100);
  CHECK(repo.templates().at(0).learn->max == 5000);
  CHECK_FALSE(repo.templates().at(1).learn);
  try {
    (void)doorman_examples::parse_yaml_config(R"(resources:
- identifier_glob: "*"
  capacity: 1000
  learn:
    min: 10
    max: 5
  algorithm: {kind: FAIR_SHARE, lease_length: 60, refresh_interval: 5}
)",
                                              "x.yml");
    FAIL("accepted");
  } catch (const doorman::config_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("resources[0].learn.max: must be at least min (line 6"));
  }
}

TEST_CASE("yaml: files by extension, etcd values by their first character", "[yaml]") {
  CHECK(doorman_examples::is_yaml("{}", "conf.yml"));
  CHECK(doorman_examples::is_yaml("", "conf.yaml"));
  CHECK_FALSE(doorman_examples::is_yaml("resources: []", "conf.json"));
  CHECK(doorman_examples::is_yaml("resources: []", "etcd:/doorman/config"));
  CHECK_FALSE(doorman_examples::is_yaml("  {\"resources\": []}", "etcd:/doorman/config"));
  CHECK_FALSE(doorman_examples::is_yaml("// a comment\n{}", "etcd:/doorman/config"));
}

TEST_CASE("doorman-node loads Doorman's YAML and warns about unknown DOORMAN_ variables",
          "[yaml][process]") {
  const auto dir = scratch("yaml-node");
  std::ofstream(dir / "config.yml") << doorman_example_yaml;
  ::setenv("DOORMAN_LISTN", "127.0.0.1:1", 1);
  process p({DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--admin", "off", "--config",
             (dir / "config.yml").string()},
            (dir / "node.log").string());
  ::unsetenv("DOORMAN_LISTN");
  const auto address = listening_address(p);
  CHECK_THAT(p.log(), Catch::Contains("warning: environment variable DOORMAN_LISTN is not a flag"));
  CHECK_THAT(p.log(), !Catch::Contains("admin endpoint"));
  line_client c(address);
  const auto st = c.call("status", json::object());
  CHECK(st["result"]["mastership"]["is_master"] == true);
  // A bad edit, then SIGHUP: refused with the line, the old configuration stays.
  std::ofstream(dir / "config.yml") << "resources:\n  - identifier_glob: \"*\"\n    capacity: x\n";
  p.signal(SIGHUP);
  const auto rejected = p.wait_for("rejected");
  REQUIRE(rejected);
  CHECK_THAT(*rejected, Catch::Contains("resources[0].capacity: must be a number (line 3 of"));
  p.signal(SIGTERM);
  CHECK(p.exits_cleanly());
  fs::remove_all(dir);
}
#endif

#ifdef DOORMAN_NODE_BINARY
TEST_CASE("doorman-node --log-level warning keeps only the problems", "[log][process]") {
  const auto dir = scratch("log-level");
  std::ofstream(dir / "c.json") << fast_config(10);
  // The log will not say where it listens: take a free port (bind port 0, read it, let go).
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
  ::close(fd);
  const std::string address = fmt::format("127.0.0.1:{}", ntohs(sa.sin_port));
  process p({DOORMAN_NODE_BINARY, "--listen", address, "--admin", "off", "--log-level", "warning",
             "--config", (dir / "c.json").string()},
            (dir / "node.log").string());
  // Once it answers, its signal handlers are installed.
  CHECK(eventually([&] {
    line_client c(address);
    return c.connected() && c.send(request_line(1, "discovery", json::object())) &&
           c.read_line(1s).has_value();
  }));
  std::ofstream(dir / "c.json") << "{}";
  p.signal(SIGHUP);
  CHECK(p.wait_for("warning: configuration"));
  p.signal(SIGTERM);
  CHECK(p.exits_cleanly());
  CHECK_THAT(p.log(), !Catch::Contains("listening on"));
  CHECK_THAT(p.log(), !Catch::Contains("became master"));
  check_refused_start(
      {DOORMAN_NODE_BINARY, "--log-level", "loud", "--config", (dir / "c.json").string()},
      (dir / "bad.log").string(), "--log-level: expected info, warning or error, got \"loud\"");
  fs::remove_all(dir);
}
#endif

// ---- the doorman CLI ----------------------------------------------------------------------

#ifdef DOORMAN_CLI_BINARY

namespace {

std::pair<int, std::string> cli(const std::string& args, bool quiet = false) {
  return run_command(std::string(DOORMAN_CLI_BINARY) + " " + args, quiet);
}

}  // namespace

TEST_CASE("a budget through a real node: a report retried across a pause counts once",
          "[budget][process][cli]") {
  const auto dir = scratch("budget-node");
  // One fixed window of 366 days: the test does not straddle a window's end.
  std::ofstream(dir / "c.json") << R"({"resources": [
    {"identifier_glob": "tokens", "capacity": 1000, "budget": {"window": 31622400},
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16,
                   "learning_mode_duration": 0}},
    {"identifier_glob": "*", "capacity": 0,
     "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 60, "refresh_interval": 16}}]})";
  process node({DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--admin", "off", "--config",
                (dir / "c.json").string()},
               (dir / "node.log").string());
  const auto address = listening_address(node);
  line_client c(address);
  const auto ask = [](const json& extra) {
    json r = {{"resource_id", "tokens"}, {"wants", 600}};
    r.update(extra);
    return json{{"client_id", "gw-1"}, {"resources", json::array({r})}};
  };
  const auto a = c.call("get_capacity", ask(json::object()));
  const json& g = a["result"]["resources"][0];
  CHECK(g["gets"]["capacity"] == 600);
  const auto window = g["budget"]["window"].get<std::int64_t>();
  // The node is paused (SIGSTOP) while a report is on its way; the client gives up waiting and
  // sends it again; both arrive once the node runs again.
  node.signal(SIGSTOP);
  const json report =
      ask({{"has", {{"capacity", 100}, {"expires_in", 50}, {"refresh_interval", 16}}},
           {"spend", {{"window", window}, {"spent", 500}}}});
  REQUIRE(c.send(request_line(2, "get_capacity", report)));
  CHECK_FALSE(c.read_line(300ms));  // a stopped node answers nothing
  REQUIRE(c.send(request_line(3, "get_capacity", report)));
  node.signal(SIGCONT);
  CHECK(c.read_line());
  CHECK(c.read_line());
  auto st = c.call("status", {{"resource_id", "tokens"}});
  CHECK(st["result"]["resources"][0]["budget"]["spent"] == 500);
  const auto [rc, out] = cli("status --server " + address);
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("BUDGET  WINDOW"));
  CHECK_THAT(out, Catch::Contains("  1000   500    400"));
  // Released with its last report: the rest of its allotment is free at once.
  c.call(
      "release_capacity",
      {{"client_id", "gw-1"},
       {"resources", {"tokens"}},
       {"spends", json::array({{{"resource_id", "tokens"}, {"window", window}, {"spent", 520}}})}});
  st = c.call("status", {{"resource_id", "tokens"}});
  CHECK(st["result"]["resources"][0]["budget"]["spent"] == 520);
  CHECK(st["result"]["resources"][0]["budget"]["left"] == 480);
  node.signal(SIGTERM);
  CHECK(node.exits_cleanly());
  fs::remove_all(dir);
}

TEST_CASE("doorman CLI: get, status, release and discovery against a root", "[cli][net]") {
  running_node<> root(fast_config(100));
  const std::string s = " --server " + root.address();
  auto [rc, out] = cli("get db --wants 30 --client-id alice" + s);
  CHECK(rc == 0);
  CHECK(out == "db: 30 of 30 wanted for alice; expires in 3 s, refresh in 0.4 s\n");
  std::tie(rc, out) = cli("status" + s);
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("role root  level 0  master " + root.address() + " (this node)"));
  CHECK_THAT(out,
             Catch::Contains("RESOURCE  CAPACITY  HAS  WANTS  CLIENTS  LEARNING  ALGORITHM\n"
                             "db        100       30   30     1        no        FAIR_SHARE\n"));
  std::tie(rc, out) = cli("status db" + s);
  CHECK_THAT(out, Catch::Contains("CLIENT  KIND    HAS  WANTS  EXPIRES IN"));
  CHECK_THAT(out, Catch::Contains("alice   client  30   30"));
  CHECK(gets(line_client(root.address()).call("get_capacity", capacity_params("bob", "db", 5))) ==
        5);
  std::tie(rc, out) = cli("status db --limit 1 --offset 1" + s);
  CHECK_THAT(out, Catch::Contains("bob     client  5"));
  CHECK_THAT(out, !Catch::Contains("alice"));
  CHECK_THAT(out, Catch::Contains("(1 of 2 leases from 1; --offset and --limit for others)"));
  std::tie(rc, out) = cli("status db --json" + s);
  CHECK(rc == 0);
  CHECK(json::parse(out)["leases"][0]["client_id"] == "alice");
  std::tie(rc, out) = cli("release db --client-id alice" + s);
  CHECK(rc == 0);
  CHECK(out == "db: released for alice\n");
  CHECK(status_of(root.address(), "db")["resources"][0]["clients"] == 1);
  std::tie(rc, out) = cli("discovery" + s);
  CHECK(out == "master: " + root.address() + "\n");
}

TEST_CASE("doorman CLI: status shows a root's learned capacity and its last step",
          "[cli][net][learn]") {
  // A step a second: a sender's rate counts for two seconds after its report, far longer than
  // a turn of the loop below takes, even with a sanitizer's CLI started at each turn.
  running_node<> root(learned_root_config(1));
  const std::string s = " --server " + root.address();
  line_client a(root.address());
  // The fields of the row of `provider` under the LEARNED header, split on spaces.
  const auto learned_row = [&] {
    auto [rc, out] = cli("status" + s);
    CHECK(rc == 0);
    std::istringstream in(out.substr(std::min(out.size(), out.find("\nLEARNED "))));
    std::vector<std::string> words;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("provider ", 0) != 0) continue;
      std::istringstream fields(line);
      for (std::string w; fields >> w;)
        words.push_back(w);
    }
    return words;
  };
  REQUIRE(a.call("get_capacity", capacity_params("alice", "provider", 500)).contains("result"));
  CHECK(learned_row() == std::vector<std::string>{"provider", "100", "10", "1000", "-", "-", "-"});
  // Calls reported, 40 a report and none overloaded, while wanting more than the capacity: the
  // root rises each refresh interval.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  double calls = 0;
  std::vector<std::string> row;
  while (std::chrono::steady_clock::now() < deadline) {
    report_calls(a, calls);
    calls += 40;
    row = learned_row();
    if (row.size() == 7 && row[6] == "rise") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the next report, later
  }
  REQUIRE(row.size() == 7);
  CHECK(row[6] == "rise");
  CHECK(std::stod(row[1]) > 100);  // the learned capacity rose
  CHECK(std::stod(row[4]) > 0);    // calls a second in the step's interval
  CHECK(row[5] == "0");            // none overloaded
}

TEST_CASE("doorman CLI: a node's malformed answers are named failures, never a crash", "[cli]") {
  using doorman_examples::cli::failure;
  using doorman_examples::cli::read_status;
  const json good = {{"mastership", {{"is_master", true}, {"master", "m:1"}}},
                     {"id", "n"},
                     {"role", "root"},
                     {"level", 0},
                     {"resources", json::array({{{"resource_id", "db"},
                                                 {"capacity", 5},
                                                 {"sum_has", 1},
                                                 {"sum_wants", 2},
                                                 {"clients", 1},
                                                 {"learning", false},
                                                 {"algorithm", "FAIR_SHARE"}}})}};
  const auto st = read_status(good);
  CHECK(doorman_examples::cli::node_line(st) ==
        "node n  role root  level 0  master m:1 (this node)\n");
  CHECK_THAT(doorman_examples::cli::resources_table(st), Catch::Contains("db        5"));
  const auto refused = [&](const char* pointer, json value, const std::string& why) {
    json bad = good;
    bad[json::json_pointer(pointer)] = std::move(value);
    INFO(bad.dump());
    CHECK_THROWS_MATCHES(
        read_status(bad), failure,
        Catch::Matchers::Message("status: the node's answer is malformed: " + why));
  };
  refused("/level", 1e300, "result.level: must be an integer");
  refused("/level", 1001, "result.level: must be between 0 and 1000");
  refused("/role", 5, "result.role: must be a string");
  refused("/resources/0", "db", "result.resources[0]: must be an object");
  refused("/resources/0/clients", -1, "result.resources[0].clients: must be between 0 and 1e15");
  refused("/resources/0/capacity", "5", "result.resources[0].capacity: must be a number");
  refused("/mastership", json::array(), "result.mastership: must be an object");
  refused("/resources", json::object(), "result.resources: must be an array");
  // A budget: its own table; a hostile one is refused naming the field.
  CHECK(doorman_examples::cli::budgets_table(st).empty());
  json budget = good;
  budget["resources"][0]["budget"] = {
      {"window", 1764374400}, {"reset", 3600}, {"limit", 1e6}, {"spent", 250000}, {"left", 700000}};
  CHECK(doorman_examples::cli::budgets_table(read_status(budget)) ==
        "\nBUDGET  WINDOW                LIMIT  SPENT   LEFT    RESETS IN  MARK\n"
        "db      2025-11-29 00:00 UTC  1e+06  250000  700000  1 h        -\n");
  budget["resources"][0]["budget"]["mark"] = 260000;  // a root keeping budget marks
  CHECK_THAT(doorman_examples::cli::budgets_table(read_status(budget)),
             Catch::EndsWith("1 h        260000\n"));
  budget["resources"][0]["budget"]["reset"] = 32029.7;  // (was "32029.7 s")
  CHECK_THAT(doorman_examples::cli::budgets_table(read_status(budget)),
             Catch::Contains("  8 h 54 min  "));
  budget["resources"][0]["budget"]["mark"] = -1;
  CHECK_THROWS_MATCHES(read_status(budget), failure,
                       Catch::Matchers::Message("status: the node's answer is malformed: "
                                                "result.resources[0].budget.mark: must be "
                                                "between 0 and 1e15"));
  refused("/resources/0/budget",
          json{{"window", -1}, {"reset", 1}, {"limit", 1}, {"spent", 0}, {"left", 0}},
          "result.resources[0].budget.window: must be between 0 and 1e11");
  // A learned capacity: its own table ("-" before the root's first step); hostile fields are
  // refused naming the field.
  CHECK(doorman_examples::cli::learned_table(st).empty());
  json learned = good;
  learned["resources"][0]["learned"] = {{"min", 10},      {"max", 1000},  {"calls", 0},
                                        {"overloads", 0}, {"seconds", 0}, {"step", "hold"}};
  CHECK(doorman_examples::cli::learned_table(read_status(learned)) ==
        "\nLEARNED  CAPACITY  MIN  MAX   CALLS/S  OVERLOADED/S  STEP\n"
        "db       5         10   1000  -        -             -\n");
  learned["resources"][0]["capacity"] = 612;
  learned["resources"][0]["learned"].update(
      {{"calls", 3930}, {"overloads", 210}, {"seconds", 5}, {"step", "cut"}});
  const std::string shown_learned = doorman_examples::cli::learned_table(read_status(learned));
  CHECK(shown_learned ==
        "\nLEARNED  CAPACITY  MIN  MAX   CALLS/S  OVERLOADED/S  STEP\n"
        "db       612       10   1000  786      42            cut\n");
  std::ifstream docs(std::string(DOORMAN_SOURCE_DIR) + "/docs/learned-capacity.md");
  const std::string doc((std::istreambuf_iterator<char>(docs)), std::istreambuf_iterator<char>());
  CHECK_THAT(doc, Catch::Contains(shown_learned.substr(1)));
  refused("/resources/0/learned",
          json{{"min", 10},
               {"max", 1000},
               {"calls", 1},
               {"overloads", 0},
               {"seconds", 1},
               {"step", "\x1b[2J"}},
          "result.resources[0].learned.step: must be hold, cut or rise");
  refused("/resources/0/learned",
          json{{"min", 10},
               {"max", 1000},
               {"calls", -1},
               {"overloads", 0},
               {"seconds", 1},
               {"step", "rise"}},
          "result.resources[0].learned.calls: must be between 0 and 1e15");
  CHECK_THROWS_AS(read_status(json::array()), failure);
  CHECK_THROWS_AS(read_status(nullptr), failure);
  // Control bytes a node sends are not written to the terminal.
  json escape = good;
  escape["resources"][0]["resource_id"] = "\x1b[2Jdb";
  CHECK_THAT(doorman_examples::cli::resources_table(read_status(escape)),
             Catch::StartsWith("RESOURCE") && Catch::Contains("?[2Jdb"));
}

TEST_CASE("doorman CLI: follows a redirect to the master", "[cli][net]") {
  running_node<> master(fast_config(100));
  running_node<fixed_election> follower(fast_config(100), {},
                                        fixed_election{false, master.address()});
  const auto [rc, out] = cli("get db --wants 7 --client-id bob --server " + follower.address());
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::StartsWith("db: 7 of 7 wanted for bob"));
  CHECK(status_of(master.address(), "db")["resources"][0]["clients"] == 1);
}

TEST_CASE("doorman CLI: failures exit 1 and bad usage 2, with a message", "[cli]") {
  auto [rc, out] = cli("status --server 127.0.0.1:1 --timeout 0.3");
  CHECK(rc == 1);
  CHECK_THAT(out, Catch::StartsWith("doorman: status at 127.0.0.1:1: "));
  std::tie(rc, out) = cli("frob");
  CHECK(rc == 2);
  CHECK(out == "doorman: unknown command \"frob\" (see --help)\n");
  std::tie(rc, out) = cli("get db");
  CHECK(rc == 2);
  CHECK(out == "doorman: get: needs --wants N\n");
  std::tie(rc, out) = cli("status --server nowhere");
  CHECK(rc == 2);
  CHECK(out == "doorman: --server: expected host:port, got \"nowhere\"\n");
  std::tie(rc, out) = cli("--help");
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::StartsWith("usage: doorman COMMAND"));
}

TEST_CASE("doorman CLI: config check and convert, offline", "[cli]") {
  const auto dir = scratch("cli-config");
  std::ofstream(dir / "good.json") << fast_config(5);
  std::ofstream(dir / "bad.json") << R"({"resources": [{"identifier_glob": "*", "capacity": -1,
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16}}]})";
  auto [rc, out] = cli("config check " + (dir / "good.json").string());
  CHECK(rc == 0);
  CHECK(out == (dir / "good.json").string() + ": ok (1 template)\n");
  std::tie(rc, out) = cli("config check " + (dir / "bad.json").string());
  CHECK(rc == 1);
  CHECK(out == "doorman: " + (dir / "bad.json").string() +
                   ": resources[0].capacity: must be between 0 and 1e15\n");
  std::tie(rc, out) = cli("config check " + (dir / "missing.json").string());
  CHECK(rc == 1);
  CHECK_THAT(out, Catch::Contains("cannot read"));
#ifdef DOORMAN_HAVE_YAML
  std::ofstream(dir / "doorman.yml") << doorman_example_yaml;
  std::tie(rc, out) = cli("config convert " + (dir / "doorman.yml").string(), true);
  REQUIRE(rc == 0);
  const auto converted = doorman::resource_repository::parse(out);
  CHECK(converted.templates() ==
        doorman_examples::parse_yaml_config(doorman_example_yaml, "x.yml").templates());
#endif
  fs::remove_all(dir);
}

TEST_CASE(
    "doorman CLI: watch redraws in a real terminal, rides out its node's absence and quits "
    "on q",
    "[cli][net][tools]") {
  if (!have("tmux")) {
    WARN("tmux is not installed; skipped");
    return;
  }
  running_node<> root(fast_config(100));
  line_client a(root.address());
  CHECK(gets(a.call("get_capacity", capacity_params("a", "watched", 10))) == 10);
  const std::string session = fmt::format("doorman-watch-{}", ::getpid());
  const std::string socket = fmt::format("-L doorman-test-{}", ::getpid());
  REQUIRE(run_command(fmt::format("tmux {} new-session -d -s {} -x 120 -y 30 '{} watch "
                                  "--interval 0.2 --server {}'",
                                  socket, session, DOORMAN_CLI_BINARY, root.address()))
              .first == 0);
  auto screen = [&] {
    return run_command(fmt::format("tmux {} capture-pane -p -t {}", socket, session)).second;
  };
  std::string seen;
  CHECK(eventually([&] {
    seen = screen();
    return seen.find("watched   100       10   10     1") != std::string::npos;
  }));
  INFO(seen);
  // Another client arrives: the table changes in place.
  CHECK(gets(a.call("get_capacity", capacity_params("b", "watched", 20))) == 20);
  CHECK(eventually([&] {
    seen = screen();
    return seen.find("watched   100       30   30     2") != std::string::npos;
  }));
  CHECK(seen.starts_with("doorman watch  " + root.address()));  // redrawn from the top

  // The node goes away: the error shows, and the node back on its port is shown again.
  const std::string address = root.address();
  root.stop();
  CHECK(eventually([&] {
    seen = screen();
    return seen.find("cannot read status") != std::string::npos;
  }));
  doorman::node_options again_options;
  again_options.listen = address;
  running_node<> again(fast_config(100), again_options);
  line_client b(again.address());
  CHECK(gets(b.call("get_capacity", capacity_params("c", "watched", 7))) == 7);
  CHECK(eventually([&] {
    seen = screen();
    return seen.find("watched   100       7    7      1") != std::string::npos;
  }));
  run_command(fmt::format("tmux {} send-keys -t {} q", socket, session));
  CHECK(eventually([&] {
    return run_command(fmt::format("tmux {} has-session -t {}", socket, session)).first != 0;
  }));
  run_command(fmt::format("tmux {} kill-server", socket));
}
#endif

// ---- the docs match the code --------------------------------------------------------------

#if defined(DOORMAN_SOURCE_DIR) && defined(DOORMAN_NODE_BINARY) && defined(DOORMAN_CLI_BINARY)

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<fs::path> markdown_files() {
  const fs::path root = DOORMAN_SOURCE_DIR;
  std::vector<fs::path> out = {root / "README.md", root / "benchmarks" / "README.md"};
  for (const auto& e : fs::directory_iterator(root / "docs"))
    if (e.path().extension() == ".md") out.push_back(e.path());
  return out;
}

// `--flag` -> the default column of node.md's flag table (its first cell, as written).
std::map<std::string, std::string> node_md_flags() {
  std::map<std::string, std::string> out;
  std::istringstream in(read_text(fs::path(DOORMAN_SOURCE_DIR) / "docs" / "node.md"));
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("| `--")) continue;
    const auto end = line.find_first_of(" `", 3);
    const auto second = line.find('|', 1);
    const auto third = line.find('|', second + 1);
    std::string fallback = line.substr(second + 1, third - second - 1);
    fallback.erase(0, fallback.find_first_not_of(' '));
    fallback.erase(fallback.find_last_not_of(' ') + 1);
    out[line.substr(3, end - 3)] = fallback;
  }
  return out;
}

}  // namespace

// The metric families a scrape names ("# TYPE name kind").
std::set<std::string> metric_families(const std::string& exposition) {
  std::set<std::string> out;
  std::istringstream in(exposition);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# TYPE ")) out.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  return out;
}

TEST_CASE("deploy/prometheus: every metric the rules use is one a root or intermediate exports",
          "[admin][net][docs]") {
  running_node<> root(fast_config(100), with_admin());
  doorman::node_options o = with_admin();
  o.parents = {root.address()};
  running_node<> mid("", o);
  line_client a(mid.address());
  CHECK(
      eventually([&] { return gets(a.call("get_capacity", capacity_params("a", "db", 5))) == 5; }));
  auto exported = metric_families(http_get(root.node().admin_address(), "/metrics").body);
  exported.merge(metric_families(http_get(mid.node().admin_address(), "/metrics").body));
  REQUIRE(exported.contains("doorman_parent_consecutive_failures"));

  const auto rules =
      read_text(fs::path(DOORMAN_SOURCE_DIR) / "deploy" / "prometheus" / "doorman.rules.yml");
  // Names of exported series; a recorded one (with a ':') is the rules' own.
  const std::regex name(R"(\b(doorman_[a-z_]+)\b(?!:))");
  std::size_t used = 0;
  for (auto it = std::sregex_iterator(rules.begin(), rules.end(), name);
       it != std::sregex_iterator(); ++it) {
    const std::string metric = (*it)[1];
    INFO(metric);
    CHECK(exported.contains(metric));
    ++used;
  }
  CHECK(used >= 10);
}

TEST_CASE("docs: node.md's flag table is doorman-node --help", "[docs]") {
  const auto help = run_command(std::string(DOORMAN_NODE_BINARY) + " --help").second;
  const auto table = node_md_flags();
  REQUIRE(table.size() > 10);
  std::istringstream in(help);
  std::size_t flags = 0;
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("  --")) continue;
    const std::string name = line.substr(2, line.find(' ', 2) - 2);
    if (name == "--help") continue;
    ++flags;
    INFO(name);
    REQUIRE(table.contains(name));
    // A default --help states is the one the table states (numbers as written there).
    if (const auto d = line.find("(default "); d != std::string::npos) {
      const std::string value = line.substr(d + 9, line.find(')', d) - d - 9);
      CHECK_THAT(table.at(name), Catch::Contains(value));
    }
  }
  CHECK(flags == table.size());
}

#ifdef DOORMAN_HTTP_BINARY
TEST_CASE("docs: every doorman-http-429 flag they show is one it takes", "[docs]") {
  const auto usage = run_command(std::string(DOORMAN_HTTP_BINARY) + " --help").second;
  REQUIRE_THAT(usage, Catch::Contains("usage: doorman-http-429"));
  const std::regex shown(R"(doorman-http-429 ([^`\n]*))");
  const std::regex flag(R"(--[a-z-]+)");
  std::size_t checked = 0;
  for (const auto& file : markdown_files()) {
    const auto text = read_text(file);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), shown);
         it != std::sregex_iterator(); ++it) {
      const std::string line = (*it)[1].str();
      for (auto f = std::sregex_iterator(line.begin(), line.end(), flag);
           f != std::sregex_iterator(); ++f) {
        INFO(file.filename().string() << ": " << f->str());
        // fmt, not operator+: GCC 12 -O3 reports a false -Wstringop-overflow on the concatenation
        CHECK_THAT(usage, Catch::Contains(fmt::format("[{} ", f->str())));
        ++checked;
      }
    }
  }
  CHECK(checked >= 5);
}
#endif

TEST_CASE("docs: every doorman command they show exists", "[docs]") {
  const auto usage = run_command(std::string(DOORMAN_CLI_BINARY) + " --help").second;
  const std::regex shown(R"(\$ doorman ([a-z]+)|`doorman ([a-z]+)[ `])");
  for (const auto& file : markdown_files()) {
    const auto text = read_text(file);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), shown);
         it != std::sregex_iterator(); ++it) {
      const std::string command = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
      INFO(file.filename().string() << ": doorman " << command);
      CHECK_THAT(usage, Catch::Contains("\n  " + command + " "));
    }
  }
}

TEST_CASE("docs: make targets and links they name exist", "[docs]") {
  const fs::path root = DOORMAN_SOURCE_DIR;
  const auto makefile = read_text(root / "Makefile");
  const std::regex make_target(R"(`make ([a-z-]+)`)");
  const std::regex link(R"(\]\(([^)#:\s]+)(#[^)]*)?\))");
  const std::regex comment(R"(<!--[^]*?-->)");  // compile hints hold C++, not links
  for (const auto& file : markdown_files()) {
    const auto text = std::regex_replace(read_text(file), comment, "");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), make_target);
         it != std::sregex_iterator(); ++it) {
      INFO(file.filename().string() << ": make " << (*it)[1].str());
      CHECK_THAT(makefile, Catch::Contains(fmt::format("\n{}:", (*it)[1].str())));
    }
    for (auto it = std::sregex_iterator(text.begin(), text.end(), link);
         it != std::sregex_iterator(); ++it) {
      const auto target = file.parent_path() / (*it)[1].str();
      INFO(file.filename().string() << " links to " << (*it)[1].str());
      CHECK(fs::exists(target));
    }
  }
}

TEST_CASE("docs: every table row and every link they open is closed on its line", "[docs]") {
  // (A cut line once left operations.md's admin table with a row ending in an open link, and
  // the rest of the line as a file at the repository's root.)
  for (const auto& file : markdown_files()) {
    std::istringstream in(read_text(file));
    bool fenced = false;
    int number = 0;
    for (std::string line; std::getline(in, line);) {
      ++number;
      if (line.starts_with("```")) fenced = !fenced;
      if (fenced) continue;
      INFO(file.filename().string() << ":" << number << ": " << line);
      if (line.starts_with("|")) CHECK(line.ends_with("|"));
      for (auto at = line.find("]("); at != std::string::npos; at = line.find("](", at + 2))
        CHECK(line.find(')', at) != std::string::npos);
    }
  }
  // The repository's root holds what the README says it does, and nothing else.
  const auto [status, listed] =
      run_command("git -C " + std::string(DOORMAN_SOURCE_DIR) + " ls-files --full-name", true);
  std::set<std::string> top;
  std::istringstream files(status == 0 ? listed : std::string());
  for (std::string f; std::getline(files, f);)
    top.insert(f.substr(0, f.find('/')));
  if (!top.empty()) {  // (not a git checkout: an unpacked source tree)
    const std::set<std::string> expected = {
        ".ci",      ".clang-format", ".gitignore", "CMakeLists.txt", "CMakePresets.json",
        "Makefile", "README.md",     "benchmarks", "cmake",          "deploy",
        "docs",     "examples",      "include",    "proto",          "python",
        "src",      "tests"};
    for (const auto& t : top) {
      INFO("at the repository's root: " << t);
      CHECK(expected.contains(t));
    }
  }
}

TEST_CASE("docs: the messages they quote are what the code says", "[docs]") {
  const fs::path root = DOORMAN_SOURCE_DIR;
  const auto node = read_text(root / "docs" / "node.md");
  const auto ops = read_text(root / "docs" / "operations.md");
  const auto ha = read_text(root / "docs" / "high-availability.md");
  // The reload rejection, as the configuration reader words it.
  std::string rejection;
  try {
    (void)doorman::resource_repository::parse(R"({"resources": [{"identifier_glob": "*",
      "capacity": -5, "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60,
      "refresh_interval": 16}}]})");
  } catch (const doorman::config_error& e) {
    rejection = e.what();
  }
  CHECK(rejection == "resources[0].capacity: must be between 0 and 1e15");
  CHECK_THAT(node, Catch::Contains(rejection));
  CHECK_THAT(ha, Catch::Contains(rejection));
  for (const auto* text : {&node, &ha}) {
    CHECK_THAT(*text, !Catch::Contains("finite number >= 0"));
    CHECK_THAT(*text, !Catch::Contains("DESIGN"));
  }
  // What operations.md quotes from the YAML reader and the admin endpoint.
#ifdef DOORMAN_HAVE_YAML
  CHECK(yaml_error("resources:\n  - identifier_glob: \"*\"\n    capacity: -5\n    algorithm: "
                   "{kind: FAIR_SHARE, lease_length: 60, refresh_interval: 5}\n") ==
        "resources[0].capacity: must be between 0 and 1e15 (line 3 of x.yml)");
  CHECK_THAT(ops, Catch::Contains("resources[0].capacity: must be between 0 and 1e15 (line 3 of "
                                  "bad.yml)"));
#endif
  doorman::admin_snapshot s;
  s.started = true;
  CHECK_THAT(ops, Catch::Contains(doorman::readiness(s).second));
  s.mastership.is_master = true;
  CHECK_THAT(ops, Catch::Contains("200 ready: " + doorman::readiness(s).second));
  CHECK_THAT(ops, Catch::Contains("Allow: GET, HEAD"));
  // --help's own wording points nowhere outside the repository.
  CHECK_THAT(run_command(std::string(DOORMAN_NODE_BINARY) + " --help").second,
             !Catch::Contains("DESIGN"));
}
#endif
