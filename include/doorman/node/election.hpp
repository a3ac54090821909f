#pragma once

/// \file
/// How a node learns whether it is master of its tree position. An election is started with a
/// callback and reports every change: `(is_master, master address if known)`. The node applies
/// each report to its engine (becoming master starts learning mode; losing mastership drops
/// every lease and turns answers into redirects), so an election backed by a lock service
/// (etcd) plugs in without the engine knowing.

#include <concepts>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace doorman {

/// What a node announces through its election: the address of its JSON-RPC door and, when it
/// has one, of its gRPC door (Doorman's protocol), so that a non-master answers each door with
/// the master's address for that door. The election's value is "HOST:PORT", or
/// "HOST:PORT grpc=HOST:PORT"; a value without the second part (a node without a gRPC door, or
/// an older one) reads as a master without a gRPC door.
struct advertised_doors {
  std::string json_rpc;
  std::string grpc;  ///< empty: none

  [[nodiscard]] std::string value() const {
    return grpc.empty() ? json_rpc : json_rpc + " grpc=" + grpc;
  }

  [[nodiscard]] static advertised_doors parse(std::string_view value) {
    constexpr std::string_view grpc_part = " grpc=";
    const auto at = value.find(grpc_part);
    if (at == std::string_view::npos) return {std::string(value), {}};
    return {std::string(value.substr(0, at)), std::string(value.substr(at + grpc_part.size()))};
  }
};

/// The callback an election reports to.
using mastership_callback = std::function<void(bool is_master, std::optional<std::string>)>;

/// What a node needs of an election.
template <class E>
concept election = requires(E& e, mastership_callback cb, std::string advertise) {
  e.start(std::move(advertise), std::move(cb));  // may call back at once or later, any thread
  e.stop();                                      // no calls back after it returns
};

/// The trivial election of a position with one task: it is always master.
class single_election {
 public:
  void start(std::string advertise, mastership_callback cb) { cb(true, std::move(advertise)); }
  void stop() {}
};

static_assert(election<single_election>);

}  // namespace doorman
