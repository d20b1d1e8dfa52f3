// Runs a validated job: makes the run directory, starts the coordinator and the workers
// (mpirun), follows their metrics with a live progress line, stops everything on a failure,
// an abort or an interrupt, then writes run.json and prints the summary.
#ifndef TANDEM_LAUNCHER_JOB_RUNNER_H_
#define TANDEM_LAUNCHER_JOB_RUNNER_H_

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "launcher/options.h"

namespace tandem {
namespace launcher {

struct RunSettings {
  std::string worker;           // absolute path of the worker binary
  int slots = 1;                // cores Open MPI counts on this host
  bool terminal = false;        // stdout is a terminal: rewrite the progress line
  // Incremented by the launcher's SIGINT/SIGTERM handler: the first stops the job cleanly,
  // a second one kills what is left at once.
  const std::atomic<int>* interrupts = nullptr;
};

enum class Outcome { kSucceeded, kFailed, kInterrupted };

// Runs the job to its end. An error means the job could not be started (or run.json not
// written); a job that ran and failed is Outcome::kFailed.
absl::StatusOr<Outcome> RunJob(const LaunchPlan& plan, const RunSettings& settings);

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_JOB_RUNNER_H_
