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
///
/// This header holds what a caller touches: the options, the state a resource's handles share
/// (its limiter, lock-free on the caller's thread) and the client's interface. The loop, the
/// channel and the client state live in `detail::client_core` (client/impl/client_core.hpp),
/// which only the definitions include: with `DOORMAN_SEPARATE_COMPILATION` a unit that
/// includes this header parses neither the network layer nor JSON (docs/building.md).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/post.hpp>

#include "doorman/core/client_resource.hpp"
#include "doorman/core/linkage.hpp"
#include "doorman/core/time.hpp"
#include "doorman/limit/any_limiter.hpp"
#include "doorman/limit/budget_counter.hpp"
#include "doorman/limit/demand_estimator.hpp"
#include "doorman/limit/gauge_limiter.hpp"
#include "doorman/net/completion.hpp"
#include "doorman/net/tls_options.hpp"

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
enum class resource_kind { rate, gauge, budget };

struct pending_wait;  // one asynchronous wait (client/impl/client_core.hpp)
class client_core;

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
  const bool estimate;      // wants measured from use (else fixed by the user)
  any_rate_limiter rate;    // used when kind == rate
  const bool auto_burst;    // the burst follows the capacity
  gauge_limiter gauge;      // used when kind == gauge
  budget_counter<> budget;  // used when kind == budget
  std::atomic<double> capacity{0};
  std::atomic<double> wants{0};
  std::atomic<bool> leased{false};
  // What the protected service answered the calls (`record_answers`), in all.
  std::atomic<std::uint64_t> answers{0};
  std::atomic<std::uint64_t> overloads{0};
  const asio::any_io_executor strand;  // the client's
  // Requested when the client stops (by `stop()` itself, before it returns) or the last handle
  // goes: the handles admit nothing from then on, whatever the limiter still holds, and every
  // wait, synchronous or asynchronous, pending or later, ends with `operation_aborted`.
  std::stop_source stop_source;
  std::atomic<int> async_waiters{0};      // asynchronous waits of a gauge or a budget (read by a
                                          // gauge's releases and a budget's refunds)
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
    if (!estimate || capacity.load(std::memory_order_relaxed) != 0 || stopped()) return;
    if (holding_back.exchange(true)) return;
    try {
      on_held_back();
    } catch (...) {
      holding_back = false;  // out of memory: the next caller tries again
    }
  }

  // The capacity changed or a slot was freed: the blocked waits look again (on the strand).
  DOORMAN_DECL void wake();

  // Ends every wait (on the strand; `stop_source.request_stop()` alone, on any thread, ends
  // the admissions and the synchronous waits).
  DOORMAN_DECL void stop();
};

class resource_handle;

}  // namespace detail

class client {
 public:
  using clock = std::chrono::steady_clock;

  /// A client on its own thread and io_context (stopped and joined by the destructor).
  /// Throws `std::invalid_argument` on missing or malformed addresses.
  DOORMAN_DECL explicit client(client_options options);

  /// A client on `executor` (a strand is made over it). Call `stop()` and let the io_context
  /// run until the client is done before destroying it.
  DOORMAN_DECL client(asio::any_io_executor executor, client_options options);

  client(const client&) = delete;
  client& operator=(const client&) = delete;

  DOORMAN_DECL ~client();

  /// This client's id at the servers.
  [[nodiscard]] const std::string& id() const noexcept { return options().client_id; }
  [[nodiscard]] DOORMAN_DECL const client_options& options() const noexcept;

  /// Releases the capacity of every resource (one `release_capacity`, bounded by
  /// `release_timeout`), then closes the connection; limiters keep their last capacity.
  /// Thread-safe; idempotent.
  DOORMAN_DECL void stop();

  /// Whether the last request was answered by a master.
  [[nodiscard]] DOORMAN_DECL bool connected() const noexcept;

  /// Stops as `stop()` does, and completes `void(std::error_code)` through any asio completion
  /// token once the client is done: the release sent and answered, or `release_timeout`
  /// passed, and the connection closed. Cancelling it (the handler's cancellation slot) ends
  /// the wait early with `asio::error::operation_aborted`; the stop goes on.
  template <class CompletionToken>
  auto async_stop(CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(std::error_code)>(
        [this](auto handler) {
          auto waiter = net::detail::make_completion(std::move(handler), executor());
          waiter->cancel_completes();
          when_stopped([waiter] { waiter->complete({}); });
        },
        token);
  }

  /// Runs `f()` on the client's strand (for callbacks that must not race the loop).
  template <class F>
  void post(F f) {
    asio::post(executor(), std::move(f));
  }

  /// The client's strand.
  [[nodiscard]] DOORMAN_DECL asio::any_io_executor executor() const;

 private:
  friend class detail::resource_handle;

  /// A handle to the entry of `id`, shared with other handles to the same id (created with
  /// these options for the first one). Thread-safe.
  DOORMAN_DECL std::shared_ptr<detail::resource_entry> attach(std::string_view id,
                                                              detail::resource_kind kind,
                                                              client_resource_options opts,
                                                              bool estimate,
                                                              const rate_algorithm_options& local);

  /// Drops a handle; the last one releases the resource's capacity at the server and ends the
  /// waits still pending on it (`operation_aborted`).
  DOORMAN_DECL void detach(const std::shared_ptr<detail::resource_entry>& e);

  /// Sets fixed wants for a resource (thread-safe).
  DOORMAN_DECL void set_wants(const std::shared_ptr<detail::resource_entry>& e, double wants);

  /// Sets the callback called (on the client's thread) with each new capacity of `e`.
  DOORMAN_DECL void on_change(const std::shared_ptr<detail::resource_entry>& e,
                              std::function<void(double)> f);

  /// Stops, then calls `f()` on the strand once the client is done.
  DOORMAN_DECL void when_stopped(std::function<void()> f);

  std::unique_ptr<detail::client_core> core_;
};

}  // namespace doorman

#if defined(DOORMAN_HEADER_ONLY)
#include "doorman/client/impl/client.ipp"
#endif
