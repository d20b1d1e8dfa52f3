// The live progress line: "step 12/300  loss 3.1234  48,000 tok/s  peak 512 MB  ETA 0:42"
// (with "val 2.3456" after the loss once a validation loss is known),
// rewritten in place on a terminal, printed every few seconds otherwise, with other messages
// kept above it.
#ifndef TANDEM_LAUNCHER_PROGRESS_H_
#define TANDEM_LAUNCHER_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "launcher/run_report.h"
#include "parallel/grid.h"

namespace tandem {
namespace launcher {

struct ProgressState {
  int step = 0;                    // steps completed
  int total = 0;
  bool has_loss = false;
  double loss = 0;
  bool has_val_loss = false;       // the latest validation loss, once there is one
  double val_loss = 0;
  double tokens_per_second = 0;    // 0: not known yet
  int64_t peak_bytes = -1;         // largest across ranks; -1: not known yet
  std::string peak_where;          // in a hybrid grid, whose: "rank 2 (replica 0, stage 1)"
  double eta_seconds = -1;         // -1: not known yet
};

// The progress line, without a newline.
std::string FormatProgress(const ProgressState& s);

// Follows the steps as workers report them, in constant time per record (per rank for a
// step every rank completed): rank 0's step and loss (the global loss) and latest validation
// loss, the slowest rank's
// mean step as MeanStepSeconds computes it (run_report.h: steps every rank completed, the first
// kWarmupSteps left out when later ones exist), and the largest peak memory of any rank (in
// a hybrid `grid`, with the rank's place: its stage decides what it holds).
class ProgressTracker {
 public:
  ProgressTracker(int ranks, int total, int64_t tokens_per_step, ProcessGrid grid = {})
      : ranks_(ranks),
        total_(total),
        tokens_per_step_(tokens_per_step),
        grid_(grid),
        completed_seconds_(ranks, 0.0) {}
  void Add(int rank, const StepRecord& r);
  ProgressState State() const;
  double MeanStepSeconds() const;

 private:
  int ranks_, total_;
  int64_t tokens_per_step_;
  ProcessGrid grid_;
  bool has_rank0_ = false;
  StepRecord last_rank0_;
  int val_step_ = -1;  // rank 0's latest step with a validation loss, and that loss
  double val_loss_ = 0;
  int64_t peak_bytes_ = -1;
  int peak_rank_ = -1;
  // step -> (ranks reported, each rank's seconds)
  std::map<int, std::pair<int, std::vector<double>>> pending_;
  int completed_ = 0;
  std::vector<double> completed_seconds_;  // per rank, over the completed steps
  // the kWarmupSteps lowest completed steps (step, each rank's seconds)
  std::vector<std::pair<int, std::vector<double>>> first_;
};

// The tracker's state after `ranks` (per rank, in order).
ProgressState ComputeProgress(const std::vector<std::vector<StepRecord>>& ranks, int total,
                              int64_t tokens_per_step, ProcessGrid grid = {});

// Shows progress on `out`. On a terminal one line is rewritten ('\r'); otherwise a line is
// printed at most every `interval` and once at the end. Print() puts other messages above
// the line. Thread-safe.
class ProgressDisplay {
 public:
  ProgressDisplay(FILE* out, bool terminal, absl::Duration interval = absl::Seconds(5))
      : out_(out), terminal_(terminal), interval_(interval) {}
  void Update(const std::string& line, absl::Time now);
  // The last line once more (non-terminal) or a newline ending it (terminal).
  void Finish(const std::string& line);
  // Writes `text` (one or more lines) to `stream`, keeping the progress line below it.
  void Print(FILE* stream, const std::string& text);

 private:
  void ClearLocked();
  std::mutex mu_;
  FILE* out_;
  bool terminal_;
  absl::Duration interval_;
  std::string shown_;  // on a terminal: what the current line shows
  absl::Time last_print_ = absl::InfinitePast();
  std::string last_printed_;  // elsewhere: the last line printed
};

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_PROGRESS_H_
