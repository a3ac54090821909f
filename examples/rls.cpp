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
// Envoy cluster share each limit: every request key is a doorman resource leased from the tree
// (--print-root-config prints the root's configuration for the rules), and this replica enforces
// its share with a fixed window of the rule's unit. --max-keys bounds the keys held per rule.
// A rule whose limit is under --exact-below is counted exactly by the root instead, one
// count_hits call per request (--exact-timeout bounds it; no answer is UNAVAILABLE).

#include <doorman/client.hpp>
#include <doorman/client/keyed_resource.hpp>
#include <doorman/limit/rules.hpp>
#include <doorman/net/address.hpp>
#include <doorman/net/channel.hpp>
#include <doorman/net/http_server.hpp>
#include <doorman/node/admin.hpp>
#include <doorman/node/file_watch.hpp>
#include <doorman/protocol/codec.hpp>

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
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "arguments.hpp"
#include "client_flags.hpp"
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
  doorman_examples::client_flags client;  // --server: leases from a doorman tree
  std::size_t max_keys = 100'000;         // per rule, with leases
  double headroom = 1.5;                  // measured demand × this, with leases
  double demand_window = 3;               // seconds, with leases
  double min_share = 0.1;                 // of a key's limit, the least asked for, with leases
  double exact_below = 100;  // requests_per_unit under which the root counts, with leases
  double exact_timeout = 1;  // seconds a count at the root may take
  bool print_root_config = false;
  std::string metrics_listen;  // empty: no metrics endpoint
};

// What the directory held when it was read: each file's name, size and change time.
// The stamps of the directory's files (a ConfigMap's symlink swap changes them).
using directory_state = std::vector<std::pair<std::string, doorman::file_stamp>>;

std::vector<std::filesystem::path> config_files(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  const std::filesystem::directory_iterator files(dir, ec);
  if (ec) throw std::invalid_argument(fmt::format("--config {}: {}", dir, ec.message()));
  for (const auto& e : files) {
    const auto ext = e.path().extension();
    if (e.is_regular_file() && (ext == ".yaml" || ext == ".yml")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

directory_state state_of(const std::string& dir) {
  directory_state s;
  for (const auto& f : config_files(dir))
    s.emplace_back(f.string(), doorman::stamp_of(f.string()));
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

// With --server, each rule's keys are counted by leases: every request key is a doorman
// resource (the rule's template at the root gives its capacity: requests_per_unit per unit),
// enforced here by a fixed window of the rule's unit over this replica's share. A key whose
// first lease has not come yet, or longer than a resource id, is counted by the rule alone.
class lease_counts {
 public:
  lease_counts(doorman::client& c, std::size_t max_keys, double headroom, double min_share)
      : client_(c), max_keys_(max_keys), headroom_(headroom), min_share_(min_share) {}

  std::optional<doorman::descriptor_status> count(doorman::rule_set& rules,
                                                  const doorman::rule_set::rule& r,
                                                  const std::string& key, double hits) {
    if (key.size() > doorman::request_limits::max_id_bytes) return std::nullopt;
    auto res = keys_for(r).resource_by_id(key);
    const bool leased = res.leased();
    const auto admitted = res.try_acquire(hits);  // before the first lease too: demand
    if (!leased) return std::nullopt;
    const auto st = res.limiter().status();
    const std::chrono::nanoseconds cap = std::chrono::hours(24);  // "never": come back later
    return rules.status_of(r, key, hits, bool(admitted), st.limit, st.remaining, st.reset,
                           std::min<std::chrono::nanoseconds>(admitted.retry_after, cap));
  }

 private:
  doorman::keyed_rate_resource& keys_for(const doorman::rule_set::rule& r) {
    const auto id = fmt::format("{} {}", r.path, r.unit.count());
    auto& k = by_rule_[id];
    if (!k) {
      doorman::resource_options o;
      o.algorithm = doorman::rate_algorithm::fixed_window;
      o.window = r.unit;
      // A new key asks for the whole limit until its demand is measured (as a rate).
      o.initial_wants = r.requests_per_unit / std::chrono::duration<double>(r.unit).count();
      o.headroom = headroom_;
      o.min_wants = o.initial_wants * min_share_;
      k = std::make_unique<doorman::keyed_rate_resource>(
          client_, "*", o, doorman::keyed_resource_options{max_keys_});
    }
    return *k;
  }

  doorman::client& client_;
  std::size_t max_keys_;
  double headroom_;
  double min_share_;
  std::map<std::string, std::unique_ptr<doorman::keyed_rate_resource>> by_rule_;
};

// With --server, a rule whose limit is under --exact-below is counted exactly by the tree's
// root (`count_hits`, one call per request, its descriptors together) instead of by leases: a
// small limit split into shares quantises badly (10 per minute over 5 replicas is 2 each). A
// key the root refused with nothing left is refused here until its window ends, without a
// call: the root sees at most the limit plus one call per replica per key and window.
class exact_counts {
 public:
  // The root's verdicts, in the counts' order; or why there are none.
  using done_type =
      std::function<void(std::optional<std::vector<doorman::hit_verdict>>, std::string)>;

  exact_counts(const doorman::client_options& c, double below, double timeout, std::size_t max_keys)
      : below_(below),
        max_keys_(max_keys),
        client_id_(c.client_id),
        channel_(io_.get_executor(), channel_options(c, timeout)),
        thread_([this] { io_.run(); }) {}

  exact_counts(const exact_counts&) = delete;
  exact_counts& operator=(const exact_counts&) = delete;
  ~exact_counts() { stop(); }

  // Once every call has been answered (the gRPC server stopped first).
  void stop() {
    if (!thread_.joinable()) return;
    asio::post(io_, [this] {
      channel_.shutdown();
      work_.reset();
    });
    thread_.join();
  }

  [[nodiscard]] bool applies(const doorman::rule_set::rule& r, const std::string& key) const {
    return r.requests_per_unit < below_ && key.size() <= doorman::request_limits::max_id_bytes;
  }

  // When `key` was refused with nothing left in its window: until when.
  std::optional<std::chrono::steady_clock::time_point> refused_until(const std::string& key) {
    const std::lock_guard lock(mutex_);
    const auto it = refused_.find(key);
    if (it == refused_.end()) return std::nullopt;
    if (it->second <= std::chrono::steady_clock::now()) {
      refused_.erase(it);
      return std::nullopt;
    }
    return it->second;
  }

  void remember_refusal(const std::string& key, std::chrono::steady_clock::time_point until) {
    const std::lock_guard lock(mutex_);
    if (refused_.size() >= max_keys_) {
      const auto now = std::chrono::steady_clock::now();
      std::erase_if(refused_, [&](const auto& e) { return e.second <= now; });
      if (refused_.size() >= max_keys_) refused_.clear();  // bounded: forget, ask again
    }
    refused_[key] = until;
  }

  // Asks the root to count `counts` (a resource id is a request key); `done` runs on this
  // object's thread.
  void count(std::vector<doorman::hit_count> counts, done_type done) {
    doorman::count_request request{client_id_, std::move(counts)};
    nlohmann::json params = request;  // the wire form (doorman/protocol/codec.hpp)
    asio::co_spawn(
        io_,
        [this, params = std::move(params), request = std::move(request),
         done = std::move(done)]() mutable -> asio::awaitable<void> {
          auto reply = co_await channel_.call("count_hits", std::move(params));
          if (!reply) {
            done(std::nullopt, "the root did not count: " + reply.message);
            co_return;
          }
          doorman::count_response answer;
          if (auto e = doorman::decode(reply.result, answer)) {
            done(std::nullopt, "the root's count_hits answer: " + e->message);
            co_return;
          }
          if (auto why = problem(answer, request.resources)) {
            done(std::nullopt, "the root's count_hits answer: " + *why);
            co_return;
          }
          done(std::move(answer.resources), {});
        },
        asio::detached);
  }

 private:
  static doorman::net::channel_options channel_options(const doorman::client_options& c,
                                                       double timeout) {
    doorman::net::channel_options o;
    o.addresses = c.addresses;
    o.tls = c.tls;
    o.call_timeout = doorman::seconds(timeout);
    o.log = c.log;
    return o;
  }

  // What is wrong with the root's answer (it comes from outside), or nothing.
  static std::optional<std::string> problem(const doorman::count_response& a,
                                            const std::vector<doorman::hit_count>& asked) {
    if (!a.mastership.is_master) return "not from the master";
    if (a.resources.size() != asked.size()) {
      return fmt::format("{} verdicts for {} counts", a.resources.size(), asked.size());
    }
    for (std::size_t i = 0; i < asked.size(); ++i) {
      const auto& v = a.resources[i];
      const auto at = [i](const char* f) { return fmt::format("resources[{}].{}", i, f); };
      if (v.resource_id != asked[i].resource_id) return at("resource_id") + ": not the one asked";
      for (const auto& [name, x] : {std::pair{"limit", v.limit}, {"remaining", v.remaining}}) {
        if (!(x >= 0 && x <= doorman::request_limits::max_quantity))
          return at(name) + ": must be between 0 and 1e15";
      }
      if (!(v.reset >= 0 && v.reset <= asked[i].window))
        return at("reset") + ": must be between 0 and the window";
    }
    return std::nullopt;
  }

  double below_;
  std::size_t max_keys_;
  std::string client_id_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  doorman::net::channel channel_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> refused_;
  std::thread thread_;  // last: it runs once the rest is built
};

// The rules behind the door: swapped whole on reload (counts start afresh).
class rules_handler final : public doorman::rls::handler {
 public:
  rules_handler(std::shared_ptr<doorman::rule_set> rules, lease_counts* leases, exact_counts* exact)
      : rules_(std::move(rules)), leases_(leases), exact_(exact) {}

  void check(const doorman::rls::check_request& r, done_type done) override {
    // The descriptors the root counts: where each goes, under which rule, how many hits (the
    // key comes back in the root's verdict, checked to be the one asked).
    struct waiting {
      std::size_t index;
      const doorman::rule_set::rule* rule;
      double hits;
    };
    std::vector<waiting> wait;
    std::vector<doorman::hit_count> counts;
    std::shared_ptr<doorman::rule_set> rules;
    doorman::rls::check_outcome o;
    {
      const std::lock_guard lock(mutex_);
      rules = rules_;
      o.statuses = rules->check_each(
          r.domain, r.descriptors,
          [&](const doorman::rule_set::rule& rule, const std::string& key, double hits,
              std::size_t i) -> std::optional<doorman::descriptor_status> {
            if (exact_ && exact_->applies(rule, key)) {
              if (const auto until = exact_->refused_until(key)) {
                const auto left = *until - std::chrono::steady_clock::now();
                return rules->status_of(rule, key, hits, false, rule.requests_per_unit, 0, left,
                                        left);
              }
              wait.push_back({i, &rule, hits});
              counts.push_back({key, hits, std::chrono::duration<double>(rule.unit).count()});
              return doorman::descriptor_status{};  // the root's verdict replaces it
            }
            return leases_ ? leases_->count(*rules, rule, key, hits)
                           : std::optional<doorman::descriptor_status>();
          });
    }
    if (wait.empty()) {
      done(std::move(o));
      return;
    }
    // The rules are held (a reload may swap them meanwhile): the rule pointers stay good.
    exact_->count(std::move(counts),
                  [this, rules, wait = std::move(wait), o = std::move(o), done = std::move(done)](
                      auto verdicts, std::string why) mutable {
                    if (!verdicts) {
                      done({{}, std::move(why)});
                      return;
                    }
                    const auto now = std::chrono::steady_clock::now();
                    {
                      const std::lock_guard lock(mutex_);
                      for (std::size_t k = 0; k < wait.size(); ++k) {
                        const auto& v = (*verdicts)[k];
                        const auto reset = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::duration<double>(v.reset));
                        o.statuses[wait[k].index] =
                            rules->status_of(*wait[k].rule, v.resource_id, wait[k].hits, v.admitted,
                                             v.limit, v.remaining, reset, reset);
                        if (!v.admitted && v.remaining <= 0)
                          exact_->remember_refusal(v.resource_id, now + reset);
                      }
                    }
                    done(std::move(o));
                  });
  }

  void replace(std::shared_ptr<doorman::rule_set> rules) {
    const std::lock_guard lock(mutex_);
    rules_ = std::move(rules);
  }

  // Every rule's counts in Prometheus's text format, as envoyproxy/ratelimit counts per key
  // (since the rules were loaded: a reload starts them again).
  std::string metrics() {
    std::shared_ptr<const doorman::rule_set> rules;
    {
      const std::lock_guard lock(mutex_);
      rules = rules_;
    }
    using stats = doorman::rule_stats;
    struct family {
      const char* name;
      const char* help;
      const std::atomic<std::uint64_t> stats::*count;
    };
    static constexpr family families[] = {
        {"doorman_rls_hits_total", "Hits counted against a rule (hits_addend summed).",
         &stats::total_hits},
        {"doorman_rls_over_limit_total", "Hits refused, or over a shadow rule's limit.",
         &stats::over_limit},
        {"doorman_rls_near_limit_total", "Hits admitted past 80% of the window's limit.",
         &stats::near_limit},
        {"doorman_rls_within_limit_total", "Hits admitted.", &stats::within_limit},
        {"doorman_rls_shadow_mode_total", "Hits a shadow rule would have refused.",
         &stats::shadow_mode},
    };
    doorman::detail::prom_writer w;
    for (const auto& f : families) {
      w.family(f.name, "counter", f.help);
      rules->for_each_stats(
          [&](const std::string& domain, const std::string& rule, const stats& st) {
            w.sample(f.name,
                     fmt::format("domain=\"{}\",rule=\"{}\"", doorman::detail::prom_escape(domain),
                                 doorman::detail::prom_escape(rule)),
                     static_cast<double>((st.*f.count).load()));
          });
    }
    return w.take();
  }

 private:
  std::mutex mutex_;
  std::shared_ptr<doorman::rule_set> rules_;
  lease_counts* leases_;  // null: each replica counts alone
  exact_counts* exact_;   // null: no rule is counted at the root
};

// The configuration of the doorman tree's root that --server leases from: each rule a template
// whose glob matches its request keys, with its limit as a rate (requests_per_unit / unit).
nlohmann::json root_config(const doorman::rule_set& rules) {
  // No learning mode: a root in learning mode grants a key nobody holds yet nothing, and an
  // edge refusing every new key for a while is worse than one that, after a root restart,
  // admits up to the limit again while the old leases run out (at most one lease length).
  const nlohmann::json algorithm = {{"kind", "FAIR_SHARE"},
                                    {"lease_length", 60},
                                    {"refresh_interval", 5},
                                    {"learning_mode_duration", 0}};
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : rules.resource_templates()) {
    list.push_back({{"identifier_glob", t.identifier_glob},
                    {"capacity", t.capacity},
                    {"description", t.description},
                    {"algorithm", algorithm}});
  }
  list.push_back({{"identifier_glob", "*"},
                  {"capacity", 0},
                  {"description", "no rule: nothing"},
                  {"algorithm", algorithm}});
  nlohmann::json config = {{"resources", std::move(list)}};
  (void)doorman::resource_repository::parse(config.dump());  // what a node will accept
  return config;
}

// Serves until SIGTERM or SIGINT; reloads on SIGHUP and when the directory changes.
int serve(const options& o) {
  sigset_t signals;
  sigemptyset(&signals);
  for (const int s : {SIGHUP, SIGTERM, SIGINT})
    sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // before gRPC's threads start: they inherit it

  std::optional<doorman::client> client;
  std::optional<lease_counts> leases;
  std::optional<exact_counts> exact;
  if (o.client.server_given) {
    auto c = o.client.client_options();
    // Demand measured over a few seconds, not the default 10: a replica's share follows its
    // traffic when that traffic moves between replicas (docs/envoy.md, accuracy).
    c.demand_window = doorman::seconds(o.demand_window);
    client.emplace(c);
    leases.emplace(*client, o.max_keys, o.headroom, o.min_share);
    if (o.exact_below > 0) {
      c.client_id = client->id();
      exact.emplace(c, o.exact_below, o.exact_timeout, o.max_keys);
    }
  }
  rules_handler handler(load(o.config_dir), leases ? &*leases : nullptr, exact ? &*exact : nullptr);
  auto seen = state_of(o.config_dir);
  // --metrics-listen: GET /metrics on a thread of its own (it inherits the blocked signals).
  asio::io_context metrics_io;
  std::optional<doorman::net::http_server> metrics;
  std::thread metrics_thread;
  if (!o.metrics_listen.empty()) {
    metrics.emplace(metrics_io.get_executor(), doorman::net::http_server_options{},
                    [&](const doorman::net::http_request& r) {
                      if (r.path != "/metrics") return doorman::net::http_answer{404, {}, "no\n"};
                      return doorman::net::http_answer{
                          200, "text/plain; version=0.0.4; charset=utf-8", handler.metrics()};
                    });
    std::error_code ec;
    metrics->listen(*doorman::net::parse_address(o.metrics_listen), ec);
    if (ec) throw std::system_error(ec, "--metrics-listen " + o.metrics_listen);
    metrics->start();
    doorman_examples::log_line(fmt::format("metrics on http://{}:{}/metrics",
                                           doorman::net::parse_address(o.metrics_listen)->host,
                                           metrics->local_endpoint().port()));
    metrics_thread = std::thread([&] { metrics_io.run(); });
  }
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
  if (exact) exact->stop();
  if (metrics) {
    asio::post(metrics_io, [&] { metrics->stop(); });
    metrics_thread.join();
  }
  if (client) client->stop();
  doorman_examples::log_line("stopped");
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
      {"--headroom", [&](arguments& a) { o.headroom = a.number(1, 10); }},
      {"--demand-window", [&](arguments& a) { o.demand_window = a.number(1, 600); }},
      {"--min-share", [&](arguments& a) { o.min_share = a.number(0, 1); }},
      {"--exact-below", [&](arguments& a) { o.exact_below = a.number(0, 1e10); }},
      {"--exact-timeout", [&](arguments& a) { o.exact_timeout = a.number(0.001, 60); }},
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
      "                   [--server HOST:PORT[,...]] [--max-keys N] [--headroom X]\n"
      "                   [--demand-window S] [--min-share F] [--exact-below N]\n"
      "                   [--exact-timeout S] [--print-root-config]\n"
      "                   [--metrics-listen HOST:PORT] [--version]\n",
      flags(o), [&] {
        if (o.config_dir.empty()) throw std::invalid_argument("--config DIR is required");
        if (o.print_root_config) {
          std::puts(root_config(*load(o.config_dir)).dump(2).c_str());
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
