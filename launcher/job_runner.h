// Runs a validated job: makes the run directory, starts the coordinator and the workers
// (mpirun), follows their metrics with a live progress line, stops everything on a failure,
// an abort or an interrupt, restarts the job from its newest complete checkpoint after a
// worker failure (--max-restarts), lets every worker checkpoint on SIGTERM (preemption),
// then writes run.json and prints the summary.
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
  // Incremented by the launcher's SIGINT handler: the first stops the job at once (the
  // coordinator aborts it), a second one kills what is left without waiting.
  const std::atomic<int>* interrupts = nullptr;
  // Incremented by the launcher's SIGTERM handler (what a batch system sends before it
  // stops a job): the first asks every worker to finish its step, checkpoint and exit
  // (bounded by kPreemptGrace), a second one stops the job at once.
  const std::atomic<int>* terminations = nullptr;
};

// How long workers get to finish their step and checkpoint after a SIGTERM.
inline constexpr int kPreemptGraceSeconds = 60;

// kPreempted: every worker checkpointed the same step and exited early (SIGTERM to the
// launcher or to a worker); the launcher exits with kPreemptedExitCode (parallel/job.h).
enum class Outcome { kSucceeded, kFailed, kInterrupted, kPreempted };

// One line on what the job runs: "2 CPU workers, pipeline, gpt-tiny: ...; batch 16 x 100
// steps; run dir /runs/x" (the first thing a run says, and what --check says would run).
absl::StatusOr<std::string> DescribeJob(const JobConfig& job);

// Runs the job to its end. An error means the job could not be started (or run.json not
// written); a job that ran and failed is Outcome::kFailed.
absl::StatusOr<Outcome> RunJob(const LaunchPlan& plan, const RunSettings& settings);

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_JOB_RUNNER_H_
