// The report's SVG charts: coordinates computed here, every element written with explicit
// attributes so a chart file renders the same standalone and inlined in the HTML report.
#include "tools/svg.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace tools {
namespace {

constexpr char kFont[] = "font-family=\"Helvetica, Arial, sans-serif\"";
constexpr char kDefaultBarColor[] = "#4e79a7";

std::string Header(int width, int height, const std::string& title) {
  return absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "role=\"img\" %s font-size=\"12\">\n<title>%s</title>\n"
      "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n",
      width, height, width, height, kFont, XmlEscape(title), width, height);
}

std::string Text(double x, double y, const std::string& s, const char* anchor = "start",
                 int size = 12, const char* fill = "#222222", const char* weight = "normal") {
  return absl::StrFormat(
      "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" font-size=\"%d\" fill=\"%s\" "
      "font-weight=\"%s\">%s</text>\n",
      x, y, anchor, size, fill, weight, XmlEscape(s));
}

std::string Rect(double x, double y, double w, double h, const std::string& fill,
                 const std::string& tooltip = "", const char* extra = "") {
  std::string out =
      absl::StrFormat("<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"%s%s",
                      x, y, std::max(0.0, w), std::max(0.0, h), fill, *extra ? " " : "", extra);
  if (tooltip.empty()) return out + "/>\n";
  return absl::StrCat(out, "><title>", XmlEscape(tooltip), "</title></rect>\n");
}

std::string Line(double x1, double y1, double x2, double y2, const char* stroke = "#999999",
                 double width = 1) {
  return absl::StrFormat(
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
      "stroke-width=\"%.1f\"/>\n",
      x1, y1, x2, y2, stroke, width);
}

// "0", "2.5", "1,000".
std::string Tick(double v) {
  if (std::fabs(v - std::round(v)) < 1e-9 * std::max(1.0, std::fabs(v))) {
    const int64_t i = static_cast<int64_t>(std::llround(v));
    std::string digits = absl::StrCat(i < 0 ? -i : i), out;
    for (size_t k = 0; k < digits.size(); ++k) {
      if (k > 0 && (digits.size() - k) % 3 == 0) out.push_back(',');
      out.push_back(digits[k]);
    }
    return i < 0 ? "-" + out : out;
  }
  return absl::StrFormat("%g", v);
}

// About how wide `s` is drawn in Helvetica at `size` px (a bold face is a little wider).
double TextWidth(const std::string& s, int size, bool bold = false) {
  return (bold ? 0.62 : 0.56) * size * s.size();
}

// `label` on one line, or on two split at the space nearest its middle when it is wider than
// `room` px at 12 px bold.
std::vector<std::string> LabelLines(const std::string& label, double room) {
  if (TextWidth(label, 12, true) <= room) return {label};
  size_t best = std::string::npos;
  for (size_t i = label.find(' '); i != std::string::npos; i = label.find(' ', i + 1)) {
    const auto off = [&](size_t k) {
      return std::abs(2 * static_cast<long>(k) - static_cast<long>(label.size()));
    };
    if (best == std::string::npos || off(i) < off(best)) best = i;
  }
  if (best == std::string::npos) return {label};
  return {label.substr(0, best), label.substr(best + 1)};
}

// Dark fills get white text.
bool IsDark(SpanKind k) {
  return k == SpanKind::kBackward || k == SpanKind::kExposedComm || k == SpanKind::kOptimizer;
}

}  // namespace

std::string XmlEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') {
          out += ' ';  // not allowed in XML 1.0
        } else {
          out.push_back(c);
        }
    }
  }
  return out;
}

double NiceStep(double range, int ticks) {
  if (!(range > 0) || !std::isfinite(range) || ticks < 1) return 1;
  const double raw = range / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return nice * mag;
}

// ---- horizontal bars ----

std::string BarChartSvg(const BarChartSpec& spec) {
  const int right = 150, top = 40, bar_h = 22, pitch = 32, axis_h = 34;
  const int n = static_cast<int>(spec.bars.size());
  double label_w = 170;  // wider for long labels
  for (const Bar& b : spec.bars) label_w = std::max(label_w, 16 + TextWidth(b.label, 12));
  const int height = top + std::max(1, n) * pitch + axis_h;
  const double plot_w = spec.width - label_w - right;
  double max_v = 0;
  for (const Bar& b : spec.bars) max_v = std::max(max_v, std::isfinite(b.value) ? b.value : 0.0);
  const double step = NiceStep(max_v > 0 ? max_v : 1, 5);
  const double axis_max = std::max(step, std::ceil(max_v / step - 1e-9) * step);
  auto x = [&](double v) { return label_w + plot_w * std::max(0.0, v) / axis_max; };

  std::string out = Header(spec.width, height, spec.title);
  out += Text(10, 22, spec.title, "start", 14, "#222222", "bold");
  const double axis_y = top + std::max(1, n) * pitch;
  for (double t = 0; t <= axis_max + step * 1e-6; t += step) {
    out += Line(x(t), top - 6, x(t), axis_y, "#e3e3e3");
    out += Text(x(t), axis_y + 16, Tick(t), "middle", 11, "#555555");
  }
  out += Text(label_w + plot_w / 2, axis_y + 31, spec.unit, "middle", 11, "#555555");
  out += Line(label_w, top - 6, label_w, axis_y, "#888888");
  for (int i = 0; i < n; ++i) {
    const Bar& b = spec.bars[i];
    const double y = top + i * pitch;
    const std::string value_text =
        b.value_text.empty() ? absl::StrCat(Tick(b.value), " ", spec.unit) : b.value_text;
    out += Text(label_w - 8, y + bar_h * 0.7, b.label, "end");
    out +=
        Rect(label_w, y, x(b.value) - label_w, bar_h, b.color.empty() ? kDefaultBarColor : b.color,
             absl::StrCat(b.label, ": ", value_text));
    out += Text(x(b.value) + 6, y + bar_h * 0.7, value_text, "start", 11, "#333333");
  }
  return out + "</svg>\n";
}

// ---- grouped stacked bars ----

std::string StackedBarChartSvg(const StackedBarChartSpec& spec) {
  const int left = 70, right = 16, top = 64;
  int bars = 0;
  double max_v = 0;
  for (const BarGroup& g : spec.groups) {
    bars += static_cast<int>(g.bars.size());
    for (const StackedBar& b : g.bars) {
      double sum = 0;
      for (double v : b.values) sum += std::isfinite(v) ? std::max(0.0, v) : 0.0;
      max_v = std::max(max_v, sum);
    }
  }
  const int groups = static_cast<int>(spec.groups.size());
  const double gap = 1.2;  // between groups, in bar slots
  const double slots = std::max(1.0, bars + gap * std::max(0, groups - 1) + 0.6);
  // Each group's label under its bars, on two lines where one is too wide; the chart widens
  // until every label's lines fit under its group.
  double slot = (spec.width - left - right) / slots;
  std::vector<std::vector<std::string>> labels;
  bool two_lines = false;
  for (const BarGroup& g : spec.groups) {
    const double n = std::max<size_t>(1, g.bars.size());
    labels.push_back(LabelLines(g.label, n * slot + gap * slot - 6));
    two_lines = two_lines || labels.back().size() > 1;
    for (const std::string& line : labels.back()) {
      slot = std::max(slot, (TextWidth(line, 12, true) + 6) / (n + gap));
    }
  }
  const int width =
      static_cast<int>(std::ceil(std::max<double>(spec.width, left + right + slot * slots)));
  const int bottom = two_lines ? 66 : 52;
  const double plot_w = width - left - right, plot_h = spec.height - top - bottom;
  const double bar_w = std::min(56.0, slot * 0.78);
  const double step = NiceStep(max_v > 0 ? max_v : 1, 5);
  const double axis_max = std::max(step, std::ceil(max_v / step - 1e-9) * step);
  auto y = [&](double v) { return top + plot_h - plot_h * v / axis_max; };

  std::string out = Header(width, spec.height, spec.title);
  out += Text(10, 22, spec.title, "start", 14, "#222222", "bold");
  // Legend.
  double lx = left;
  for (const Series& s : spec.series) {
    out += Rect(lx, 34, 12, 12, s.color);
    out += Text(lx + 16, 44, s.name, "start", 11);
    lx += 28 + 6.5 * s.name.size();
  }
  for (double t = 0; t <= axis_max + step * 1e-6; t += step) {
    out += Line(left, y(t), left + plot_w, y(t), "#e3e3e3");
    out += Text(left - 6, y(t) + 4, Tick(t), "end", 11, "#555555");
  }
  out += absl::StrFormat(
      "<text x=\"14\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\" fill=\"#555555\" "
      "transform=\"rotate(-90 14 %.1f)\">%s</text>\n",
      top + plot_h / 2, top + plot_h / 2, XmlEscape(spec.unit));
  double cursor = left + slot * 0.3;
  for (size_t gi = 0; gi < spec.groups.size(); ++gi) {
    const BarGroup& g = spec.groups[gi];
    const double group_start = cursor;
    for (const StackedBar& b : g.bars) {
      const double bx = cursor + (slot - bar_w) / 2;
      double acc = 0;
      for (size_t s = 0; s < b.values.size() && s < spec.series.size(); ++s) {
        const double v = std::isfinite(b.values[s]) ? std::max(0.0, b.values[s]) : 0.0;
        if (v <= 0) continue;
        out += Rect(bx, y(acc + v), bar_w, y(acc) - y(acc + v), spec.series[s].color,
                    absl::StrFormat("%s, %s, %s: %.3g %s", g.label, b.label, spec.series[s].name, v,
                                    spec.unit));
        acc += v;
      }
      out += Text(bx + bar_w / 2, top + plot_h + 14, b.label, "middle", 10, "#444444");
      cursor += slot;
    }
    for (size_t l = 0; l < labels[gi].size(); ++l) {
      out += Text((group_start + cursor) / 2, top + plot_h + 32 + 14 * l, labels[gi][l], "middle",
                  12, "#222222", "bold");
    }
    cursor += slot * gap;
  }
  out += Line(left, top + plot_h, left + plot_w, top + plot_h, "#888888");
  return out + "</svg>\n";
}

// ---- timeline ----

const char* SpanKindName(SpanKind k) {
  switch (k) {
    case SpanKind::kForward:
      return "forward";
    case SpanKind::kBackward:
      return "backward";
    case SpanKind::kCompute:
      return "other compute";
    case SpanKind::kComm:
      return "communication running";
    case SpanKind::kExposedComm:
      return "waiting for a collective";
    case SpanKind::kBubble:
      return "pipeline bubble (waiting for a peer)";
    case SpanKind::kOptimizer:
      return "optimizer";
  }
  return "?";
}

const char* SpanKindColor(SpanKind k) {
  switch (k) {
    case SpanKind::kForward:
      return "#9ecae1";
    case SpanKind::kBackward:
      return "#2b6cb0";
    case SpanKind::kCompute:
      return "#9e9ac8";
    case SpanKind::kComm:
      return "#fd8d3c";
    case SpanKind::kExposedComm:
      return "#c0392b";
    case SpanKind::kBubble:
      return "#cfcfcf";
    case SpanKind::kOptimizer:
      return "#2f9e44";
  }
  return "#000000";
}

std::string GanttSvg(const GanttSpec& spec) {
  const int right = 18, top = 62, lane_h = 22, comm_h = 9, pitch = 44, axis_h = 36;
  const int rows = static_cast<int>(spec.rows.size());
  double left = 74;  // wider for long row labels: "rank 3 (1, 1)"
  for (const std::string& row : spec.rows) left = std::max(left, 16 + TextWidth(row, 12, true));
  const int height = top + std::max(1, rows) * pitch + axis_h;
  const double plot_w = spec.width - left - right;
  double end = spec.end_ms;
  if (!(end > 0)) {
    for (const GanttSpan& s : spec.spans) end = std::max(end, s.end_ms);
  }
  if (!(end > 0)) end = 1;
  auto x = [&](double t) { return left + plot_w * std::clamp(t, 0.0, end) / end; };

  std::string out = Header(spec.width, height, spec.title);
  out += Text(10, 22, spec.title, "start", 14, "#222222", "bold");
  // Legend: the kinds present, in a fixed order.
  bool present[7] = {false};
  for (const GanttSpan& s : spec.spans) present[static_cast<int>(s.kind)] = true;
  double lx = left;
  for (int k = 0; k < 7; ++k) {
    if (!present[k]) continue;
    const SpanKind kind = static_cast<SpanKind>(k);
    out += Rect(lx, 34, 12, 12, SpanKindColor(kind));
    out += Text(lx + 16, 44, SpanKindName(kind), "start", 11);
    lx += 30 + 6.2 * std::string(SpanKindName(kind)).size();
  }
  // Axis and grid.
  const double axis_y = top + std::max(1, rows) * pitch - 6;
  const double step = NiceStep(end, 10);
  for (double t = 0; t <= end + step * 1e-6; t += step) {
    out += Line(x(t), top - 6, x(t), axis_y, "#ececec");
    out += Text(x(t), axis_y + 15, Tick(t), "middle", 11, "#555555");
  }
  out += Text(left + plot_w / 2, axis_y + 30, "time in the step (ms)", "middle", 11, "#555555");
  out += Line(left, axis_y, left + plot_w, axis_y, "#888888");
  // Rows.
  for (int r = 0; r < rows; ++r) {
    const double y = top + r * pitch;
    out += Rect(left, y, plot_w, lane_h, "#f6f6f6");
    out += Rect(left, y + lane_h + 2, plot_w, comm_h, "#fbf3ec");
    out += Text(left - 8, y + 15, spec.rows[r], "end", 12, "#222222", "bold");
    out += Text(left - 8, y + lane_h + 10, "comm", "end", 9, "#777777");
  }
  for (const GanttSpan& s : spec.spans) {
    if (s.row < 0 || s.row >= rows || !(s.end_ms > s.start_ms)) continue;
    const double y = top + s.row * pitch + (s.comm_lane ? lane_h + 2 : 0);
    const double h = s.comm_lane ? comm_h : lane_h;
    const double x0 = x(s.start_ms), x1 = x(s.end_ms);
    const double w = std::max(0.6, x1 - x0);
    // A hairline keeps back-to-back spans (consecutive all-reduces) apart.
    out += Rect(x0, y, w, h, SpanKindColor(s.kind), s.tooltip,
                w >= 3 ? "stroke=\"#ffffff\" stroke-width=\"0.6\"" : "");
    if (!s.text.empty() && !s.comm_lane && w >= 6.5 * s.text.size() + 3) {
      out += Text(x0 + w / 2, y + 15, s.text, "middle", 10, IsDark(s.kind) ? "#ffffff" : "#1a1a1a");
    }
  }
  return out + "</svg>\n";
}

}  // namespace tools
}  // namespace tandem
