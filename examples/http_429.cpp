// doorman-http-429: a tiny HTTP service that keeps to its limits and says so in its headers.
//
// With a Doorman server, every request asks the resource's lease for a permit (try_acquire,
// never blocking). With a rule file (--rules, JSON or YAML in the style of Lyft's ratelimit),
// every request is also checked against the rules of --domain with three descriptors:
// [remote_address=<peer IP>], [path=<request path>], and, when the request has an X-Api-Key
// header, [api_key=<key>]. Admitted requests get 200; the others 429 Too Many Requests with a
// Retry-After header (whole seconds, rounded up). Every answer carries RateLimit-Limit,
// RateLimit-Remaining and RateLimit-Reset (seconds) for the limit with the fewest requests
// left. A request over an elastic rule is held (up to the rule's max_delay, and at most
// --max-queued at once) and checked again when it would fit, instead of being refused.
//
//   doorman-http-429 --server 127.0.0.1:7700 --listen 127.0.0.1:8080 --resource api
//   doorman-http-429 --rules examples/rules.yaml --domain api --listen 127.0.0.1:8080
//   curl -i http://127.0.0.1:8080/
//
// With --rules and no --server, no Doorman client is made. SIGHUP reads the rule file again
// (a file that does not parse keeps the previous rules). One request per connection
// (Connection: close); request heads are read up to 8 KiB and parsed as the admin endpoint
// parses them (targets up to 2 KiB: 414 beyond; 64 header lines: 431 beyond). It listens
// through the library's net::listener, as the node's ports do.

#include <doorman/client.hpp>
#include <doorman/limit/rules.hpp>
#include <doorman/net/http_request.hpp>
#include <doorman/net/listener.hpp>

#include <fmt/format.h>
#include <asio.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "client_flags.hpp"
#include "flags.hpp"
#include "yaml_config.hpp"

namespace {

using namespace std::chrono_literals;

struct service {
  doorman::rate_resource* api = nullptr;  // the Doorman resource, if any
  std::optional<doorman::rule_set> rules;
  std::string domain;
  int max_queued = 1000;
  int queued = 0;  // requests held by an elastic rule (on the io thread)
};

// The verdict for one request: the rules', then the Doorman resource's.
doorman::rule_verdict decide(service& s, const doorman::net::http_request& h,
                             const std::string& peer) {
  doorman::rule_verdict v;
  if (s.rules) {
    std::vector<doorman::descriptor> d{{{"remote_address", peer}}, {{"path", h.path}}};
    if (auto key = h.header("x-api-key"); key && !key->empty()) d.push_back({{"api_key", *key}});
    v = s.rules->check(s.domain, d);
  }
  if (s.api && v.code != doorman::rule_code::refused && v.code != doorman::rule_code::delay) {
    const auto r = s.api->try_acquire();
    doorman::combine(v, r, s.api->limiter().status());
  }
  return v;
}

std::string answer(const doorman::rule_verdict& v) {
  const bool refused = v.code == doorman::rule_code::refused || v.code == doorman::rule_code::delay;
  std::string head = refused ? "HTTP/1.1 429 Too Many Requests\r\n" : "HTTP/1.1 200 OK\r\n";
  for (const auto& h : doorman::rate_limit_headers(v))
    head += h + "\r\n";
  const std::string_view body = refused ? "too many requests\n" : "ok\n";
  return fmt::format(
      "{}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}", head,
      body.size(), body);
}

std::string refusal(int status, std::string_view reason) {
  return fmt::format("HTTP/1.1 {} {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", status,
                     reason);
}

asio::awaitable<void> serve(asio::ip::tcp::socket socket, service& s) {
  std::string request;
  std::error_code ec;
  // Read the request head (a client that sends nothing is dropped after 5 s).
  asio::steady_timer deadline(socket.get_executor(), std::chrono::seconds(5));
  deadline.async_wait([&](std::error_code e) {
    if (!e) socket.close();
  });
  co_await asio::async_read_until(socket, asio::dynamic_buffer(request, 8192), "\r\n\r\n",
                                  asio::redirect_error(asio::use_awaitable, ec));
  deadline.cancel();
  if (ec) co_return;
  const auto head = doorman::net::parse_http_request(request);
  const auto peer = socket.remote_endpoint(ec);
  const std::string ip = ec ? "" : peer.address().to_string();
  std::string response;
  if (head.status != 0) {
    response = refusal(head.status, head.reason);
  } else if (head.method != "GET" && head.method != "POST") {
    response = refusal(405, "Method Not Allowed");
  } else {
    auto v = decide(s, head, ip);
    // An elastic rule: hold the request until it fits (each wait within the rule's max_delay),
    // at most 8 times, and at most max_queued requests at once.
    for (int round = 0; v.code == doorman::rule_code::delay && round < 8; ++round) {
      if (s.queued >= s.max_queued) break;
      ++s.queued;
      asio::steady_timer wait(socket.get_executor(), v.retry_after);
      co_await wait.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      --s.queued;
      v = decide(s, head, ip);
    }
    response = answer(v);
  }
  co_await asio::async_write(socket, asio::buffer(response),
                             asio::redirect_error(asio::use_awaitable, ec));
  socket.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
}

std::string read_file(const std::string& path) {
  auto text = doorman_examples::file_text(path);
  if (!text) throw std::invalid_argument("--rules: cannot read " + path);
  return std::move(*text);
}

// The rules of `path` (domain `s.domain`, else the file's first) into `s`; throws, naming the
// file, when it does not parse or lacks the domain (then `s` keeps what it had).
void load_rules(service& s, const std::string& path) {
  auto fresh = doorman_examples::parse_rules_any(read_file(path), path);
  const auto domains = fresh.domains();
  if (s.domain.empty() && !domains.empty()) s.domain = domains.front();
  if (std::find(domains.begin(), domains.end(), s.domain) == domains.end())
    throw std::invalid_argument("--domain: " + path + " has no domain " + s.domain);
  s.rules.emplace(std::move(fresh));
}

// SIGHUP reads the rule file again: the new rules apply from the next request (their counts
// start afresh); a file that does not load keeps the previous rules.
void reload_on_hup(asio::signal_set& hup, service& s, const std::string& path) {
  hup.async_wait([&hup, &s, &path](std::error_code e, int) {
    if (e) return;
    try {
      load_rules(s, path);
      fmt::print(stderr, "doorman-http-429: reloaded {}\n", path);
    } catch (const std::exception& ex) {
      fmt::print(stderr, "doorman-http-429: kept the previous rules: {}\n", ex.what());
    }
    reload_on_hup(hup, s, path);
  });
}

// Serves on `at` until SIGTERM or SIGINT.
int serve_http(service& s, const doorman::net::address& at, const std::string& rules_path) {
  asio::io_context io;
  // The library's listener: close-on-exec sockets, and an accept loop that pauses instead of
  // spinning when accept fails (out of file descriptors, say).
  doorman::net::listener listener(io.get_executor(), "accept", [](std::string_view line) {
    fmt::print(stderr, "doorman-http-429: {}\n", line);
  });
  listener.listen(at);
  // Caught before the "listening" line, so a SIGTERM sent on it stops gracefully.
  asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](std::error_code, int) {
    listener.stop();
    io.stop();
  });
  fmt::print(stderr, "doorman-http-429 listening on {}:{}\n",
             listener.local_endpoint().address().to_string(), listener.local_endpoint().port());
  asio::signal_set hup(io);
  if (!rules_path.empty()) {
    hup.add(SIGHUP);
    reload_on_hup(hup, s, rules_path);
  }
  listener.start([&](asio::ip::tcp::socket socket) {
    asio::co_spawn(io, serve(std::move(socket), s), asio::detached);
  });
  io.run();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:8080";
  std::string rules_path;
  std::string algorithm = "gcra";
  service s;
  doorman_examples::client_flags flags{.resource = "api"};
  return doorman_examples::run_program(
      argc, argv, "doorman-http-429",
      "usage: doorman-http-429 [--server HOST:PORT[,...]] [--listen HOST:PORT]"
      " [--resource ID] [--algorithm NAME] [--rules FILE] [--domain NAME] [--max-queued N]\n",
      flags.with(
          {{"--listen", [&](auto& a) { listen = a.value(); }},
           {"--rules", [&](auto& a) { rules_path = a.value(); }},
           {"--domain", [&](auto& a) { s.domain = a.value(); }},
           {"--algorithm", [&](auto& a) { algorithm = a.value(); }},
           {"--max-queued", [&](auto& a) { s.max_queued = static_cast<int>(a.number(0, 1e6)); }}}),
      [&] {
        const auto at = doorman::net::parse_address(listen);
        if (!at) throw std::invalid_argument("--listen: expected host:port, got " + listen);
        const auto kind = doorman::rate_algorithm_from(algorithm);
        if (!kind) {
          throw std::invalid_argument(
              "--algorithm: expected gcra, fixed_window, sliding_log, sliding_window or "
              "leaky_bucket, got " +
              algorithm);
        }
        if (!rules_path.empty()) load_rules(s, rules_path);
        std::optional<doorman::client> client;
        std::optional<doorman::rate_resource> api;
        if (rules_path.empty() || flags.server_given) {
          client.emplace(flags.client_options());
          api.emplace(*client, flags.resource, doorman::resource_options{.algorithm = *kind});
          s.api = &*api;
        }
        return serve_http(s, *at, rules_path);
      });
}
