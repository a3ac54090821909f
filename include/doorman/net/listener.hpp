#pragma once

/// \file
/// The accepting half of every TCP port a node serves (JSON-RPC lines, the admin endpoint):
/// binding, an accept loop that never ends silently and pauses instead of spinning when accept
/// fails, sockets kept out of child processes, the TLS context a new connection gets, and the
/// refusal of a connection over its server's limits. What a connection then does is its
/// server's.
///
///     doorman::net::listener l(strand, "accept", log);
///     l.listen(*doorman::net::parse_address("127.0.0.1:0"));
///     l.start([&](asio::ip::tcp::socket s) {
///       if (full) return doorman::net::refuse(s, "busy\n");
///       serve(std::move(s), l.tls());
///     });

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <asio.hpp>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#endif

#include "doorman/core/linkage.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/supervise.hpp"
#include "doorman/net/tls.hpp"

namespace doorman::net {

/// An endpoint's `host:port` (`[host]:port` for an IPv6 address).
[[nodiscard]] inline std::string address_of(const asio::ip::tcp::endpoint& ep) {
  return address{ep.address().to_string(), std::to_string(ep.port())}.to_string();
}

namespace detail {

// Keeps a socket out of the processes an embedding program starts: a child that inherited the
// listening socket would hold the port after the node stopped (and an accepted one, the peer's
// connection).
template <class Socket>
void close_on_exec(Socket& socket) {
#if defined(__unix__) || defined(__APPLE__)
  const int fd = socket.native_handle();
  if (fd >= 0) ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
#else
  (void)socket;
#endif
}

// Resolves `where`, then opens, binds and listens `acceptor` (port 0 picks a free port); on
// failure `ec` says why and the acceptor is left closed.
inline void listen_on(asio::ip::tcp::acceptor& acceptor, const address& where,
                      std::error_code& ec) {
  asio::ip::tcp::resolver resolver(acceptor.get_executor());
  const auto results = resolver.resolve(where.host, where.port, ec);
  if (ec) return;
  if (results.empty()) {
    ec = asio::error::host_not_found;
    return;
  }
  const auto endpoint = results.begin()->endpoint();
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) close_on_exec(acceptor);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::error_code ignored;
    acceptor.close(ignored);
  }
}

// The peer's "host:port" (or "an unknown peer"), for log lines.
inline std::string peer_of(const asio::ip::tcp::socket& socket) {
  std::error_code ec;
  const auto ep = socket.remote_endpoint(ec);
  if (ec) return "an unknown peer";
  return address_of(ep);
}

}  // namespace detail

/// Refuses a connection just accepted: writes `message` without blocking (the send buffer of
/// a fresh socket takes a short one), then closes it.
inline void refuse(asio::ip::tcp::socket& socket, std::string_view message) {
  std::error_code ec;
  if (!message.empty()) {
    socket.non_blocking(true, ec);
    socket.write_some(asio::buffer(message), ec);
  }
  socket.close(ec);
}

/// Binds a port and accepts connections on it, handing each to its server.
class listener {
 public:
  /// Called on the executor with every accepted socket: keeps it (a new connection) or
  /// `refuse`s it.
  using accept_handler = std::function<void(asio::ip::tcp::socket)>;
  using log_type = std::function<void(std::string_view)>;

  /// `what` names the loop in log lines ("accept": "warning: accept failed: ...").
  listener(asio::any_io_executor executor, std::string what, log_type log = {})
      : executor_(std::move(executor)),
        what_(std::move(what)),
        log_(std::move(log)),
        acceptor_(executor_),
        retry_(executor_) {}

  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;

  /// Binds and listens (port 0 picks a free port); `ec` says why not (e.g. `address_in_use`).
  void listen(const address& where, std::error_code& ec) {
    detail::listen_on(acceptor_, where, ec);
  }

  /// As above; throws `std::system_error` naming the address.
  void listen(const address& where) {
    std::error_code ec;
    listen(where, ec);
    if (ec) throw std::system_error(ec, "listening on " + where.to_string());
  }

  /// Where it listens.
  [[nodiscard]] asio::ip::tcp::endpoint local_endpoint() const {
    return acceptor_.local_endpoint();
  }

  /// Serves TLS with the context's current certificates (a null pointer: plaintext).
  /// `tls->reload()` changes what later connections get.
  void use_tls(std::shared_ptr<tls_context> tls) { tls_ = std::move(tls); }

  /// Whether connections are TLS.
  [[nodiscard]] bool secure() const noexcept { return tls_ != nullptr; }

  /// The TLS context for a connection accepted now (null without TLS).
  [[nodiscard]] ssl_context_ptr tls() const { return tls_ ? tls_->current() : nullptr; }

  /// Starts accepting: `on_accept` gets every connection until `stop`.
  DOORMAN_DECL void start(accept_handler on_accept);

  /// Stops accepting and closes the port. Call it on the executor.
  void stop() {
    stopping_ = true;
    std::error_code ec;
    acceptor_.close(ec);
    retry_.cancel();
  }

  /// Whether `stop` was called.
  [[nodiscard]] bool stopping() const noexcept { return stopping_; }

 private:
  DOORMAN_DECL asio::awaitable<void> accept_loop();

  asio::any_io_executor executor_;
  std::string what_;
  log_type log_;
  asio::ip::tcp::acceptor acceptor_;
  asio::steady_timer retry_;
  std::shared_ptr<tls_context> tls_;
  accept_handler on_accept_;
  bool stopping_ = false;
};

namespace detail {

/// What every server that accepts connections does with its listener, written once: bind, say
/// where, serve TLS, start accepting into `Derived::on_accept(socket)`. The JSON-RPC server
/// and the HTTP server build on it.
template <class Derived>
class accepting {
 public:
  using log_type = std::function<void(std::string_view)>;

  accepting(const accepting&) = delete;
  accepting& operator=(const accepting&) = delete;

  /// Binds and listens (port 0 picks a free port); `ec` says why not (e.g. `address_in_use`).
  void listen(const address& where, std::error_code& ec) { listener_.listen(where, ec); }

  /// As above; throws `std::system_error` naming the address.
  void listen(const address& where) { listener_.listen(where); }

  /// Where it listens.
  [[nodiscard]] asio::ip::tcp::endpoint local_endpoint() const {
    return listener_.local_endpoint();
  }

  /// Serves TLS with the context's current certificates (call before `start`; a null pointer
  /// goes back to plaintext). `tls->reload()` changes what later connections get.
  void use_tls(std::shared_ptr<tls_context> tls) { listener_.use_tls(std::move(tls)); }

  /// Starts accepting.
  void start() {
    listener_.start([this](asio::ip::tcp::socket socket) {
      static_cast<Derived*>(this)->on_accept(std::move(socket));
    });
  }

 protected:
  /// `what` names the accept loop in log lines.
  accepting(asio::any_io_executor executor, std::string what, log_type log)
      : executor_(std::move(executor)),
        log_(std::move(log)),
        listener_(executor_, std::move(what), log_) {}
  ~accepting() = default;

  asio::any_io_executor executor_;
  log_type log_;
  listener listener_;
};

}  // namespace detail

}  // namespace doorman::net

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/net/impl/listener.ipp"
#endif
