#pragma once

// Doorman's gRPC messages (proto/doorman.proto) to doorman's requests and back
// (docs/doorman-compatibility.md). Pure functions: no clock is read (`now_unix` is the time the
// call is decided at, in Unix seconds), nothing is validated here beyond what the wire form
// needs; the engine validates the requests it is given, as for every door.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <doorman/core/messages.hpp>

#include "doorman.pb.h"

namespace doorman::grpc_door {

// Now, in Unix seconds (what Doorman's leases are measured in).
double unix_now();

// A proto Lease held by a client, in doorman's relative terms at `now_unix`.
lease_info from_proto(const ::doorman::Lease& l, double now_unix);

// A grant in Doorman's absolute terms: `expiry_time` rounded down to a whole Unix second (never
// later than the lease), `refresh_interval` rounded down to whole seconds, at least 1 and at
// most the seconds left on the lease (the client refreshes no later than it must).
void to_proto(const lease_info& l, double now_unix, ::doorman::Lease& out);

capacity_request from_proto(const ::doorman::GetCapacityRequest& r, double now_unix);
// `outstanding` is not on Doorman's wire: 0.
server_capacity_request from_proto(const ::doorman::GetServerCapacityRequest& r, double now_unix);
// Empty resource ids are dropped: Doorman's Go client sends one per resource before the real
// ids when it closes (it appends to a slice made with that length), and would retry a refusal
// forever. `kept`, when given, receives the proto's index of each id kept, for `proto_path`.
release_request from_proto(const ::doorman::ReleaseCapacityRequest& r,
                           std::vector<std::size_t>* kept = nullptr);

// A non-master's answer carries `mastership` (naming the master when known); a master's
// leaves it out, which Doorman's clients read as "this is the master".
void to_proto(const capacity_response& a, double now_unix, ::doorman::GetCapacityResponse& out);
void to_proto(const server_capacity_response& a, double now_unix,
              ::doorman::GetServerCapacityResponse& out);
void to_proto(const release_response& a, ::doorman::ReleaseCapacityResponse& out);
void to_proto(const discovery_response& a, ::doorman::DiscoveryResponse& out);

// The other way, for a parent link to a Doorman server (parent_channel.hpp): doorman's request
// in Doorman's terms (`outstanding` is not on its wire), and its answer in doorman's. An answer
// without `mastership` is a master's; a parameter's value that reads as a JSON number becomes
// one, as in doorman's configuration. Nothing is validated here: the link decodes the result
// as it decodes every parent's answer.
void to_proto(const server_capacity_request& r, double now_unix,
              ::doorman::GetServerCapacityRequest& out);
server_capacity_response from_proto(const ::doorman::GetServerCapacityResponse& r, double now_unix);

// A field path of doorman's JSON requests ("params.resources[0].wants") as the proto names it
// ("resource[0].wants"; `list` is the request's repeated field, "resource_id" for a release),
// for INVALID_ARGUMENT messages. `indices`: the proto's index of each entry of doorman's list,
// when some were dropped (a release's empty ids); none: the same.
std::string proto_path(std::string message, std::string_view list = "resource",
                       const std::vector<std::size_t>& indices = {});

}  // namespace doorman::grpc_door
