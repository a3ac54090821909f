// Learned capacity's control law (core/capacity_learner.hpp) against a model of a protected
// service whose true capacity steps, with noise: how fast it follows, how much it uses, how far
// it swings, and that it holds on silence.

#include <catch2/catch.hpp>

#include <doorman/core/capacity_learner.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace {

// Ten clients that always want more than they get, each taking a tenth of the capacity at its
// own refresh (every 5 s, staggered); the service answers overloaded whatever passes its true
// capacity (1000, then 500 from 100 s, then 750 from 200 s: -50% and +50%), with 2% noise. The
// law steps every 5 s on the calls of that interval. Time in steps of 0.1 s.
struct run_result {
  std::vector<double> t, learnt, truth, offered;
};

run_result model(unsigned seed) {
  constexpr int n = 10;
  constexpr double dt = 0.1, refresh = 5;
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0, 0.02);
  std::uniform_real_distribution<double> phase_of(0, refresh);
  doorman::capacity_learner learn({.min = 50, .max = 5000}, 600);
  std::vector<double> lease(n, learn.capacity() / n), phase(n);
  for (auto& p : phase)
    p = phase_of(rng);
  run_result r;
  double calls = 0, overloads = 0;
  for (int k = 0; k < 3000; ++k) {
    const double t = k * dt;
    const double truth = t < 100 ? 1000 : t < 200 ? 500 : 750;
    double offered = 0;
    for (double l : lease)
      offered += l;
    calls += offered * dt;
    overloads += std::max(0.0, offered - truth * (1 + noise(rng))) * dt;
    for (int i = 0; i < n; ++i) {
      if (t >= phase[i] && std::fmod(t - phase[i], refresh) < dt) lease[i] = learn.capacity() / n;
    }
    if (k > 0 && k % 50 == 0) {
      learn.update({.calls = calls, .overloads = overloads, .seconds = refresh, .held = true});
      calls = overloads = 0;
    }
    r.t.push_back(t);
    r.learnt.push_back(learn.capacity());
    r.truth.push_back(truth);
    r.offered.push_back(offered);
  }
  return r;
}

// The first time from `from` at which the learnt capacity is within 10% of the truth.
double settled_at(const run_result& r, double from) {
  for (std::size_t i = 0; i < r.t.size(); ++i) {
    if (r.t[i] >= from && std::abs(r.learnt[i] - r.truth[i]) <= 0.1 * r.truth[i]) return r.t[i];
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace

TEST_CASE("a learnt capacity follows a service that steps by -50% and +50%, within 30 s",
          "[core][learn]") {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    INFO("seed " << seed);
    const auto r = model(seed);
    CHECK(settled_at(r, 100) - 100 <= 30);
    CHECK(settled_at(r, 200) - 200 <= 30);
    // Steady state (the last 50 s of each level): at least 90% of the true capacity used,
    // and no swing past ±10% of it.
    for (double start : {50.0, 150.0, 250.0}) {
      double used = 0, truth = 0, worst = 0;
      for (std::size_t i = 0; i < r.t.size(); ++i) {
        if (r.t[i] < start || r.t[i] >= start + 50) continue;
        used += std::min(r.offered[i], r.truth[i]);
        truth += r.truth[i];
        worst = std::max(worst, std::abs(r.learnt[i] - r.truth[i]) / r.truth[i]);
      }
      INFO("from " << start << " s");
      CHECK(used >= 0.9 * truth);
      CHECK(worst <= 0.1);
    }
  }
}

TEST_CASE("a learnt capacity holds on silence, within its bounds, and bounds each cut",
          "[core][learn]") {
  doorman::capacity_learner learn({.min = 100, .max = 2000}, 1000);
  using doorman::learn_step;
  // Silence, demand below the capacity, and numbers that mean nothing: no change.
  CHECK(learn.update({}) == learn_step::hold);
  CHECK(learn.update({.calls = 4000, .overloads = 0, .seconds = 5, .held = false}) ==
        learn_step::hold);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const doorman::overload_sample s : {doorman::overload_sample{nan, 0, 5, true},
                                           {inf, 0, 5, true},
                                           {-1, 0, 5, true},
                                           {100, 200, 5, true},
                                           {100, nan, 5, true},
                                           {100, 0, 0, true},
                                           {100, 0, -5, true}}) {
    CHECK(learn.update(s) == learn_step::hold);
  }
  CHECK(learn.capacity() == 1000);
  // Rises by doubling steps once each was tried (the clients used the whole capacity), up
  // to the bound.
  const auto used_all = [&] { return doorman::overload_sample{5 * learn.capacity(), 0, 5, true}; };
  CHECK(learn.update(used_all()) == learn_step::rise);
  CHECK(learn.capacity() == Approx(1020));
  learn.update(used_all());
  CHECK(learn.capacity() == Approx(1060.8));
  learn.update({.calls = 5000, .overloads = 0, .seconds = 5, .held = true});  // not tried
  CHECK(learn.capacity() == Approx(1060.8 * 1.08));
  learn.update(used_all());  // the same step again: the last one was not tried
  CHECK(learn.capacity() == Approx(1060.8 * 1.08 * 1.08));
  for (int i = 0; i < 10; ++i)
    learn.update(used_all());
  CHECK(learn.capacity() == 2000);
  // A cut goes to what got through less the margin, but takes at most half at once, and
  // never below the bound; the next rise starts small again.
  CHECK(learn.update({.calls = 10000, .overloads = 9000, .seconds = 5, .held = true}) ==
        learn_step::cut);
  CHECK(learn.capacity() == 1000);
  learn.update({.calls = 5000, .overloads = 500, .seconds = 5, .held = true});
  CHECK(learn.capacity() == Approx(873));  // 900 a second got through, less 3%
  learn.update({.calls = 5000, .overloads = 0, .seconds = 5, .held = true});
  CHECK(learn.capacity() == Approx(873 * 1.02));
  for (int i = 0; i < 5; ++i)
    learn.update({.calls = 100, .overloads = 99, .seconds = 5, .held = true});
  CHECK(learn.capacity() == 100);
  // Within 0.5% of overloads, nothing is cut.
  doorman::capacity_learner calm({}, 500);
  CHECK(calm.update({.calls = 1000, .overloads = 5, .seconds = 5, .held = false}) ==
        learn_step::hold);
  CHECK(calm.capacity() == 500);
}
