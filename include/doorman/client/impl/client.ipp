#pragma once

/// \file
/// The coroutines of client::client, and what spawns them (declared in
/// <doorman/client/client.hpp>): included by that header when header-only, compiled once by
/// <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/client/client.hpp"

namespace doorman {

DOORMAN_DECL asio::awaitable<void> client::run() {
  std::error_code ec;
  co_await driver_.async_run(asio::redirect_error(asio::use_awaitable, ec));
  std::vector<std::string> all;
  for (const auto& [id, e] : active_)
    all.push_back(id);
  for (auto& id : state_.take_releases())
    all.push_back(std::move(id));
  for (auto& id : std::exchange(releases_, {}))
    all.push_back(std::move(id));
  // A release cut short by the stop (its answer was not waited for) goes out again.
  for (auto& id : std::exchange(releasing_, {}))
    all.push_back(std::move(id));
  if (!all.empty()) {
    const auto reply = co_await channel_.call("release_capacity", release_params(std::move(all)),
                                              true, options_.release_timeout);
    if (!reply) log_release_failure(reply);
  }
  channel_.shutdown();
  finished_ = true;
  for (auto& f : std::exchange(when_finished_, {}))
    f();
}

DOORMAN_DECL asio::awaitable<void> client::requester::on_reply(net::call_reply reply,
                                                               clock::time_point now) const {
  c.on_reply(std::move(reply), now);
  co_return;
}
DOORMAN_DECL void client::start() {
  next_sample_ = clock::now() + to_duration<clock::duration>(options_.sample_interval.count());
  last_sample_ = clock::now();
  asio::co_spawn(strand_, run(), asio::detached);
}

}  // namespace doorman
