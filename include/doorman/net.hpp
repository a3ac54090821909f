#pragma once

/// \file
/// The asio transport: addresses, the JSON-RPC line server and the client channel.

#include "doorman/net/address.hpp"
#include "doorman/net/channel.hpp"
#include "doorman/net/server.hpp"
