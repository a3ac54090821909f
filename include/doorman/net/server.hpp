#pragma once

/// \file
/// A JSON-RPC server over TCP, one JSON object per line (docs/protocol.md), on asio C++20
/// coroutines. It frames lines and hands each to a synchronous handler; the handler's answer is
/// written back. Requests on one connection may be pipelined; answers are written in batches.
///
///     auto strand = asio::make_strand(io);
///     doorman::net::server srv(strand, {}, [&](std::string_view line) {
///       return doorman::handle_line(engine, line, std::chrono::steady_clock::now());
///     });
///     srv.listen(*doorman::net::parse_address("127.0.0.1:7700"));
///     srv.start();
///     io.run();
///
/// Every coroutine of the server runs on the executor it is given; give it a strand, and the
/// handler (and whatever it touches) is only ever called from that strand.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>

#include "doorman/core/linkage.hpp"
#include "doorman/core/log_throttle.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/connection_counts.hpp"
#include "doorman/net/framing.hpp"
#include "doorman/net/listener.hpp"
#include "doorman/net/tls.hpp"
#include "doorman/protocol/json_rpc.hpp"

namespace doorman::net {

/// Limits of a server, with their defaults.
struct server_options {
  /// Longest accepted line (one JSON-RPC message), in bytes. A longer one is answered with an
  /// error (id null) and the connection is closed.
  std::size_t max_message_bytes = std::size_t{1} << 20;

  /// Connections beyond this are answered with an error and closed at once.
  std::size_t max_connections = 10'000;

  /// The retry delay that refusal names (`error.data.retry_after`, seconds); this library's
  /// clients wait at least that long before they connect to any task of the position again.
  seconds refused_retry_after{1};

  /// A connection that completes no line for this long is closed (this also ends a peer that
  /// stops reading its answers).
  seconds idle_timeout{300};

  /// Answers not yet written on one connection beyond which it is not read any further until
  /// they drain: a peer that pipelines without reading only stalls itself.
  std::size_t max_in_flight = 1024;

  /// How long `stop` waits for answers to be written before closing connections anyway.
  seconds stop_grace{5};

  /// With TLS: a connection that has not completed its handshake this long after it was
  /// accepted is closed.
  seconds handshake_timeout{10};
};

/// Who is on the other end of a connection, for a handler that authorizes.
struct peer_info {
  std::string address;           ///< `host:port`
  std::string identity;          ///< from a verified TLS client certificate; empty otherwise
  bool secure = false;           ///< whether the connection is TLS
  std::uint64_t connection = 0;  ///< unique within the server, from 1
};

namespace detail {

inline std::string error_line(rpc_code code, std::string message) {
  return to_line(make_error(nullptr, code, std::move(message))) + "\n";
}

}  // namespace detail

/// The server: an accept loop and one session per connection.
class server : public detail::accepting<server> {
 public:
  /// Called with the non-blank lines of one read (without their line ends), in order, and who
  /// sent them: appends an answer line and its newline to `out` for each line it answers, and
  /// returns how many it appended. Used as is, the answers go straight into the connection's
  /// output buffer, and a handler may work on several requests at once.
  using batch_handler = std::function<std::size_t(std::span<const std::string_view>,
                                                  const peer_info&, std::string& out)>;
  /// Called for every non-blank line: appends the answer line (no newline) to `out` and returns
  /// true, or returns false (no answer).
  using output_handler = std::function<bool(std::string_view, const peer_info&, std::string& out)>;
  /// Returns the answer line (no newline) or nothing.
  using handler_type =
      std::function<std::optional<std::string>(std::string_view, const peer_info&)>;
  /// A handler that does not look at the peer.
  using line_handler = std::function<std::optional<std::string>(std::string_view)>;

  server(asio::any_io_executor executor, server_options options, batch_handler handler,
         log_type log = {})
      : accepting(std::move(executor), "accept", std::move(log)),
        options_(options),
        handler_(std::move(handler)),
        stop_timer_(executor_) {}

  server(asio::any_io_executor executor, server_options options, output_handler handler,
         log_type log = {})
      : server(std::move(executor), options,
               batch_handler([h = std::move(handler)](std::span<const std::string_view> lines,
                                                      const peer_info& peer, std::string& out) {
                 std::size_t answers = 0;
                 for (const auto line : lines) {
                   if (!h(line, peer, out)) continue;
                   out += '\n';
                   ++answers;
                 }
                 return answers;
               }),
               std::move(log)) {}

  server(asio::any_io_executor executor, server_options options, handler_type handler,
         log_type log = {})
      : server(std::move(executor), options,
               output_handler([h = std::move(handler)](std::string_view line, const peer_info& peer,
                                                       std::string& out) {
                 auto reply = h(line, peer);
                 if (reply) out += *reply;
                 return reply.has_value();
               }),
               std::move(log)) {}

  server(asio::any_io_executor executor, server_options options, line_handler handler,
         log_type log = {})
      : server(std::move(executor), options,
               handler_type([h = std::move(handler)](std::string_view line, const peer_info&) {
                 return h(line);
               }),
               std::move(log)) {}

  ~server();

  /// Called on the executor when a connection ends, with its peer.
  void on_disconnect(std::function<void(const peer_info&)> f) { on_disconnect_ = std::move(f); }

  /// Graceful stop: stops accepting, stops reading, writes the answers already computed, then
  /// closes every connection (after `stop_grace` at the latest). Call it on the executor.
  void stop();

  /// Open connections.
  [[nodiscard]] std::size_t connections() const noexcept { return sessions_.size(); }

  /// What it counted of its connections since the start.
  [[nodiscard]] const connection_counts& counts() const noexcept { return counts_; }

  /// Connections refused because `max_connections` was reached, since the start.
  [[nodiscard]] std::uint64_t refused() const noexcept { return counts_.refused; }

  /// Connections accepted (and not refused), since the start.
  [[nodiscard]] std::uint64_t accepted() const noexcept { return counts_.accepted; }

  /// Connections closed for `idle_timeout`, since the start.
  [[nodiscard]] std::uint64_t closed_idle() const noexcept { return counts_.closed_idle; }

  /// TLS handshakes that failed or timed out, since the start.
  [[nodiscard]] std::uint64_t failed_handshakes() const noexcept {
    return counts_.failed_handshakes;
  }

  [[nodiscard]] const server_options& options() const noexcept { return options_; }

 private:
  friend class detail::accepting<server>;
  class session;

  void log(std::string_view s) const {
    if (log_) log_(s);
  }

  // A line of a repetitive kind (a flood of them is an attack or a misconfigured fleet):
  // one per 10 s per kind, with the count of those held back.
  void warn(log_throttle<std::chrono::steady_clock::time_point>& kind, std::string line) {
    kind.log(log_, std::move(line), std::chrono::steady_clock::now());
  }

  void close_all();

  void on_accept(asio::ip::tcp::socket socket);

  server_options options_;
  batch_handler handler_;
  asio::steady_timer stop_timer_;
  std::unordered_set<std::shared_ptr<session>> sessions_;
  std::function<void(const peer_info&)> on_disconnect_;
  log_throttle<std::chrono::steady_clock::time_point> handshake_log_{seconds(10)};
  log_throttle<std::chrono::steady_clock::time_point> idle_log_{seconds(10)};
  log_throttle<std::chrono::steady_clock::time_point> too_long_log_{seconds(10)};
  log_throttle<std::chrono::steady_clock::time_point> refused_log_{seconds(10)};
  connection_counts counts_;
  std::uint64_t connections_made_ = 0;
  bool stopping_ = false;
};

/// One connection: a reader that frames lines and calls the handler, a writer that sends the
/// answers in batches, and a watchdog for the idle timeout.
class server::session : public std::enable_shared_from_this<server::session> {
 public:
  session(server& owner, asio::ip::tcp::socket socket, const ssl_context_ptr& tls)
      : owner_(owner),
        executor_(socket.get_executor()),
        stream_(std::move(socket), tls),
        drained_(executor_),
        idle_(executor_) {
    peer_.address = detail::peer_of(stream_.socket());
    peer_.secure = stream_.secure();
    peer_.connection = ++owner_.connections_made_;
  }

  DOORMAN_DECL void start();

  // Stop reading; close once the answers computed so far are written.
  void stop() {
    stopping_ = true;
    if (!writing_) close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    stream_.close();
    idle_.cancel();
    drained_.cancel();
    if (owner_.on_disconnect_) owner_.on_disconnect_(peer_);
    owner_.sessions_.erase(shared_from_this());
    if (owner_.stopping_ && owner_.sessions_.empty()) owner_.stop_timer_.cancel();
  }

 private:
  using clock = std::chrono::steady_clock;

  void touch() {
    deadline_ = clock::now() + to_duration<clock::duration>(owner_.options_.idle_timeout.count());
  }

  // Takes up to `room` complete lines into `batch_` (line ends and blank lines dropped);
  // false when there were none.
  bool take_lines(line_buffer& in, std::size_t room) {
    batch_.clear();
    while (batch_.size() < room) {
      auto line = in.next_line();
      if (!line) break;
      if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
      if (line->find_first_not_of(" \t") == std::string_view::npos) continue;
      batch_.push_back(*line);
    }
    return !batch_.empty();
  }

  // Queues the error for an over-long line and ends the connection after writing it.
  void too_long() {
    owner_.warn(owner_.too_long_log_,
                fmt::format("warning: closing the connection from {}: a line longer than "
                            "max_message_bytes ({})",
                            peer_.address, owner_.options_.max_message_bytes));
    out_ += detail::error_line(rpc_code::invalid_request,
                               fmt::format("message longer than max_message_bytes ({})",
                                           owner_.options_.max_message_bytes));
    ++queued_;
    stopping_ = true;
    flush();
  }

  DOORMAN_DECL void flush();

  // The TLS handshake (bounded by handshake_timeout through the watchdog); false when it
  // failed and the connection is closed.
  static DOORMAN_DECL asio::awaitable<bool> handshake(std::shared_ptr<session> self);

  static DOORMAN_DECL asio::awaitable<void> read_loop(std::shared_ptr<session> self);

  static DOORMAN_DECL asio::awaitable<void> write_loop(std::shared_ptr<session> self);

  static DOORMAN_DECL asio::awaitable<void> watchdog(std::shared_ptr<session> self);

  server& owner_;
  asio::any_io_executor executor_;
  stream stream_;
  peer_info peer_;
  asio::steady_timer drained_;  // cancelled whenever answers were written
  asio::steady_timer idle_;
  clock::time_point deadline_{};
  std::string out_;                      // answers not yet handed to the socket
  std::vector<std::string_view> batch_;  // lines handed to the handler together
  std::size_t queued_ = 0;               // answers in out_
  std::size_t in_write_ = 0;             // answers being written
  bool writing_ = false;
  bool stopping_ = false;
  bool closed_ = false;
  bool handshaken_ = false;  // TLS only
};

inline server::~server() {
  close_all();
}

inline void server::stop() {
  if (stopping_) return;
  stopping_ = true;
  listener_.stop();
  const auto sessions = sessions_;  // stop() may remove sessions from the set
  for (const auto& s : sessions)
    s->stop();
  if (!sessions_.empty()) {
    stop_timer_.expires_after(
        to_duration<std::chrono::steady_clock::duration>(options_.stop_grace.count()));
    stop_timer_.async_wait([this](std::error_code e) {
      if (e) return;
      log(fmt::format("stopping: closing {} connection{} whose answers were not taken within {} s",
                      sessions_.size(), sessions_.size() == 1 ? "" : "s",
                      options_.stop_grace.count()));
      close_all();
    });
  }
}

inline void server::close_all() {
  const auto sessions = sessions_;
  for (const auto& s : sessions)
    s->close();
  sessions_.clear();
  stop_timer_.cancel();
}

inline void server::on_accept(asio::ip::tcp::socket socket) {
  if (sessions_.size() >= options_.max_connections) {
    ++counts_.refused;
    warn(refused_log_,
         fmt::format("warning: refusing connections beyond max_connections ({}), e.g. from {} "
                     "({} refused so far)",
                     options_.max_connections, detail::peer_of(socket), counts_.refused));
    // The hint tells clients of this library when to come back (their backoff's floor).
    auto refusal =
        make_error(nullptr, rpc_code::server_error, "too many connections; try again later");
    refusal["error"]["data"] = {{"retry_after", options_.refused_retry_after.count()}};
    refuse(socket, to_line(refusal) + "\n");
    return;
  }
  std::error_code ec;
  socket.set_option(asio::ip::tcp::no_delay(true), ec);
  const ssl_context_ptr tls = listener_.tls();  // named: see etcd.hpp
  auto s = std::make_shared<session>(*this, std::move(socket), tls);
  ++counts_.accepted;
  sessions_.insert(s);
  s->start();
}

}  // namespace doorman::net

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/net/impl/server.ipp"
#endif
