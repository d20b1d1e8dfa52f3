#include "parallel/metrics.h"

#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/json.h"

namespace tandem {

StepRecord StepRecordOf(const StepReport& r) {
  StepRecord s;
  s.step = r.step;
  s.loss = r.loss;
  if (r.val_loss) s.val_loss = *r.val_loss;
  s.lr = r.lr;
  s.grad_norm = r.grad_norm;
  s.skipped = r.skipped;
  s.seconds = r.seconds;
  s.host_syncs = r.host_syncs;
  return s;
}

std::string MetricsPath(const std::string& run_dir, int rank) {
  return absl::StrFormat("%s/metrics/rank-%d.jsonl", run_dir, rank);
}

std::string MetricsLine(const StepRecord& r) {
  // Times in seconds, to the microsecond.
  auto seconds = [](double v) { return JsonRounded(v, 6); };
  // The losses, learning rates and norms are floats: exactly.
  auto exact = [](double v) { return JsonFloat(static_cast<float>(v)); };
  Json j;
  j["step"] = r.step;
  j["loss"] = exact(r.loss);
  if (r.val_loss) j["val_loss"] = exact(*r.val_loss);
  j["seconds"] = seconds(r.seconds);
  if (r.breakdown) {
    j["compute"] = seconds(r.compute);
    j["comm"] = seconds(r.comm);
    j["exposed_comm"] = seconds(r.exposed_comm);
    if (r.tensor_comm > 0) j["tensor_comm"] = seconds(r.tensor_comm);
    j["bubble"] = seconds(r.bubble);
    j["optimizer"] = seconds(r.optimizer);
    j["input"] = seconds(r.input);
  }
  j["host_syncs"] = r.host_syncs;
  j["peak_in_flight"] = r.peak_in_flight;
  j["comm_bytes"] = r.comm_bytes;
  j["sequence"] = r.sequence;
  j["lr"] = exact(r.lr);
  j["grad_norm"] = exact(r.grad_norm);
  j["skipped"] = r.skipped;
  j["allocated_bytes"] = r.allocated_bytes;
  j["peak_bytes"] = r.peak_bytes;
  j["param_bytes"] = r.param_bytes;
  j["grad_bytes"] = r.grad_bytes;
  j["optimizer_bytes"] = r.optimizer_bytes;
  return JsonText(j, JsonLayout::kLine);
}

absl::StatusOr<StepRecord> ParseMetricsLine(absl::string_view line) {
  absl::StatusOr<Json> j = ParseJson(line);
  if (!j.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics line: ", j.status().message(), ": ", line));
  }
  // A member's number (true and false as 1 and 0; null, written for nan and infinities, as
  // nan); none when missing or of another type.
  auto number = [&](const char* key) -> std::optional<double> {
    if (!j->is_object()) return std::nullopt;
    const auto it = j->find(key);
    if (it == j->end()) return std::nullopt;
    if (it->is_number()) return it->get<double>();
    if (it->is_boolean()) return it->get<bool>() ? 1 : 0;
    if (it->is_null()) return std::numeric_limits<double>::quiet_NaN();
    return std::nullopt;
  };
  const std::optional<double> step = number("step"), loss = number("loss"),
                              seconds = number("seconds");
  if (!step || !loss || !seconds || !std::isfinite(*step) || !std::isfinite(*seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics line without a step, loss or seconds (numbers): ", line));
  }
  auto get = [&](const char* key) { return number(key).value_or(0.0); };
  auto count = [&](const char* key) {
    const double v = get(key);
    return std::isfinite(v) ? static_cast<int64_t>(v) : 0;
  };
  StepRecord r;
  r.step = static_cast<int>(*step);
  r.loss = *loss;
  r.val_loss = number("val_loss");
  r.lr = get("lr");
  r.grad_norm = get("grad_norm");
  r.skipped = get("skipped") != 0;
  r.seconds = *seconds;
  r.breakdown = number("compute").has_value();
  r.compute = get("compute");
  r.comm = get("comm");
  r.exposed_comm = get("exposed_comm");
  r.tensor_comm = get("tensor_comm");
  r.bubble = get("bubble");
  r.optimizer = get("optimizer");
  r.input = get("input");
  r.host_syncs = count("host_syncs");
  r.peak_in_flight = static_cast<int>(count("peak_in_flight"));
  r.comm_bytes = count("comm_bytes");
  r.sequence = count("sequence");
  r.allocated_bytes = count("allocated_bytes");
  r.peak_bytes = count("peak_bytes");
  r.param_bytes = count("param_bytes");
  r.grad_bytes = count("grad_bytes");
  r.optimizer_bytes = count("optimizer_bytes");
  return r;
}

MetricsWriter::MetricsWriter(std::string path)
    : path_(std::move(path)), out_(path_, std::ios::app) {}

absl::Status MetricsWriter::Append(const StepRecord& r) {
  out_ << MetricsLine(r) << '\n';
  out_.flush();
  if (!out_) return absl::InternalError(absl::StrFormat("cannot write %s", path_));
  return absl::OkStatus();
}

}  // namespace tandem
