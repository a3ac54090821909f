#pragma once

/// \file
/// A run's outputs: the summary table (Markdown), the time series (CSV) and a chart (SVG) a
/// browser opens. The CSV and the SVG depend on the run alone, so the same seed gives the same
/// bytes.

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "doorman/core/markup.hpp"
#include "doorman/sim/scenario.hpp"

namespace doorman::sim {

/// The time series: one line per trace point.
inline void write_csv(std::ostream& os, const run_result& r) {
  os << "t,capacity,wants,granted,learning\n";
  for (const auto& p : r.trace) {
    os << fmt::format("{:.3f},{:.6f},{:.6f},{:.6f},{}\n", p.t, p.capacity, p.wants, p.granted,
                      p.learning ? 1 : 0);
  }
}

/// The events and how long each took to re-converge.
inline void write_events_csv(std::ostream& os, const run_result& r) {
  os << "t,event,converged_after\n";
  for (const auto& m : r.marks) {
    os << fmt::format("{:.3f},\"{}\",{}\n", m.t, m.label,
                      m.converged_after ? fmt::format("{:.1f}", *m.converged_after) : "");
  }
}

namespace detail {

/// A line chart's frame (1000 × 420): a title, axes from 0 to `t_end` seconds and from 0 to
/// `y_top`, shaded stretches, marked moments and lines with their legend, drawn in the order
/// called.
class svg_chart {
 public:
  svg_chart(std::ostream& os, double t_end, double y_top)
      : os_(os), t_end_(std::max(1.0, t_end)), y_max_(std::max(1.0, y_top) * 1.1) {}

  void title(const std::string& text) {
    os_ << fmt::format(
        R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" font-family="sans-serif" font-size="12">)"
        "\n",
        width, height);
    os_ << fmt::format(R"(<rect width="{}" height="{}" fill="white"/>)"
                       "\n",
                       width, height);
    os_ << fmt::format(R"(<text x="{}" y="20" font-size="14">{}</text>)"
                       "\n",
                       left, doorman::detail::xml_escape(text));
  }

  // A shaded stretch of time (learning mode).
  void shade(double from, double to) {
    os_ << fmt::format(R"(<rect x="{:.1f}" y="{}" width="{:.2f}" height="{}" fill="#eeeeee"/>)"
                       "\n",
                       x(from), top, x(to) - x(from), height - top - bottom);
  }

  void axes() {
    os_ << fmt::format(R"(<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="black"/>)"
                       "\n",
                       left, top, height - bottom);
    os_ << fmt::format(R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="black"/>)"
                       "\n",
                       left, height - bottom, width - right);
    for (int i = 0; i <= 5; ++i) {
      const double v = y_max_ / 1.1 * i / 5;
      os_ << fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end">{:.0f}</text>)"
                         "\n",
                         left - 6, y(v) + 4, v);
      const double t = t_end_ * i / 5;
      os_ << fmt::format(R"(<text x="{:.1f}" y="{}" text-anchor="middle">{:.0f} s</text>)"
                         "\n",
                         x(t), height - bottom + 18, t);
    }
  }

  // A marked moment (an event), its label shown on hover.
  void mark(double t, const std::string& label) {
    os_ << fmt::format(
        R"(<line x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}" stroke="#cc8800" stroke-dasharray="3,3"><title>{3:.0f} s: {4}</title></line>)"
        "\n",
        x(t), top, height - bottom, t, doorman::detail::xml_escape(label));
  }

  // One line of the chart: `value(i)` at `t(i)` for i in [0, n); its legend entry at `row`.
  template <class Time, class Value>
  void series(std::size_t n, Time t, Value value, const char* colour, const char* name, int row) {
    std::string points;
    for (std::size_t i = 0; i < n; ++i)
      points += fmt::format("{:.1f},{:.1f} ", x(t(i)), y(value(i)));
    os_ << fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>)"
                       "\n",
                       colour, points);
    os_ << fmt::format(
        R"(<rect x="{}" y="{}" width="14" height="3" fill="{}"/><text x="{}" y="{}">{}</text>)"
        "\n",
        left + 10 + 150 * row, height - 14, colour, left + 28 + 150 * row, height - 9, name);
  }

  // The legend of the shading and the marks (at `row` and the next), if there are any.
  void legend(int row, const char* shaded, bool marks) {
    const double at = left + 10 + 150 * row;
    if (shaded != nullptr) {
      os_ << fmt::format(
          R"(<rect x="{}" y="{}" width="14" height="10" fill="#eeeeee"/><text x="{}" y="{}">{}</text>)"
          "\n",
          at, height - 18, at + 18, height - 9, shaded);
    }
    if (marks) {
      os_ << fmt::format(
          R"(<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="#cc8800" stroke-dasharray="3,3"/><text x="{3}" y="{4}">event</text>)"
          "\n",
          at + 130, height - 13, at + 144, at + 150, height - 9);
    }
  }

  void end() { os_ << "</svg>\n"; }

 private:
  static constexpr double width = 1000;
  static constexpr double height = 420;
  static constexpr double left = 70;
  static constexpr double right = 20;
  static constexpr double top = 40;
  static constexpr double bottom = 50;

  [[nodiscard]] double x(double t) const { return left + (width - left - right) * t / t_end_; }
  [[nodiscard]] double y(double v) const {
    return top + (height - top - bottom) * (1 - v / y_max_);
  }

  std::ostream& os_;
  double t_end_ = 1;
  double y_max_ = 1;
};

}  // namespace detail

/// A line chart: capacity, total wants and total granted over time, learning periods shaded,
/// events marked.
inline void write_svg(std::ostream& os, const run_result& r) {
  const auto& trace = r.trace;
  double top = 0;
  for (const auto& p : trace)
    top = std::max({top, p.capacity, p.granted, p.wants});
  detail::svg_chart chart(os, trace.empty() ? 1.0 : trace.back().t, top);
  chart.title(fmt::format(
      "scenario {} ({}), seed {}: mean allocation {:.2f}%, {} of {} samples over capacity, "
      "max {:.2f}%",
      r.info.number, r.info.name, r.seed, 100 * r.summary.mean_allocation, r.summary.over_samples,
      r.summary.samples, 100 * r.summary.max_allocation));
  // Learning mode, shaded: one band per stretch of trace points in it.
  for (std::size_t i = 0; i + 1 < trace.size(); ++i) {
    if (!trace[i].learning) continue;
    std::size_t j = i + 1;
    while (j + 1 < trace.size() && trace[j].learning)
      ++j;
    chart.shade(trace[i].t, trace[j].t);
    i = j - 1;
  }
  chart.axes();
  for (const auto& m : r.marks)
    chart.mark(m.t, m.label);
  const auto t = [&](std::size_t i) { return trace[i].t; };
  chart.series(
      trace.size(), t, [&](std::size_t i) { return trace[i].capacity; }, "#d62728", "capacity", 0);
  chart.series(
      trace.size(), t, [&](std::size_t i) { return trace[i].wants; }, "#2ca02c", "total wants", 1);
  chart.series(
      trace.size(), t, [&](std::size_t i) { return trace[i].granted; }, "#1f77b4", "total granted",
      2);
  chart.legend(3, "learning mode", true);
  chart.end();
}

/// The summary as a Markdown table, one row per run.
[[nodiscard]] inline std::string summary_table(const std::vector<run_result>& runs) {
  std::string out =
      "| scenario | seed | clients | mean allocation | of min(capacity, wants) | samples over "
      "capacity | max | mean when over | re-converged (median / max, s) | requests/s by level "
      "|\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const auto& r : runs) {
    std::vector<double> times;
    std::size_t never = 0;
    for (const auto& m : r.marks) {
      if (m.converged_after) {
        times.push_back(*m.converged_after);
      } else {
        ++never;
      }
    }
    std::sort(times.begin(), times.end());
    std::string conv = "-";
    if (!times.empty()) {
      conv = fmt::format("{:.0f} / {:.0f}", times[times.size() / 2], times.back());
      if (never > 0) conv += fmt::format(" ({} unsettled)", never);
    }
    std::string levels;
    for (const double q : r.summary.requests_per_second)
      levels += fmt::format("{}{:.1f}", levels.empty() ? "" : " / ", q);
    out += fmt::format(
        "| {} {} | {} | {} | {:.2f}% | {:.2f}% | {} of {} | {:.2f}% | {} | {} | {} |\n",
        r.info.number, r.info.name, r.seed, r.clients, 100 * r.summary.mean_allocation,
        100 * r.summary.mean_allocation_of_demand, r.summary.over_samples, r.summary.samples,
        100 * r.summary.max_allocation,
        r.summary.over_samples > 0 ? fmt::format("{:.2f}%", 100 * r.summary.mean_when_over)
                                   : std::string("-"),
        conv, levels);
  }
  return out;
}

}  // namespace doorman::sim
