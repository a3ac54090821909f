// Operating a node: the admin endpoint (its HTTP request parser, the pages it renders, a node
// serving them to real tools: promtool, a Prometheus server, headless Chromium) and Doorman's
// YAML configurations.

#include <catch2/catch.hpp>

#include <doorman/node.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

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
  m.observe({doorman::rpc_method::other, doorman::rpc_code::parse_error}, 1.0);
  const auto text = doorman::render_metrics(s, m);
  CHECK_THAT(text, Catch::Contains(R"(id="a\"b\\c\nd")"));
  CHECK_THAT(text, Catch::Contains(R"(doorman_resource_capacity{resource="quote\"d"} 12.5)"));
  CHECK_THAT(text,
             Catch::Contains(R"(doorman_requests_total{method="get_capacity",outcome="ok"} 2)"));
  CHECK_THAT(text,
             Catch::Contains(R"(doorman_requests_total{method="other",outcome="parse_error"} 1)"));
  CHECK_THAT(text,
             Catch::Contains(
                 R"(doorman_request_duration_seconds_bucket{method="get_capacity",le="5e-05"} 1)"));
  CHECK_THAT(
      text, Catch::Contains(
                R"(doorman_request_duration_seconds_bucket{method="get_capacity",le="0.0025"} 2)"));
  CHECK_THAT(text, Catch::Contains(
                       R"(doorman_request_duration_seconds_bucket{method="other",le="0.1"} 0)"));
  CHECK_THAT(text, Catch::Contains(
                       R"(doorman_request_duration_seconds_bucket{method="other",le="+Inf"} 1)"));
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

// ---- a node serving them ------------------------------------------------------------------

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
  CHECK_THAT(metrics.body,
             Catch::Contains(R"(doorman_requests_total{method="get_capacity",outcome="ok"} 1)"));
  CHECK_THAT(
      metrics.body,
      Catch::Contains(R"(doorman_requests_total{method="other",outcome="method_not_found"} 1)"));
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

  // Two slow peers hold both connections: a third is answered 503 at once; once the slow ones
  // time out, the endpoint serves again.
  line_client slow1(admin), slow2(admin);
  slow1.send("GET / HTTP/1.1\r\n");
  slow2.send("GET / HTTP/1.1\r\n");
  CHECK(eventually([&] { return http_get(admin, "/healthz").status == 503; }));
  CHECK(slow1.closed_by_peer());
  CHECK(slow2.closed_by_peer());
  CHECK(eventually([&] { return http_get(admin, "/healthz").status == 200; }));
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
  CHECK(prom.wait_exit() == 0);
  fs::remove_all(dir);
}
#endif

TEST_CASE("admin endpoint: headless Chromium renders the status page", "[admin][net][tools]") {
  if (!have("chromium")) {
    WARN("chromium is not installed (Debian package chromium); skipped");
    return;
  }
  running_node<> root(R"({"resources": [{"identifier_glob": "*", "capacity": 100,
    "description": "the default",
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 3, "refresh_interval": 0.4,
                  "learning_mode_duration": 0}}]})",
                      with_admin());
  line_client a(root.address());
  CHECK(gets(a.call("get_capacity", capacity_params("alice", "orders", 30))) == 30);
  const auto dir = scratch("chromium");
  const auto [status, dom] =
      run_command("timeout 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir=" +
                      (dir / "profile").string() + " --dump-dom http://" +
                      root.node().admin_address() + "/status",
                  true);
  INFO(dom.substr(0, 2000));
  CHECK(status == 0);
  // The DOM the browser built: the resources table with its row, in order.
  CHECK_THAT(dom, Catch::Contains("<table id=\"resources\">"));
  CHECK_THAT(dom, Catch::Contains("<a href=\"/status/resources/orders\">orders</a></td>"
                                  "<td class=\"n\">100</td><td class=\"n\">30</td>"));
  CHECK_THAT(dom, Catch::Contains("<td>the default</td>"));
  fs::remove_all(dir);
}
