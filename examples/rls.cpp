// doorman-rls: Envoy's global rate limit service (envoy.service.ratelimit.v3.RateLimitService)
// from envoyproxy/ratelimit's configuration files, read as they are (docs/envoy.md).
//
//   doorman-rls --listen 127.0.0.1:8081 --config /etc/ratelimit/config
//
// --config is a directory: every .yaml/.yml file in it is one domain, in envoyproxy/ratelimit's
// format (domain, nested descriptors with key/value, rate_limit with unit, requests_per_unit,
// unlimited, name and replaces, shadow_mode, detailed_metric, wildcard values). The files are
// read again when they change (checked every --reload-interval seconds) and on SIGHUP; a set
// that does not load is refused with the file, line and field, and the previous one stays.
// Counting is a fixed window per rule's unit (as envoyproxy/ratelimit counts), per replica.
// SIGTERM and SIGINT stop it after the calls in flight are answered.
//
// With --server (a doorman tree's root, or the tasks of its position), the replicas behind one
// Envoy cluster share each limit exactly: the root counts every request key's window (its
// configuration comes from --print-root-config), and each replica draws blocks of hits from that
// count and admits from them, so a window never admits more than its limit across the replicas,
// from a key's first request on. A block holds at most --block-fraction of a window's limit (0:
// every request is counted at the root). --max-keys bounds the keys held; --exact-timeout bounds
// a call to the root (no answer and no block left: UNAVAILABLE; Envoy's failure_mode_deny
// decides).

#include <doorman/net/address.hpp>
#include <doorman/net/http_server.hpp>
#include <doorman/node/source_follower.hpp>

#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>
#include <asio.hpp>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "arguments.hpp"
#include "client_flags.hpp"
#include "flags.hpp"
#include "rls_door.hpp"
#include "rls_mapping.hpp"
#include "rls_service.hpp"
#include "yaml_config.hpp"

namespace {

struct options {
  std::string listen = "127.0.0.1:8081";
  std::string config_dir;
  double reload_interval = 1;
  doorman::rls::header_names headers;
  doorman::net::tls_options tls;
  doorman_examples::client_flags client;  // --server: counted by a doorman tree's root
  std::size_t max_keys = 100'000;         // keys held, with --server
  double exact_timeout = 1;               // seconds a call to the root may take
  double block_fraction = 0.05;           // of a window's limit, the most a block holds
  bool print_root_config = false;
  std::string metrics_listen;  // empty: no metrics endpoint
};

// The rule files of `dir`, read as envoyproxy/ratelimit's YAML (errors name the file and line).
std::shared_ptr<doorman::rule_set> load(const std::string& dir) {
  return doorman::rls::load_rules_directory(
      dir, [](std::string_view text, const std::string& path, const auto& check) {
        return doorman_examples::parse_yaml_with(text, path, check);
      });
}

void log(std::string_view line) {
  doorman_examples::log_line(line);
}

// --metrics-listen: GET /metrics, the rules' counts, on `io`.
void serve_metrics(asio::io_context& io, const options& o, doorman::rls::rules_service& service,
                   std::optional<doorman::net::http_server>& metrics) {
  if (o.metrics_listen.empty()) return;
  metrics.emplace(io.get_executor(), doorman::net::http_server_options{},
                  [&service](const doorman::net::http_request& r) {
                    if (r.path != "/metrics") return doorman::net::http_answer{404, {}, "no\n"};
                    return doorman::net::http_answer{
                        200, "text/plain; version=0.0.4; charset=utf-8", service.metrics()};
                  });
  const auto at = *doorman::net::parse_address(o.metrics_listen);
  std::error_code ec;
  metrics->listen(at, ec);
  if (ec) throw std::system_error(ec, "--metrics-listen " + o.metrics_listen);
  metrics->start();
  log(fmt::format("metrics on http://{}:{}/metrics", at.host, metrics->local_endpoint().port()));
}

// Serves until SIGTERM or SIGINT; reloads on SIGHUP and when the directory changes. The
// signals reach this thread only (gRPC's threads start with them blocked).
int serve(const options& o) {
  sigset_t signals;
  sigemptyset(&signals);
  for (const int s : {SIGHUP, SIGTERM, SIGINT})
    sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::optional<doorman::rls::root_options> root;
  if (o.client.server_given) {
    root = doorman::rls::root_options{o.client.client_options(),
                                      doorman::seconds(o.exact_timeout),
                                      {.block_fraction = o.block_fraction, .max_keys = o.max_keys}};
  }
  // The stamps first, then the rules: a file changed between the two is read at the next look.
  auto watch = doorman::file_watch::directory(o.config_dir, {".yaml", ".yml"});
  doorman::rls::rules_service service(load(o.config_dir), std::move(root));
  asio::io_context io;
  std::optional<doorman::net::http_server> metrics;
  serve_metrics(io, o, service, metrics);
  doorman::rls::server door({o.listen, o.tls}, service, o.headers);
  door.start();
  log(fmt::format("envoy.service.ratelimit.v3.RateLimitService listening on {}:{}",
                  doorman::net::parse_address(o.listen)->host, door.port()));
  doorman::file_follower rules(
      io.get_executor(), o.config_dir, std::move(watch), doorman::seconds(o.reload_interval),
      [&](const std::vector<std::string>& changed) {
        try {
          service.replace(load(o.config_dir));
          log(fmt::format("configuration reloaded ({})",
                          changed.empty() ? "SIGHUP" : "files changed"));
        } catch (const std::exception& e) {
          log(fmt::format("error: configuration rejected, keeping the previous one: {}", e.what()));
        }
      },
      log);
  asio::signal_set hup(io, SIGHUP), stop(io, SIGTERM, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
  std::function<void(std::error_code, int)> on_hup = [&](std::error_code ec, int) {
    if (ec) return;
    rules.reread();
    hup.async_wait(on_hup);
  };
  hup.async_wait(on_hup);
  stop.async_wait([&](std::error_code, int) {
    hup.cancel();
    rules.stop();
    if (metrics) metrics->stop();
  });
  rules.start();
  io.run();
  log("stopping");
  door.stop();
  service.stop();
  log("stopped");
  return 0;
}

std::vector<doorman_examples::flag_action> flags(options& o) {
  using doorman_examples::arguments;
  return o.client.with({
      {"--listen", [&](arguments& a) { o.listen = a.value(); }},
      {"--config", [&](arguments& a) { o.config_dir = a.value(); }},
      {"--reload-interval", [&](arguments& a) { o.reload_interval = a.number(0.01, 3600); }},
      {"--response-headers", [&](arguments&) { o.headers.enabled = true; }},
      {"--header-limit", [&](arguments& a) { o.headers.limit = a.value(); }},
      {"--header-remaining", [&](arguments& a) { o.headers.remaining = a.value(); }},
      {"--header-reset", [&](arguments& a) { o.headers.reset = a.value(); }},
      {"--tls-cert", [&](arguments& a) { o.tls.cert_file = a.value(); }},
      {"--tls-key", [&](arguments& a) { o.tls.key_file = a.value(); }},
      {"--tls-ca", [&](arguments& a) { o.tls.ca_file = a.value(); }},
      {"--max-keys",
       [&](arguments& a) { o.max_keys = static_cast<std::size_t>(a.number(1, 1e7)); }},
      {"--print-root-config", [&](arguments&) { o.print_root_config = true; }},
      {"--metrics-listen", [&](arguments& a) { o.metrics_listen = a.value(); }},
      {"--exact-timeout", [&](arguments& a) { o.exact_timeout = a.number(0.001, 60); }},
      {"--block-fraction", [&](arguments& a) { o.block_fraction = a.number(0, 0.5); }},
  });
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  return doorman_examples::run_program(
      argc, argv, "doorman-rls",
      "usage: doorman-rls --config DIR [--listen HOST:PORT] [--reload-interval S]\n"
      "                   [--response-headers] [--header-limit NAME] [--header-remaining NAME]\n"
      "                   [--header-reset NAME] [--tls-cert FILE --tls-key FILE] [--tls-ca FILE]\n"
      "                   [--server HOST:PORT[,...]] [--max-keys N] [--exact-timeout S]\n"
      "                   [--block-fraction F] [--print-root-config]\n"
      "                   [--metrics-listen HOST:PORT] [--version]\n",
      flags(o), [&] {
        if (o.config_dir.empty()) throw std::invalid_argument("--config DIR is required");
        try {  // a directory that cannot be listed: said naming the flag
          (void)doorman::rls::rule_files(o.config_dir);
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(std::string("--config ") + e.what());
        }
        if (o.print_root_config) {
          std::puts(doorman::rls::root_config(*load(o.config_dir)).dump(2).c_str());
          return 0;
        }
        if (!doorman::net::parse_address(o.listen))
          throw std::invalid_argument("--listen: expected host:port, got \"" + o.listen + "\"");
        if (!o.metrics_listen.empty() && !doorman::net::parse_address(o.metrics_listen)) {
          throw std::invalid_argument("--metrics-listen: expected host:port, got \"" +
                                      o.metrics_listen + "\"");
        }
        return serve(o);
      });
}
