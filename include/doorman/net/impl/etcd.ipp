#pragma once

/// \file
/// The coroutines of net::etcd client, and what spawns them (declared in <doorman/net/etcd.hpp>):
/// included by that header when header-only, compiled once by <doorman/src.hpp> under
/// DOORMAN_SEPARATE_COMPILATION
/// (<doorman/core/linkage.hpp>).

#include "doorman/net/etcd.hpp"

namespace doorman::net {

DOORMAN_DECL asio::awaitable<etcd_result<nlohmann::json>> etcd_client::call(
    std::string method, nlohmann::json body, clock::time_point deadline) {
  etcd_result<nlohmann::json> r;
  const std::string text = body.dump();
  std::string errors;
  for (std::size_t tried = 0; tried < endpoints_.size() && clock::now() < deadline; ++tried) {
    const std::string endpoint = endpoints_[current_];
    // Leave the other endpoints a share of the time when this one hangs.
    const auto share = (deadline - clock::now()) / static_cast<int>(endpoints_.size() - tried);
    // A named copy: GCC 12 destroys a temporary passed by value into a coroutine twice when
    // it comes from a conditional expression.
    const ssl_context_ptr tls = tls_ ? tls_->current() : nullptr;
    auto answer = co_await http_post(executor_, endpoint, "/v3/" + method, text,
                                     clock::now() + share, std::size_t{1} << 20, tls);
    std::string why = std::move(answer.message);
    if (!answer.error) {
      auto a = etcd_decode::read(answer);
      if (a.value) {
        r.value = std::move(*a.value);
        co_return r;
      }
      why = std::move(a.why);
      if (a.final) {
        r.grpc_code = a.code;
        r.error = a.code == grpc_not_found ? etcd_errc::not_found : etcd_errc::refused;
        r.message = fmt::format("{} at {}: {}", method, endpoint, why);
        co_return r;
      }
    }
    errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", endpoint, why);
    current_ = (current_ + 1) % endpoints_.size();
  }
  if (errors.empty()) {
    r.error = errc::timed_out;
    r.message = method + ": deadline passed";
  } else {
    r.error = errc::unreachable;
    r.message = fmt::format("{}: {}", method, errors);
  }
  co_return r;
}

DOORMAN_DECL asio::awaitable<etcd_result<etcd_lease>> etcd_client::grant(
    std::int64_t ttl, clock::time_point deadline) {
  nlohmann::json body = {{"TTL", ttl}};
  auto a = co_await call("lease/grant", std::move(body), deadline);
  if (!a) co_return a.template failure<etcd_lease>();
  co_return etcd_decode::grant(a.value, ttl);
}

DOORMAN_DECL asio::awaitable<etcd_result<std::int64_t>> etcd_client::keep_alive(
    std::int64_t id, clock::time_point deadline) {
  // A stream method: the gateway wraps each answer in "result".
  nlohmann::json body = {{"ID", std::to_string(id)}};
  auto a = co_await call("lease/keepalive", std::move(body), deadline);
  if (!a) co_return a.template failure<std::int64_t>();
  co_return etcd_decode::keep_alive(a.value);
}

DOORMAN_DECL asio::awaitable<etcd_result<bool>> etcd_client::revoke(std::int64_t id,
                                                                    clock::time_point deadline) {
  etcd_result<bool> r;
  nlohmann::json body = {{"ID", std::to_string(id)}};
  auto a = co_await call("lease/revoke", std::move(body), deadline);
  if (!a) co_return a.template failure<bool>();
  r.value = true;
  co_return r;
}

namespace detail {

// A `kv/txn` body: put `key` = `value` (on `lease`, 0 for none) when the key's `target`
// revision ("CREATE" or "MOD") is `revision`; else read the key.
inline nlohmann::json txn_put(std::string_view key, std::string_view value, std::int64_t lease,
                              const char* target, std::int64_t revision) {
  const auto k = base64_encode(key);
  const std::string field = target == std::string_view("MOD") ? "mod_revision" : "create_revision";
  nlohmann::json put = {{"key", k}, {"value", base64_encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  return {{"compare", nlohmann::json::array({{{"key", k},
                                              {"target", target},
                                              {"result", "EQUAL"},
                                              {field, std::to_string(revision)}}})},
          {"success", nlohmann::json::array({{{"request_put", std::move(put)}}})},
          {"failure", nlohmann::json::array({{{"request_range", {{"key", k}}}}})}};
}

// `txn_put` creating `key` (compare `create_revision == 0`), and with it `record`, after
// counting the keys under the record's prefix (the range's end: the prefix, its last byte + 1).
inline nlohmann::json txn_put_with_record(std::string_view key, std::string_view value,
                                          std::int64_t lease, const etcd_record& record) {
  auto body = txn_put(key, value, lease, "CREATE", 0);
  std::string end = record.prefix;
  if (!end.empty()) end.back() = static_cast<char>(end.back() + 1);
  nlohmann::json count = {{"key", base64_encode(record.prefix)},
                          {"range_end", base64_encode(end)},
                          {"count_only", true}};
  nlohmann::json put = {{"key", base64_encode(record.key)},
                        {"value", base64_encode("")},
                        {"lease", std::to_string(record.lease)}};
  auto& success = body["success"];
  success.insert(success.begin(), nlohmann::json{{"request_range", std::move(count)}});
  success.push_back({{"request_put", std::move(put)}});
  return body;
}

}  // namespace detail

DOORMAN_DECL asio::awaitable<etcd_result<etcd_claim>> etcd_client::put_if_absent(
    std::string key, std::string value, std::int64_t lease, const etcd_record& record,
    clock::time_point deadline) {
  auto a =
      co_await call("kv/txn", detail::txn_put_with_record(key, value, lease, record), deadline);
  if (!a) co_return a.template failure<etcd_claim>();
  co_return etcd_decode::claim_with_record(a.value, std::move(value), lease);
}

DOORMAN_DECL asio::awaitable<etcd_result<etcd_claim>> etcd_client::put_if_absent(
    std::string key, std::string value, std::int64_t lease, clock::time_point deadline) {
  auto a = co_await call("kv/txn", detail::txn_put(key, value, lease, "CREATE", 0), deadline);
  if (!a) co_return a.template failure<etcd_claim>();
  co_return etcd_decode::claim(a.value, std::move(value), lease);
}

DOORMAN_DECL asio::awaitable<etcd_result<etcd_claim>> etcd_client::put_if_revision(
    std::string key, std::string value, std::int64_t revision, clock::time_point deadline) {
  auto a = co_await call("kv/txn", detail::txn_put(key, value, 0, "MOD", revision), deadline);
  if (!a) co_return a.template failure<etcd_claim>();
  co_return etcd_decode::claim(a.value, std::move(value), 0);
}

DOORMAN_DECL asio::awaitable<etcd_result<bool>> etcd_client::watch(
    std::string key, std::int64_t from, clock::time_point deadline,
    std::function<void(std::function<void()>)> on_open) {
  etcd_result<bool> r;
  const nlohmann::json body = {
      {"create_request", {{"key", base64_encode(key)}, {"start_revision", std::to_string(from)}}}};
  auto state = etcd_decode::watch_state::waiting;
  http_stream_hooks hooks;
  hooks.stop_when = [&state](std::string_view raw) {
    state = etcd_decode::watch_progress(raw);
    return state != etcd_decode::watch_state::waiting;
  };
  hooks.on_open = std::move(on_open);
  const std::string endpoint = endpoints_[current_];
  const ssl_context_ptr tls = tls_ ? tls_->current() : nullptr;
  auto answer = co_await http_post(executor_, endpoint, "/v3/watch", body.dump(), deadline,
                                   std::size_t{1} << 20, tls, std::move(hooks));
  if (state == etcd_decode::watch_state::changed) {
    r.value = true;
  } else if (answer.error == errc::timed_out) {
    r.value = false;  // no change before the deadline
  } else {
    r.error = answer.error ? answer.error : make_error_code(errc::bad_answer);
    r.message = fmt::format("watch at {}: {}", endpoint,
                            answer.error ? answer.message
                            : state == etcd_decode::watch_state::refused
                                ? "not a watch answer"
                                : "the stream ended without a change");
  }
  co_return r;
}

DOORMAN_DECL asio::awaitable<etcd_result<std::optional<etcd_kv>>> etcd_client::get(
    std::string key, clock::time_point deadline) {
  etcd_result<std::optional<etcd_kv>> r;
  nlohmann::json body = {{"key", base64_encode(key)}};
  auto a = co_await call("kv/range", std::move(body), deadline);
  if (!a) co_return a.template failure<std::optional<etcd_kv>>();
  r.value = etcd_decode::first_kv(a.value);
  co_return r;
}

DOORMAN_DECL asio::awaitable<etcd_result<bool>> etcd_client::put(std::string key, std::string value,
                                                                 clock::time_point deadline) {
  etcd_result<bool> r;
  nlohmann::json body = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  auto a = co_await call("kv/put", std::move(body), deadline);
  if (!a) co_return a.template failure<bool>();
  r.value = true;
  co_return r;
}

}  // namespace doorman::net
