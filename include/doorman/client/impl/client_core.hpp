#pragma once

/// \file
/// The client's loop and everything it owns (the channel, the client state, the refresh
/// driver, the resources by id), behind `doorman::client` (client/client.hpp). Only the
/// definitions include it: client/impl/client.ipp and client/impl/resource.ipp, inline in
/// every unit when header-only, once in <doorman/src.hpp> otherwise.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "doorman/client/client.hpp"
#include "doorman/client/client_id.hpp"
#include "doorman/core/client_state.hpp"
#include "doorman/core/messages.hpp"
#include "doorman/net/address.hpp"
#include "doorman/net/channel.hpp"
#include "doorman/net/refresh_driver.hpp"
#include "doorman/protocol/codec.hpp"

namespace doorman::detail {

/// One asynchronous wait pending on a resource; touched only on the client's strand.
struct pending_wait {
  explicit pending_wait(const asio::any_io_executor& strand)
      : timer(strand, asio::steady_timer::time_point::max()) {}
  asio::steady_timer timer;  // its own: until a reservation's time, or a wake-up
  bool blocked = false;      // waiting for a capacity change or a free slot
  bool cancelled = false;    // by its cancellation slot, or the client's stop

  void cancel() {
    cancelled = true;
    timer.cancel();
  }
};

class client_core {
 public:
  using clock = std::chrono::steady_clock;

  /// On its own thread and io_context (stopped and joined by the destructor).
  explicit client_core(client_options options)
      : own_io_(std::make_unique<asio::io_context>()),
        work_(std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(
            own_io_->get_executor())),
        strand_(asio::make_strand(asio::any_io_executor(own_io_->get_executor()))),
        options_(prepare(std::move(options))),
        state_(state_options(options_)),
        channel_(strand_, channel_options_of(options_)),
        driver_(strand_, requester_, channel_, "client refresh loop", options_.log) {
    start();
    thread_ = std::thread([this] { own_io_->run(); });
  }

  /// On `executor` (a strand is made over it).
  client_core(asio::any_io_executor executor, client_options options)
      : strand_(asio::make_strand(executor)),
        options_(prepare(std::move(options))),
        state_(state_options(options_)),
        channel_(strand_, channel_options_of(options_)),
        driver_(strand_, requester_, channel_, "client refresh loop", options_.log) {
    start();
  }

  client_core(const client_core&) = delete;
  client_core& operator=(const client_core&) = delete;

  ~client_core() {
    if (own_io_) {
      stop();
      work_.reset();
      thread_.join();
    }
  }

  [[nodiscard]] const client_options& options() const noexcept { return options_; }
  [[nodiscard]] bool connected() const noexcept { return connected_.load(); }
  [[nodiscard]] asio::any_io_executor executor() const { return strand_; }

  void stop() {
    {
      // Closed is closed at once: no handle admits once stop() returns.
      std::lock_guard lock(mutex_);
      closed_ = true;
      for (auto& [id, e] : registry_) {
        e->stop_source.request_stop();
        e->budget.close();  // what it has left reads 0 from now on
      }
    }
    asio::post(strand_, [this] {
      if (stopping_) return;
      stopping_ = true;
      for (auto& [id, e] : active_)
        e->stop();
      driver_.stop();
      // Nobody to release to: fail the call in flight now instead of at its deadline.
      if (!connected_) channel_.shutdown();
    });
  }

  // Stops, then calls `f()` on the strand once done.
  void when_stopped(std::function<void()> f) {
    stop();
    asio::post(strand_, [this, f = std::move(f)]() mutable {
      if (finished_) {
        f();
      } else {
        when_finished_.push_back(std::move(f));
      }
    });
  }

  std::shared_ptr<resource_entry> attach(std::string_view id, resource_kind kind,
                                         client_resource_options opts, bool estimate,
                                         const rate_algorithm_options& local) {
    if (const char* problem = id_problem(id)) {
      throw std::invalid_argument("resource id " + std::string(problem));
    }
    require_quantity(opts.wants, "wants");
    std::lock_guard lock(mutex_);
    if (const auto held = registry_.find(id); held != registry_.end()) {
      auto& slot = held->second;
      if (slot->kind != kind) {
        throw std::invalid_argument("resource " + std::string(id) +
                                    " is already held as a different kind");
      }
      ++slot->handles;
      return slot;
    }
    // Made before it is registered: an entry that throws (an unknown algorithm) leaves nothing.
    auto made =
        std::make_shared<resource_entry>(strand_, std::string(id), kind, opts, estimate, local);
    auto& slot = registry_[std::string(id)] = std::move(made);
    slot->handles = 1;
    slot->wants = opts.wants;
    if (closed_) slot->stop_source.request_stop();  // made after stop(): admits nothing
    slot->on_held_back = [this, e = slot.get()] {
      asio::post(strand_, [this, entry = e->shared_from_this()] {
        if (stopping_ || active_.count(entry->id) == 0) return;
        state_.hold_back(entry->id, clock::now());
        driver_.reschedule();  // its next step shows the raised wants (push_capacities)
      });
    };
    slot->demand = demand_estimator(options_.demand_window);
    apply(*slot, fallback_capacity(opts, std::nullopt));  // until the first answer
    asio::post(strand_, [this, e = slot] {
      if (stopping_) {
        e->stop();
        return;
      }
      active_[e->id] = e;
      state_.add(e->id, e->options);
      driver_.reschedule();
    });
    return slot;
  }

  void detach(const std::shared_ptr<resource_entry>& e) {
    std::lock_guard lock(mutex_);
    if (--e->handles > 0) return;
    registry_.erase(e->id);
    asio::post(strand_, [this, e] {
      e->stop();  // its pending waits end: nothing will grant them any more
      if (stopping_) return;
      if (auto s = spend_of(*e)) spends_.push_back(std::move(*s));
      active_.erase(e->id);
      state_.remove(e->id);
      driver_.reschedule();
    });
  }

  /// Sets fixed wants for a resource (thread-safe).
  void set_wants(const std::shared_ptr<resource_entry>& e, double wants) {
    require_quantity(wants, "wants");
    e->wants = wants;
    asio::post(strand_, [this, e, wants] {
      if (!stopping_ && active_.count(e->id) != 0) state_.set_wants(e->id, wants);
    });
  }

  /// Sets the callback called (on the client's thread) with each new capacity of `e`.
  void on_change(const std::shared_ptr<resource_entry>& e, std::function<void(double)> f) {
    asio::post(strand_, [e, f = std::move(f)]() mutable { e->on_change = std::move(f); });
  }

 private:
  static client_options prepare(client_options o) {
    if (o.addresses.empty()) throw std::invalid_argument("client: no server addresses");
    for (const auto& a : o.addresses) {
      if (!net::parse_address(a)) {
        throw std::invalid_argument("client: expected host:port, got \"" + a + "\"");
      }
    }
    if (o.client_id.empty()) o.client_id = default_client_id();
    if (!(o.sample_interval.count() > 0)) o.sample_interval = seconds(1);
    if (!(o.throttled_headroom >= 1)) o.throttled_headroom = 1;
    return o;
  }

  static client_state_options state_options(const client_options& o) {
    client_state_options s;
    s.client_id = o.client_id;
    s.refresh.minimum_interval = o.minimum_refresh_interval;
    s.refresh.seed = std::random_device{}();
    s.log = o.log;
    return s;
  }

  static net::channel_options channel_options_of(const client_options& o) {
    return {.addresses = o.addresses, .call_timeout = o.call_timeout, .log = o.log, .tls = o.tls};
  }

  void log(const std::string& s) const {
    if (options_.log) options_.log(s);
  }

  void start() {
    next_sample_ = clock::now() + to_duration<clock::duration>(options_.sample_interval.count());
    last_sample_ = clock::now();
    asio::co_spawn(strand_, run(), asio::detached);
  }

  static void apply(resource_entry& e, double capacity) {
    if (e.kind == resource_kind::rate) {
      apply_capacity(e.rate, capacity, e.auto_burst);
    } else if (e.kind == resource_kind::gauge) {
      e.gauge.set_limit(capacity);
    } else if (!(capacity > 0)) {
      e.budget.close();  // its allotment ended (an allotment comes with its answer: adopt)
    }
    e.capacity = capacity;
  }

  // Pushes every resource's effective capacity into its limiter (on a change only).
  void push_capacities(clock::time_point now) {
    for (auto& [id, e] : active_) {
      const double c = state_.capacity(id, now);
      e->leased = state_.leased(id, now);
      if (e->estimate) e->wants = state_.find(id)->options.wants;  // a fast start raises them
      if (c == e->capacity.load() && !e->first_capacity) continue;
      e->first_capacity = false;
      apply(*e, c);
      if (c != 0) e->holding_back = false;
      e->wake();
      if (e->on_change) e->on_change(c);
    }
  }

  // Measures demand: for a rate, permits asked per second (admitted or not); for a gauge, the
  // peak in flight + waiting. A rate whose waiters were delayed asks for capacity × headroom,
  // at once: a throttled sample raises the wants past the moving average (which only brings
  // them down as demand falls), so a saturated client doubles its lease each refresh.
  // What the protected service answered (`resource_handle::record_answers`), into the state:
  // sent with the next refresh, and the client's own cut on a second of overloads.
  void record_signals(const std::string& id, const resource_entry& e, clock::time_point now) {
    const auto calls = e.answers.load(std::memory_order_relaxed);
    if (calls == 0 || e.kind == resource_kind::budget) return;
    const auto overloads = std::min(calls, e.overloads.load(std::memory_order_relaxed));
    state_.set_signals(id, {static_cast<double>(calls), static_cast<double>(overloads)}, now);
  }

  void sample(clock::time_point now) {
    const double span = to_seconds(now - last_sample_);
    last_sample_ = now;
    for (auto& [id, e] : active_) {
      record_signals(id, *e, now);
      if (!e->estimate || !(span > 0)) continue;
      if (e->kind == resource_kind::budget) {
        state_.set_wants(id, budget_wants(*e, span));
        continue;
      }
      bool throttled = false;
      double value = 0;
      if (e->kind == resource_kind::rate) {
        value = rate_sample(*e, span, throttled);
      } else {
        value = static_cast<double>(e->gauge.take_peak());
      }
      const double wants =
          sampled_wants(e->demand, value, span, throttled, e->kind == resource_kind::gauge,
                        e->options.headroom, e->options.min_wants);
      state_.set_wants(id, wants);  // shown by push_capacities
    }
  }

  // Permits asked for per second since the last sample; at least capacity × headroom when a
  // waiter was delayed (`throttled`).
  double rate_sample(resource_entry& e, double span, bool& throttled) const {
    const double attempted = e.rate.attempted();
    const std::uint64_t delayed = e.rate.delayed();
    throttled = delayed != e.throttled_seen;
    const double value = rate_demand(attempted - e.attempted_seen, span, throttled,
                                     e.capacity.load(), options_.throttled_headroom);
    e.attempted_seen = attempted;
    e.throttled_seen = delayed;
    return value;
  }

  // A budget's wants (`budget_wants`), from what its callers asked since the last sample.
  double budget_wants(resource_entry& e, double span) {
    const auto* r = state_.find(e.id);
    const bool leased = r != nullptr && r->lease;
    const double attempted = e.budget.attempted();
    const std::uint64_t refused = e.budget.refused();
    const bool throttled = refused != e.throttled_seen;
    const double asked = attempted - e.attempted_seen;
    e.attempted_seen = attempted;
    e.throttled_seen = refused;
    return doorman::budget_wants(
        e.demand, asked, span, throttled, leased ? r->lease->capacity : 0,
        leased ? to_seconds(r->lease->refresh_interval) : options_.sample_interval.count(),
        options_.sample_interval.count(), options_.throttled_headroom, e.options.headroom,
        e.options.min_wants);
  }

  // A budget's last report, for a release (none before the root named a window: nothing was
  // spent).
  std::optional<resource_spend> spend_of(resource_entry& e) {
    const auto* r = state_.find(e.id);
    if (e.kind != resource_kind::budget || r == nullptr || !r->budget.info) return std::nullopt;
    e.budget.close();
    return resource_spend{e.id, r->budget.info->window, e.budget.report()};
  }

  // Refreshes until stopped (the driver), then gives everything back and closes.
  asio::awaitable<void> run() {
    std::error_code ec;
    co_await driver_.async_run(asio::redirect_error(asio::use_awaitable, ec));
    std::vector<std::string> all;
    std::vector<resource_spend> spends = std::exchange(spends_, {});
    for (auto& s : std::exchange(spending_, {}))
      spends.push_back(std::move(s));
    for (const auto& [id, e] : active_) {
      all.push_back(id);
      if (auto s = spend_of(*e)) spends.push_back(std::move(*s));
    }
    for (auto& id : state_.take_releases())
      all.push_back(std::move(id));
    for (auto& id : std::exchange(releases_, {}))
      all.push_back(std::move(id));
    // A release cut short by the stop (its answer was not waited for) goes out again.
    for (auto& id : std::exchange(releasing_, {}))
      all.push_back(std::move(id));
    if (!all.empty()) {
      // Named, not braced inside co_await (GCC 12 destroys such a temporary twice).
      auto last = spends_for(all, std::move(spends));
      release_request release{options_.client_id, std::move(all), std::move(last)};
      net::call_options within{.follow_redirects = true, .timeout = options_.release_timeout};
      const auto reply =
          co_await channel_.call<methods::release_capacity>(std::move(release), std::move(within));
      if (!reply) log_release_failure(reply);
    }
    channel_.shutdown();
    finished_ = true;
    for (auto& f : std::exchange(when_finished_, {}))
      f();
  }

  // What the client sends: its releases first, then its refreshes.
  using next_call = std::variant<net::outgoing_call<methods::release_capacity>,
                                 net::outgoing_call<methods::get_capacity>>;

  // The client's side of its refresh driver: measures demand, pushes capacities into the
  // limiters, and sends releases first, then the state's refreshes.
  struct requester {
    client_core& c;
    refresh_step<clock::time_point> next(clock::time_point now) const { return c.next_step(now); }
    next_call request(clock::time_point now) const { return c.make_call(now); }
    asio::awaitable<void> on_reply(net::reply_of<methods::release_capacity> reply,
                                   clock::time_point) const {
      c.on_release(reply);
      co_return;
    }
    asio::awaitable<void> on_reply(net::reply_of<methods::get_capacity> reply,
                                   clock::time_point now) const {
      c.on_reply(std::move(reply), now);
      co_return;
    }
  };

  refresh_step<clock::time_point> next_step(clock::time_point now) {
    if (now >= next_sample_) {
      sample(now);
      next_sample_ = now + to_duration<clock::duration>(options_.sample_interval.count());
    }
    push_capacities(now);
    if (releases_.empty()) releases_ = state_.take_releases();
    if (!releases_.empty()) return {true, now};
    auto step = state_.next(now);
    if (!step.send) step.at = std::min(step.at, next_sample_);
    return step;
  }

  next_call make_call(clock::time_point now) {
    releasing_ = std::exchange(releases_, {});
    if (!releasing_.empty()) {
      spending_ = spends_for(releasing_, std::exchange(spends_, {}));
      return net::outgoing_call<methods::release_capacity>{
          {options_.client_id, releasing_, spending_}};
    }
    const seconds timeout = state_.call_timeout(now, options_.call_timeout);
    const auto read = coarse_clock::now();  // the budgets' reports (the callers' clock)
    for (auto& [id, e] : active_) {
      // The answers as of the send: the root takes rates over the time between reports.
      record_signals(id, *e, now);
      if (e->kind == resource_kind::budget)
        state_.set_spend(id, e->budget.report(), e->budget.left(read));
    }
    return net::outgoing_call<methods::get_capacity>{state_.make_request(now), timeout};
  }

  void log_release_failure(const net::call_status& reply) const {
    log(fmt::format("warning: client {}: release failed ({})", options_.client_id, reply.message));
  }

  // Not retried: the server lets the lease run out (a refresh must not wait behind it).
  void on_release(const net::call_status& reply) {
    releasing_.clear();
    spending_.clear();
    if (!reply) log_release_failure(reply);
  }

  // Each budget's new allotment, into its counter (before any caller sees the new capacity).
  void adopt_allotments() {
    if (stopping_) return;  // closed is closed
    for (auto& [id, e] : active_) {
      if (e->kind != resource_kind::budget) continue;
      const auto a = state_.take_allotment(id);
      const auto* r = state_.find(id);
      if (!a || r == nullptr || !r->lease) continue;
      // coarse_clock and steady_clock count from the same epoch (CLOCK_MONOTONIC*); ahead by
      // the coarse clock's lag, so that nothing is admitted past the lease's end.
      const coarse_clock::time_point expires(
          std::chrono::duration_cast<coarse_clock::duration>(r->lease->expiry.time_since_epoch()) -
          coarse_clock::resolution());
      e->budget.grant({a->units, a->spent_at_send, a->new_window, expires});
      e->wake();  // its asynchronous waits look again (the blocking ones are woken by grant)
    }
  }

  void on_reply(net::reply_of<methods::get_capacity> reply, clock::time_point now) {
    net::require_master(reply);
    const capacity_response& resp = reply.result;
    const refresh_event event =
        reply ? state_.on_reply(resp, now) : state_.on_reply(reply.error, now);
    adopt_allotments();
    connected_ = state_.failures() == 0;
    if (event == refresh_event::reached || event == refresh_event::regained) {
      log(fmt::format("client {}: server {} answered for {} resources", options_.client_id,
                      channel_.current(), resp.resources.size()));
    } else if (reply.error && state_.failures() == 1) {  // lost, or never reached
      log(fmt::format(
          "warning: client {}: refresh failed ({}); retrying, the leases held stay until they "
          "expire",
          options_.client_id, reply.message));
    }
  }

  std::unique_ptr<asio::io_context> own_io_;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  asio::strand<asio::any_io_executor> strand_;
  client_options options_;
  client_state state_;
  net::channel channel_;
  requester requester_{*this};
  net::refresh_driver<requester> driver_;
  std::thread thread_;

  std::mutex mutex_;     // guards registry_, the entries' handle counts and closed_
  bool closed_ = false;  // stop() was called
  std::map<std::string, std::shared_ptr<resource_entry>, std::less<>> registry_;

  // Touched only on the strand.
  std::map<std::string, std::shared_ptr<resource_entry>, std::less<>> active_;
  clock::time_point next_sample_{};
  clock::time_point last_sample_{};
  std::vector<std::string> releases_;     // to send before the next refresh
  std::vector<std::string> releasing_;    // those of the release in flight (none: a refresh)
  std::vector<resource_spend> spends_;    // the budgets' last reports, for the next release
  std::vector<resource_spend> spending_;  // those of the release in flight
  bool stopping_ = false;
  bool finished_ = false;                             // run() is over
  std::vector<std::function<void()>> when_finished_;  // async_stop's waiters
  std::atomic<bool> connected_{false};
};

}  // namespace doorman::detail
