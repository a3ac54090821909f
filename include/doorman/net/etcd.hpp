#pragma once

/// \file
/// A client of etcd's v3 JSON gateway (`POST /v3/...`, etcd 3.4) on `http_post`: leases,
/// put-if-absent, range, put. Several endpoints: a request that fails on one goes on to the
/// next until its deadline. Keys and values travel base64-encoded and 64-bit numbers as
/// strings, as the gateway wants; callers see plain strings and integers.
///
///     doorman::net::etcd_client etcd(executor, {"127.0.0.1:2379"});
///     auto lease = co_await etcd.grant(10, deadline);  // lease.value.id, lease.value.ttl
///     auto won = co_await etcd.put_if_absent("/doorman/master", "10.0.0.7:7700",
///                                            lease.value.id, deadline);

#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "doorman/core/linkage.hpp"
#include "doorman/net/http.hpp"
#include "doorman/protocol/json_rpc.hpp"

namespace doorman::net {

[[nodiscard]] inline std::string base64_encode(std::string_view in) {
  static constexpr char alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const auto v = static_cast<std::uint32_t>(static_cast<unsigned char>(in[i])) << 16 |
                   static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8 |
                   static_cast<unsigned char>(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6)
      out += alphabet[(v >> s) & 63];
  }
  if (const auto left = in.size() - i; left > 0) {
    std::uint32_t v = static_cast<std::uint32_t>(static_cast<unsigned char>(in[i])) << 16;
    if (left == 2) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8;
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    out += left == 2 ? alphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

/// Nothing when `in` is not base64.
[[nodiscard]] inline std::optional<std::string> base64_decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  while (!in.empty() && in.back() == '=')
    in.remove_suffix(1);
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : in) {
    const int v = value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  return out;
}

/// What etcd itself answered when it refused a request (errors of the "etcd" category). The
/// other failures are `doorman::errc`: `unreachable` (no endpoint answered), `timed_out` (the
/// deadline passed first), `bad_answer` (an answer not as the gateway documents it).
enum class etcd_errc {
  not_found = 1,  ///< gRPC NOT_FOUND: no such lease (it expired) or key
  refused,        ///< any other error etcd answered (`etcd_result::grpc_code` says which)
};

}  // namespace doorman::net

template <>
struct std::is_error_code_enum<doorman::net::etcd_errc> : std::true_type {};

namespace doorman::net {

namespace detail {

inline constexpr char etcd_name[] = "etcd";
inline constexpr const char* etcd_messages[] = {"not found", "refused by etcd"};
static_assert(std::size(etcd_messages) == static_cast<std::size_t>(etcd_errc::refused));

}  // namespace detail

[[nodiscard]] inline const std::error_category& etcd_category() noexcept {
  return doorman::detail::table_category<detail::etcd_name, detail::etcd_messages,
                                         std::size(detail::etcd_messages)>::get();
}

[[nodiscard]] inline std::error_code make_error_code(etcd_errc e) noexcept {
  return {static_cast<int>(e), etcd_category()};
}

/// The outcome of an etcd request: `value` when `error` is empty, else why not (`message`, in
/// words that name the method and endpoint).
template <class T>
struct etcd_result {
  T value{};
  std::error_code error;
  std::string message;
  int grpc_code = 0;  ///< the gRPC status code of an error answered by etcd
  explicit operator bool() const noexcept { return !error; }

  /// The same failure, for a result of another type.
  template <class U>
  [[nodiscard]] etcd_result<U> failure() const {
    etcd_result<U> r;
    r.error = error;
    r.message = message;
    r.grpc_code = grpc_code;
    return r;
  }
};

namespace detail {

template <class T>
[[nodiscard]] etcd_result<T> etcd_bad_answer(std::string message) {
  etcd_result<T> r;
  r.error = errc::bad_answer;
  r.message = std::move(message);
  return r;
}

}  // namespace detail

/// A key's value and bookkeeping, as `range` finds it.
struct etcd_kv {
  std::string value;
  std::int64_t mod_revision = 0;
  std::int64_t lease = 0;  ///< 0: the key is held by no lease
};

/// A granted lease.
struct etcd_lease {
  std::int64_t id = 0;
  std::int64_t ttl = 0;  ///< seconds
};

/// The outcome of `put_if_absent`: whether this put created the key, and who holds it now.
struct etcd_claim {
  bool created = false;
  etcd_kv holder;  ///< the key as it is after the request (ours when created)
  /// The store's revision the answer reflects (0 when not given): a watch from the next one
  /// sees every later change of the key.
  std::int64_t revision = 0;
  /// `put_if_absent` with a record, created: how many keys the record's prefix held before.
  std::optional<std::int64_t> records;
};

/// A record put beside a claimed key, in the same transaction (`put_if_absent`): `key`,
/// attached to `lease`, under `prefix`, whose keys are counted first.
struct etcd_record {
  std::string prefix;
  std::string key;
  std::int64_t lease = 0;
};

/// Reading etcd's answers, apart from the I/O so that each can be tested (and fuzzed) on its
/// own. Every function takes untrusted input and never throws on it.
/// gRPC's NOT_FOUND, as the gateway reports it in `code`.
inline constexpr int grpc_not_found = 5;

namespace etcd_decode {

/// What one gateway answer means: a JSON object (`value`), or why not (`why`), `final` when the
/// request itself was refused (HTTP 4xx: another endpoint would refuse it too), with etcd's
/// gRPC code when it gave one.
struct gateway_answer {
  std::optional<nlohmann::json> value;
  std::string why;
  bool final = false;
  int code = 0;
};

/// A 64-bit integer field: the gateway writes them as strings (small ones sometimes as
/// numbers). Nothing when absent, of another type, or not wholly an integer in range.
[[nodiscard]] inline std::optional<std::int64_t> integer(const nlohmann::json& j,
                                                         const char* field) {
  if (!j.is_object()) return std::nullopt;
  const auto it = j.find(field);
  if (it == j.end()) return std::nullopt;
  if (it->is_number()) return as_int64(*it);
  if (!it->is_string()) return std::nullopt;
  const auto& s = it->get_ref<const std::string&>();
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

/// Reads an HTTP answer of the gateway.
[[nodiscard]] inline gateway_answer read(const http_response& answer) {
  gateway_answer a;
  auto json = nlohmann::json::parse(answer.body, nullptr, false);
  if (json.is_discarded() || !json.is_object()) {
    a.why = fmt::format("HTTP {}, not a JSON object", answer.status);
    return a;
  }
  if (answer.status == 200 && !json.contains("error")) {
    a.value = std::move(json);
    return a;
  }
  // A gateway error: {"error": ..., "message": ..., "code": ...}.
  const auto m = json.find("message");
  a.why = fmt::format("HTTP {}: {}", answer.status,
                      m != json.end() && m->is_string() ? m->get<std::string>() : to_line(json));
  if (answer.status >= 400 && answer.status < 500) {
    a.final = true;  // not the endpoint's fault
    if (const auto c = integer(json, "code"); c && *c >= INT_MIN && *c <= INT_MAX) {
      a.code = static_cast<int>(*c);
    }
  }
  return a;
}

/// The first key of a range answer (`kvs[0]`), or nothing.
[[nodiscard]] inline std::optional<etcd_kv> first_kv(const nlohmann::json& range) {
  if (!range.is_object()) return std::nullopt;
  const auto kvs = range.find("kvs");
  if (kvs == range.end() || !kvs->is_array() || kvs->empty() || !(*kvs)[0].is_object()) {
    return std::nullopt;
  }
  const auto& kv = (*kvs)[0];
  etcd_kv out;
  if (const auto v = kv.find("value"); v != kv.end() && v->is_string()) {
    out.value = base64_decode(v->get<std::string>()).value_or(std::string{});
  }
  out.mod_revision = integer(kv, "mod_revision").value_or(0);
  out.lease = integer(kv, "lease").value_or(0);
  return out;
}

/// A `lease/grant` answer (`ttl`: what was asked, when the answer omits it).
[[nodiscard]] inline etcd_result<etcd_lease> grant(const nlohmann::json& a, std::int64_t ttl) {
  const auto id = integer(a, "ID");
  if (!id || *id == 0)
    return detail::etcd_bad_answer<etcd_lease>("lease/grant: answer without an ID");
  etcd_result<etcd_lease> r;
  r.value = {*id, integer(a, "TTL").value_or(ttl)};
  return r;
}

/// A `lease/keepalive` answer: the remaining TTL, 0 when the lease has expired.
[[nodiscard]] inline etcd_result<std::int64_t> keep_alive(const nlohmann::json& a) {
  // A stream method: the gateway wraps each answer in "result".
  const auto res = a.is_object() ? a.find("result") : a.end();
  if (!a.is_object() || res == a.end() || !res->is_object()) {
    return detail::etcd_bad_answer<std::int64_t>("lease/keepalive: answer without a result");
  }
  etcd_result<std::int64_t> r;
  r.value = integer(*res, "TTL").value_or(0);  // an omitted TTL is 0: the lease is gone
  return r;
}

/// The rest of `claim`: the holder from the failure branch's range.
[[nodiscard]] inline etcd_result<etcd_claim> claim_held(const nlohmann::json& a,
                                                        etcd_result<etcd_claim> r) {
  const auto responses = a.find("responses");
  if (responses == a.end() || !responses->is_array() || responses->empty() ||
      !(*responses)[0].is_object() || !(*responses)[0].contains("response_range")) {
    return detail::etcd_bad_answer<etcd_claim>(
        "kv/txn: answer without the range of the failure branch");
  }
  if (auto kv = first_kv((*responses)[0]["response_range"])) {
    r.value.holder = std::move(*kv);
  } else {  // cannot happen in a txn
    return detail::etcd_bad_answer<etcd_claim>(
        "kv/txn: the key vanished between compare and range");
  }
  return r;
}

/// A `kv/txn` answer of `put_if_absent(key, value, lease)` or `put_if_revision` (lease 0).
[[nodiscard]] inline etcd_result<etcd_claim> claim(const nlohmann::json& a, std::string value,
                                                   std::int64_t lease) {
  etcd_result<etcd_claim> r;
  if (!a.is_object()) return detail::etcd_bad_answer<etcd_claim>("kv/txn: answer is not an object");
  const auto succeeded = a.find("succeeded");  // omitted when false
  r.value.created = succeeded != a.end() && succeeded->is_boolean() && succeeded->get<bool>();
  const auto h = a.find("header");
  r.value.revision = h != a.end() ? integer(*h, "revision").value_or(0) : std::int64_t{0};
  if (r.value.created) {
    r.value.holder.value = std::move(value);
    r.value.holder.lease = lease;
    r.value.holder.mod_revision = r.value.revision;
    return r;
  }
  // The failure branch's range: responses[0].response_range.kvs[0].
  return claim_held(a, std::move(r));
}

/// A `kv/txn` answer of `put_if_absent` with a record: as `claim`, and when the key was
/// created, the count of the record's prefix before it (`responses[0].response_range.count`,
/// omitted when 0).
[[nodiscard]] inline etcd_result<etcd_claim> claim_with_record(const nlohmann::json& a,
                                                               std::string value,
                                                               std::int64_t lease) {
  auto r = claim(a, std::move(value), lease);
  if (!r || !r.value.created) return r;
  const auto responses = a.find("responses");
  if (responses == a.end() || !responses->is_array() || responses->empty() ||
      !(*responses)[0].is_object() || !(*responses)[0].contains("response_range")) {
    return detail::etcd_bad_answer<etcd_claim>(
        "kv/txn: answer without the count of the success branch");
  }
  const auto count = integer((*responses)[0]["response_range"], "count").value_or(0);
  if (count < 0) return detail::etcd_bad_answer<etcd_claim>("kv/txn: a negative count");
  r.value.records = count;
  return r;
}

/// How far the streamed answer of a `watch` has come.
enum class watch_state {
  waiting,  ///< nothing yet: read on
  changed,  ///< the key changed (or the watch was cancelled or compacted: look again)
  refused,  ///< not a watch answer: a status other than 200, an error, a line that is not JSON
};

/// Reads a `watch` answer as it streams in (`raw`: every byte so far, head included): the
/// gateway answers 200 with chunks holding one JSON message a line, `{"result": {"created":
/// true}}` first, then a message per change with `events`. A head over 16 KiB is refused.
[[nodiscard]] inline watch_state watch_progress(std::string_view raw) {
  const auto head_end = raw.find("\r\n\r\n");
  if (head_end == std::string_view::npos) {
    return raw.size() > 16384 ? watch_state::refused : watch_state::waiting;
  }
  if (!raw.starts_with("HTTP/1.") || raw.size() < 12 || raw.substr(8, 4) != " 200") {
    return watch_state::refused;
  }
  std::string head(raw.substr(0, head_end));
  std::transform(head.begin(), head.end(), head.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string_view rest = raw.substr(head_end + 4);
  std::string body;
  if (head.find("\r\ntransfer-encoding: chunked") == std::string::npos) {
    body = std::string(rest);
  } else {
    for (;;) {  // the complete chunks so far
      const auto eol = rest.find("\r\n");
      if (eol == std::string_view::npos) break;
      std::size_t size = 0;
      const auto [end, ec] = std::from_chars(rest.data(), rest.data() + eol, size, 16);
      if (ec != std::errc{} || end == rest.data() || size > (std::size_t{1} << 24)) {
        return watch_state::refused;
      }
      if (size == 0 || rest.size() < eol + 2 + size + 2) break;
      body.append(rest.substr(eol + 2, size));
      rest.remove_prefix(eol + 2 + size + 2);
    }
  }
  for (std::size_t start = 0, nl; (nl = body.find('\n', start)) != std::string::npos;
       start = nl + 1) {
    const auto line = std::string_view(body).substr(start, nl - start);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    const auto res = j.is_object() ? j.find("result") : j.end();
    if (j.is_discarded() || !j.is_object() || j.contains("error") || res == j.end() ||
        !res->is_object()) {
      return watch_state::refused;
    }
    const auto events = res->find("events");
    const auto canceled = res->find("canceled");
    if ((events != res->end() && events->is_array() && !events->empty()) ||
        (canceled != res->end() && canceled->is_boolean() && canceled->get<bool>()) ||
        integer(*res, "compact_revision").value_or(0) > 0) {
      return watch_state::changed;
    }
  }
  return watch_state::waiting;
}

}  // namespace etcd_decode

class etcd_client {
 public:
  using clock = std::chrono::steady_clock;

  /// `endpoints`: `host:port` of etcd members (`http://` and a trailing `/` allowed;
  /// `https://` for TLS, with the CA and client certificate of `tls`). Throws
  /// `std::invalid_argument` on a malformed one, or none, or unusable TLS files.
  etcd_client(asio::any_io_executor executor, std::vector<std::string> endpoints,
              const tls_options& tls = {})
      : executor_(std::move(executor)) {
    bool secure = false;
    for (const auto& e : endpoints) {
      auto bare = parse_endpoint(e);
      if (!bare) {
        throw std::invalid_argument(
            fmt::format("etcd endpoint: expected host:port, got \"{}\"", e));
      }
      secure = secure || std::string_view(e).starts_with("https://");
      endpoints_.push_back(std::move(*bare));
    }
    if (endpoints_.empty()) throw std::invalid_argument("etcd endpoints: none given");
    if (secure || tls.active()) {
      auto o = tls;
      o.enabled = true;
      tls_ = std::make_shared<tls_context>(tls_side::client, o, "etcd tls");
    }
  }

  /// `host:port` from an etcd client URL (`http://` or `https://` and a trailing `/` allowed),
  /// or nothing.
  [[nodiscard]] static std::optional<std::string> parse_endpoint(std::string_view e) {
    if (e.starts_with("http://")) e.remove_prefix(7);
    if (e.starts_with("https://")) e.remove_prefix(8);
    if (e.ends_with('/')) e.remove_suffix(1);
    if (!parse_address(e)) return std::nullopt;
    return std::string(e);
  }

  [[nodiscard]] const std::vector<std::string>& endpoints() const noexcept { return endpoints_; }

  /// Re-reads the TLS files for the next requests (thread-safe); throws as
  /// `tls_context::reload` does, keeping the old ones. Nothing without TLS.
  void reload_tls() {
    if (tls_) tls_->reload();
  }

  /// POSTs `body` to `/v3/<method>` on the endpoints in turn (starting with the last one that
  /// answered) until one answers 200 or the deadline passes. The answer's JSON, or why not.
  DOORMAN_DECL asio::awaitable<etcd_result<nlohmann::json>> call(std::string method,
                                                                 nlohmann::json body,
                                                                 clock::time_point deadline);

  /// A lease of `ttl` seconds (etcd may grant a longer one: its minimum is about 2 s).
  DOORMAN_DECL asio::awaitable<etcd_result<etcd_lease>> grant(std::int64_t ttl,
                                                              clock::time_point deadline);

  /// Renews lease `id`: its remaining TTL in seconds, 0 when it has expired.
  DOORMAN_DECL asio::awaitable<etcd_result<std::int64_t>> keep_alive(std::int64_t id,
                                                                     clock::time_point deadline);

  /// Revokes lease `id` (and so deletes its keys).
  DOORMAN_DECL asio::awaitable<etcd_result<bool>> revoke(std::int64_t id,
                                                         clock::time_point deadline);

  /// Creates `key` = `value` attached to `lease` unless the key exists (one transaction on
  /// `create_revision == 0`); either way, the key as it is afterwards.
  DOORMAN_DECL asio::awaitable<etcd_result<etcd_claim>> put_if_absent(std::string key,
                                                                      std::string value,
                                                                      std::int64_t lease,
                                                                      clock::time_point deadline);

  /// `put_if_absent`, and when it creates the key, `record` too in the same transaction, after
  /// counting the keys under its prefix (the answer's `records`).
  DOORMAN_DECL asio::awaitable<etcd_result<etcd_claim>> put_if_absent(std::string key,
                                                                      std::string value,
                                                                      std::int64_t lease,
                                                                      const etcd_record& record,
                                                                      clock::time_point deadline);

  /// Sets `key` = `value` (no lease) if the key's `mod_revision` is still `revision` (0: the key
  /// does not exist); either way, the key as it is afterwards (`created`: this put happened).
  DOORMAN_DECL asio::awaitable<etcd_result<etcd_claim>> put_if_revision(std::string key,
                                                                        std::string value,
                                                                        std::int64_t revision,
                                                                        clock::time_point deadline);

  /// Waits for a change of `key` at or after revision `from` (a watch, on the endpoint that
  /// answered last): true once there is one, false when `deadline` comes first, an error when
  /// the endpoint cannot be reached or does not answer as a watch. `on_open` gets a function
  /// that ends the wait at once (as a failure), for a caller that stops.
  DOORMAN_DECL asio::awaitable<etcd_result<bool>> watch(
      std::string key, std::int64_t from, clock::time_point deadline,
      std::function<void(std::function<void()>)> on_open = {});

  /// The key's value, or nothing when it does not exist.
  DOORMAN_DECL asio::awaitable<etcd_result<std::optional<etcd_kv>>> get(std::string key,
                                                                        clock::time_point deadline);

  /// Sets `key` = `value` (no lease).
  DOORMAN_DECL asio::awaitable<etcd_result<bool>> put(std::string key, std::string value,
                                                      clock::time_point deadline);

 private:
  asio::any_io_executor executor_;
  std::vector<std::string> endpoints_;
  std::shared_ptr<tls_context> tls_;  // all endpoints speak TLS when one is https://
  std::size_t current_ = 0;
};

}  // namespace doorman::net

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/net/impl/etcd.ipp"
#endif
