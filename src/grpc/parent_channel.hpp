#pragma once

// A parent link's channel that speaks Doorman's gRPC protocol, so that a doorman intermediate
// can sit under a Doorman server (docs/doorman-compatibility.md). It answers the link's
// `get_server_capacity` calls with `doorman.Capacity/GetServerCapacity`: the same addresses,
// deadline, redirects to the master and backoff as doorman's own channel (the sans-I/O
// `failover` machine decides where and when), the same TLS files. Doorman's protocol has no
// `status`: the link's call for the parent's level fails at once, and the level stays 1.
// Compiled once (doorman::grpc); no gRPC header shows through this one.

#include <memory>

#include <asio/any_io_executor.hpp>

#include <doorman/net/channel.hpp>

namespace doorman::grpc_door {

// A channel for `node_options::parent_channel` (its calls run on `executor`, the node's strand).
// Throws std::runtime_error naming a TLS file it cannot read.
std::unique_ptr<net::call_channel> make_parent_channel(asio::any_io_executor executor,
                                                       net::channel_options options);

}  // namespace doorman::grpc_door
