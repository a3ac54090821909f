#pragma once

/// \file
/// A node: engine + JSON-RPC server + upstream loop + election, on asio.

#include "doorman/net.hpp"
#include "doorman/node/admin.hpp"
#include "doorman/node/config_source.hpp"
#include "doorman/node/election.hpp"
#include "doorman/node/etcd_election.hpp"
#include "doorman/node/file_watch.hpp"
#include "doorman/node/node.hpp"
#include "doorman/node/source_follower.hpp"
#include "doorman/node/status_page.hpp"
