// The local rate algorithms compared on the same traffic: accuracy against an exact sliding
// window, memory, and cost per try_acquire.
//
//   build/release/benchmarks/doorman_bench_algorithms [--minutes M] [--seconds S]
//       [--json FILE] [--svg DIR]
//
// Accuracy (a manual clock, so the results do not depend on the machine): a limit of 100 per
// 60 s; four traffic patterns of M simulated minutes (default 60), generated once with a fixed
// seed and replayed against every algorithm:
// - poisson-80 and poisson-120: Poisson arrivals at 80 and 120 per minute;
// - on-off: bursts of 10 s at 10 per second, one per minute (100 per minute on average);
// - edge: every 3 minutes, 100 requests in the second before a window edge and 100 in the
//   second after it.
// For each: requests admitted; the most admitted in any 60 s window (over the limit: what the
// limit failed to stop); refusals while the algorithm's own admissions in the last 60 s were
// under the limit (an exact sliding window would have admitted them); memory per limiter (the
// compact window limiters, as a keyed limiter holds them; the leaky bucket queues instead of
// refusing, up to 100 requests, so its mean wait is shown).
// Cost (real time, coarse clock, every call admitted): nanoseconds per try_acquire on one
// thread and on each of two threads sharing one limiter, over S seconds (default 0.5) each.
// --svg DIR writes one chart per pattern: each algorithm's own count (limit − remaining) and
// the exact count of its admissions in the last 60 s, over the first 10 minutes.

#include <doorman/core/time.hpp>
#include <doorman/limit.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <vector>

namespace {

using namespace std::chrono_literals;

std::atomic<std::uint64_t> sink{0};  // refusals in the cost runs (keeps the calls)
using doorman::manual_clock;

using clock_ref = doorman::manual_clock_ref;

constexpr double limit = 100;
constexpr std::int64_t window_ns = 60'000'000'000;

// A limiter behind one interface, made on a clock.
struct algorithm {
  std::string name;
  std::function<std::unique_ptr<struct any_limiter>(const manual_clock&)> make;
};

struct any_limiter {
  virtual ~any_limiter() = default;
  // The time the request runs (ns; for all but the shaper, now), or -1 when refused.
  virtual std::int64_t take(std::int64_t now) = 0;
  virtual doorman::limit_status status() = 0;
  virtual std::size_t memory() = 0;
};

template <class L>
struct holder final : any_limiter {
  template <class O>
  holder(O o, const manual_clock& c) : l(o, clock_ref{&c}) {}
  std::int64_t take(std::int64_t now) override {
    if constexpr (
        requires { l.reserve(1); } &&
        !requires {
          l.set_burst(1);
          l.burst();
        }) {
      // The shaper queues: its callers wait (up to its queue), they are not refused.
      const auto at = l.reserve(1).at;
      return at == manual_clock::time_point::max() ? -1 : at.time_since_epoch().count();
    } else {
      return l.try_acquire().admitted ? now : -1;
    }
  }
  doorman::limit_status status() override { return l.status(); }
  std::size_t memory() override { return l.memory_bytes(); }
  L l;
};

template <class L, class O>
algorithm make_algorithm(std::string name, O options) {
  return {std::move(name), [options](const manual_clock& c) -> std::unique_ptr<any_limiter> {
            return std::make_unique<holder<L>>(options, c);
          }};
}

std::vector<algorithm> algorithms() {
  const doorman::window_limiter_options w{.limit = limit, .window = 60s};
  auto k12 = w;
  k12.sub_windows = 12;
  return {
      make_algorithm<doorman::basic_rate_limiter<clock_ref>>(
          "gcra (burst 100)", doorman::rate_limiter_options{.rate = limit / 60, .burst = 100}),
      make_algorithm<doorman::basic_rate_limiter<clock_ref>>(
          "gcra (burst 10)", doorman::rate_limiter_options{.rate = limit / 60, .burst = 10}),
      make_algorithm<doorman::basic_fixed_window_limiter<clock_ref, 1>>("fixed_window", w),
      make_algorithm<doorman::basic_sliding_log_limiter<clock_ref, 1>>("sliding_log", w),
      make_algorithm<doorman::basic_sliding_window_limiter<clock_ref, 1>>("sliding_window (k=1)",
                                                                          w),
      make_algorithm<doorman::basic_sliding_window_limiter<clock_ref, 1>>("sliding_window (k=12)",
                                                                          k12),
      make_algorithm<doorman::basic_leaky_bucket_limiter<clock_ref>>(
          "leaky_bucket (queue 100)",
          doorman::leaky_bucket_options{.rate = limit / 60, .queue = limit}),
  };
}

struct pattern {
  std::string name;
  std::vector<std::int64_t> arrivals;  // ns, sorted
};

std::vector<pattern> patterns(int minutes) {
  const std::int64_t end = minutes * window_ns;
  std::mt19937_64 rng(2026);
  auto poisson = [&](double per_minute) {
    std::exponential_distribution<double> gap(per_minute / 60e9);
    std::vector<std::int64_t> out;
    for (double t = gap(rng); t < static_cast<double>(end); t += gap(rng))
      out.push_back(static_cast<std::int64_t>(t));
    return out;
  };
  std::vector<pattern> out;
  out.push_back({"poisson-80", poisson(80)});
  out.push_back({"poisson-120", poisson(120)});
  std::vector<std::int64_t> onoff;
  for (std::int64_t m = 0; m < minutes; ++m) {
    for (int i = 0; i < 100; ++i)  // 10 s at 10/s, from 25 s into each minute
      onoff.push_back(m * window_ns + 25'000'000'000 + std::int64_t{i} * 100'000'000);
  }
  out.push_back({"on-off", std::move(onoff)});
  std::vector<std::int64_t> edge;
  for (std::int64_t e = window_ns; e < end; e += 3 * window_ns) {
    for (int i = 0; i < 200; ++i)  // 100 in the second before the edge, 100 in the one after
      edge.push_back(e - 1'000'000'000 + std::int64_t{i} * 10'000'000);
  }
  out.push_back({"edge", std::move(edge)});
  return out;
}

struct sample {
  double own;    // the algorithm's own count
  double exact;  // its admissions in the last 60 s
};

struct accuracy {
  std::size_t offered = 0;
  std::size_t admitted = 0;
  std::size_t most_in_window = 0;
  std::size_t under = 0;  // refused while under the limit over the last 60 s
  std::size_t memory = 0;
  double mean_delay = 0;      // seconds (the shaper's queue)
  std::vector<sample> chart;  // one per second, first 10 minutes
};

// Admission times (sorted) and exact counts over them.
class admissions {
 public:
  void add(std::int64_t t) { times_.push_back(t); }
  // In (t - 60 s, t].
  [[nodiscard]] std::size_t in_window(std::int64_t t) {
    while (head_ < times_.size() && times_[head_] <= t - window_ns)
      ++head_;
    const auto end =
        std::upper_bound(times_.begin() + static_cast<std::ptrdiff_t>(head_), times_.end(), t);
    return static_cast<std::size_t>(end - times_.begin()) - head_;
  }
  // The most in any 60 s window.
  [[nodiscard]] std::size_t most() const {
    std::size_t best = 0;
    std::size_t tail = 0;
    for (std::size_t i = 0; i < times_.size(); ++i) {
      while (times_[tail] <= times_[i] - window_ns)
        ++tail;
      best = std::max(best, i - tail + 1);
    }
    return best;
  }

 private:
  std::vector<std::int64_t> times_;
  std::size_t head_ = 0;
};

accuracy replay(const algorithm& a, const pattern& p, int minutes) {
  manual_clock clock;
  auto lim = a.make(clock);
  accuracy r;
  admissions admitted;
  double delay = 0;
  std::size_t next = 0;
  const std::int64_t chart_end = std::min<std::int64_t>(minutes, 10) * window_ns;
  for (std::int64_t s = 0;; s += 1'000'000'000) {
    // Arrivals up to this second, then a chart sample at it.
    for (; next < p.arrivals.size() && p.arrivals[next] <= s; ++next) {
      const std::int64_t t = p.arrivals[next];
      clock.set(manual_clock::time_point(std::chrono::nanoseconds(t)));
      ++r.offered;
      if (const std::int64_t at = lim->take(t); at >= 0) {
        ++r.admitted;
        admitted.add(at);
        delay += static_cast<double>(at - t) / 1e9;
      } else if (static_cast<double>(admitted.in_window(t)) + 1 <= limit) {
        ++r.under;
      }
    }
    if (s > chart_end && next == p.arrivals.size()) break;
    if (s <= chart_end) {
      clock.set(manual_clock::time_point(std::chrono::nanoseconds(s)));
      const auto st = lim->status();
      r.chart.push_back({st.limit - st.remaining, static_cast<double>(admitted.in_window(s))});
    }
  }
  r.most_in_window = admitted.most();
  r.mean_delay = r.admitted ? delay / static_cast<double>(r.admitted) : 0;
  r.memory = lim->memory();
  return r;
}

// Nanoseconds per try_acquire on each of `threads` threads sharing one limiter.
template <class L, class O>
double cost(O options, int threads, double seconds) {
  L lim(options);
  std::atomic<bool> go{false};
  std::atomic<bool> stop{false};
  std::vector<double> per_call(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (!go)
        std::this_thread::yield();
      std::uint64_t calls = 0;
      std::uint64_t refused = 0;
      const auto start = std::chrono::steady_clock::now();
      while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 256; ++i)
          refused += lim.try_acquire().admitted ? 0 : 1;
        calls += 256;
      }
      const double ns =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
              .count();
      per_call[static_cast<std::size_t>(t)] = ns / static_cast<double>(calls);
      sink += refused;
    });
  }
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : pool)
    th.join();
  double sum = 0;
  for (const double v : per_call)
    sum += v;
  return sum / threads;
}

struct costs {
  double one = 0;
  double two = 0;
};

std::vector<costs> measure_costs(double seconds) {
  const double huge = 1e9;  // per window: every call admitted
  const doorman::window_limiter_options w{.limit = huge, .window = 60s};
  auto k12 = w;
  k12.sub_windows = 12;
  const doorman::rate_limiter_options g{.rate = huge, .burst = huge};
  auto both = [&](auto f) { return costs{f(1), f(2)}; };
  return {
      both([&](int n) { return cost<doorman::rate_limiter>(g, n, seconds); }),
      both([&](int n) { return cost<doorman::rate_limiter>(g, n, seconds); }),
      both([&](int n) { return cost<doorman::fixed_window_limiter>(w, n, seconds); }),
      both([&](int n) { return cost<doorman::sliding_log_limiter>(w, n, seconds); }),
      both([&](int n) { return cost<doorman::sliding_window_limiter>(w, n, seconds); }),
      both([&](int n) { return cost<doorman::sliding_window_limiter>(k12, n, seconds); }),
      both([&](int n) {
        // Unlimited would skip the algorithm: a rate no call reaches instead.
        return cost<doorman::leaky_bucket_limiter>(
            doorman::leaky_bucket_options{.rate = 1e12, .queue = 0}, n, seconds);
      }),
  };
}

// One chart per pattern: a panel per algorithm.
void write_svg(const std::string& path, const pattern& p, const std::vector<algorithm>& algos,
               const std::vector<accuracy>& results) {
  constexpr int panel_w = 420;
  constexpr int panel_h = 150;
  constexpr int cols = 2;
  const int rows = static_cast<int>((algos.size() + cols - 1) / cols);
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" "
      "fill=\"white\"/>\n<text x=\"10\" y=\"16\" font-size=\"13\">{}: each algorithm's own "
      "count (blue) and the exact count of its admissions in the last 60 s (orange); limit 100 "
      "(grey), first 10 minutes</text>\n",
      cols * panel_w + 20, rows * (panel_h + 30) + 30, p.name);
  for (std::size_t i = 0; i < algos.size(); ++i) {
    const int x0 = 10 + static_cast<int>(i % cols) * panel_w;
    const int y0 = 30 + static_cast<int>(i / cols) * (panel_h + 30);
    const int w = panel_w - 20;
    const int h = panel_h - 10;
    const auto& chart = results[i].chart;
    const double top = 220;
    auto y = [&](double v) { return y0 + 14 + h - std::min(v, top) / top * h; };
    auto line = [&](auto value, const char* colour) {
      std::string pts;
      for (std::size_t s = 0; s < chart.size(); ++s)
        pts += fmt::format("{:.1f},{:.1f} ",
                           x0 + static_cast<double>(s) / static_cast<double>(chart.size()) * w,
                           y(value(chart[s])));
      return fmt::format(
          "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.2\" points=\"{}\"/>\n", colour,
          pts);
    };
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\">{} (most in any 60 s: {})</text>\n<rect x=\"{}\" y=\"{}\" "
        "width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#ccc\"/>\n<line x1=\"{}\" y1=\"{:.1f}\" "
        "x2=\"{}\" y2=\"{:.1f}\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n<text x=\"{}\" "
        "y=\"{:.1f}\" fill=\"#999\">200</text>\n",
        x0, y0 + 10, algos[i].name, results[i].most_in_window, x0, y0 + 14, w, h, x0, y(100),
        x0 + w, y(100), x0 + w - 22, y(200) + 10);
    svg += line([](const sample& s) { return s.exact; }, "#e67e22");
    svg += line([](const sample& s) { return s.own; }, "#2470b3");
  }
  svg += "</svg>\n";
  std::ofstream(path) << svg;
}

}  // namespace

int main(int argc, char** argv) {
  int minutes = 60;
  double seconds = 0.5;
  std::string json_path;
  std::string svg_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", argv[i]);
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    try {
      if (a == "--minutes") {
        minutes = std::stoi(value());
      } else if (a == "--seconds") {
        seconds = std::stod(value());
      } else if (a == "--json") {
        json_path = value();
      } else if (a == "--svg") {
        svg_dir = value();
      } else if (a == "--help" || a == "-h") {
        std::puts(
            "usage: doorman_bench_algorithms [--minutes M] [--seconds S] [--json FILE] "
            "[--svg DIR]\n"
            "  --minutes M   simulated minutes of each traffic pattern (1-10000; default 60)\n"
            "  --seconds S   real seconds per cost measurement (default 0.5)\n"
            "  --json FILE   also write the results as JSON lines\n"
            "  --svg DIR     write one chart per traffic pattern into DIR");
        return 0;
      } else {
        std::fprintf(stderr, "unknown argument: %s (see --help)\n", argv[i]);
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "%s: not a number\n", argv[i - 1]);
      return 2;
    }
  }
  if (minutes < 1 || minutes > 10000 || !(seconds > 0 && seconds <= 60)) {
    std::fprintf(stderr, "--minutes must be 1 to 10000 and --seconds 0 to 60\n");
    return 2;
  }
  const auto algos = algorithms();
  const auto pats = patterns(minutes);
  std::ofstream json;
  if (!json_path.empty()) json.open(json_path);

  fmt::print("Accuracy: limit 100 per 60 s, {} simulated minutes per pattern\n\n", minutes);
  fmt::print(
      "| traffic | algorithm | offered | admitted | most in any 60 s | over the limit | "
      "refused under the limit | mean wait (s) | memory (bytes) |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& p : pats) {
    std::vector<accuracy> results;
    for (const auto& a : algos) {
      results.push_back(replay(a, p, minutes));
      const auto& r = results.back();
      fmt::print("| {} | {} | {} | {} | {} | {} | {} | {:.1f} | {} |\n", p.name, a.name, r.offered,
                 r.admitted, r.most_in_window,
                 r.most_in_window > 100 ? fmt::format("+{}", r.most_in_window - 100) : "0", r.under,
                 r.mean_delay, r.memory);
      if (json) {
        json << fmt::format(
            "{{\"kind\": \"accuracy\", \"traffic\": \"{}\", \"algorithm\": \"{}\", \"offered\": "
            "{}, \"admitted\": {}, \"most_in_window\": {}, \"refused_under_limit\": {}, "
            "\"mean_wait_s\": {:.3f}, \"memory_bytes\": {}}}\n",
            p.name, a.name, r.offered, r.admitted, r.most_in_window, r.under, r.mean_delay,
            r.memory);
      }
    }
    if (!svg_dir.empty()) write_svg(svg_dir + "/algorithms-" + p.name + ".svg", p, algos, results);
  }

  fmt::print("\nCost: ns per try_acquire (every call admitted), {} s per measurement\n\n", seconds);
  fmt::print("| algorithm | 1 thread | 2 threads (each) |\n|---|---:|---:|\n");
  const auto c = measure_costs(seconds);
  for (std::size_t i = 0; i < algos.size(); ++i) {
    fmt::print("| {} | {:.1f} | {:.1f} |\n", algos[i].name, c[i].one, c[i].two);
    if (json) {
      json << fmt::format(
          "{{\"kind\": \"cost\", \"algorithm\": \"{}\", \"ns_1_thread\": {:.2f}, "
          "\"ns_2_threads\": {:.2f}}}\n",
          algos[i].name, c[i].one, c[i].two);
    }
  }
  return 0;
}
