// Cost of the local limiters against a mutex-based token bucket, in the same run.
//
//   build/release/benchmarks/doorman_bench_limiter [--seconds S] [--json FILE]
//
// - try_acquire, one thread, admitted path (rate high enough that every call is admitted) and
//   refused path (rate 1/s, so nearly every call is refused): nanoseconds per call.
// - try_acquire, 2 threads on one limiter: calls per second in total.
// - wait() scheduling error: at 1 000/s, how late each caller runs after its permit was due.
// The baseline is the token bucket people write first: a std::mutex around
// {tokens, last refill}, refilled from std::chrono::steady_clock on every call.

#include <doorman/limit.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using steady = std::chrono::steady_clock;

// The baseline: a mutex token bucket reading steady_clock.
class mutex_bucket {
 public:
  mutex_bucket(double rate, double burst) : rate_(rate), burst_(burst), tokens_(burst) {}
  bool try_acquire() {
    std::lock_guard lock(mutex_);
    const auto now = steady::now();
    tokens_ =
        std::min(burst_, tokens_ + std::chrono::duration<double>(now - last_).count() * rate_);
    last_ = now;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }

 private:
  std::mutex mutex_;
  double rate_;
  double burst_;
  double tokens_;
  steady::time_point last_ = steady::now();
};

std::atomic<std::uint64_t> sink{0};

// Nanoseconds per call of f() in one thread, over `seconds`.
template <class F>
double ns_per_call(F f, double seconds) {
  std::uint64_t calls = 0;
  std::uint64_t admitted = 0;
  const auto start = steady::now();
  const auto end =
      start + std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(seconds));
  auto now = start;
  while (now < end) {
    for (int i = 0; i < 1024; ++i)
      admitted += f() ? 1 : 0;
    calls += 1024;
    now = steady::now();
  }
  sink += admitted;
  return std::chrono::duration<double, std::nano>(now - start).count() / static_cast<double>(calls);
}

// Calls per second of f() from `threads` threads together.
template <class F>
double calls_per_second(F f, int threads, double seconds) {
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> total{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      while (!go) {
      }
      std::uint64_t calls = 0;
      std::uint64_t admitted = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 256; ++i)
          admitted += f() ? 1 : 0;
        calls += 256;
      }
      total += calls;
      sink += admitted;
    });
  }
  const auto start = steady::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : pool)
    t.join();
  return static_cast<double>(total) / std::chrono::duration<double>(steady::now() - start).count();
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 1;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  if (!(seconds > 0)) {
    std::fprintf(stderr, "--seconds: expected a positive number\n");
    return 2;
  }
  std::fprintf(stderr, "coarse clock resolution: %lld ns\n",
               static_cast<long long>(doorman::coarse_clock::resolution().count()));

  // One thread, admitted: 1e9 permits/s is more than any loop can take.
  doorman::rate_limiter fast({.rate = 1e9, .burst = 1000});
  mutex_bucket fast_base(1e9, 1000);
  const double ours_admit = ns_per_call([&] { return fast.try_acquire().admitted; }, seconds);
  const double base_admit = ns_per_call([&] { return fast_base.try_acquire(); }, seconds);
  // One thread, refused.
  doorman::rate_limiter slow({.rate = 1, .burst = 1});
  mutex_bucket slow_base(1, 1);
  const double ours_refuse = ns_per_call([&] { return slow.try_acquire().admitted; }, seconds);
  const double base_refuse = ns_per_call([&] { return slow_base.try_acquire(); }, seconds);
  // Two threads on one limiter, admitted path.
  doorman::rate_limiter shared({.rate = 1e9, .burst = 1000});
  mutex_bucket shared_base(1e9, 1000);
  const double ours_2t =
      calls_per_second([&] { return shared.try_acquire().admitted; }, 2, seconds);
  const double base_2t = calls_per_second([&] { return shared_base.try_acquire(); }, 2, seconds);
  // wait() lateness at 1 000/s.
  doorman::rate_limiter paced({.rate = 1000, .burst = 1});
  std::vector<double> late_us;
  const int waits = std::max(100, static_cast<int>(1000 * seconds));
  for (int i = 0; i < waits; ++i) {
    const auto due = paced.wait();
    late_us.push_back(
        std::chrono::duration<double, std::micro>(doorman::coarse_clock::precise_now() - due)
            .count());
  }
  const double late_p50 = percentile(late_us, 0.5);
  const double late_p99 = percentile(late_us, 0.99);

  std::printf("| measure | doorman::rate_limiter | mutex token bucket | ratio |\n");
  std::printf("|---|---:|---:|---:|\n");
  std::printf("| try_acquire, 1 thread, admitted (ns/call) | %.1f | %.1f | %.2fx faster |\n",
              ours_admit, base_admit, base_admit / ours_admit);
  std::printf("| try_acquire, 1 thread, refused (ns/call) | %.1f | %.1f | %.2fx faster |\n",
              ours_refuse, base_refuse, base_refuse / ours_refuse);
  std::printf("| try_acquire, 2 threads (M calls/s) | %.1f | %.1f | %.2fx |\n", ours_2t / 1e6,
              base_2t / 1e6, ours_2t / base_2t);
  std::printf("| wait() at 1000/s, lateness p50 / p99 (us) | %.0f / %.0f | | |\n", late_p50,
              late_p99);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << fmt::format(
        R"({{"try_acquire_admitted_ns": {{"doorman": {:.2f}, "mutex": {:.2f}}},
 "try_acquire_refused_ns": {{"doorman": {:.2f}, "mutex": {:.2f}}},
 "two_threads_calls_per_s": {{"doorman": {:.0f}, "mutex": {:.0f}, "ratio": {:.3f}}},
 "wait_lateness_us": {{"p50": {:.1f}, "p99": {:.1f}}}}}
)",
        ours_admit, base_admit, ours_refuse, base_refuse, ours_2t, base_2t, ours_2t / base_2t,
        late_p50, late_p99);
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
