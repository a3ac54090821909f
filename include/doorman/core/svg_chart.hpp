#pragma once

/// \file
/// A line chart in SVG, written as text: the simulator's reports and the admin endpoint's
/// status pages draw with it.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <ostream>
#include <string>

#include <fmt/format.h>

#include "doorman/core/markup.hpp"

namespace doorman {

namespace detail {

/// A line chart's frame (1000 × 420): a title, axes from `t_start` to `t_end` seconds and from
/// 0 to `y_top`, shaded stretches, marked moments and lines with their legend, drawn in the
/// order called.
class svg_chart {
 public:
  svg_chart(std::ostream& os, double t_end, double y_top, double t_start = 0)
      : os_(os),
        t_start_(t_start),
        t_end_(std::max(t_start + 1, t_end)),
        y_max_(std::max(1.0, y_top) * 1.1) {}

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
                       left, xml_escape(text));
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
      const double t = t_start_ + (t_end_ - t_start_) * i / 5;
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
        x(t), top, height - bottom, t, xml_escape(label));
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

  // One line of `lines`: its value at point i, its colour and its legend entry.
  struct line {
    std::function<double(std::size_t)> value;
    const char* colour;
    const char* name;
  };

  // Lines over the same `n` points at `t(i)`, their legend entries from row 0 in order.
  template <class Time>
  void lines(std::size_t n, Time t, std::initializer_list<line> all) {
    int row = 0;
    for (const line& l : all)
      series(n, t, l.value, l.colour, l.name, row++);
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

  [[nodiscard]] double x(double t) const {
    return left + (width - left - right) * (t - t_start_) / (t_end_ - t_start_);
  }
  [[nodiscard]] double y(double v) const {
    return top + (height - top - bottom) * (1 - v / y_max_);
  }

  std::ostream& os_;
  double t_start_ = 0;
  double t_end_ = 1;
  double y_max_ = 1;
};

}  // namespace detail

}  // namespace doorman
