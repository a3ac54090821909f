// Tests of the protocol layer: codecs, JSON-RPC envelope, and the line dispatcher against a
// real engine. No sockets: lines in, lines out.

#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <doorman/core.hpp>
#include <doorman/protocol.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using doorman::manual_clock;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

using engine_t = doorman::basic_engine<manual_clock>;

struct node {
  manual_clock clock;
  engine_t engine{engine_t::parse_config(R"({"resources": [
    {"identifier_glob": "*", "capacity": 100,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 60, "refresh_interval": 16,
                   "learning_mode_duration": 0}}]})")};
  doorman::node_identity identity{"127.0.0.1:7700", "root", 0, std::nullopt};

  node() { engine.set_mastership(true, "127.0.0.1:7700", clock.now()); }

  // Sends a line, expects an answer, returns it parsed.
  json call(const std::string& line) {
    auto reply = doorman::handle_line(engine, line, clock.now(), identity);
    REQUIRE(reply);
    CHECK(reply->find('\n') == std::string::npos);  // one line, framing adds the newline
    auto j = json::parse(*reply);
    CHECK(j["jsonrpc"] == "2.0");
    return j;
  }

  // The error message of a request expected to fail with `code`.
  std::string error(const std::string& line, int code = -32602) {
    auto j = call(line);
    REQUIRE(j.contains("error"));
    CHECK(j["error"]["code"] == code);
    CHECK_FALSE(j.contains("result"));
    return j["error"]["message"].get<std::string>();
  }

  // A get_capacity request line with the given params.
  static std::string get_capacity(const std::string& params) {
    return R"({"jsonrpc":"2.0","id":1,"method":"get_capacity","params":)" + params + "}";
  }
};

}  // namespace

TEST_CASE("messages round-trip through JSON", "[protocol]") {
  doorman::capacity_request req{
      "client-1",
      {{"db", 2, 12.5, doorman::lease_info{10, 30.5, 16}}, {"cache", 0, 3, std::nullopt}}};
  doorman::capacity_request back;
  REQUIRE_FALSE(doorman::decode(json(req), back));
  CHECK(back.client_id == "client-1");
  REQUIRE(back.resources.size() == 2);
  CHECK(back.resources[0].priority == 2);
  CHECK(back.resources[0].wants == 12.5);
  CHECK(back.resources[0].has == doorman::lease_info{10, 30.5, 16});
  CHECK_FALSE(back.resources[1].has);

  doorman::server_capacity_request sreq{"leaf-1",
                                        {{"db", std::nullopt, 7, {{0, 3, 40}, {1, 1, 5}}}}};
  auto sback = json(sreq).get<doorman::server_capacity_request>();  // from_json, throwing form
  REQUIRE(sback.resources.size() == 1);
  CHECK(sback.resources[0].outstanding == 7);
  CHECK(sback.resources[0].wants.size() == 2);
  CHECK(sback.resources[0].wants[0].num_clients == 3);

  doorman::capacity_response resp{{{"db", {12.5, 59.98, 16}, 25}}, {true, "10.0.0.7:7700"}};
  const json wire = resp;
  CHECK(wire["resources"][0]["gets"] ==
        json::parse(R"({"capacity": 12.5, "expires_in": 59.98, "refresh_interval": 16})"));
  CHECK(wire["mastership"] == json::parse(R"({"is_master": true, "master": "10.0.0.7:7700"})"));
  doorman::capacity_response rback;
  REQUIRE_FALSE(doorman::decode(wire, rback));
  CHECK(rback.resources[0].gets == resp.resources[0].gets);
  CHECK(rback.mastership == resp.mastership);

  CHECK_THROWS_AS(json::parse(R"({"client_id": 3})").get<doorman::capacity_request>(),
                  doorman::protocol_error);
}

namespace {

// What the hot path writes for `v` against what the DOM writes, and what decode reads back.
template <class Message>
void check_one_description(const Message& v) {
  std::string hot;
  doorman::detail::write_fields(hot, v);
  CHECK(hot == doorman::to_line(json(v)));
  if constexpr (requires(Message & m) { doorman::decode(json(v), m); }) {
    Message back;
    REQUIRE_FALSE(doorman::decode(json(v), back));
    CHECK(json(back) == json(v));
  }
}

}  // namespace

TEST_CASE(
    "each described message: the hot writer writes what to_json writes, decode reads it "
    "back",
    "[protocol][hot]") {
  const doorman::algorithm_config alg{"FAIR_SHARE", doorman::seconds(60), doorman::seconds(16),
                                      doorman::seconds(30), json{{"x", 1}}};
  check_one_description(doorman::lease_info{1.5, -0.25, 16});
  check_one_description(doorman::mastership_info{false, std::nullopt});  // "master": null
  check_one_description(doorman::mastership_info{true, "10.0.0.7:7700"});
  check_one_description(doorman::capacity_request{
      "c\"1", {{"db", 2, 12.5, doorman::lease_info{10, 30.5, 16}}, {"x", 0, 3, std::nullopt}}});
  check_one_description(doorman::server_capacity_request{
      "leaf", {{"db", std::nullopt, 7, {{0, 3, 40}, {1, 1, 1e-7}}}, {"e", {}, 0, {}}}});
  check_one_description(doorman::capacity_response{{{"db", {12.5, 59.98, 16}, -1}}, {}});
  check_one_description(doorman::capacity_response{{}, {true, "m:1"}});
  check_one_description(
      doorman::server_capacity_response{{{"db", {40, 59, 8}, 10, alg}}, {true, "root:7700"}});
  check_one_description(doorman::discovery_response{{true, "m:1"}});
  check_one_description(doorman::release_response{{false, "m:1"}});
  check_one_description(doorman::release_request{"c", {"db", "x\"y"}});
  check_one_description(doorman::status_request{});
  check_one_description(doorman::status_request{"db"});
  doorman::status_response status;
  status.mastership = {true, "m:1"};
  status.resources = {{"db", 100, 40, 55.5, 2, 3, true, "FAIR_SHARE"},
                      {"e", -1, 0, 0, 0, 0, false, ""}};
  check_one_description(status);
  CHECK_FALSE(json(status).contains("leases"));  // an optional list left empty is left out
  status.leases = {{"c1", {40, 59, 16}, 55.5, 3, true, 7, {{0, 20, 2}, {1, 35.5, 1}}}};
  status.lease_count = 12;
  check_one_description(status);
  CHECK(json(status)["leases"][0]["bands"][1] ==
        json::parse(R"({"priority": 1, "num_clients": 1, "wants": 35.5})"));
  // The required fields, as a mask of their positions in the description.
  STATIC_REQUIRE(doorman::detail::required_fields<doorman::resource_request>() == 0b0101);
  STATIC_REQUIRE(doorman::detail::required_fields<doorman::priority_band>() == 0b110);
  STATIC_REQUIRE(doorman::detail::fields_by_name<doorman::server_resource_grant>() ==
                 std::array<std::size_t, 5>{3, 4, 1, 0, 2});
}

TEST_CASE("status and release messages are read from their description, bounds included",
          "[protocol]") {
  const auto status_error = [](json result) {
    doorman::status_response out;
    const auto e = doorman::decode(result, out);
    return e ? e->message : std::string("none");
  };
  const json good = {{"mastership", {{"is_master", true}}},
                     {"resources", {{{"resource_id", "db"}, {"capacity", 5}}}},
                     {"leases", {{{"client_id", "c"}, {"wants", 3}, {"bands", json::array()}}}},
                     {"lease_count", 1}};
  CHECK(status_error(good) == "none");
  const auto with = [&](const char* pointer, json v) {
    json bad = good;
    bad[json::json_pointer(pointer)] = std::move(v);
    return status_error(bad);
  };
  CHECK(with("/resources/0/capacity", -2) ==
        "result.resources[0].capacity: must be between -1 and 1e15");
  CHECK(with("/resources/0/clients", 1.5) == "result.resources[0].clients: must be an integer");
  CHECK(with("/leases/0/wants", 1e16) == "result.leases[0].wants: must be between 0 and 1e15");
  CHECK(with("/leases/0/bands", json::array({{{"num_clients", -1}}})) ==
        "result.leases[0].bands[0].num_clients: must be between 0 and 1e15");
  CHECK(with("/lease_count", -1) == "result.lease_count: must be between 0 and 1e15");
  CHECK(with("/leases", 3) == "result.leases: must be an array");

  doorman::release_request r;
  auto e = doorman::decode(json::parse(R"({"client_id": "c", "resources": ["a", 3]})"), r);
  REQUIRE(e);
  CHECK(e->message == "params.resources[1]: must be a string");
  e = doorman::decode(json::parse(R"({"client_id": "c"})"), r);
  REQUIRE(e);
  CHECK_THAT(e->message, Contains("params.resources"));
  doorman::status_request s;
  CHECK_FALSE(doorman::decode(json(nullptr), s));
  e = doorman::decode(json::parse(R"({"resource_id": 7})"), s);
  REQUIRE(e);
  CHECK(e->message == "params.resource_id: must be a string");
}

TEST_CASE("a server grant carries its algorithm, which is checked when decoded", "[protocol]") {
  doorman::algorithm_config alg{"FAIR_SHARE", doorman::seconds(60), doorman::seconds(16),
                                doorman::seconds(30), json{{"x", 1}}};
  doorman::server_capacity_response resp{{{"db", {40, 59, 8}, 10, alg}}, {true, "root:7700"}};
  doorman::server_capacity_response back;
  REQUIRE_FALSE(doorman::decode(json(resp), back));
  REQUIRE(back.resources.size() == 1);
  CHECK(back.resources[0].gets == resp.resources[0].gets);
  CHECK(back.resources[0].safe_capacity == 10);
  CHECK(back.resources[0].algorithm == alg);
  CHECK(back.mastership == resp.mastership);

  json bad = resp;
  bad["resources"][0]["algorithm"]["refresh_interval"] = 90;  // longer than the lease
  auto err = doorman::decode(bad, back);
  REQUIRE(err);
  // The configuration's rule and message, read by the same code.
  CHECK(err->message == "result.resources[0].algorithm.lease_length: must be >= refresh_interval");
  bad["resources"][0]["algorithm"]["refresh_interval"] = 0.01;
  err = doorman::decode(bad, back);
  REQUIRE(err);
  CHECK(err->message ==
        "result.resources[0].algorithm.refresh_interval: must be between 0.1 and 1e6 seconds");
  bad = resp;
  bad["resources"][0]["algorithm"].erase("kind");
  err = doorman::decode(bad, back);
  REQUIRE(err);
  CHECK_THAT(err->message, Contains("result.resources[0].algorithm.kind"));
  bad = resp;
  bad["resources"][0]["gets"]["capacity"] = "lots";
  err = doorman::decode(bad, back);
  REQUIRE(err);
  CHECK_THAT(err->message, Contains("result.resources[0].gets.capacity"));
}

TEST_CASE("a get_capacity exchange over the line dispatcher", "[protocol]") {
  node n;
  auto j = n.call(node::get_capacity(
      R"({"client_id": "c1", "resources": [{"resource_id": "db", "wants": 30}]})"));
  CHECK(j["id"] == 1);
  CHECK(j["result"]["resources"][0]["resource_id"] == "db");
  CHECK(j["result"]["resources"][0]["gets"] ==
        json::parse(R"({"capacity": 30, "expires_in": 60, "refresh_interval": 16})"));
  CHECK(j["result"]["resources"][0]["safe_capacity"] == 100);
  CHECK(j["result"]["mastership"]["is_master"] == true);

  SECTION("string ids and pipelined requests keep their ids") {
    auto a = n.call(R"({"jsonrpc":"2.0","id":"a-7","method":"discovery"})");
    CHECK(a["id"] == "a-7");
    CHECK(a["result"]["mastership"]["master"] == "127.0.0.1:7700");
  }
  SECTION("server capacity carries the algorithm") {
    auto s = n.call(R"({"jsonrpc":"2.0","id":2,"method":"get_server_capacity","params":
      {"server_id": "leaf", "resources": [{"resource_id": "db", "outstanding": 0,
       "wants": [{"priority": 0, "num_clients": 3, "wants": 90}]}]}})");
    CHECK(s["result"]["resources"][0]["gets"]["capacity"] == 70);  // 100 - c1's 30
    CHECK(s["result"]["resources"][0]["algorithm"]["kind"] == "FAIR_SHARE");
    CHECK(s["result"]["resources"][0]["algorithm"]["lease_length"] == 60);
  }
  SECTION("release, then status") {
    auto r = n.call(R"({"jsonrpc":"2.0","id":3,"method":"release_capacity","params":
      {"client_id": "c1", "resources": ["db"]}})");
    CHECK(r["result"]["mastership"]["is_master"] == true);
    auto st = n.call(R"({"jsonrpc":"2.0","id":4,"method":"status","params":{}})");
    CHECK(st["result"]["id"] == "127.0.0.1:7700");
    CHECK(st["result"]["role"] == "root");
    CHECK(st["result"]["level"] == 0);
    CHECK(st["result"]["master"] == "127.0.0.1:7700");
    CHECK(st["result"]["resources"].empty());  // released: no state left
  }
  SECTION("status of one resource lists its leases") {
    auto st = n.call(R"({"jsonrpc":"2.0","id":5,"method":"status","params":{"resource_id":"db"}})");
    REQUIRE(st["result"]["leases"].size() == 1);
    CHECK(st["result"]["leases"][0]["client_id"] == "c1");
    CHECK(st["result"]["resources"][0]["sum_has"] == 30);
  }
}

namespace {

// A guard that refuses every call and counts what it was asked.
struct refusing_guard final : doorman::call_guard {
  int asked = 0;
  std::optional<std::string> no() {
    ++asked;
    return "not today";
  }
  std::optional<std::string> allow(const doorman::capacity_request&) override { return no(); }
  std::optional<std::string> allow(const doorman::server_capacity_request&) override {
    return no();
  }
  std::optional<std::string> allow(const doorman::release_request&) override { return no(); }
  std::optional<std::string> allow(const doorman::status_request&) override { return no(); }
  std::optional<std::string> allow(const doorman::count_request&) override { return no(); }
};

// Valid params for each method of the table.
std::string params_for(std::string_view method) {
  if (method == "get_capacity") {
    return R"({"client_id": "c1", "resources": [{"resource_id": "db", "wants": 30}]})";
  }
  if (method == "get_server_capacity") {
    return R"({"server_id": "s1", "resources": [{"resource_id": "db",
               "wants": [{"priority": 0, "num_clients": 1, "wants": 5}]}]})";
  }
  if (method == "release_capacity") return R"({"client_id": "c1", "resources": ["db"]})";
  if (method == "count_hits") {
    return R"({"client_id": "c1", "resources": [{"resource_id": "db", "hits": 1, "window": 60}]})";
  }
  return "{}";
}

}  // namespace

TEST_CASE("every method of the table counts under its own name and asks the guard as it says",
          "[protocol]") {
  std::size_t rows = 0;
  doorman::for_some_method([&]<class M>() {
    ++rows;
    INFO(M::name);
    CHECK(doorman::rpc_method_names[static_cast<std::size_t>(M::id)] == M::name);
    const std::string line = fmt::format(R"({{"jsonrpc":"2.0","id":1,"method":"{}","params":{}}})",
                                         M::name, params_for(M::name));
    for (const bool refuse : {false, true}) {
      node n;
      refusing_guard guard;
      doorman::dispatch_record rec;
      auto reply = doorman::handle_line(n.engine, line, n.clock.now(), n.identity, &rec,
                                        refuse ? &guard : nullptr);
      REQUIRE(reply);
      const auto j = json::parse(*reply);
      CHECK(rec.method == M::id);
      const bool refused = refuse && M::guarded;
      CHECK(guard.asked == (refused ? 1 : 0));
      CHECK(j.contains("error") == refused);
      CHECK(rec.error == (refused ? std::optional(doorman::rpc_code::forbidden) : std::nullopt));
      if (refused) {
        CHECK(j["error"]["message"] == "forbidden: not today");
        CHECK(n.engine.status({}, n.clock.now()).value().resources.empty());  // no state
      }
    }
    return false;
  });
  CHECK(rows + 1 == doorman::rpc_method_names.size());
}

TEST_CASE("notifications get no answer", "[protocol]") {
  node n;
  CHECK_FALSE(
      doorman::handle_line(n.engine, R"({"jsonrpc":"2.0","method":"discovery"})", n.clock.now()));
  // Not even an error: a notification with bad params is dropped silently.
  CHECK_FALSE(doorman::handle_line(
      n.engine, R"({"jsonrpc":"2.0","method":"get_capacity","params":{"client_id":""}})",
      n.clock.now()));
  CHECK_FALSE(
      doorman::handle_line(n.engine, R"({"jsonrpc":"2.0","method":"nope"})", n.clock.now()));
  // But a notification can still act (it is a request without an answer).
  CHECK_FALSE(doorman::handle_line(
      n.engine,
      R"({"jsonrpc":"2.0","method":"get_capacity","params":{"client_id":"c","resources":[{"resource_id":"db","wants":5}]}})",
      n.clock.now()));
  CHECK(n.engine.store("db")->size() == 1);
}

TEST_CASE("hostile envelopes are answered with the right code", "[protocol]") {
  node n;
  CHECK(n.error("{", -32700) == "parse error: not valid JSON");
  CHECK(n.error("", -32700) == "parse error: not valid JSON");
  CHECK(n.error("\xff\xfe garbage", -32700) == "parse error: not valid JSON");
  CHECK(n.error(R"({"jsonrpc":"2.0","id":1,"method":"discovery","x":"\xc3\x28"})", -32700) ==
        "parse error: not valid JSON");  // invalid UTF-8 inside a string
  CHECK(n.error("[]", -32600) == "batch requests are not supported");
  CHECK(n.error("42", -32600) == "a request must be a JSON object");
  CHECK(n.error(R"({"jsonrpc":"1.0","id":1,"method":"discovery"})", -32600) ==
        "jsonrpc: must be \"2.0\"");
  CHECK(n.error(R"({"id":1,"method":"discovery"})", -32600) == "jsonrpc: must be \"2.0\"");
  CHECK(n.error(R"({"jsonrpc":"2.0","id":{},"method":"discovery"})", -32600) ==
        "id: must be a string, a number or null");
  CHECK(n.error(R"({"jsonrpc":"2.0","id":1,"method":7})", -32600) == "method: must be a string");
  CHECK(n.error(R"({"jsonrpc":"2.0","id":1,"method":"fly"})", -32601) == "method not found: fly");
  CHECK(n.error(R"({"jsonrpc":"2.0","id":1,"method":"status","params":[1]})", -32602) ==
        "params: must be an object");
  CHECK(n.error(node::get_capacity("{}").substr(0, 40) + "1e999}}", -32700) ==
        "parse error: not valid JSON");

  auto j = n.call(R"({"jsonrpc":"1.0","id":9,"method":"discovery"})");
  CHECK(j["id"] == 9);  // the id is echoed once it could be read
  auto k = n.call("{");
  CHECK(k["id"].is_null());

  SECTION("deep nesting neither crashes nor hangs") {
    const std::string deep = std::string(100'000, '[') + std::string(100'000, ']');
    CHECK(n.error(deep, -32600) == "batch requests are not supported");
    const std::string deep_params =
        R"({"jsonrpc":"2.0","id":1,"method":"status","params":{"a":)" + deep + "}}";
    auto reply = n.call(deep_params);  // unknown fields are ignored
    CHECK(reply.contains("result"));
  }
}

TEST_CASE("hostile params get an error naming the field, and change nothing", "[protocol]") {
  node n;
  auto err = [&](const std::string& params) { return n.error(node::get_capacity(params)); };
  CHECK(err("null") == "params: must be an object");
  CHECK(err("{}") == "params.client_id: is required");
  CHECK(err(R"({"client_id": 5, "resources": []})") == "params.client_id: must be a string");
  CHECK(err(R"({"client_id": "c"})") == "params.resources: is required");
  CHECK(err(R"({"client_id": "c", "resources": {}})") == "params.resources: must be an array");
  CHECK(err(R"({"client_id": "c", "resources": [7]})") == "params.resources[0]: must be an object");
  CHECK(err(R"({"client_id": "c", "resources": [{"wants": 1}]})") ==
        "params.resources[0].resource_id: is required");
  CHECK(err(R"({"client_id": "c", "resources": [{"resource_id": "db"}]})") ==
        "params.resources[0].wants: is required");
  CHECK(err(R"({"client_id": "c", "resources": [{"resource_id": "db", "wants": "9"}]})") ==
        "params.resources[0].wants: must be a number");
  CHECK(err(R"({"client_id": "c", "resources": [{"resource_id": "db", "wants": -1}]})") ==
        "params.resources[0].wants: must be a finite number between 0 and 1e15");
  CHECK(
      err(R"({"client_id": "c", "resources": [{"resource_id": "db", "wants": 1, "priority": 1.5}]})") ==
      "params.resources[0].priority: must be an integer");
  CHECK(err(R"({"client_id": "c", "resources": [{"resource_id": "db", "wants": 1, "has": 3}]})") ==
        "params.resources[0].has: must be an object");
  CHECK(err(R"({"client_id": "c", "resources": [{"resource_id": "db", "wants": 1,
                "has": {"capacity": 1, "expires_in": 2}}]})") ==
        "params.resources[0].has.refresh_interval: is required");
  CHECK(err(R"({"client_id": "", "resources": []})") ==
        "params.client_id: must be a non-empty string");
  CHECK(err(R"({"client_id": ")" + std::string(257, 'x') + R"(", "resources": []})") ==
        "params.client_id: must be at most 256 bytes");
  CHECK(err(R"({"client_id": "c", "resources": [{"resource_id": "db", "wants": 1},
                                                 {"resource_id": "db", "wants": 2}]})") ==
        "params.resources[1]: duplicate resource id \"db\"");
  std::string many = R"({"client_id": "c", "resources": [)";
  for (int i = 0; i <= 10'000; ++i) {
    many += (i ? "," : "") + std::string(R"({"resource_id":"r)") + std::to_string(i) +
            R"(","wants":1})";
  }
  CHECK(err(many + "]}") == "params.resources: must hold at most 10000 elements");

  auto server_err = [&](const std::string& params) {
    return n.error(R"({"jsonrpc":"2.0","id":1,"method":"get_server_capacity","params":)" + params +
                   "}");
  };
  CHECK(server_err(R"({"server_id": "s", "resources": [{"resource_id": "db",
                      "wants": [{"num_clients": 0, "wants": 1}]}]})") ==
        "params.resources[0].wants[0].num_clients: must be an integer between 1 and 1000000000");
  CHECK(server_err(R"({"server_id": "s", "resources": [{"resource_id": "db",
                      "wants": [{"wants": 1}]}]})") ==
        "params.resources[0].wants[0].num_clients: is required");
  CHECK(server_err(R"({"server_id": "s", "resources": [{"resource_id": "db", "outstanding": -2,
                      "wants": [{"num_clients": 1, "wants": 1}]}]})") ==
        "params.resources[0].outstanding: must be a finite number between 0 and 1e15");
  CHECK(n.error(R"({"jsonrpc":"2.0","id":1,"method":"release_capacity","params":
                   {"client_id": "c", "resources": [1]}})") ==
        "params.resources[0]: must be a string");
  CHECK(n.error(R"({"jsonrpc":"2.0","id":1,"method":"status","params":{"resource_id": ""}})") ==
        "params.resource_id: must be a non-empty string");
  auto status_err = [&](const std::string& params) {
    return n.error(R"({"jsonrpc":"2.0","id":1,"method":"status","params":)" + params + "}");
  };
  CHECK(status_err(R"({"offset": 5})") == "params.offset: only with resource_id");
  CHECK(status_err(R"({"limit": 5})") == "params.limit: only with resource_id");
  CHECK(status_err(R"({"resource_id": "db", "offset": -1})") ==
        "params.offset: must be between 0 and 1000000000");
  CHECK(status_err(R"({"resource_id": "db", "limit": 0})") ==
        "params.limit: must be between 1 and 1000000");
  CHECK(status_err(R"({"resource_id": "db", "limit": 1.5})") == "params.limit: must be an integer");

  CHECK(n.engine.store("db") == nullptr);  // none of it reached the engine's state
}

TEST_CASE("status pages the leases of a resource in client id order", "[protocol]") {
  node n;
  for (const char* c : {"e", "b", "d", "a", "c"})
    (void)n.call(std::string(R"({"jsonrpc":"2.0","id":1,"method":"get_capacity","params":)"
                             R"({"client_id":")") +
                 c + R"(","resources":[{"resource_id":"db","wants":1}]}})");
  auto page = [&](const std::string& params) {
    const auto r =
        n.call(R"({"jsonrpc":"2.0","id":2,"method":"status","params":)" + params + "}")["result"];
    std::string ids;
    for (const auto& l : r.value("leases", nlohmann::json::array()))
      ids += l["client_id"].get<std::string>();
    return ids + "/" + std::to_string(r["lease_count"].get<int>());
  };
  CHECK(page(R"({"resource_id": "db"})") == "abcde/5");
  CHECK(page(R"({"resource_id": "db", "limit": 2})") == "ab/5");
  CHECK(page(R"({"resource_id": "db", "offset": 2, "limit": 2})") == "cd/5");
  CHECK(page(R"({"resource_id": "db", "offset": 4, "limit": 2})") == "e/5");
  CHECK(page(R"({"resource_id": "db", "offset": 9})") == "/5");
  CHECK(page(R"({"resource_id": "other"})") == "/0");
}

TEST_CASE("answers are read without throwing, whatever the peer sent", "[protocol][answer]") {
  using kind = doorman::rpc_answer::kind;
  auto read = [](const char* text) { return doorman::read_answer(json::parse(text)); };
  auto a = read(R"({"id":1,"error":{"code":"x","message":5}})");
  CHECK(a.type == kind::error);
  CHECK(a.code == 0);
  CHECK(a.message == "error");
  a = read(R"({"id":1,"error":{"code":1e300,"message":"busy"}})");
  CHECK(a.type == kind::error);
  CHECK(a.code == 0);  // not an integer: no float-to-int conversion
  CHECK(a.message == "busy");
  CHECK(read(R"({"id":1,"error":{"code":99999999999}})").code == 0);
  CHECK(read(R"({"id":1,"error":{"code":18446744073709551615}})").code == 0);
  CHECK(read(R"({"id":1,"error":{"code":-32602,"message":"bad"}})").code == -32602);
  CHECK(read(R"({"id":1,"error":[1,2]})").type == kind::error);
  CHECK(read(R"({"id":1,"result":5})").type == kind::malformed);
  CHECK(read(R"([1])").type == kind::malformed);
  a = read(R"({"id":1,"result":{"mastership":{"is_master":"yes"}}})");
  REQUIRE(a.type == kind::result);
  // Not a boolean: not a redirect; the result's decoder names the field instead.
  CHECK_FALSE(doorman::read_redirect(a.result).not_master);
  doorman::capacity_response resp;
  CHECK(doorman::decode(a.result, resp)->message ==
        "result.mastership.is_master: must be a boolean");
  const auto hint =
      doorman::read_redirect(json::parse(R"({"mastership":{"is_master":false,"master":7}})"));
  CHECK(hint.not_master);
  CHECK_FALSE(hint.master);
  CHECK(doorman::read_redirect(
            json::parse(R"({"mastership":{"is_master":false,"master":"10.0.0.7:7700"}})"))
            .master == "10.0.0.7:7700");
}

namespace {

// A random request line for a hot method: mostly the plain form, often with something the
// streaming reader does not take (escapes, non-ASCII, unknown or repeated members, floats where
// integers go, nulls, odd numbers, white space), and sometimes mutated into invalid JSON.
class line_maker {
 public:
  explicit line_maker(std::uint64_t seed) : rng_(seed) {}

  std::string next() {
    std::string line = envelope();
    if (chance(0.1)) mutate(line);
    return line;
  }

 private:
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng_)];
  }
  std::string ws() { return chance(0.1) ? pick<std::string>({" ", "\t", "\r\n ", "  "}) : ""; }

  std::string number() {
    if (chance(0.85)) return pick<std::string>({"0", "1", "7", "40", "12.5", "2.50", "1e2"});
    return pick<std::string>({"0",
                              "1",
                              "7",
                              "40",
                              "-1",
                              "12.5",
                              "1e2",
                              "1E+2",
                              "2.50",
                              "0.1",
                              "1e-7",
                              "-0",
                              "-0.0",
                              "1e15",
                              "1e16",
                              "1000000000000001",
                              "3e300",
                              "1e400",
                              "1e-400",
                              "00",
                              "1.",
                              ".5",
                              "99999999999999999999",
                              "123456789012345678",
                              "\"5\"",
                              "null",
                              "true",
                              "[1]"});
  }
  std::string id_string() {
    if (chance(0.9)) return pick<std::string>({"\"c1\"", "\"c2\"", "\"db\"", "\"cache\""});
    return pick<std::string>({"\"c1\"", "\"c2\"", "\"db\"", "\"cache\"", "\"\"", "\"a\\u0062\"",
                              "\"caf\xc3\xa9\"", "\"x\\\"y\"", "\"tab\\t\"", "\"c1\"", "7", "null",
                              "\"" + std::string(300, 'x') + "\""});
  }
  std::string member(const std::string& key, const std::string& value) {
    return ws() + "\"" + key + "\"" + ws() + ":" + ws() + value + ws();
  }
  std::string object(std::vector<std::string> members) {
    std::shuffle(members.begin(), members.end(), rng_);
    if (chance(0.02) && !members.empty()) members.push_back(members.front());  // repeated
    if (chance(0.02)) members.push_back(member("extra", "{\"x\":[1,2]}"));
    std::string s = "{";
    for (std::size_t i = 0; i < members.size(); ++i)
      s += (i ? "," : "") + members[i];
    return s + "}";
  }
  std::string lease() {
    if (chance(0.1)) return "null";
    std::vector<std::string> m = {member("capacity", number()), member("expires_in", number()),
                                  member("refresh_interval", number())};
    if (chance(0.1)) m.pop_back();
    return object(m);
  }
  std::string resource(bool server) {
    std::vector<std::string> m = {member("resource_id", id_string())};
    if (!server) {
      m.push_back(member("wants", number()));
      if (chance(0.3)) m.push_back(member("priority", chance(0.5) ? "1" : number()));
    } else {
      std::string bands = "[";
      const int n = std::uniform_int_distribution<int>(0, 3)(rng_);
      for (int i = 0; i < n; ++i) {
        bands +=
            (i ? "," : "") + object({member("priority", chance(0.7) ? std::to_string(i) : number()),
                                     member("num_clients", chance(0.7) ? "3" : number()),
                                     member("wants", number())});
      }
      m.push_back(member("wants", bands + "]"));
      if (chance(0.5)) m.push_back(member("outstanding", number()));
    }
    if (chance(0.4)) m.push_back(member("has", lease()));
    return object(m);
  }
  std::string envelope() {
    const bool server = chance(0.4);
    std::string resources = "[";
    const int n = std::uniform_int_distribution<int>(0, 3)(rng_);
    for (int i = 0; i < n; ++i)
      resources += (i ? "," : "") + resource(server);
    resources += "]";
    const std::string params = object(
        {member(server ? "server_id" : "client_id", id_string()), member("resources", resources)});
    std::vector<std::string> m = {
        member("jsonrpc", chance(0.95) ? "\"2.0\"" : "\"1.0\""),
        member("method", server ? "\"get_server_capacity\"" : "\"get_capacity\""),
        member("params", chance(0.95) ? params : "null")};
    if (chance(0.9)) {
      m.push_back(member("id", chance(0.8)
                                   ? pick<std::string>({"1", "42", "-3", "\"abc\"", "null"})
                                   : pick<std::string>({"1.5", "\"\\u00e9\"",
                                                        "123456789012345678901", "-0", "[1]"})));
    }
    return ws() + object(m) + ws();
  }
  void mutate(std::string& line) {
    if (line.empty()) return;
    const auto at = std::uniform_int_distribution<std::size_t>(0, line.size() - 1)(rng_);
    switch (std::uniform_int_distribution<int>(0, 2)(rng_)) {
      case 0:
        line.erase(at, 1);
        break;
      case 1:
        line.insert(at, 1, pick<char>({'{', '"', ',', '1', ':', ' ', '\\', 'e'}));
        break;
      default:
        line[at] = pick<char>({'}', ']', 'x', '0', '.', '-'});
    }
  }

  std::mt19937_64 rng_;
};

}  // namespace

TEST_CASE("the hot path answers exactly as the DOM path, and changes the same state",
          "[protocol][hot]") {
  node hot;
  node reference;  // every line through the DOM path only
  line_maker maker(GENERATE(1u, 2u, 3u));
  std::size_t answered = 0;
  std::size_t results = 0;
  std::size_t plain = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string line = maker.next();
    std::string a;
    std::string b;
    doorman::dispatch_record ra;
    doorman::dispatch_record rb;
    const bool sa =
        doorman::handle_line_to(a, hot.engine, line, hot.clock.now(), hot.identity, &ra);
    const bool sb = doorman::detail::dispatch(b, reference.engine, line, reference.clock.now(),
                                              reference.identity, &rb, nullptr, false);
    INFO(line);
    REQUIRE(sa == sb);
    REQUIRE(a == b);
    REQUIRE(ra.method == rb.method);
    REQUIRE(ra.error == rb.error);
    doorman::detail::hot_request read;
    plain += doorman::detail::read_hot_request(line, read) ? 1 : 0;
    answered += sa ? 1 : 0;
    results += a.find("\"result\"") != std::string::npos ? 1 : 0;
    hot.clock.advance(100ms);
    reference.clock.advance(100ms);
  }
  // The engines hold the same leases.
  for (const char* id : {"c1", "c2", "db", "cache"}) {
    const std::string status =
        R"({"jsonrpc":"2.0","id":9,"method":"status","params":{"resource_id":")" + std::string(id) +
        "\"}}";
    CHECK(
        *doorman::handle_line(hot.engine, status, hot.clock.now(), hot.identity) ==
        *doorman::handle_line(reference.engine, status, reference.clock.now(), reference.identity));
  }
  // The generator reaches both paths and both kinds of answer.
  CHECK(plain > 300);
  CHECK(plain < 2500);
  CHECK(answered > 2000);
  CHECK(results > 300);
  CHECK(answered - results > 300);
}

TEST_CASE("hot path: -0 is 0 on both paths, in the answer and the state", "[protocol][hot]") {
  for (const std::string zero : {"-0", "-0.0", "-0e5", "-0.0E-3"}) {
    INFO(zero);
    node hot;
    node reference;
    const std::string line = R"({"jsonrpc":"2.0","id":1,"method":"get_capacity","params":)"
                             R"({"client_id":"c","resources":[{"resource_id":"r","wants":)" +
                             zero + "}]}}";
    doorman::detail::hot_request read;
    REQUIRE(doorman::detail::read_hot_request(line, read));  // the hot path takes it
    std::string a;
    std::string b;
    doorman::handle_line_to(a, hot.engine, line, hot.clock.now(), hot.identity);
    doorman::detail::dispatch(b, reference.engine, line, reference.clock.now(), reference.identity,
                              nullptr, nullptr, false);
    CHECK(a == b);
    const std::string status =
        R"({"jsonrpc":"2.0","id":2,"method":"status","params":{"resource_id":"r"}})";
    const auto from_hot = *doorman::handle_line(hot.engine, status, hot.clock.now(), hot.identity);
    CHECK(from_hot == *doorman::handle_line(reference.engine, status, reference.clock.now(),
                                            reference.identity));
    CHECK(from_hot.find("-0") == std::string::npos);
  }
}

TEST_CASE("numbers are written as nlohmann/json writes them", "[protocol][hot]") {
  std::mt19937_64 rng(7);
  std::vector<double> values = {0.0,
                                -0.0,
                                1.0,
                                50.0,
                                0.1,
                                1e-7,
                                1e15,
                                1e16,
                                1e300,
                                33.3333,
                                1e-300,
                                -2.5,
                                1e21,
                                123456.789,
                                5e-324,
                                1e308,
                                100.0 / 3,
                                2e-5,
                                999999999999999.9};
  std::uniform_real_distribution<double> mantissa(-10, 10);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (int i = 0; i < 20000; ++i)
    values.push_back(mantissa(rng) * std::pow(10.0, exponent(rng)));
  for (const double v : values) {
    std::string out;
    doorman::detail::write_number(out, v);
    INFO(v);
    REQUIRE(out == json(v).dump());
  }
  std::string out;
  doorman::detail::write_number(out, std::nan(""));
  CHECK(out == json(std::nan("")).dump());
}

TEST_CASE("a batch of lines is answered as each line alone would be", "[protocol][hot]") {
  node batched;
  node reference;  // line by line, through the DOM path only
  line_maker maker(GENERATE(4u, 5u));
  std::mt19937_64 rng(9);
  std::size_t answers = 0;
  for (int round = 0; round < 150; ++round) {
    // Batches of 1 to 40 lines: across the 16 read and prefetched together, and within them.
    std::vector<std::string> text(std::uniform_int_distribution<std::size_t>(1, 40)(rng));
    for (auto& line : text)
      line = maker.next();
    const std::vector<std::string_view> lines(text.begin(), text.end());
    std::string got;
    std::vector<doorman::dispatch_record> records;
    const std::size_t n =
        doorman::handle_lines_to(got, batched.engine, lines, batched.clock.now(), batched.identity,
                                 nullptr, [&](std::size_t i, const doorman::dispatch_record& r) {
                                   CHECK(i == records.size());  // in order, once each
                                   records.push_back(r);
                                 });
    std::string expected;
    std::size_t expected_n = 0;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      doorman::dispatch_record r;
      if (doorman::detail::dispatch(expected, reference.engine, lines[i], reference.clock.now(),
                                    reference.identity, &r, nullptr, false)) {
        expected += '\n';
        ++expected_n;
      }
      REQUIRE(i < records.size());
      CHECK(records[i].method == r.method);
      CHECK(records[i].error == r.error);
    }
    REQUIRE(records.size() == lines.size());
    REQUIRE(n == expected_n);
    REQUIRE(got == expected);
    answers += n;
    batched.clock.advance(1s);
    reference.clock.advance(1s);
  }
  CHECK(answers > 2000);
  for (const char* id : {"c1", "c2", "db", "cache"}) {
    const std::string status =
        R"({"jsonrpc":"2.0","id":9,"method":"status","params":{"resource_id":")" + std::string(id) +
        "\"}}";
    CHECK(
        *doorman::handle_line(batched.engine, status, batched.clock.now(), batched.identity) ==
        *doorman::handle_line(reference.engine, status, reference.clock.now(), reference.identity));
  }
}
