#pragma once

/// \file
/// The sans-I/O core: time, leases, configuration, algorithms, lease store, engine and upstream
/// state.

#include "doorman/core/algorithm.hpp"
#include "doorman/core/backoff.hpp"
#include "doorman/core/call.hpp"
#include "doorman/core/client_state.hpp"
#include "doorman/core/config.hpp"
#include "doorman/core/config_follower.hpp"
#include "doorman/core/election_campaign.hpp"
#include "doorman/core/election_term.hpp"
#include "doorman/core/engine.hpp"
#include "doorman/core/error.hpp"
#include "doorman/core/glob.hpp"
#include "doorman/core/hit_counts.hpp"
#include "doorman/core/lease.hpp"
#include "doorman/core/lease_store.hpp"
#include "doorman/core/log_throttle.hpp"
#include "doorman/core/markup.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/core/share_index.hpp"
#include "doorman/core/string_hash.hpp"
#include "doorman/core/time.hpp"
#include "doorman/core/time_text.hpp"
#include "doorman/core/upstream.hpp"
