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

#include <doorman/client.hpp>
#include <doorman/client/client_id.hpp>
#include <doorman/client/window_draws.hpp>
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
  doorman_examples::client_flags client;  // --server: counted by a doorman tree's root
  std::size_t max_keys = 100'000;         // keys held, with --server
  double exact_timeout = 1;               // seconds a call to the root may take
  double block_fraction = 0.05;           // of a window's limit, the most a block holds
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

// A ShouldRateLimit whose descriptors wait on draws from the root: its statuses so far, and
// each waiting descriptor's rule, key and hits, decided when the root answers.
struct pending_check {
  struct slot {
    std::size_t index;  // in the statuses
    const doorman::rule_set::rule* rule;
    std::string key;
    double hits;
    doorman::draw_outcome outcome;
  };
  std::shared_ptr<doorman::rule_set> rules;  // held: a reload may swap them meanwhile
  doorman::rls::check_outcome outcome;
  doorman::rls::handler::done_type done;
  std::vector<slot> slots;
  std::atomic<std::size_t> left{1};  // slots undecided, and one while the check is built
  std::string unavailable;           // why a slot had no decision
  // The slots' outcomes and `unavailable` are written under root_draws' mutex, and read once
  // `left` is 0.
};

// With --server, every request key is counted exactly by the doorman tree's root: this replica
// draws blocks of hits from the root's count of the key's window (`count_hits`) and admits from
// them (doorman/client/window_draws.hpp). The root sees one call per block, about one refused
// call per replica, key and window, and none at all for a key refused until its window ends.
class root_draws {
 public:
  struct waiter {
    std::shared_ptr<pending_check> check;
    std::size_t slot;
  };

  root_draws(const doorman::client_options& c, double timeout, doorman::window_draw_options d)
      : client_id_(c.client_id.empty() ? doorman::default_client_id() : c.client_id),
        draws_(d),
        channel_(io_.get_executor(), channel_options(c, timeout)),
        thread_([this] { io_.run(); }) {}

  root_draws(const root_draws&) = delete;
  root_draws& operator=(const root_draws&) = delete;
  ~root_draws() { stop(); }

  // Once every call has been answered (the gRPC server stopped first).
  void stop() {
    if (!thread_.joinable()) return;
    asio::post(io_, [this] {
      channel_.shutdown();
      work_.reset();
    });
    thread_.join();
  }

  // Slot `k` of `c`: decided now (true), or when the root answers a draw (a draw to send
  // joins `sends`).
  bool take(const std::shared_ptr<pending_check>& c, std::size_t k,
            std::vector<doorman::hit_count>& sends) {
    auto& slot = c->slots[k];
    const std::lock_guard lock(mutex_);
    auto s = draws_.take(slot.key, slot.hits, slot.rule->requests_per_unit, slot.rule->unit,
                         std::chrono::steady_clock::now(), {c, k});
    if (s.draw) sends.push_back(std::move(*s.draw));
    if (s.decided) decide(*c, k, *s.decided, {});
    return s.decided.has_value();
  }

  // Asks the root for `sends` (one call), and hands its answers to the draws.
  void send(std::vector<doorman::hit_count> sends) {
    if (sends.empty()) return;
    doorman::count_request request{client_id_, std::move(sends)};
    nlohmann::json params = request;  // the wire form (doorman/protocol/codec.hpp)
    asio::co_spawn(
        io_,
        [this, params = std::move(params),
         request = std::move(request)]() mutable -> asio::awaitable<void> {
          auto reply = co_await channel_.call("count_hits", std::move(params));
          doorman::count_response answer;
          std::string why;
          if (!reply) {
            why = "the root did not count: " + reply.message;
          } else if (auto e = doorman::decode(reply.result, answer)) {
            why = "the root's count_hits answer: " + e->message;
          } else if (auto p = problem(answer, request.resources)) {
            why = "the root's count_hits answer: " + *p;
          }
          answered(request.resources, why.empty() ? &answer.resources : nullptr, why);
        },
        asio::detached);
  }

 private:
  // The root's verdicts on `asked` (null: none, for `why`): the waiting decided, the checks
  // completed, the next draws sent.
  void answered(const std::vector<doorman::hit_count>& asked,
                const std::vector<doorman::hit_verdict>* verdicts, const std::string& why) {
    std::vector<std::shared_ptr<pending_check>> decided;
    std::vector<doorman::hit_count> sends;
    {
      const std::lock_guard lock(mutex_);
      const auto now = std::chrono::steady_clock::now();
      for (std::size_t i = 0; i < asked.size(); ++i) {
        auto r = draws_.answered(asked[i].resource_id, verdicts ? &(*verdicts)[i] : nullptr, now);
        for (auto& [w, outcome] : r.decided) {
          decide(*w.check, w.slot, outcome, why);
          decided.push_back(std::move(w.check));
        }
        if (r.draw) sends.push_back(std::move(*r.draw));
      }
    }
    for (auto& c : decided)
      finish_one(std::move(c));
    send(std::move(sends));
  }

  // Under the mutex: every write to a check's slots and reason is made holding it.
  static void decide(pending_check& c, std::size_t k, const doorman::draw_outcome& o,
                     const std::string& why) {
    c.slots[k].outcome = o;
    if (o.what == doorman::draw_outcome::kind::unavailable && c.unavailable.empty())
      c.unavailable = why.empty() ? o.why : why;
  }

 public:
  // One slot of `c` decided, or its building done: the last one answers the check.
  static void finish_one(std::shared_ptr<pending_check> c) {
    if (c->left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (!c->unavailable.empty()) {
      c->done({{}, std::move(c->unavailable)});
      return;
    }
    for (const auto& s : c->slots) {
      const auto& o = s.outcome;
      const bool admitted = o.what == doorman::draw_outcome::kind::admitted;
      const auto reset = o.reset > std::chrono::nanoseconds(0) ? o.reset : s.rule->unit;
      c->outcome.statuses[s.index] =
          c->rules->status_of(*s.rule, s.key, s.hits, admitted, o.limit, o.remaining, reset, reset);
    }
    c->done(std::move(c->outcome));
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

  std::string client_id_;
  std::mutex mutex_;
  doorman::window_draws<std::chrono::steady_clock, waiter> draws_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_ = asio::make_work_guard(io_);
  doorman::net::channel channel_;
  std::thread thread_;  // last: it runs once the rest is built
};

// The rules behind the door: swapped whole on reload (counts start afresh).
class rules_handler final : public doorman::rls::handler {
 public:
  rules_handler(std::shared_ptr<doorman::rule_set> rules, root_draws* draws)
      : rules_(std::move(rules)), draws_(draws) {}

  void check(const doorman::rls::check_request& r, done_type done) override {
    auto c = std::make_shared<pending_check>();
    std::vector<doorman::hit_count> sends;
    {
      const std::lock_guard lock(mutex_);
      c->rules = rules_;
      c->outcome.statuses = c->rules->check_each(
          r.domain, r.descriptors,
          [&](const doorman::rule_set::rule& rule, const std::string& key, double hits,
              std::size_t i) -> std::optional<doorman::descriptor_status> {
            // A key longer than a resource id is counted by the rule alone.
            if (!draws_ || key.size() > doorman::request_limits::max_id_bytes) return std::nullopt;
            c->slots.push_back({i, &rule, key, hits, {}});
            return doorman::descriptor_status{};  // the draws' outcome replaces it
          });
      // The slots are all made (none moves from here on): now they may be decided.
      c->left.fetch_add(c->slots.size(), std::memory_order_relaxed);
      for (std::size_t k = 0; k < c->slots.size(); ++k) {
        if (draws_->take(c, k, sends)) c->left.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    c->done = std::move(done);
    if (draws_) draws_->send(std::move(sends));
    root_draws::finish_one(std::move(c));
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
  root_draws* draws_;  // null: each replica counts alone
};

// The configuration of the doorman tree's root that --server counts at: each rule a template
// whose glob matches its request keys, with its limit as a rate (requests_per_unit / unit; the
// root counts the rate × the window, the rule's requests_per_unit, in each window). The algorithm
// is for Doorman clients that lease the same keys; no learning mode, so they get leases at once.
nlohmann::json root_config(const doorman::rule_set& rules) {
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

  std::optional<root_draws> draws;
  if (o.client.server_given) {
    draws.emplace(
        o.client.client_options(), o.exact_timeout,
        doorman::window_draw_options{.block_fraction = o.block_fraction, .max_keys = o.max_keys});
  }
  rules_handler handler(load(o.config_dir), draws ? &*draws : nullptr);
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
  if (draws) draws->stop();
  if (metrics) {
    asio::post(metrics_io, [&] { metrics->stop(); });
    metrics_thread.join();
  }
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
