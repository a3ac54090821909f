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
#include <utility>

namespace doorman {

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
