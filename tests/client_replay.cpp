// doorman_client_replay: the C++ client's decisions over recorded traces, for the differential
// test against the Python client's sans-I/O core (python/tests/test_differential.py).
//
// Reads one trace a line on stdin and writes one line of decisions per trace on stdout. A
// trace: {"seed", "start" (ns), "options": {call_timeout, minimum_refresh_interval,
// sample_interval, demand_window, throttled_headroom}, "steps": [[op, args...], ...]}. The ops:
//   ["advance", ns]                         the manual clock moves on
//   ["attach", id, kind, options]           a handle (a new resource, or one more handle)
//   ["detach", id]                          a handle goes (the last one removes the resource)
//   ["try", id, n]                          a rate handle's try_acquire: [admitted, retry_after]
//   ["reserve", id, n]                      a wait's reservation: ns until due (or "never")
//   ["settle", id, reserved, used, back]    a rate handle's settle: whether it settled (with
//                                           the slot of the `back`-th latest admission or
//                                           reservation of the resource; 0: without a slot)
//   ["gauge_try", id] / ["gauge_release", id]
//   ["budget_try", id, n] / ["budget_settle", id, reserved, used, windows_back]   a budget
//                                           handle's (settled in the window `windows_back`
//                                           before the counter's)
//   ["answers", id, calls, overloads]       a handle's record_answers (learned capacity)
//   ["step"]                                the client's next step: release, refresh or wait
//   ["answer", result] / ["fail"]           what came back for the step's call
//   ["close"]
// Every op's decision, and after each op every resource's [capacity, leased, wants] (and a
// budget's [left, spent]), are written out; the Python core must write the same.
//
// It drives the client's own parts — `basic_client_state`, `basic_rate_limiter`,
// `gauge_limiter`, `budget_counter`, `demand_estimator` with `rate_demand`, `sampled_wants`
// and `budget_wants` — on a manual
// clock, in the order `client_core` calls them (its `next_step`, `next_call`, `on_reply`,
// `push_capacities`, `sample`, and a handle's `held_back`).

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "doorman/core/client_state.hpp"
#include "doorman/limit/budget_counter.hpp"
#include "doorman/limit/demand_estimator.hpp"
#include "doorman/limit/gauge_limiter.hpp"
#include "doorman/limit/rate_limiter.hpp"
#include "doorman/protocol/codec.hpp"

namespace {

using json = nlohmann::json;
using doorman::manual_clock;
using time_point = manual_clock::time_point;
using ns = std::chrono::nanoseconds;

struct entry {
  entry(std::string kind_, bool estimate_, double burst, const manual_clock& clock)
      : kind(std::move(kind_)),
        estimate(estimate_),
        auto_burst(!(burst > 0)),
        rate({.rate = 0, .burst = burst > 0 ? burst : 1}, doorman::manual_clock_ref{&clock}) {}
  std::string kind;
  bool estimate;
  bool auto_burst;
  doorman::basic_rate_limiter<doorman::manual_clock_ref> rate;
  doorman::gauge_limiter gauge{0};
  doorman::budget_counter<manual_clock> budget;
  doorman::demand_estimator demand{std::chrono::seconds(10)};
  int handles = 1;
  double capacity = 0;
  bool leased = false;
  bool first_capacity = true;
  bool holding_back = false;
  double asked_seen = 0;
  std::uint64_t delayed_seen = 0;
  std::uint64_t answers = 0;  // record_answers, in all
  std::uint64_t overloads = 0;
  std::vector<std::int64_t> slots;  // of the admissions and reservations, oldest first
};

json time_or_never(time_point t, time_point now) {
  if (t == time_point::max()) return "never";
  return (t - now).count();
}

class replay {
 public:
  explicit replay(const json& trace)
      : clock_(time_point(ns(trace.at("start").get<std::int64_t>()))),
        options_(trace.at("options")),
        state_(state_options(trace)) {
    next_sample_ = clock_.now() + doorman::to_duration<ns>(opt("sample_interval"));
    last_sample_ = clock_.now();
  }

  json run(const json& steps) {
    json out = json::array();
    for (const auto& s : steps) {
      out.push_back({apply(s), snapshot()});
    }
    return out;
  }

 private:
  static doorman::client_state_options state_options(const json& trace) {
    doorman::client_state_options o;
    o.client_id = "replay";
    o.refresh.minimum_interval =
        doorman::seconds(trace.at("options").at("minimum_refresh_interval"));
    o.refresh.seed = trace.at("seed").get<std::uint64_t>();
    return o;
  }

  double opt(const char* name) const { return options_.at(name).get<double>(); }
  time_point now() const { return clock_.now(); }

  json apply(const json& s) {
    const std::string op = s.at(0);
    if (op == "advance") {
      clock_.advance(ns(s.at(1).get<std::int64_t>()));
      return nullptr;
    }
    if (op == "attach") return attach(s.at(1), s.at(2), s.at(3));
    if (op == "detach") return detach(s.at(1));
    if (op == "try") return try_acquire(s.at(1), s.at(2));
    if (op == "reserve") return reserve(s.at(1), s.at(2));
    if (op == "settle") return settle(s.at(1), s.at(2), s.at(3), s.at(4));
    if (op == "gauge_try") return gauge_try(s.at(1));
    if (op == "budget_try") return budget_try(s.at(1), s.at(2));
    if (op == "budget_settle") {
      auto* e = find(s.at(1));
      if (e == nullptr || e->kind != "budget") return nullptr;
      // The window the call was admitted in, `s[4]` windows before the counter's.
      const std::uint64_t back = s.at(4), now = e->budget.window();
      return e->budget.settle(s.at(2), s.at(3), now - std::min(back, now));
    }
    if (op == "gauge_release") {
      if (auto* e = find(s.at(1)); e && e->kind == "gauge" && e->gauge.in_flight() > 0) {
        e->gauge.release();
      }
      return nullptr;
    }
    if (op == "answers") return record_answers(s.at(1), s.at(2), s.at(3));
    if (op == "step") return step();
    if (op == "answer") return answer(s.at(1));
    if (op == "fail") return fail();
    if (op == "close") return close();
    throw std::runtime_error("unknown op " + op);
  }

  entry* find(const std::string& id) {
    const auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : it->second.get();
  }

  json attach(const std::string& id, const std::string& kind, const json& o) {
    if (closed_) return "closed";
    if (auto* e = find(id)) {
      if (e->kind != kind) return "kind";
      ++e->handles;
      return "shared";
    }
    doorman::client_resource_options opts;
    opts.priority = o.at("priority").get<std::int64_t>();
    opts.wants = o.at("wants").is_null() ? 0.0 : o.at("wants").get<double>();
    const std::string mode = o.at("mode");
    opts.mode = mode == "optimistic"    ? doorman::fallback::optimistic
                : mode == "pessimistic" ? doorman::fallback::pessimistic
                                        : doorman::fallback::safe;
    if (!o.at("safe_capacity").is_null()) opts.safe_capacity = o.at("safe_capacity").get<double>();
    opts.budget = kind == "budget";
    auto e =
        std::make_unique<entry>(kind, o.at("wants").is_null(), o.at("burst").get<double>(), clock_);
    e->demand = doorman::demand_estimator(doorman::seconds(opt("demand_window")));
    set_capacity(*e, doorman::fallback_capacity(opts, std::nullopt));
    state_.add(id, opts);
    entries_[id] = std::move(e);
    return "new";
  }

  json detach(const std::string& id) {
    auto* e = find(id);
    if (e == nullptr) return false;
    if (--e->handles > 0) return false;
    if (auto spend = spend_of(id, *e)) spends_.push_back(*spend);
    entries_.erase(id);
    state_.remove(id);
    return true;
  }

  // A handle's refusal at capacity 0 (`resource_entry::held_back`, then on the strand
  // `client_state::hold_back`).
  void held_back(const std::string& id, entry& e) {
    if (!e.estimate || e.capacity != 0 || closed_ || e.holding_back) return;
    e.holding_back = true;
    state_.hold_back(id, now());
  }

  json try_acquire(const std::string& id, double n) {
    auto* e = find(id);
    if (e == nullptr || e->kind != "rate") return nullptr;
    if (closed_) return json::array({false, "never"});
    const auto r = e->rate.try_acquire(n);
    if (r) {
      e->slots.push_back(r.slot);
      return json::array({true, 0.0});
    }
    if (r.retry_after == ns::max()) {
      held_back(id, *e);
      return json::array({false, "never"});
    }
    return json::array({false, doorman::to_seconds(r.retry_after)});
  }

  json reserve(const std::string& id, double n) {
    auto* e = find(id);
    if (e == nullptr || e->kind != "rate" || closed_) return nullptr;
    const auto reserved = e->rate.reserve(n);
    const time_point at = reserved.at;
    if (at == time_point::max())
      held_back(id, *e);
    else
      e->slots.push_back(reserved.slot);
    return time_or_never(at, now());
  }

  // As `rate_resource::settle`: the limiter settles (a closed client's too: nothing admitted
  // depends on it).
  json settle(const std::string& id, double reserved, double used, std::size_t back) {
    auto* e = find(id);
    if (e == nullptr || e->kind != "rate") return nullptr;
    if (back == 0 || back > e->slots.size()) return e->rate.settle(reserved, used);
    return e->rate.settle(reserved, used, e->slots[e->slots.size() - back]);
  }

  json gauge_try(const std::string& id) {
    auto* e = find(id);
    if (e == nullptr || e->kind != "gauge") return nullptr;
    if (closed_) return false;
    if (e->gauge.try_acquire()) return true;
    held_back(id, *e);
    return false;
  }

  // A budget handle's try_acquire (`budget_resource::try_acquire`).
  json budget_try(const std::string& id, double n) {
    auto* e = find(id);
    if (e == nullptr || e->kind != "budget") return nullptr;
    if (closed_) return false;
    if (e->budget.try_acquire(n, now())) return true;
    held_back(id, *e);
    return false;
  }

  // A budget's last report, for a release (`client_core::spend_of`).
  std::optional<doorman::resource_spend> spend_of(const std::string& id, entry& e) {
    const auto* r = state_.find(id);
    if (e.kind != "budget" || r == nullptr || !r->budget.info) return std::nullopt;
    e.budget.close();
    return doorman::resource_spend{id, r->budget.info->window, e.budget.report()};
  }

  // Each budget's new allotment (`client_core::adopt_allotments`).
  void adopt_allotments() {
    for (auto& [id, e] : entries_) {
      if (e->kind != "budget") continue;
      const auto a = state_.take_allotment(id);
      const auto* r = state_.find(id);
      if (a && r != nullptr && r->lease)
        e->budget.grant({a->units, a->spent_at_send, a->new_window, r->lease->expiry});
    }
  }

  void set_capacity(entry& e, double c) {
    if (e.kind == "rate") {
      if (e.auto_burst) e.rate.set_burst(std::max(1.0, c * 0.1));
      e.rate.set_rate(c);
    } else if (e.kind == "gauge") {
      e.gauge.set_limit(c);
    } else if (!(c > 0)) {
      e.budget.close();
    }
    e.capacity = c;
  }

  void push_capacities() {
    for (auto& [id, e] : entries_) {
      const double c = state_.capacity(id, now());
      e->leased = state_.leased(id, now());
      if (c == e->capacity && !e->first_capacity) continue;
      e->first_capacity = false;
      set_capacity(*e, c);
      if (c != 0) e->holding_back = false;
    }
  }

  // A handle's `record_answers`, as the client keeps them until its next sample.
  json record_answers(const std::string& id, std::uint64_t calls, std::uint64_t overloads) {
    const auto it = entries_.find(id);
    if (it == entries_.end()) return nullptr;
    it->second->answers += calls;
    it->second->overloads += std::min(overloads, calls);
    return nullptr;
  }

  // client_core::record_signals: at each sample, and before each refresh.
  void record_signals(const std::string& id, const entry& e) {
    if (e.answers == 0 || e.kind == "budget") return;
    state_.set_signals(
        id, {static_cast<double>(e.answers), static_cast<double>(std::min(e.answers, e.overloads))},
        now());
  }

  void sample() {
    const double span = doorman::to_seconds(now() - last_sample_);
    last_sample_ = now();
    for (auto& [id, e] : entries_) {
      record_signals(id, *e);
      if (!e->estimate || !(span > 0)) continue;
      if (e->kind == "budget") {
        const auto* r = state_.find(id);
        const bool leased = r != nullptr && r->lease;
        const std::uint64_t refused = e->budget.refused();
        const double asked = e->budget.attempted() - e->asked_seen;
        const bool throttled = refused != e->delayed_seen;
        e->asked_seen = e->budget.attempted();
        e->delayed_seen = refused;
        state_.set_wants(id, doorman::budget_wants(
                                 e->demand, asked, span, throttled, leased ? r->lease->capacity : 0,
                                 leased ? doorman::to_seconds(r->lease->refresh_interval)
                                        : opt("sample_interval"),
                                 opt("sample_interval"), std::max(1.0, opt("throttled_headroom"))));
        continue;
      }
      bool throttled = false;
      double value = 0;
      if (e->kind == "rate") {
        const double asked = e->rate.attempted();
        const std::uint64_t delayed = e->rate.delayed();
        throttled = delayed != e->delayed_seen;
        value = doorman::rate_demand(asked - e->asked_seen, span, throttled, e->capacity,
                                     std::max(1.0, opt("throttled_headroom")));
        e->asked_seen = asked;
        e->delayed_seen = delayed;
      } else {
        value = static_cast<double>(e->gauge.take_peak());
      }
      state_.set_wants(
          id, doorman::sampled_wants(e->demand, value, span, throttled, e->kind == "gauge"));
    }
  }

  json step() {
    if (closed_) return {{"action", "wait"}, {"at", "never"}};
    if (now() >= next_sample_) {
      sample();
      next_sample_ = now() + doorman::to_duration<ns>(opt("sample_interval"));
    }
    push_capacities();
    if (releases_.empty()) releases_ = state_.take_releases();
    if (!releases_.empty()) {
      releasing_ = std::exchange(releases_, {});
      spending_ = doorman::spends_for(releasing_, std::exchange(spends_, {}));
      return {{"action", "release"}, {"params", releasing_}, {"spends", spending_}};
    }
    auto next = state_.next(now());
    if (!next.send) {
      return {{"action", "wait"}, {"at", time_or_never(std::min(next.at, next_sample_), now())}};
    }
    const double timeout =
        state_.call_timeout(now(), doorman::seconds(opt("call_timeout"))).count();
    for (auto& [id, e] : entries_) {
      record_signals(id, *e);
      if (e->kind == "budget") state_.set_spend(id, e->budget.report(), e->budget.left(now()));
    }
    return {
        {"action", "refresh"}, {"params", json(state_.make_request(now()))}, {"timeout", timeout}};
  }

  json answer(const json& result) {
    if (!releasing_.empty()) {
      releasing_.clear();
      spending_.clear();
      return "none";
    }
    doorman::capacity_response resp;
    doorman::refresh_event e;
    if (doorman::decode(result, resp)) {
      e = state_.on_reply(doorman::make_error_code(doorman::errc::bad_answer), now());
    } else {
      e = state_.on_reply(resp, now());
    }
    adopt_allotments();
    push_capacities();
    return event_name(e);
  }

  json fail() {
    if (!releasing_.empty()) {
      releasing_.clear();
      spending_.clear();
      return "none";
    }
    const auto e = state_.on_reply(doorman::make_error_code(doorman::errc::unreachable), now());
    push_capacities();
    return event_name(e);
  }

  // What the client releases when it stops: every resource held, then those removed whose
  // release has not gone out (as `client_core::run` gathers them).
  json close() {
    closed_ = true;
    std::vector<std::string> ids;
    auto spends = std::exchange(spends_, {});
    for (auto& s : std::exchange(spending_, {}))
      spends.push_back(std::move(s));
    for (const auto& [id, e] : entries_) {
      ids.push_back(id);
      if (auto spend = spend_of(id, *e)) spends.push_back(*spend);
      e->budget.close();  // closed is closed (`client_core::stop`)
    }
    auto removed = state_.take_releases();
    for (auto* more : {&removed, &releases_, &releasing_}) {
      for (auto& id : std::exchange(*more, {}))
        ids.push_back(std::move(id));
    }
    return json::array({ids, doorman::spends_for(ids, spends)});
  }

  static const char* event_name(doorman::refresh_event e) {
    switch (e) {
      case doorman::refresh_event::reached:
        return "reached";
      case doorman::refresh_event::lost:
        return "lost";
      case doorman::refresh_event::regained:
        return "regained";
      case doorman::refresh_event::none:
        break;
    }
    return "none";
  }

  json snapshot() const {
    json out = json::object();
    for (const auto& [id, e] : entries_) {
      const auto* r = state_.find(id);
      out[id] = {e->capacity, e->leased, r ? r->options.wants : 0.0};
      if (e->kind == "budget") {
        out[id].push_back(e->budget.left(now()));
        out[id].push_back(e->budget.spent());
      }
    }
    return out;
  }

  manual_clock clock_;
  json options_;
  doorman::basic_client_state<manual_clock> state_;
  std::map<std::string, std::unique_ptr<entry>> entries_;
  time_point next_sample_{};
  time_point last_sample_{};
  std::vector<std::string> releases_;
  std::vector<std::string> releasing_;
  std::vector<doorman::resource_spend> spends_;    // for the next release
  std::vector<doorman::resource_spend> spending_;  // those of the release in flight
  bool closed_ = false;
};

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    try {
      const json trace = json::parse(line);
      replay r(trace);
      std::cout << r.run(trace.at("steps")).dump() << '\n';
    } catch (const std::exception& e) {
      std::cout << json({{"error", e.what()}}).dump() << '\n';
    }
  }
  return 0;
}
