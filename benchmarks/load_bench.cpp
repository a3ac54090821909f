// doorman_bench_load: a loopback load generator against a real doorman-node pinned to one core.
//
//   doorman_bench_load [--node-binary PATH] [--baseline-binary PATH] [--seconds 5]
//                      [--shape real|pipelined] [--connections N] [--window N] [--no-floor]
//                      [--clients 1000,10000,100000,1000000]
//                      [--algorithm FAIR_SHARE|PROPORTIONAL_SHARE] [--tls DIR] [--grpc]
//                      [--json FILE]
//
// Two shapes of load. `real` (the default): what a fleet brings, one connection per client
// process with one request in flight on each (--connections 1000, --window 1), and beside the
// node, in the same run, the floor: doorman_bench_floor, a bare line server on the same core
// that only finds each request's client id and writes a fixed answer of the same size, under
// the same load (--no-floor leaves it out). `pipelined`: a few connections with many requests
// in flight on each (--connections 4, --window 32), which measures the node's decisions more
// than the kernel.
//
// For each client count N: starts `taskset -c 0 doorman-node` (minimum refresh interval 0, so
// every request runs the algorithm; capacity 30 N, about 60% of what the clients want, so every
// decision is contended), pins itself to core 1, and registers the N client ids, one request
// each. Then, for --seconds, it keeps --window get_capacity requests in flight on each of
// --connections connections, as N clients would: a random client that has no request in flight
// asks again, its wants drifted (drift.hpp: by up to ±2.5, between 1 and 100), sending the lease it
// holds as `has`. Only answers read before the deadline count.
//
// Reported per run: decisions/s; the node's CPU time per decision and its share of one core
// (from /proc/<pid>/stat over the measured seconds); its system calls per decision (where
// /usr/bin/perf may count them: `perf stat -e raw_syscalls:sys_enter -p PID`, over the
// registration and the measured seconds); latency percentiles (request written ->
// answer read); and the node's resident memory per client (VmRSS after the run minus before
// registration, over N).
//
// With --baseline-binary (another build of doorman-node, e.g. the previous commit's), every
// client count runs on the baseline and then on --node-binary, in the same run.
// With --tls DIR (certificates made by examples/make_certs.sh DIR), every client count runs
// twice, plaintext then mutual TLS (node.pem for the node, --tls-client-auth require,
// client-a.pem for the generator, client ids spiffe://doorman.test/client/a#client-N as the
// node's default policy requires), connections made once and reused.
// With --grpc (a build with the gRPC layer), every client count also runs through the node's
// gRPC door (--grpc-listen; Doorman's GetCapacity, plaintext, and with --tls mutual TLS as
// above): --connections gRPC channels, each its own HTTP/2 connection with --window calls in
// flight, the same clients and wants; first (in either shape; --no-floor leaves it out) the gRPC
// floor (doorman_bench_grpc_floor: hosted as the doors are, with the same TLS flags, answering
// each GetCapacity on gRPC's thread with what it wants) under the same load, as the gRPC rows'
// "x floor".

#include <doorman/net/address.hpp>
#include <doorman/net/tls.hpp>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#ifdef DOORMAN_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#endif

#ifdef DOORMAN_HAVE_GRPC
#include <memory>

#include <grpcpp/grpcpp.h>

#include "answer_queue.hpp"
#include "doorman.grpc.pb.h"
#endif

#include "arguments.hpp"
#include "drift.hpp"
#include "proc_stats.hpp"
#include "process.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
using doorman_bench::cpu_seconds;
using doorman_bench::percentile;
using doorman_bench::resident_bytes;

struct options {
  std::string node_binary;
  std::string baseline_binary;
  std::string floor_binary;
  std::string grpc_floor_binary;  // doorman_bench_grpc_floor, with --grpc
  double seconds = 5;
  std::string shape = "real";
  int connections = 0;  // 0: the shape's (1000 real, 4 pipelined)
  int window = 0;       // 0: the shape's (1 real, 32 pipelined)
  bool floor = true;    // with the real shape
  std::vector<long> clients = {1000, 10000, 100000, 1000000};
  std::string algorithm = "FAIR_SHARE";
  std::string json_file;
  std::string tls_dir;
  bool grpc = false;
};

struct result {
  std::string build;  // "baseline", "node" or "floor"
  long clients = 0;
  bool tls = false;
  bool grpc = false;  // through the gRPC door (Doorman's protocol), else JSON-RPC
  double decisions_per_s = 0;
  double cpu_us_per_decision = 0;  // the node's user + system CPU time per decision
  double cpu_share = 0;            // the node's CPU time over the measured wall time
  double p50_us = 0, p99_us = 0, p999_us = 0;
  double rss_bytes_per_client = 0;
  double rss_bytes_per_connection = 0;  // open and idle, before the first request
  double syscalls_per_decision = -1;    // -1: not counted (no perf, or not allowed)
  long errors = 0;
};

int connect_to(const std::string& address) {
  const auto a = doorman::net::parse_address(address);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(a->port)));
  ::inet_pton(AF_INET, a->host.c_str(), &sa.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    throw std::runtime_error("cannot connect to " + address);
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

#ifdef DOORMAN_TLS
// The generator's side of mutual TLS (blocking SSL over the connected descriptor).
struct tls_client {
  explicit tls_client(const std::string& dir) : ctx(SSL_CTX_new(TLS_client_method())) {
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (SSL_CTX_load_verify_locations(ctx, (dir + "/ca.pem").c_str(), nullptr) != 1 ||
        SSL_CTX_use_certificate_chain_file(ctx, (dir + "/client-a.pem").c_str()) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, (dir + "/client-a.key").c_str(), SSL_FILETYPE_PEM) != 1) {
      throw std::runtime_error("--tls: cannot use the certificates in " + dir +
                               " (make them with examples/make_certs.sh DIR)");
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  }
  tls_client(const tls_client&) = delete;
  tls_client& operator=(const tls_client&) = delete;
  ~tls_client() { SSL_CTX_free(ctx); }
  SSL* wrap(int fd) const {
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set1_host(ssl, "127.0.0.1");
    if (SSL_connect(ssl) != 1) throw std::runtime_error("TLS handshake with the node failed");
    return ssl;
  }
  SSL_CTX* ctx;
};
#else
using SSL = void;
#endif

struct connection {
  int fd = -1;
  SSL* ssl = nullptr;  // with --tls
  std::string in;
  std::string out;
  struct pending {
    clock_type::time_point sent;
    std::uint32_t client;
  };
  std::deque<pending> sent;  // answers come back in order on one connection
};

// Reads what is there (the descriptor is readable): plaintext or TLS.
long receive(connection& c, char* buffer, std::size_t size) {
#ifdef DOORMAN_TLS
  if (c.ssl) return SSL_read(c.ssl, buffer, static_cast<int>(size));
#endif
  return ::recv(c.fd, buffer, size, 0);
}

void close_connection(connection& c) {
#ifdef DOORMAN_TLS
  if (c.ssl) SSL_free(c.ssl);
#endif
  ::close(c.fd);
}

void send_all(connection& c, const std::string& data) {
#ifdef DOORMAN_TLS
  if (c.ssl) {
    if (SSL_write(c.ssl, data.data(), static_cast<int>(data.size())) <= 0)
      throw std::runtime_error("TLS send failed");
    return;
  }
#endif
  const int fd = c.fd;
  std::size_t off = 0;
  while (off < data.size()) {
    const auto n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error("send failed");
    off += static_cast<std::size_t>(n);
  }
}

// The configured lease, which `has` reports back as it ages.
constexpr double lease_length = 60;
constexpr double refresh_interval = 16;

// N clients as the node sees them: each wants 1-100, drifting, and holds the last lease it got.
class population {
 public:
  // `prefix`: what the client ids start with (over mutual TLS, the generator's identity and '#',
  // so that the node's default policy lets it use them).
  explicit population(long n, std::string prefix = "client-")
      : clients_(static_cast<std::size_t>(n)), prefix_(std::move(prefix)) {
    for (auto& c : clients_)
      c.wants = doorman_bench::initial_wants(rng_);
  }

  // Whether some client has no request in flight.
  [[nodiscard]] bool any_idle() const noexcept { return in_flight_ < clients_.size(); }

  // A client with no request in flight (`next` for registration, else a random one).
  std::uint32_t pick(std::optional<std::uint32_t> next) {
    if (next) return *next;
    std::uniform_int_distribution<std::uint32_t> any(
        0, static_cast<std::uint32_t>(clients_.size() - 1));
    for (;;) {
      const auto i = any(rng_);
      if (!clients_[i].in_flight) return i;
    }
  }

  // Client `i`'s next request: its wants drifted, and the lease it holds (if any) as it is now.
  struct request {
    std::uint32_t client;
    double wants;
    std::optional<double> has;  // its capacity
    double expires_in = 0;      // seconds left on it
  };
  request next(std::uint32_t i, clock_type::time_point now) {
    auto& c = clients_[i];
    c.wants = doorman_bench::drift_wants(c.wants, rng_);
    c.in_flight = true;
    ++in_flight_;
    request r{i, c.wants, std::nullopt, 0};
    if (c.holds) {
      r.has = c.has;
      r.expires_in =
          std::max(0.0, lease_length - std::chrono::duration<double>(now - c.got_at).count());
    }
    return r;
  }

  [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }

  // Appends client `i`'s next request to `out` as a JSON-RPC line.
  void ask(std::string& out, long id, std::uint32_t i, clock_type::time_point now) {
    const auto r = next(i, now);
    auto o = std::back_inserter(out);
    fmt::format_to(
        o,
        R"({{"jsonrpc":"2.0","id":{},"method":"get_capacity","params":{{"client_id":"{}{}",)"
        R"("resources":[{{"resource_id":"api","wants":{:.2f})",
        id, prefix_, i, r.wants);
    if (r.has) {
      fmt::format_to(o, R"(,"has":{{"capacity":{},"expires_in":{:.3f},"refresh_interval":{}}})",
                     *r.has, r.expires_in, refresh_interval);
    }
    out += "}]}}\n";
  }

  // Takes client `i`'s answer line; returns whether it was an error.
  bool answer(std::uint32_t i, std::string_view line, clock_type::time_point now) {
    if (line.find("\"error\"") != std::string_view::npos) return settle(i, std::nullopt, now);
    constexpr std::string_view key = "\"capacity\":";
    const auto at = line.find(key);
    if (at == std::string_view::npos) return settle(i, std::nullopt, now);
    const char* begin = line.data() + at + key.size();
    double has = 0;
    if (std::from_chars(begin, line.data() + line.size(), has).ec != std::errc{})
      return settle(i, std::nullopt, now);
    return settle(i, has, now);
  }

  // Client `i`'s answer: the capacity it got, or none (an error); returns whether it was one.
  bool settle(std::uint32_t i, std::optional<double> got, clock_type::time_point now) {
    auto& c = clients_[i];
    c.in_flight = false;
    --in_flight_;
    if (!got) return true;
    c.has = *got;
    c.holds = true;
    c.got_at = now;
    return false;
  }

 private:
  struct client {
    double wants = 0;
    double has = 0;
    clock_type::time_point got_at;
    bool holds = false;
    bool in_flight = false;
  };
  std::vector<client> clients_;
  std::string prefix_;
  std::size_t in_flight_ = 0;
  std::mt19937_64 rng_{42};
};

struct drive_result {
  std::vector<double> latencies_us;  // of the answers read before the deadline
  long errors = 0;
  double cpu_seconds = 0;  // the node's, from the start to the deadline
  double elapsed = 0;
};

// The system calls a process makes, counted by `perf stat` (the raw_syscalls:sys_enter
// tracepoint) from construction to `stop`; nothing where perf is missing or not allowed.
class syscall_counter {
 public:
  syscall_counter(pid_t pid, const std::filesystem::path& log) {
    if (!std::filesystem::exists("/usr/bin/perf")) return;
    perf_.emplace(std::vector<std::string>{"/usr/bin/perf", "stat", "-x", ",", "-e",
                                           "raw_syscalls:sys_enter", "-p", std::to_string(pid)},
                  log.string());
  }

  // The count, or nothing.
  std::optional<double> stop() {
    if (!perf_) return std::nullopt;
    perf_->signal(SIGINT);
    perf_->wait_exit();
    // A line "COUNT,,raw_syscalls:sys_enter,...": COUNT is "<not counted>" when refused.
    std::istringstream in(perf_->log());
    for (std::string line; std::getline(in, line);) {
      if (line.find("raw_syscalls:sys_enter") == std::string::npos) continue;
      double count = 0;
      const auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), count);
      if (ec == std::errc() && end != line.data() && *end == ',') return count;
    }
    return std::nullopt;
  }

 private:
  std::optional<doorman_examples::process> perf_;
};

// Keeps `window` requests in flight on every connection until `until` (`registering`: sends
// one request for each client in turn instead, and waits for every answer).
drive_result drive(std::vector<connection>& conns, population& people, long clients, int window,
                   clock_type::time_point until, bool registering, pid_t node) {
  drive_result r;
  const double cpu0 = cpu_seconds(node);
  const auto t0 = clock_type::now();
  long next_id = 0;
  long registered = 0;
  bool open = true;  // still sending
  const auto top_up = [&](connection& c, clock_type::time_point now) {
    c.out.clear();
    while (open && static_cast<int>(c.sent.size()) < window) {
      if (registering ? registered == clients : !people.any_idle()) break;
      const auto who =
          people.pick(registering ? std::optional<std::uint32_t>(registered++) : std::nullopt);
      people.ask(c.out, next_id++, who, now);
      c.sent.push_back({now, who});
    }
    if (!c.out.empty()) send_all(c, c.out);
  };
  // epoll: with thousands of connections, a wake-up costs what is ready, not what is open.
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) throw std::runtime_error("epoll_create1 failed");
  long pending = 0;
  for (std::size_t i = 0; i < conns.size(); ++i) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = i;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &e);
  }
  for (auto& c : conns) {
    top_up(c, clock_type::now());
    pending += static_cast<long>(c.sent.size());
  }
  std::vector<epoll_event> ready(1024);
  char chunk[1 << 16];
  while (pending > 0) {
    const int woken = ::epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), 5000);
    if (woken <= 0) {
      ::close(ep);
      throw std::runtime_error("no answer in 5 s");
    }
    const auto now = clock_type::now();
    if (!registering && open && now >= until) {
      open = false;  // the deadline: what is still in flight does not count
      r.cpu_seconds = cpu_seconds(node) - cpu0;
      r.elapsed = std::chrono::duration<double>(now - t0).count();
      break;
    }
    for (int k = 0; k < woken; ++k) {
      connection& c = conns[ready[static_cast<std::size_t>(k)].data.u64];
      pending -= static_cast<long>(c.sent.size());
      const auto n = receive(c, chunk, sizeof chunk);
      if (n <= 0) throw std::runtime_error("connection closed by the node");
      c.in.append(chunk, static_cast<std::size_t>(n));
#ifdef DOORMAN_TLS
      // Records already decrypted are not seen by poll: take them now.
      while (c.ssl && SSL_pending(c.ssl) > 0) {
        const auto extra = SSL_read(c.ssl, chunk, sizeof chunk);
        if (extra <= 0) break;
        c.in.append(chunk, static_cast<std::size_t>(extra));
      }
#endif
      std::size_t start = 0;
      for (std::size_t nl; (nl = c.in.find('\n', start)) != std::string::npos; start = nl + 1) {
        const auto& p = c.sent.front();
        if (people.answer(p.client, std::string_view(c.in).substr(start, nl - start), now)) {
          ++r.errors;
        }
        r.latencies_us.push_back(std::chrono::duration<double, std::micro>(now - p.sent).count());
        c.sent.pop_front();
      }
      c.in.erase(0, start);
      top_up(c, now);
      pending += static_cast<long>(c.sent.size());
    }
  }
  ::close(ep);
  if (registering) r.elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
  return r;
}

#ifdef DOORMAN_HAVE_GRPC
// The same load through the node's gRPC door (Doorman's GetCapacity): --connections channels,
// each its own HTTP/2 connection, each with --window calls in flight (gRPC's callback API; the
// answers are taken on this thread from a queue the callbacks fill).
class grpc_load {
 public:
  // `tls_dir`: mutual TLS with the certificates there (client-a's), else plaintext.
  grpc_load(const std::string& address, int connections, const std::string& tls_dir) {
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!tls_dir.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = read_file(tls_dir + "/ca.pem");
      ssl.pem_private_key = read_file(tls_dir + "/client-a.key");
      ssl.pem_cert_chain = read_file(tls_dir + "/client-a.pem");
      creds = grpc::SslCredentials(ssl);
    }
    for (int i = 0; i < connections; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      args.SetInt("doorman.bench.connection", i);
      stubs_.push_back(
          ::doorman::Capacity::NewStub(grpc::CreateCustomChannel(address, creds, args)));
    }
  }

  drive_result drive(population& people, long clients, int window, clock_type::time_point until,
                     bool registering, pid_t node) {
    drive_result r;
    const double cpu0 = cpu_seconds(node);
    const auto t0 = clock_type::now();
    long registered = 0;
    bool open = true;
    std::vector<int> in_flight(stubs_.size(), 0);
    long pending = 0;
    const auto top_up = [&](std::size_t conn, clock_type::time_point now) {
      while (open && in_flight[conn] < window) {
        if (registering ? registered == clients : !people.any_idle()) break;
        const auto who =
            people.pick(registering ? std::optional<std::uint32_t>(registered++) : std::nullopt);
        send(conn, people, people.next(who, now), now);
        ++in_flight[conn];
        ++pending;
      }
    };
    for (std::size_t c = 0; c < stubs_.size(); ++c)
      top_up(c, clock_type::now());
    while (pending > 0) {
      std::unique_ptr<call> done = answers_.take(std::chrono::seconds(5));
      if (!done) throw std::runtime_error("no gRPC answer in 5 s");
      --pending;
      --in_flight[done->connection];
      const auto now = done->answered;
      if (!registering && open && clock_type::now() >= until) {
        open = false;  // the deadline: what is still in flight does not count
        r.cpu_seconds = cpu_seconds(node) - cpu0;
        r.elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
      }
      if (!open) continue;  // drained, not counted
      const bool ok = done->status.ok() && done->response.response_size() == 1;
      if (people.settle(
              done->client,
              ok ? std::optional(done->response.response(0).gets().capacity()) : std::nullopt,
              now)) {
        ++r.errors;
      }
      r.latencies_us.push_back(std::chrono::duration<double, std::micro>(now - done->sent).count());
      top_up(done->connection, clock_type::now());
    }
    if (registering) r.elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
    return r;
  }

 private:
  struct call {
    grpc::ClientContext context;
    ::doorman::GetCapacityRequest request;
    ::doorman::GetCapacityResponse response;
    grpc::Status status;
    std::size_t connection = 0;
    std::uint32_t client = 0;
    clock_type::time_point sent, answered;
  };

  void send(std::size_t conn, const population& people, const population::request& q,
            clock_type::time_point now) {
    auto c = std::make_unique<call>();
    c->connection = conn;
    c->client = q.client;
    c->sent = now;
    c->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    c->request.set_client_id(people.prefix() + std::to_string(q.client));
    auto& res = *c->request.add_resource();
    res.set_resource_id("api");
    res.set_priority(0);
    res.set_wants(std::round(q.wants * 100) / 100);
    if (q.has) {
      const double unix_now =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      auto& has = *res.mutable_has();
      has.set_capacity(*q.has);
      has.set_expiry_time(static_cast<std::int64_t>(unix_now + q.expires_in));
      has.set_refresh_interval(static_cast<std::int64_t>(refresh_interval));
    }
    call* raw = c.release();
    stubs_[conn]->async()->GetCapacity(&raw->context, &raw->request, &raw->response,
                                       answers_.on_done(raw));
  }

  static std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in || text.empty()) {
      throw std::runtime_error("--tls: cannot read " + path +
                               " (make the certificates with examples/make_certs.sh DIR)");
    }
    return text;
  }

  std::vector<std::unique_ptr<::doorman::Capacity::Stub>> stubs_;
  doorman_bench::answer_queue<call> answers_;
};
#endif

// The end of a measured run that starts now.
clock_type::time_point measure_until(const options& o) {
  return clock_type::now() +
         std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(o.seconds));
}

// The load over JSON-RPC lines: registration, then the measured run.
// `rss_connected`: the server's resident memory once every connection is open (none used).
// `syscalls`: the server's system calls from registration to the deadline, when counted.
std::pair<drive_result, drive_result> drive_json_rpc(const options& o, const std::string& address,
                                                     const std::string& build, long clients,
                                                     bool tls, pid_t node, double& rss_connected,
                                                     const std::filesystem::path& perf_log,
                                                     std::optional<double>& syscalls) {
  std::vector<connection> conns(static_cast<std::size_t>(o.connections));
#ifdef DOORMAN_TLS
  std::optional<tls_client> secure;
  if (tls) secure.emplace(o.tls_dir);
#endif
  for (auto& c : conns) {
    c.fd = connect_to(address);
#ifdef DOORMAN_TLS
    if (secure) c.ssl = secure->wrap(c.fd);
#endif
  }
  // One discovery call on each (no client state): the server has then accepted and read every
  // connection, and holds what an idle connection costs it.
  const std::string hello = R"({"jsonrpc":"2.0","id":0,"method":"discovery","params":{}})"
                            "\n";
  for (auto& c : conns)
    send_all(c, hello);
  char buffer[4096];
  for (auto& c : conns) {
    while (c.in.find('\n') == std::string::npos) {
      const auto n = receive(c, buffer, sizeof buffer);
      if (n <= 0) throw std::runtime_error("connection closed by the server");
      c.in.append(buffer, static_cast<std::size_t>(n));
    }
    c.in.clear();
  }
  rss_connected = resident_bytes(node);
  // Over mutual TLS the node has no access file: its default policy lets the generator (client-a)
  // use the client ids it owns, spiffe://doorman.test/client/a#NAME.
  population people(clients, tls ? "spiffe://doorman.test/client/a#client-" : "client-");
  fmt::print(stderr, "  {} {} clients{}: registering...", build, clients, tls ? " over TLS" : "");
  // Counted over registration too (the same traffic): perf takes a moment to attach, which
  // then misses a smaller share of the calls.
  syscall_counter counter(node, perf_log);
  auto reg = drive(conns, people, clients, o.window, {}, true, node);
  fmt::print(stderr, " ({:.1f} s) measuring {} s...", reg.elapsed, o.seconds);
  auto m = drive(conns, people, clients, o.window, measure_until(o), false, node);
  syscalls = counter.stop();
  fmt::print(stderr, " done\n");
  for (auto& c : conns)
    close_connection(c);
  return {std::move(reg), std::move(m)};
}

// The same through the gRPC door (`line`: the node's "listening on" line for it).
std::pair<drive_result, drive_result> drive_grpc(const options& o, const std::string& line,
                                                 const std::string& build, long clients, bool tls,
                                                 pid_t node) {
#ifdef DOORMAN_HAVE_GRPC
  grpc_load load(line.substr(line.find("listening on ") + 13), o.connections,
                 tls ? o.tls_dir : std::string());
  population people(clients, tls ? "spiffe://doorman.test/client/a#client-" : "client-");
  fmt::print(stderr, "  {} {} clients through gRPC{}: registering...", build, clients,
             tls ? " over TLS" : "");
  auto reg = load.drive(people, clients, o.window, {}, true, node);
  fmt::print(stderr, " ({:.1f} s) measuring {} s...", reg.elapsed, o.seconds);
  auto m = load.drive(people, clients, o.window, measure_until(o), false, node);
  fmt::print(stderr, " done\n");
  return {std::move(reg), std::move(m)};
#else
  (void)o, (void)line, (void)build, (void)clients, (void)tls, (void)node;
  throw std::invalid_argument("--grpc: this build has no gRPC");
#endif
}

result run_one(const options& o, const std::string& build, long clients,
               const std::filesystem::path& dir, bool tls, bool grpc) {
  const std::string& binary = build == "baseline"        ? o.baseline_binary
                              : build == "floor" && grpc ? o.grpc_floor_binary
                              : build == "floor"         ? o.floor_binary
                                                         : o.node_binary;
  const auto config = dir / "resources.json";
  std::ofstream(config) << fmt::format(
      R"({{"resources": [{{"identifier_glob": "*", "capacity": {},
    "algorithm": {{"kind": "{}", "lease_length": {}, "refresh_interval": {},
                  "learning_mode_duration": 0}}}}]}})",
      30.0 * static_cast<double>(clients), o.algorithm, lease_length, refresh_interval);
  std::vector<std::string> args = {"/usr/bin/taskset",
                                   "-c",
                                   "0",
                                   binary,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--admin",
                                   "off",
                                   "--config",
                                   config.string(),
                                   "--minimum-refresh-interval",
                                   "0",
                                   "--max-connections",
                                   std::to_string(o.connections + 16)};
  if (build == "floor") args = {"/usr/bin/taskset", "-c", "0", binary, "--listen", "127.0.0.1:0"};
  const bool grpc_floor = build == "floor" && grpc;
  if (tls) {
    for (const auto& a :
         {"--tls-cert", "/node.pem", "--tls-key", "/node.key", "--tls-ca", "/ca.pem"}) {
      args.push_back(a[0] == '/' ? o.tls_dir + a : std::string(a));
    }
    args.insert(args.end(), {"--tls-client-auth", "require"});
  }
  if (grpc && !grpc_floor) args.insert(args.end(), {"--grpc-listen", "127.0.0.1:0"});
  doorman_examples::process node(args, (dir / fmt::format("{}-{}{}{}.log", build, clients,
                                                          tls ? "-tls" : "", grpc ? "-grpc" : ""))
                                           .string());
  // The gRPC port binds (and says so) before the JSON-RPC one.
  std::optional<std::string> grpc_line;
  if (grpc) {
    grpc_line = node.wait_for(grpc_floor ? "gRPC floor listening on "
                                         : "doorman.Capacity (gRPC) listening on ");
  }
  // The gRPC floor has no JSON-RPC port.
  const auto address = grpc_floor ? std::optional<std::string>("") : node.listening_address();
  if (!address || (grpc && !grpc_line))
    throw std::runtime_error("the node did not start: " + node.log());
  const double rss0 = resident_bytes(node.pid());
  double rss_connected = rss0;
  std::optional<double> syscalls;
  auto [reg, m] =
      grpc ? drive_grpc(o, *grpc_line, build, clients, tls, node.pid())
           : drive_json_rpc(o, *address, build, clients, tls, node.pid(), rss_connected,
                            dir / fmt::format("perf-{}-{}.log", build, clients), syscalls);
  const double rss1 = resident_bytes(node.pid());
  node.signal(SIGTERM);
  node.wait_exit();

  result r;
  r.build = build;
  r.clients = clients;
  r.tls = tls;
  r.grpc = grpc;
  const auto decisions = static_cast<double>(m.latencies_us.size());
  r.decisions_per_s = decisions / m.elapsed;
  r.cpu_us_per_decision = decisions > 0 ? m.cpu_seconds * 1e6 / decisions : 0;
  r.cpu_share = m.cpu_seconds / m.elapsed;
  r.p50_us = percentile(m.latencies_us, 0.5);
  r.p99_us = percentile(m.latencies_us, 0.99);
  r.p999_us = percentile(m.latencies_us, 0.999);
  r.rss_bytes_per_client = (rss1 - rss0) / static_cast<double>(clients);
  r.rss_bytes_per_connection = (rss_connected - rss0) / o.connections;
  const auto all = static_cast<double>(reg.latencies_us.size()) + decisions;
  if (syscalls && all > 0) r.syscalls_per_decision = *syscalls / all;
  r.errors = m.errors + reg.errors;
  return r;
}

// The server's CPU per answer over the floor's, for the same clients, link and door; 0 when
// the run has no floor.
double over_floor(const std::vector<result>& results, const result& r) {
  for (const auto& f : results) {
    if (f.build == "floor" && f.clients == r.clients && f.tls == r.tls && f.grpc == r.grpc &&
        f.cpu_us_per_decision > 0) {
      return r.cpu_us_per_decision / f.cpu_us_per_decision;
    }
  }
  return 0;
}

void report(const options& o, const std::vector<result>& results) {
  fmt::print("{}, {} shape: {} connections x {} in flight, {} s per run\n\n", o.algorithm, o.shape,
             o.connections, o.window, o.seconds);
  fmt::print(
      "| build | clients | door | link | decisions/s | server CPU µs/decision | x floor | server "
      "CPU | syscalls/decision | p50 | p99 | p99.9 | RSS bytes/client | RSS bytes/connection | "
      "errors |\n");
  fmt::print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::string json = fmt::format(
      R"({{"algorithm": "{}", "shape": "{}", "connections": {}, "window": {}, "seconds": {}, )"
      R"("runs": [)",
      o.algorithm, o.shape, o.connections, o.window, o.seconds);
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    const char* link = r.tls ? "mutual TLS" : "plaintext";
    const double ratio = over_floor(results, r);
    fmt::print(
        "| {} | {} | {} | {} | {:.0f} | {:.2f} | {} | {:.0f}% | {} | {:.2f} ms | {:.2f} ms | "
        "{:.2f} ms | {:.0f} | {:.0f} | {} |\n",
        r.build, r.clients, r.grpc ? "gRPC" : "JSON-RPC", link, r.decisions_per_s,
        r.cpu_us_per_decision, ratio > 0 ? fmt::format("{:.2f}", ratio) : "—", r.cpu_share * 100,
        r.syscalls_per_decision >= 0 ? fmt::format("{:.2f}", r.syscalls_per_decision) : "—",
        r.p50_us / 1000, r.p99_us / 1000, r.p999_us / 1000, r.rss_bytes_per_client,
        r.rss_bytes_per_connection, r.errors);
    json += fmt::format(
        "{}{{\"build\": \"{}\", \"clients\": {}, \"door\": \"{}\", \"tls\": {}, "
        "\"decisions_per_s\": {:.1f}, "
        "\"cpu_us_per_decision\": {:.3f}, \"over_floor\": {:.3f}, \"cpu_share\": {:.3f}, "
        "\"syscalls_per_decision\": {:.3f}, "
        "\"p50_us\": {:.1f}, \"p99_us\": {:.1f}, \"p999_us\": {:.1f}, "
        "\"rss_bytes_per_client\": {:.1f}, \"rss_bytes_per_connection\": {:.1f}, "
        "\"errors\": {}}}",
        i ? ", " : "", r.build, r.clients, r.grpc ? "grpc" : "json-rpc", r.tls, r.decisions_per_s,
        r.cpu_us_per_decision, ratio, r.cpu_share, r.syscalls_per_decision, r.p50_us, r.p99_us,
        r.p999_us, r.rss_bytes_per_client, r.rss_bytes_per_connection, r.errors);
  }
  json += "]}\n";
  if (!o.json_file.empty()) std::ofstream(o.json_file) << json;
}

// The flags, each reading its value into `o` (ranges checked as it reads).
std::vector<doorman_examples::flag_action> flags(options& o) {
  using doorman_examples::arguments;
  return {
      {"--node-binary", [&](arguments& a) { o.node_binary = a.value(); }},
      {"--baseline-binary", [&](arguments& a) { o.baseline_binary = a.value(); }},
      {"--seconds", [&](arguments& a) { o.seconds = a.number(0.001, 86400); }},
      {"--shape",
       [&](arguments& a) {
         o.shape = a.value();
         if (o.shape != "real" && o.shape != "pipelined")
           throw std::invalid_argument("--shape: must be real or pipelined");
       }},
      {"--no-floor", [&](arguments&) { o.floor = false; }},
      {"--connections",
       [&](arguments& a) { o.connections = static_cast<int>(a.number(1, 20000)); }},
      {"--window", [&](arguments& a) { o.window = static_cast<int>(a.number(1, 1e6)); }},
      {"--clients",
       [&](arguments& a) {
         o.clients.clear();
         for (const auto& n : doorman::net::split_list(a.value()))
           o.clients.push_back(
               static_cast<long>(doorman_examples::parse_number("--clients", n, 1, 1e8)));
         if (o.clients.empty()) throw std::invalid_argument("--clients: no count given");
       }},
      {"--algorithm",
       [&](arguments& a) {
         o.algorithm = a.value();
         if (o.algorithm != "FAIR_SHARE" && o.algorithm != "PROPORTIONAL_SHARE")
           throw std::invalid_argument("--algorithm: must be FAIR_SHARE or PROPORTIONAL_SHARE");
       }},
      {"--tls",
       [&](arguments& a) {
         o.tls_dir = a.value();
         if (!doorman::net::tls_available)
           throw std::invalid_argument("--tls: this build has no TLS (OpenSSL not found)");
       }},
      {"--json", [&](arguments& a) { o.json_file = a.value(); }},
      {"--grpc",
       [&](arguments&) {
         o.grpc = true;
#ifndef DOORMAN_HAVE_GRPC
         throw std::invalid_argument("--grpc: this build has no gRPC");
#endif
       }},
  };
}

// Runs the load at each client count, node and baseline side by side, and reports.
int run(options o) {
  const bool real = o.shape == "real";
  if (o.connections == 0) o.connections = real ? 1000 : 4;
  if (o.window == 0) o.window = real ? 1 : 32;
  const bool floor = real && o.floor;
  // A descriptor per connection, here and in the server (which inherits the limit).
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);
  if (static_cast<rlim_t>(o.connections) + 64 > files.rlim_cur) {
    throw std::invalid_argument(fmt::format("--connections {}: this process may open {} files",
                                            o.connections,
                                            static_cast<unsigned long long>(files.rlim_cur)));
  }
  // The generator on core 1; the node gets core 0 through taskset.
  doorman_bench::pin_to_core(1);

  const auto dir =
      std::filesystem::temp_directory_path() / fmt::format("doorman-bench-load-{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::vector<result> results;
  fmt::print(stderr, "node on core 0 (taskset), generator on core 1\n");
  for (const long n : o.clients) {
    for (const bool tls : {false, true}) {
      if (tls && o.tls_dir.empty()) continue;
      if (floor && !tls) results.push_back(run_one(o, "floor", n, dir, false, false));
      if (!o.baseline_binary.empty()) results.push_back(run_one(o, "baseline", n, dir, tls, false));
      results.push_back(run_one(o, "node", n, dir, tls, false));
    }
    for (const bool tls : {false, true}) {
      if (!o.grpc || (tls && o.tls_dir.empty())) continue;
      if (o.floor) results.push_back(run_one(o, "floor", n, dir, tls, true));  // any shape
      if (!o.baseline_binary.empty()) results.push_back(run_one(o, "baseline", n, dir, tls, true));
      results.push_back(run_one(o, "node", n, dir, tls, true));
    }
  }
  std::filesystem::remove_all(dir);
  report(o, results);
  long errors = 0;
  for (const auto& r : results)
    errors += r.errors;
  if (errors > 0) {
    fmt::print(stderr, "doorman_bench_load: {} requests failed (the errors column)\n", errors);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  o.node_binary = DOORMAN_NODE_BINARY;
  o.floor_binary = DOORMAN_FLOOR_BINARY;
#ifdef DOORMAN_GRPC_FLOOR_BINARY
  o.grpc_floor_binary = DOORMAN_GRPC_FLOOR_BINARY;
#endif
  return doorman_examples::run_program(
      argc, argv, "doorman_bench_load",
      "usage: doorman_bench_load [--node-binary PATH] [--baseline-binary PATH] [--seconds S]\n"
      "                          [--shape real|pipelined] [--no-floor]\n"
      "                          [--connections N] [--window N] [--clients N,N,...]\n"
      "                          [--algorithm FAIR_SHARE|PROPORTIONAL_SHARE] [--tls DIR]\n"
      "                          [--grpc] [--json FILE]\n",
      flags(o), [&] { return run(o); });
}
