// The JSON-RPC server: pipelining, notifications, hostile peers, limits.

#include "line_client.hpp"
#include "support.hpp"

using namespace doorman_test;  // NOLINT: the tests' own helpers (support.hpp, line_client.hpp)

// ---- root only -----------------------------------------------------------------------------

TEST_CASE("a root answers get_capacity, discovery and errors over TCP", "[net][node]") {
  running_node root(fast_config(100));
  line_client c(root.address());
  REQUIRE(c.connected());
  const json r = c.call("get_capacity", capacity_params("a", "db", 40));
  CHECK(gets(r) == 40);
  CHECK(r["result"]["mastership"]["is_master"] == true);
  CHECK(r["result"]["mastership"]["master"] == root.address());
  CHECK(c.call("discovery", json::object())["result"]["mastership"]["master"] == root.address());
  const json bad = c.call("get_capacity", capacity_params("a", "db", -1));
  CHECK(bad["error"]["code"] == -32602);
  CHECK_THAT(bad["error"]["message"].get<std::string>(),
             Catch::Contains("params.resources[0].wants"));
  CHECK(c.call("nope", json::object())["error"]["code"] == -32601);
  const json st = c.call("status", json::object());
  CHECK(st["result"]["role"] == "root");
  CHECK(st["result"]["level"] == 0);
  CHECK(st["result"]["resources"][0]["sum_has"] == 40);
}

TEST_CASE("pipelined requests are all answered, matched by id, notifications are not",
          "[net][node]") {
  running_node root(fast_config(1000));
  line_client c(root.address());
  std::string batch;
  for (int i = 0; i < 200; ++i) {
    batch += request_line(i, "get_capacity", capacity_params("c" + std::to_string(i), "db", 1));
    if (i % 50 == 0) {  // a notification: no answer
      batch += R"({"jsonrpc":"2.0","method":"discovery","params":{}})"
               "\n";
    }
  }
  REQUIRE(c.send(batch));
  std::vector<bool> seen(200, false);
  for (int i = 0; i < 200; ++i) {
    const auto line = c.read_line();
    REQUIRE(line);
    const json j = json::parse(*line);
    REQUIRE(j.contains("result"));
    seen[j["id"].get<std::size_t>()] = true;
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](bool b) { return b; }));
  CHECK_FALSE(c.read_line(200ms));  // nothing more: the notifications got no answer
}

TEST_CASE("answers a peer does not read at once are written whole and in order when it does",
          "[net][node]") {
  // The node hands answers straight to the socket; what the socket cannot take (a peer that
  // pipelines without reading) is left to a writer. Fill the socket, then read everything.
  running_node root(fast_config(1000));
  line_client c(root.address());
  std::string chunk;
  for (int i = 0; i < 100; ++i)
    chunk += request_line(i, "get_capacity", capacity_params("c" + std::to_string(i), "db", 1));
  REQUIRE(c.flood_until_stalled(chunk, 300ms));  // the node stopped reading: its writes stalled
  int answers = 0;
  while (const auto line = c.read_line(2s)) {
    const json j = json::parse(*line);
    REQUIRE(j.contains("result"));
    REQUIRE(j["id"] == answers % 100);  // every answer whole, none lost or reordered
    ++answers;
  }
  CHECK(answers > 1000);  // more than the node's in-flight limit: it read again as answers left
}

TEST_CASE("a single-threaded node works on its executor, without a strand", "[net][node]") {
  doorman::node_options o;
  o.single_threaded = true;  // running_node runs its io_context on one thread
  running_node root(fast_config(100), o);
  line_client c(root.address());
  CHECK(gets(c.call("get_capacity", capacity_params("a", "db", 30))) == 30);
  root.node().reload(doorman::engine::parse_config(fast_config(10)));  // posted from this thread
  CHECK(gets(c.call("get_capacity", capacity_params("a", "db", 30))) <= 10);  // applied, in order
}

// ---- hostile peers ----------------------------------------------------------------------

TEST_CASE("hostile peers get errors or are cut off, a good client keeps being answered",
          "[net][hostile]") {
  // Built once, before any connection exists: under a sanitizer building it takes long enough
  // to come near the node's idle timeout.
  static const std::string greedy_batch = [] {
    std::string batch;
    for (int i = 0; i < 10000; ++i) {
      batch += request_line(i, "get_capacity", capacity_params("g" + std::to_string(i), "db", 0));
    }
    return batch;
  }();
  doorman::node_options o;
  o.server.max_message_bytes = 4096;
  o.server.max_connections = 600;
  // Long enough that no section's good or waiting connections idle out on a slow (sanitized,
  // loaded) run; short enough for the idle-timeout section.
  o.server.idle_timeout = doorman::seconds(3);
  o.server.max_in_flight = 64;
  running_node root(fast_config(100), o);
  line_client good(root.address());
  REQUIRE(good.connected());
  auto good_answers = [&] {
    const auto start = steady::now();
    const json r = good.call("get_capacity", capacity_params("good", "db", 1));
    const auto took = steady::now() - start;
    CHECK(gets(r) == 1);
    CHECK(took < 500ms);
  };

  SECTION("not JSON, or JSON that is not an object") {
    line_client c(root.address());
    REQUIRE(c.send("this is not json\n[1,2]\n42\n{\"jsonrpc\":\"2.0\",\"id\":7}\n"));
    const json e1 = json::parse(*c.read_line());
    CHECK(e1["error"]["code"] == -32700);
    CHECK(e1["id"].is_null());
    CHECK(json::parse(*c.read_line())["error"]["code"] == -32600);
    CHECK(json::parse(*c.read_line())["error"]["code"] == -32600);
    const json e4 = json::parse(*c.read_line());
    CHECK(e4["error"]["code"] == -32600);
    CHECK(e4["id"] == 7);
    good_answers();
  }
  SECTION("a line over the limit is answered with an error and the connection is closed") {
    line_client c(root.address());
    REQUIRE(c.send(std::string(5000, 'x')));  // no newline yet: already too long
    const auto line = c.read_line();
    REQUIRE(line);
    CHECK(json::parse(*line)["error"]["code"] == -32600);
    CHECK_THAT(*line, Catch::Contains("max_message_bytes"));
    CHECK(c.closed_by_peer());
    good_answers();
  }
  SECTION("half a line, then silence: closed after the idle timeout") {
    line_client c(root.address());
    REQUIRE(c.send(R"({"jsonrpc":"2.0","id":1,"meth)"));
    good_answers();
    const auto silent_since = steady::now();
    CHECK(c.closed_by_peer(10s));
    CHECK(steady::now() - silent_since >= 2s);  // not before the idle timeout (3 s)
    // The good client was idle as long, so it was closed too: it reconnects.
    good.shutdown();
    line_client again(root.address());
    const json r = again.call("get_capacity", capacity_params("good", "db", 1));
    CHECK(gets(r) == 1);
  }
  SECTION("1 000 connections at once: the ones over the limit are refused") {
    std::vector<std::unique_ptr<line_client>> many;
    for (int i = 0; i < 1000; ++i)
      many.push_back(std::make_unique<line_client>(root.address()));
    good_answers();
    // Every connection either works or was told why it was refused.
    int refused = 0;
    for (auto& c : many) {
      REQUIRE(c->send(R"({"jsonrpc":"2.0","id":1,"method":"discovery","params":{}})"
                      "\n"));
      const auto line = c->read_line(5s);
      REQUIRE(line);
      const json j = json::parse(*line);
      if (j.contains("error")) {
        CHECK_THAT(j["error"]["message"].get<std::string>(), Catch::Contains("too many"));
        ++refused;
      }
    }
    CHECK(refused >= 1000 - 600);
    CHECK(root.node().server().refused() >= static_cast<std::size_t>(refused));
    many.clear();
    good_answers();
  }
  SECTION("10 000 pipelined requests never read: only that peer stalls") {
    auto greedy = std::make_unique<line_client>(root.address());
    // Send from another thread: the node stops reading this peer, so the send blocks.
    std::thread sender([&] { greedy->send(greedy_batch); });
    // Whatever a check below does, the sender is unblocked and joined.
    struct joiner {
      line_client& peer;
      std::thread& thread;
      ~joiner() {
        peer.shutdown();  // the sender unblocks; the node sees the peer go
        thread.join();
      }
    };
    {
      joiner guard{*greedy, sender};
      for (int i = 0; i < 20; ++i)
        good_answers();
    }
    greedy.reset();
    good_answers();
  }
}
