#pragma once

// A real etcd member for the tests (etcd_test.cpp, grpc_test.cpp), and a free port.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <catch2/catch.hpp>

#include <doorman/net/etcd.hpp>

#include "process.hpp"

namespace doorman_test {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using doorman_examples::process;

// A TCP socket bound to a free port on 127.0.0.1 (the kernel's pick), closed when it goes;
// `listening`: it also listens, and never accepts (a peer that connects and is never answered).
class loopback_socket {
 public:
  explicit loopback_socket(bool listening) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    REQUIRE(fd_ >= 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    if (listening) REQUIRE(::listen(fd_, 16) == 0);
    socklen_t len = sizeof sa;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
    port_ = ntohs(sa.sin_port);
  }
  loopback_socket(const loopback_socket&) = delete;
  loopback_socket& operator=(const loopback_socket&) = delete;
  ~loopback_socket() { ::close(fd_); }

  [[nodiscard]] int port() const noexcept { return port_; }
  [[nodiscard]] std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_;
  int port_ = 0;
};

// A free TCP port on 127.0.0.1 (the kernel's pick; closed again at once).
inline int free_port() {
  return loopback_socket(false).port();
}

// A TCP link to `target` that the test can cut and heal, as a network does: while cut, no
// byte moves either way (connections stay open, the kernel's buffers fill, new connections are
// accepted and carry nothing); after the heal, what waited flows on.
class link_proxy {
 public:
  // `target`: 127.0.0.1:PORT.
  explicit link_proxy(const std::string& target)
      : target_port_(target.substr(target.rfind(':') + 1)) {
    acceptor_.open(asio::ip::tcp::v4());
    acceptor_.bind({asio::ip::make_address_v4("127.0.0.1"), 0});
    acceptor_.listen();
    asio::co_spawn(io_, accept(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  link_proxy(const link_proxy&) = delete;
  link_proxy& operator=(const link_proxy&) = delete;
  ~link_proxy() {
    io_.stop();
    thread_.join();
  }

  [[nodiscard]] std::string address() const {
    return "127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port());
  }
  void cut() { cut_ = true; }
  void heal() { cut_ = false; }
  // As a peer that restarts: the link's connections are closed (once this returns), and new
  // ones are closed as they come, until `accept_again`.
  void refuse() {
    refusing_ = true;
    std::promise<void> done;
    asio::post(io_, [this, &done] {
      for (auto& w : live_) {
        if (const auto sock = w.lock()) {
          std::error_code ignored;
          sock->close(ignored);
        }
      }
      live_.clear();
      done.set_value();
    });
    done.get_future().wait();
  }
  void accept_again() { refusing_ = false; }

 private:
  using tcp = asio::ip::tcp;

  asio::awaitable<void> accept() {
    for (;;) {
      auto in = std::make_shared<tcp::socket>(co_await acceptor_.async_accept(asio::use_awaitable));
      if (refusing_) continue;  // closed as it goes
      std::erase_if(live_, [](const auto& w) { return w.expired(); });
      live_.push_back(in);
      auto out = std::make_shared<tcp::socket>(io_);
      std::error_code ec;
      out->connect({asio::ip::make_address_v4("127.0.0.1"),
                    static_cast<unsigned short>(std::stoi(target_port_))},
                   ec);
      if (ec) continue;
      asio::co_spawn(io_, pump(in, out), asio::detached);
      asio::co_spawn(io_, pump(out, in), asio::detached);
    }
  }

  asio::awaitable<void> pump(std::shared_ptr<tcp::socket> from, std::shared_ptr<tcp::socket> to) {
    std::array<char, 16384> buf{};
    asio::steady_timer t(io_);
    try {
      for (;;) {
        while (cut_) {  // polled: the test cuts and heals from its own thread
          t.expires_after(std::chrono::milliseconds(10));
          co_await t.async_wait(asio::use_awaitable);
        }
        const std::size_t n =
            co_await from->async_read_some(asio::buffer(buf), asio::use_awaitable);
        while (cut_) {  // read just before the cut: held until the heal
          t.expires_after(std::chrono::milliseconds(10));
          co_await t.async_wait(asio::use_awaitable);
        }
        co_await asio::async_write(*to, asio::buffer(buf.data(), n), asio::use_awaitable);
      }
    } catch (const std::exception&) {
      std::error_code ignored;
      to->shutdown(tcp::socket::shutdown_send, ignored);
    }
  }

  std::string target_port_;
  asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  std::atomic<bool> cut_{false};
  std::atomic<bool> refusing_{false};
  std::vector<std::weak_ptr<tcp::socket>> live_;  // the accepted ends (on io_'s thread)
  std::thread thread_;
};

inline std::string find_etcd() {
  const char* path = std::getenv("PATH");
  const std::string p = path ? path : "/usr/bin";
  for (std::size_t start = 0; start <= p.size();) {
    const auto end = std::min(p.find(':', start), p.size());
    const std::string candidate = p.substr(start, end - start) + "/etcd";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

// One etcd member on loopback ports with a temporary data directory; killed and removed at
// the end. `kill` then `start` again keeps its data (leases included).
class etcd_server {
 public:
  // With `tls` (a directory of examples/make_certs.sh), clients must speak TLS and show a
  // certificate of its CA; the server shows node.pem.
  // The ports are picked free, then bound by etcd: another process may take one in between,
  // and etcd then exits at once. Up to 3 tries, each with fresh ports.
  explicit etcd_server(std::string tls = {}) : tls_(std::move(tls)) {
    binary_ = find_etcd();
    if (binary_.empty()) FAIL("etcd not found on PATH: install etcd-server (make deps does)");
    char dir_template[] = "/tmp/doorman-etcd-XXXXXX";
    REQUIRE(::mkdtemp(dir_template));
    dir_ = dir_template;
    for (int attempt = 1;; ++attempt) {
      {
        const loopback_socket client(false), peer(false);  // two distinct ports
        client_port_ = client.port();
        peer_port_ = peer.port();
      }
      if (launch()) return;
      INFO("etcd's log:\n" << process_->log());
      REQUIRE(attempt < 3);
      process_.reset();
      std::filesystem::remove_all(dir_ + "/data");
    }
  }
  etcd_server(const etcd_server&) = delete;
  etcd_server& operator=(const etcd_server&) = delete;
  ~etcd_server() {
    process_.reset();
    std::filesystem::remove_all(dir_);
  }

  [[nodiscard]] std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  [[nodiscard]] const std::string& dir() const { return dir_; }

  // Starts it again (after `kill`) on the same ports, with its data.
  void start() {
    const bool ready = launch();
    INFO("etcd's log:\n" << process_->log());
    REQUIRE(ready);
  }

  void kill() { process_.reset(); }
  void pause() { process_->signal(SIGSTOP); }
  void resume() { process_->signal(SIGCONT); }

  // Writes `key` = `value` through the library's own gateway client.
  void put(const std::string& key, const std::string& value) {
    asio::io_context io;
    doorman::net::etcd_client etcd(io.get_executor(), {endpoint()});
    std::string error = "not run";
    asio::co_spawn(io, etcd.put(key, value, steady::now() + 5s),
                   [&](std::exception_ptr e, doorman::net::etcd_result<bool> r) {
                     error = e ? "exception" : r.message;
                   });
    io.run();
    REQUIRE(error.empty());
  }

 private:
  // Starts etcd; whether it said it is ready to serve within 30 s.
  bool launch() {
    const std::string client = (tls_.empty() ? "http://" : "https://") + endpoint();
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    process_.reset();
    std::vector<std::string> args = {binary_,
                                     "--name",
                                     "doorman-test",
                                     "--data-dir",
                                     dir_ + "/data",
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     "doorman-test=" + peer};
    if (!tls_.empty()) {
      for (const auto& a :
           {"--cert-file=" + tls_ + "/node.pem", "--key-file=" + tls_ + "/node.key",
            "--trusted-ca-file=" + tls_ + "/ca.pem", std::string("--client-cert-auth")})
        args.push_back(a);
    }
    process_ = std::make_unique<process>(args, dir_ + "/etcd.log");
    return process_->wait_for("ready to serve client requests", 30s).has_value();
  }

  int client_port_ = 0;
  int peer_port_ = 0;
  std::string binary_;
  std::string dir_;
  std::string tls_;
  std::unique_ptr<process> process_;
};

}  // namespace doorman_test
