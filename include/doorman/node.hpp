#pragma once

/// \file
/// A node: engine + JSON-RPC server + upstream loop + election, on asio.

#include "doorman/net.hpp"
#include "doorman/node/election.hpp"
#include "doorman/node/etcd_election.hpp"
#include "doorman/node/node.hpp"
