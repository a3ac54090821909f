#pragma once

/// \file
/// The asio client: one connection to a tree position (several addresses, redirects,
/// reconnects with backoff and jitter), one refresh loop for all of the process's resources,
/// and the demand estimation that sets their wants. Users touch it through `rate_resource` and
/// `gauge_resource` (doorman/client/resource.hpp).
///
///     doorman::client client({.addresses = {"127.0.0.1:7700"}});  // runs its own thread
///     doorman::rate_resource api(client, "api");
///     for (;;) { api.wait(); call_the_api(); }
///
/// Embedding on an existing io_context instead: `doorman::client client(io.get_executor(),
/// options)`; call `stop()` and let the io_context finish before destroying it.

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
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <asio.hpp>
#include <nlohmann/json.hpp>

#include "doorman/core/client_state.hpp"
#include "doorman/core/linkage.hpp"
#include "doorman/limit/any_limiter.hpp"
#include "doorman/limit/demand_estimator.hpp"
#include "doorman/limit/gauge_limiter.hpp"
#include "doorman/limit/rate_limiter.hpp"
#include "doorman/net/channel.hpp"
#include "doorman/net/completion.hpp"
#include "doorman/net/refresh_driver.hpp"
#include "doorman/protocol/codec.hpp"

namespace doorman {

/// Options of a client, with their defaults.
struct client_options {
  std::vector<std::string> addresses;   ///< `host:port` of every task of the server position
  std::string client_id;                ///< default: `hostname:pid:n`, n distinct per client
  seconds minimum_refresh_interval{1};  ///< floor between two requests
  seconds call_timeout{5};              ///< one request, retries and redirects included
  seconds release_timeout{1};           ///< the `release_capacity` sent by `stop()`
  seconds sample_interval{1};           ///< how often demand is measured
  seconds demand_window{10};            ///< the moving average of measured demand
  /// While callers of a rate resource are made to wait (`wait`, `async_wait`), its measured
  /// wants are at least its capacity × this: a blocked caller attempts no more than the rate
  /// lets it, so its attempts alone would never ask for more. (Refused `try_acquire` calls are
  /// counted as attempts, which measures their demand directly.)
  double throttled_headroom = 2;
  std::function<void(std::string_view)> log{};  ///< one line per notable event; null: silent
  /// TLS to the servers (docs/security.md): `ca_file` the CAs the server's certificate must
  /// chain to, `cert_file`/`key_file` this client's certificate (mutual TLS), `server_name`
  /// the name the server's certificate must carry (default: the host dialled). All empty:
  /// plaintext; set `enabled` for TLS with the system's CAs and no certificate.
  net::tls_options tls{};
};

namespace detail {

/// The kind of local enforcement of a resource.
enum class resource_kind { rate, gauge };

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

/// A burst of 0 follows the capacity; until the first one, 1.
inline rate_algorithm_options with_burst(rate_algorithm_options o) noexcept {
  if (!(o.burst > 0)) o.burst = 1;
  return o;
}

/// What every handle to one resource id shares: the limiter, the demand, the capacity.
struct resource_entry : std::enable_shared_from_this<resource_entry> {
  resource_entry(asio::any_io_executor strand_, std::string id_, resource_kind kind_,
                 client_resource_options options_, bool estimate_, rate_algorithm_options local)
      : id(std::move(id_)),
        kind(kind_),
        options(options_),
        estimate(estimate_),
        rate(with_burst(local), 0),
        auto_burst(!(local.burst > 0)),
        gauge(0),
        strand(std::move(strand_)) {}

  const std::string id;
  const resource_kind kind;
  const client_resource_options options;
  const bool estimate;    // wants measured from use (else fixed by the user)
  any_rate_limiter rate;  // used when kind == rate
  const bool auto_burst;  // the burst follows the capacity
  gauge_limiter gauge;    // used when kind == gauge
  std::atomic<double> capacity{0};
  std::atomic<double> wants{0};
  std::atomic<bool> leased{false};
  const asio::any_io_executor strand;  // the client's
  // Requested when the client stops or the last handle goes: every wait, synchronous or
  // asynchronous, pending or later, ends with `operation_aborted`.
  std::stop_source stop_source;
  std::atomic<int> gauge_waiters{0};      // asynchronous acquires pending (read by releases)
  std::atomic<bool> holding_back{false};  // told the client (`held_back`) since capacity was 0
  std::function<void()> on_held_back;     // the client's, set before the entry is shared

  // Below: touched only by the client's loop.
  int handles = 0;  // guarded by the client's registry mutex
  demand_estimator demand;
  double attempted_seen = 0;
  std::uint64_t throttled_seen = 0;
  bool first_capacity = true;
  std::function<void(double)> on_change;    // the user's callback
  std::unordered_set<pending_wait*> waits;  // the asynchronous ones

  [[nodiscard]] bool stopped() const noexcept { return stop_source.stop_requested(); }

  // A caller is held back by a capacity of 0: with measured wants, the client asks for the
  // start wants (fast start; `client_state::hold_back`). Once per stretch at 0; lock-free
  // until then.
  void held_back() noexcept {
    if (!estimate || capacity.load(std::memory_order_relaxed) != 0) return;
    if (holding_back.exchange(true)) return;
    try {
      on_held_back();
    } catch (...) {
      holding_back = false;  // out of memory: the next caller tries again
    }
  }

  // The capacity changed or a slot was freed: the blocked waits look again.
  void wake() {
    for (auto* w : waits)
      if (w->blocked) w->timer.cancel();
  }

  // Ends every wait (on the strand).
  void stop() {
    stop_source.request_stop();
    for (auto* w : waits)
      w->cancel();
  }
};

class resource_handle;

inline std::string default_client_id() {
  static std::atomic<std::uint64_t> counter{0};
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return fmt::format("{}:{}:{}", host[0] ? host : "localhost", ::getpid(), counter++);
}

}  // namespace detail

class client {
 public:
  using clock = std::chrono::steady_clock;

  /// A client on its own thread and io_context (stopped and joined by the destructor).
  /// Throws `std::invalid_argument` on missing or malformed addresses.
  explicit client(client_options options)
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

  /// A client on `executor` (a strand is made over it). Call `stop()` and let the io_context
  /// run until the client is done before destroying it.
  client(asio::any_io_executor executor, client_options options)
      : strand_(asio::make_strand(executor)),
        options_(prepare(std::move(options))),
        state_(state_options(options_)),
        channel_(strand_, channel_options_of(options_)),
        driver_(strand_, requester_, channel_, "client refresh loop", options_.log) {
    start();
  }

  client(const client&) = delete;
  client& operator=(const client&) = delete;

  ~client() {
    if (own_io_) {
      stop();
      work_.reset();
      thread_.join();
    }
  }

  /// This client's id at the servers.
  [[nodiscard]] const std::string& id() const noexcept { return options_.client_id; }
  [[nodiscard]] const client_options& options() const noexcept { return options_; }

  /// Releases the capacity of every resource (one `release_capacity`, bounded by
  /// `release_timeout`), then closes the connection; limiters keep their last capacity.
  /// Thread-safe; idempotent.
  void stop() {
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

  /// Whether the last request was answered by a master.
  [[nodiscard]] bool connected() const noexcept { return connected_.load(); }

  /// Stops as `stop()` does, and completes `void(std::error_code)` through any asio completion
  /// token once the client is done: the release sent and answered, or `release_timeout`
  /// passed, and the connection closed. Cancelling it (the handler's cancellation slot) ends
  /// the wait early with `asio::error::operation_aborted`; the stop goes on.
  template <class CompletionToken>
  auto async_stop(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(std::error_code)>(
        [this](auto handler) {
          auto waiter = net::detail::make_completion(std::move(handler), strand_);
          waiter->cancel_completes();
          stop();
          asio::post(strand_, [this, waiter] {
            if (finished_) {
              waiter->complete({});
            } else {
              when_finished_.push_back([waiter] { waiter->complete({}); });
            }
          });
        },
        token);
  }

  /// Runs `f()` on the client's strand (for callbacks that must not race the loop).
  template <class F>
  void post(F f) {
    asio::post(strand_, std::move(f));
  }

  [[nodiscard]] asio::any_io_executor executor() const { return strand_; }

 private:
  friend class detail::resource_handle;

  /// A handle to the entry of `id`, shared with other handles to the same id (created with
  /// these options for the first one). Thread-safe.
  std::shared_ptr<detail::resource_entry> attach(std::string_view id, detail::resource_kind kind,
                                                 client_resource_options opts, bool estimate,
                                                 const rate_algorithm_options& local) {
    if (const char* problem = detail::id_problem(id)) {
      throw std::invalid_argument("resource id " + std::string(problem));
    }
    detail::require_quantity(opts.wants, "wants");
    std::lock_guard lock(mutex_);
    auto& slot = registry_[std::string(id)];
    if (slot) {
      if (slot->kind != kind) {
        throw std::invalid_argument("resource " + std::string(id) +
                                    " is already held as a different kind");
      }
      ++slot->handles;
      return slot;
    }
    slot = std::make_shared<detail::resource_entry>(strand_, std::string(id), kind, opts, estimate,
                                                    local);
    slot->handles = 1;
    slot->wants = opts.wants;
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

  /// Drops a handle; the last one releases the resource's capacity at the server and ends the
  /// waits still pending on it (`operation_aborted`).
  void detach(const std::shared_ptr<detail::resource_entry>& e) {
    std::lock_guard lock(mutex_);
    if (--e->handles > 0) return;
    registry_.erase(e->id);
    asio::post(strand_, [this, e] {
      e->stop();  // its pending waits end: nothing will grant them any more
      if (stopping_) return;
      active_.erase(e->id);
      state_.remove(e->id);
      driver_.reschedule();
    });
  }

  /// Sets fixed wants for a resource (thread-safe).
  void set_wants(const std::shared_ptr<detail::resource_entry>& e, double wants) {
    detail::require_quantity(wants, "wants");
    e->wants = wants;
    asio::post(strand_, [this, e, wants] {
      if (!stopping_ && active_.count(e->id) != 0) state_.set_wants(e->id, wants);
    });
  }

  /// Sets the callback called (on the client's thread) with each new capacity of `e`.
  void on_change(const std::shared_ptr<detail::resource_entry>& e, std::function<void(double)> f) {
    asio::post(strand_, [e, f = std::move(f)]() mutable { e->on_change = std::move(f); });
  }

  static client_options prepare(client_options o) {
    if (o.addresses.empty()) throw std::invalid_argument("client: no server addresses");
    for (const auto& a : o.addresses) {
      if (!net::parse_address(a)) {
        throw std::invalid_argument("client: expected host:port, got \"" + a + "\"");
      }
    }
    if (o.client_id.empty()) o.client_id = detail::default_client_id();
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

  DOORMAN_DECL void start();

  static void apply(detail::resource_entry& e, double capacity) {
    if (e.kind == detail::resource_kind::rate) {
      if (e.auto_burst) e.rate.set_burst(std::max(1.0, capacity * 0.1));
      e.rate.set_rate(capacity);
    } else {
      e.gauge.set_limit(capacity);
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
  void sample(clock::time_point now) {
    const double span = to_seconds(now - last_sample_);
    last_sample_ = now;
    for (auto& [id, e] : active_) {
      if (!e->estimate || !(span > 0)) continue;
      bool throttled = false;
      double value = 0;
      if (e->kind == detail::resource_kind::rate) {
        value = rate_sample(*e, span, throttled);
      } else {
        value = static_cast<double>(e->gauge.take_peak());
      }
      e->demand.add(value, seconds(span));
      double wants = e->demand.estimate();
      if (throttled) wants = std::max(wants, value);
      // Concurrency is whole operations: a gauge asks for the next whole number.
      if (e->kind == detail::resource_kind::gauge) wants = std::ceil(wants - 1e-6);
      // Within the protocol's bound, whatever was measured (set_wants refuses more).
      state_.set_wants(id, detail::bounded_quantity(wants));  // shown by push_capacities
    }
  }

  // Permits asked for per second since the last sample; at least capacity × headroom when a
  // waiter was delayed (`throttled`).
  double rate_sample(detail::resource_entry& e, double span, bool& throttled) const {
    const double attempted = e.rate.attempted();
    const std::uint64_t delayed = e.rate.delayed();
    double value = (attempted - e.attempted_seen) / span;
    throttled = delayed != e.throttled_seen;
    if (throttled) {
      value = std::max(value, std::max(e.capacity.load(), 1.0) * options_.throttled_headroom);
    }
    e.attempted_seen = attempted;
    e.throttled_seen = delayed;
    return value;
  }

  // Refreshes until stopped (the driver), then gives everything back and closes.
  DOORMAN_DECL asio::awaitable<void> run();

  // The client's side of its refresh driver: measures demand, pushes capacities into the
  // limiters, and sends releases first, then the state's refreshes.
  struct requester {
    client& c;
    refresh_step<clock::time_point> next(clock::time_point now) const { return c.next_step(now); }
    net::outgoing_call request(clock::time_point now) const { return c.next_call(now); }
    DOORMAN_DECL asio::awaitable<void> on_reply(net::call_reply reply, clock::time_point now) const;
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

  net::outgoing_call next_call(clock::time_point now) {
    releasing_ = std::exchange(releases_, {});
    if (!releasing_.empty()) return {"release_capacity", release_params(releasing_)};
    return {"get_capacity", nlohmann::json(state_.make_request(now))};
  }

  nlohmann::json release_params(std::vector<std::string> ids) const {
    return nlohmann::json(release_request{options_.client_id, std::move(ids)});
  }

  void log_release_failure(const net::call_reply& reply) const {
    log(fmt::format("warning: client {}: release failed ({})", options_.client_id, reply.message));
  }

  void on_reply(net::call_reply reply, clock::time_point now) {
    if (!releasing_.empty()) {
      releasing_.clear();
      // Not retried: the server lets the lease run out (a refresh must not wait behind it).
      if (!reply) log_release_failure(reply);
      return;
    }
    capacity_response resp;
    net::decode_refresh(reply, resp);
    const refresh_event event =
        reply ? state_.on_reply(resp, now) : state_.on_reply(reply.error, now);
    connected_ = state_.failures() == 0;
    if (event == refresh_event::reached || event == refresh_event::regained) {
      log(fmt::format("client {}: server {} answered for {} resources", options_.client_id,
                      channel_.current(), resp.resources.size()));
    } else if (reply.error && state_.failures() == 1) {  // lost, or never reached
      log(fmt::format(
          "warning: client {}: refresh failed ({}); leases run out, then the fallbacks apply",
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

  std::mutex mutex_;  // guards registry_ and the entries' handle counts
  std::map<std::string, std::shared_ptr<detail::resource_entry>, std::less<>> registry_;

  // Touched only on the strand.
  std::map<std::string, std::shared_ptr<detail::resource_entry>, std::less<>> active_;
  clock::time_point next_sample_{};
  clock::time_point last_sample_{};
  std::vector<std::string> releases_;   // to send before the next refresh
  std::vector<std::string> releasing_;  // those of the release in flight (none: a refresh)
  bool stopping_ = false;
  bool finished_ = false;                             // run() is over
  std::vector<std::function<void()>> when_finished_;  // async_stop's waiters
  std::atomic<bool> connected_{false};
};

}  // namespace doorman

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/client/impl/client.ipp"
#endif
