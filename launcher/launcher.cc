// The launcher: `bazel run //launcher -- --strategy=data --gpus=N`. Validates every flag,
// then runs the job (coordinator, workers through mpirun, progress, run.json, summary);
// --check stops after validating. Exit codes: 0 every worker succeeded (--check: the run
// would start), 1 the job failed, 2 bad flags, 75 preempted (SIGTERM: every worker
// checkpointed; continue with --resume=auto), 130 interrupted (SIGINT).
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "launcher/job_runner.h"
#include "launcher/options.h"
#include "launcher/process.h"
#include "launcher/trace_merge.h"
#include "runtime/status.h"

namespace {

std::atomic<int> g_interrupts{0};
std::atomic<int> g_terminations{0};

void OnInterrupt(int) { g_interrupts.fetch_add(1); }
void OnTerminate(int) { g_terminations.fetch_add(1); }

// --balance=time's block timing in a worker process (`worker --time-blocks`): the launcher
// lives on beside the workers and must not hold a CUDA context or device memory meanwhile.
absl::StatusOr<std::vector<double>> TimeBlocksInWorker(const std::string& worker,
                                                       const tandem::JobConfig& job) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path =
      absl::StrCat(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", "/tandem-job-XXXXXX");
  const int fd = mkstemp(path.data());
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrFormat("--balance=time: cannot write %s: %s", path, std::strerror(errno)));
  }
  const std::string text = job.ToText();
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  std::string output;
  absl::StatusOr<tandem::launcher::ExitStatus> ended =
      written ? tandem::launcher::RunCaptured({worker, "--time-blocks", "--job-config=" + path},
                                              tandem::launcher::CurrentEnvironment(), &output)
              : absl::UnavailableError(absl::StrFormat("--balance=time: cannot write %s", path));
  unlink(path.c_str());
  if (!ended.ok()) return ended.status();
  std::vector<double> seconds;
  std::vector<std::string> said;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> w = absl::StrSplit(line, ' ');
    double s;
    if (w.size() == 3 && w[0] == "block" && absl::SimpleAtod(w[2], &s)) {
      seconds.push_back(s);
    } else {
      said.emplace_back(line);
    }
  }
  ASSIGN_OR_RETURN(const tandem::ModelConfig model, job.Model());
  if (!ended->ok() || static_cast<int>(seconds.size()) != model.num_blocks()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("--balance=time: timing the blocks in %s failed (%s): %s", worker,
                        ended->ToString(), absl::StrJoin(said, "; ")));
  }
  return seconds;
}

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
  HostInfo host = HostInfo::Detect(/*probe_cuda=*/options.job.device != "cpu");
  absl::StatusOr<std::string> worker = FindWorkerBinary(argv[0], startup_dir);
  if (worker.ok()) {
    host.time_blocks = [&worker](const tandem::JobConfig& job) {
      return TimeBlocksInWorker(*worker, job);
    };
  }
  absl::StatusOr<LaunchPlan> plan = Validate(options, host);
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
  if (options.explain) {
    std::fputs(plan->explanation.c_str(), stdout);
    std::fflush(stdout);
  }

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
    // coordinator (worker/worker.cc, examples/slurm/train.sbatch).
    absl::Status s = CreateRunDirectory(plan->job.run_dir);
    if (s.ok()) s = WriteJobConfig(plan->job);
    if (!s.ok()) {
      PrintProblems(std::string(s.message()));
      return 1;
    }
    std::fprintf(stderr,
                 "launcher: wrote %s/job.conf for %d worker%s; start them with\n"
                 "  TANDEM_JOB_TOKEN=<a secret> srun --ntasks=%d --mpi=pmix %s "
                 "--job-config=%s/job.conf\n"
                 "(every worker takes the same token; examples/slurm/train.sbatch makes one)\n",
                 plan->job.run_dir.c_str(), plan->job.workers, plan->job.workers == 1 ? "" : "s",
                 plan->job.workers, worker->c_str(), plan->job.run_dir.c_str());
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
