#pragma once

/// \file
/// Where a node's configuration comes from (docs/node.md): a file (`file:PATH`, or just
/// `PATH`), re-read on `reload_config()` (the `doorman-node` binary calls it on SIGHUP), or an
/// etcd key (`etcd:KEY`), polled and applied at each new valid revision. An invalid new
/// configuration is refused and the old one kept.
///
///     doorman::node_options o;
///     o.config = {.source = "etcd:/doorman/config", .etcd_endpoints = {"127.0.0.1:2379"}};
///     doorman::node root(io.get_executor(), o);  // reads the key before it returns
///
/// The text is JSON unless `config_options::parse` says otherwise (the binaries add Doorman's
/// YAML there, so that the header-only library does not depend on a YAML parser).

#include <chrono>
#include <cstdint>
#include <exception>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>

#include "doorman/core/config.hpp"
#include "doorman/core/linkage.hpp"
#include "doorman/core/time.hpp"
#include "doorman/net/etcd.hpp"

namespace doorman {

/// Where the configuration comes from, and how it is read.
struct config_options {
  /// `file:PATH`, `PATH`, or `etcd:KEY`; empty: the configuration is given in code only.
  std::string source;
  /// etcd members (`host:port`), for an `etcd:KEY` source.
  std::vector<std::string> etcd_endpoints;
  /// How often an `etcd:KEY` source is read.
  seconds poll_interval{1};
  /// Deadline of one read of an `etcd:KEY` source.
  seconds etcd_timeout{5};
  /// Turns the text read into a configuration; `name` is the file path or `etcd:KEY`. Throws
  /// `config_error` (or another `std::exception`) naming what is wrong. Null: JSON.
  std::function<resource_repository(std::string_view text, const std::string& name)> parse{};
  /// CA and client certificate for `https://` etcd endpoints (docs/security.md).
  net::tls_options etcd_tls{};
};

/// A parsed `config_options::source`.
struct config_location {
  enum class kind { none, file, etcd };
  kind type = kind::none;
  std::string where;  ///< the path, or the key

  /// Throws `std::invalid_argument` on an unknown scheme (`foo:bar`) or `etcd:` without a key.
  [[nodiscard]] static config_location parse(std::string_view source) {
    if (source.empty()) return {};
    if (source.starts_with("file:")) return {kind::file, std::string(source.substr(5))};
    if (source.starts_with("etcd:")) {
      if (source.size() == 5) throw std::invalid_argument("config: etcd: needs a key");
      return {kind::etcd, std::string(source.substr(5))};
    }
    const auto colon = source.find(':');
    if (colon != std::string_view::npos && !source.starts_with("/") && !source.starts_with(".") &&
        source.substr(0, colon).find('/') == std::string_view::npos) {
      throw std::invalid_argument(
          fmt::format("config: unknown source \"{}:\" (expected file:PATH or etcd:KEY)",
                      source.substr(0, colon)));
    }
    return {kind::file, std::string(source)};
  }

  /// As an operator writes it: the path, or `etcd:KEY`.
  [[nodiscard]] std::string name() const { return type == kind::etcd ? "etcd:" + where : where; }
};

/// `text` parsed with `o.parse`, or as JSON.
[[nodiscard]] inline resource_repository parse_config_text(const config_options& o,
                                                           std::string_view text,
                                                           const std::string& name) {
  if (o.parse) return o.parse(text, name);
  return resource_repository::parse(text);
}

/// A file's whole text; throws `std::runtime_error` naming it when it cannot be read.
[[nodiscard]] inline std::string read_config_file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// Reads and parses a configuration file; throws `std::runtime_error` when it cannot be read,
/// `config_error` when it is invalid.
[[nodiscard]] inline resource_repository read_config_file(const config_options& o,
                                                          const std::string& path) {
  std::string text;
  try {
    text = read_config_file_text(path);
  } catch (const std::runtime_error&) {
    throw std::runtime_error(fmt::format("cannot read configuration {}", path));
  }
  return parse_config_text(o, text, path);
}

/// A configuration read from its source, with the etcd revision it had (0 for a file).
struct loaded_config {
  resource_repository config;
  std::int64_t revision = 0;
};

/// Reads the etcd key once, before a node starts (runs its own io_context for it).
[[nodiscard]] DOORMAN_DECL loaded_config read_config_etcd(const config_options& o,
                                                          const std::string& key);

/// Reads the configuration from `o.source`; throws when there is none, or it cannot be read,
/// or it is invalid.
[[nodiscard]] inline loaded_config load_config(const config_options& o) {
  const auto at = config_location::parse(o.source);
  switch (at.type) {
    case config_location::kind::file:
      return {read_config_file(o, at.where), 0};
    case config_location::kind::etcd:
      return read_config_etcd(o, at.where);
    case config_location::kind::none:
      break;
  }
  throw std::invalid_argument("config: no source given");
}

}  // namespace doorman

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/node/impl/config_source.ipp"
#endif
