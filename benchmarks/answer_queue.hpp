#pragma once

// The answers of gRPC calls made with the callback API, handed to the thread that drives the
// load: each call's callback records its status and time and queues it; `take` waits for one.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>

#include <grpcpp/grpcpp.h>

namespace doorman_bench {

// `Call` has `grpc::Status status` and `std::chrono::steady_clock::time_point answered`.
template <class Call>
class answer_queue {
 public:
  // The callback of the call `raw` (released by the caller; owned again by `take`).
  auto on_done(Call* raw) {
    return [this, raw](const grpc::Status& st) {
      raw->status = st;
      raw->answered = std::chrono::steady_clock::now();
      const std::lock_guard lock(mutex_);
      done_.emplace_back(raw);
      ready_.notify_one();
    };
  }

  // The next answered call, or null when none comes within `timeout`.
  std::unique_ptr<Call> take(std::chrono::seconds timeout) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [this] { return !done_.empty(); })) return nullptr;
    auto c = std::move(done_.front());
    done_.pop_front();
    return c;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::unique_ptr<Call>> done_;
};

}  // namespace doorman_bench
