// The launcher: `bazel run //launcher -- --strategy=data --gpus=N`. Validates every flag,
// then runs the job (coordinator, workers through mpirun, progress, run.json, summary);
// --check stops after validating. Exit codes: 0 every worker succeeded (--check: the run
// would start), 1 the job failed, 2 bad flags, 75 preempted (SIGTERM: every worker
// checkpointed; continue with --resume=auto), 130 interrupted (SIGINT).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "launcher/job_runner.h"
#include "launcher/options.h"
#include "launcher/process.h"
#include "launcher/trace_merge.h"

namespace {

std::atomic<int> g_interrupts{0};
std::atomic<int> g_terminations{0};

void OnInterrupt(int) { g_interrupts.fetch_add(1); }
void OnTerminate(int) { g_terminations.fetch_add(1); }

void PrintProblems(const std::string& message) {
  for (absl::string_view line : absl::StrSplit(message, '\n')) {
    std::fprintf(stderr, "launcher: %s\n", std::string(line).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem::launcher;
  char cwd[4096];
  const std::string startup_dir = getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : ".";

  bool help = false;
  absl::Status parsed = ParseFlags(std::vector<std::string>(argv + 1, argv + argc), &help);
  if (help) {
    std::fputs(HelpText().c_str(), stdout);
    return 0;
  }
  if (!parsed.ok()) {
    PrintProblems(std::string(parsed.message()));
    return 2;
  }
  const Options options = OptionsFromFlags();
  const HostInfo host = HostInfo::Detect(/*probe_cuda=*/options.job.device != "cpu");
  absl::StatusOr<LaunchPlan> plan = Validate(options, host);
  absl::StatusOr<std::string> worker = FindWorkerBinary(argv[0], startup_dir);
  // --prepare starts nothing: workers come from srun.
  absl::StatusOr<std::string> mpirun =
      options.prepare
          ? absl::StatusOr<std::string>("")
          : FindInPath("mpirun", "install Open MPI (Debian: apt-get install openmpi-bin)");
  if (!plan.ok() || !worker.ok() || !mpirun.ok()) {
    for (const absl::Status& s : {plan.status(), worker.status(), mpirun.status()}) {
      if (!s.ok()) PrintProblems(std::string(s.message()));
    }
    return 2;
  }
  for (const std::string& notice : plan->notices) std::fprintf(stderr, "launcher: %s\n", notice.c_str());

  if (options.check) {
    // Everything a run checks before it starts has passed; nothing is started or written.
    const absl::StatusOr<std::string> description = DescribeJob(plan->job);
    if (!description.ok()) {
      PrintProblems(std::string(description.status().message()));
      return 2;
    }
    std::fprintf(stderr, "launcher: check passed, nothing started: %s%s\n", description->c_str(),
                 options.prepare ? " (--prepare would write job.conf there)" : "");
    return 0;
  }

  if (options.prepare) {
    // Workers started by srun: the job description every task reads; rank 0 hosts the
    // coordinator (parallel/worker.cc, examples/slurm/train.sbatch).
    absl::Status s = CreateRunDirectory(plan->job.run_dir);
    if (s.ok()) s = WriteJobConfig(plan->job);
    if (!s.ok()) {
      PrintProblems(std::string(s.message()));
      return 1;
    }
    std::fprintf(stderr,
                 "launcher: wrote %s/job.conf for %d workers; start them with\n"
                 "  srun --ntasks=%d --mpi=pmix %s --job-config=%s/job.conf\n",
                 plan->job.run_dir.c_str(), plan->job.workers, plan->job.workers,
                 worker->c_str(), plan->job.run_dir.c_str());
    return 0;
  }

  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sa.sa_handler = OnTerminate;
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  RunSettings settings;
  settings.worker = *worker;
  settings.slots = SlotsOnThisHost();
  settings.terminal = isatty(1) != 0;
  settings.interrupts = &g_interrupts;
  settings.terminations = &g_terminations;
  absl::StatusOr<Outcome> outcome = RunJob(*plan, settings);
  if (!outcome.ok()) {
    PrintProblems(std::string(outcome.status().message()));
    return 1;
  }
  if (plan->job.profile) FinishProfile(plan->job.run_dir, plan->job.workers, stdout, stderr);
  switch (*outcome) {
    case Outcome::kSucceeded: return 0;
    case Outcome::kInterrupted: return 130;
    case Outcome::kPreempted: return tandem::kPreemptedExitCode;
    case Outcome::kFailed: return 1;
  }
  return 1;
}
