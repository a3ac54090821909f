// The rate limit service behind the door (see rls_service.hpp).

#include "rls_service.hpp"

#include <doorman/client/client_id.hpp>
#include <doorman/core/error.hpp>
#include <doorman/net/channel.hpp>
#include <doorman/node/admin.hpp>
#include <doorman/node/file_watch.hpp>
#include <doorman/protocol/codec.hpp>

#include <fmt/format.h>
#include <asio.hpp>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "rls_mapping.hpp"

namespace doorman::rls {
namespace {

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
}  // namespace

// With --server, every request key is counted exactly by the doorman tree's root: this replica
// draws blocks of hits from the root's count of the key's window (`count_hits`) and admits from
// them (doorman/client/window_draws.hpp). The root sees one call per block, about one refused
// call per replica, key and window, and none at all for a key refused until its window ends.
class rules_service::root_draws {
 public:
  struct waiter {
    std::shared_ptr<pending_check> check;
    std::size_t slot;
  };

  explicit root_draws(const root_options& o)
      : client_id_(o.client.client_id.empty() ? doorman::default_client_id() : o.client.client_id),
        draws_(o.draws),
        channel_(io_.get_executor(), channel_options(o.client, o.call_timeout)),
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
    asio::co_spawn(
        io_,
        [this, request = std::move(request)]() mutable -> asio::awaitable<void> {
          auto reply = co_await channel_.call<doorman::methods::count_hits>(request);
          std::string why;
          if (!reply) {  // a malformed answer among them: "bad answer: result...."
            why = "the root did not count: " + reply.message;
          } else if (auto p = problem(reply.result, request.resources)) {
            why = "the root's count_hits answer: " + *p;
          }
          answered(request.resources, why.empty() ? &reply.result.resources : nullptr, why);
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
                                                       seconds timeout) {
    doorman::net::channel_options o;
    o.addresses = c.addresses;
    o.tls = c.tls;
    o.call_timeout = timeout;
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

rules_service::rules_service(std::shared_ptr<rule_set> rules, std::optional<root_options> root)
    : rules_(std::move(rules)) {
  if (root) draws_ = std::make_unique<root_draws>(*root);
}

rules_service::~rules_service() {
  stop();
}

void rules_service::check(const check_request& r, done_type done) {
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

void rules_service::replace(std::shared_ptr<rule_set> rules) {
  const std::lock_guard lock(mutex_);
  rules_ = std::move(rules);
}

std::shared_ptr<const rule_set> rules_service::rules() {
  const std::lock_guard lock(mutex_);
  return rules_;
}

std::string rules_service::metrics() {
  const auto rules = this->rules();
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
    rules->for_each_stats([&](const std::string& domain, const std::string& rule, const stats& st) {
      w.sample(f.name,
               fmt::format("domain=\"{}\",rule=\"{}\"", doorman::detail::prom_escape(domain),
                           doorman::detail::prom_escape(rule)),
               static_cast<double>((st.*f.count).load()));
    });
  }
  return w.take();
}

void rules_service::stop() {
  if (draws_) draws_->stop();
}

std::vector<std::string> rule_files(const std::string& dir) {
  return file_watch::files_in(dir, {".yaml", ".yml"});
}

std::shared_ptr<rule_set> load_rules_directory(const std::string& dir,
                                               const rules_file_reader& read) {
  const auto files = rule_files(dir);
  if (files.empty()) throw std::invalid_argument(dir + ": no .yaml or .yml files");
  nlohmann::json all = nlohmann::json::array();
  std::vector<std::string> names;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream text;
    if (!(in && text << in.rdbuf())) throw std::invalid_argument("cannot read " + f);
    auto doc = read(text.str(), f, [](const nlohmann::json& d) {
      nlohmann::json x = d;
      if (x.is_object() && !x.contains("algorithm")) x["algorithm"] = "fixed_window";
      (void)rule_set::parse(x);  // checked alone: errors name this file's line
      return x;
    });
    if (doc.is_object() && doc.contains("domain")) {
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (all[i]["domain"] == doc["domain"]) {
          throw std::invalid_argument(fmt::format("{}: domain {} is already defined in {}", f,
                                                  doc["domain"].dump(), names[i]));
        }
      }
    }
    all.push_back(std::move(doc));
    names.push_back(f);
  }
  return std::make_shared<rule_set>(rule_set::parse(all));
}

// The algorithm is for Doorman clients that lease the same keys; no learning mode, so they get
// leases at once. Keys no rule matches get nothing.
nlohmann::json root_config(const doorman::rule_set& rules) {
  const nlohmann::json algorithm = {{"kind", "FAIR_SHARE"},
                                    {"lease_length", 60},
                                    {"refresh_interval", 5},
                                    {"learning_mode_duration", 0}};
  nlohmann::json list = nlohmann::json::array();
  for (const auto& t : rules.resource_templates(std::chrono::hours(24))) {
    nlohmann::json r = {{"identifier_glob", t.identifier_glob},
                        {"capacity", t.capacity},
                        {"description", t.description},
                        {"algorithm", algorithm}};
    if (t.budget) r["budget"] = {{"window", t.budget->fixed_seconds}};
    list.push_back(std::move(r));
  }
  list.push_back({{"identifier_glob", "*"},
                  {"capacity", 0},
                  {"description", "no rule: nothing"},
                  {"algorithm", algorithm}});
  nlohmann::json config = {{"resources", std::move(list)}};
  (void)doorman::resource_repository::parse(config.dump());  // what a node will accept
  return config;
}

}  // namespace doorman::rls
