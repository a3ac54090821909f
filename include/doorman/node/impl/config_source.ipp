#pragma once

/// \file
/// Reading a configuration from etcd (declared in <doorman/node/config_source.hpp>): included by
/// that header when header-only, compiled once by <doorman/src.hpp> under
/// DOORMAN_SEPARATE_COMPILATION (<doorman/core/linkage.hpp>).

#include "doorman/node/config_source.hpp"

namespace doorman {

DOORMAN_DECL loaded_config read_config_etcd(const config_options& o, const std::string& key) {
  if (o.etcd_endpoints.empty()) throw std::invalid_argument("config etcd:KEY needs etcd endpoints");
  asio::io_context io;
  net::etcd_client etcd(io.get_executor(), o.etcd_endpoints, o.etcd_tls);
  std::optional<net::etcd_result<std::optional<net::etcd_kv>>> got;
  std::exception_ptr failed;
  const auto deadline = std::chrono::steady_clock::now() +
                        to_duration<std::chrono::steady_clock::duration>(o.etcd_timeout.count());
  asio::co_spawn(io, etcd.get(key, deadline), [&](std::exception_ptr e, auto r) {
    failed = e;
    got = std::move(r);
  });
  io.run();
  if (failed) std::rethrow_exception(failed);
  if (!*got) {
    throw std::runtime_error(
        fmt::format("cannot read configuration etcd:{}: {}", key, got->message));
  }
  if (!got->value) throw std::runtime_error(fmt::format("configuration etcd:{}: no such key", key));
  try {
    return {parse_config_text(o, got->value->value, "etcd:" + key), got->value->mod_revision};
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("configuration etcd:{}: {}", key, e.what()));
  }
}
}  // namespace doorman
