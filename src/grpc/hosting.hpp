#pragma once

// A gRPC server hosting the services of one port, for the layer's doors (door.cpp, rls_door.cpp):
// bound with the node's TLS files and limits, rebuilt with new certificates on reload (a new server
// binds beside the old one, SO_REUSEPORT; the old one answers its calls in flight and goes).
// Internal to the compiled layer: it shows gRPC's headers.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>

#include "door.hpp"

namespace doorman::grpc_door {

// Who called, by the rules of the node's other ports: the identity of a verified client
// certificate.
caller caller_of(const grpc::CallbackServerContext& ctx);

class hosting {
 public:
  // Makes fresh service objects for each server (a service is registered with one at a time).
  using services = std::vector<std::unique_ptr<grpc::Service>>;
  using make_services = std::function<services()>;

  hosting(server_options options, make_services make)
      : options_(std::move(options)), make_(std::move(make)) {}
  ~hosting() { stop(std::chrono::milliseconds(1000)); }
  hosting(const hosting&) = delete;
  hosting& operator=(const hosting&) = delete;

  // Binds and serves; throws std::runtime_error naming the address when it cannot.
  void start();
  [[nodiscard]] int port() const noexcept { return port_; }
  // As `server::reload_tls` (door.hpp) says.
  bool reload_tls(std::chrono::milliseconds grace);
  void stop(std::chrono::milliseconds grace);

 private:
  struct built {
    std::unique_ptr<grpc::Server> server;
    services served;
  };
  built build(const std::string& address, const std::shared_ptr<grpc::ServerCredentials>& creds,
              int& bound);
  void retire(built old, std::chrono::milliseconds grace);

  server_options options_;
  make_services make_;
  built current_;
  int port_ = 0;
  std::thread retiring_;  // shuts down the server a reload replaced
};

}  // namespace doorman::grpc_door
