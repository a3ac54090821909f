// A parent link's channel over Doorman's gRPC protocol (see parent_channel.hpp).

#include "parent_channel.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <asio.hpp>

#include <doorman/core/call.hpp>
#include <doorman/core/failover.hpp>

#include "doorman.grpc.pb.h"
#include "mapping.hpp"
#include "pem.hpp"

namespace doorman::grpc_door {

namespace {

using clock = std::chrono::steady_clock;

// The calls gRPC still owes an answer to: a channel waits for them before it goes, so that no
// completion reaches an executor that is gone.
struct in_flight {
  std::mutex m;
  std::condition_variable cv;
  std::set<grpc::ClientContext*> calls;

  void add(grpc::ClientContext* c) {
    const std::lock_guard lock(m);
    calls.insert(c);
  }
  void remove(grpc::ClientContext* c) {
    const std::lock_guard lock(m);
    calls.erase(c);
    cv.notify_all();
  }
  // On the channel's executor, where the calls' contexts live (gRPC may answer a cancel at
  // once, so not under the lock).
  void cancel_all() {
    std::set<grpc::ClientContext*> now;
    {
      const std::lock_guard lock(m);
      now = calls;
    }
    for (auto* c : now)
      c->TryCancel();
  }
  void wait_empty() {
    std::unique_lock lock(m);
    cv.wait(lock, [this] { return calls.empty(); });
  }
};

class parent_channel final : public net::call_channel {
 public:
  parent_channel(asio::any_io_executor executor, net::channel_options options)
      : executor_(std::move(executor)),
        options_(std::move(options)),
        policy_(options_.addresses,
                {{options_.initial_backoff, options_.maximum_backoff}, std::random_device{}()}) {
    credentials_ = make_credentials();
  }
  parent_channel(const parent_channel&) = delete;
  parent_channel& operator=(const parent_channel&) = delete;
  ~parent_channel() override {
    calls_.cancel_all();
    calls_.wait_empty();
  }

  asio::awaitable<net::call_status> call_any(net::any_request request, net::any_response response,
                                             net::call_options options) override {
    if (shut_) co_return fail(errc::shut_down, "channel shut down");
    const auto* req = std::get_if<const server_capacity_request*>(&request);
    auto* const* resp = std::get_if<server_capacity_response*>(&response);
    if (!req || !resp) {
      const std::string_view method = std::visit(
          [](const auto* r) { return method_of_request<std::remove_cvref_t<decltype(*r)>>::name; },
          request);
      co_return fail(errc::error_answer,
                     fmt::format("Doorman's protocol has no {} (the parent speaks gRPC)", method));
    }
    const auto start = clock::now();
    const auto deadline = start + to_duration<clock::duration>(
                                      options.timeout.value_or(options_.call_timeout).count());
    call_machine<clock::time_point> m(policy_, start, deadline,
                                      {options_.max_redirects, options.follow_redirects});
    const std::uint64_t cancels = cancels_;
    net::call_status status;
    auto a = m.resume(start, false, problem());
    for (;;) {
      if (shut_) co_return fail(errc::shut_down, "channel shut down");
      if (cancels_ != cancels) co_return fail(asio::error::operation_aborted, "call cancelled");
      switch (a.what) {
        case step::kind::wait:
          co_await sleep_until(a.until);
          a = m.resume(clock::now(), false, problem());
          break;
        case step::kind::connect:  // gRPC connects as it sends
        case step::kind::send: {
          const std::string address = policy_.current();
          a = co_await send_step(m, address, **req, **resp, status);
          if (cancels_ != cancels) co_return fail(asio::error::operation_aborted, "call cancelled");
          break;
        }
        case step::kind::moved:  // the next call goes to the route's address
          a = m.resume(clock::now(), false, problem());
          break;
        case step::kind::done:
          co_return std::move(status);
        case step::kind::fail:
          co_return fail(a.error, std::move(a.message));
      }
    }
  }

  void cancel() override {
    ++cancels_;
    if (sleeping_) sleeping_->cancel();
    calls_.cancel_all();
  }

  void shutdown() override {
    shut_ = true;
    cancel();
  }

  [[nodiscard]] const std::string& current() const override { return policy_.current(); }

  void reload_tls() override {
    credentials_ = make_credentials();  // throws, keeping the old ones, when a file fails
    stubs_.clear();
  }

 private:
  static net::call_status fail(std::error_code ec, std::string message) {
    net::call_status r;
    r.error = ec;
    r.message = std::move(message);
    return r;
  }

  std::shared_ptr<grpc::ChannelCredentials> make_credentials() const {
    const auto& tls = options_.tls;
    if (!tls.active()) return grpc::InsecureChannelCredentials();
    grpc::SslCredentialsOptions o;
    if (!tls.ca_file.empty()) o.pem_root_certs = read_pem(tls.ca_file, "parent tls ca");
    if (!tls.cert_file.empty())
      o.pem_cert_chain = read_pem(tls.cert_file, "parent tls certificate");
    if (!tls.key_file.empty()) o.pem_private_key = read_pem(tls.key_file, "parent tls key");
    return grpc::SslCredentials(o);
  }

  ::doorman::Capacity::Stub& stub_for(const std::string& address) {
    auto& s = stubs_[address];
    if (!s) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
      if (!options_.tls.server_name.empty()) {
        args.SetSslTargetNameOverride(options_.tls.server_name);
      }
      s = ::doorman::Capacity::NewStub(grpc::CreateCustomChannel(address, credentials_, args));
    }
    return *s;
  }

  // One GetServerCapacity; completes on the channel's executor.
  asio::awaitable<grpc::Status> ask(const std::string& address,
                                    const ::doorman::GetServerCapacityRequest& req,
                                    ::doorman::GetServerCapacityResponse& resp,
                                    clock::time_point deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + (deadline - clock::now()));
    auto& stub = stub_for(address);
    calls_.add(&ctx);
    auto* calls = &calls_;
    co_return co_await asio::async_initiate<decltype(asio::use_awaitable), void(grpc::Status)>(
        [&](auto handler) {
          auto h = std::make_shared<decltype(handler)>(std::move(handler));
          auto ex = asio::get_associated_executor(*h, executor_);
          stub.async()->GetServerCapacity(
              &ctx, &req, &resp, [h, ex, calls, c = &ctx](grpc::Status s) {
                calls->remove(c);
                asio::post(ex, [h, s = std::move(s)]() mutable { (*h)(std::move(s)); });
              });
        },
        asio::use_awaitable);
  }

  using step = call_action<clock::time_point>;

  std::string problem() const { return problem_.empty() ? "" : "; " + problem_; }

  // The machine's `send`: one GetServerCapacity to `address`; the machine's next step, the
  // answer in `answer` and how the call went in `status`. A hung parent ends the call (the
  // route moves on), an unreachable one is left for the next address while the deadline
  // allows, a refusal is the call's answer.
  asio::awaitable<step> send_step(call_machine<clock::time_point>& m, const std::string& address,
                                  const server_capacity_request& request,
                                  server_capacity_response& answer, net::call_status& status) {
    static constexpr std::string_view method = methods::get_server_capacity::name;
    ::doorman::GetServerCapacityRequest req;
    to_proto(request, unix_now(), req);
    ::doorman::GetServerCapacityResponse resp;
    const grpc::Status s = co_await ask(address, req, resp, m.deadline());
    switch (s.error_code()) {
      case grpc::StatusCode::OK:
        break;
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        stubs_.erase(address);  // the connection may be hung or cut off: a new one next time
        problem_ = fmt::format("{} did not answer {} in time", address, method);
        co_return m.timed_out(clock::now(), problem_);
      case grpc::StatusCode::UNAVAILABLE:
        problem_ = fmt::format("cannot reach {}: {}", address, s.error_message());
        co_return m.connect_failed(clock::now(), true, problem());
      case grpc::StatusCode::CANCELLED:
        status = fail(asio::error::operation_aborted, "call cancelled");
        co_return step::to(step::kind::done);
      default:
        status =
            fail(errc::error_answer, fmt::format("parent refused: {} {}: {} ({})", address, method,
                                                 s.error_message(), int(s.error_code())));
        co_return m.error_answer();
    }
    answer = from_proto(resp, unix_now());
    status = net::call_status{};
    std::optional<std::string> master;
    if (answer.mastership.master && net::parse_address(*answer.mastership.master))
      master = answer.mastership.master;
    auto next = m.answered(clock::now(), !answer.mastership.is_master, master);
    if (next.what == step::kind::done) problem_.clear();
    co_return next;
  }

  asio::awaitable<void> sleep_until(clock::time_point until) {
    asio::steady_timer t(executor_);
    t.expires_at(until);
    sleeping_ = &t;
    std::error_code ec;
    co_await t.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    sleeping_ = nullptr;
  }

  asio::any_io_executor executor_;
  net::channel_options options_;
  failover<clock::time_point> policy_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::map<std::string, std::unique_ptr<::doorman::Capacity::Stub>> stubs_;
  in_flight calls_;
  asio::steady_timer* sleeping_ = nullptr;
  std::uint64_t cancels_ = 0;
  bool shut_ = false;
  std::string problem_;  // why the last attempt failed, for the call that gives up
};

}  // namespace

std::unique_ptr<net::call_channel> make_parent_channel(asio::any_io_executor executor,
                                                       net::channel_options options) {
  return std::make_unique<parent_channel>(std::move(executor), std::move(options));
}

}  // namespace doorman::grpc_door
