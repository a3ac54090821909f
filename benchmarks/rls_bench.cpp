// doorman_bench_rls: Envoy's rate limit service on a real doorman-rls, for docs/envoy.md.
//
//   doorman_bench_rls [--rls-binary PATH] [--node-binary PATH] [--floor-binary PATH]
//                     [--seconds S] [--window N] [--keys N,N,...] [--redis-server PATH]
//                     [--accuracy-seconds S] [--replicas N] [--tls DIR] [--json FILE]
//                     [--svg FILE]
//
// Speed: a doorman-rls pinned to core 0 (taskset), answering ShouldRateLimit for --keys distinct
// keys (one descriptor each, picked at random per call, a rule of 10^9 a minute so that every
// key is counted and none refused): calls/s with --window calls in flight from core 1 (gRPC's
// callback API), its CPU per call, and latency p50/p99 (call made -> answer taken). Beside it, in
// the same run, what envoyproxy/ratelimit pays per request at least: one Redis round trip of a
// pipelined INCRBY and EXPIRE on a redis-server pinned to core 0, over the same keys, with
// --window connections (one in flight each). Then the same doorman-rls with --server: each key
// drawn in blocks from a doorman-node root's count (a round trip per block, not per request);
// and with --server --block-fraction 0, every request counted at the root (one round trip to
// the root per call). The root's CPU is not in the figures. First in each group, on the same
// load: the gRPC floor (doorman_bench_grpc_floor: hosted as the doors are, answering OK on
// gRPC's thread), and each row's CPU per call as a ratio to it ("× floor"). With --tls DIR
// (certificates made by examples/make_certs.sh DIR), last in each group: the gRPC floor and
// doorman-rls (alone) again over TLS (node.pem; the generator checks it against ca.pem), the
// latter's ratio to the former.
//
// Accuracy: --replicas doorman-rls replicas share one limit (60 a second on one key) under
// uneven, shifting offered traffic, paced open loop, in three phases of --accuracy-seconds: over
// the limit with 60/30/10% of the traffic on the replicas, over it with 10/30/60%, and under it
// (a quarter of the limit) with 60/30/10%. Per window (a second of the monotonic clock, where
// the root and the replicas on this machine put their windows), the fleet's admitted calls are
// compared with an ideal single counter (a fixed window: min(offered, limit)): a call is offered
// in the window it was sent in, admitted in the window its answer's reset names. Over and under
// are summed over the windows, per mode: each replica alone (envoyproxy/ratelimit without a shared
// Redis, or doorman-rls without --server), blocks drawn from the root's count (--server) and
// every request counted at the root (--server --block-fraction 0). Then a new key of a rule of
// 300 a minute, asked at 2 and at 3 replicas as fast as they answer for 3 s: per window of a
// minute, the fleet's admitted calls against the limit.

#include <doorman/net/address.hpp>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "answer_queue.hpp"
#include "arguments.hpp"
#include "proc_stats.hpp"
#include "process.hpp"
#include "rls.grpc.pb.h"

namespace {

const char* const usage =
    "usage: doorman_bench_rls [--rls-binary PATH] [--node-binary PATH] [--floor-binary PATH]\n"
    "                         [--seconds S] [--window N] [--keys N,N,...]\n"
    "                         [--redis-server PATH] [--accuracy-seconds S] [--replicas N]\n"
    "                         [--tls DIR] [--json FILE] [--svg FILE]\n";

using clock_type = std::chrono::steady_clock;
namespace pb = ::envoy::service::ratelimit::v3;

struct options {
  std::string rls_binary = DOORMAN_RLS_BINARY;
  std::string node_binary = DOORMAN_NODE_BINARY;
  std::string floor_binary = DOORMAN_GRPC_FLOOR_BINARY;
  std::string redis_binary = "/usr/bin/redis-server";
  double seconds = 3;
  int window = 32;
  std::vector<long> keys = {1000, 10000, 100000};
  double accuracy_seconds = 20;
  int replicas = 3;
  std::string tls_dir;  // with --tls: the speed of the floor and doorman-rls over TLS too
  std::string json_file;
  std::string svg_file;
};

// How the replicas count: alone, in blocks drawn from a root's count, or every request at it.
enum class mode { alone, blocks, each };
constexpr std::array<mode, 3> all_modes = {mode::alone, mode::blocks, mode::each};

// The flags a replica of `m` adds (the root at `root`).
std::vector<std::string> mode_flags(mode m, const std::string& root) {
  if (m == mode::alone) return {};
  if (m == mode::blocks) return {"--server", root};
  return {"--server", root, "--block-fraction", "0"};
}

struct speed_result {
  std::string server;  // "doorman-rls", "doorman-rls --server", "redis INCRBY+EXPIRE"
  long keys = 0;
  double calls_per_s = 0, cpu_us_per_call = 0, p50_us = 0, p99_us = 0;
  long errors = 0;
};

struct accuracy_result {
  std::string mode;
  std::string phase;
  long offered = 0, ideal = 0, admitted = 0, over = 0, under = 0;
  std::vector<std::pair<long, long>> per_second;  // ideal, admitted
};

std::string key_name(long k) {
  return fmt::format("user-{}", k);
}

pb::RateLimitRequest ask_for(const std::string& domain, const std::string& key,
                             const std::string& value) {
  pb::RateLimitRequest r;
  r.set_domain(domain);
  auto& e = *r.add_descriptors()->add_entries();
  e.set_key(key);
  e.set_value(value);
  return r;
}

// A started server process and the address it said it listens on.
struct started {
  std::unique_ptr<doorman_examples::process> p;
  std::string address;
};

// Starts `args`, logging to `log` numbered by the start (`3-floor-1000.log`): a log that an
// earlier process wrote still holds its "listening on" line, which would send the load to a
// closed port (`--keys 1000,1000` measured refused calls in its second group).
started start(std::vector<std::string> args, const std::filesystem::path& log,
              const std::string& line) {
  static int starts = 0;
  const auto own = log.parent_path() / fmt::format("{}-{}", ++starts, log.filename().string());
  started s;
  s.p = std::make_unique<doorman_examples::process>(std::move(args), own.string());
  const auto l = s.p->wait_for(line);
  if (!l) throw std::runtime_error("did not start: " + s.p->log());
  s.address = l->substr(l->rfind(' ') + 1);
  return s;
}

void stop(started& s) {
  s.p->signal(SIGTERM);
  s.p->wait_exit();
}

// A root for --server, configured by doorman-rls --print-root-config over `config`.
started start_root(const options& o, const std::filesystem::path& dir,
                   const std::filesystem::path& config, const std::string& name) {
  static int roots = 0;
  const auto json = dir / fmt::format("{}-root-{}.json", name, ++roots);
  const std::string cmd = fmt::format("{} --config {} --print-root-config > {}", o.rls_binary,
                                      config.string(), json.string());
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  return start(
      {o.node_binary, "--listen", "127.0.0.1:0", "--admin", "off", "--config", json.string()},
      dir / fmt::format("{}-root-{}.log", name, roots), "listening on ");
}

// --window calls in flight through gRPC's callback API; answers taken on this thread.
class rls_load {
 public:
  // `ca_pem`: TLS, the server's certificate checked against it; empty: plaintext.
  explicit rls_load(const std::string& address, const std::string& ca_pem = {})
      : stub_(pb::RateLimitService::NewStub(grpc::CreateChannel(address, credentials(ca_pem)))) {}

  static std::shared_ptr<grpc::ChannelCredentials> credentials(const std::string& ca_pem) {
    if (ca_pem.empty()) return grpc::InsecureChannelCredentials();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ca_pem;
    return grpc::SslCredentials(ssl);
  }

  // Calls for `seconds`, each for a key picked at random; `seconds` 0: each key once, in order.
  speed_result drive(const options& o, long keys, pid_t server, double seconds) {
    speed_result r;
    r.keys = keys;
    std::mt19937_64 random(42);
    std::uniform_int_distribution<long> random_key(0, keys - 1);
    long next = 0;
    const auto pick = [&](std::mt19937_64& g) { return seconds > 0 ? random_key(g) : next++; };
    std::vector<double> latencies;
    const auto t0 = clock_type::now();
    const auto until = t0 + std::chrono::duration_cast<clock_type::duration>(
                                std::chrono::duration<double>(seconds));
    const double cpu0 = doorman_bench::cpu_seconds(server);
    long pending = 0, counted = 0;
    bool open = true;
    double elapsed = 0, cpu = 0;
    for (int i = 0; i < o.window && (seconds > 0 || next < keys); ++i, ++pending)
      send(key_name(pick(random)));
    while (pending > 0) {
      auto done = answers_.take(std::chrono::seconds(10));
      if (!done) throw std::runtime_error("no answer from doorman-rls in 10 s");
      --pending;
      if (open && (seconds > 0 ? clock_type::now() >= until : next >= keys)) {
        open = false;
        elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
        cpu = doorman_bench::cpu_seconds(server) - cpu0;
      }
      if (!open) continue;
      ++counted;
      if (!done->status.ok() || done->response.overall_code() != pb::RateLimitResponse::OK) {
        if (r.errors++ == 0) {  // the first one, said: a failed call or a refusal
          fmt::print(stderr, "first error: {}\n",
                     done->status.ok() ? "refused (OVER_LIMIT)"
                                       : fmt::format("gRPC status {}: {}",
                                                     static_cast<int>(done->status.error_code()),
                                                     done->status.error_message()));
        }
      }
      latencies.push_back(
          std::chrono::duration<double, std::micro>(done->answered - done->sent).count());
      if (seconds > 0 || next < keys) {
        send(key_name(pick(random)));
        ++pending;
      }
    }
    r.calls_per_s = static_cast<double>(counted) / elapsed;
    r.cpu_us_per_call = cpu * 1e6 / static_cast<double>(counted);
    r.p50_us = doorman_bench::percentile(latencies, 0.5);
    r.p99_us = doorman_bench::percentile(latencies, 0.99);
    return r;
  }

  // One call, synchronously: admitted or not.
  // When `q` is admitted: the end of the window it was admitted in (the answer's time plus its
  // duration_until_reset, on the monotonic clock that every process here shares).
  std::optional<clock_type::time_point> admit(const pb::RateLimitRequest& q) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::RateLimitResponse out;
    const auto st = stub_->ShouldRateLimit(&ctx, q, &out);
    if (!st.ok()) throw std::runtime_error("ShouldRateLimit: " + st.error_message());
    if (out.overall_code() != pb::RateLimitResponse::OK || out.statuses_size() != 1)
      return std::nullopt;
    const auto& reset = out.statuses(0).duration_until_reset();
    return clock_type::now() + std::chrono::seconds(reset.seconds()) +
           std::chrono::nanoseconds(reset.nanos());
  }

 private:
  struct call {
    grpc::ClientContext context;
    pb::RateLimitRequest request;
    pb::RateLimitResponse response;
    grpc::Status status;
    clock_type::time_point sent, answered;
  };

  void send(const std::string& key) {
    auto c = std::make_unique<call>();
    c->request = ask_for("bench", "user", key);
    c->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    c->sent = clock_type::now();
    call* raw = c.release();
    stub_->async()->ShouldRateLimit(&raw->context, &raw->request, &raw->response,
                                    answers_.on_done(raw));
  }

  std::unique_ptr<pb::RateLimitService::Stub> stub_;
  doorman_bench::answer_queue<call> answers_;
};

// One blocking connection to Redis speaking RESP: INCRBY and EXPIRE pipelined, as
// envoyproxy/ratelimit's fixed-window cache sends them for each request.
class redis_connection {
 public:
  explicit redis_connection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      throw std::runtime_error("cannot connect to redis-server");
    }
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  redis_connection(const redis_connection&) = delete;
  redis_connection& operator=(const redis_connection&) = delete;
  ~redis_connection() { ::close(fd_); }

  // INCRBY key 1, EXPIRE key 60: the count after it (both replies read).
  long incr(const std::string& key) {
    const std::string q = fmt::format(
        "*3\r\n$6\r\nINCRBY\r\n${}\r\n{}\r\n$1\r\n1\r\n*3\r\n$6\r\nEXPIRE\r\n${}\r\n{}\r\n$"
        "2\r\n60\r\n",
        key.size(), key, key.size(), key);
    for (std::size_t sent = 0; sent < q.size();) {
      const auto n = ::send(fd_, q.data() + sent, q.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("redis: send failed");
      sent += static_cast<std::size_t>(n);
    }
    const long count = read_integer();
    read_integer();
    return count;
  }

 private:
  long read_integer() {
    for (;;) {
      if (const auto nl = in_.find("\r\n"); nl != std::string::npos) {
        if (in_[0] != ':') throw std::runtime_error("redis: " + in_.substr(0, nl));
        const long v = std::stol(in_.substr(1, nl - 1));
        in_.erase(0, nl + 2);
        return v;
      }
      char buffer[512];
      const auto n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) throw std::runtime_error("redis: connection closed");
      in_.append(buffer, static_cast<std::size_t>(n));
    }
  }

  int fd_ = -1;
  std::string in_;
};

// --window connections, each a thread with one request in flight.
speed_result drive_redis(const options& o, int port, long keys, pid_t server) {
  speed_result r;
  r.server = "redis INCRBY+EXPIRE";
  r.keys = keys;
  std::vector<std::vector<double>> latencies(static_cast<std::size_t>(o.window));
  std::vector<long> errors(latencies.size(), 0);
  std::atomic<bool> go{false};
  const double cpu0 = doorman_bench::cpu_seconds(server);
  const auto t0 = clock_type::now();
  const auto until = t0 + std::chrono::duration_cast<clock_type::duration>(
                              std::chrono::duration<double>(o.seconds));
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < latencies.size(); ++i) {
      threads.emplace_back([&, i] {
        redis_connection c(port);
        std::mt19937_64 random(i);
        std::uniform_int_distribution<long> pick(0, keys - 1);
        while (clock_type::now() < until) {
          const auto sent = clock_type::now();
          if (c.incr(key_name(pick(random))) < 1) ++errors[i];
          latencies[i].push_back(
              std::chrono::duration<double, std::micro>(clock_type::now() - sent).count());
        }
      });
    }
  }
  const double elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
  const double cpu = doorman_bench::cpu_seconds(server) - cpu0;
  std::vector<double> all;
  for (auto& l : latencies)
    all.insert(all.end(), l.begin(), l.end());
  for (const long e : errors)
    r.errors += e;
  r.calls_per_s = static_cast<double>(all.size()) / elapsed;
  r.cpu_us_per_call = cpu * 1e6 / static_cast<double>(all.size());
  r.p50_us = doorman_bench::percentile(all, 0.5);
  r.p99_us = doorman_bench::percentile(all, 0.99);
  return r;
}

// The gRPC floor, then doorman-rls alone, over TLS (--tls): two rows for `keys` into `out`.
void speed_tls(const options& o, const std::filesystem::path& dir,
               const std::filesystem::path& config, long keys, std::vector<speed_result>& out) {
  std::ifstream in(o.tls_dir + "/ca.pem");
  const std::string ca((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (ca.empty()) {
    throw std::invalid_argument("--tls: no " + o.tls_dir +
                                "/ca.pem (make the certificates with examples/make_certs.sh DIR)");
  }
  const std::vector<std::string> tls = {"--tls-cert", o.tls_dir + "/node.pem", "--tls-key",
                                        o.tls_dir + "/node.key"};
  for (const bool floor : {true, false}) {
    std::vector<std::string> args =
        floor ? std::vector<std::string>{"/usr/bin/taskset", "-c", "0", o.floor_binary}
              : std::vector<std::string>{"/usr/bin/taskset", "-c",           "0",
                                         o.rls_binary,       "--listen",     "127.0.0.1:0",
                                         "--config",         config.string()};
    args.insert(args.end(), tls.begin(), tls.end());
    auto server = start(args, dir / fmt::format("tls-{}-{}.log", floor ? "floor" : "rls", keys),
                        floor ? "gRPC floor listening on " : "RateLimitService listening on ");
    rls_load load(server.address, ca);
    (void)load.drive(o, keys, server.p->pid(), 0);
    auto r = load.drive(o, keys, server.p->pid(), o.seconds);
    r.server = floor ? "gRPC floor over TLS" : "doorman-rls over TLS";
    out.push_back(r);
    fmt::print(stderr, "{} keys {}: {:.0f} calls/s\n", r.server, keys, r.calls_per_s);
    stop(server);
  }
}

std::vector<speed_result> speed(const options& o, const std::filesystem::path& dir) {
  std::vector<speed_result> out;
  const auto config = dir / "speed";
  std::filesystem::create_directories(config);
  std::ofstream(config / "bench.yaml")
      << "domain: bench\ndescriptors:\n  - key: user\n    rate_limit:\n"
         "      unit: minute\n      requests_per_unit: 1000000000\n";
  const bool redis = std::filesystem::exists(o.redis_binary);
  if (!redis) fmt::print(stderr, "no {}: the Redis rows are left out\n", o.redis_binary);
  for (const long keys : o.keys) {
    {
      auto floor = start({"/usr/bin/taskset", "-c", "0", o.floor_binary},
                         dir / fmt::format("floor-{}.log", keys), "gRPC floor listening on ");
      rls_load load(floor.address);
      (void)load.drive(o, keys, floor.p->pid(), 0);
      auto r = load.drive(o, keys, floor.p->pid(), o.seconds);
      r.server = "gRPC floor";
      out.push_back(r);
      fmt::print(stderr, "gRPC floor keys {}: {:.0f} calls/s\n", keys, r.calls_per_s);
      stop(floor);
    }
    for (const mode m : all_modes) {
      std::optional<started> root;
      std::vector<std::string> args = {"/usr/bin/taskset", "-c",           "0",
                                       o.rls_binary,       "--listen",     "127.0.0.1:0",
                                       "--config",         config.string()};
      if (m != mode::alone) root = start_root(o, dir, config, "speed");
      const auto more = mode_flags(m, root ? root->address : "");
      args.insert(args.end(), more.begin(), more.end());
      auto rls = start(args, dir / fmt::format("speed-{}-{}.log", keys, static_cast<int>(m)),
                       "RateLimitService listening on ");
      rls_load load(rls.address);
      // Every key once first (each a new key, and with --server a first block drawn), so that
      // the measured calls are steady state.
      (void)load.drive(o, keys, rls.p->pid(), 0);
      auto r = load.drive(o, keys, rls.p->pid(), o.seconds);
      static constexpr std::array<const char*, 3> names = {
          "doorman-rls", "doorman-rls --server", "doorman-rls --server --block-fraction 0"};
      r.server = names[static_cast<std::size_t>(m)];
      out.push_back(r);
      fmt::print(stderr, "{} keys {}: {:.0f} calls/s\n", r.server, keys, r.calls_per_s);
      stop(rls);
      if (root) stop(*root);
    }
    if (redis) {
      const int port = 20000 + static_cast<int>(::getpid() % 20000);
      started server;
      server.p = std::make_unique<doorman_examples::process>(
          std::vector<std::string>{"/usr/bin/taskset", "-c", "0", o.redis_binary, "--port",
                                   std::to_string(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--logfile",
                                   (dir / fmt::format("redis-{}.log", keys)).string()},
          (dir / "redis-stderr.log").string());
      // Ready when it takes a connection (a deadline, polling).
      const auto deadline = clock_type::now() + std::chrono::seconds(10);
      for (;;) {
        try {
          redis_connection probe(port);
          break;
        } catch (const std::exception&) {
          if (clock_type::now() > deadline || !server.p->running())
            throw std::runtime_error("redis-server did not start on port " + std::to_string(port));
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling period
        }
      }
      out.push_back(drive_redis(o, port, keys, server.p->pid()));
      fmt::print(stderr, "redis keys {}: {:.0f} calls/s\n", keys, out.back().calls_per_s);
      stop(server);
    }
    if (!o.tls_dir.empty()) speed_tls(o, dir, config, keys, out);
  }
  return out;
}

// The offered rate of each replica in each phase, as a share of the total.
struct phase {
  const char* name;
  double total;  // × the limit
  std::array<double, 3> share;
};

// Per window, what `seen` (per replica: offered and admitted per window) adds up to for the
// fleet, against an ideal counter of `limit` per window; `partial`: the first and last windows
// are left out.
accuracy_result fold(const std::string& mode, const std::string& phase,
                     const std::vector<std::map<long, std::pair<long, long>>>& seen, long limit,
                     bool partial) {
  accuracy_result r;
  r.mode = mode;
  r.phase = phase;
  std::map<long, std::pair<long, long>> fleet;
  for (const auto& per : seen)
    for (const auto& [window, c] : per) {
      fleet[window].first += c.first;
      fleet[window].second += c.second;
    }
  if (partial && fleet.size() > 2) {
    fleet.erase(fleet.begin());
    fleet.erase(std::prev(fleet.end()));
  }
  for (const auto& [window, c] : fleet) {
    const long ideal = std::min(c.first, limit);
    r.offered += c.first;
    r.ideal += ideal;
    r.admitted += c.second;
    r.over += std::max(0L, c.second - ideal);
    r.under += std::max(0L, ideal - c.second);
    r.per_second.emplace_back(ideal, c.second);
  }
  fmt::print(stderr, "{}, {}: ideal {} admitted {}\n", mode, phase, r.ideal, r.admitted);
  return r;
}

std::vector<accuracy_result> accuracy(const options& o, const std::filesystem::path& dir) {
  constexpr long limit = 60;          // a second
  constexpr long minute_limit = 300;  // a minute, at a new key
  const std::vector<phase> phases = {
      {"over, 60/30/10%", 2.0, {0.6, 0.3, 0.1}},
      {"over, shifted to 10/30/60%", 2.0, {0.1, 0.3, 0.6}},
      {"under (a quarter), 60/30/10%", 0.25, {0.6, 0.3, 0.1}},
  };
  const auto config = dir / "accuracy";
  std::filesystem::create_directories(config);
  std::ofstream(config / "shared.yaml") << fmt::format(
      "domain: shared\ndescriptors:\n  - key: tenant\n    rate_limit:\n"
      "      unit: second\n      requests_per_unit: {}\n",
      limit);
  std::ofstream(config / "minute.yaml") << fmt::format(
      "domain: minute\ndescriptors:\n  - key: tenant\n    rate_limit:\n"
      "      unit: minute\n      requests_per_unit: {}\n",
      minute_limit);
  const auto replicas = static_cast<std::size_t>(std::clamp(o.replicas, 1, 3));
  std::vector<accuracy_result> out;
  for (const mode m : all_modes) {
    static constexpr std::array<const char*, 3> names = {
        "each replica alone", "blocks (--server)", "every request (--server --block-fraction 0)"};
    const std::string mode_name = names[static_cast<std::size_t>(m)];
    std::optional<started> root;
    if (m != mode::alone) root = start_root(o, dir, config, "accuracy");
    std::vector<started> rls;
    for (std::size_t i = 0; i < replicas; ++i) {
      std::vector<std::string> args = {o.rls_binary, "--listen", "127.0.0.1:0", "--config",
                                       config.string()};
      const auto more = mode_flags(m, root ? root->address : "");
      args.insert(args.end(), more.begin(), more.end());
      rls.push_back(start(args, dir / fmt::format("accuracy-{}-{}.log", static_cast<int>(m), i),
                          "RateLimitService listening on "));
    }
    const auto q = ask_for("shared", "tenant", "t1");
    for (const auto& ph : phases) {
      // Per replica and window: offered and admitted.
      std::vector<std::map<long, std::pair<long, long>>> seen(replicas);
      const auto t0 = clock_type::now();
      const auto end = t0 + std::chrono::duration_cast<clock_type::duration>(
                                std::chrono::duration<double>(o.accuracy_seconds));
      {
        std::vector<std::jthread> threads;
        for (std::size_t i = 0; i < replicas; ++i) {
          threads.emplace_back([&, i] {
            rls_load load(rls[i].address);
            const double rate = ph.total * static_cast<double>(limit) * ph.share[i];
            const auto gap = std::chrono::duration_cast<clock_type::duration>(
                std::chrono::duration<double>(1.0 / rate));
            for (auto at = t0 + gap * static_cast<long>(i); at < end; at += gap) {
              std::this_thread::sleep_until(at);  // pacing: an open loop at `rate`
              // Offered in the window (a second of the monotonic clock) it was sent in;
              // admitted in the one its answer names (the window's end rounded to the
              // second: a request waiting on the root may be counted in the next window).
              const auto second = [](clock_type::time_point t) {
                return static_cast<long>(
                    std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count());
              };
              ++seen[i][second(clock_type::now())].first;
              if (const auto window_end = load.admit(q)) {
                ++seen[i][second(*window_end + std::chrono::milliseconds(500)) - 1].second;
              }
            }
          });
        }
      }
      // The first and last seconds are partial: left out.
      out.push_back(fold(mode_name, ph.name, seen, limit, true));
    }
    // A new key of a per-minute rule, asked at 2 and then 3 replicas as fast as they answer
    // (one call in flight each) for 3 s: per window of a minute, the fleet's admitted against
    // the limit.
    for (std::size_t n = 2; n <= replicas; ++n) {
      const auto fresh = ask_for("minute", "tenant", fmt::format("new-{}", n));
      std::vector<std::map<long, std::pair<long, long>>> seen(n);
      const auto until = clock_type::now() + std::chrono::seconds(3);
      {
        std::vector<std::jthread> threads;
        for (std::size_t i = 0; i < n; ++i) {
          threads.emplace_back([&, i] {
            rls_load load(rls[i].address);
            const auto minute = [](clock_type::time_point t) {
              return static_cast<long>(t.time_since_epoch() / std::chrono::minutes(1));
            };
            while (clock_type::now() < until) {
              ++seen[i][minute(clock_type::now())].first;
              if (const auto window_end = load.admit(fresh))
                ++seen[i][minute(*window_end + std::chrono::seconds(30)) - 1].second;
            }
          });
        }
      }
      out.push_back(fold(mode_name,
                         fmt::format("new key, {} a minute, {} replicas flat out", minute_limit, n),
                         seen, minute_limit, false));
      out.back().per_second.clear();  // not in the chart of the seconds
    }
    for (auto& s : rls)
      stop(s);
    if (root) stop(*root);
  }
  return out;
}

// The fleet's admitted requests each second against the ideal, per mode, phase after phase.
void write_svg(const std::string& file, const std::vector<accuracy_result>& results) {
  std::vector<std::string> modes;
  std::map<std::string, std::vector<long>> admitted;
  std::vector<long> ideal;
  std::vector<std::size_t> phase_ends;
  for (const auto& r : results) {
    if (r.per_second.empty()) continue;  // not a phase of the seconds (a new key's minute)
    if (std::find(modes.begin(), modes.end(), r.mode) == modes.end()) modes.push_back(r.mode);
    for (const auto& [i, a] : r.per_second) {
      admitted[r.mode].push_back(a);
      if (r.mode == modes.front()) ideal.push_back(i);
    }
    if (r.mode == modes.front()) phase_ends.push_back(ideal.size());
  }
  long top = 1;
  for (const auto& [m, v] : admitted)
    for (const long a : v)
      top = std::max(top, a);
  const double w = 720, h = 340, left = 50, right = 20, up = 82, down = 40;
  const auto n = static_cast<double>(std::max<std::size_t>(ideal.size(), 2) - 1);
  const auto x = [&](std::size_t i) {
    return left + (w - left - right) * static_cast<double>(i) / n;
  };
  const auto y = [&](long v) {
    return h - down - (h - up - down) * static_cast<double>(v) / static_cast<double>(top);
  };
  const auto line = [&](const std::vector<long>& v, const char* colour, const char* dash) {
    std::string points;
    for (std::size_t i = 0; i < v.size(); ++i)
      points += fmt::format("{:.1f},{:.1f} ", x(i), y(v[i]));
    return fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="2" {} points="{}"/>)",
                       colour, dash, points);
  };
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">)"
      "\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      R"(<text x="{}" y="18">admitted per second by the fleet of replicas, against an ideal counter</text>)"
      "\n",
      w, h, left);
  svg += fmt::format(
      R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="black"/><line x1="{0}" y1="{3}" x2="{0}" y2="{1}" stroke="black"/>)"
      "\n",
      left, h - down, w - right, up);
  for (const long v : {0L, top / 2, top})
    svg += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end">{}</text>)"
                       "\n",
                       left - 6, y(v) + 4, v);
  for (std::size_t p = 0; p + 1 < phase_ends.size(); ++p)
    svg += fmt::format(
        R"(<line x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}" stroke="#999" stroke-dasharray="2,3"/>)"
        "\n",
        x(phase_ends[p]), up, h - down);
  svg += fmt::format(
      R"(<text x="{}" y="{}">seconds (phases: over 60/30/10%, over shifted, under)</text>)"
      "\n",
      left, h - 12);
  const std::array<const char*, 3> colours = {"#d62728", "#1f77b4", "#2ca02c"};
  svg += line(ideal, "#555", R"(stroke-dasharray="6,4")") + "\n";
  std::string legend = fmt::format(R"(<text x="{}" y="{}" fill="#555">ideal</text>)", left, 36);
  for (std::size_t m = 0; m < modes.size() && m < colours.size(); ++m) {
    svg += line(admitted[modes[m]], colours[m], "") + "\n";
    legend += fmt::format(R"(<text x="{}" y="{}" fill="{}">{}</text>)", left,
                          36 + 14 * static_cast<double>(m + 1), colours[m], modes[m]);
  }
  svg += legend + "\n</svg>\n";
  std::ofstream(file) << svg;
}

int run(const options& o) {
  doorman_bench::pin_to_core(1);
  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("doorman-bench-rls-{}", ::getpid());
  std::filesystem::create_directories(dir);
  const auto fast = o.seconds > 0 ? speed(o, dir) : std::vector<speed_result>{};
  const auto accurate = o.accuracy_seconds > 0 ? accuracy(o, dir) : std::vector<accuracy_result>{};
  std::filesystem::remove_all(dir);

  fmt::print(
      "| server | keys | calls/s | server CPU µs/call | × floor | p50 ms | p99 ms | errors |\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::string json = R"({"speed": [)";
  double floor = 0;  // the gRPC floor's CPU per call, first in each group of keys (and TLS's)
  for (std::size_t i = 0; i < fast.size(); ++i) {
    const auto& r = fast[i];
    if (r.server.starts_with("gRPC floor")) floor = r.cpu_us_per_call;
    const double ratio = floor > 0 ? r.cpu_us_per_call / floor : 0;
    fmt::print("| {} | {} | {:.0f} | {:.1f} | {:.2f} | {:.3f} | {:.3f} | {} |\n", r.server, r.keys,
               r.calls_per_s, r.cpu_us_per_call, ratio, r.p50_us / 1000, r.p99_us / 1000, r.errors);
    json += fmt::format(
        R"({}{{"server": "{}", "keys": {}, "calls_per_s": {:.1f}, "cpu_us_per_call": {:.2f}, )"
        R"("ratio_to_floor": {:.3f}, "p50_us": {:.1f}, "p99_us": {:.1f}, "errors": {}}})",
        i ? ", " : "", r.server, r.keys, r.calls_per_s, r.cpu_us_per_call, ratio, r.p50_us,
        r.p99_us, r.errors);
  }
  fmt::print(
      "\n| mode | phase | offered | ideal | admitted | over | under |\n"
      "|---|---|---:|---:|---:|---:|---:|\n");
  json += R"(], "accuracy": [)";
  for (std::size_t i = 0; i < accurate.size(); ++i) {
    const auto& r = accurate[i];
    const auto pct = [&](long x) {
      return r.ideal ? 100.0 * static_cast<double>(x) / static_cast<double>(r.ideal) : 0.0;
    };
    fmt::print("| {} | {} | {} | {} | {} | {} ({:.1f}%) | {} ({:.1f}%) |\n", r.mode, r.phase,
               r.offered, r.ideal, r.admitted, r.over, pct(r.over), r.under, pct(r.under));
    json += fmt::format(
        R"({}{{"mode": "{}", "phase": "{}", "offered": {}, "ideal": {}, "admitted": {}, )"
        R"("over": {}, "under": {}}})",
        i ? ", " : "", r.mode, r.phase, r.offered, r.ideal, r.admitted, r.over, r.under);
  }
  json += "]}\n";
  if (!o.json_file.empty()) std::ofstream(o.json_file) << json;
  if (!o.svg_file.empty() && !accurate.empty()) write_svg(o.svg_file, accurate);
  return 0;
}

std::vector<doorman_examples::flag_action> flags(options& o) {
  using doorman_examples::arguments;
  return {
      {"--rls-binary", [&](arguments& a) { o.rls_binary = a.value(); }},
      {"--node-binary", [&](arguments& a) { o.node_binary = a.value(); }},
      {"--floor-binary", [&](arguments& a) { o.floor_binary = a.value(); }},
      {"--redis-server", [&](arguments& a) { o.redis_binary = a.value(); }},
      {"--seconds", [&](arguments& a) { o.seconds = a.number(0, 600); }},
      {"--window", [&](arguments& a) { o.window = static_cast<int>(a.number(1, 1024)); }},
      {"--keys",
       [&](arguments& a) {
         o.keys.clear();
         const std::string list = a.value();
         for (std::size_t at = 0; at <= list.size();) {
           const auto comma = std::min(list.find(',', at), list.size());
           o.keys.push_back(std::stol(list.substr(at, comma - at)));
           at = comma + 1;
         }
       }},
      {"--accuracy-seconds", [&](arguments& a) { o.accuracy_seconds = a.number(0, 3600); }},
      {"--replicas", [&](arguments& a) { o.replicas = static_cast<int>(a.number(1, 3)); }},
      {"--tls", [&](arguments& a) { o.tls_dir = a.value(); }},
      {"--json", [&](arguments& a) { o.json_file = a.value(); }},
      {"--svg", [&](arguments& a) { o.svg_file = a.value(); }},
  };
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  return doorman_examples::run_program(argc, argv, "doorman_bench_rls", usage, flags(o),
                                       [&] { return run(o); });
}
