// Envoy's rate limit quota service (docs/envoy.md) on real doorman-node processes, driven by
// a C++ gRPC stream client generated from proto/envoy/rlqs.proto: Envoys with uneven traffic
// behind an intermediate converge to their fair shares, never over the capacity; a stream that
// ends frees its share; a master change keeps every assignment valid; a hostile report ends its
// stream with the field named; streams are bounded per identity.

#include <catch2/catch.hpp>

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "etcd_server.hpp"
#include "grpc_node.hpp"
#include "line_client.hpp"
#include "rlqs.grpc.pb.h"

namespace {

namespace pb = ::envoy::service::rate_limit_quota::v3;
using doorman_test::grpc_node;
using clock_type = std::chrono::steady_clock;

// Buckets `envoy/name=*`: 300 a second, FAIR_SHARE, a 30 s lease refreshed every 2 s.
const char* rlqs_config = R"({"resources": [
  {"identifier_glob": "envoy/name=*", "capacity": 300,
   "algorithm": {"kind": "FAIR_SHARE", "lease_length": 30, "refresh_interval": 2,
                 "learning_mode_duration": 0}},
  {"identifier_glob": "*", "capacity": 0,
   "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 30, "refresh_interval": 2}}]})";

// The same, leases of 12 s, with a learning mode (of a lease length) after a master change.
const char* rlqs_learning_config = R"({"resources": [
  {"identifier_glob": "envoy/name=*", "capacity": 300,
   "algorithm": {"kind": "FAIR_SHARE", "lease_length": 12, "refresh_interval": 2}},
  {"identifier_glob": "*", "capacity": 0,
   "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 12, "refresh_interval": 2}}]})";

// The whole fleet's view: each Envoy's assignment now, and the most their unexpired
// assignments ever added up to (checked at every message any Envoy reads).
struct fleet {
  std::mutex mu;
  std::map<int, std::pair<double, clock_type::time_point>> assigned;  // rate, until
  double most = 0;
  int zeros = 0;  // assignments of nothing

  void take(int envoy, double rate, double ttl) {
    std::lock_guard l(mu);
    if (rate == 0) ++zeros;
    const auto now = clock_type::now();
    assigned[envoy] = {rate, now + std::chrono::duration_cast<clock_type::duration>(
                                       std::chrono::duration<double>(ttl))};
    double sum = 0;
    for (const auto& [e, a] : assigned)
      if (a.second > now) sum += a.first;
    most = std::max(most, sum);
  }
  double rate(int envoy) {
    std::lock_guard l(mu);
    auto it = assigned.find(envoy);
    return it == assigned.end() || it->second.second <= clock_type::now() ? 0 : it->second.first;
  }
};

double rate_of(const pb::RateLimitQuotaResponse::BucketAction::QuotaAssignmentAction& q) {
  const auto& s = q.rate_limit_strategy().requests_per_time_unit();
  const double unit = s.time_unit() == ::envoy::type::v3::SECOND   ? 1
                      : s.time_unit() == ::envoy::type::v3::MINUTE ? 60
                                                                   : 3600;
  return static_cast<double>(s.requests_per_time_unit()) / unit;
}

// One Envoy: a stream to `address`, reporting `demand` requests a second of bucket
// {name: api} every half second (allowed up to its assignment), reading assignments on a thread.
struct fake_envoy {
  int index;
  fleet& all;
  std::atomic<double> demand;
  std::unique_ptr<pb::RateLimitQuotaService::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<
      grpc::ClientReaderWriter<pb::RateLimitQuotaUsageReports, pb::RateLimitQuotaResponse>>
      stream;
  std::thread reader;
  std::atomic<int> abandons{0};
  std::atomic<int> assignments{0};  // read on this stream

  fake_envoy(int i, fleet& f, double d, const std::string& address) : index(i), all(f), demand(d) {
    stub = pb::RateLimitQuotaService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    stream = stub->StreamRateLimitQuotas(&ctx);
    reader = std::thread([this] {
      pb::RateLimitQuotaResponse m;
      while (stream->Read(&m)) {
        for (const auto& a : m.bucket_action()) {
          if (a.has_abandon_action()) ++abandons;
          if (!a.has_quota_assignment_action()) continue;
          const auto& q = a.quota_assignment_action();
          ++assignments;
          const auto& ttl = q.assignment_time_to_live();
          all.take(index, rate_of(q), static_cast<double>(ttl.seconds()) + ttl.nanos() / 1e9);
        }
      }
    });
  }
  ~fake_envoy() { close(); }

  bool report(double elapsed) {
    pb::RateLimitQuotaUsageReports r;
    r.set_domain("envoy");
    auto& u = *r.add_bucket_quota_usages();
    (*u.mutable_bucket_id()->mutable_bucket())["name"] = "api";
    u.mutable_time_elapsed()->set_nanos(static_cast<std::int32_t>(elapsed * 1e9));
    const double got = all.rate(index);
    const double allowed = got > 0 ? std::min<double>(demand, got) : demand.load();
    u.set_num_requests_allowed(static_cast<std::uint64_t>(allowed * elapsed));
    u.set_num_requests_denied(static_cast<std::uint64_t>((demand - allowed) * elapsed));
    return stream->Write(r);
  }

  grpc::Status close() {
    if (!reader.joinable()) return grpc::Status::OK;
    stream->WritesDone();
    reader.join();
    return stream->Finish();
  }
};

// Reports from every Envoy every half second until `done()` or `deadline`; true if `done()`.
template <class Done>
bool drive(std::vector<std::unique_ptr<fake_envoy>>& envoys, std::chrono::seconds within,
           Done done) {
  const auto deadline = clock_type::now() + within;
  while (clock_type::now() < deadline) {
    for (auto& e : envoys)
      if (e) REQUIRE(e->report(0.5));
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // Envoy's reporting interval
  }
  return false;
}

bool near(double got, double want) {
  return std::abs(got - want) <= 1.5;
}

}  // namespace

TEST_CASE("rlqs: uneven Envoys behind an intermediate converge to their fair shares",
          "[grpc][rlqs][process]") {
  grpc_node root("rlqs-root", {}, rlqs_config);
  grpc_node mid("rlqs-mid", {"--parent", root.json_address, "--id", "mid"}, rlqs_config);
  REQUIRE(mid.node->wait_for("parent " + root.json_address + " reached"));
  fleet f;
  std::vector<std::unique_ptr<fake_envoy>> envoys;
  const std::vector<double> demand{40, 200, 400};
  for (int i = 0; i < 3; ++i)
    envoys.push_back(
        std::make_unique<fake_envoy>(i, f, demand[static_cast<std::size_t>(i)], mid.address));
  // 40 wanted is granted whole; the other 260 evenly to the two that want more.
  CHECK(drive(envoys, std::chrono::seconds(30),
              [&] { return near(f.rate(0), 40) && near(f.rate(1), 130) && near(f.rate(2), 130); }));
  CHECK(f.most <= 300);
  // A stream that ends frees its share: within a refresh or two the others have it.
  CHECK(envoys[2]->close().ok());
  envoys[2].reset();
  {
    std::lock_guard l(f.mu);
    f.assigned.erase(2);
  }
  // Within a refresh interval (2 s), a reporting interval (0.5 s) and the door's wake (0.2 s),
  // with 1.5 s of slack for a busy machine.
  const auto ended = clock_type::now();
  CHECK(drive(envoys, std::chrono::seconds(10), [&] { return near(f.rate(1), 200); }));
  const double took = std::chrono::duration<double>(clock_type::now() - ended).count();
  CAPTURE(took);
  CHECK(took <= 4.2);
  CHECK(f.most <= 300);
  // Demand moves: the shares follow.
  envoys[0]->demand = 250;
  CHECK(drive(envoys, std::chrono::seconds(20),
              [&] { return near(f.rate(0), 150) && near(f.rate(1), 150); }));
  CHECK(f.most <= 300);
}

TEST_CASE("rlqs: a master change keeps every assignment valid", "[grpc][rlqs][etcd][process]") {
  doorman_test::etcd_server etcd;
  const std::vector<std::string> elect{"--etcd-endpoints",   etcd.endpoint(),  "--election-key",
                                       "/doorman/rlqs-test", "--election-ttl", "3"};
  auto a = std::make_unique<grpc_node>("rlqs-a", elect, rlqs_learning_config);
  REQUIRE(a->node->wait_for("became master", std::chrono::seconds(20)));
  grpc_node b("rlqs-b", elect, rlqs_learning_config);
  fleet f;
  std::vector<std::unique_ptr<fake_envoy>> envoys;
  // The Envoys ask the master; after it goes, the new one (a stream ends when its node is no
  // longer master, and Envoy opens another).
  for (int i = 0; i < 2; ++i)
    envoys.push_back(std::make_unique<fake_envoy>(i, f, i == 0 ? 100 : 400, a->address));
  REQUIRE(drive(envoys, std::chrono::seconds(20),
                [&] { return near(f.rate(0), 100) && near(f.rate(1), 200); }));
  a.reset();  // SIGTERM: it resigns
  REQUIRE(b.node->wait_for("became master", std::chrono::seconds(20)));
  for (int i = 0; i < 2; ++i) {
    envoys[static_cast<std::size_t>(i)].reset();
    envoys[static_cast<std::size_t>(i)] =
        std::make_unique<fake_envoy>(i, f, i == 0 ? 100 : 400, b.address);
  }
  // The new master grants nothing in its learning mode (12 s): the Envoys keep the old
  // master's assignments (valid for 12 s), nothing replaces them with nothing, and then the
  // new master's take over. Never more than the capacity, counting every unexpired one.
  CHECK(drive(envoys, std::chrono::seconds(45), [&] {
    return envoys[0]->assignments > 0 && envoys[1]->assignments > 0 && near(f.rate(0), 100) &&
           near(f.rate(1), 200);
  }));
  CHECK(f.most <= 300);
  CHECK(f.zeros == 0);
}

TEST_CASE("rlqs: a hostile report ends its stream naming the field, and streams are bounded",
          "[grpc][rlqs][process]") {
  grpc_node root("rlqs-bounds", {"--rlqs-max-streams", "2"}, rlqs_config);
  auto stub = pb::RateLimitQuotaService::NewStub(
      grpc::CreateChannel(root.address, grpc::InsecureChannelCredentials()));
  const auto refused = [&](const pb::RateLimitQuotaUsageReports& r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto s = stub->StreamRateLimitQuotas(&ctx);
    s->Write(r);
    pb::RateLimitQuotaResponse m;
    while (s->Read(&m)) {
    }
    return s->Finish();
  };
  pb::RateLimitQuotaUsageReports r;
  r.set_domain("envoy");
  auto& u = *r.add_bucket_quota_usages();
  (*u.mutable_bucket_id()->mutable_bucket())["name"] = "api";
  u.set_num_requests_allowed(10);
  auto status = refused(r);  // no time_elapsed
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message() ==
        "bucket_quota_usages[0].time_elapsed: must be more than 0 and at most 1e6 seconds");
  u.mutable_time_elapsed()->set_seconds(1);
  r.set_domain("");
  status = refused(r);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message() == "domain: must be given in the stream's first message");
  // Nothing was granted to the refused streams.
  doorman_test::line_client c(root.json_address);
  REQUIRE(c.send(doorman_test::request_line(1, "status", {{"resource_id", "envoy/name=api"}})));
  const auto line = c.read_line(std::chrono::seconds(5));
  REQUIRE(line);
  CHECK(nlohmann::json::parse(*line)["result"]["resources"][0]["sum_has"] == 0);
  // Two streams from this host at once, not three.
  fleet f;
  fake_envoy one(0, f, 10, root.address), two(1, f, 10, root.address);
  REQUIRE(one.report(0.5));
  REQUIRE(two.report(0.5));
  r.set_domain("envoy");
  status = refused(r);
  CHECK(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(status.error_message() == "streams: at most 2 per identity (ipv4:127.0.0.1)");
}

TEST_CASE("rlqs over mutual TLS: a stream is a client of its certificate's identity",
          "[grpc][rlqs][tls][process]") {
  const auto& certs = doorman_test::test_certificates::get();
  grpc_node n("rlqs-tls",
              {"--tls-cert", certs("node.pem"), "--tls-key", certs("node.key"), "--tls-ca",
               certs("ca.pem"), "--tls-client-auth", "require"},
              rlqs_config);
  const auto read = [](const std::string& path) {
    std::ifstream in(path);
    return std::string{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  };
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = read(certs("ca.pem"));
  o.pem_private_key = read(certs("client-a.key"));
  o.pem_cert_chain = read(certs("client-a.pem"));
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  auto stub = pb::RateLimitQuotaService::NewStub(
      grpc::CreateCustomChannel(n.address, grpc::SslCredentials(o), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto s = stub->StreamRateLimitQuotas(&ctx);
  pb::RateLimitQuotaUsageReports r;
  r.set_domain("envoy");
  auto& u = *r.add_bucket_quota_usages();
  (*u.mutable_bucket_id()->mutable_bucket())["name"] = "api";
  u.mutable_time_elapsed()->set_seconds(1);
  u.set_num_requests_allowed(50);
  REQUIRE(s->Write(r));
  // Granted under its identity's own client id, without an access file.
  pb::RateLimitQuotaResponse m;
  if (!s->Read(&m)) {
    const auto status = s->Finish();
    FAIL(status.error_message());
  }
  REQUIRE(m.bucket_action_size() == 1);
  CHECK(rate_of(m.bucket_action(0).quota_assignment_action()) == 50);
  s->WritesDone();
  while (s->Read(&m)) {
  }
  CHECK(s->Finish().ok());
}
