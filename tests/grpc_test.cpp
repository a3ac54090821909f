// Doorman's gRPC protocol on a real doorman-node, driven by a C++ gRPC client generated from
// proto/doorman.proto (docs/doorman-compatibility.md).

#include <catch2/catch.hpp>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

#include <random>

#include "answer_recorder.hpp"
#include "doorman.grpc.pb.h"
#include "etcd_server.hpp"
#include "grpc_node.hpp"
#include "line_client.hpp"
#include "mapping.hpp"
#include "parent_channel.hpp"
#include "process.hpp"
#include "support.hpp"

namespace {

using doorman::grpc_door::unix_now;

using doorman_examples::process;
using doorman_test::config_text;
using doorman_test::grpc_node;

::doorman::GetCapacityRequest ask(const std::string& client, const std::string& resource,
                                  double wants) {
  ::doorman::GetCapacityRequest r;
  r.set_client_id(client);
  auto& x = *r.add_resource();
  x.set_resource_id(resource);
  x.set_priority(0);
  x.set_wants(wants);
  return r;
}

// A server child's request: `clients` clients at priority 0 wanting `wants` of `resource`.
::doorman::GetServerCapacityRequest ask_server(const std::string& server,
                                               const std::string& resource, std::int64_t clients,
                                               double wants) {
  ::doorman::GetServerCapacityRequest r;
  r.set_server_id(server);
  auto& x = *r.add_resource();
  x.set_resource_id(resource);
  auto& band = *x.add_wants();
  band.set_priority(0);
  band.set_num_clients(clients);
  band.set_wants(wants);
  return r;
}

// What client c1 gets of "api" wanting `wants`, asked until it gets all of it or `timeout`
// passes (an intermediate's first answers come before it holds any of the resource).
// With `also`, the same request asks for that resource too (wants 100): its grants are in
// `also_got`.
double capacity_within(::doorman::Capacity::Stub& stub, double wants, std::chrono::seconds timeout,
                       const std::string& also = {}, std::vector<double>* also_got = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  double got = 0;
  for (;;) {
    ::doorman::GetCapacityResponse r;
    auto req = ask("c1", "api", wants);
    if (!also.empty()) {
      auto& x = *req.add_resource();
      x.set_resource_id(also);
      x.set_priority(0);
      x.set_wants(100);
    }
    REQUIRE(stub.GetCapacity(grpc_node::context().get(), req, &r).ok());
    got = 0;
    for (const auto& g : r.response()) {
      if (g.resource_id() == "api") got = g.gets().capacity();
      if (also_got != nullptr && g.resource_id() == also) also_got->push_back(g.gets().capacity());
    }
    if (got >= wants || std::chrono::steady_clock::now() >= deadline) return got;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling period
  }
}

// A day's budget of 1 000 "tokens", and a rate of 100 for every other id.
constexpr const char* budget_config_text = R"({"resources": [
    {"identifier_glob": "tokens", "capacity": 1000, "budget": {"window": "day"},
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 20, "refresh_interval": 1}},
    {"identifier_glob": "*", "capacity": 100,
     "algorithm": {"kind": "FAIR_SHARE", "lease_length": 20, "refresh_interval": 1,
                   "learning_mode_duration": 0}}]})";

}  // namespace

namespace {

// A service answering any method by its name: /p/busy RESOURCE_EXHAUSTED, /p/down
// UNAVAILABLE, /p/wrong INVALID_ARGUMENT, /p/slow OK after 0.3 s (its latency), else OK.
class status_service final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    class reactor final : public grpc::ServerGenericBidiReactor {
     public:
      explicit reactor(grpc::Status s) { Finish(std::move(s)); }
      void OnDone() override { delete this; }
    };
    const std::string& m = ctx->method();
    if (m == "/p/slow") std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (m == "/p/busy") return new reactor(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, ""));
    if (m == "/p/down") return new reactor(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
    if (m == "/p/wrong") return new reactor(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, ""));
    return new reactor(grpc::Status::OK);
  }
};

// Counts what the recorder records (any handle with `record_answer(bool)` will do).
struct tally {
  std::atomic<int> calls{0};
  std::atomic<int> overloads{0};
  void record_answer(bool overloaded) {
    ++calls;
    overloads += overloaded ? 1 : 0;
  }
};

}  // namespace

TEST_CASE("grpc: the answer recorder counts each call's status, overloaded as gRPC says",
          "[grpc][learn]") {
  status_service service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&service);
  const auto server = builder.BuildAndStart();
  REQUIRE(server);
  tally t;
  CHECK_THROWS_WITH(doorman::grpc_answer_recorder(t, doorman::seconds(0)),
                    Catch::Contains("latency_target"));
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> f;
  f.push_back(std::make_unique<doorman::grpc_answer_recorder>(t, doorman::seconds(0.2)));
  const auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), {}, std::move(f));
  grpc::GenericStub stub(channel);
  const auto call = [&](const std::string& method, bool cancel = false) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    std::promise<grpc::StatusCode> done;
    stub.UnaryCall(&ctx, method, {}, &request, &response,
                   [&](const grpc::Status& s) { done.set_value(s.error_code()); });
    if (cancel) ctx.TryCancel();
    return done.get_future().get();
  };
  CHECK(call("/p/ok") == grpc::StatusCode::OK);
  CHECK(call("/p/busy") == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(call("/p/down") == grpc::StatusCode::UNAVAILABLE);
  CHECK(call("/p/wrong") == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(call("/p/slow") == grpc::StatusCode::OK);  // 0.3 s: past the 0.2 s target
  CHECK(t.calls == 5);
  CHECK(t.overloads == 3);
  // A call its caller cancelled is not an answer.
  CHECK(call("/p/slow", true) == grpc::StatusCode::CANCELLED);
  CHECK(t.calls == 5);
  server->Shutdown();
  // Any doorman handle records (`record_answer(bool)`); anything else does not compile.
  static_assert(std::is_constructible_v<doorman::grpc_answer_recorder, doorman::rate_resource&>);
  static_assert(std::is_constructible_v<doorman::grpc_answer_recorder, doorman::gauge_resource&>);
  static_assert(!std::is_constructible_v<doorman::grpc_answer_recorder, int&>);
}

TEST_CASE("grpc: a master answers Discovery and GetCapacity as Doorman's clients expect",
          "[grpc][process]") {
  grpc_node n;
  ::doorman::DiscoveryResponse d;
  REQUIRE(n.stub->Discovery(n.context().get(), {}, &d).ok());
  CHECK(d.is_master());

  const double before = unix_now();
  ::doorman::GetCapacityResponse a;
  REQUIRE(n.stub->GetCapacity(n.context().get(), ask("c1", "api", 30), &a).ok());
  CHECK_FALSE(a.has_mastership());  // present only when not the master
  REQUIRE(a.response_size() == 1);
  const auto& g = a.response(0);
  CHECK(g.resource_id() == "api");
  CHECK(g.gets().capacity() == 30);
  CHECK(g.safe_capacity() == 5);
  // Whole seconds, never past the real lease (20 s from when it was decided).
  CHECK(g.gets().expiry_time() <= static_cast<std::int64_t>(unix_now() + 20));
  CHECK(g.gets().expiry_time() >= static_cast<std::int64_t>(before + 20) - 1);
  CHECK(g.gets().refresh_interval() == 4);

  // A second client shares fairly with the first.
  ::doorman::GetCapacityResponse b;
  REQUIRE(n.stub->GetCapacity(n.context().get(), ask("c2", "api", 100), &b).ok());
  CHECK(b.response(0).gets().capacity() == 70);
}

TEST_CASE(
    "grpc: a non-master names the master's gRPC port, and a client that follows it gets "
    "capacity",
    "[grpc][etcd][process]") {
  doorman_test::etcd_server etcd;
  const std::vector<std::string> elect{"--etcd-endpoints",   etcd.endpoint(),  "--election-key",
                                       "/doorman/grpc-test", "--election-ttl", "5"};
  grpc_node master("master", elect);
  REQUIRE(master.node->wait_for("became master", std::chrono::seconds(20)));
  grpc_node other("other", elect);
  // Until the second task has read the election (a deadline, not a sleep).
  ::doorman::DiscoveryResponse d;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline &&
         (!other.stub->Discovery(other.context().get(), {}, &d).ok() ||
          d.mastership().master_address().empty())) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling period
  }
  CHECK_FALSE(d.is_master());
  CHECK(d.mastership().master_address() == master.address);

  // The master's Discovery names its own gRPC port.
  REQUIRE(master.stub->Discovery(master.context().get(), {}, &d).ok());
  CHECK(d.is_master());
  CHECK(d.mastership().master_address() == master.address);

  // The non-master grants nothing and names the master's gRPC port, not its JSON-RPC one.
  ::doorman::GetCapacityResponse r;
  REQUIRE(other.stub->GetCapacity(other.context().get(), ask("c1", "api", 30), &r).ok());
  REQUIRE(r.has_mastership());
  CHECK(r.response_size() == 0);
  const std::string redirect = r.mastership().master_address();
  CHECK(redirect == master.address);

  // Followed as Doorman's client does: a new channel to the address it was given.
  auto followed = ::doorman::Capacity::NewStub(
      grpc::CreateChannel(redirect, grpc::InsecureChannelCredentials()));
  REQUIRE(followed->GetCapacity(grpc_node::context().get(), ask("c1", "api", 30), &r).ok());
  CHECK_FALSE(r.has_mastership());
  REQUIRE(r.response_size() == 1);
  CHECK(r.response(0).gets().capacity() == 30);
}

TEST_CASE("grpc: a mixed tree: an intermediate whose parent speaks Doorman's gRPC",
          "[grpc][process]") {
  grpc_node root("root");
  grpc_node mid("mid", {"--parent", root.address, "--parent-protocol", "grpc", "--id", "mid"});
  REQUIRE(mid.node->wait_for("parent " + root.address + " reached"));

  // A client of the intermediate gets capacity the intermediate leased from the root over gRPC
  // (its first answer may come before the intermediate has any: ask until the deadline).
  CHECK(capacity_within(*mid.stub, 30, std::chrono::seconds(20)) == 30);

  // The root holds a server lease for the intermediate, asked for with GetServerCapacity.
  doorman_test::line_client c(root.json_address);
  REQUIRE(c.send(doorman_test::request_line(1, "status", {{"resource_id", "api"}})));
  const auto line = c.read_line(std::chrono::seconds(5));
  REQUIRE(line);
  const auto status = nlohmann::json::parse(*line);
  bool leased_to_mid = false;
  for (const auto& l : status["result"]["leases"]) {
    if (l["client_id"] == "mid") leased_to_mid = l["is_server"] && l["has"]["capacity"] >= 30;
  }
  CHECK(leased_to_mid);
}

TEST_CASE("grpc: a mixed tree: a budget asked through a gRPC parent link gets 0, rates flow",
          "[grpc][process][budget]") {
  // The intermediate asks its parent for every resource in one GetServerCapacity; a budget
  // among them (its reports cannot travel over Doorman's protocol) gets 0, not the request.
  grpc_node root("budget-root", {}, budget_config_text);
  grpc_node mid("budget-mid",
                {"--parent", root.address, "--parent-protocol", "grpc", "--id", "mid"});
  std::vector<double> tokens;
  CHECK(capacity_within(*mid.stub, 30, std::chrono::seconds(20), "tokens", &tokens) == 30);
  REQUIRE_FALSE(tokens.empty());
  CHECK(std::all_of(tokens.begin(), tokens.end(), [](double c) { return c == 0; }));
  CHECK(root.node->wait_for("warning: mid asked for budget tokens through Doorman's protocol"));
  // Nothing of the budget was allotted or counted.
  doorman_test::line_client c(root.json_address);
  REQUIRE(c.send(doorman_test::request_line(1, "status", {{"resource_id", "tokens"}})));
  const auto line = c.read_line(std::chrono::seconds(5));
  REQUIRE(line);
  const auto budget = nlohmann::json::parse(*line)["result"]["resources"][0]["budget"];
  CHECK(budget["spent"] == 0);
  CHECK(budget["left"] == 1000);
}

TEST_CASE("grpc: the parent channel maps typed calls straight to Doorman's messages",
          "[grpc][process][typed]") {
  grpc_node root("typed");
  asio::io_context io;
  auto ch =
      doorman::grpc_door::make_parent_channel(io.get_executor(), {.addresses = {root.address}});
  doorman::server_capacity_request req{"mid", {{"api", std::nullopt, 0, {{0, 2, 30}}}}};
  const auto r = doorman_test::run_coroutine_test(
      io, [&] { return ch->call<doorman::methods::get_server_capacity>(req); });
  REQUIRE(r);
  CHECK(r.result.mastership.is_master);
  REQUIRE(r.result.resources.size() == 1);
  CHECK(r.result.resources[0].resource_id == "api");
  CHECK(r.result.resources[0].gets.capacity == 30);
  CHECK(r.result.resources[0].algorithm.kind == "FAIR_SHARE");

  // Doorman's protocol has no status: the call fails at once, before any deadline.
  const auto start = std::chrono::steady_clock::now();
  const auto st =
      doorman_test::run_coroutine_test(io, [&] { return ch->call<doorman::methods::status>({}); });
  CHECK(st.error == doorman::errc::error_answer);
  CHECK(st.message == "Doorman's protocol has no status (the parent speaks gRPC)");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  ch->shutdown();
}

TEST_CASE("grpc: a parent link over gRPC to an address that refuses backs off and says why",
          "[grpc][process]") {
  const int port = doorman_test::free_port();  // nothing listens there
  grpc_node mid("mid",
                {"--parent", "127.0.0.1:" + std::to_string(port), "--parent-protocol", "grpc"});
  const auto line = mid.node->wait_for("parent unreachable");
  REQUIRE(line);
  CHECK(line->find("cannot reach 127.0.0.1:" + std::to_string(port)) != std::string::npos);
}

TEST_CASE(
    "grpc: a parent link over gRPC to a peer that accepts and never answers gives up at "
    "its deadline, and the node still stops at once",
    "[grpc][process]") {
  // A listening socket nobody accepts on: the kernel completes the handshake, nothing answers.
  const doorman_test::loopback_socket silent(true);
  const std::string hung = silent.address();
  {
    grpc_node mid("hung",
                  {"--parent", hung, "--parent-protocol", "grpc", "--parent-timeout", "0.5"});
    const auto line = mid.node->wait_for("parent unreachable");
    REQUIRE(line);
    CHECK_THAT(*line, Catch::Contains(hung + " did not answer get_server_capacity in time"));
    const auto stop_started = std::chrono::steady_clock::now();
    mid.node->signal(SIGTERM);
    CHECK(mid.node->exits_cleanly());
    CHECK(std::chrono::steady_clock::now() - stop_started < std::chrono::seconds(3));
  }
}

TEST_CASE("grpc: a request that breaks a bound gets INVALID_ARGUMENT naming the field",
          "[grpc][process]") {
  grpc_node n;
  ::doorman::GetCapacityResponse a;
  const auto s = n.stub->GetCapacity(n.context().get(), ask("c1", "api", -1), &a);
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(s.error_message(), Catch::StartsWith("resource[0].wants"));
  // Nothing was granted: the client asking properly gets the whole capacity.
  REQUIRE(n.stub->GetCapacity(n.context().get(), ask("c2", "api", 500), &a).ok());
  CHECK(a.response(0).gets().capacity() == 100);
}

TEST_CASE("grpc: a budget gets 0, the rest as always: Doorman's protocol cannot report a spend",
          "[grpc][process]") {
  grpc_node n("budget", {}, budget_config_text);
  // One request with a rate and the budget, as a Go client batches them.
  auto both = ask("c1", "api", 10);
  auto& t = *both.add_resource();
  t.set_resource_id("tokens");
  t.set_priority(0);
  t.set_wants(100);
  ::doorman::GetCapacityResponse a;
  REQUIRE(n.stub->GetCapacity(n.context().get(), both, &a).ok());
  REQUIRE(a.response_size() == 2);
  for (const auto& g : a.response()) {
    CHECK(g.gets().capacity() == (g.resource_id() == "api" ? 10 : 0));
    CHECK(g.gets().refresh_interval() == 1);
  }
  CHECK(
      n.node->wait_for("warning: c1 asked for budget tokens through Doorman's protocol, "
                       "which cannot report a spend: granted 0 (ask for it over JSON-RPC)"));
  ::doorman::GetServerCapacityResponse b;
  REQUIRE(
      n.stub->GetServerCapacity(n.context().get(), ask_server("mid", "tokens", 2, 100), &b).ok());
  REQUIRE(b.response_size() == 1);
  CHECK(b.response(0).gets().capacity() == 0);
}

TEST_CASE("grpc: ReleaseCapacity gives a lease back, GetServerCapacity counts subclients",
          "[grpc][process]") {
  grpc_node n;
  ::doorman::GetCapacityResponse a;
  REQUIRE(n.stub->GetCapacity(n.context().get(), ask("c1", "api", 100), &a).ok());
  CHECK(a.response(0).gets().capacity() == 100);

  ::doorman::ReleaseCapacityRequest rel;
  rel.set_client_id("c1");
  rel.add_resource_id("api");
  ::doorman::ReleaseCapacityResponse released;
  REQUIRE(n.stub->ReleaseCapacity(n.context().get(), rel, &released).ok());
  CHECK_FALSE(released.has_mastership());
  // Padded as Doorman's Go client pads, with a duplicate: the error names the proto's index.
  ::doorman::ReleaseCapacityRequest padded;
  padded.set_client_id("c1");
  for (const char* id : {"", "", "api", "api"})
    padded.add_resource_id(id);
  const auto refused = n.stub->ReleaseCapacity(n.context().get(), padded, &released);
  CHECK(refused.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(refused.error_message(), Catch::StartsWith("resource_id[3]: duplicate"));

  // A server child with 3 clients at one priority: FAIR_SHARE counts them.
  ::doorman::GetServerCapacityResponse sa;
  REQUIRE(n.stub->GetServerCapacity(n.context().get(), ask_server("mid", "api", 3, 60), &sa).ok());
  REQUIRE(sa.response_size() == 1);
  CHECK(sa.response(0).gets().capacity() == 60);
  CHECK(sa.response(0).algorithm().kind() == ::doorman::Algorithm::FAIR_SHARE);
  CHECK(sa.response(0).algorithm().lease_length() == 20);
  // c1's lease is gone: c3 may have what mid does not.
  REQUIRE(n.stub->GetCapacity(n.context().get(), ask("c3", "api", 100), &a).ok());
  CHECK(a.response(0).gets().capacity() == 40);
}

TEST_CASE("grpc mapping: leases round down to whole seconds, never past the real lease", "[grpc]") {
  ::doorman::Lease l;
  doorman::grpc_door::to_proto({10, 2.9, 0.4}, 1000.5, l);
  CHECK(l.expiry_time() == 1003);    // 1003.4 rounded down
  CHECK(l.refresh_interval() == 1);  // at least 1 s
  doorman::grpc_door::to_proto({10, 30, 16.7}, 1000.0, l);
  CHECK(l.expiry_time() == 1030);
  CHECK(l.refresh_interval() == 16);
  doorman::grpc_door::to_proto({10, 0, 5}, 1000.0, l);  // expired
  CHECK(l.expiry_time() == 1000);
  CHECK(l.refresh_interval() == 0);  // ask again at once
  const auto back = doorman::grpc_door::from_proto(l, 999.5);
  CHECK(back.expires_in == 0.5);
  CHECK(doorman::grpc_door::proto_path("params.resources[3].has.expires_in: must be") ==
        "resource[3].has.expiry_time: must be");
  // The client counts the interval from when the answer came: it never ends after the expiry.
  for (const double now : {1000.0, 1000.1, 1000.5, 1000.9, 1000.99}) {
    for (const double expires_in : {0.5, 1.2, 2.9, 3.0, 5.0, 30.0}) {
      doorman::grpc_door::to_proto({10, expires_in, 5}, now, l);
      INFO("now " << now << ", expires_in " << expires_in);
      const auto expiry = static_cast<double>(l.expiry_time());
      if (expiry >= now) {
        CHECK(now + static_cast<double>(l.refresh_interval()) <= expiry);
      } else {
        CHECK(l.refresh_interval() == 0);  // gone in whole seconds already: at once
      }
      CHECK(static_cast<double>(l.expiry_time()) <= now + expires_in);
    }
  }
  doorman::grpc_door::to_proto({10, 2.9, 5}, 1000.9, l);  // 2.1 s to 1003: 2 (was 3, past it)
  CHECK(l.expiry_time() == 1003);
  CHECK(l.refresh_interval() == 2);
}

TEST_CASE("grpc calls are counted by method, outcome and door", "[grpc][process]") {
  grpc_node n("metrics", {"--admin", "127.0.0.1:0"});
  // (Logged before the gRPC port, which the fixture waited for.)
  const std::string log = n.node->log();
  const auto at = log.find("admin endpoint on http://");
  REQUIRE(at != std::string::npos);
  const auto from = at + std::string("admin endpoint on http://").size();
  const std::string admin = log.substr(from, log.find("/status", from) - from);
  ::doorman::GetCapacityResponse out;
  REQUIRE(n.stub->GetCapacity(grpc_node::context().get(), ask("c1", "api", 10), &out).ok());
  REQUIRE(n.stub->GetCapacity(grpc_node::context().get(), ask("c2", "api", 10), &out).ok());
  CHECK_FALSE(n.stub->GetCapacity(grpc_node::context().get(), ask("c3", "api", -1), &out).ok());
  const auto metrics = doorman_test::http_get(admin, "/metrics").body;
  CHECK_THAT(metrics,
             Catch::Contains(
                 R"(doorman_requests_total{method="get_capacity",outcome="ok",door="grpc"} 2)"));
  CHECK_THAT(
      metrics,
      Catch::Contains(
          R"(doorman_requests_total{method="get_capacity",outcome="invalid_params",door="grpc"} 1)"));
  CHECK_THAT(
      metrics,
      Catch::Contains(
          R"(doorman_requests_total{method="get_capacity",outcome="ok",door="json-rpc"} 0)"));
}

TEST_CASE("grpc and JSON-RPC give the same decisions for the same requests", "[grpc][process]") {
  grpc_node over_json("json");
  grpc_node over_grpc("grpc");
  doorman_test::line_client rpc(over_json.json_address);
  std::mt19937 random(7);
  const std::string resources[] = {"api", "db", "mail"};
  int compared = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string client = "c" + std::to_string(random() % 6);
    const std::string resource = resources[random() % 3];
    if (random() % 8 == 0) {  // a release, now and then
      ::doorman::ReleaseCapacityRequest rel;
      rel.set_client_id(client);
      rel.add_resource_id(resource);
      ::doorman::ReleaseCapacityResponse out;
      REQUIRE(over_grpc.stub->ReleaseCapacity(grpc_node::context().get(), rel, &out).ok());
      const auto j =
          rpc.call("release_capacity", {{"client_id", client}, {"resources", {resource}}});
      REQUIRE(j.contains("result"));
      continue;
    }
    const auto priority = static_cast<std::int64_t>(random() % 3);
    const double wants = static_cast<double>(random() % 81);
    auto req = ask(client, resource, wants);
    req.mutable_resource(0)->set_priority(priority);
    ::doorman::GetCapacityResponse out;
    REQUIRE(over_grpc.stub->GetCapacity(grpc_node::context().get(), req, &out).ok());
    const auto j = rpc.call(
        "get_capacity",
        {{"client_id", client},
         {"resources", {{{"resource_id", resource}, {"priority", priority}, {"wants", wants}}}}});
    REQUIRE(j.contains("result"));
    INFO("request " << i << ": " << client << " " << resource << " wants " << wants);
    CHECK(out.response(0).gets().capacity() ==
          j["result"]["resources"][0]["gets"]["capacity"].get<double>());
    ++compared;
  }
  CHECK(compared > 200);
}

namespace {

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A stub over TLS to `address`, showing `name`'s certificate (none: "").
std::unique_ptr<::doorman::Capacity::Stub> tls_stub(const std::string& address,
                                                    const std::string& name) {
  const auto& certs = doorman_test::test_certificates::get();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = file_text(certs("ca.pem"));
  if (!name.empty()) {
    o.pem_private_key = file_text(certs(name + ".key"));
    o.pem_cert_chain = file_text(certs(name + ".pem"));
  }
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  return ::doorman::Capacity::NewStub(
      grpc::CreateCustomChannel(address, grpc::SslCredentials(o), args));
}

}  // namespace

TEST_CASE("grpc over mutual TLS: the peer's certificate is its identity", "[grpc][tls][process]") {
  const auto& certs = doorman_test::test_certificates::get();
  grpc_node n("tls", {"--tls-cert", certs("node.pem"), "--tls-key", certs("node.key"), "--tls-ca",
                      certs("ca.pem"), "--tls-client-auth", "require"});
  const std::string a = "spiffe://doorman.test/client/a";
  auto client_a = tls_stub(n.address, "client-a");
  ::doorman::GetCapacityResponse out;
  // With no access file, an identity may use its own client ids only.
  REQUIRE(client_a->GetCapacity(grpc_node::context().get(), ask(a, "api", 10), &out).ok());
  CHECK(out.response(0).gets().capacity() == 10);
  REQUIRE(
      client_a->GetCapacity(grpc_node::context().get(), ask(a + "#worker", "api", 10), &out).ok());
  const auto refused = client_a->GetCapacity(
      grpc_node::context().get(), ask("spiffe://doorman.test/client/b", "api", 10), &out);
  CHECK(refused.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK_THAT(refused.error_message(), Catch::Contains("forbidden"));
  // Another certificate on another connection is its own identity, before and after the first
  // one's calls (the door remembers each certificate's identity by its text).
  auto client_b = tls_stub(n.address, "client-b");
  const std::string b = "spiffe://doorman.test/client/b";
  REQUIRE(client_b->GetCapacity(grpc_node::context().get(), ask(b, "api", 10), &out).ok());
  CHECK(client_b->GetCapacity(grpc_node::context().get(), ask(a, "api", 10), &out).error_code() ==
        grpc::StatusCode::PERMISSION_DENIED);
  CHECK(client_a->GetCapacity(grpc_node::context().get(), ask(b + "#worker", "api", 10), &out)
            .error_code() == grpc::StatusCode::PERMISSION_DENIED);
  REQUIRE(client_a->GetCapacity(grpc_node::context().get(), ask(a, "api", 10), &out).ok());
  // No certificate: no call at all.
  auto anonymous = tls_stub(n.address, "");
  const auto s = anonymous->GetCapacity(grpc_node::context().get(), ask(a, "api", 10), &out);
  CHECK(s.error_code() == grpc::StatusCode::UNAVAILABLE);
  // Plaintext to a TLS port: no call either.
  CHECK_FALSE(n.stub->GetCapacity(grpc_node::context().get(), ask(a, "api", 10), &out).ok());
}

// The names in the certificate a node showed on `stub`'s connection (after a Discovery).
std::string server_names(::doorman::Capacity::Stub& stub) {
  auto ctx = grpc_node::context();
  ::doorman::DiscoveryResponse d;
  if (!stub.Discovery(ctx.get(), {}, &d).ok()) return "(no answer)";
  std::string names;
  for (const auto& n : ctx->auth_context()->FindPropertyValues("x509_subject_alternative_name"))
    names += std::string(n.data(), n.size()) + " ";
  return names;
}

TEST_CASE("grpc: a parent link over gRPC with mutual TLS", "[grpc][tls][process]") {
  const auto& certs = doorman_test::test_certificates::get();
  grpc_node root("tls-root", {"--tls-cert", certs("node.pem"), "--tls-key", certs("node.key"),
                              "--tls-ca", certs("ca.pem"), "--tls-client-auth", "require"});
  grpc_node mid("tls-mid",
                {"--parent", root.address, "--parent-protocol", "grpc", "--parent-tls-cert",
                 certs("node2.pem"), "--parent-tls-key", certs("node2.key"), "--parent-tls-ca",
                 certs("ca.pem"), "--parent-tls-server-name", "localhost", "--id", "mid"});
  REQUIRE(mid.node->wait_for("parent " + root.address + " reached"));
  // Its clients get capacity leased over the TLS link.
  CHECK(capacity_within(*mid.stub, 10, std::chrono::seconds(20)) == 10);
}

TEST_CASE("grpc over TLS: SIGHUP rotates the gRPC port's certificate, a broken file is refused",
          "[grpc][tls][process]") {
  const auto& certs = doorman_test::test_certificates::get();
  const auto dir = std::filesystem::temp_directory_path() /
                   ("doorman-grpc-rotate-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto copy = [&](const std::string& from, const std::string& to) {
    std::filesystem::copy_file(certs(from), dir / to,
                               std::filesystem::copy_options::overwrite_existing);
  };
  copy("node.pem", "cert.pem");
  copy("node.key", "key.pem");
  grpc_node n("rotate",
              {"--tls-cert", (dir / "cert.pem").string(), "--tls-key", (dir / "key.pem").string(),
               "--tls-ca", certs("ca.pem"), "--tls-client-auth", "require"});
  CHECK_THAT(server_names(*tls_stub(n.address, "client-a")),
             Catch::Contains("spiffe://doorman.test/node/root "));

  copy("node2.pem", "cert.pem");
  copy("node2.key", "key.pem");
  n.node->signal(SIGHUP);
  REQUIRE(n.node->wait_for("gRPC TLS certificates reloaded"));
  // A new connection gets the new certificate; the port never closed.
  CHECK_THAT(server_names(*tls_stub(n.address, "client-a")),
             Catch::Contains("spiffe://doorman.test/node/root-2"));

  std::ofstream(dir / "cert.pem") << "not a certificate\n";
  n.node->signal(SIGHUP);
  const auto rejected = n.node->wait_for("gRPC TLS certificates rejected");
  REQUIRE(rejected);
  CHECK_THAT(*rejected, Catch::Contains("cert.pem"));
  CHECK_THAT(server_names(*tls_stub(n.address, "client-a")),
             Catch::Contains("spiffe://doorman.test/node/root-2"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("grpc: without certificates, --max-client-ids counts per peer host, across connections",
          "[grpc][process]") {
  grpc_node n("bound", {"--max-client-ids", "2"});
  const auto channel = [&](int i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    args.SetInt("doorman.test.connection", i);
    return ::doorman::Capacity::NewStub(
        grpc::CreateCustomChannel(n.address, grpc::InsecureChannelCredentials(), args));
  };
  auto a = channel(1);
  auto b = channel(2);
  ::doorman::GetCapacityResponse out;
  REQUIRE(a->GetCapacity(grpc_node::context().get(), ask("c1", "api", 10), &out).ok());
  REQUIRE(a->GetCapacity(grpc_node::context().get(), ask("c2", "api", 10), &out).ok());
  // Another connection from the same host shares the host's bound.
  const auto refused = b->GetCapacity(grpc_node::context().get(), ask("c3", "api", 10), &out);
  CHECK(refused.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK_THAT(refused.error_message(), Catch::Contains("2"));
  // A release frees a place for it.
  ::doorman::ReleaseCapacityRequest rel;
  rel.set_client_id("c1");
  rel.add_resource_id("api");
  ::doorman::ReleaseCapacityResponse released;
  REQUIRE(a->ReleaseCapacity(grpc_node::context().get(), rel, &released).ok());
  CHECK(b->GetCapacity(grpc_node::context().get(), ask("c3", "api", 10), &out).ok());
}

TEST_CASE("grpc mapping: mastership only in a non-master's answer, naming the master", "[grpc]") {
  doorman::capacity_response from_master;
  from_master.mastership = {true, "10.0.0.1:7700"};
  ::doorman::GetCapacityResponse a;
  doorman::grpc_door::to_proto(from_master, 1000, a);
  CHECK_FALSE(a.has_mastership());  // Doorman's clients read its presence as "not the master"

  doorman::capacity_response from_other;
  from_other.mastership = {false, "10.0.0.1:7700"};
  ::doorman::GetCapacityResponse b;
  doorman::grpc_door::to_proto(from_other, 1000, b);
  REQUIRE(b.has_mastership());
  CHECK(b.mastership().master_address() == "10.0.0.1:7700");

  doorman::release_response unknown;  // a non-master that knows no master
  unknown.mastership = {false, std::nullopt};
  ::doorman::ReleaseCapacityResponse c;
  doorman::grpc_door::to_proto(unknown, c);
  REQUIRE(c.has_mastership());
  CHECK_FALSE(c.mastership().has_master_address());

  ::doorman::DiscoveryResponse d;  // its mastership is required: always there
  doorman::grpc_door::to_proto(doorman::discovery_response{{true, "10.0.0.1:7700"}}, d);
  CHECK(d.is_master());
  CHECK(d.has_mastership());
  CHECK(d.IsInitialized());  // every proto2 required field is set
  CHECK(a.IsInitialized());
  CHECK(b.IsInitialized());
}

TEST_CASE("grpc mapping: a release padded with empty ids, as Doorman's Go client sends it",
          "[grpc]") {
  ::doorman::ReleaseCapacityRequest r;
  r.set_client_id("c1");
  r.add_resource_id("");
  r.add_resource_id("");
  r.add_resource_id("api");
  r.add_resource_id("db");
  std::vector<std::size_t> kept;
  const auto q = doorman::grpc_door::from_proto(r, &kept);
  CHECK(q.client_id == "c1");
  CHECK(q.resources == std::vector<std::string>{"api", "db"});
  CHECK(kept == std::vector<std::size_t>{2, 3});
  // An error names the proto's index, not the index after the empty ids were dropped.
  CHECK(doorman::grpc_door::proto_path("params.resources[1]: duplicate", "resource_id", kept) ==
        "resource_id[3]: duplicate");
  CHECK(doorman::grpc_door::proto_path("params.resources[7]: x", "resource_id", kept) ==
        "resource_id[7]: x");  // out of the map: left as it is
}
