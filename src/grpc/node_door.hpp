#pragma once

// The gRPC door's handler over a node: every call goes through `basic_node::call`, so it is
// decided, guarded, counted and logged as a JSON-RPC call is.

#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>

#include <doorman/node.hpp>

#include "door.hpp"

namespace doorman::grpc_door {

template <class Node>
class node_handler final : public handler {
 public:
  explicit node_handler(Node& node) : node_(node) {}

  void get_capacity(capacity_request r, caller c, reply<capacity_response> done) override {
    node_.template call<methods::get_capacity>(std::move(r), peer_of(std::move(c)), rpc_door::grpc,
                                               std::move(done));
  }
  void get_server_capacity(server_capacity_request r, caller c,
                           reply<server_capacity_response> done) override {
    node_.template call<methods::get_server_capacity>(std::move(r), peer_of(std::move(c)),
                                                      rpc_door::grpc, std::move(done));
  }
  void release_capacity(release_request r, caller c, reply<release_response> done) override {
    node_.template call<methods::release_capacity>(std::move(r), peer_of(std::move(c)),
                                                   rpc_door::grpc, std::move(done));
  }
  void discovery(caller c, reply<discovery_response> done) override {
    node_.template call<methods::discovery>(discovery_request{}, peer_of(std::move(c)),
                                            rpc_door::grpc, std::move(done));
  }
  void count_hits(count_request r, caller c, reply<count_response> done) override {
    node_.template call<methods::count_hits>(std::move(r), peer_of(std::move(c)), rpc_door::grpc,
                                             std::move(done));
  }

 private:
  // A gRPC peer has no connection of the node's, and gRPC says nothing when one closes. A
  // caller without an identity has its client ids counted (`max_client_ids`) per peer host,
  // under a number of its own (the top bit set: never a connection's), so that the records stay
  // as many as the hosts, however often they reconnect.
  static net::peer_info peer_of(caller c) {
    const std::string_view address = c.address;  // "ipv4:10.0.0.7:5000", "ipv6:[::1]:5000"
    const auto host = address.substr(0, address.rfind(':'));
    const std::uint64_t holder = (std::uint64_t{1} << 63) | std::hash<std::string_view>{}(host);
    return {std::move(c.address), std::move(c.identity), c.secure, holder};
  }

  Node& node_;
};

}  // namespace doorman::grpc_door
