#pragma once

/// \file
/// The definitions of doorman::client (declared in <doorman/client/client.hpp>), over its
/// core (client/impl/client_core.hpp): included by that header when header-only, compiled
/// once by <doorman/src.hpp> under DOORMAN_SEPARATE_COMPILATION (<doorman/core/linkage.hpp>).

#include "doorman/client/client.hpp"
#include "doorman/client/impl/client_core.hpp"

namespace doorman {

DOORMAN_DECL void detail::resource_entry::wake() {
  for (auto* w : waits)
    if (w->blocked) w->timer.cancel();
}

DOORMAN_DECL void detail::resource_entry::stop() {
  stop_source.request_stop();
  for (auto* w : waits)
    w->cancel();
}

DOORMAN_DECL client::client(client_options options)
    : core_(std::make_unique<detail::client_core>(std::move(options))) {}

DOORMAN_DECL client::client(asio::any_io_executor executor, client_options options)
    : core_(std::make_unique<detail::client_core>(std::move(executor), std::move(options))) {}

DOORMAN_DECL client::~client() = default;

DOORMAN_DECL const client_options& client::options() const noexcept {
  return core_->options();
}

DOORMAN_DECL void client::stop() {
  core_->stop();
}

DOORMAN_DECL bool client::connected() const noexcept {
  return core_->connected();
}

DOORMAN_DECL asio::any_io_executor client::executor() const {
  return core_->executor();
}

DOORMAN_DECL std::shared_ptr<detail::resource_entry> client::attach(
    std::string_view id, detail::resource_kind kind, client_resource_options opts, bool estimate,
    const rate_algorithm_options& local) {
  return core_->attach(id, kind, opts, estimate, local);
}

DOORMAN_DECL void client::detach(const std::shared_ptr<detail::resource_entry>& e) {
  core_->detach(e);
}

DOORMAN_DECL void client::set_wants(const std::shared_ptr<detail::resource_entry>& e,
                                    double wants) {
  core_->set_wants(e, wants);
}

DOORMAN_DECL void client::on_change(const std::shared_ptr<detail::resource_entry>& e,
                                    std::function<void(double)> f) {
  core_->on_change(e, std::move(f));
}

DOORMAN_DECL void client::when_stopped(std::function<void()> f) {
  core_->when_stopped(std::move(f));
}

}  // namespace doorman
