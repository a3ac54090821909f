#pragma once

/// \file
/// The wire protocol: message codecs, the JSON-RPC envelope, and the line dispatcher.

#include "doorman/protocol/codec.hpp"
#include "doorman/protocol/dispatch.hpp"
#include "doorman/protocol/hot_path.hpp"
#include "doorman/protocol/json_rpc.hpp"
#include "doorman/protocol/service.hpp"
