#pragma once

/// \file
/// A deterministic discrete-event simulation of a whole capacity tree on a virtual clock.
///
/// The nodes are the core's `basic_engine` and `basic_upstream`, the clients its
/// `basic_client_state`: the very objects the node and the client run, driven here by an event
/// queue instead of timers and sockets. Messages travel through an in-memory network with a
/// latency, a jitter and a loss rate; a caller that hears nothing gives up after a timeout, as
/// the real transports do.
///
///     doorman::sim::simulation s({.config = config_json});
///     auto root = s.add_job("root", std::nullopt);
///     auto dc = s.add_job("dc-1", root);
///     auto c = s.add_client("c-1", dc, 110);
///     s.at(120.0, [&] { s.lose_master(root, 20.0); });
///     s.run_until(doorman::sim::at(600.0));
///
/// Each position of the tree is a *job* of tasks that elect their master as the node's do: each
/// runs the node's `election_campaign` against the job's model of etcd (`etcd_model`). The
/// acting master holds the job's engine; a new master starts empty, in learning mode. Same
/// options and seed, same run, bit for bit (invariant 4 of docs/design.md): no wall clock, no
/// unordered iteration, and the random numbers come from the seed alone.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "doorman/core/backoff.hpp"
#include "doorman/core/call.hpp"
#include "doorman/core/client_state.hpp"
#include "doorman/core/election_campaign.hpp"
#include "doorman/core/engine.hpp"
#include "doorman/core/failover.hpp"
#include "doorman/core/time.hpp"
#include "doorman/core/upstream.hpp"
#include "doorman/sim/etcd_model.hpp"

namespace doorman::sim {

using clock_type = manual_clock;
using time_point = clock_type::time_point;
using duration = clock_type::duration;
using engine_type = basic_engine<clock_type>;
using upstream_type = basic_upstream<engine_type>;
using client_state_type = basic_client_state<clock_type>;

/// The simulated time `s` seconds after the start.
[[nodiscard]] inline time_point at(double s) noexcept {
  return time_point{to_duration<duration>(s)};
}

/// Seconds since the start.
[[nodiscard]] inline double seconds_of(time_point t) noexcept {
  return to_seconds(t.time_since_epoch());
}

/// The in-memory network. Times in seconds.
struct network_options {
  double latency = 0.001;  ///< one way
  double jitter = 0;       ///< a uniform extra delay in [0, jitter], one way
  double loss = 0;         ///< probability that a message is lost, each way
  /// Probability that a request reaches the master twice (a retransmitted copy): both copies
  /// are decided, the caller hears the second answer.
  double duplicate = 0;
  double timeout = 1;  ///< a caller that heard nothing gives up after this
};

/// Thrown by a run with `check_invariants` when an invariant of docs/design.md fails.
class invariant_violation : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Options of a simulation, with their defaults.
struct simulation_options {
  /// The resource configuration of every job (JSON, as a node reads it). The root's capacity
  /// comes from it; the other jobs take their capacity and algorithm from their parent.
  std::string config;
  std::string resource = "resource";  ///< the one resource every client asks for
  network_options network{};
  engine_options engine{};                    ///< every job's (is_root is set per job)
  upstream_options upstream{};                ///< every intermediate's (server_id: the job's name)
  client_state_options client{};              ///< every client's (client_id and seed per client)
  client_resource_options client_resource{};  ///< priority and fallback of every client
  std::uint64_t seed = 1;
  /// Tasks per job. With more than one, one is master and the others redirect to it, and every
  /// requester keeps a `failover` machine over them (as `net::channel` does): a timed-out,
  /// refused or redirected request moves it, and its backoff delays the next.
  std::size_t tasks = 1;
  /// The TTL of every job's election lease, in seconds: a paused or hung master's term
  /// (`election_term`, from its last renewal) ends a margin before the lease runs out, and
  /// another task wins one poll (TTL / 5) after it has.
  double election_ttl = 10;
  /// Whether a master answers only inside its term. Off only to show what fencing prevents.
  bool fencing = true;
  /// Whether every master keeps a record in the election store that outlives its leases, as a
  /// node electing in etcd does (`etcd_election_options::record_cover`): a task that wins with
  /// no earlier master's record alive skips learning mode. Off by default, as the published
  /// scenarios were run.
  bool election_record = false;
  /// How far a master's clock may run from the election store's, as a fraction (each master
  /// draws its rate in [1 - e, 1 + e] when elected): its term ends when its own clock says,
  /// which is later in real time when its clock is slow. The term's margin covers rates that
  /// differ by less than a tenth (docs/high-availability.md).
  double clock_rate_error = 0;
  failover_options failover{};  ///< every requester's (with `tasks` > 1)
  call_options call{};          ///< every requester's calls (with `tasks` > 1)
  /// The retry delay a refusing job names (a node's over-limit refusal names 1 s by default).
  double refused_retry_after = 1;
  /// Checks after every decision that no lease outlives its granter's, and that outside
  /// learning mode a decision never adds to what a node has granted beyond its capacity.
  /// O(clients of the node) per decision: for tests.
  bool check_invariants = false;
  /// Checks invariant 1 tree-wide whenever a client's lease changes (the only moments the
  /// tree's total can grow): the sum of what the clients may use, answers of deposed masters
  /// included, never exceeds the root's capacity. O(clients) per answer: for tests.
  bool check_tree = false;
};

/// The exchange a requester (a client, or an intermediate facing its parent) has with the job
/// it asks: at most one request in flight.
struct exchange {
  std::uint32_t wake_generation = 0;  ///< of the wake-up pending (older ones are stale)
  std::uint32_t request_number = 0;
  std::uint32_t in_flight = 0;  ///< the request number awaited, 0 for none
  time_point sent{};
  duration timeout{};            ///< of the request in flight (bounded by the leases held)
  std::uint64_t epoch_seen = 0;  ///< the master epoch of the job it asked last
  failure why = failure::hung;   ///< how the request in flight fails, if it does
  /// What the answer on its way says of its sender: the master (nothing), a non-master naming
  /// the master, or (an empty name) a non-master that knows none.
  std::optional<std::string> not_master;
  /// Which task of the job to ask, and when (with `simulation_options::tasks` > 1).
  std::optional<failover<time_point>> route;
  /// The call under way over `route`: the machine `net::channel` drives, driven here.
  std::optional<call_machine<time_point>> call;
};

/// A request waiting in the socket of a paused task, answered when it resumes.
struct queued_request {
  bool from_node = false;  ///< an intermediate's, else a client's
  std::size_t who = 0;
  std::uint32_t number = 0;
  std::variant<capacity_request, server_capacity_request> request;
};

/// One task of a job: a process that campaigns for mastership with the real campaign machine
/// (`election_campaign`) against its job's model of etcd, on a clock of its own.
struct task {
  using campaign_type = election_campaign<time_point>;
  std::optional<campaign_type> campaign;  ///< none while the process is down
  campaign_type::action doing{};          ///< the campaign's action under way
  std::uint32_t generation = 0;           ///< of `doing`'s events (older ones are stale)
  campaign_type::outcome answer;          ///< what came of `doing`
  /// Whether it takes itself for master: since the campaign reported so, until it reported
  /// otherwise (without fencing: until it learnt another holder).
  bool believes = false;
  bool paused = false;
  bool hung = false;
  time_point etcd_cut_until{};  ///< its link to etcd is cut until then (`cut_election`)
  double clock_rate = 1;        ///< its clock against real time, since `base_real`
  time_point base_real{};
  time_point base_local{};
  /// A master's engine it keeps while it is not the job's acting master (paused, or deposed
  /// while it still believes): it answers what reaches the task, fenced by the task's term.
  std::unique_ptr<engine_type> engine;
  std::vector<queued_request> queued;  ///< requests waiting in a paused task's socket
};

/// One task group at one position of the tree.
struct job {
  std::string name;
  std::optional<std::size_t> parent;
  int level = 0;                            ///< 0 at the root
  std::unique_ptr<engine_type> engine;      ///< the acting master's; null while there is none
  std::unique_ptr<upstream_type> upstream;  ///< the acting master's, below the root
  std::uint64_t epoch = 0;                  ///< bumped whenever the acting master changes
  std::uint64_t requests = 0;               ///< requests received (any method)
  std::uint64_t elections = 0;
  exchange up;                             ///< with the parent
  time_point wake_at = time_point::max();  ///< of the wake-up pending
  std::size_t master_task = 0;             ///< the acting master's task (when `engine`)
  time_point elected_at{};                 ///< when it became the acting master
  std::vector<task> tasks;
  etcd_model etcd;  ///< the store the tasks elect through
  /// Tasks watching the key: (task, generation of its watch).
  std::vector<std::pair<std::size_t, std::uint32_t>> watchers;
  // Faults (`lose_master`, `hang_answers`, `cut_clients`, `cut_parent`, `refuse`; the others
  // are the tasks'):
  bool down = false;  ///< every task down (`lose_master`)
  time_point down_since{};
  duration quiet{};  ///< how long the position was unreachable, for its next master
  time_point refusing_until{};
  time_point answers_hung_until{};    ///< its master answers no one until then (`hang_answers`)
  time_point clients_cut_until{};     ///< the links from its clients
  time_point parent_cut_until{};      ///< the link to its parent
  std::uint64_t in_flight_epoch = 0;  ///< this job's epoch when the request went out
  server_capacity_request request;
  server_capacity_response response;
};

/// One simulated client process holding the one resource. Its state is kept in place (not
/// behind a pointer): a large run visits clients in random order, and every separate block is
/// one more cache miss per event.
struct client {
  bool active = false;
  bool wants_changed = false;  ///< to hand to `state` before the next request
  exchange up;                 ///< with its job
  std::size_t job = 0;
  double wants = 0;
  const client_state_type::resource* held = nullptr;  ///< the resource in `state`
  std::optional<client_state_type> state;
  capacity_request request;
  capacity_response response;
  std::string name;
};

/// The simulation: jobs, clients, the network and the event queue.
class simulation {
 public:
  explicit simulation(simulation_options options)
      : options_(std::move(options)),
        config_(engine_type::parse_config(options_.config)),
        random_(options_.seed) {}

  simulation(const simulation&) = delete;
  simulation& operator=(const simulation&) = delete;

  [[nodiscard]] const simulation_options& options() const noexcept { return options_; }
  [[nodiscard]] time_point now() const noexcept { return clock_.now(); }
  /// The simulated clock (for objects that read it, such as a client's limiter).
  [[nodiscard]] const clock_type& clock() const noexcept { return clock_; }

  /// Adds a job under `parent` (none: the root) of `simulation_options::tasks` tasks, which
  /// campaign at once (task 0 wins). Returns its index.
  std::size_t add_job(std::string name, std::optional<std::size_t> parent) {
    if (parent && *parent >= jobs_.size()) throw std::out_of_range("add_job: no such parent");
    job j;
    j.name = std::move(name);
    j.parent = parent;
    j.level = parent ? jobs_[*parent].level + 1 : 0;
    if (options_.tasks > max_tasks) throw std::invalid_argument("simulation: more than 256 tasks");
    j.tasks.resize(std::max<std::size_t>(options_.tasks, 1));
    jobs_.push_back(std::move(j));
    const std::size_t index = jobs_.size() - 1;
    // The tree stands when the run begins: each task's first round is answered at once, in
    // task order (task 0 wins).
    for (std::size_t t = 0; t < jobs_[index].tasks.size(); ++t)
      start_task(index, t, true);
    return index;
  }

  /// Adds a client of `job` wanting `wants`, arriving now. Returns its index.
  std::size_t add_client(std::string name, std::size_t job_index, double wants) {
    if (job_index >= jobs_.size()) throw std::out_of_range("add_client: no such job");
    client c;
    c.name = std::move(name);
    c.job = job_index;
    clients_.push_back(std::move(c));
    standing_.emplace_back();
    const std::size_t index = clients_.size() - 1;
    arrive(index, wants);
    return index;
  }

  /// A client that left comes back (a new process with the same id), wanting `wants`.
  void arrive(std::size_t index, double wants) {
    client& c = clients_.at(index);
    client_state_options o = options_.client;
    o.client_id = c.name;
    o.refresh.seed = mix(options_.seed, 0xc1, index);
    c.state.emplace(o);
    c.wants = wants;
    c.active = true;
    c.up.in_flight = 0;
    c.up.route = route(mix(options_.seed, 0xfa, index));
    client_resource_options r = options_.client_resource;
    r.wants = wants;
    c.state->add(options_.resource, r);
    c.held = c.state->find(options_.resource);
    c.wants_changed = false;
    stand(index);
    client_side{*this, index}.wake_at(now());
  }

  /// The client leaves: it releases its capacity (one message, not retried) and stops.
  void leave(std::size_t index) {
    client& c = clients_.at(index);
    if (!c.active) return;
    c.active = false;
    c.up.in_flight = 0;
    ++c.up.wake_generation;
    c.held = nullptr;
    c.state.reset();
    stand(index);
    if (lost()) return;
    schedule(now() + one_way(), kind::client_release, index, 0);
  }

  /// Sets what a client wants (sent with its next refresh).
  void set_wants(std::size_t index, double wants) {
    client& c = clients_.at(index);
    c.wants = std::max(0.0, wants);
    c.wants_changed = true;  // only a request carries it: handed over then ...
    if (c.active && options_.client_resource.mode == fallback::optimistic) {
      c.state->set_wants(options_.resource, c.wants);  // ... unless the fallback uses it
      c.wants_changed = false;
      stand(index);
    } else if (c.active) {
      // Only the wants change (so a drift of every client costs no cache miss per client).
      standing_[index].wants = c.wants;
    }
  }

  /// Every task of the job is down for `for_seconds` (their processes gone, their election
  /// leases left to run out): requests to the job go unanswered; then they start again and
  /// campaign, and the winner starts empty, in learning mode.
  void lose_master(std::size_t index, double for_seconds) {
    job& j = jobs_.at(index);
    if (j.down) return;  // already down: the earlier loss decides when it comes back
    j.down = true;
    j.down_since = now();
    for (task& k : j.tasks)
      crash(k);
    step_down(j);
    at(seconds_of(now()) + std::max(0.0, for_seconds), [this, index] {
      job& k = jobs_[index];
      k.down = false;
      // The master that returns knows how long the position was unreachable: nobody was
      // granted anything meanwhile, so its learning mode is that much shorter.
      k.quiet = now() - k.down_since;
      for (std::size_t t = 0; t < k.tasks.size(); ++t)
        start_task(index, t);
    });
  }

  /// The acting master stops (a restart): it steps down, revokes its election lease so that
  /// another task wins at once (empty, in learning mode), and campaigns again a period later
  /// (the job's only task: at once, and wins again).
  void elect_master(std::size_t index) {
    job& j = jobs_.at(index);
    if (!j.engine) return;
    const std::size_t t = j.master_task;
    task& k = j.tasks[t];
    step_down(j);
    k.believes = false;
    step(index, t, k.campaign->stop(local(k)));
  }

  /// The job's acting master is paused for `for_seconds` (SIGSTOP), then resumes. Requests
  /// that reach it wait in its socket, and its campaign stands still: its election lease runs
  /// out `election_ttl` after its last renewal and a standby wins. On resume it answers what
  /// waited, each fenced by its term (`election_term`, as the node does), and its campaign
  /// goes on from where it stood.
  void pause_master(std::size_t index, double for_seconds) {
    job& j = jobs_.at(index);
    if (!j.engine) return;
    const std::size_t t = j.master_task;
    task& k = j.tasks[t];
    k.paused = true;
    ++k.generation;  // what the campaign waited for is heard on resume
    step_down(j, &k.engine);
    const std::uint32_t generation = k.generation;
    at(seconds_of(now()) + std::max(0.0, for_seconds),
       [this, index, t, generation] { resume(index, t, generation); });
  }

  /// The job's acting master hangs: it accepts requests and answers none, and renews nothing;
  /// a standby wins once its election lease has run out. A supervisor restarts it after
  /// `restart_after` seconds (negative: never).
  void hang_master(std::size_t index, double restart_after = -1) {
    job& j = jobs_.at(index);
    if (!j.engine) return;
    const std::size_t t = j.master_task;
    task& k = j.tasks[t];
    k.hung = true;
    ++k.generation;
    step_down(j);
    if (restart_after < 0) return;
    const std::uint32_t generation = k.generation;
    at(seconds_of(now()) + restart_after, [this, index, t, generation] {
      task& h = jobs_[index].tasks[t];
      if (!h.hung || h.generation != generation || jobs_[index].down) return;
      start_task(index, t);  // a new process
    });
  }

  /// The job's acting master loses the election store (etcd) for `for_seconds`, and only
  /// that: it still answers its requesters. Its renewals fail, so its campaign steps down when
  /// its term ends, and it answers that it knows no master until the link heals; a standby
  /// wins once the election lease has run out at the store. A cut that heals within the term
  /// changes nothing.
  void cut_election(std::size_t index, double for_seconds) {
    job& j = jobs_.at(index);
    if (!j.engine) return;
    j.tasks[j.master_task].etcd_cut_until =
        now() + to_duration<duration>(std::max(0.0, for_seconds));
  }

  /// The job's master stops answering its requesters for `for_seconds` (it accepts their
  /// requests and answers none) while it keeps renewing its election: a master whose client
  /// door is wedged but whose etcd session is not. Nothing in the tree detects it; the
  /// requesters' leases run out as they would with the master gone, and no other task takes
  /// over (docs/high-availability.md).
  void hang_answers(std::size_t index, double for_seconds) {
    jobs_.at(index).answers_hung_until = now() + to_duration<duration>(std::max(0.0, for_seconds));
  }

  /// Every message between the job and its clients is lost for `for_seconds`.
  void cut_clients(std::size_t index, double for_seconds) {
    jobs_.at(index).clients_cut_until = now() + to_duration<duration>(for_seconds);
  }

  /// Every message between the job and its parent is lost for `for_seconds`.
  void cut_parent(std::size_t index, double for_seconds) {
    jobs_.at(index).parent_cut_until = now() + to_duration<duration>(for_seconds);
  }

  /// Every task of the job refuses connections for `for_seconds`: a request fails at once.
  void refuse(std::size_t index, double for_seconds) {
    jobs_.at(index).refusing_until = now() + to_duration<duration>(for_seconds);
  }

  /// Runs `f` at `seconds` after the start (in the order scheduled among equal times).
  void at(double seconds, std::function<void()> f) {
    actions_.push_back(std::move(f));
    schedule(std::max(now(), sim::at(seconds)), kind::action, actions_.size() - 1, 0);
  }

  /// Processes every event up to and including `end`; the clock then reads `end`.
  void run_until(time_point end) {
    while (!queue_.empty() && queue_.top().t <= end) {
      const event e = queue_.top();
      queue_.pop();
      clock_.set(e.t);
      dispatch(e);
    }
    if (end > clock_.now()) clock_.set(end);
  }

  [[nodiscard]] const std::vector<job>& jobs() const noexcept { return jobs_; }
  [[nodiscard]] const std::vector<client>& clients() const noexcept { return clients_; }

  /// What client `index` may use now: its lease, or its fallback (−1, unlimited, counts as its
  /// wants); 0 when it is gone.
  [[nodiscard]] double effective_capacity(std::size_t index) const {
    return standing_[index].at(now());
  }

  /// Whether client `index` holds an unexpired lease now (of any capacity, 0 included).
  [[nodiscard]] bool leased(std::size_t index) const { return now() < standing_[index].until; }

  /// The sum of `effective_capacity` over all clients, in index order.
  [[nodiscard]] double total_granted() const noexcept {
    return sum_over(standing_, [t = now()](const standing& s) { return s.at(t); });
  }

  /// The sum of what the clients present want, in index order.
  [[nodiscard]] double total_wants() const noexcept {
    return sum_over(standing_, &standing::wants);
  }

  /// The capacity of the tree: the root's configured capacity for the resource.
  [[nodiscard]] double capacity() const { return config_.find(options_.resource).capacity; }

  /// The root's capacity for the resource now: a learned one as its acting master holds it
  /// (docs/learned-capacity.md), else the configured one; the configured one while the root
  /// has no master.
  [[nodiscard]] double root_capacity() const {
    for (const job& j : jobs_) {
      if (j.level == 0 && j.engine) return j.engine->capacity(options_.resource, now());
    }
    return capacity();
  }

  /// What client `index`'s calls to the protected service met, in all (the driver's counts):
  /// sent with its next refresh, and its own cut while it waits (`set_signals`).
  void set_signals(std::size_t index, const overload_signals& signals) {
    client& c = clients_.at(index);
    if (!c.active) return;
    const time_point before = c.state->next_request();
    c.state->set_signals(options_.resource, signals, now());
    // A second of overloads brings the next request forward, as a real client's driver does.
    const time_point after = c.state->next_request();
    if (after < before && c.up.in_flight == 0) client_side{*this, index}.wake_at(after);
  }

  /// What client `index`'s limiter enforces now: its state's capacity (a cut of its own
  /// included), 0 when it is gone; unlimited (−1) counts as its wants.
  [[nodiscard]] double client_capacity(std::size_t index) const {
    const client& c = clients_.at(index);
    if (!c.active) return 0;
    const double x = c.state->capacity(options_.resource, now());
    return x < 0 ? c.wants : x;
  }

  /// Whether any master is in learning mode now.
  [[nodiscard]] bool learning() const {
    return std::any_of(jobs_.begin(), jobs_.end(), [&](const job& j) {
      return j.engine && j.engine->learning(options_.resource, now());
    });
  }

  /// Events processed so far.
  [[nodiscard]] std::uint64_t events() const noexcept { return events_; }

  /// A uniform number in [0, 1) from the simulation's generator (for scenario scripts, so that
  /// they repeat with the seed).
  double uniform() noexcept { return random_.uniform(); }

 private:
  enum class kind : std::uint8_t {
    action,
    client_wake,
    client_arrives,  // a client's get_capacity reaches its job
    client_answer,   // the answer reaches the client
    client_timeout,  // the client gives up on its request
    client_release,  // a leaving client's release_capacity reaches its job
    node_wake,
    node_arrives,  // an intermediate's get_server_capacity reaches its parent
    node_answer,
    node_timeout,
    task_step,    // what a task's campaign waited for: an answer of etcd, a deadline, a wake-up
    etcd_call,    // a task's call reaches its job's etcd
    etcd_expiry,  // a lease of a job's etcd may have run out
  };
  // The pending events, earliest first (among equal times, in the order scheduled).
  //
  // A large run keeps one wake-up per client pending, and a heap of them all was a third of
  // its time, most of it cache misses. So events wait in buckets of 2^24 ns (about 17 ms),
  // each a list in the order scheduled, on a ring of 4 096 buckets (68 s); later ones wait in
  // a heap. When the clock reaches a bucket, its events are sorted into a run that is then
  // consumed in order; events scheduled into the current bucket meanwhile (network messages)
  // go to a small heap. Everything in the run and the small heap is earlier than everything
  // outside them, so the earlier of their two fronts is the earliest event.
  class event_queue {
   public:
    struct entry {
      time_point t;
      std::uint64_t order;  // sequence number << 8 | kind
      std::uint32_t who;
      std::uint32_t tag;
      [[nodiscard]] kind what() const noexcept { return static_cast<kind>(order & 0xff); }
    };

    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

    // The earliest event; the queue must not be empty.
    [[nodiscard]] const entry& top() {
      while (run_at_ == run_.size() && near_.empty())
        advance();
      return from_run() ? run_[run_at_] : near_.front();
    }

    // Removes the earliest event (after `top`).
    void pop() noexcept {
      if (from_run()) {
        ++run_at_;
      } else {
        pop_heap(near_);
      }
      --size_;
    }

    void push(time_point t, kind k, std::uint32_t who, std::uint32_t tag) {
      const entry e{t, (seq_++ << 8) | static_cast<std::uint64_t>(k), who, tag};
      ++size_;
      const std::int64_t b = bucket_of(t);
      if (b < next_) {
        push_heap(near_, e);
      } else if (b < next_ + ring_size) {
        append(b, e);
      } else {
        push_heap(far_, e);
      }
    }

   private:
    static constexpr int bucket_bits = 24;
    static constexpr std::int64_t ring_size = 4096;
    static constexpr std::size_t arity = 4;

    static std::int64_t bucket_of(time_point t) noexcept {
      return t.time_since_epoch().count() >> bucket_bits;
    }

    static bool before(const entry& a, const entry& b) noexcept {
      return a.t != b.t ? a.t < b.t : a.order < b.order;
    }

    [[nodiscard]] bool from_run() const noexcept {
      if (run_at_ == run_.size()) return false;
      return near_.empty() || before(run_[run_at_], near_.front());
    }

    // Sorts the next bucket (and the far events now within reach) into the run; called when
    // the run and the small heap are both empty.
    void advance() {
      if (in_ring_ == 0 && !far_.empty()) next_ = std::max(next_, bucket_of(far_.front().t));
      list& bucket = ring_[static_cast<std::size_t>(next_) & (ring_size - 1)];
      ++next_;
      run_.clear();
      run_at_ = 0;
      for (std::uint32_t i = bucket.head; i != none;) {
        node& n = pool_[i];
        run_.push_back(n.e);
        const std::uint32_t next = n.next;
        n.next = free_;
        free_ = i;
        i = next;
      }
      in_ring_ -= run_.size();
      bucket = {};
      while (!far_.empty() && bucket_of(far_.front().t) < next_) {
        run_.push_back(far_.front());
        pop_heap(far_);
      }
      std::sort(run_.begin(), run_.end(), before);
    }

    void append(std::int64_t b, const entry& e) {
      std::uint32_t i = free_;
      if (i != none) {
        free_ = pool_[i].next;
        pool_[i] = {e, none};
      } else {
        i = static_cast<std::uint32_t>(pool_.size());
        pool_.push_back({e, none});
      }
      list& bucket = ring_[static_cast<std::size_t>(b) & (ring_size - 1)];
      if (bucket.head == none) {
        bucket.head = i;
      } else {
        pool_[bucket.tail].next = i;
      }
      bucket.tail = i;
      ++in_ring_;
    }

    static void push_heap(std::vector<entry>& heap, const entry& e) {
      std::size_t hole = heap.size();
      heap.push_back(e);
      while (hole > 0) {
        const std::size_t parent = (hole - 1) / arity;
        if (!before(e, heap[parent])) break;
        heap[hole] = heap[parent];
        hole = parent;
      }
      heap[hole] = e;
    }

    static void pop_heap(std::vector<entry>& heap) noexcept {
      const entry last = heap.back();
      heap.pop_back();
      const std::size_t n = heap.size();
      if (n == 0) return;
      std::size_t hole = 0;
      for (;;) {
        const std::size_t first = hole * arity + 1;
        if (first >= n) break;
        std::size_t best = first;
        const std::size_t end = std::min(first + arity, n);
        for (std::size_t c = first + 1; c < end; ++c) {
          if (before(heap[c], heap[best])) best = c;
        }
        if (!before(heap[best], last)) break;
        heap[hole] = heap[best];
        hole = best;
      }
      heap[hole] = last;
    }

    // A bucket is a list of nodes, in the order scheduled; the nodes come from one pool, so the
    // memory is that of the events pending, however unevenly they fall into buckets.
    static constexpr std::uint32_t none = std::numeric_limits<std::uint32_t>::max();
    struct node {
      entry e;
      std::uint32_t next;
    };
    struct list {
      std::uint32_t head = none;
      std::uint32_t tail = none;
    };

    std::vector<entry> run_;  // the current bucket, sorted
    std::size_t run_at_ = 0;
    std::vector<entry> near_;             // scheduled into the current bucket meanwhile
    std::array<list, ring_size> ring_{};  // buckets next_ .. next_ + ring_size - 1
    std::vector<node> pool_;
    std::uint32_t free_ = none;
    std::vector<entry> far_;  // later ones
    std::int64_t next_ = 0;
    std::size_t in_ring_ = 0;
    std::size_t size_ = 0;
    std::uint64_t seq_ = 0;
  };
  using event = event_queue::entry;

  static std::uint64_t mix(std::uint64_t seed, std::uint64_t salt, std::uint64_t index) noexcept {
    detail::splitmix64 g(seed ^ (salt << 56) ^ (index * 0x9e3779b97f4a7c15ULL));
    return g.next();
  }

  void schedule(time_point t, kind k, std::size_t who, std::uint32_t tag) {
    queue_.push(t, k, static_cast<std::uint32_t>(who), tag);
  }

  bool lost() noexcept {
    return options_.network.loss > 0 && random_.uniform() < options_.network.loss;
  }

  duration one_way() noexcept {
    double d = options_.network.latency;
    if (options_.network.jitter > 0) d += random_.uniform() * options_.network.jitter;
    return to_duration<duration>(d);
  }

  // A caller that knew an older master went there first and was redirected (or refused): one
  // more round trip. `seen` is the master epoch the caller last talked to.
  duration redirect_cost(std::uint64_t& seen, std::uint64_t epoch) const noexcept {
    if (seen == epoch) return duration::zero();
    const bool knew_another = seen != 0;
    seen = epoch;
    return knew_another ? 2 * to_duration<duration>(options_.network.latency) : duration::zero();
  }

  // When the caller of `x` gives up: its deadline, or now when the request reached its
  // server after it (sent within a call, just before the deadline).
  [[nodiscard]] time_point gives_up_at(const exchange& x) const noexcept {
    return std::max(now(), x.sent + x.timeout);
  }

  // Sends an answer back to the caller of exchange `x`: it arrives after the network's delay
  // (plus `extra`), unless it is lost or comes after the caller gave up (`x.timeout` after
  // it sent the request).
  void answer(const exchange& x, duration extra, kind arrives, kind gives_up, std::size_t who,
              std::uint32_t number, bool cut = false) {
    const time_point back = now() + extra + one_way();
    if (lost() || cut || back > x.sent + x.timeout) {
      schedule(gives_up_at(x), gives_up, who, number);
    } else {
      schedule(back, arrives, who, number);
    }
  }

  // A requester's failover machine over the tasks of a job (none with one task).
  std::optional<failover<time_point>> route(std::uint64_t seed) const {
    if (options_.tasks <= 1) return std::nullopt;
    std::vector<std::string> tasks;
    for (std::size_t t = 0; t < options_.tasks; ++t)
      tasks.push_back(std::to_string(t));
    failover_options o = options_.failover;
    o.seed = seed;
    return failover<time_point>(std::move(tasks), o);
  }

  // Task `t` becomes the job's acting master: with the engine it kept if that is still master
  // (a pause that ended within its term: the process goes on with what it knew), else a new
  // one, empty, in learning mode (shorter by the time the position was unreachable); fenced
  // by the task's term.
  void elect(std::size_t index, std::size_t t) {
    job& j = jobs_[index];
    task& k = j.tasks[t];
    engine_options eo = options_.engine;
    eo.is_root = !j.parent;
    eo.log = nullptr;
    if (k.engine) k.engine->fence(now());  // its term may have ended meanwhile
    if (k.engine && k.engine->mastership().is_master) {
      j.engine = std::move(k.engine);
    } else {
      k.engine.reset();
      j.engine = std::make_unique<engine_type>(config_, eo);
      // A task that won where no earlier master's record was alive: no lease can be out.
      auto quiet = std::exchange(j.quiet, duration::zero());
      if (!k.campaign->leases_may_be_out()) {
        quiet = to_duration<duration>(longest_learning(config_) + 1);
      }
      j.engine->set_mastership(true, j.name, now(), quiet);
    }
    j.master_task = t;
    j.elected_at = now();
    if (options_.clock_rate_error > 0) {
      set_clock_rate(k, 1 + options_.clock_rate_error * (2 * random_.uniform() - 1));
    }
    if (options_.fencing) j.engine->set_valid_until(real(k, k.campaign->valid_until()));
    ++j.epoch;
    ++j.elections;
    j.up.in_flight = 0;
    if (j.parent) {
      upstream_options uo = options_.upstream;
      uo.server_id = j.name;
      uo.decay_factor = eo.decay_factor;
      uo.refresh.seed = mix(options_.seed, 0x0b, index * 1000 + j.elections);
      j.upstream = std::make_unique<upstream_type>(uo);
      j.up.route = route(mix(options_.seed, 0xfb, index * 1000 + j.elections));
      node_side{*this, index}.wake_at(now());
    }
  }

  // The acting master steps down (its engine handed to `keep`, else dropped).
  void step_down(job& j, std::unique_ptr<engine_type>* keep = nullptr) {
    if (!j.engine) return;
    if (keep) *keep = std::move(j.engine);
    j.engine.reset();
    j.upstream.reset();
    ++j.epoch;
    j.up.in_flight = 0;
    ++j.up.wake_generation;
  }

  void dispatch(const event& e) {
    ++events_;
    switch (e.what()) {
      case kind::action: {
        // Out of the list first: an action may schedule others, which grows the list.
        const auto action = std::move(actions_[e.who]);
        action();
        break;
      }
      case kind::client_release:
        on_client_release(e.who);
        break;
      case kind::client_wake:
      case kind::client_arrives:
      case kind::client_answer:
      case kind::client_timeout:
        on_exchange(client_side{*this, e.who}, e.what(), e.tag);
        break;
      case kind::node_wake:
      case kind::node_arrives:
      case kind::node_answer:
      case kind::node_timeout:
        on_exchange(node_side{*this, e.who}, e.what(), e.tag);
        break;
      case kind::task_step:
        on_task_step(e.who, e.tag);
        break;
      case kind::etcd_call:
        on_etcd_call(e.who, e.tag);
        break;
      case kind::etcd_expiry:
        on_etcd_expiry(e.who);
        break;
    }
  }

  // ---- clients ----

  // What a client stands at, kept beside the clients for the totals the scenarios trace
  // every few seconds: a scan of 100 000 clients then reads 3 MB in order, not a resource
  // scattered in memory per client. The parts of the client state's `capacity_of`, stored
  // whenever the client's state changes: its lease (until it expires) or else its fallback.
  struct standing {
    double wants = 0;  // 0 when gone
    double leased = 0;
    time_point until = time_point::min();  // the lease's expiry
    double otherwise = 0;                  // the fallback (-1: unlimited, counts as wants)

    [[nodiscard]] double at(time_point now) const noexcept {
      const double x = now < until ? leased : otherwise;
      return x < 0 ? wants : x;
    }
  };

  void stand(std::size_t index) {
    const client& c = clients_[index];
    standing& s = standing_[index];
    s = {};
    if (!c.active) return;
    s.wants = c.wants;
    if (c.held->lease) {
      s.leased = c.held->lease->capacity;
      s.until = c.held->lease->expiry;
    }
    s.otherwise = fallback_capacity(c.held->options, c.held->server_safe_capacity);
    if (options_.check_tree) check_tree(c);
  }

  void on_client_release(std::size_t index) {
    client& c = clients_[index];
    job& j = jobs_[c.job];
    ++j.requests;
    if (!j.engine) return;
    release_request req{c.name, {options_.resource}};
    (void)j.engine->release_capacity(req, now());
  }

  // ---- requesters: clients and intermediates, through one path ----
  //
  // A requester wakes when its refresh machine says, sends its request through the network,
  // and hands the answer (or a timeout) back to its machine. The two sides differ only in
  // what they are: a client's machine is its `client_state`, it asks its own job with
  // `get_capacity`; an intermediate's is its job's `upstream`, it asks the parent job with
  // `get_server_capacity`.

  // An engine's answer into `out`; the refusal's message, or "" when it answered.
  template <class Response>
  static std::string adopt(result<Response> r, Response& out) {
    if (!r) return r.error().message;
    out = std::move(r).value();
    return {};
  }

  struct client_side {
    static constexpr kind wake = kind::client_wake, arrives = kind::client_arrives,
                          answered = kind::client_answer, timed_out = kind::client_timeout;
    simulation& s;
    std::size_t index;

    [[nodiscard]] client& me() const { return s.clients_[index]; }
    [[nodiscard]] exchange& up() const { return me().up; }
    [[nodiscard]] bool present() const { return me().active; }
    [[nodiscard]] bool link_cut() const { return s.now() < s.jobs_[me().job].clients_cut_until; }
    [[nodiscard]] bool awaited() const { return true; }
    [[nodiscard]] bool due() const { return me().state->due(s.now()); }
    [[nodiscard]] time_point next_request() const { return me().state->next_request(); }
    [[nodiscard]] std::size_t asks() const { return me().job; }
    [[nodiscard]] const std::string& name() const { return me().name; }
    void woke() const {}
    [[nodiscard]] seconds call_timeout() const {
      return me().state->call_timeout(s.now(), seconds(s.options_.network.timeout));
    }
    void make_request() const {
      client& c = me();
      if (c.wants_changed) {  // handed over with the request (see set_wants)
        c.state->set_wants(s.options_.resource, c.wants);
        c.wants_changed = false;
        s.stand(index);
      }
      c.request = c.state->make_request(s.now());
    }
    [[nodiscard]] std::string decide(engine_type& e) const {
      return adopt(e.get_capacity(me().request, s.now()), me().response);
    }
    void reply(std::error_code error) const {
      client& c = me();
      if (error) {
        (void)c.state->on_reply(error, s.now());
      } else {
        (void)c.state->on_reply(c.response, s.now());
      }
      s.stand(index);
    }
    void wake_at(time_point t) const {
      s.schedule(std::max(t, s.now()), wake, index, ++up().wake_generation);
    }
  };

  struct node_side {
    static constexpr kind wake = kind::node_wake, arrives = kind::node_arrives,
                          answered = kind::node_answer, timed_out = kind::node_timeout;
    simulation& s;
    std::size_t index;

    [[nodiscard]] job& me() const { return s.jobs_[index]; }
    [[nodiscard]] exchange& up() const { return me().up; }
    [[nodiscard]] bool present() const { return me().upstream && me().engine; }
    [[nodiscard]] bool link_cut() const { return s.now() < me().parent_cut_until; }
    // An answer to a request of an earlier master of this job is nobody's.
    [[nodiscard]] bool awaited() const { return me().in_flight_epoch == me().epoch; }
    [[nodiscard]] bool due() const { return me().upstream->due(*me().engine, s.now()); }
    [[nodiscard]] time_point next_request() const {
      return me().upstream->next_request(*me().engine);
    }
    [[nodiscard]] std::size_t asks() const { return *me().parent; }
    [[nodiscard]] const std::string& name() const { return me().name; }
    void woke() const { me().wake_at = time_point::max(); }
    [[nodiscard]] seconds call_timeout() const {
      return me().upstream->call_timeout(s.now(), seconds(s.options_.network.timeout));
    }
    void make_request() const {
      job& j = me();
      j.request = j.upstream->make_request(*j.engine, s.now());
      j.in_flight_epoch = j.epoch;
    }
    [[nodiscard]] std::string decide(engine_type& e) const {
      return adopt(e.get_server_capacity(me().request, s.now()), me().response);
    }
    void reply(std::error_code error) const {
      job& j = me();
      if (error) {
        (void)j.upstream->on_reply(error, s.now());
      } else {
        (void)j.upstream->on_reply(*j.engine, j.response, s.now());
      }
    }
    void wake_at(time_point t) const {
      me().wake_at = std::max(t, s.now());
      s.schedule(me().wake_at, wake, index, ++up().wake_generation);
    }
  };

  template <class Side>
  void on_exchange(const Side& side, kind what, std::uint32_t tag) {
    if (!side.present()) return;
    exchange& x = side.up();
    if (what == Side::wake) {
      if (tag == x.wake_generation) on_wake(side);
    } else if (tag == x.in_flight) {
      if (what == Side::arrives) {
        on_arrives(side);
      } else if (side.awaited()) {  // the answer, or the caller gives up
        x.in_flight = 0;
        if (x.call) return on_outcome(side, what == Side::answered);
        x.why = failure::hung;
        side.reply(what == Side::answered ? std::error_code() : make_error_code(errc::timed_out));
        side.wake_at(side.next_request());
      }
    }
  }

  // Sends the request if it is due, or else sleeps until it is. Over several tasks, the call
  // is the call machine's: it waits out the route's backoff, sends, and goes on after a
  // redirect or a lost request until the call's deadline.
  template <class Side>
  void on_wake(const Side& side) {
    side.woke();
    exchange& x = side.up();
    // A call under way (its request made) waited out its route's backoff: it goes on.
    if (x.call) return drive(side, machine(x).resume(now(), false));
    if (!side.due()) {
      if (x.in_flight == 0) side.wake_at(side.next_request());
      return;
    }
    x.timeout = to_duration<duration>(side.call_timeout().count());
    x.sent = now();
    side.make_request();
    if (!x.route) return send(side);
    x.call.emplace(*x.route, now(), now() + x.timeout, options_.call);
    drive(side, x.call->resume(now(), false));
  }

  // The call machine of `x`, over `x`'s route wherever the exchange now is.
  static call_machine<time_point>& machine(exchange& x) {
    x.call->rebind(*x.route);
    return *x.call;
  }

  // Does what the call machine says, until it waits for the network or the clock.
  template <class Side>
  void drive(const Side& side, call_action<time_point> a) {
    exchange& x = side.up();
    for (;;) {
      switch (a.what) {
        case call_action<time_point>::kind::wait:
          side.wake_at(a.until);
          return;
        case call_action<time_point>::kind::connect:  // connecting costs nothing here
        case call_action<time_point>::kind::moved:
          a = machine(x).resume(now(), a.what == call_action<time_point>::kind::connect);
          break;
        case call_action<time_point>::kind::send:
          return send(side);
        case call_action<time_point>::kind::done:
        case call_action<time_point>::kind::fail:
          x.call.reset();
          x.in_flight = 0;
          side.reply(a.what == call_action<time_point>::kind::done ? std::error_code()
                                                                   : make_error_code(a.error));
          side.wake_at(side.next_request());
          return;
      }
    }
  }

  // The request goes (again, within a call): it arrives, or is lost.
  template <class Side>
  void send(const Side& side) {
    exchange& x = side.up();
    x.in_flight = ++x.request_number;
    if (lost() || side.link_cut()) {
      schedule(gives_up_at(x), Side::timed_out, side.index, x.in_flight);
    } else {
      schedule(now() + one_way(), Side::arrives, side.index, x.in_flight);
    }
  }

  // The answer of a call's request came back (`answered`), or the request failed: the machine
  // decides what follows.
  template <class Side>
  void on_outcome(const Side& side, bool answered) {
    exchange& x = side.up();
    auto& m = machine(x);
    call_action<time_point> a;
    if (answered && x.not_master) {
      a = m.answered(now(), true,
                     x.not_master->empty() ? std::nullopt : std::optional(*x.not_master));
    } else if (answered) {
      a = m.answered(now(), false);
    } else if (x.why == failure::hung) {
      a = m.timed_out(now(), "no answer before the deadline");
    } else {  // refused or closed: the connection fails, and the call goes on
      x.route->failed(now(), x.why,
                      seconds(x.why == failure::refused ? options_.refused_retry_after : 0));
      a = m.lost(now(), "connection closed");
    }
    x.why = failure::hung;
    x.not_master.reset();
    drive(side, a);
  }

  // The request reaches the job it asks: its master decides, and the answer travels back.
  template <class Side>
  void on_arrives(const Side& side) {
    exchange& x = side.up();
    const std::size_t target = side.asks();
    job& j = jobs_[target];
    ++j.requests;
    if (x.route) {
      arrive_at_task(side, target);
      return;
    }
    if (!j.engine || now() < j.answers_hung_until) {  // nobody answers
      schedule(gives_up_at(x), Side::timed_out, side.index, x.in_flight);
      return;
    }
    decide_and_answer(side, target, redirect_cost(x.epoch_seen, j.epoch));
  }

  // The master of `target` decides, and the answer travels back (after `extra` more).
  template <class Side>
  void decide_and_answer(const Side& side, std::size_t target, duration extra) {
    decide_and_answer(side, target, *jobs_[target].engine, extra);
  }

  // The same, decided by engine `e` of `target` (its master's, or a deposed one's).
  template <class Side>
  void decide_and_answer(const Side& side, std::size_t target, engine_type& e, duration extra) {
    exchange& x = side.up();
    job& j = jobs_[target];
    const int copies =
        options_.network.duplicate > 0 && random_.uniform() < options_.network.duplicate ? 2 : 1;
    for (int copy = 0; copy < copies; ++copy) {
      const auto before = &e == j.engine.get() ? check_before(j, side.name()) : std::nullopt;
      if (const std::string refused = side.decide(e); !refused.empty()) {
        throw std::logic_error("simulation: the engine refused " + side.name() +
                               "'s request: " + refused);
      }
      check_after(j, side.name(), before);
      if (j.level == 0 && options_.check_tree) note_root_capacity(e);
    }
    if (&e == j.engine.get()) after_decision(target);
    answer(x, extra, Side::answered, Side::timed_out, side.index, x.in_flight, side.link_cut());
  }

  // ---- tasks and faults ----

  // The request reaches the task its route names: the acting master decides; a task that
  // still takes itself for master with an engine of its own (deposed, or without fencing)
  // decides with it, fenced by its term; a standby answers that it is not the master, naming
  // the holder its campaign knows or none (the call machine then follows it); a paused task
  // keeps the request until it resumes; a hung or stopped one never answers; a refusing job
  // closes the connection at once.
  template <class Side>
  void arrive_at_task(const Side& side, std::size_t target) {
    exchange& x = side.up();
    job& j = jobs_[target];
    if (now() < j.refusing_until) return fail_soon(side, failure::refused);
    const std::size_t t = std::stoul(x.route->current());
    task& k = j.tasks[t];
    if (!k.campaign || k.hung || k.paused) {  // the caller waits in vain, unless it resumes
      schedule(gives_up_at(x), Side::timed_out, side.index, x.in_flight);
      if (k.paused) {
        k.queued.push_back(
            {std::is_same_v<Side, node_side>, side.index, x.in_flight, side.me().request});
      }
      return;
    }
    if (j.engine && t == j.master_task) {
      if (now() < j.answers_hung_until) {  // wedged: the caller waits in vain
        schedule(gives_up_at(x), Side::timed_out, side.index, x.in_flight);
        return;
      }
      return decide_and_answer(side, target, duration::zero());
    }
    if (k.engine) return decide_and_answer(side, target, *k.engine, duration::zero());
    const auto& holder = k.campaign->master();
    x.not_master = holder && !k.campaign->is_master() ? *holder : std::string();
    answer(x, duration::zero(), Side::answered, Side::timed_out, side.index, x.in_flight,
           side.link_cut());
  }

  // The request fails for `why`, as soon as the answer saying so is back.
  template <class Side>
  void fail_soon(const Side& side, failure why) {
    exchange& x = side.up();
    x.why = why;
    schedule(now() + one_way(), Side::timed_out, side.index, x.in_flight);
  }

  // ---- the tasks' campaigns, against each job's etcd ----
  //
  // Each task runs `election_campaign`, the machine `etcd_election` drives in the node, and
  // performs its actions here: a sleep is an event on the task's clock, a call to etcd
  // travels one network latency each way (none while the task's link is cut; then it fails at
  // its deadline), and a watch waits at the store until the key changes or its deadline.
  // After each step `sync` turns what the campaign reports into who acts as the job's master.

  using campaign_action = task::campaign_type::action;
  using campaign_kind = campaign_action::kind;
  using campaign_outcome = task::campaign_type::outcome;
  static constexpr std::size_t max_tasks = 256;  // a task's number is 8 bits of an event's tag

  [[nodiscard]] static std::uint32_t tag_of(const task& k, std::size_t t) noexcept {
    return (k.generation << 8) | static_cast<std::uint32_t>(t);
  }
  [[nodiscard]] static bool current(const task& k, std::uint32_t tag) noexcept {
    return k.campaign && (tag >> 8) == (k.generation & 0xffffffu);
  }

  // The task's clock at the real `now()`, and the real time at which it reads `l`.
  [[nodiscard]] time_point local(const task& k) const {
    return k.base_local + to_duration<duration>(to_seconds(now() - k.base_real) * k.clock_rate);
  }
  [[nodiscard]] static time_point real(const task& k, time_point l) {
    if (l == time_point::min() || l == time_point::max()) return l;
    return k.base_real + to_duration<duration>(to_seconds(l - k.base_local) / k.clock_rate);
  }
  void set_clock_rate(task& k, double rate) {
    k.base_local = local(k);
    k.base_real = now();
    k.clock_rate = rate;
  }

  [[nodiscard]] bool etcd_cut(const task& k) const noexcept { return now() < k.etcd_cut_until; }
  [[nodiscard]] duration etcd_latency() const {
    return to_duration<duration>(options_.network.latency);
  }
  [[nodiscard]] static task::campaign_type::outcome past_deadline() {
    task::campaign_type::outcome a;
    a.error = "context deadline exceeded";
    return a;
  }
  [[nodiscard]] static bool is_call(const campaign_action& a) noexcept {
    return a.what != campaign_kind::sleep && a.what != campaign_kind::watch &&
           a.what != campaign_kind::done;
  }

  // The task's process is gone, and all it had with it.
  static void crash(task& k) {
    k.campaign.reset();
    ++k.generation;
    k.believes = k.paused = k.hung = false;
    k.engine.reset();
    k.queued.clear();
  }

  // The task's process starts and campaigns; `at_once`: its calls are answered without delay
  // until it first waits.
  void start_task(std::size_t index, std::size_t t, bool at_once = false) {
    job& j = jobs_[index];
    task& k = j.tasks[t];
    crash(k);
    std::string key = "/doorman/";
    key += j.name;
    const std::int64_t record_ttl =
        options_.election_record
            ? record_ttl_for(seconds(longest_lease(config_)), seconds(options_.election_ttl))
            : 0;
    k.campaign.emplace(
        election_campaign_options{
            .key = key, .advertise = std::to_string(t), .record_ttl = record_ttl},
        to_duration<duration>(options_.election_ttl));
    campaign_action a = k.campaign->start(local(k));
    while (at_once && is_call(a)) {
      k.doing = a;
      sync(index, t);
      call_etcd(index, t);
      a = heard(index, t);
    }
    step(index, t, a);
  }

  // The campaign's next action: under way from now.
  void step(std::size_t index, std::size_t t, campaign_action a) {
    task& k = jobs_[index].tasks[t];
    ++k.generation;  // what the earlier action waited for is stale
    k.doing = a;
    sync(index, t);
    if (a.what == campaign_kind::done) return stopped(index, t);
    const std::uint32_t tag = tag_of(k, t);
    if (a.what == campaign_kind::sleep) {
      schedule(std::max(now(), real(k, a.until)), kind::task_step, index, tag);
    } else if (etcd_cut(k)) {  // the call is lost: it fails at its deadline
      k.answer = past_deadline();
      schedule(std::max(now(), real(k, a.until)), kind::task_step, index, tag);
    } else {
      schedule(now() + etcd_latency(), kind::etcd_call, index, tag);
    }
  }

  // A task's call reaches etcd: etcd does it, and the answer travels back (a watch waits at the
  // store for a change). A call of a task that stopped or paused since is lost with it.
  void on_etcd_call(std::size_t index, std::uint32_t tag) {
    job& j = jobs_[index];
    const std::size_t t = tag & 0xffu;
    task& k = j.tasks[t];
    if (!current(k, tag)) return;  // a pause, a hang or a crash made it stale
    const time_point deadline = std::max(now(), real(k, k.doing.until));
    if (etcd_cut(k)) {
      k.answer = past_deadline();
      schedule(deadline, kind::task_step, index, tag);
      return;
    }
    if (k.doing.what == campaign_kind::watch) {
      k.answer = {};  // a change, or the deadline: either way it ends without an error
      if (j.etcd.changed_since(k.doing.revision)) {
        schedule(now() + etcd_latency(), kind::task_step, index, tag);
      } else {
        j.watchers.emplace_back(t, k.generation);
        schedule(deadline, kind::task_step, index, tag);
      }
      return;
    }
    call_etcd(index, t);
    const time_point back = now() + etcd_latency();
    if (back > deadline) {
      k.answer = past_deadline();
      schedule(deadline, kind::task_step, index, tag);
    } else {
      schedule(back, kind::task_step, index, tag);
    }
  }

  // Does the task's call (`doing`) at its job's etcd now; `answer` holds what etcd answered.
  void call_etcd(std::size_t index, std::size_t t) {
    job& j = jobs_[index];
    task& k = j.tasks[t];
    const campaign_action& a = k.doing;
    const std::int64_t before = j.etcd.revision();
    k.answer = {};
    switch (a.what) {
      case campaign_kind::grant:
        k.answer.ttl = std::llround(options_.election_ttl);
        k.answer.lease = j.etcd.grant(now(), k.answer.ttl);
        expire_at(index, k.answer.lease);
        renew_record(index, a, k.answer);
        break;
      case campaign_kind::keep_alive:
        k.answer.ttl = j.etcd.keep_alive(now(), a.lease);
        expire_at(index, a.lease);
        if (k.answer.ttl > 0) renew_record(index, a, k.answer);
        break;
      case campaign_kind::claim:
        if (auto r = a.record_lease == 0
                         ? j.etcd.put_if_absent(now(), a.lease, k.campaign->advertise())
                         : j.etcd.put_if_absent(now(), a.lease, k.campaign->advertise(),
                                                a.record_lease, k.answer.records)) {
          k.answer.revision = r->first;
          k.answer.holder = std::move(r->second);
        }
        break;
      case campaign_kind::read:
        k.answer.value = j.etcd.get(now());
        break;
      case campaign_kind::revoke:
        j.etcd.revoke(now(), a.lease);
        break;
      default:
        break;
    }
    if (j.etcd.revision() != before) notify_watchers(index);
  }

  // A grant or keep-alive renews the record lease too, or grants one, as the action says.
  void renew_record(std::size_t index, const campaign_action& a, campaign_outcome& o) {
    job& j = jobs_[index];
    if (a.record_lease != 0) {
      o.record_lease = a.record_lease;
      o.record_ttl = j.etcd.keep_alive(now(), a.record_lease);
    } else if (a.record_ttl > 0) {
      o.record_ttl = a.record_ttl;
      o.record_lease = j.etcd.grant(now(), a.record_ttl);
    } else {
      return;
    }
    expire_at(index, o.record_lease);
  }

  // The campaign hears what its action came to (`answer`), and says what to do next.
  campaign_action heard(std::size_t index, std::size_t t) {
    task& k = jobs_[index].tasks[t];
    return k.campaign->resume(local(k), k.doing.what, k.answer);
  }

  void on_task_step(std::size_t index, std::uint32_t tag) {
    task& k = jobs_[index].tasks[tag & 0xffu];
    if (!current(k, tag)) return;
    step(index, tag & 0xffu, heard(index, tag & 0xffu));
  }

  // A lease that may run out at `lease`'s expiry: the store looks then.
  void expire_at(std::size_t index, std::int64_t lease) {
    const time_point t = jobs_[index].etcd.expiry(lease);
    if (t != time_point::max()) schedule(t, kind::etcd_expiry, index, 0);
  }

  void on_etcd_expiry(std::size_t index) {
    job& j = jobs_[index];
    const std::int64_t before = j.etcd.revision();
    j.etcd.expire(now());
    if (j.etcd.revision() != before) notify_watchers(index);
  }

  // The key changed: every watch under way ends, its news a latency away.
  void notify_watchers(std::size_t index) {
    job& j = jobs_[index];
    for (const auto& [t, generation] : std::exchange(j.watchers, {})) {
      task& k = j.tasks[t];
      if (!k.campaign || k.generation != generation || etcd_cut(k)) continue;
      schedule(now() + etcd_latency(), kind::task_step, index, tag_of(k, t));
    }
  }

  // A task's campaign ended (a stop): the process restarts a renewal period later, so that
  // another task wins; at once when it is the job's only task.
  void stopped(std::size_t index, std::size_t t) {
    task& k = jobs_[index].tasks[t];
    crash(k);
    const std::uint32_t generation = k.generation;
    const double later = jobs_[index].tasks.size() > 1 ? options_.election_ttl / 5 : 0;
    at(seconds_of(now()) + later, [this, index, t, generation] {
      const task& h = jobs_[index].tasks[t];
      if (h.campaign || h.generation != generation || jobs_[index].down) return;
      start_task(index, t);
    });
  }

  // A paused task resumes: it answers what waited (with the engine it kept, fenced by its
  // term), and its campaign hears that what it waited for is over (a call or a watch ran past
  // its deadline, a sleep ended).
  void resume(std::size_t index, std::size_t t, std::uint32_t generation) {
    task& k = jobs_[index].tasks[t];
    if (!k.paused || k.generation != generation) return;
    k.paused = false;
    if (k.engine) {
      for (queued_request& q : k.queued)
        answer_queued(*k.engine, q);
    }
    k.queued.clear();
    if (is_call(k.doing)) k.answer = past_deadline();
    if (k.doing.what == campaign_kind::watch) k.answer = {};
    step(index, t, heard(index, t));
  }

  // What the campaign of task `t` reported, into who acts as the job's master: a task acts
  // while it believes it is master and its term (on its own clock) runs; without fencing, for
  // as long as it believes. A task that takes over deposes the acting one, which keeps its
  // engine, fenced by its own term, while it still believes.
  void sync(std::size_t index, std::size_t t) {
    job& j = jobs_[index];
    task& k = j.tasks[t];
    auto& c = *k.campaign;
    for (const mastership_change& r : c.take_reports()) {
      if (r.is_master) {
        k.believes = true;
      } else if (options_.fencing || r.master) {
        k.believes = false;
      }
    }
    (void)c.take_log();
    const time_point valid = real(k, c.valid_until());
    const bool may = k.believes && !k.paused && !k.hung && (!options_.fencing || now() < valid);
    if (j.engine && j.master_task == t) {
      if (!may) return step_down(j);
      if (options_.fencing) j.engine->set_valid_until(valid);
      // Fenced at a call, and confirmed again since: learning mode again, as the node does.
      if (!j.engine->mastership().is_master) elect(index, t);
      return;
    }
    if (k.engine && !k.believes) k.engine.reset();
    if (k.engine && options_.fencing) k.engine->set_valid_until(valid);
    if (!may) return;
    task& acting = j.tasks[j.master_task];
    step_down(j, acting.believes ? &acting.engine : nullptr);
    elect(index, t);
  }

  // A paused master's answer to a request that waited for it, if its caller still waits.
  void answer_queued(engine_type& engine, queued_request& q) {
    if (q.from_node) {
      job& n = jobs_[q.who];
      auto r = engine.get_server_capacity(std::get<server_capacity_request>(q.request), now());
      if (!r || n.up.in_flight != q.number) return;
      n.response = std::move(r).value();
      answer(n.up, duration::zero(), kind::node_answer, kind::node_timeout, q.who, q.number,
             now() < n.parent_cut_until);
    } else {
      client& c = clients_[q.who];
      auto r = engine.get_capacity(std::get<capacity_request>(q.request), now());
      if (!r || !c.active || c.up.in_flight != q.number) return;
      c.response = std::move(r).value();
      answer(c.up, duration::zero(), kind::client_answer, kind::client_timeout, q.who, q.number,
             now() < jobs_[c.job].clients_cut_until);
    }
  }

  // A decision at an intermediate may have given it news for its parent (a new resource, or
  // capacity given back): if that makes its next request due sooner, wake it then.
  void after_decision(std::size_t index) {
    job& j = jobs_[index];
    if (!j.upstream || j.up.in_flight != 0) return;
    const time_point t = std::max(j.upstream->next_request(*j.engine), now());
    if (t < j.wake_at) node_side{*this, index}.wake_at(t);
  }

  // ---- invariants (docs/design.md), when asked for ----

  struct granted {
    double sum = 0;  // unexpired leases
    double capacity = 0;
    bool learning = false;
  };

  [[nodiscard]] granted measure(const job& j) const {
    granted g;
    g.capacity = j.engine->capacity(options_.resource, now());
    g.learning = j.engine->learning(options_.resource, now());
    if (const auto* store = j.engine->store(options_.resource)) {
      store->for_each([&](const auto& c) {
        if (!c.lease.expired(now())) g.sum += c.lease.capacity;
      });
    }
    return g;
  }

  [[nodiscard]] std::optional<granted> check_before(const job& j, const std::string&) const {
    if (!options_.check_invariants) return std::nullopt;
    return measure(j);
  }

  void check_after(const job& j, const std::string& requester,
                   const std::optional<granted>& before) const {
    if (!before) return;
    const auto fail = [&](const std::string& what) {
      throw invariant_violation("t=" + std::to_string(seconds_of(now())) + " s, node " + j.name +
                                ", requester " + requester + ": " + what);
    };
    const granted after = measure(j);
    constexpr double eps = 1e-6;
    if (!after.learning) {
      // At the capacity it decided with (a learned one may have moved as the decision began).
      const double excess_before = std::max(0.0, before->sum - after.capacity);
      const double excess_after = std::max(0.0, after.sum - after.capacity);
      if (excess_after > excess_before + eps) {
        fail("granted " + std::to_string(after.sum) + " of a capacity of " +
             std::to_string(after.capacity) + " (the decision added to the excess)");
      }
    }
    if (j.parent && !after.learning) {
      const auto own = j.engine->parent_lease(options_.resource);
      const auto* store = j.engine->store(options_.resource);
      const auto* c = store ? store->find(requester) : nullptr;
      // A lease decided now (not one handed back unchanged within the minimum refresh
      // interval) ends no later than the node's own, as the node sees it.
      if (c && c->last_decision == now() && c->lease.capacity > 0 &&
          (!own || c->lease.expiry > own->expiry)) {
        fail("a lease of " + std::to_string(c->lease.capacity) + " outlives the node's own lease");
      }
    }
  }

  // Invariant 1 tree-wide, as `client`'s lease just changed (`check_tree`).
  void check_tree(const client& c) const {
    const double total = total_granted();
    const double bound = tree_bound();
    if (total > bound * (1 + 1e-9) + 1e-9) {
      throw invariant_violation("t=" + std::to_string(seconds_of(now())) + " s, client " + c.name +
                                ": the clients may use " + std::to_string(total) +
                                " of a capacity of " + std::to_string(bound) +
                                " (invariant 1, tree-wide)");
    }
  }

  // Invariant 1's bound: the root's capacity, or for a learned one the most any root engine
  // decided with over the last lease length (a lease granted before a cut may run to its end,
  // docs/learned-capacity.md).
  [[nodiscard]] double tree_bound() const {
    const auto& t = config_.find(options_.resource);
    if (!t.learn) return capacity();
    const time_point since = now() - to_duration<duration>(t.algorithm.lease_length.count());
    double most = 0;
    for (const auto& [at, x] : learned_) {
      if (at >= since) most = std::max(most, x);
    }
    return most;
  }

  // A root engine decided with capacity `e.capacity`: kept for a lease length (`tree_bound`).
  void note_root_capacity(const engine_type& e) {
    const auto& t = config_.find(options_.resource);
    if (!t.learn) return;
    const time_point since = now() - to_duration<duration>(t.algorithm.lease_length.count());
    std::erase_if(learned_, [&](const auto& p) { return p.first < since; });
    const double c = e.capacity(options_.resource, now());
    if (!learned_.empty() && learned_.back().second == c) {
      learned_.back().first = now();
    } else {
      learned_.emplace_back(now(), c);
    }
  }

  simulation_options options_;
  resource_repository config_;
  clock_type clock_;
  detail::splitmix64 random_;
  std::vector<job> jobs_;
  std::vector<client> clients_;
  std::vector<standing> standing_;  // one per client
  // The root's learned capacity since a lease length ago, when it changed (`tree_bound`).
  std::vector<std::pair<time_point, double>> learned_;
  std::vector<std::function<void()>> actions_;
  event_queue queue_;
  std::uint64_t events_ = 0;
};

}  // namespace doorman::sim
