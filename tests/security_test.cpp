// Security (docs/security.md): the access file and its decisions (sans-I/O), then TLS on real
// connections with certificates made by the openssl CLI (examples/make_certs.sh): refused
// handshakes, authorization by identity, the admin endpoint, a tree over mutual TLS, and
// certificate rotation by SIGHUP.

#include <regex>

#include "line_client.hpp"
#include "support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (support.hpp, line_client.hpp)

namespace {

const char* const access_doc = R"({"rules": [
  {"identity": "admin.doorman.test", "roles": ["admin"]},
  {"identity": "spiffe://doorman.test/client/*", "roles": ["client"], "resources": ["api*"],
   "max_client_ids": 2},
  {"identity": "spiffe://doorman.test/node/*", "roles": ["server"], "server_ids": ["*"]}]})";

const std::string client_a = "spiffe://doorman.test/client/a";
const std::string client_b = "spiffe://doorman.test/client/b";

doorman::capacity_request ask(const std::string& client, const std::string& resource,
                              double wants) {
  doorman::capacity_request r;
  r.client_id = client;
  doorman::resource_request rr;
  rr.resource_id = resource;
  rr.wants = wants;
  r.resources.push_back(rr);
  return r;
}

std::string refusal(doorman::access_control& ac, const doorman::access_caller& c,
                    const auto& request) {
  return ac.check(c, request).value_or("");
}

}  // namespace

// ---- the access file and its decisions (no network) ------------------------------------

TEST_CASE("an access file is validated field by field", "[access]") {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[]", "expected an object with \"rules\""},
      {R"({"rules": {}})", "rules: expected a list"},
      {R"({"rules": [], "other": 1})", "other: unknown field"},
      {R"({"rules": [{"roles": ["admin"]}]})", "rules[0].identity: expected a non-empty glob"},
      {R"({"rules": [{"identity": "a[", "roles": ["admin"]}]})", "rules[0].identity:"},
      {R"({"rules": [{"identity": "a", "roles": []}]})", "rules[0].roles: expected a list"},
      {R"({"rules": [{"identity": "a", "roles": ["root"]}]})",
       "rules[0].roles[0]: expected client, server or admin, got root"},
      {R"({"rules": [{"identity": "a", "roles": ["client"], "resources": "x"}]})",
       "rules[0].resources: expected a list of globs"},
      {R"({"rules": [{"identity": "a", "roles": ["client"], "client_ids": ["{identity}["]}]})",
       "rules[0].client_ids[0]:"},
      {R"({"rules": [{"identity": "a", "roles": ["client"], "max_client_ids": 0}]})",
       "rules[0].max_client_ids: must be an integer from 1 to 1000000"},
      {R"({"rules": [{"identity": "a", "roles": ["client"], "owner": "x"}]})",
       "rules[0].owner: unknown field"},
      {"{", "not valid JSON"},
  };
  for (const auto& [text, message] : bad) {
    INFO(text);
    CHECK_THROWS_WITH(doorman::access_policy::parse(text), Catch::Contains(message));
  }
  const auto p = doorman::access_policy::parse(access_doc);
  REQUIRE(p.rules().size() == 3);
  CHECK(p.rules()[1].client_ids == std::vector<std::string>{"{identity}", "{identity}#*"});
  // No `resources`: every resource id; given: those globs only.
  CHECK(p.rules()[2].all_resources);
  CHECK_FALSE(p.rules()[1].all_resources);
  CHECK(p.rule_for(client_a) == &p.rules()[1]);
  CHECK(p.rule_for("") == nullptr);
  CHECK(p.rule_for("spiffe://doorman.test/client/a/b") == nullptr);  // '*' does not cross '/'
  // An identity is taken literally where {identity} stands: each of its bytes is escaped.
  CHECK(doorman::access_policy::expand("{identity}#*", "a*b") == "\\a\\*\\b#*");
}

TEST_CASE("an identity never uses another identity's client ids, nor shares its records",
          "[access]") {
  // Path-shaped identities: b is a path below a. a owns a and a#NAME, never b (b's own id).
  const std::string a = "spiffe://doorman.test/client/a";
  const std::string b = a + "/w1";
  doorman::access_control ac(
      doorman::access_policy::parse(R"({"rules": [{"identity": "spiffe://doorman.test/client/*",
          "roles": ["client"]}, {"identity": "spiffe://doorman.test/client/*/*",
          "roles": ["client"]}]})"),
      0, nullptr);
  CHECK(refusal(ac, {a, 1}, ask(a, "api", 1)).empty());
  CHECK(refusal(ac, {a, 1}, ask(a + "#w1", "api", 1)).empty());
  CHECK_THAT(refusal(ac, {a, 1}, ask(b, "api", 1)),
             Catch::Contains("client_id \"" + b + "\" is not one that identity \"" + a + "\""));
  CHECK_THAT(refusal(ac, {a, 1}, ask(b + "#x", "api", 1)), Catch::Contains("is not one that"));
  CHECK_THAT(refusal(ac, {a, 1}, doorman::release_request{b, {"api"}}),
             Catch::Contains("is not one that"));
  CHECK(refusal(ac, {b, 2}, ask(b, "api", 1)).empty());
  CHECK(refusal(ac, {b, 2}, ask(b + "#x", "api", 1)).empty());
  CHECK_THAT(refusal(ac, {b, 2}, ask(a, "api", 1)), Catch::Contains("is not one that"));
  // An identity holding '#' is no identity (a certificate naming one gets nothing).
  CHECK_THAT(refusal(ac, {a + "#w1", 3}, ask(a + "#w1", "api", 1)),
             Catch::Contains("matches no rule"));

  // {identity} is literal inside a bracket class too: "a-z" is three bytes, not a range.
  doorman::access_control classes(
      doorman::access_policy::parse(
          R"({"rules": [{"identity": "*", "roles": ["client"], "client_ids": ["x[{identity}]"]}]})"),
      0, nullptr);
  CHECK(refusal(classes, {"a-z", 1}, ask("x-", "r", 1)).empty());
  CHECK(refusal(classes, {"a-z", 1}, ask("xz", "r", 1)).empty());
  CHECK_THAT(refusal(classes, {"a-z", 1}, ask("xb", "r", 1)), Catch::Contains("is not one that"));
  CHECK(refusal(classes, {"]", 1}, ask("x]", "r", 1)).empty());
  CHECK(refusal(classes, {"!a", 1}, ask("xa", "r", 1)).empty());
  CHECK_THAT(refusal(classes, {"!a", 1}, ask("xb", "r", 1)), Catch::Contains("is not one that"));

  // Client ids held per identity and per connection never share a record, however an
  // identity is spelled.
  doorman::access_control bound(std::nullopt, 1, nullptr);
  for (const std::string id : {"#3", "c3", "i", "3"}) {
    INFO(id);
    CHECK(refusal(bound, {id, 9}, ask("mine-" + id, "r", 1)).empty());
  }
  CHECK(refusal(bound, {"", 3}, ask("conn-3", "r", 1)).empty());
  CHECK(refusal(bound, {"", 3}, ask("conn-3", "r", 1)).empty());
  CHECK(bound.holders() == 5);
  bound.disconnected(3);
  CHECK(bound.holders() == 4);
}

TEST_CASE("an access glob matches as its expanded pattern does, with hostile identities",
          "[access]") {
  using doorman::access_policy;
  doorman::detail::splitmix64 draw(11);
  const std::string_view pattern_bytes = "ab*?[]!-#/\\";
  const std::string_view id_bytes = "ab*?[]#/\\";
  const std::vector<std::string> tokens = {"{identity}", "{identity}#*", "x-{identity}",
                                           "{identity}/{identity}", "[{identity}]*"};
  int matched = 0;
  for (int n = 0; n < 100000; ++n) {
    std::string identity;
    std::string id;
    std::string pattern = tokens[draw.next() % tokens.size()];
    for (auto k = draw.next() % 5; k > 0; --k)
      pattern += pattern_bytes[draw.next() % pattern_bytes.size()];
    if (doorman::glob_error(access_policy::expand(pattern, "x"))) continue;
    for (auto k = draw.next() % 5; k > 0; --k)
      identity += id_bytes[draw.next() % id_bytes.size()];
    id = draw.next() % 2 ? identity : std::string();
    for (auto k = draw.next() % 6; k > 0; --k)
      id += id_bytes[draw.next() % id_bytes.size()];
    INFO("pattern " << pattern << ", identity " << identity << ", id " << id);
    const bool expected = doorman::glob_match(access_policy::expand(pattern, identity), id);
    REQUIRE(access_policy::matches(pattern, identity, id) == expected);
    matched += expected ? 1 : 0;
  }
  CHECK(matched > 1000);
}

TEST_CASE("client certificates without an access file: the default policy", "[access]") {
  const std::string a = "spiffe://doorman.test/client/a";
  const std::string b = a + "/w1";
  doorman::access_control ac(doorman::access_policy::defaults(0), 0, nullptr);
  CHECK(refusal(ac, {a, 1}, ask(a, "anything", 1)).empty());
  CHECK(refusal(ac, {a, 1}, ask(a + "#w1", "anything", 1)).empty());
  // Every resource id, `/` included (an RLQS bucket's `edge/name=api`).
  CHECK(refusal(ac, {a, 1}, ask(a, "edge/name=api", 1)).empty());
  CHECK(refusal(ac, {b, 2}, ask(b, "anything", 1)).empty());
  // No identity acts on another's client ids: neither refresh nor release.
  CHECK_THAT(refusal(ac, {a, 1}, ask(b, "anything", 1)), Catch::Contains("is not one that"));
  CHECK_THAT(refusal(ac, {a, 1}, doorman::release_request{b, {"anything"}}),
             Catch::Contains("is not one that"));
  CHECK_THAT(refusal(ac, {a, 1}, doorman::release_request{"client-7", {"anything"}}),
             Catch::Contains("is not one that"));
  // Every identity is a server (an intermediate's server id is its --id), none an admin.
  doorman::server_capacity_request srv;
  srv.server_id = "127.0.0.1:7701";
  srv.resources.push_back({});
  srv.resources.back().resource_id = "db";
  CHECK(refusal(ac, {"leaf.doorman.test", 3}, srv).empty());
  CHECK(refusal(ac, {"leaf.doorman.test", 3}, doorman::status_request{}).empty());
  const auto leases = refusal(ac, {a, 1}, doorman::status_request{"anything"});
  CHECK(leases ==
        "status needs the admin role; with client certificates and no access file identity \"" + a +
            "\" has client, server (give the node an access file to grant it)");
  CHECK_THAT(ac.admin({a, 1}, "/metrics").value_or(""),
             Catch::Contains("/metrics needs the admin role"));
  // A caller without a certificate (client auth "request") may only call discovery.
  CHECK_THAT(refusal(ac, {"", 4}, ask("x", "anything", 1)),
             Catch::Contains("this connection (no client certificate) has no role"));
  // The node's --max-client-ids applies per identity.
  doorman::access_control bounded(doorman::access_policy::defaults(1), 1, nullptr);
  CHECK(refusal(bounded, {a, 1}, ask(a, "r", 1)).empty());
  CHECK_THAT(refusal(bounded, {a, 1}, ask(a + "#2", "r", 1)),
             Catch::Contains("already holds 1 client ids"));
}

TEST_CASE("access control decides by role, client id, server id and resource", "[access]") {
  doorman::access_control ac(doorman::access_policy::parse(access_doc), 0, nullptr);
  const doorman::access_caller a{client_a, 1};
  const doorman::access_caller admin{"admin.doorman.test", 2};
  const doorman::access_caller node{"spiffe://doorman.test/node/leaf", 3};
  const doorman::access_caller nobody{"", 4};

  CHECK(refusal(ac, a, ask(client_a, "api", 1)).empty());
  CHECK(refusal(ac, a, ask(client_a + "#worker-1", "api-2", 1)).empty());
  CHECK_THAT(refusal(ac, a, ask(client_b, "api", 1)),
             Catch::Contains("client_id \"spiffe://doorman.test/client/b\" is not one that "
                             "identity \"spiffe://doorman.test/client/a\" may use"));
  CHECK_THAT(refusal(ac, a, ask(client_a, "db", 1)),
             Catch::Contains("resources[0].resource_id \"db\" is not allowed"));
  doorman::release_request rel{client_b, {"api"}};
  CHECK_THAT(refusal(ac, a, rel), Catch::Contains("is not one that"));
  CHECK_THAT(refusal(ac, admin, ask("x", "api", 1)),
             Catch::Contains("get_capacity needs the client role; identity "
                             "\"admin.doorman.test\" has admin"));
  CHECK_THAT(refusal(ac, nobody, ask("x", "api", 1)),
             Catch::Contains("this connection (no client certificate) matches no rule"));

  doorman::server_capacity_request srv;
  srv.server_id = "leaf-1";
  srv.resources.push_back({});
  srv.resources.back().resource_id = "db";
  CHECK(refusal(ac, node, srv).empty());
  CHECK_THAT(refusal(ac, a, srv), Catch::Contains("get_server_capacity needs the server role"));
  // A server may read the node's summary (its level), not a resource's leases.
  CHECK(refusal(ac, node, doorman::status_request{}).empty());
  CHECK_THAT(refusal(ac, node, doorman::status_request{"api"}),
             Catch::Contains("status needs the admin role"));

  const doorman::status_request status{};
  CHECK(refusal(ac, admin, status).empty());
  CHECK_THAT(refusal(ac, a, status), Catch::Contains("status needs the admin role"));
  CHECK_THAT(ac.admin(a, "/metrics").value_or(""), Catch::Contains("/metrics needs the admin"));
  CHECK_FALSE(ac.admin(admin, "/metrics"));
}

TEST_CASE("max_client_ids bounds the client ids a caller holds, forgetting expired ones",
          "[access]") {
  std::set<std::string> leased;  // what the "engine" holds
  doorman::access_control ac(std::nullopt, 2, [&](std::string_view, std::string_view c) {
    return leased.contains(std::string(c));
  });
  const doorman::access_caller conn{"", 7};
  CHECK(refusal(ac, conn, ask("c1", "r", 1)).empty());
  leased.insert("c1");
  CHECK(refusal(ac, conn, ask("c2", "r", 1)).empty());
  leased.insert("c2");
  CHECK(refusal(ac, conn, ask("c1", "r", 1)).empty());      // one it holds: no new id
  CHECK(refusal(ac, conn, ask("c3", "other", 1)).empty());  // per resource
  CHECK_THAT(refusal(ac, conn, ask("c3", "r", 1)),
             Catch::Contains("already holds 2 client ids on resource \"r\" (max_client_ids 2)"));
  // Another connection has its own bound.
  CHECK(refusal(ac, {"", 8}, ask("c3", "r", 1)).empty());
  // A released id frees its place; so does an expired lease.
  CHECK(refusal(ac, conn, doorman::release_request{"c1", {"r"}}).empty());
  CHECK(refusal(ac, conn, ask("c4", "r", 1)).empty());
  leased.erase("c2");
  CHECK(refusal(ac, conn, ask("c5", "r", 1)).empty());
  CHECK(ac.holders() == 2);
  ac.disconnected(7);
  CHECK(ac.holders() == 1);
}

TEST_CASE("a refused call is answered 'forbidden' and changes no state", "[access]") {
  doorman::engine eng(doorman::engine::parse_config(fast_config(100)));
  doorman::access_control ac(doorman::access_policy::parse(access_doc), 0, nullptr);
  doorman::access_guard guard(ac, {client_a, 1});
  const auto now = std::chrono::steady_clock::now();
  eng.set_mastership(true, "self", now);
  const auto line = request_line(1, "get_capacity", capacity_params(client_b, "api", 10));
  doorman::dispatch_record rec;
  const auto reply = doorman::handle_line(eng, line, now, {}, &rec, &guard);
  REQUIRE(reply);
  const auto j = json::parse(*reply);
  CHECK(j["error"]["code"] == -32003);
  CHECK_THAT(j["error"]["message"].get<std::string>(), Catch::StartsWith("forbidden: client_id"));
  CHECK(rec.error == doorman::rpc_code::forbidden);
  CHECK(eng.store("api") == nullptr);  // no resource was even created
  const auto ok = doorman::handle_line(
      eng, request_line(2, "get_capacity", capacity_params(client_a, "api", 10)), now, {}, nullptr,
      &guard);
  INFO(*ok);
  CHECK(gets(json::parse(*ok)) == 10);
}

// ---- TLS on real connections ---------------------------------------------------------

namespace {

// A channel on its own io_context, with the TLS options given.
class tls_caller {
 public:
  tls_caller(const std::string& address, doorman::net::tls_options tls, double timeout = 2) {
    doorman::net::channel_options o;
    o.addresses = {address};
    o.tls = std::move(tls);
    o.call_timeout = doorman::seconds(timeout);
    o.maximum_backoff = doorman::seconds(0.2);
    channel_.emplace(io_.get_executor(), std::move(o));
  }
  tls_caller(const tls_caller&) = delete;
  tls_caller& operator=(const tls_caller&) = delete;
  ~tls_caller() {
    channel_->shutdown();
    io_.restart();
    io_.poll();
  }

  doorman::net::call_reply call(const std::string& method, const json& params) {
    return run_coroutine_test(
        io_, [&] { return channel_->call(method, params); }, 15s);
  }
  doorman::net::channel& channel() { return *channel_; }

 private:
  asio::io_context io_;
  std::optional<doorman::net::channel> channel_;
};

doorman::node_options tls_node_options(const std::string& cert = "node") {
  const auto& certs = test_certificates::get();
  doorman::node_options o;
  o.tls = certs.side(cert);
  o.tls.client_auth = doorman::net::client_auth::require;
  return o;
}

// GET over HTTPS with `tls` (the client's side); the status and body (status 0: no answer).
http_result https_get(const std::string& address, const std::string& target,
                      const doorman::net::tls_options& tls) {
  asio::io_context io;
  doorman::net::tls_context ctx(doorman::net::tls_side::client, tls);
  REQUIRE(doorman::net::parse_address(address));
  return run_coroutine_test(io, [&]() -> asio::awaitable<http_result> {
    doorman::net::stream s(io.get_executor(), ctx.current());
    const auto a = doorman::net::parse_address(address);
    std::error_code ec;
    co_await s.socket().async_connect(
        asio::ip::tcp::endpoint(asio::ip::make_address(a->host),
                                static_cast<unsigned short>(std::stoi(a->port))),
        asio::redirect_error(asio::use_awaitable, ec));
    if (!ec) co_await s.handshake(doorman::net::tls_side::client, a->host, ec);
    const std::string request = fmt::format("GET {} HTTP/1.1\r\nHost: test\r\n\r\n", target);
    if (!ec) {
      co_await asio::async_write(s, asio::buffer(request),
                                 asio::redirect_error(asio::use_awaitable, ec));
    }
    std::string raw;
    std::array<char, 4096> chunk;
    while (!ec) {
      const auto n = co_await s.async_read_some(asio::buffer(chunk),
                                                asio::redirect_error(asio::use_awaitable, ec));
      raw.append(chunk.data(), n);
    }
    http_result r;
    const auto end = raw.find("\r\n\r\n");
    if (!raw.starts_with("HTTP/1.1 ") || end == std::string::npos) co_return r;
    r.status = std::stoi(raw.substr(9, 3));
    r.body = raw.substr(end + 4);
    co_return r;
  });
}

}  // namespace

TEST_CASE("TLS handshakes: the wrong CA, no certificate, expired, the wrong name are refused",
          "[net][tls]") {
  const auto& certs = test_certificates::get();
  auto options = tls_node_options();
  options.admin = "127.0.0.1:0";
  options.access = certs("handshake-access.json");  // the admin reads /metrics below
  std::ofstream(options.access) << access_doc;
  running_node node(fast_config(100), options);
  const auto discovery = [&](const doorman::net::tls_options& tls) {
    tls_caller c(node.address(), tls, 1);
    return c.call("discovery", json::object());
  };
  const auto refused = [&](const doorman::net::tls_options& tls, const std::string& why) {
    const auto r = discovery(tls);
    INFO(r.message);
    CHECK_FALSE(r);
    CHECK_THAT(r.message, Catch::Contains(why));
    // The node keeps serving others.
    CHECK(discovery(certs.side("client-a")));
  };
  CHECK(discovery(certs.side("client-a")));
  refused(certs.side(""), "certificate required");
  refused(certs.side("rogue"), "unknown ca");
  refused(certs.side("expired"), "certificate expired");
  auto other_name = certs.side("client-a");
  other_name.server_name = "other.example";
  refused(other_name, "certificate verify failed");
  auto other_ca = certs.side("client-a");
  other_ca.ca_file = certs("other-ca.pem");
  refused(other_ca, "certificate verify failed");
  // Plaintext against a TLS port gets nowhere either.
  refused({}, "closed before any answer");

  // The node counts the handshakes it refused (four at least: no certificate, the other CA,
  // expired, plaintext).
  const auto metrics = https_get(node.node().admin_address(), "/metrics", certs.side("admin"));
  const std::regex failed(R"(doorman_tls_handshakes_failed_total (\d+))");
  std::smatch m;
  REQUIRE(std::regex_search(metrics.body, m, failed));
  CHECK(std::stoi(m[1].str()) >= 4);

  // A server whose certificate does not carry the name dialled.
  running_node wrong(fast_config(100), tls_node_options("wrong-name"));
  tls_caller c(wrong.address(), certs.side("client-a"), 1);
  const auto r = c.call("discovery", json::object());
  CHECK_FALSE(r);
  CHECK_THAT(r.message, Catch::Contains("certificate verify failed"));
}

TEST_CASE("a TLS connection that never completes its handshake is closed at the deadline",
          "[net][tls]") {
  auto options = tls_node_options();
  options.server.handshake_timeout = doorman::seconds(0.2);
  running_node node(fast_config(100), options);
  line_client silent(node.address());  // connects, then sends nothing
  REQUIRE(silent.connected());
  const auto start = steady::now();
  CHECK(silent.read_until_closed(5s).empty());
  CHECK(steady::now() - start < 4s);  // closed by the node, not by the test's deadline
  // The node still serves.
  tls_caller c(node.address(), test_certificates::get().side("client-a"));
  CHECK(c.call("discovery", json::object()));
}

TEST_CASE("identities bound what a caller may do over mutual TLS", "[net][tls][access]") {
  const auto& certs = test_certificates::get();
  const std::string access = certs("access.json");
  std::ofstream(access) << access_doc;
  auto options = tls_node_options();
  options.access = access;
  options.admin = "127.0.0.1:0";
  running_node node(fast_config(100), options);

  tls_caller a(node.address(), certs.side("client-a"));
  tls_caller b(node.address(), certs.side("client-b"));
  tls_caller admin(node.address(), certs.side("admin"));
  REQUIRE(a.call("get_capacity", capacity_params(client_a, "api", 10)));
  REQUIRE(b.call("get_capacity", capacity_params(client_b, "api", 10)));
  CHECK(a.channel().server_identity() == "spiffe://doorman.test/node/root");

  const auto forbidden = [](const doorman::net::call_reply& r, const std::string& why) {
    INFO(r.message);
    CHECK(r.code == -32003);
    CHECK_THAT(r.message, Catch::Contains("forbidden: " + why));
  };
  // a cannot release, nor refresh, b's client id; b's lease stays.
  forbidden(a.call("release_capacity", {{"client_id", client_b}, {"resources", {"api"}}}),
            "client_id \"spiffe://doorman.test/client/b\" is not one that identity "
            "\"spiffe://doorman.test/client/a\" may use");
  forbidden(a.call("get_capacity", capacity_params(client_b, "api", 90)), "client_id");
  forbidden(a.call("get_capacity", capacity_params(client_a, "db", 1)),
            "resources[0].resource_id \"db\" is not allowed");
  forbidden(
      a.call("get_server_capacity",
             {{"server_id", client_a},
              {"resources", json::array({{{"resource_id", "api"}, {"wants", json::array()}}})}}),
      "get_server_capacity needs the server role");
  forbidden(a.call("status", json::object()), "status needs the admin role");
  // Many client ids from one identity: two at most on a resource.
  REQUIRE(a.call("get_capacity", capacity_params(client_a + "#w1", "api", 1)));
  forbidden(a.call("get_capacity", capacity_params(client_a + "#w2", "api", 1)),
            "identity \"spiffe://doorman.test/client/a\" already holds 2 client ids on resource "
            "\"api\"");

  const auto st = admin.call("status", {{"resource_id", "api"}});
  REQUIRE(st);
  CHECK(st.result["resources"][0]["clients"] == 3);
  CHECK(st.result["resources"][0]["sum_has"] == 21);

  // The admin endpoint: /metrics and /status need admin; /healthz does not.
  const std::string web = node.node().admin_address();
  CHECK(https_get(web, "/metrics", certs.side("admin")).status == 200);
  const auto denied = https_get(web, "/status", certs.side("client-a"));
  CHECK(denied.status == 403);
  CHECK_THAT(denied.body, Catch::Contains("forbidden: /status needs the admin role"));
  CHECK(https_get(web, "/healthz", certs.side("client-a")).status == 200);
  const auto metrics = https_get(web, "/metrics", certs.side("admin"));
  CHECK_THAT(metrics.body, Catch::Contains("doorman_requests_total{method=\"get_capacity\",outcome="
                                           "\"forbidden\",door=\"json-rpc\"} 3"));
}

TEST_CASE("a node without TLS bounds client ids per connection with max_client_ids", "[net]") {
  doorman::node_options o;
  o.max_client_ids = 3;
  running_node node(fast_config(100), o);
  line_client c(node.address());
  for (int i = 0; i < 3; ++i)
    CHECK(gets(c.call("get_capacity", capacity_params(fmt::format("c{}", i), "r", 1))) == 1);
  const auto refused = c.call("get_capacity", capacity_params("c3", "r", 1));
  CHECK(refused["error"]["code"] == -32003);
  CHECK_THAT(refused["error"]["message"].get<std::string>(),
             Catch::Contains("this connection (no client certificate) already holds 3"));
  line_client other(node.address());
  CHECK(gets(other.call("get_capacity", capacity_params("c3", "r", 1))) == 1);
}

TEST_CASE("an access file without client certificates, or an unreadable one, is refused",
          "[access]") {
  const auto& certs = test_certificates::get();
  doorman::node_options o;
  o.listen = "127.0.0.1:0";
  o.access = certs("no-such-access.json");
  asio::io_context io;
  CHECK_THROWS_WITH(
      doorman::node(io.get_executor(), doorman::engine::parse_config(fast_config(1)), o),
      Catch::Contains("an access file needs client certificates"));
  o.tls = certs.side("node");
  o.tls.client_auth = doorman::net::client_auth::request;
  CHECK_THROWS_WITH(
      doorman::node(io.get_executor(), doorman::engine::parse_config(fast_config(1)), o),
      Catch::Contains("cannot read"));
  const std::string bad = certs("bad-access.json");
  std::ofstream(bad) << R"({"rules": [{"identity": "x", "roles": ["owner"]}]})";
  o.access = bad;
  CHECK_THROWS_WITH(
      doorman::node(io.get_executor(), doorman::engine::parse_config(fast_config(1)), o),
      Catch::Contains("rules[0].roles[0]: expected client, server or admin"));
  o.access.clear();
  o.tls.key_file = certs("client-a.key");
  CHECK_THROWS_WITH(
      doorman::node(io.get_executor(), doorman::engine::parse_config(fast_config(1)), o),
      Catch::Contains("tls key: cannot use \"" + certs("client-a.key") + "\" with"));
}

TEST_CASE("a root, an intermediate and clients converge over mutual TLS as in plaintext",
          "[net][tls][tree]") {
  const bool tls = GENERATE(false, true);
  INFO("tls: " << tls);
  const auto& certs = test_certificates::get();
  doorman::node_options root_options;
  if (tls) {
    root_options = tls_node_options();
    root_options.access = certs("tree-access.json");
    std::ofstream(root_options.access) << access_doc;
  }
  running_node root(fast_config(100), root_options);
  doorman::node_options mid_options;
  if (tls) {
    mid_options = tls_node_options("leaf");
    mid_options.parent_tls = certs.side("leaf");
  }
  mid_options.parents = {root.address()};
  running_node mid("", mid_options);

  // Two clients of the intermediate and one of the root want 60 each of 100: 100/3 each.
  const auto make = [&](const std::string& at, const std::string& who) {
    auto o = fast_client(at);
    o.client_id = "spiffe://doorman.test/client/" + who;
    if (tls) o.tls = certs.side("client-" + who);
    return std::make_unique<doorman::client>(o);
  };
  auto c1 = make(mid.address(), "a");
  auto c2 = make(mid.address(), "b");
  auto c3 = make(root.address(), "a");
  doorman::rate_resource h1(*c1, "api", {.wants = 60});
  doorman::rate_resource h2(*c2, "api", {.wants = 60});
  doorman::rate_resource h3(*c3, "api", {.wants = 60});
  const auto near = [](double x) { return std::abs(x - 100.0 / 3) < 1e-6; };
  const bool converged = eventually(
      [&] { return near(h1.capacity()) && near(h2.capacity()) && near(h3.capacity()); }, 20s);
  INFO(h1.capacity() << " " << h2.capacity() << " " << h3.capacity());
  CHECK(converged);
  // The intermediate asked the root's summary for its level, and was answered (a server may).
  std::promise<std::array<std::uint64_t, 2>> status_calls;
  root.node().post([&](auto&) {
    const auto& by_outcome =
        root.node().metrics().requests[0][static_cast<std::size_t>(doorman::rpc_method::status)];
    status_calls.set_value(
        {by_outcome[0], by_outcome[doorman::outcome_index(doorman::rpc_code::forbidden)]});
  });
  const auto calls = status_calls.get_future().get();
  CHECK(calls[0] >= 1);
  CHECK(calls[1] == 0);
  if (!tls) return;
  // The intermediate has client certificates and no access file: the default policy. Client a
  // may not release b's lease, nor read the resource's leases; b's share stays.
  tls_caller a(mid.address(), certs.side("client-a"));
  const auto release =
      a.call("release_capacity", {{"client_id", client_b}, {"resources", {"api"}}});
  CHECK(release.code == -32003);
  CHECK_THAT(release.message,
             Catch::Contains("forbidden: client_id \"" + client_b +
                             "\" is not one that identity \"" + client_a + "\" may use"));
  const auto leases = a.call("status", {{"resource_id", "api"}});
  CHECK(leases.code == -32003);
  CHECK_THAT(leases.message, Catch::Contains("with client certificates and no access file"));
  CHECK(near(h2.capacity()));
}

#ifdef DOORMAN_NODE_BINARY
TEST_CASE(
    "doorman-node over TLS: SIGHUP rotates certificates and the access file, clients keep "
    "their leases",
    "[net][tls][process]") {
  const auto& certs = test_certificates::get();
  char dir_template[] = "/tmp/doorman-test-XXXXXX";
  REQUIRE(::mkdtemp(dir_template));
  const std::string dir = dir_template;
  const auto copy = [&](const std::string& from, const std::string& to) {
    std::filesystem::copy_file(certs(from), dir + "/" + to,
                               std::filesystem::copy_options::overwrite_existing);
  };
  copy("node.pem", "cert.pem");
  copy("node.key", "key.pem");
  std::ofstream(dir + "/resources.json") << fast_config(100);
  std::ofstream(dir + "/access.json")
      << R"({"rules": [{"identity": ")" << client_a << R"(", "roles": ["client"]}]})";
  process root({DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--config", dir + "/resources.json",
                "--admin", "off", "--minimum-refresh-interval", "0", "--tls-cert",
                dir + "/cert.pem", "--tls-key", dir + "/key.pem", "--tls-ca", certs("ca.pem"),
                "--tls-client-auth", "require", "--access", dir + "/access.json"},
               dir + "/root.log");
  const std::string address = listening_address(root);

  tls_caller before(address, certs.side("client-a"));
  REQUIRE(before.call("get_capacity", capacity_params(client_a, "api", 10)));
  CHECK(before.channel().server_identity() == "spiffe://doorman.test/node/root");
  auto client_options = fast_client(address);
  client_options.client_id = client_a + "#worker";
  client_options.tls = certs.side("client-a");
  doorman::client client(client_options);
  doorman::rate_resource held(client, "api", {.wants = 20});
  REQUIRE(eventually([&] { return held.capacity() == 20; }));
  tls_caller b(address, certs.side("client-b"));
  CHECK(b.call("get_capacity", capacity_params(client_b, "api", 5)).code == -32003);

  // New certificate and key, and an access file that lets every client in.
  copy("node2.pem", "cert.pem");
  copy("node2.key", "key.pem");
  std::ofstream(dir + "/access.json")
      << R"({"rules": [{"identity": "spiffe://doorman.test/client/*", "roles": ["client"]}]})";
  root.signal(SIGHUP);
  REQUIRE(root.wait_for("TLS certificates reloaded"));
  REQUIRE(root.wait_for("access file " + dir + "/access.json reloaded"));

  tls_caller after(address, certs.side("client-a"));
  REQUIRE(after.call("discovery", json::object()));
  CHECK(after.channel().server_identity() == "spiffe://doorman.test/node/root-2");
  // The connections made before stay up, with the certificate they began with.
  REQUIRE(before.call("get_capacity", capacity_params(client_a, "api", 10)));
  CHECK(before.channel().server_identity() == "spiffe://doorman.test/node/root");
  CHECK(held.capacity() == 20);
  CHECK(b.call("get_capacity", capacity_params(client_b, "api", 5)));

  // A broken certificate file is rejected; the node keeps serving with what it had.
  std::ofstream(dir + "/cert.pem") << "not a certificate\n";
  root.signal(SIGHUP);
  const auto rejected = root.wait_for("TLS certificates rejected");
  REQUIRE(rejected);
  CHECK_THAT(*rejected, Catch::Contains("cert.pem"));
  tls_caller later(address, certs.side("client-a"));
  REQUIRE(later.call("discovery", json::object()));
  CHECK(later.channel().server_identity() == "spiffe://doorman.test/node/root-2");
  CHECK(eventually([&] { return held.capacity() == 20 && held.leased(); }));

  client.stop();
  root.signal(SIGTERM);
  CHECK(root.exits_cleanly());
  std::filesystem::remove_all(dir);
}

TEST_CASE("doorman-node refuses bad TLS and access flags with a message", "[net][tls][process]") {
  const auto& certs = test_certificates::get();
  const std::string log = certs("flags.log");
  std::ofstream(certs("flags-config.json")) << fast_config(1);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tls-cert", certs("node.pem"), "--tls-key", certs("node.key"), "--tls-client-auth",
        "always"},
       "--tls-client-auth: expected none, request or require, got \"always\""},
      {{"--tls-cert", certs("missing.pem"), "--tls-key", certs("node.key")},
       "--tls-cert: cannot read"},
      {{"--access", certs("ca.pem")}, "--access: needs --tls-client-auth request or require"},
      {{"--tls-client-auth", "require"}, "--tls-client-auth: needs --tls-cert and --tls-key"},
      {{"--tls-cert", certs("node.pem"), "--tls-key", certs("admin.key")}, "tls key: cannot use"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--config",
                                     certs("flags-config.json")};
    args.insert(args.end(), flags.begin(), flags.end());
    check_refused_start(args, log, message);
  }
}
#endif

#ifdef DOORMAN_SOURCE_DIR
TEST_CASE("docs: security.md quotes what the code says", "[docs][access]") {
  std::ifstream in(std::string(DOORMAN_SOURCE_DIR) + "/docs/security.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(!doc.empty());
  // The access file shown there is valid, and decides as the text says.
  const auto start = doc.find("{\"rules\": [");
  const auto end = doc.find("\n]}", start);
  REQUIRE(end != std::string::npos);
  const auto policy = doorman::access_policy::parse(doc.substr(start, end + 3 - start));
  doorman::access_control ac(policy, 0, nullptr);
  const doorman::access_caller a{client_a, 1};
  const auto refused = ac.check(a, ask("spiffe://doorman.test/client/b#w1", "api", 1));
  REQUIRE(refused);
  CHECK_THAT(doc, Catch::Contains("forbidden: " + *refused));
  CHECK_THAT(doc, Catch::Contains("forbidden: " + *ac.check(a, doorman::status_request{})));
  CHECK_THAT(doc, Catch::Contains("403 Forbidden: forbidden: " + *ac.admin(a, "/metrics")));
  CHECK_THAT(
      doc, Catch::Contains(fmt::format("**{}**", static_cast<int>(doorman::rpc_code::forbidden))));
  try {
    (void)doorman::access_policy::parse(R"({"rules": [{"identity": "x", "roles": ["owner"]}]})");
  } catch (const doorman::config_error& e) {
    CHECK_THAT(doc, Catch::Contains(e.what()));
  }
  // The handshake failure the node logs, as the stream words it.
  CHECK_THAT(doc, Catch::Contains("certificate verify failed: certificate has expired"));
  CHECK_THAT(doc, Catch::Contains("error: TLS certificates rejected, keeping the old: tls cert: "
                                  "cannot use"));
}
#endif

#ifdef DOORMAN_HAVE_YAML
#include "yaml_config.hpp"

TEST_CASE("an access file may be YAML, its errors naming the field and the line", "[access]") {
  const auto p = doorman_examples::parse_access_any(R"(rules:
  - identity: "spiffe://doorman.test/client/*"
    roles: [client]
    max_client_ids: 4
)",
                                                    "access.yml");
  REQUIRE(p.rules().size() == 1);
  CHECK(p.rules()[0].max_client_ids == 4);
  CHECK_THROWS_WITH(doorman_examples::parse_access_any(
                        "rules:\n  - identity: a\n    roles: [root]\n", "access.yml"),
                    "rules[0].roles[0]: expected client, server or admin, got root (line 3 of "
                    "access.yml)");
}
#endif
