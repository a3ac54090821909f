#pragma once

// A blocking JSON-RPC line client on plain POSIX sockets, every read with a deadline, for the
// network tests (it shares no code with the channel it tests).

#include <catch2/catch.hpp>

#include <doorman/net/address.hpp>
#include <doorman/protocol/json_rpc.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace doorman_test {

using json = nlohmann::json;
using steady = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A listening TCP socket on a free port of 127.0.0.1, and its address ("127.0.0.1:PORT"), for
// the tests' own peers.
inline std::pair<int, std::string> listen_on_loopback(int backlog = 8) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  REQUIRE(::listen(fd, backlog) == 0);
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  return {fd, "127.0.0.1:" + std::to_string(ntohs(sa.sin_port))};
}

// One JSON-RPC request line, newline included.
inline std::string request_line(int id, const std::string& method, const json& params) {
  return doorman::to_line(
             {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}}) +
         "\n";
}

// ---- a blocking line client on plain POSIX sockets, every read with a deadline ------------

class line_client {
 public:
  explicit line_client(const std::string& address) {
    const auto a = doorman::net::parse_address(address);
    REQUIRE(a);
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(a->port)));
    ::inet_pton(AF_INET, a->host.c_str(), &sa.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  line_client(const line_client&) = delete;
  line_client& operator=(const line_client&) = delete;
  ~line_client() {
    if (fd_ >= 0) ::close(fd_);
  }

  [[nodiscard]] bool connected() const { return connected_; }

  // Ends the connection in both directions (wakes a send blocked in another thread).
  void shutdown() { ::shutdown(fd_, SHUT_RDWR); }

  bool send(std::string_view data) {
    while (!data.empty()) {
      const auto n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // Sends `chunk` again and again without reading until the peer stops taking it: no byte
  // accepted for `quiet` (a server that stops reading once its answers cannot be written).
  // False if the peer still takes data after `limit`, or fails.
  bool flood_until_stalled(std::string_view chunk, std::chrono::milliseconds quiet,
                           std::chrono::milliseconds limit = 20s) {
    const auto deadline = steady::now() + limit;
    std::size_t at = 0;
    while (steady::now() < deadline) {
      const auto n = ::send(fd_, chunk.data() + at, chunk.size() - at, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        at = (at + static_cast<std::size_t>(n)) % chunk.size();
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
      pollfd p{fd_, POLLOUT, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(quiet.count()));
      if (ready == 0) return true;
      if (ready < 0) return false;
    }
    return false;
  }

  // The next line, or nothing at the deadline or when the peer closed.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = steady::now() + timeout;
    for (;;) {
      if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char chunk[65536];
      const auto n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // Everything until the peer closes (what came before the deadline, if it does not).
  std::string read_until_closed(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = steady::now() + timeout;
    std::string out = std::move(buffer_);
    buffer_.clear();
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
      if (left.count() <= 0) return out;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return out;
      char chunk[65536];
      const auto n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return out;
      out.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // Whether the peer closed the connection before the deadline.
  bool closed_by_peer(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = steady::now() + timeout;
    while (steady::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char chunk[4096];
      const auto n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0) return true;
    }
    return false;
  }

  json call(const std::string& method, const json& params, int id = 1) {
    REQUIRE(send(request_line(id, method, params)));
    const auto line = read_line();
    REQUIRE(line);
    return json::parse(*line);
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string buffer_;
};

// An HTTP exchange on a fresh connection: sends `request` as is, reads until the peer closes
// (or the deadline). The status code and the body; status 0 when no whole answer came (or no
// connection).
struct http_result {
  int status = 0;
  std::string head;
  std::string body;
};

inline http_result http_exchange(const std::string& address, std::string_view request,
                                 std::chrono::milliseconds timeout = 5s) {
  line_client c(address);
  if (!c.connected()) return {};
  c.send(request);
  const std::string raw = c.read_until_closed(timeout);
  http_result r;
  const auto end = raw.find("\r\n\r\n");
  if (!raw.starts_with("HTTP/1.1 ") || end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.head = raw.substr(0, end);
  r.body = raw.substr(end + 4);
  return r;
}

inline http_result http_get(const std::string& address, const std::string& target) {
  // fmt, not operator+: GCC 12 at -O2 warns falsely (-Warray-bounds) on that concatenation.
  return http_exchange(address, fmt::format("GET {} HTTP/1.1\r\nHost: test\r\n\r\n", target));
}

inline json capacity_params(const std::string& client, const std::string& resource, double wants,
                            const std::optional<json>& has = std::nullopt) {
  json r = {{"resource_id", resource}, {"wants", wants}};
  if (has) r["has"] = *has;
  return {{"client_id", client}, {"resources", json::array({r})}};
}

inline double gets(const json& response, std::size_t i = 0) {
  return response.at("result").at("resources").at(i).at("gets").at("capacity").get<double>();
}

inline json status_of(const std::string& address, const std::string& resource) {
  line_client c(address);
  REQUIRE(c.connected());
  return c.call("status", {{"resource_id", resource}}).at("result");
}

inline double capacity_at(const std::string& address, const std::string& resource) {
  return status_of(address, resource).at("resources").at(0).at("capacity").get<double>();
}

// `publish(text)` puts a configuration with a negative capacity where the node `p` (a
// process) reads it and makes it look; the node must reject it, naming the field, and keep
// serving "db" with capacity `kept`.
template <class Process, class Publish>
void check_bad_config_kept(Process& p, const std::string& address, double kept, Publish publish) {
  publish(R"({"resources": [{"identifier_glob": "*", "capacity": -5,
    "algorithm": {"kind": "FAIR_SHARE", "lease_length": 3, "refresh_interval": 0.4}}]})");
  const auto rejected = p.wait_for("rejected", 5s);
  REQUIRE(rejected);
  CHECK_THAT(*rejected, Catch::Contains("resources[0].capacity"));
  CHECK(capacity_at(address, "db") == kept);
}

}  // namespace doorman_test
