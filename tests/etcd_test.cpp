// The etcd client against hostile HTTP peers, and a real etcd: election, failover, config.

#include "etcd_server.hpp"
#include "line_client.hpp"
#include "support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (support.hpp, line_client.hpp)

// ---- the etcd gateway client against hostile HTTP peers -------------------------------------

namespace {

// A TCP peer on 127.0.0.1 that answers each connection with the next canned reply (after
// reading the request head), or stays silent for an empty one.
class canned_http_peer {
 public:
  explicit canned_http_peer(std::vector<std::string> replies) : replies_(std::move(replies)) {
    std::tie(fd_, address_) = listen_on_loopback();
    thread_ = std::thread([this] {
      for (const auto& reply : replies_) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        std::string request;
        char chunk[4096];
        while (request.find("\r\n\r\n") == std::string::npos) {
          const auto n = ::recv(c, chunk, sizeof chunk, 0);
          if (n <= 0) break;
          request.append(chunk, static_cast<std::size_t>(n));
        }
        requests.push_back(request);
        if (reply.empty()) {
          pollfd p{c, POLLIN, 0};
          ::poll(&p, 1, 3000);  // silent until the client gives up and closes
        } else {
          ::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
        }
        ::close(c);
      }
    });
  }
  canned_http_peer(const canned_http_peer&) = delete;
  canned_http_peer& operator=(const canned_http_peer&) = delete;
  ~canned_http_peer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  [[nodiscard]] const std::string& address() const { return address_; }
  std::vector<std::string> requests;  // read after the destructor or when the peer is done

 private:
  int fd_ = -1;
  std::string address_;
  std::vector<std::string> replies_;
  std::thread thread_;
};

std::string http_reply(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\n\r\n" +
         body;
}

// Runs one etcd_client coroutine (with a 2 s deadline of its own) to completion on a fresh
// io_context.
template <class F>
auto run_etcd(const std::vector<std::string>& endpoints, F f) {
  asio::io_context io;
  doorman::net::etcd_client etcd(io.get_executor(), endpoints);
  return doorman_test::run_coroutine_test(io, [&] { return f(etcd, steady::now() + 2s); });
}

}  // namespace

TEST_CASE("base64 and HTTP answer parsing", "[net][etcd]") {
  using doorman::net::base64_decode;
  using doorman::net::base64_encode;
  for (const std::string s : {"", "a", "ab", "abc", "abcd", "/doorman/\xff\x01 master"}) {
    CHECK(base64_decode(base64_encode(s)) == s);
  }
  CHECK(base64_encode("/doorman/root") == "L2Rvb3JtYW4vcm9vdA==");
  CHECK_FALSE(base64_decode("a*b="));
  CHECK_FALSE(base64_decode("abcde"));

  using doorman::net::detail::parse_http_response;
  auto r = parse_http_response(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\n{\"a\r\n4;x=1\r\n\":1}\r\n0\r\nTrailer: y\r\n\r\n");
  CHECK_FALSE(r.error);
  CHECK(r.status == 200);
  CHECK(r.body == R"({"a":1})");
  CHECK(parse_http_response("HTTP/1.1 404 Not Found\r\n\r\nx").status == 404);
  CHECK(parse_http_response("HTTP/1.1 2x0 OK\r\n\r\n").error == doorman::errc::bad_answer);
  CHECK(parse_http_response("SMTP ready\r\n\r\n").error == doorman::errc::bad_answer);
  CHECK(parse_http_response("HTTP/1.1 200 OK\r\n").error == doorman::errc::bad_answer);
  CHECK(
      parse_http_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nabc").error ==
      doorman::errc::bad_answer);
  CHECK(parse_http_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffff\r\n")
            .error == doorman::errc::bad_answer);
  CHECK(parse_http_response("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").error ==
        doorman::errc::bad_answer);
}

TEST_CASE("etcd watch answers read as they stream in", "[net][etcd]") {
  using doorman::net::etcd_decode::watch_progress;
  using state = doorman::net::etcd_decode::watch_state;
  const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string created = R"({"result":{"created":true}})"
                              "\n";
  const std::string deleted = R"({"result":{"events":[{"type":"DELETE","kv":{}}]}})"
                              "\n";
  const auto chunk = [](const std::string& data) {
    return fmt::format("{:x}\r\n{}\r\n", data.size(), data);
  };
  CHECK(watch_progress("HTTP/1.1 200 OK\r\nTransfer-") == state::waiting);
  CHECK(watch_progress(std::string(20000, 'x')) == state::refused);  // a head without an end
  CHECK(watch_progress("HTTP/1.1 503 X\r\n\r\n") == state::refused);
  CHECK(watch_progress(head + chunk(created)) == state::waiting);
  const std::string both = head + chunk(created) + chunk(deleted);
  CHECK(watch_progress(both) == state::changed);
  for (std::size_t cut = head.size(); cut < both.size() - 2; ++cut) {  // a read at every byte
    INFO(cut);
    CHECK(watch_progress(both.substr(0, cut)) == state::waiting);
  }
  CHECK(watch_progress(head + chunk(created + deleted)) == state::changed);  // one chunk, 2 lines
  CHECK(watch_progress("HTTP/1.1 200 OK\r\n\r\n" + created + deleted) == state::changed);
  CHECK(watch_progress(head + chunk(R"({"result":{"canceled":true}})"
                                    "\n")) == state::changed);
  CHECK(watch_progress(head + chunk(R"({"result":{"compact_revision":"12"}})"
                                    "\n")) == state::changed);
  CHECK(watch_progress(head + chunk(R"({"result":{"events":[]}})"
                                    "\n")) == state::waiting);
  CHECK(watch_progress(head + chunk("[1]\n")) == state::refused);
  CHECK(watch_progress(head + chunk(R"({"error":{"message":"boom"}})"
                                    "\n")) == state::refused);
  CHECK(watch_progress(head + "zz\r\n") == state::refused);
  CHECK(watch_progress(head + "fffffffff\r\n") == state::refused);  // a chunk over 16 MiB
}

TEST_CASE(
    "a winning claim's answer counts the records alive before it, and a bad count is "
    "refused",
    "[net][etcd]") {
  using doorman::net::etcd_decode::claim_with_record;
  const auto decode = [](const char* text) {
    return claim_with_record(json::parse(text), "me", 42);
  };
  // Created: the count of the success branch's first range (omitted when 0).
  const auto two = decode(R"({"header": {"revision": "9"}, "succeeded": true,
      "responses": [{"response_range": {"count": "2"}}, {"response_put": {}}]})");
  REQUIRE(two);
  CHECK(two.value.created);
  CHECK(two.value.records == 2);
  CHECK(two.value.holder.lease == 42);
  const auto none = decode(R"({"succeeded": true, "responses": [{"response_range": {}}]})");
  REQUIRE(none);
  CHECK(none.value.records == 0);
  // Held by another: its holder, and no count.
  const auto held = decode(R"({"responses": [{"response_range": {"kvs": [{"value": "b3RoZXI=",
      "lease": "7", "mod_revision": "3"}]}}]})");
  REQUIRE(held);
  CHECK_FALSE(held.value.created);
  CHECK(held.value.holder.value == "other");
  CHECK_FALSE(held.value.records);
  // Hostile: a negative count, or no range at all, is not an answer.
  const auto negative =
      decode(R"({"succeeded": true, "responses": [{"response_range": {"count": "-1"}}]})");
  CHECK_FALSE(negative);
  CHECK_THAT(negative.message, Catch::Contains("a negative count"));
  const auto bare = decode(R"({"succeeded": true})");
  CHECK_FALSE(bare);
  CHECK_THAT(bare.message, Catch::Contains("without the count of the success branch"));
}

TEST_CASE("the etcd client survives hostile answers with an error each, within its deadline",
          "[net][etcd]") {
  using doorman::net::etcd_client;
  const auto get = [](etcd_client& e, steady::time_point d) { return e.get("/k", d); };
  const auto claim = [](etcd_client& e, steady::time_point d) {
    return e.put_if_absent("/k", "me", 42, d);
  };
  SECTION("well-formed answers are decoded") {
    canned_http_peer peer(
        {http_reply(200, R"({"kvs": [{"key": "L2s=", "value": "MTIzOjQ1", "mod_revision": "7",
                             "lease": "99"}]})"),
         "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" +
             std::string("2\r\n{}\r\n0\r\n\r\n"),
         http_reply(404, R"({"error": "lease not found", "message": "lease not found",
                             "code": 5})")});
    const auto found = run_etcd({peer.address()}, get);
    REQUIRE(found);
    REQUIRE(found.value);
    CHECK(found.value->value == "123:45");
    CHECK(found.value->mod_revision == 7);
    CHECK(found.value->lease == 99);
    const auto absent = run_etcd({peer.address()}, get);
    CHECK(absent);
    CHECK_FALSE(absent.value);
    const auto gone = run_etcd({peer.address()}, claim);
    CHECK_FALSE(gone);
    CHECK(gone.error == doorman::net::etcd_errc::not_found);
    CHECK(gone.grpc_code == 5);
    CHECK_THAT(gone.message, Catch::Contains("lease not found"));
  }
  SECTION("garbage, wrong types, server errors, oversized and silent peers") {
    const std::string big = http_reply(200, "{\"x\": \"" + std::string(std::size_t{2} << 20, 'a'));
    canned_http_peer peer({http_reply(200, "not json"), http_reply(200, "[1, 2]"),
                           http_reply(200, R"({"succeeded": "yes", "responses": {"a": 1}})"),
                           http_reply(500, R"({"error": "boom", "message": "boom", "code": 2})"),
                           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{}", big,
                           ""});
    CHECK_THAT(run_etcd({peer.address()}, get).message, Catch::Contains("not a JSON object"));
    CHECK_THAT(run_etcd({peer.address()}, get).message, Catch::Contains("not a JSON object"));
    const auto odd = run_etcd({peer.address()}, claim);
    CHECK(odd.error == doorman::errc::bad_answer);
    CHECK_THAT(odd.message, Catch::Contains("without the range of the failure branch"));
    CHECK_THAT(run_etcd({peer.address()}, get).message, Catch::Contains("HTTP 500: boom"));
    CHECK_THAT(run_etcd({peer.address()}, get).message, Catch::Contains("truncated"));
    CHECK_THAT(run_etcd({peer.address()}, get).message, Catch::Contains("answer longer than"));
    const auto start = steady::now();
    const auto silent = run_etcd({peer.address()}, get);
    CHECK(silent.error == doorman::errc::unreachable);  // the one endpoint failed
    CHECK_THAT(silent.message, Catch::Contains("no answer before"));
    CHECK(steady::now() - start < 3s);  // the 2 s deadline, not the peer, ended it
  }
  SECTION("a watch: a change ends it; a refusal, garbage or a stream without one is an error") {
    const std::string chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
    const auto chunk = [](const std::string& data) {
      return fmt::format("{:x}\r\n{}\r\n", data.size(), data);
    };
    const std::string created = R"({"result":{"header":{"revision":"7"},"created":true}})"
                                "\n";
    canned_http_peer peer({chunked + chunk(created) +
                               chunk(R"({"result":{"events":[{"type":"DELETE"}]}})"
                                     "\n"),
                           http_reply(400, R"({"error": "bad", "message": "bad", "code": 3})"),
                           chunked + chunk(created) + "0\r\n\r\n", chunked + chunk("nope\n"), ""});
    const auto watch = [](etcd_client& e, steady::time_point d) { return e.watch("/k", 8, d); };
    const auto changed = run_etcd({peer.address()}, watch);
    REQUIRE(changed);
    CHECK(changed.value);
    CHECK_THAT(run_etcd({peer.address()}, watch).message, Catch::Contains("not a watch answer"));
    CHECK_THAT(run_etcd({peer.address()}, watch).message,
               Catch::Contains("the stream ended without a change"));
    CHECK_THAT(run_etcd({peer.address()}, watch).message, Catch::Contains("not a watch answer"));
    const auto start = steady::now();
    const auto quiet = run_etcd({peer.address()}, watch);  // a peer that never answers
    CHECK(quiet);
    CHECK_FALSE(quiet.value);  // no change before the deadline
    CHECK(steady::now() - start < 3s);
  }
  SECTION("a failing endpoint hands over to the next") {
    canned_http_peer bad({http_reply(503, R"({"message": "unavailable"})")});
    canned_http_peer good({http_reply(200, R"({"kvs": [{"value": "b2s="}]})")});
    const auto r = run_etcd({bad.address(), "http://" + good.address()}, get);
    REQUIRE(r);
    CHECK(r.value->value == "ok");
  }
}

#ifdef DOORMAN_NODE_BINARY
// ---- high availability: a real etcd server, several doorman-node tasks per position --------

#include <doorman/client.hpp>

#include <sys/stat.h>

namespace {

// The mastership a task reports through `discovery`, or nothing when it does not answer.
std::optional<json> discover(const std::string& address) {
  line_client c(address);
  if (!c.connected()) return std::nullopt;
  if (!c.send(request_line(1, "discovery", json::object()))) return std::nullopt;
  const auto line = c.read_line(1s);
  if (!line) return std::nullopt;
  const auto j = json::parse(*line, nullptr, false);
  if (!j.contains("result")) return std::nullopt;
  return j["result"]["mastership"];
}

// Several doorman-node tasks of one position, electing through `etcd` on `key`; `args` adds
// the position's own flags (--config, --parent, --id).
struct position {
  // `endpoints`: each task's way to etcd (default: etcd's own endpoint).
  position(etcd_server& etcd, const std::string& key, int tasks, int ttl,
           const std::vector<std::string>& args, const std::vector<std::string>& endpoints = {}) {
    for (int i = 0; i < tasks; ++i) {
      const std::string log =
          etcd.dir() + "/" + key.substr(key.rfind('/') + 1) + "-task" + std::to_string(i) + ".log";
      std::filesystem::remove(log);
      std::vector<std::string> argv{DOORMAN_NODE_BINARY,
                                    "--listen",
                                    "127.0.0.1:0",
                                    "--etcd-endpoints",
                                    endpoints.empty() ? etcd.endpoint() : endpoints.at(i),
                                    "--election-key",
                                    key,
                                    "--election-ttl",
                                    std::to_string(ttl),
                                    "--minimum-refresh-interval",
                                    "0"};
      argv.insert(argv.end(), args.begin(), args.end());
      nodes.push_back(std::make_unique<process>(argv, log));
      addresses.push_back(listening_address(*nodes.back()));
    }
  }

  // The index of the one task that says it is master while every other answering task names
  // it; nothing otherwise.
  [[nodiscard]] std::optional<std::size_t> master() const {
    std::optional<std::size_t> found;
    std::vector<json> answers;
    for (std::size_t i = 0; i < addresses.size(); ++i) {
      const auto m = nodes[i] ? discover(addresses[i]) : std::nullopt;
      answers.push_back(m.value_or(json()));
      if (m && m->value("is_master", false)) {
        if (found) return std::nullopt;  // two masters
        found = i;
      }
    }
    if (!found) return std::nullopt;
    for (std::size_t i = 0; i < answers.size(); ++i) {
      if (i == *found || answers[i].is_null()) continue;
      if (answers[i].value("master", json()) != addresses[*found]) return std::nullopt;
    }
    return found;
  }

  // Waits for `master()`.
  std::size_t elected() const {
    std::optional<std::size_t> m;
    REQUIRE(eventually([&] { return (m = master()).has_value(); }));
    return *m;
  }

  [[nodiscard]] bool none_master() const {
    for (std::size_t i = 0; i < addresses.size(); ++i) {
      const auto m = nodes[i] ? discover(addresses[i]) : std::nullopt;
      if (m && m->value("is_master", false)) return false;
    }
    return true;
  }

  std::vector<std::unique_ptr<process>> nodes;
  std::vector<std::string> addresses;
};

// The root position's tasks, with the configuration `config_text` in a file.
position root_position(etcd_server& etcd, const std::string& config_text, int tasks, int ttl,
                       const std::vector<std::string>& endpoints = {}) {
  const std::string config = etcd.dir() + "/resources.json";
  std::ofstream(config) << config_text;
  return position(etcd, "/doorman/test/root", tasks, ttl, {"--config", config}, endpoints);
}

// Lease 5 s (or `lease`), refresh 0.4 s, learning mode as long as a lease.
std::string ha_config(double capacity, int lease = 5) {
  const std::string l = std::to_string(lease);
  return R"({"resources": [{"identifier_glob": "*", "capacity": )" + std::to_string(capacity) +
         R"(, "algorithm": {"kind": "FAIR_SHARE", "lease_length": )" + l +
         R"(, "refresh_interval": 0.4, "learning_mode_duration": )" + l + "}}]}";
}

doorman::client_options ha_client(std::vector<std::string> addresses) {
  doorman::client_options o;
  o.addresses = std::move(addresses);
  o.minimum_refresh_interval = doorman::seconds(0.05);
  o.call_timeout = doorman::seconds(1);
  return o;
}

// Below a root position: a client of the position and an intermediate (with a client of its
// own), both knowing every task; the client wants 30 and the intermediate's 90 of 100.
struct tree_below {
  explicit tree_below(const position& root)
      : mid("", mid_options(root)),
        direct(ha_client(root.addresses)),
        behind(ha_client({mid.address()})),
        a(direct, "db", {.wants = 30, .mode = doorman::fallback::pessimistic}),
        b(behind, "db", {.wants = 90, .mode = doorman::fallback::pessimistic}) {
    REQUIRE(eventually([&] { return a.capacity() == 30 && mid_capacity() == 70; }, 20s));
  }
  static doorman::node_options mid_options(const position& root) {
    doorman::node_options o;
    o.parents = root.addresses;
    return o;
  }
  json mid_capacity() { return status_of(mid.address(), "db")["resources"][0]["capacity"]; }

  running_node<> mid;
  doorman::client direct;
  doorman::client behind;
  doorman::rate_resource a;
  doorman::rate_resource b;
};

}  // namespace

TEST_CASE("etcd election: one master, failover on SIGKILL without over-granting", "[net][etcd]") {
  etcd_server etcd;
  constexpr int ttl = 2;
  position root = root_position(etcd, ha_config(100), 3, ttl);

  // Exactly one master; the others redirect to it and name it in discovery.
  const std::optional<std::size_t> first = root.elected();
  for (std::size_t i = 0; i < 3; ++i) {
    line_client c(root.addresses[i]);
    const auto r = c.call("get_capacity", capacity_params("probe", "other", 1));
    if (i == *first) {
      // A fresh store holds no earlier master's record: no lease can be out, so the first
      // master grants at once (no learning mode).
      CHECK(gets(r) == 1);
      CHECK(r["result"]["mastership"]["is_master"] == true);
      CHECK_THAT(root.nodes[i]->log(),
                 Catch::Contains("became master; no earlier master's record is alive in etcd"));
    } else {
      CHECK(r["result"]["resources"].empty());
      CHECK(r["result"]["mastership"]["master"] == root.addresses[*first]);
    }
  }

  // A client of the position and an intermediate (with a client of its own) know every task.
  tree_below tree(root);
  auto& a = tree.a;
  auto mid_capacity = [&] { return tree.mid_capacity(); };

  // SIGKILL the master; the client now wants more than its share, which learning mode must
  // not give it until every old lease has run out.
  const auto killed_at = steady::now();
  root.nodes[*first].reset();
  a.set_wants(80);
  std::optional<std::size_t> second;
  // Sampled all along: the most granted at once, and whether the client and the intermediate
  // kept their leases.
  double worst = 0;
  double mid_least = 100;
  bool a_leased_throughout = true;
  const auto sample = [&] {
    const double m = mid_capacity().get<double>();
    worst = std::max(worst, a.capacity() + m);
    mid_least = std::min(mid_least, m);
    a_leased_throughout = a_leased_throughout && a.leased();
  };
  REQUIRE(eventually(
      [&] {
        sample();
        return (second = root.master()).has_value();
      },
      10s));
  const double takeover = std::chrono::duration<double>(steady::now() - killed_at).count();
  CHECK(*second != *first);
  std::printf("etcd failover: a new master %.2f s after the SIGKILL (TTL %d s)\n", takeover, ttl);
  // Within the TTL plus one refresh interval, plus etcd's own lease-expiry check period
  // (500 ms) and the polls of this test.
  CHECK(takeover < ttl + 0.4 + 1.0);

  // The new master is in learning mode (the killed master's record outlives its leases): the
  // client keeps 30 however much it wants, and the sum of what is granted never exceeds the
  // capacity while the old leases run out.
  const std::string new_master = root.addresses[*second];
  CHECK(eventually([&] {
    sample();
    const auto s = status_of(new_master, "db")["resources"][0];
    return s["learning"] == true && s["clients"] == 2;
  }));
  const auto until = steady::now() + 3s;
  while (steady::now() < until) {
    sample();
    std::this_thread::sleep_for(20ms);  // sampling period
  }
  CHECK(a.capacity() == 30);
  CHECK(worst <= 100 + 1e-9);
  CHECK(a_leased_throughout);  // the failover was invisible to the client
  CHECK(mid_least == 70);      // and to the intermediate

  // After learning mode: the fair shares of the new demands, 50 and 50.
  CHECK(eventually([&] { return a.capacity() == 50 && mid_capacity() == 50; }, 10s));
  CHECK(status_of(new_master, "db")["resources"][0]["learning"] == false);
  CHECK(root.nodes[*second]->log().find("became master; learning mode starts") !=
        std::string::npos);

  // The record covers the leases of the configuration the task started with: a reload that
  // lengthens them is refused, and the old one kept.
  std::ofstream(etcd.dir() + "/resources.json") << ha_config(100, 60);
  root.nodes[*second]->signal(SIGHUP);
  CHECK(eventually([&] {
    return root.nodes[*second]->log().find(
               "rejected, keeping the old one: lease_length: 60 s is longer than the leases "
               "the election's record in etcd covers (5 s") != std::string::npos;
  }));
}

TEST_CASE("etcd election: a master stopped by SIGTERM hands over in a fraction of the TTL",
          "[net][etcd]") {
  etcd_server etcd;
  constexpr int ttl = 10;  // the default: a dead master is replaced within 10 s
  position root = root_position(etcd, ha_config(100), 3, ttl);
  const std::size_t first = root.elected();

  const auto stopped_at = steady::now();
  root.nodes[first]->signal(SIGTERM);
  std::optional<std::size_t> second;
  REQUIRE(eventually([&] { return (second = root.master()).has_value() && *second != first; },
                     std::chrono::seconds(ttl)));
  const double takeover = std::chrono::duration<double>(steady::now() - stopped_at).count();
  std::printf("etcd hand-over: a new master %.2f s after the SIGTERM (TTL %d s)\n", takeover, ttl);
  // The stopping master revokes its lease; a standby watching the key campaigns when it is
  // free: a few round trips, not the TTL (nor a round period, ttl / 5).
  CHECK(root.nodes[first]->exits_cleanly());
  INFO("the old master's log:\n"
       << root.nodes[first]->log() << "the new master's log:\n"
       << root.nodes[*second]->log());
  CHECK(takeover < 1.0);
  CHECK_THAT(root.nodes[first]->log(), Catch::Contains("etcd: lease revoked"));
  // A stop revokes the election's lease, not the record's: the leases it granted may still
  // be out, so the new master learns.
  CHECK(eventually([&] {
    return root.nodes[*second]->log().find("became master; learning mode starts") !=
           std::string::npos;
  }));
}

TEST_CASE("etcd election: an intermediate position fails over, its parent sees one child",
          "[net][etcd]") {
  etcd_server etcd;
  running_node<> root(ha_config(100));
  // Two tasks of one intermediate position, one id at the parent.
  position mid(etcd, "/doorman/test/mid", 2, 2, {"--parent", root.address(), "--id", "mid"});
  const std::size_t first = mid.elected();
  doorman::client behind(ha_client(mid.addresses));
  doorman::client direct(ha_client({root.address()}));
  doorman::rate_resource a(behind, "db", {.wants = 30, .mode = doorman::fallback::pessimistic});
  doorman::rate_resource b(direct, "db", {.wants = 90, .mode = doorman::fallback::pessimistic});
  REQUIRE(eventually([&] { return a.capacity() == 30 && b.capacity() == 70; }, 20s));

  mid.nodes[first].reset();  // SIGKILL
  double root_most = 0;
  std::size_t root_children = 0;
  bool a_leased_throughout = true;
  const auto sample = [&] {
    const auto s = status_of(root.address(), "db")["resources"][0];
    root_most = std::max(root_most, s["sum_has"].get<double>());
    root_children = std::max(root_children, s["clients"].get<std::size_t>());
    a_leased_throughout = a_leased_throughout && a.leased();
  };
  std::optional<std::size_t> second;
  REQUIRE(eventually(
      [&] {
        sample();
        return (second = mid.master()).has_value();
      },
      10s));
  CHECK(*second != first);
  // The client reaches the new master, which learns its lease; then nothing changes.
  CHECK(eventually([&] {
    sample();
    return status_of(mid.addresses[*second], "db")["resources"][0]["clients"] == 1;
  }));
  const auto until = steady::now() + 2s;
  while (steady::now() < until) {
    sample();
    std::this_thread::sleep_for(20ms);  // sampling period
  }
  INFO("new master: " << status_of(mid.addresses[*second], "db").dump());
  INFO("root: " << status_of(root.address(), "db").dump());
  INFO("new master's log: " << mid.nodes[*second]->log());
  CHECK(a_leased_throughout);
  CHECK(a.capacity() == 30);
  CHECK(b.capacity() == 70);
  CHECK(root_children == 2);  // the intermediate and the direct client: never a third
  CHECK(root_most <= 100 + 1e-9);
}

TEST_CASE(
    "etcd election: a master paused past its TTL grants nothing after SIGCONT, and the tree moves "
    "to the new master meanwhile",
    "[net][etcd]") {
  etcd_server etcd;
  constexpr int ttl = 2;
  // Leases by the documented rule: 1.5 x TTL + refresh interval + call timeout + 1 s = 5.4 s.
  position root = root_position(etcd, ha_config(100, 6), 2, ttl);
  const std::size_t first = root.elected();
  const std::size_t other = 1 - first;
  tree_below tree(root);  // its intermediate's calls time out after 1 s (running_node)
  auto& a = tree.a;
  auto mid_capacity = [&] { return tree.mid_capacity(); };
  bool a_leased_throughout = true;  // a client of the roots, by the rule: never without

  // A connection opened before the pause; its request waits in the paused process's socket.
  line_client queued(root.addresses[first]);
  REQUIRE(queued.connected());
  root.nodes[first]->signal(SIGSTOP);
  const auto paused_at = steady::now();
  REQUIRE(queued.send(request_line(7, "get_capacity", capacity_params("late", "db", 50))));

  // The other task wins once the paused one's lease has expired at etcd.
  REQUIRE(eventually(
      [&] {
        a_leased_throughout = a_leased_throughout && a.leased();
        const auto m = discover(root.addresses[other]);
        return m && m->value("is_master", false);
      },
      15s));
  const double takeover = std::chrono::duration<double>(steady::now() - paused_at).count();
  // The client and the intermediate leave the hung task for the new master while it stays
  // paused: both are known there within a call timeout and a refresh interval or so.
  const auto elected_at = steady::now();
  const std::string new_master = root.addresses[other];
  REQUIRE(eventually(
      [&] {
        a_leased_throughout = a_leased_throughout && a.leased();
        return status_of(new_master, "db")["resources"][0]["clients"] == 2;
      },
      10s));
  CHECK(a_leased_throughout);
  const double moved = std::chrono::duration<double>(steady::now() - elected_at).count();
  CHECK(eventually([&] { return a.leased() && mid_capacity() > 0; }, 10s));
  std::printf("pause: a new master %.2f s after SIGSTOP (TTL %d s); the tree moved %.2f s later\n",
              takeover, ttl, moved);
  CHECK(moved < 1.0 + 0.4 + 1.0);  // call timeout + refresh interval + the test's polls

  // Resumed long after its term: the queued request is answered by a non-master, which grants
  // nothing (it names the new master only if the election told it first).
  const std::size_t paused_log = root.nodes[first]->log().size();
  root.nodes[first]->signal(SIGCONT);
  const auto answer = queued.read_line(5s);
  REQUIRE(answer);
  const json j = json::parse(*answer);
  INFO(*answer);
  CHECK(j["result"]["resources"].empty());
  CHECK(j["result"]["mastership"]["is_master"] == false);
  // It said it stepped down, by whichever the resumed process ran first: the queued call
  // (the term had ended: fenced) or the election's report that it lost (no longer master).
  const auto stepped_down = [&] {
    const std::string since = root.nodes[first]->log().substr(paused_log);
    return since.find("stepping down before answering") != std::string::npos ||
           since.find("not master; redirecting") != std::string::npos;
  };
  CHECK(eventually(stepped_down, 5s));
  // And the position settles on the new master.
  CHECK(eventually([&] { return root.master() == other; }, 10s));
}

TEST_CASE(
    "etcd election: a master cut from etcd steps down, and the tree leaves it for the new master",
    "[net][etcd]") {
  // The chaos trial's fault: only the master's link to etcd is cut (its clients still reach
  // it), for 10 s. It steps down at the end of its term and answers that it knows no master;
  // the client and the intermediate must find the task that wins, not wait for the heal.
  etcd_server etcd;
  constexpr int ttl = 2;
  link_proxy link0(etcd.endpoint()), link1(etcd.endpoint());
  position root = root_position(etcd, ha_config(100), 2, ttl, {link0.address(), link1.address()});
  const std::size_t first = root.elected();
  tree_below tree(root);
  auto& a = tree.a;

  (first == 0 ? link0 : link1).cut();
  const auto cut_at = steady::now();
  double worst = 0;
  double a_gap = 0, mid_gap = 0;  // the longest time without a lease
  std::optional<steady::time_point> a_lost, mid_lost;
  const auto gap = [](std::optional<steady::time_point>& lost, bool held, double& longest) {
    if (!held && !lost) lost = steady::now();
    if (held && lost) {
      longest = std::max(longest, std::chrono::duration<double>(steady::now() - *lost).count());
      lost.reset();
    }
  };
  while (steady::now() < cut_at + 10s) {
    const double m = tree.mid_capacity().get<double>();
    worst = std::max(worst, a.capacity() + m);
    gap(a_lost, a.leased(), a_gap);
    gap(mid_lost, m > 0, mid_gap);
    std::this_thread::sleep_for(20ms);  // sampling period
  }
  gap(a_lost, true, a_gap);
  gap(mid_lost, true, mid_gap);
  const auto other = discover(root.addresses[1 - first]);  // the cut task knows no master
  std::printf("etcd cut: longest time without a lease %.2f s (client), %.2f s (intermediate)\n",
              a_gap, mid_gap);
  INFO("the cut master's log:\n" << root.nodes[first]->log());
  CHECK(root.nodes[first]->wait_for("stepping down", 1s));
  CHECK((other && other->value("is_master", false)));  // elected while the cut lasts
  CHECK(worst <= 100 + 1e-9);
  // At most a call timeout (1 s) and a refresh interval (0.4 s), plus the test's polls.
  CHECK(a_gap <= 1 + 0.4 + 0.2);
  CHECK(mid_gap <= 1 + 0.4 + 0.2);
  (first == 0 ? link0 : link1).heal();
  CHECK(eventually([&] { return root.master() == 1 - first; }, 10s));
}

TEST_CASE("etcd election: a short etcd outage keeps the master, a long one steps it down",
          "[net][etcd]") {
  etcd_server etcd;
  constexpr int ttl = 3;
  position root = root_position(etcd, ha_config(100), 2, ttl);
  const std::optional<std::size_t> first = root.elected();
  doorman::client cl(ha_client(root.addresses));
  doorman::rate_resource r(cl, "db", {.wants = 40, .mode = doorman::fallback::optimistic});
  REQUIRE(eventually([&] { return r.leased() && r.capacity() == 40; }));

  // Frozen for 1.5 s (half the TTL): renewals fail and are retried; the master stays.
  etcd.pause();
  const auto until = steady::now() + 1500ms;
  bool kept = true;
  while (steady::now() < until) {
    const auto m = discover(root.addresses[*first]);
    kept = kept && m && m->value("is_master", false);
    std::this_thread::sleep_for(20ms);  // sampling period
  }
  etcd.resume();
  CHECK(kept);
  CHECK(root.master() == first);
  CHECK(root.nodes[*first]->wait_for("renewal failed", 3s));
  CHECK_FALSE(root.nodes[*first]->log().find("stepping down") != std::string::npos);

  // Gone for longer than the TTL: the master steps down before its lease could expire, no
  // task grants, and the client falls back once its lease has run out.
  r.set_wants(45);
  etcd.kill();
  const auto killed_at = steady::now();
  REQUIRE(root.nodes[*first]->wait_for("stepping down", 10s));
  CHECK(std::chrono::duration<double>(steady::now() - killed_at).count() < ttl + 0.5);
  CHECK(root.none_master());
  line_client c(root.addresses[*first]);
  CHECK(c.call("get_capacity", capacity_params("probe", "db", 1))["result"]["resources"].empty());
  CHECK(eventually([&] { return !r.leased(); }, 10s));
  CHECK(r.capacity() == 45);  // optimistic: its wants

  // etcd back: a master again, and the client is granted again.
  etcd.start();
  CHECK(eventually([&] { return root.master().has_value(); }, 15s));
  CHECK(eventually([&] { return r.leased() && r.capacity() == 45; }, 15s));
}

TEST_CASE("etcd:KEY configuration: changes applied, a bad one rejected, a missing key refused",
          "[net][etcd]") {
  etcd_server etcd;
  const std::string log = etcd.dir() + "/node.log";
  check_refused_start({DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--config",
                       "etcd:/doorman/cfg", "--etcd-endpoints", etcd.endpoint()},
                      log, "configuration etcd:/doorman/cfg: no such key");
  etcd.put("/doorman/cfg", fast_config(100));
  process node({DOORMAN_NODE_BINARY, "--listen", "127.0.0.1:0", "--config", "etcd:/doorman/cfg",
                "--etcd-endpoints", "http://" + etcd.endpoint()},
               log);
  const std::string address = listening_address(node);
  REQUIRE(eventually([&] {  // it also elects itself (on the default key)
    const auto m = discover(address);
    return m && m->value("is_master", false);
  }));
  line_client a(address);
  CHECK(eventually(
      [&] { return gets(a.call("get_capacity", capacity_params("a", "db", 150))) == 100; }));

  etcd.put("/doorman/cfg", fast_config(60));
  REQUIRE(node.wait_for("accepted", 5s));
  CHECK(capacity_at(address, "db") == 60);
  CHECK(eventually(
      [&] { return gets(a.call("get_capacity", capacity_params("a", "db", 150))) == 60; }));

  check_bad_config_kept(node, address, 60,
                        [&](const std::string& text) { etcd.put("/doorman/cfg", text); });
  CHECK(gets(a.call("get_capacity", capacity_params("a", "db", 150))) == 60);

  node.signal(SIGTERM);
  CHECK(node.exits_cleanly());
}
#endif

TEST_CASE("the etcd client watches a key of a real etcd: a change ends the wait at once",
          "[net][etcd]") {
  etcd_server etcd;
  asio::io_context io;
  doorman::net::etcd_client client(io.get_executor(), {etcd.endpoint()});
  doorman::net::etcd_client writer(io.get_executor(), {etcd.endpoint()});
  const auto outcome = run_coroutine_test(io, [&]() -> asio::awaitable<std::string> {
    const auto c = co_await client.put_if_absent("/w", "a", 0, steady::now() + 3s);
    if (!c || c.value.revision <= 0) co_return "claim: " + c.message;
    // Nothing changes: the wait lasts to its deadline and says so.
    auto start = steady::now();
    const auto quiet = co_await client.watch("/w", c.value.revision + 1, start + 300ms);
    if (!quiet || quiet.value || steady::now() - start < 250ms) co_return "quiet: " + quiet.message;
    // A change made (on this thread, by another client) once the watch is under way ends it
    // long before its deadline.
    start = steady::now();
    const auto moved =
        co_await client.watch("/w", c.value.revision + 1, start + 10s, [&](std::function<void()>) {
          asio::co_spawn(io, writer.put("/w", "b", steady::now() + 5s), asio::detached);
        });
    if (!moved || !moved.value) co_return "moved: " + moved.message;
    if (steady::now() - start > 5s) co_return "moved late";
    // A change before the watch began is seen too (it starts from the claim's revision).
    const auto replayed = co_await client.watch("/w", c.value.revision + 1, steady::now() + 10s);
    if (!replayed || !replayed.value) co_return "replayed: " + replayed.message;
    co_return "ok";
  });
  CHECK(outcome == "ok");
}

TEST_CASE("a put over a revision goes through only if the key is still at it, on a real etcd",
          "[net][etcd]") {
  etcd_server etcd;
  asio::io_context io;
  doorman::net::etcd_client client(io.get_executor(), {etcd.endpoint()});
  const auto outcome = run_coroutine_test(io, [&]() -> asio::awaitable<std::string> {
    const auto d = steady::now() + 5s;
    const auto first = co_await client.put_if_revision("/m", "1", 0, d);  // 0: absent
    if (!first || !first.value.created) co_return "first: " + first.message;
    const auto next = co_await client.put_if_revision("/m", "2", first.value.revision, d);
    if (!next || !next.value.created) co_return "next: " + next.message;
    // A writer still at the first revision is refused, and told the key as it is.
    const auto late = co_await client.put_if_revision("/m", "0", first.value.revision, d);
    if (!late || late.value.created) co_return "late went through";
    if (late.value.holder.value != "2" || late.value.holder.mod_revision != next.value.revision) {
      co_return "late: told " + late.value.holder.value;
    }
    const auto absent = co_await client.put_if_revision("/m", "0", 0, d);
    if (!absent || absent.value.created) co_return "a put as if absent went through";
    const auto now = co_await client.get("/m", d);
    co_return now&& now.value&& now.value->value == "2" ? "ok" : "the key changed";
  });
  CHECK(outcome == "ok");
}

TEST_CASE("a budget mark's stored value is read as untrusted, naming the field at fault",
          "[net][etcd][budget]") {
  const auto ok = doorman::read_budget_mark(R"({"window": 1764374400, "mark": 1500.5})");
  REQUIRE(std::holds_alternative<doorman::stored_budget_mark>(ok));
  CHECK(std::get<doorman::stored_budget_mark>(ok).window == 1764374400);
  CHECK(std::get<doorman::stored_budget_mark>(ok).mark == 1500.5);
  const auto why = [](std::string_view text) {
    const auto r = doorman::read_budget_mark(text);
    return std::holds_alternative<std::string>(r) ? std::get<std::string>(r) : "read";
  };
  CHECK(why("") == "not a JSON object");
  CHECK(why("[1]") == "not a JSON object");
  CHECK(why(R"({"mark": 1})") == "window: must be an integer");
  CHECK(why(R"({"window": 1.5, "mark": 1})") == "window: must be an integer");
  CHECK(why(R"({"window": 1})") == "mark: must be a number");
  CHECK(why(R"({"window": 1, "mark": "9"})") == "mark: must be a number");
  CHECK(why(R"({"window": 1, "mark": -1})") == "mark: must be from 0 to 1e15");
  CHECK(why(R"({"window": 1, "mark": 1e300})") == "mark: must be from 0 to 1e15");
}

TEST_CASE("the etcd client speaks TLS to https:// endpoints, with a client certificate",
          "[etcd][tls]") {
  const auto& certs = test_certificates::get();
  etcd_server etcd(certs.dir());
  const auto put_get = [&](const doorman::net::tls_options& tls) {
    asio::io_context io;
    doorman::net::etcd_client client(io.get_executor(), {"https://" + etcd.endpoint()}, tls);
    return run_coroutine_test(io, [&]() -> asio::awaitable<std::string> {
      const auto put = co_await client.put("/doorman/tls", "over TLS", steady::now() + 3s);
      if (put.error) co_return "put: " + put.message;
      const auto got = co_await client.get("/doorman/tls", steady::now() + 3s);
      if (got.error) co_return "get: " + got.message;
      co_return got.value ? got.value->value : std::string("nothing");
    });
  };
  CHECK(put_get(certs.side("client-a")) == "over TLS");
  // Without a client certificate, or trusting another CA, etcd is out of reach.
  CHECK_THAT(put_get(certs.side("")), Catch::StartsWith("put: "));
  auto other = certs.side("client-a");
  other.ca_file = certs("other-ca.pem");
  const auto refused = put_get(other);
  CHECK_THAT(refused, Catch::Contains("certificate verify failed"));
}
