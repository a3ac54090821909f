// Envoy's rate limit quota service (docs/envoy.md) on real doorman-node processes, driven by
// a C++ gRPC stream client generated from proto/envoy/rlqs.proto that does what Envoy's filter
// does (its reports, token buckets and times to live; see envoy_bucket): Envoys with uneven
// traffic behind an intermediate converge to their fair shares, and their token buckets let
// through no more than the capacity; an ended stream's share moves once its assignments run out
// (Envoy keeps them); a master change keeps every assignment valid; a hostile report ends its
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
#include <tuple>
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

// Buckets `envoy/name=*` as a budget of 300 every 10 s.
const char* rlqs_budget_config = R"({"resources": [
  {"identifier_glob": "envoy/name=*", "capacity": 300, "budget": {"window": 10},
   "algorithm": {"kind": "FAIR_SHARE", "lease_length": 30, "refresh_interval": 2}},
  {"identifier_glob": "*", "capacity": 0,
   "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 30, "refresh_interval": 2}}]})";

// The same, leases of 12 s, with a learning mode (of a lease length) after a master change.
const char* rlqs_learning_config = R"({"resources": [
  {"identifier_glob": "envoy/name=*", "capacity": 300,
   "algorithm": {"kind": "FAIR_SHARE", "lease_length": 12, "refresh_interval": 2}},
  {"identifier_glob": "*", "capacity": 0,
   "algorithm": {"kind": "NO_ALGORITHM", "lease_length": 12, "refresh_interval": 2}}]})";

// What Envoy's RLQS filter does with a bucket, as its source says (Envoy 1.36-1.37), for the
// fleet below to do the same:
// - it reports a bucket at once when it first sees it (one request allowed, time_elapsed 0),
//   then every reporting interval, time_elapsed in whole seconds, cut down;
// - it enforces blanket rules and token buckets, and drops an assignment of
//   requests_per_time_unit (it logs "not yet supported");
// - a token bucket starts full, and an assignment with an equal one (max_tokens,
//   tokens_per_fill, and fill_interval by its nanos) keeps the one it has; the fill rate is
//   tokens_per_fill over fill_interval's whole seconds;
// - an assignment lasts assignment_time_to_live's whole seconds, then no_assignment_behavior
//   (its default, ALLOW_ALL).
struct envoy_bucket {
  using action = pb::RateLimitQuotaResponse::BucketAction::QuotaAssignmentAction;
  bool assigned = false, deny = false, token_bucket = false;
  bool deny_unassigned = false;  // no_assignment_behavior DENY_ALL (else ALLOW_ALL)
  std::tuple<std::uint32_t, std::uint32_t, std::int32_t> key;  // max, per fill, nanos
  double max_tokens = 0, fill_rate = 0, tokens = 0;
  clock_type::time_point filled, until;

  // Takes an assignment; false if Envoy drops it.
  bool take(const action& q, clock_type::time_point now) {
    const auto& s = q.rate_limit_strategy();
    if (!s.has_token_bucket() && !s.has_blanket_rule()) return false;
    assigned = true;
    until = now + std::chrono::seconds(q.assignment_time_to_live().seconds());
    deny =
        s.has_blanket_rule() && s.blanket_rule() == ::envoy::type::v3::RateLimitStrategy::DENY_ALL;
    if (!s.has_token_bucket()) {
      token_bucket = false;
      return true;
    }
    const auto& t = s.token_bucket();
    const auto k =
        std::make_tuple(t.max_tokens(), t.tokens_per_fill().value(), t.fill_interval().nanos());
    if (token_bucket && k == key) return true;  // carried over
    token_bucket = true;
    key = k;
    max_tokens = tokens = t.max_tokens();
    fill_rate = t.tokens_per_fill().value() / static_cast<double>(t.fill_interval().seconds());
    filled = now;
    return true;
  }

  // Of `n` requests at `now`, how many it allows.
  double allow(double n, clock_type::time_point now) {
    if (!assigned || now >= until) return deny_unassigned ? 0 : n;
    if (deny) return 0;
    if (!token_bucket) return n;
    tokens = std::min(max_tokens,
                      tokens + fill_rate * std::chrono::duration<double>(now - filled).count());
    filled = now;
    const double a = std::min(n, tokens);
    tokens -= a;
    return a;
  }

  [[nodiscard]] double rate(clock_type::time_point now) const {
    return !assigned || now >= until || deny || !token_bucket ? 0 : fill_rate;
  }
};

// The whole fleet's view: each Envoy's bucket {name: api}, what they allowed, and the most
// their unexpired assignments ever added up to (checked at every message any Envoy reads).
struct fleet {
  std::mutex mu;
  std::map<int, envoy_bucket> buckets;
  double most = 0;
  double allowed = 0;  // by every Envoy
  double bursts = 0;   // every new token bucket's max_tokens (each starts full)
  int zeros = 0;       // DENY_ALL
  int dropped = 0;     // assignments Envoy drops
  double window = 0;   // a budget's window, seconds: what every Envoy allowed in each
  std::map<std::int64_t, double> per_window;

  std::int64_t window_at(std::chrono::system_clock::time_point t) const {
    return static_cast<std::int64_t>(
        std::floor(std::chrono::duration<double>(t.time_since_epoch()).count() / window));
  }

  void take(int envoy, const envoy_bucket::action& q) {
    std::lock_guard l(mu);
    const auto now = clock_type::now();
    auto& b = buckets[envoy];
    const auto key = b.key;
    const bool had = b.token_bucket;
    if (!b.take(q, now)) {
      ++dropped;
      return;
    }
    if (b.deny) ++zeros;
    if (b.token_bucket && (!had || key != b.key)) bursts += b.max_tokens;
    double sum = 0;
    for (const auto& [e, x] : buckets)
      sum += x.rate(now);
    most = std::max(most, sum);
  }
  double rate(int envoy) {
    std::lock_guard l(mu);
    return buckets[envoy].rate(clock_type::now());
  }
};

double rate_of(const envoy_bucket::action& q) {
  const auto& t = q.rate_limit_strategy().token_bucket();
  return t.tokens_per_fill().value() / static_cast<double>(t.fill_interval().seconds());
}

// One Envoy with `demand` requests a second of bucket {name: api}, on a stream to `address`:
// `serve` lets its requests through its bucket (the fleet's) and reports as Envoy does; a
// thread reads its assignments. `reconnect` opens a new stream, keeping what it holds.
struct fake_envoy {
  int index;
  fleet& all;
  std::atomic<double> demand;
  double every;  // reporting interval, seconds
  std::unique_ptr<pb::RateLimitQuotaService::Stub> stub;
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<
      grpc::ClientReaderWriter<pb::RateLimitQuotaUsageReports, pb::RateLimitQuotaResponse>>
      stream;
  std::thread reader;
  std::atomic<int> abandons{0};
  std::atomic<int> assignments{0};  // read on this stream
  bool announced = false;
  double allowed = 0, denied = 0;  // since the last report
  double total = 0;                // allowed in all
  clock_type::time_point served = clock_type::now(), reported = served;

  fake_envoy(int i, fleet& f, double d, const std::string& address, double interval = 1)
      : index(i), all(f), demand(d), every(interval) {
    open(address);
  }
  ~fake_envoy() { close(); }

  void open(const std::string& address) {
    stub = pb::RateLimitQuotaService::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    stream = stub->StreamRateLimitQuotas(ctx.get());
    assignments = 0;
    reader = std::thread([this] {
      pb::RateLimitQuotaResponse m;
      while (stream->Read(&m)) {
        for (const auto& a : m.bucket_action()) {
          if (a.has_abandon_action()) ++abandons;
          if (!a.has_quota_assignment_action()) continue;
          ++assignments;
          all.take(index, a.quota_assignment_action());
        }
      }
    });
  }

  void reconnect(const std::string& address) {
    close();
    open(address);
  }

  // The requests since the last call, and a report when one is due; false if a write failed.
  bool serve() {
    const auto now = clock_type::now();
    const double n = demand * std::chrono::duration<double>(now - served).count();
    served = now;
    {
      std::lock_guard l(all.mu);
      const double a = all.buckets[index].allow(n, now);
      all.allowed += a;
      if (all.window > 0) all.per_window[all.window_at(std::chrono::system_clock::now())] += a;
      total += a;
      allowed += a;
      denied += n - a;
    }
    if (!announced) {  // the bucket's first request: reported at once
      announced = true;
      reported = now;
      return write(0, 1, 0);
    }
    const double since = std::chrono::duration<double>(now - reported).count();
    if (since < every) return true;
    reported = now;
    const double a = std::floor(allowed), d = std::floor(denied);
    allowed -= a;
    denied -= d;
    return write(static_cast<std::int64_t>(since), static_cast<std::uint64_t>(a),
                 static_cast<std::uint64_t>(d));
  }

  bool write(std::int64_t seconds, std::uint64_t a, std::uint64_t d) {
    pb::RateLimitQuotaUsageReports r;
    r.set_domain("envoy");
    auto& u = *r.add_bucket_quota_usages();
    (*u.mutable_bucket_id()->mutable_bucket())["name"] = "api";
    u.mutable_time_elapsed()->set_seconds(seconds);
    u.set_num_requests_allowed(a);
    u.set_num_requests_denied(d);
    return stream->Write(r);
  }

  grpc::Status close() {
    if (!reader.joinable()) return grpc::Status::OK;
    stream->WritesDone();
    reader.join();
    return stream->Finish();
  }
};

// Every Envoy serves (and reports) every 0.1 s until `done()` or `within`; true if `done()`.
template <class Done>
bool drive(std::vector<std::unique_ptr<fake_envoy>>& envoys, std::chrono::seconds within,
           Done done) {
  const auto deadline = clock_type::now() + within;
  while (clock_type::now() < deadline) {
    for (auto& e : envoys)
      if (e) REQUIRE(e->serve());
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the requests' pace
  }
  return false;
}

// What the fleet allowed since it was made, beyond 300 a second and each token bucket's burst
// (each starts full, those held at the start included): at most 0.
struct allowance {
  fleet& f;
  clock_type::time_point from = clock_type::now();
  double allowed0 = 0, bursts0 = 0;
  explicit allowance(fleet& x) : f(x) {
    std::lock_guard l(f.mu);
    allowed0 = f.allowed;
    bursts0 = f.bursts;
    for (const auto& [e, b] : f.buckets)
      if (b.token_bucket) bursts0 -= b.max_tokens;
  }
  [[nodiscard]] double over() const {
    std::lock_guard l(f.mu);
    const double span = std::chrono::duration<double>(clock_type::now() - from).count();
    return (f.allowed - allowed0) - (300 * span + (f.bursts - bursts0));
  }
};

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
  CHECK(drive(envoys, std::chrono::seconds(60),
              [&] { return near(f.rate(0), 40) && near(f.rate(1), 130) && near(f.rate(2), 130); }));
  CHECK(f.most <= 300);
  // What the Envoys' token buckets let through, from here on: within the capacity.
  const allowance since(f);
  // A stream that ends: Envoy keeps enforcing its assignment until its time to live (the
  // fleet keeps counting it), so its share goes to the others only once that has run out;
  // freed at once, the unexpired assignments would add up past the capacity.
  CHECK(envoys[2]->close().ok());
  envoys[2].reset();
  const auto ended = clock_type::now();
  clock_type::time_point enforced_until;
  {
    std::lock_guard l(f.mu);
    enforced_until = f.buckets[2].until;
  }
  CHECK(drive(envoys, std::chrono::seconds(60), [&] { return near(f.rate(1), 200); }));
  const double took = std::chrono::duration<double>(clock_type::now() - ended).count();
  CAPTURE(took);
  CHECK(clock_type::now() >= enforced_until);  // not before the ended stream's assignment ran out
  CHECK(f.most <= 300);
  // Demand moves: the shares follow.
  envoys[0]->demand = 250;
  CHECK(drive(envoys, std::chrono::seconds(40),
              [&] { return near(f.rate(0), 150) && near(f.rate(1), 150); }));
  CHECK(f.most <= 300);
  CHECK(since.over() <= 1);
  CHECK(f.dropped == 0);  // every assignment one Envoy enforces
}

TEST_CASE("rlqs: a budget's bucket is spent in blocks drawn at the root, never over a window",
          "[grpc][rlqs][budget][process]") {
  grpc_node root("rlqs-budget", {}, rlqs_budget_config);
  fleet f;
  f.window = 10;
  std::vector<std::unique_ptr<fake_envoy>> envoys;
  for (int i = 0; i < 2; ++i) {
    f.buckets[i].deny_unassigned = true;  // as docs/envoy.md says to set for a budget
    envoys.push_back(std::make_unique<fake_envoy>(i, f, i == 0 ? 10 : 30, root.address));
  }
  // 400 wanted in each window of 10 s, 300 to spend: the second and third windows whole.
  const auto first = f.window_at(std::chrono::system_clock::now());
  CHECK(drive(envoys, std::chrono::seconds(40),
              [&] { return f.window_at(std::chrono::system_clock::now()) >= first + 3; }));
  std::lock_guard l(f.mu);
  for (const auto w : {first + 1, first + 2}) {
    INFO("window " << w - first);
    // The stand-in Envoy spends fractions of a request (demand x elapsed time): their sum may
    // pass 300 by rounding (300.000000542 seen under ASan), never by a request.
    CHECK(f.per_window[w] <= 300 + 1e-6);
    CHECK(f.per_window[w] >= 200);
  }
  CHECK(envoys[0]->total > 0);
  CHECK(envoys[1]->total > 2 * envoys[0]->total);
  CHECK(f.dropped == 0);
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
  // The first master is in its learning mode too (12 s from its election), and a bucket's
  // first 0 is held back a lease length: the shares come after that and a refresh or two
  // (a deadline, with room for a sanitizer build on a busy machine; 20 s was too short there).
  REQUIRE(drive(envoys, std::chrono::seconds(45),
                [&] { return near(f.rate(0), 100) && near(f.rate(1), 200); }));
  const allowance since(f);
  a.reset();  // SIGTERM: it resigns
  REQUIRE(b.node->wait_for("became master", std::chrono::seconds(20)));
  for (auto& e : envoys)
    e->reconnect(b.address);
  // The new master grants nothing in its learning mode (12 s): the Envoys keep the old
  // master's assignments (valid for 12 s), nothing replaces them with nothing, and then the
  // new master's take over. Never more than the capacity, counting every unexpired one.
  CHECK(drive(envoys, std::chrono::seconds(45), [&] {
    return envoys[0]->assignments > 0 && envoys[1]->assignments > 0 && near(f.rate(0), 100) &&
           near(f.rate(1), 200);
  }));
  CHECK(f.most <= 300);
  CHECK(f.zeros == 0);
  CHECK(f.dropped == 0);
  CHECK(since.over() <= 1);  // the old buckets held the Envoys meanwhile
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
  u.mutable_time_elapsed()->set_seconds(-1);
  auto status = refused(r);
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(status.error_message() ==
        "bucket_quota_usages[0].time_elapsed: must be at least 0 and at most 1e6 seconds");
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
  REQUIRE(one.serve());
  REQUIRE(two.serve());
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
