// Envoy's rate limit quota service on the node's gRPC port (see rlqs_door.hpp).

#include "rlqs_door.hpp"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "hosting.hpp"
#include "rlqs.grpc.pb.h"
#include "rlqs_mapping.hpp"

namespace doorman::grpc_door {

namespace {

namespace pb = ::envoy::service::rate_limit_quota::v3;

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class stream;

// One stream: its session and what is under way. Shared by the stream's reactor, the node's
// answers and the service's ticker; `mu` guards all of it (recursive: a handler may answer on
// the calling thread).
struct stream_state {
  stream_state(std::string client_id, caller c, handler& handler_, const rlqs_options& o)
      : session(std::move(client_id), o.session),
        who(std::move(c)),
        h(handler_),
        max_queued(o.max_queued_messages) {}

  std::recursive_mutex mu;
  rlqs::session session;
  caller who;
  handler& h;
  std::size_t max_queued;
  stream* reactor = nullptr;  // none once the stream is done
  pb::RateLimitQuotaUsageReports in;
  std::deque<pb::RateLimitQuotaResponse> out;
  bool writing = false;
  bool finished = false;
  std::optional<grpc::Status> finish_after_write;
  double wake = std::numeric_limits<double>::infinity();
};

using state_ptr = std::shared_ptr<stream_state>;

void pump(const state_ptr& st, double now);

class stream final
    : public grpc::ServerBidiReactor<pb::RateLimitQuotaUsageReports, pb::RateLimitQuotaResponse> {
 public:
  stream(state_ptr st, std::function<void()> gone) : st_(std::move(st)), gone_(std::move(gone)) {
    std::lock_guard l(st_->mu);
    st_->reactor = this;
    StartRead(&st_->in);
  }

  // Ends the stream once (after the write under way, if any).
  void finish(grpc::Status s) {
    if (st_->finished) return;
    st_->finished = true;
    if (st_->writing) {
      st_->finish_after_write = std::move(s);
    } else {
      Finish(std::move(s));
    }
  }

  // Queues one message of actions; a reader that lets too many pile up is cut off.
  void push(const std::vector<rlqs::bucket_action>& actions) {
    if (actions.empty() || st_->finished) return;
    if (st_->out.size() >= st_->max_queued) {
      finish({grpc::StatusCode::RESOURCE_EXHAUSTED,
              "more than " + std::to_string(st_->max_queued) + " messages unread"});
      return;
    }
    pb::RateLimitQuotaResponse m;
    for (const auto& a : actions)
      to_proto(a, *m.add_bucket_action());
    st_->out.push_back(std::move(m));
    write_next();
  }

  void OnReadDone(bool ok) override {
    std::lock_guard l(st_->mu);
    if (!ok) return finish(grpc::Status::OK);  // Envoy closed its side, or the call ended
    const double now = steady_seconds();
    if (auto r = st_->session.report(from_proto(st_->in), now); !r) {
      return finish({grpc::StatusCode::INVALID_ARGUMENT, r.error().message});
    }
    pump(st_, now);
    if (!st_->finished) StartRead(&st_->in);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard l(st_->mu);
    st_->writing = false;
    st_->out.pop_front();
    if (st_->finish_after_write) {
      Finish(std::move(*st_->finish_after_write));
      st_->finish_after_write.reset();
      return;
    }
    if (!ok) return finish(grpc::Status::OK);
    write_next();
  }

  // What the stream held is not released: Envoy keeps enforcing each assignment until its
  // time to live, whatever ended the stream, and each lease ends with it.
  void OnDone() override {
    {
      std::lock_guard l(st_->mu);
      st_->reactor = nullptr;
    }
    gone_();
    delete this;
  }

 private:
  void write_next() {
    if (st_->writing || st_->out.empty() || st_->finished) return;
    st_->writing = true;
    StartWrite(&st_->out.front());
  }

  state_ptr st_;
  std::function<void()> gone_;
};

// An answer from a node that is not master ends the stream, naming the master if known.
void not_master(const state_ptr& st, const mastership_info& m) {
  st->reactor->finish({grpc::StatusCode::UNAVAILABLE,
                       "not the master" + (m.master ? "; the master is " + *m.master : "")});
}

// What the session made of an answer: its actions pushed, or (not master) the stream ended.
void deliver(const state_ptr& st, const result<std::vector<rlqs::bucket_action>>& actions,
             const mastership_info& m) {
  if (!actions) return not_master(st, m);
  st->reactor->push(actions.value());
  st->wake = st->session.next_wake();
}

// The node's answer to a session's ask.
void on_answer(const state_ptr& st, call_result<capacity_response> r) {
  std::lock_guard l(st->mu);
  const double now = steady_seconds();
  if (st->reactor == nullptr) {  // ended meanwhile: its leases run out as the others do
    (void)st->session.answer(r ? r.value() : capacity_response{}, now);
    return;
  }
  if (!r) {
    // Refused (the access file, a bound of the node's): the stream ends saying why. Not
    // decided (the node stopping): asked again later.
    st->session.failed(now);
    if (r.code() == rpc_code::forbidden) {
      st->reactor->finish({grpc::StatusCode::PERMISSION_DENIED, r.message()});
    } else if (r.code() == rpc_code::invalid_params) {
      st->reactor->finish({grpc::StatusCode::INVALID_ARGUMENT, r.message()});
    }
    st->wake = st->session.next_wake();
    return;
  }
  deliver(st, st->session.answer(r.value(), now), r.value().mastership);
}

// The root's answer to a session's draw (budget buckets' blocks).
void on_drawn(const state_ptr& st, call_result<count_response> r) {
  std::lock_guard l(st->mu);
  const double now = steady_seconds();
  if (st->reactor == nullptr) return;  // ended meanwhile: a draw is spent, nothing to release
  if (!r) {
    // Not a root (it draws nothing), or refused: tried again after a while. Shutting down:
    // soon.
    st->session.failed_draw(now, r.code() == rpc_code::server_error ? 1.0 : 30.0);
    st->wake = st->session.next_wake();
    return;
  }
  deliver(st, st->session.drawn(r.value(), now), r.value().mastership);
}

// What a session has to do at `now`: abandon what went unreported, ask what is due.
void pump(const state_ptr& st, double now) {
  if (st->reactor == nullptr || st->finished) return;
  auto [abandoned, ids] = st->session.expire(now);
  if (!ids.empty()) {
    st->reactor->push(abandoned);
    st->h.release_capacity({st->session.client_id(), std::move(ids)}, st->who,
                           [](call_result<release_response>) {});
  }
  if (auto ask = st->session.ask(now)) {
    st->h.get_capacity(std::move(*ask), st->who,
                       [st](call_result<capacity_response> r) { on_answer(st, std::move(r)); });
  }
  if (auto draw = st->session.draw(now)) {
    st->h.count_hits(std::move(*draw), st->who,
                     [st](call_result<count_response> r) { on_drawn(st, std::move(r)); });
  }
  st->wake = st->session.next_wake();
}

// A stream refused before it starts.
class refused final
    : public grpc::ServerBidiReactor<pb::RateLimitQuotaUsageReports, pb::RateLimitQuotaResponse> {
 public:
  explicit refused(grpc::Status s) { Finish(std::move(s)); }
  void OnDone() override { delete this; }
};

class service final : public pb::RateLimitQuotaService::CallbackService {
 public:
  service(handler& h, rlqs_options o) : h_(h), o_(std::move(o)), ticker_([this] { tick(); }) {}

  ~service() override {
    {
      std::lock_guard l(mu_);
      stopping_ = true;
    }
    wakeup_.notify_all();
    ticker_.join();
  }
  service(const service&) = delete;
  service& operator=(const service&) = delete;

  grpc::ServerBidiReactor<pb::RateLimitQuotaUsageReports, pb::RateLimitQuotaResponse>*
  StreamRateLimitQuotas(grpc::CallbackServerContext* ctx) override {
    caller c = caller_of(*ctx);
    // Streams are counted per identity, or per peer host without one.
    std::string key = c.identity;
    if (key.empty()) key = c.address.substr(0, c.address.rfind(':'));
    key.resize(std::min<std::size_t>(key.size(), 200));
    std::lock_guard l(mu_);
    std::size_t& n = per_key_[key];
    if (n >= o_.max_streams_per_identity) {
      if (n == 0) per_key_.erase(key);
      return new refused({grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "streams: at most " + std::to_string(o_.max_streams_per_identity) +
                              " per identity (" + key + ")"});
    }
    ++n;
    // With a certificate, one of its identity's own client ids (`identity#...`: the access
    // rules of every door); else named after the host.
    const std::string number = std::to_string(++serial_);
    std::string client_id =
        c.identity.empty() ? "rlqs/" + key + "/" + number : c.identity + "#rlqs-" + number;
    auto st = std::make_shared<stream_state>(std::move(client_id), std::move(c), h_, o_);
    live_.push_back(st);
    return new stream(std::move(st), [this, key] { forget(key); });
  }

 private:
  void forget(const std::string& key) {
    std::lock_guard l(mu_);
    if (auto it = per_key_.find(key); it != per_key_.end() && --it->second == 0) {
      per_key_.erase(it);
    }
  }

  // Wakes every session whose time has come, five times a second, and forgets the streams
  // that ended.
  void tick() {
    std::unique_lock l(mu_);
    while (!wakeup_.wait_for(l, std::chrono::milliseconds(200), [this] { return stopping_; })) {
      std::vector<state_ptr> due;
      for (const auto& w : live_)
        if (auto st = w.lock()) due.push_back(std::move(st));
      l.unlock();
      const double now = steady_seconds();
      for (const auto& st : due) {
        std::lock_guard sl(st->mu);
        if (st->wake <= now) pump(st, now);
      }
      due.clear();
      l.lock();
      std::erase_if(live_, [](const std::weak_ptr<stream_state>& w) { return w.expired(); });
    }
  }

  handler& h_;
  rlqs_options o_;
  std::mutex mu_;
  std::condition_variable wakeup_;
  bool stopping_ = false;
  std::map<std::string, std::size_t> per_key_;
  std::vector<std::weak_ptr<stream_state>> live_;
  std::uint64_t serial_ = 0;
  std::thread ticker_;  // last: started once the rest is built
};

}  // namespace

std::unique_ptr<grpc::Service> make_rlqs_service(handler& h, const rlqs_options& o) {
  return std::make_unique<service>(h, o);
}

}  // namespace doorman::grpc_door
