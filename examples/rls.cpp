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

#include <doorman/limit/rules.hpp>
#include <doorman/net/address.hpp>

#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "arguments.hpp"
#include "flags.hpp"
#include "rls_door.hpp"
#include "rls_mapping.hpp"
#include "yaml_config.hpp"

namespace {

struct options {
  std::string listen = "127.0.0.1:8081";
  std::string config_dir;
  double reload_interval = 1;
  doorman::rls::header_names headers;
  doorman::net::tls_options tls;
};

// What the directory held when it was read: each file's name, size and change time.
using directory_state = std::vector<std::tuple<std::string, std::uintmax_t, std::int64_t>>;

std::vector<std::filesystem::path> config_files(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const auto ext = e.path().extension();
    if (e.is_regular_file() && (ext == ".yaml" || ext == ".yml")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

directory_state state_of(const std::string& dir) {
  directory_state s;
  std::error_code ec;
  for (const auto& f : config_files(dir)) {
    const auto t = std::filesystem::last_write_time(f, ec).time_since_epoch().count();
    s.emplace_back(f.string(), std::filesystem::file_size(f, ec), static_cast<std::int64_t>(t));
  }
  return s;
}

std::string read_text(const std::filesystem::path& p) {
  auto text = doorman_examples::file_text(p.string());
  if (!text) throw std::invalid_argument("cannot read " + p.string());
  return std::move(*text);
}

// Every file of the directory, each checked alone (its errors name it, with the line), then
// compiled together (a domain defined twice names both files). Counting: a fixed window, as
// envoyproxy/ratelimit counts, unless a file chooses another algorithm.
std::shared_ptr<doorman::rule_set> load(const std::string& dir) {
  const auto files = config_files(dir);
  if (files.empty()) throw std::invalid_argument(dir + ": no .yaml or .yml files");
  nlohmann::json all = nlohmann::json::array();
  std::vector<std::string> names;
  for (const auto& f : files) {
    auto doc =
        doorman_examples::parse_yaml_with(read_text(f), f.string(), [](const nlohmann::json& d) {
          nlohmann::json x = d;
          if (x.is_object() && !x.contains("algorithm")) x["algorithm"] = "fixed_window";
          (void)doorman::rule_set::parse(x);  // checked alone: errors name this file's line
          return x;
        });
    if (doc.is_object() && doc.contains("domain")) {
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (all[i]["domain"] == doc["domain"]) {
          throw std::invalid_argument(fmt::format("{}: domain {} is already defined in {}",
                                                  f.string(), doc["domain"].dump(), names[i]));
        }
      }
    }
    all.push_back(std::move(doc));
    names.push_back(f.string());
  }
  return std::make_shared<doorman::rule_set>(doorman::rule_set::parse(all));
}

// The rules behind the door: swapped whole on reload (counts start afresh).
class rules_handler final : public doorman::rls::handler {
 public:
  explicit rules_handler(std::shared_ptr<doorman::rule_set> rules) : rules_(std::move(rules)) {}

  std::vector<doorman::descriptor_status> check(const doorman::rls::check_request& r) override {
    const std::lock_guard lock(mutex_);
    return rules_->check_each(r.domain, r.descriptors);
  }

  void replace(std::shared_ptr<doorman::rule_set> rules) {
    const std::lock_guard lock(mutex_);
    rules_ = std::move(rules);
  }

 private:
  std::mutex mutex_;
  std::shared_ptr<doorman::rule_set> rules_;
};

// Serves until SIGTERM or SIGINT; reloads on SIGHUP and when the directory changes.
int serve(const options& o) {
  sigset_t signals;
  sigemptyset(&signals);
  for (const int s : {SIGHUP, SIGTERM, SIGINT})
    sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before gRPC's threads start: they inherit it

  rules_handler handler(load(o.config_dir));
  auto seen = state_of(o.config_dir);
  doorman::rls::server server({o.listen, o.tls}, handler, o.headers);
  server.start();
  doorman_examples::log_line(
      fmt::format("envoy.service.ratelimit.v3.RateLimitService listening on {}:{}",
                  doorman::net::parse_address(o.listen)->host, server.port()));
  const auto reload = [&](const char* why) {
    try {
      handler.replace(load(o.config_dir));
      doorman_examples::log_line(fmt::format("configuration reloaded ({})", why));
    } catch (const std::exception& e) {
      doorman_examples::log_line(
          fmt::format("error: configuration rejected, keeping the previous one: {}", e.what()));
    }
  };
  for (;;) {
    const double whole = std::floor(o.reload_interval);
    const timespec wait{static_cast<std::time_t>(whole),
                        static_cast<long>((o.reload_interval - whole) * 1e9)};
    const int s = sigtimedwait(&signals, nullptr, &wait);
    if (s == SIGTERM || s == SIGINT) break;
    if (s == SIGHUP) {
      seen = state_of(o.config_dir);
      reload("SIGHUP");
    } else if (auto now = state_of(o.config_dir); now != seen) {
      seen = std::move(now);
      reload("files changed");
    }
  }
  doorman_examples::log_line("stopping");
  server.stop();
  doorman_examples::log_line("stopped");
  return 0;
}

std::vector<doorman_examples::flag_action> flags(options& o) {
  using doorman_examples::arguments;
  return {
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
  };
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  return doorman_examples::run_program(
      argc, argv, "doorman-rls",
      "usage: doorman-rls --config DIR [--listen HOST:PORT] [--reload-interval S]\n"
      "                   [--response-headers] [--header-limit NAME] [--header-remaining NAME]\n"
      "                   [--header-reset NAME] [--tls-cert FILE --tls-key FILE] [--tls-ca FILE]\n",
      flags(o), [&] {
        if (o.config_dir.empty()) throw std::invalid_argument("--config DIR is required");
        if (!doorman::net::parse_address(o.listen))
          throw std::invalid_argument("--listen: expected host:port, got \"" + o.listen + "\"");
        return serve(o);
      });
}
