// doorman_bench_load: a loopback load generator against a real doorman-node pinned to one core.
// Defaults: 4 connections x 32 requests in flight, 5 s per client count.
//
//   doorman_bench_load [--node-binary PATH] [--seconds 5] [--connections 4] [--window 32]
//                      [--clients 1000,10000,100000] [--json FILE]
//
// For each client count N: starts `taskset -c 0 doorman-node` (FAIR_SHARE, minimum refresh
// interval 0, so every request runs the algorithm), pins itself to core 1, registers N client
// ids, then for --seconds keeps --window pipelined get_capacity requests (one resource each,
// random client ids among N, random wants) in flight on each of --connections connections.
// Reports decisions/s and the latency percentiles (request written -> answer read), as a table
// and as JSON.

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
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

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
};

struct result {
  long clients = 0;
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

struct connection {
  int fd = -1;
  std::string in;
  std::deque<clock_type::time_point> sent;  // answers come back in order on one connection
};

std::string request(long id, long client, double wants) {
  return fmt::format(
      R"({{"jsonrpc":"2.0","id":{},"method":"get_capacity","params":{{"client_id":"client-{}","resources":[{{"resource_id":"api","wants":{}}}]}}}})"
      "\n",
      id, client, wants);
}

void send_all(int fd, const std::string& data) {
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
    if (!batch.empty()) send_all(c.fd, batch);
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
      const auto n = ::recv(c.fd, chunk, sizeof chunk, 0);
      if (n <= 0) throw std::runtime_error("connection closed by the node");
      c.in.append(chunk, static_cast<std::size_t>(n));
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

result run_one(const options& o, long clients, const std::filesystem::path& dir) {
  const auto config = dir / "resources.json";
  std::ofstream(config) << R"({"resources": [{"identifier_glob": "*", "capacity": 1000000,
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 600, "refresh_interval": 60,
                  "learning_mode_duration": 0}}]})";
  doorman_examples::process node(
      {"/usr/bin/taskset", "-c", "0", o.node_binary, "--listen", "127.0.0.1:0", "--config",
       config.string(), "--minimum-refresh-interval", "0"},
      (dir / fmt::format("node-{}.log", clients)).string());
  const auto address = node.listening_address();
  if (!address) throw std::runtime_error("the node did not start: " + node.log());

  std::vector<connection> conns(static_cast<std::size_t>(o.connections));
  for (auto& c : conns)
    c.fd = connect_to(*address);
  long errors = 0;
  fmt::print(stderr, "  {} clients: registering...", clients);
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
    ::close(c.fd);
  node.signal(SIGTERM);
  node.wait_exit();

  result r;
  r.clients = clients;
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
      } else if (arg == "--json") {
        o.json_file = value();
      } else {
        fmt::print(
            "usage: doorman_bench_load [--node-binary PATH] [--seconds S] [--connections N]\n"
            "                          [--window N] [--clients N,N,...] [--json FILE]\n");
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
    for (const long n : o.clients)
      results.push_back(run_one(o, n, dir));
    std::filesystem::remove_all(dir);

    fmt::print("| clients | decisions/s | p50 | p99 | p99.9 | errors |\n");
    fmt::print("|---:|---:|---:|---:|---:|---:|\n");
    std::string json = "{\"connections\": " + std::to_string(o.connections) +
                       ", \"window\": " + std::to_string(o.window) + ", \"runs\": [";
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      fmt::print("| {} | {:.0f} | {:.2f} ms | {:.2f} ms | {:.2f} ms | {} |\n", r.clients,
                 r.decisions_per_s, r.p50_us / 1000, r.p99_us / 1000, r.p999_us / 1000, r.errors);
      json += fmt::format(
          "{}{{\"clients\": {}, \"decisions_per_s\": {:.1f}, \"p50_us\": {:.1f}, "
          "\"p99_us\": {:.1f}, \"p999_us\": {:.1f}, \"errors\": {}}}",
          i ? ", " : "", r.clients, r.decisions_per_s, r.p50_us, r.p99_us, r.p999_us, r.errors);
    }
    json += "]}\n";
    if (!o.json_file.empty()) std::ofstream(o.json_file) << json;
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "doorman_bench_load: {}\n", e.what());
    return 1;
  }
}
