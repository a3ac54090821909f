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
#include "doorman/core/svg_chart.hpp"
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

/// A line chart: capacity, total wants and total granted over time, learning periods shaded,
/// events marked.
inline void write_svg(std::ostream& os, const run_result& r) {
  const auto& trace = r.trace;
  double top = 0;
  for (const auto& p : trace)
    top = std::max({top, p.capacity, p.granted, p.wants});
  doorman::detail::svg_chart chart(os, trace.empty() ? 1.0 : trace.back().t, top);
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
  chart.lines(trace.size(), t,
              {{[&](std::size_t i) { return trace[i].capacity; }, "#d62728", "capacity"},
               {[&](std::size_t i) { return trace[i].wants; }, "#2ca02c", "total wants"},
               {[&](std::size_t i) { return trace[i].granted; }, "#1f77b4", "total granted"}});
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
