// The per-step metrics a worker (and examples/train) appends to
// <run_dir>/metrics/rank-<r>.jsonl, one JSON object a line:
//
//   {"step": 3, "loss": 5.48475, "seconds": 0.000391, "compute": 0.00027, ...}
//
// and reading such a line back. The launcher follows the files as they grow (progress) and
// reads them whole at the end (run.json); tools/compare and the end-to-end tests read them
// too, the tests with sed: a line starts with its step and loss, in that order.
#ifndef TANDEM_PARALLEL_METRICS_H_
#define TANDEM_PARALLEL_METRICS_H_

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/trainer.h"

namespace tandem {

// One rank's record of one step.
struct StepRecord {
  int step = 0;             // 0-based
  double loss = 0;          // the global batch's; nan where it was not finite (null)
  // The validation loss after this step, where one was evaluated ("val_loss" in the line).
  std::optional<double> val_loss;
  double lr = 0;            // the learning rate the step used
  double grad_norm = 0;     // before clipping; nan where it was not finite (null)
  bool skipped = false;     // the loss scaler skipped the update
  double seconds = 0;       // the whole step
  // Where the step's time went. A one-device step (examples/train) measures only its whole;
  // then `breakdown` is false and the line leaves these out.
  bool breakdown = true;
  double compute = 0;       // forward and backward
  double comm = 0;          // the communicator's busy time on the step's operations
  double exposed_comm = 0;  // waiting for communication
  double tensor_comm = 0;   // waiting for tensor-parallel collectives (0 without)
  double bubble = 0;        // pipeline: waiting on another stage (StepTiming::bubble_seconds)
  double optimizer = 0;
  double input = 0;         // waiting for a micro-batch's copy to the device
  int64_t host_syncs = 0;   // host synchronizations the rank made during the step
  int peak_in_flight = 0;   // micro-batches whose activations were held at once
  int64_t comm_bytes = 0;
  int64_t sequence = 0;     // the last collective's sequence number
  int64_t allocated_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t param_bytes = 0;      // model state: parameters (and their 16-bit copy),
  int64_t grad_bytes = 0;       // gradients,
  int64_t optimizer_bytes = 0;  // optimizer moments
};

// A record with what a step's report holds: step, loss, validation loss, learning rate,
// norm, skip, seconds and host synchronizations.
StepRecord StepRecordOf(const StepReport& r);

// <run_dir>/metrics/rank-<rank>.jsonl.
std::string MetricsPath(const std::string& run_dir, int rank);

// The record as one metrics line, without the newline. The step's floats (loss, learning
// rate, norm) are written in full: the shortest decimal that reads back as the same float, so
// two runs' losses compare bit for bit as text; times to the microsecond; nan and infinities
// as null.
std::string MetricsLine(const StepRecord& r);

// Parses one metrics line; step, loss and seconds must be there (the loss may be null: a step
// without a loss, read as nan); any other field missing reads as 0 (false). An error names
// what is wrong.
absl::StatusOr<StepRecord> ParseMetricsLine(absl::string_view line);

// Appends metrics lines to a file, each flushed as it is written (the launcher follows it).
class MetricsWriter {
 public:
  // Opens `path` for appending (a resumed run continues its file); made if missing.
  explicit MetricsWriter(std::string path);
  absl::Status Append(const StepRecord& r);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_METRICS_H_
