// Self-contained SVG charts for the strategy report: horizontal bars (throughput), grouped
// stacked bars (memory and step time per rank) and a per-rank Gantt timeline of one training
// step. Pure functions from plain data to SVG text; presentation attributes only, no CSS.
#ifndef TANDEM_TOOLS_SVG_H_
#define TANDEM_TOOLS_SVG_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem {
namespace tools {

// Text made safe for SVG/HTML content and attribute values.
std::string XmlEscape(absl::string_view s);

// A "nice" tick step (1, 2 or 5 x 10^k) splitting [0, range] into about `ticks` parts.
double NiceStep(double range, int ticks);

// ---- horizontal bars ----

struct Bar {
  std::string label;
  double value = 0;
  std::string value_text;  // shown after the bar; the value with the unit when empty
  std::string color;       // "#4e79a7" when empty
};

struct BarChartSpec {
  std::string title;
  std::string unit;  // of the axis
  std::vector<Bar> bars;
  int width = 760;  // the labels' column widens for long labels
};

std::string BarChartSvg(const BarChartSpec& spec);

// ---- grouped stacked bars ----

struct Series {
  std::string name;
  std::string color;
};

struct StackedBar {
  std::string label;           // under the bar ("r0")
  std::vector<double> values;  // one per series, in the chart's unit
};

struct BarGroup {
  std::string label;  // under the group ("data parallel")
  std::vector<StackedBar> bars;
};

struct StackedBarChartSpec {
  std::string title;
  std::string unit;  // of the vertical axis
  std::vector<Series> series;
  std::vector<BarGroup> groups;
  int width = 960;  // at least: wider where the groups' labels need it (two lines each at most)
  int height = 380;
};

std::string StackedBarChartSvg(const StackedBarChartSpec& spec);

// ---- timeline ----

enum class SpanKind {
  kForward,      // compute: forward of a micro-batch
  kBackward,     // compute: backward of a micro-batch
  kCompute,      // other compute
  kComm,         // communication lane: a collective or transfer running
  kExposedComm,  // compute lane: waiting for a collective (gradients, the loss, parameters)
  kBubble,       // compute lane: a pipeline stage waiting for activations or gradients
  kOptimizer,
};
const char* SpanKindName(SpanKind k);
const char* SpanKindColor(SpanKind k);

struct GanttSpan {
  int row = 0;             // rank
  bool comm_lane = false;  // the thinner communication sub-row
  double start_ms = 0;
  double end_ms = 0;
  SpanKind kind = SpanKind::kCompute;
  std::string text;     // inside the rectangle when it fits (a micro-batch number)
  std::string tooltip;  // <title>
};

struct GanttSpec {
  std::string title;
  std::vector<std::string> rows;  // "rank 0", ...
  std::vector<GanttSpan> spans;
  double end_ms = 0;  // the axis runs from 0 to this (the latest span's end when 0)
  int width = 1040;
};

// One row per rank (compute lane, then a thinner communication lane), a time axis in ms and
// a legend of the kinds present.
std::string GanttSvg(const GanttSpec& spec);

}  // namespace tools
}  // namespace tandem

#endif  // TANDEM_TOOLS_SVG_H_
