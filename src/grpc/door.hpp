#pragma once

// Doorman's gRPC service (`doorman.Capacity`) as a door of a node: it translates each call to
// doorman's request, hands it to a `handler` (the node's service core), and translates the
// answer back (docs/doorman-compatibility.md). Compiled once (the CMake target doorman::grpc);
// no gRPC or protobuf header shows through this one.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include <doorman/core/messages.hpp>
#include <doorman/net/tls_options.hpp>
#include <doorman/protocol/rlqs_session.hpp>
#include <doorman/protocol/service.hpp>

namespace doorman::grpc_door {

// Who called, as the node's other doors describe a peer.
struct caller {
  std::string address;   // the peer as gRPC names it (e.g. "ipv4:127.0.0.1:5000")
  std::string identity;  // from a verified client certificate; empty otherwise
  bool secure = false;
};

template <class Answer>
using reply = std::function<void(call_result<Answer>)>;

// What the door calls: each call once, its `reply` exactly once, from any thread.
class handler {
 public:
  virtual ~handler() = default;
  virtual void get_capacity(capacity_request r, caller c, reply<capacity_response> done) = 0;
  virtual void get_server_capacity(server_capacity_request r, caller c,
                                   reply<server_capacity_response> done) = 0;
  virtual void release_capacity(release_request r, caller c, reply<release_response> done) = 0;
  virtual void discovery(caller c, reply<discovery_response> done) = 0;
  // Not a gRPC method of Doorman's: the RLQS door draws budget blocks with it.
  virtual void count_hits(count_request r, caller c, reply<count_response> done) = 0;

 protected:
  handler() = default;
  handler(const handler&) = default;
  handler& operator=(const handler&) = default;
};

struct server_options {
  std::string listen;      // host:port (port 0: a free one)
  net::tls_options tls{};  // all empty: plaintext
  int max_message_bytes = 1 << 20;
  int max_concurrent_streams = 100;  // per connection
};

// Envoy's rate limit quota service (RLQS) beside Doorman's on the same port (rlqs_door.hpp):
// each stream a client of the node, each bucket a resource (docs/envoy.md).
struct rlqs_options {
  bool enabled = true;
  rlqs::session_options session{};
  std::size_t max_streams_per_identity = 64;  ///< or per peer host, without a certificate
  std::size_t max_queued_messages = 64;       ///< unread by Envoy: more ends the stream
};

class hosting;

// A gRPC server of one of the layer's services (hosting.hpp): binds in `start()`, stops in
// `stop()` or its destructor, after the calls in flight are answered (within `grace`).
class server_base {
 public:
  ~server_base();
  server_base(const server_base&) = delete;
  server_base& operator=(const server_base&) = delete;

  // Binds and starts serving; throws std::runtime_error naming the address when it cannot.
  void start();
  // The port it listens on (after `start`).
  [[nodiscard]] int port() const noexcept;
  // Reads the TLS files again (SIGHUP): a new server with the new certificates takes the port
  // (beside the old one, SO_REUSEPORT), and the old one answers its calls in flight (within
  // `grace`) and goes; its clients reconnect to the new one. False without TLS; throws, naming
  // the file and keeping the old server, when the files do not load. Not concurrently with
  // `stop`.
  bool reload_tls(std::chrono::milliseconds grace = std::chrono::milliseconds(1000));
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(1000));

 protected:
  explicit server_base(std::unique_ptr<hosting> host);

 private:
  std::unique_ptr<hosting> host_;
};

// The gRPC server of Doorman's service over `h`, and (unless `rlqs.enabled` is false)
// Envoy's rate limit quota service over the same handler.
class server : public server_base {
 public:
  server(server_options options, handler& h, rlqs_options rlqs = {});
};

}  // namespace doorman::grpc_door
