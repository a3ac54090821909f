#pragma once

/// \file
/// The asio transport: addresses, the JSON-RPC line server, the client channel, and the etcd
/// v3 gateway client (on a minimal HTTP/1.1 client).

#include "doorman/net/address.hpp"
#include "doorman/net/channel.hpp"
#include "doorman/net/etcd.hpp"
#include "doorman/net/http.hpp"
#include "doorman/net/http_request.hpp"
#include "doorman/net/http_server.hpp"
#include "doorman/net/listener.hpp"
#include "doorman/net/server.hpp"
#include "doorman/net/supervise.hpp"
#include "doorman/net/tls.hpp"
