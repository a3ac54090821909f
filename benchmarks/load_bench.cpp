// doorman_bench_load: a loopback load generator against a real doorman-node pinned to one core.
// Defaults: 4 connections x 32 requests in flight, 5 s per client count.
//
//   doorman_bench_load [--node-binary PATH] [--seconds 5] [--connections 4] [--window 32]
//                      [--clients 1000,10000,100000] [--tls DIR] [--json FILE]
//
// For each client count N: starts `taskset -c 0 doorman-node` (FAIR_SHARE, minimum refresh
// interval 0, so every request runs the algorithm), pins itself to core 1, registers N client
// ids, then for --seconds keeps --window pipelined get_capacity requests (one resource each,
// random client ids among N, random wants) in flight on each of --connections connections.
// Reports decisions/s and the latency percentiles (request written -> answer read), as a table
// and as JSON.
//
// With --tls DIR (certificates made by examples/make_certs.sh DIR), every client count runs
// twice in the same run, plaintext then mutual TLS (node.pem for the node, --tls-client-auth
// require, client-a.pem for the generator), connections made once and reused.

#include <doorman/net/address.hpp>
#include <doorman/protocol/json_rpc.hpp>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#ifdef DOORMAN_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#endif

#include "process.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
  std::string node_binary;
  double seconds = 5;
  int connections = 4;
  int window = 32;
  std::vector<long> clients = {1000, 10000, 100000};
  std::string json_file;
  std::string tls_dir;
};

struct result {
  long clients = 0;
  bool tls = false;
  double decisions_per_s = 0;
  double p50_us = 0, p99_us = 0, p999_us = 0;
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
  std::deque<clock_type::time_point> sent;  // answers come back in order on one connection
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

std::string request(long id, long client, double wants) {
  return fmt::format(
      R"({{"jsonrpc":"2.0","id":{},"method":"get_capacity","params":{{"client_id":"client-{}","resources":[{{"resource_id":"api","wants":{}}}]}}}})"
      "\n",
      id, client, wants);
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

// Keeps `window` requests in flight on every connection until `until`; returns latencies in µs.
// With `only_count` > 0, sends exactly that many requests (client ids 0..only_count-1) instead.
std::vector<double> drive(std::vector<connection>& conns, long clients, int window,
                          clock_type::time_point until, long only_count, long& errors) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<long> pick(0, clients - 1);
  std::uniform_real_distribution<double> wants(1, 100);
  std::vector<double> latencies;
  long next_id = 0;
  long registered = 0;
  const auto more = [&] {
    return only_count > 0 ? registered < only_count : clock_type::now() < until;
  };
  const auto top_up = [&](connection& c) {
    std::string batch;
    while (static_cast<int>(c.sent.size()) < window && more()) {
      const long client = only_count > 0 ? registered++ : pick(rng);
      batch += request(next_id++, client, std::round(wants(rng)));
      c.sent.push_back(clock_type::now());
    }
    if (!batch.empty()) send_all(c, batch);
  };
  for (auto& c : conns)
    top_up(c);
  std::vector<pollfd> fds(conns.size());
  for (;;) {
    bool pending = false;
    for (std::size_t i = 0; i < conns.size(); ++i) {
      fds[i] = {conns[i].fd, POLLIN, 0};
      pending = pending || !conns[i].sent.empty();
    }
    if (!pending) break;
    if (::poll(fds.data(), fds.size(), 5000) <= 0) throw std::runtime_error("no answer in 5 s");
    for (std::size_t i = 0; i < conns.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      connection& c = conns[i];
      char chunk[1 << 16];
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
      const auto now = clock_type::now();
      std::size_t start = 0;
      for (std::size_t nl; (nl = c.in.find('\n', start)) != std::string::npos; start = nl + 1) {
        if (std::string_view(c.in).substr(start, nl - start).find("\"error\"") !=
            std::string_view::npos) {
          ++errors;
        }
        latencies.push_back(
            std::chrono::duration<double, std::micro>(now - c.sent.front()).count());
        c.sent.pop_front();
      }
      c.in.erase(0, start);
      top_up(c);
    }
  }
  return latencies;
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

result run_one(const options& o, long clients, const std::filesystem::path& dir, bool tls) {
  const auto config = dir / "resources.json";
  std::ofstream(config) << R"({"resources": [{"identifier_glob": "*", "capacity": 1000000,
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 600, "refresh_interval": 60,
                  "learning_mode_duration": 0}}]})";
  std::vector<std::string> args = {"/usr/bin/taskset",
                                   "-c",
                                   "0",
                                   o.node_binary,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--admin",
                                   "off",
                                   "--config",
                                   config.string(),
                                   "--minimum-refresh-interval",
                                   "0"};
  if (tls) {
    for (const auto& a :
         {"--tls-cert", "/node.pem", "--tls-key", "/node.key", "--tls-ca", "/ca.pem"}) {
      args.push_back(a[0] == '/' ? o.tls_dir + a : std::string(a));
    }
    args.insert(args.end(), {"--tls-client-auth", "require"});
  }
  doorman_examples::process node(
      args, (dir / fmt::format("node-{}{}.log", clients, tls ? "-tls" : "")).string());
  const auto address = node.listening_address();
  if (!address) throw std::runtime_error("the node did not start: " + node.log());

  std::vector<connection> conns(static_cast<std::size_t>(o.connections));
#ifdef DOORMAN_TLS
  std::optional<tls_client> secure;
  if (tls) secure.emplace(o.tls_dir);
#endif
  for (auto& c : conns) {
    c.fd = connect_to(*address);
#ifdef DOORMAN_TLS
    if (secure) c.ssl = secure->wrap(c.fd);
#endif
  }
  long errors = 0;
  fmt::print(stderr, "  {} clients{}: registering...", clients, tls ? " over TLS" : "");
  (void)drive(conns, clients, o.window, clock_type::now(), clients, errors);
  fmt::print(stderr, " measuring {} s...", o.seconds);
  const auto t0 = clock_type::now();
  auto lat = drive(conns, clients, o.window,
                   t0 + std::chrono::duration_cast<clock_type::duration>(
                            std::chrono::duration<double>(o.seconds)),
                   0, errors);
  const double elapsed = std::chrono::duration<double>(clock_type::now() - t0).count();
  fmt::print(stderr, " done\n");
  for (auto& c : conns)
    close_connection(c);
  node.signal(SIGTERM);
  node.wait_exit();

  result r;
  r.clients = clients;
  r.tls = tls;
  r.decisions_per_s = static_cast<double>(lat.size()) / elapsed;
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  r.p999_us = percentile(lat, 0.999);
  r.errors = errors;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  o.node_binary = DOORMAN_NODE_BINARY;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--node-binary") {
        o.node_binary = value();
      } else if (arg == "--seconds") {
        o.seconds = std::stod(value());
      } else if (arg == "--connections") {
        o.connections = std::stoi(value());
      } else if (arg == "--window") {
        o.window = std::stoi(value());
      } else if (arg == "--clients") {
        o.clients.clear();
        for (const auto& s : doorman::net::split_list(value()))
          o.clients.push_back(std::stol(s));
      } else if (arg == "--tls") {
        o.tls_dir = value();
#ifndef DOORMAN_TLS
        throw std::invalid_argument("--tls: this build has no TLS (OpenSSL not found)");
#endif
      } else if (arg == "--json") {
        o.json_file = value();
      } else {
        fmt::print(
            "usage: doorman_bench_load [--node-binary PATH] [--seconds S] [--connections N]\n"
            "                          [--window N] [--clients N,N,...] [--tls DIR] [--json "
            "FILE]\n");
        return arg == "--help" ? 0 : 2;
      }
    }
    if (o.connections < 1 || o.window < 1 || !(o.seconds > 0) || o.clients.empty()) {
      throw std::invalid_argument("connections, window, seconds and clients must be positive");
    }
    // The generator on core 1; the node gets core 0 through taskset.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(1, &set);
    ::sched_setaffinity(0, sizeof set, &set);

    const auto dir =
        std::filesystem::temp_directory_path() / fmt::format("doorman-bench-load-{}", ::getpid());
    std::filesystem::create_directories(dir);
    std::vector<result> results;
    fmt::print(stderr,
               "node on core 0 (taskset), generator on core 1; {} connections x {} "
               "in flight\n",
               o.connections, o.window);
    for (const long n : o.clients) {
      results.push_back(run_one(o, n, dir, false));
      if (!o.tls_dir.empty()) results.push_back(run_one(o, n, dir, true));
    }
    std::filesystem::remove_all(dir);

    fmt::print("| clients | link | decisions/s | p50 | p99 | p99.9 | errors |\n");
    fmt::print("|---:|---|---:|---:|---:|---:|---:|\n");
    std::string json = "{\"connections\": " + std::to_string(o.connections) +
                       ", \"window\": " + std::to_string(o.window) + ", \"runs\": [";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      const char* link = r.tls ? "mutual TLS" : "plaintext";
      fmt::print("| {} | {} | {:.0f} | {:.2f} ms | {:.2f} ms | {:.2f} ms | {} |\n", r.clients, link,
                 r.decisions_per_s, r.p50_us / 1000, r.p99_us / 1000, r.p999_us / 1000, r.errors);
      json += fmt::format(
          "{}{{\"clients\": {}, \"tls\": {}, \"decisions_per_s\": {:.1f}, \"p50_us\": {:.1f}, "
          "\"p99_us\": {:.1f}, \"p999_us\": {:.1f}, \"errors\": {}}}",
          i ? ", " : "", r.clients, r.tls, r.decisions_per_s, r.p50_us, r.p99_us, r.p999_us,
          r.errors);
    }
    json += "]}\n";
    if (!o.json_file.empty()) std::ofstream(o.json_file) << json;
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "doorman_bench_load: {}\n", e.what());
    return 1;
  }
}
