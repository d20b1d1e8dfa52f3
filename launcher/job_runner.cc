// The launcher's run loop: coordinator in-process, workers through mpirun in a session of
// their own, a 200 ms monitor loop over mpirun's state, the coordinator's abort flag, the
// user's interrupt, SIGTERM (every worker checkpoints and exits) and the workers' metrics
// files; restarts after a worker failure from the newest complete checkpoint; the report at
// the end.
#include "launcher/job_runner.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "comm/coordinator_server.h"
#include "comm/job_token.h"
#include "launcher/process.h"
#include "launcher/progress.h"
#include "launcher/run_report.h"
#include "model/sharded_checkpoint.h"
#include "model/trainer.h"
#include "runtime/files.h"
#include "runtime/status.h"

namespace tandem {
namespace launcher {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(200);
// After the coordinator aborts, workers leave within a heartbeat or two; past this, the
// launcher stops them itself.
constexpr absl::Duration kAbortGrace = absl::Seconds(4);
// SIGTERM first; SIGKILL to whatever is still there after this.
constexpr absl::Duration kTermGrace = absl::Seconds(3);
constexpr absl::Duration kStopDeadline = absl::Seconds(6);

// "data parallel", "pipeline", "2 replicas of a 2-stage pipeline, tensor parallel over 2,
// ZeRO-1".
std::string StrategyWords(const JobConfig& job) {
  const ProcessGrid grid = job.Grid();
  std::string words = job.strategy == "data"    ? "data parallel"
                      : job.strategy == "model" ? "model parallel"
                                                : "pipeline";
  if (grid.replicas > 1 && grid.stages > 1) {
    words = absl::StrFormat("%d replicas of a %d-stage %s", grid.replicas, grid.stages,
                            job.strategy == "model" ? "model-parallel split" : "pipeline");
  }
  if (grid.tensors > 1) absl::StrAppendFormat(&words, ", tensor parallel over %d", grid.tensors);
  if (job.zero >= 1 && grid.replicas > 1) absl::StrAppend(&words, ", ZeRO-", job.zero);
  return words;
}

// How one start of the workers ended.
struct Attempt {
  Outcome outcome = Outcome::kSucceeded;
  Failure failure;
  std::string abort_reason;  // who aborted the job and why, as the coordinator says it
  std::string exit;  // run.json's "exit" when not ok: the summary's final line
};

// The step a job resuming from `resume` (a checkpoint, or "" for none) starts at.
int StartStep(const std::string& resume) { return resume.empty() ? 0 : CheckpointStep(resume); }

class Runner {
 public:
  Runner(const LaunchPlan& plan, const RunSettings& settings, ProgressDisplay* display,
         int64_t tokens_per_step)
      : plan_(plan),
        settings_(settings),
        display_(*display),
        tokens_per_step_(tokens_per_step) {}

  void Say(const std::string& text) {
    display_.Print(stderr, absl::StrCat("launcher: ", text));
  }

  int interrupts() const { return settings_.interrupts ? settings_.interrupts->load() : 0; }
  int terminations() const {
    return settings_.terminations ? settings_.terminations->load() : 0;
  }

  // Starts the coordinator and the workers for `job` and follows them to their end.
  absl::StatusOr<Attempt> Run(const JobConfig& job) {
    const int n = job.workers;
    const bool cpu = job.device == "cpu";
    const std::string run_dir = job.run_dir;
    // This attempt writes the steps from the one it starts at (its checkpoint's, else 0)
    // again: the records an earlier attempt or run left of them go (of every rank it had),
    // before any worker opens its file.
    RETURN_IF_ERROR(TruncateRunMetrics(run_dir, StartStep(job.resume)));
    // A fresh coordinator and token for every start.
    ASSIGN_OR_RETURN(std::string token, GenerateJobToken());
    CoordinatorServerOptions co;
    co.address = plan_.coordinator_listen;
    co.allow_remote = plan_.coordinator_remote;
    co.world_size = n;
    co.token = token;
    co.job_config = job.ToText();
    co.heartbeat_timeout = absl::Seconds(job.heartbeat_timeout_s);
    co.log = [this](const std::string& text) { display_.Print(stderr, text); };
    co.events = RunEventsLog(run_dir);
    ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server, CoordinatorServer::Start(co));
    const std::string address = absl::StrCat(plan_.coordinator_host, ":", server->port());

    // The workers.
    MpirunSpec spec;
    spec.workers = n;
    spec.worker = settings_.worker;
    spec.hostfile = plan_.hostfile;
    spec.cpu = cpu;
    // Data parallel on 2 cores, gpt-tiny in 0.5 MB buckets, 60-step runs: 1.13x to 1.16x
    // tokens/s (BENCHMARKS.md, "Performance work"). The pipeline's sends and receives wait on
    // its critical path, where busy polling measured faster.
    spec.yield_when_idle = cpu && job.strategy == "data";
    spec.cores = settings_.slots;
    spec.extra_args = plan_.mpirun_args;
    const std::vector<std::string> base_env = CurrentEnvironment();
    spec.forward_env = ForwardedEnvironment(base_env);
    const std::vector<std::string> argv = MpirunArgv(spec);
    const std::vector<std::string> env =
        MpirunEnvironment(base_env, address, token, spec, geteuid() == 0);
    const std::string mpirun_log = absl::StrCat(run_dir, "/logs/mpirun.log");
    ASSIGN_OR_RETURN(std::unique_ptr<Process> mpirun, Process::Start(argv, env, mpirun_log));

    // Follow the job: the metrics lines added from now on (a resumed or restarted run
    // appends to files holding earlier steps; run.json reads them whole at the end).
    std::vector<MetricsTail> tails;
    for (int r = 0; r < n; ++r) {
      tails.emplace_back(MetricsPath(run_dir, r));
      tails.back().ReadNew();
    }
    ProgressTracker tracker(n, job.steps, tokens_per_step_, job.Grid());
    std::vector<std::string> metric_errors;
    auto read_metrics = [&] {
      for (int r = 0; r < n; ++r) {
        for (const StepRecord& s : tails[r].ReadNew(&metric_errors)) tracker.Add(r, s);
      }
      for (const std::string& e : metric_errors) Say(e);
      metric_errors.clear();
    };
    bool interrupted = false, abort_seen = false, stopped_early = false, stop_asked = false;
    absl::Time stop_at = absl::InfiniteFuture();
    absl::Time stop_asked_at;
    int terminations_asking = 0;  // the SIGTERMs that asked for the checkpoint and stop
    std::optional<ExitStatus> status;
    for (;;) {
      status = mpirun->Poll();
      read_metrics();
      const absl::Time now = absl::Now();
      const ProgressState state = tracker.State();
      if (state.has_loss) {
        display_.Update(FormatProgress(state), now);
      } else {
        int registered = 0;
        const rpc::GetStatusResponse st = server->Status();
        for (int r = 0; r < st.ranks_size(); ++r) registered += st.ranks(r).registered() ? 1 : 0;
        display_.Update(absl::StrFormat("starting: %d/%d workers registered", registered, n),
                        now);
      }
      if (status.has_value()) break;
      if (interrupts() > 0 && !interrupted) {
        interrupted = true;
        Say("interrupted: stopping the workers");
        server->Abort("interrupted (SIGINT)");
        stop_at = std::min(stop_at, now + absl::Seconds(2));
      }
      if (interrupts() > 1) stop_at = now;  // asked twice: no more waiting
      if (terminations() > 0 && !stop_asked) {
        stop_asked = true;
        Say(absl::StrFormat(
            "SIGTERM: every worker finishes its step, writes a checkpoint and exits (up to "
            "%d s)",
            kPreemptGraceSeconds));
        // Through the coordinator, not by signalling mpirun: it reaches workers on every
        // host, and Open MPI's mpirun answers a SIGTERM of its own by killing its workers
        // (SIGTERM, then SIGKILL a second later: odls_base_sigkill_timeout), too soon for a
        // checkpoint.
        server->RequestStop();
        stop_at = std::min(stop_at, now + absl::Seconds(kPreemptGraceSeconds));
        stop_asked_at = now;
      }
      // SIGTERMs within a second of the first are the same request: GNU timeout, for one,
      // signals the launcher and then its whole process group. A later one stops at once.
      if (stop_asked && now - stop_asked_at < absl::Seconds(1)) {
        terminations_asking = terminations();
      }
      if (stop_asked && terminations() > terminations_asking && !interrupted) {
        interrupted = true;
        Say("SIGTERM again: stopping every worker now, without waiting for the checkpoint");
        server->Abort("a second SIGTERM: stopped without waiting for the checkpoint");
        stop_at = now;
      }
      if (server->aborted() && !abort_seen) {
        abort_seen = true;
        stop_at = std::min(stop_at, now + kAbortGrace);
      }
      if (now >= stop_at) {
        stopped_early = true;
        // Unless something else stopped the job first (then this has no effect).
        if (stop_asked) {
          server->Abort(absl::StrFormat(
              "the workers did not checkpoint and exit within %d s of SIGTERM",
              kPreemptGraceSeconds));
        }
        break;
      }
      std::this_thread::sleep_for(kPollInterval);
    }
    const bool we_signaled_before_exit = stopped_early;
    // Whatever happened, nothing of the job outlives this attempt.
    const absl::Duration grace = interrupts() > 1 ? absl::ZeroDuration() : kTermGrace;
    absl::Status stop = mpirun->Stop(grace, kStopDeadline);
    if (!stop.ok()) Say(std::string(stop.message()));
    status = mpirun->Poll();
    read_metrics();

    Attempt a;
    a.abort_reason = server->aborted() ? server->abort_reason() : "";
    const bool preempted = !stopped_early && status.has_value() && !status->signaled &&
                           status->code == kPreemptedExitCode && a.abort_reason.empty();
    if (interrupted) {
      a.outcome = Outcome::kInterrupted;
      a.exit = a.abort_reason.empty() ? "interrupted" : a.abort_reason;
    } else if (preempted) {
      a.outcome = Outcome::kPreempted;
      a.exit = "preempted";
    } else if (!status.has_value() || !status->ok() || !a.abort_reason.empty()) {
      a.outcome = Outcome::kFailed;
      std::string mpirun_output;
      for (const std::string& l : LastLines(mpirun_log, 400)) {
        absl::StrAppend(&mpirun_output, l, "\n");
      }
      a.failure = IdentifyFailure(mpirun_output, a.abort_reason, status, we_signaled_before_exit);
      const ProcessGrid grid = job.Grid();
      if (grid.hybrid() && a.failure.rank >= 0 && a.failure.rank < grid.ranks()) {
        a.failure.place = grid.Place(a.failure.rank);
      }
      a.exit = FailureLine(a.failure, a.abort_reason, status);
    }
    return a;
  }

 private:
  const LaunchPlan& plan_;
  const RunSettings& settings_;
  ProgressDisplay& display_;
  int64_t tokens_per_step_;  // batch * seq_len
};

}  // namespace

absl::StatusOr<std::string> DescribeJob(const JobConfig& job) {
  ASSIGN_OR_RETURN(ModelConfig model, job.Model());
  const int n = job.workers;
  const ProcessGrid grid = job.Grid();
  return absl::StrFormat("%d %s worker%s, %s, %s; batch %d x %d steps; %srun dir %s", n,
                         job.device == "cpu" ? "CPU" : "CUDA", n == 1 ? "" : "s",
                         StrategyWords(job), model.ToString(), job.batch, job.steps,
                         grid.hybrid() ? grid.Places() + "; " : "", job.run_dir);
}

absl::StatusOr<Outcome> RunJob(const LaunchPlan& plan, const RunSettings& settings) {
  JobConfig job = plan.job;
  ASSIGN_OR_RETURN(ModelConfig model, job.Model());
  ASSIGN_OR_RETURN(std::string description, DescribeJob(job));
  const int64_t tokens_per_step = int64_t{job.batch} * model.seq_len;

  RETURN_IF_ERROR(CreateRunDirectory(job.run_dir));
  ProgressDisplay display(stdout, settings.terminal);
  Runner runner(plan, settings, &display, tokens_per_step);
  runner.Say(description);
  if (!plan.hostfile.empty()) {
    runner.Say(absl::StrFormat("hosts from %s; coordinator at %s", plan.hostfile,
                               plan.coordinator_host));
  }
  BecomeSubreaper();
  const absl::Time start = absl::Now();
  const std::string checkpoints = job.run_dir + "/checkpoints";
  int restarts = 0;
  Attempt a;
  for (;;) {
    ASSIGN_OR_RETURN(a, runner.Run(job));
    if (a.outcome != Outcome::kFailed || restarts >= plan.max_restarts ||
        runner.interrupts() > 0 || runner.terminations() > 0) {
      break;
    }
    if (absl::StrContains(a.abort_reason, kTrainingDiverged)) {
      runner.Say(
          "not restarted: training diverged, and a restart would too (it resumes from the "
          "newest checkpoint, which holds the last update's weights, with the same --lr)");
      break;
    }
    // A worker failed: the whole job again, from the newest complete checkpoint (or where
    // this run started), with a fresh coordinator, token and mpirun.
    ++restarts;
    absl::StatusOr<std::string> latest = FindLatestCheckpoint(checkpoints);
    job.resume = latest.ok() ? *latest : plan.job.resume;
    const int from = StartStep(job.resume);
    runner.Say(absl::StrFormat("%s; restarting from step %d (restart %d of %d)", a.exit, from,
                               restarts, plan.max_restarts));
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);

  // What happened.
  RunRecord rec;
  rec.job = plan.job;
  rec.seq_len = model.seq_len;
  rec.wall_seconds = wall;
  rec.restarts = restarts;
  rec.first_step = StartStep(plan.job.resume);
  rec.ranks = ReadRunMetrics(job.run_dir, job.workers);
  const ProgressState final_state =
      ComputeProgress(rec.ranks, job.steps, tokens_per_step, job.Grid());
  std::string preempted_at;
  if (a.outcome == Outcome::kPreempted) {
    absl::StatusOr<std::string> latest = FindLatestCheckpoint(checkpoints);
    preempted_at = latest.ok() ? *latest : "";
    a.exit = absl::StrFormat("preempted at step %d",
                             latest.ok() ? CheckpointStep(*latest) : final_state.step);
  }
  if (a.outcome != Outcome::kSucceeded) rec.exit = a.exit;
  rec.abort_reason = a.abort_reason;
  if (a.outcome == Outcome::kFailed) {
    rec.failed_rank = a.failure.rank;
    rec.failure = a.failure.how;
  }
  absl::Status written = WriteRunJson(rec);

  if (!rec.ranks.empty() && !rec.ranks[0].empty()) display.Finish(FormatProgress(final_state));
  else display.Finish(absl::StrFormat("step 0/%d", job.steps));

  const std::string mpirun_log = absl::StrCat(job.run_dir, "/logs/mpirun.log");
  if (a.outcome == Outcome::kFailed) {
    // Who ended the job and why; and who aborted it, when a crash came first.
    std::string text = absl::StrCat("launcher: ", a.exit, "\n");
    if (!a.abort_reason.empty() && a.abort_reason != a.exit) {
      absl::StrAppend(&text, "launcher: ", a.abort_reason, "\n");
    }
    if (restarts > 0) {
      absl::StrAppendFormat(&text, "launcher: giving up after %d restart%s (--max-restarts=%d)\n",
                            restarts, restarts == 1 ? "" : "s", plan.max_restarts);
    }
    std::string log = a.failure.rank >= 0
                          ? absl::StrFormat("%s/logs/rank-%d.log", job.run_dir, a.failure.rank)
                          : mpirun_log;
    std::vector<std::string> lines = LastLines(log, 20);
    if (lines.empty()) {
      log = mpirun_log;
      lines = LastLines(log, 20);
    }
    std::string which = "last 20 lines of ";
    if (log == mpirun_log) {
      // mpirun says what went wrong first (ssh: Could not resolve hostname ...), then explains
      // at length: all of a short log, else its first lines too.
      const std::vector<std::string> all = LastLines(log, 10000);
      if (all.size() <= 40) {
        lines = all;
        which = "";
      } else {
        absl::StrAppendFormat(&text, "launcher: first 5 lines of %s:\n", log);
        for (size_t i = 0; i < 5; ++i) absl::StrAppend(&text, "    ", all[i], "\n");
      }
    }
    absl::StrAppendFormat(&text, "launcher: %s%s:\n", which, log);
    for (const std::string& l : lines) absl::StrAppend(&text, "    ", l, "\n");
    display.Print(stderr, text);
  } else if (a.outcome == Outcome::kInterrupted) {
    const absl::StatusOr<std::string> latest = FindLatestCheckpoint(checkpoints);
    runner.Say(absl::StrFormat(
        "interrupted after %d of %d steps; every worker stopped%s", final_state.step, job.steps,
        latest.ok() ? absl::StrFormat(" (--resume=auto --run-dir=%s continues from %s)",
                                      job.run_dir, *latest)
                    : ""));
  } else if (a.outcome == Outcome::kPreempted) {
    runner.Say(absl::StrFormat(
        "preempted: every worker checkpointed %s and exited; exit code %d (run again with "
        "--resume=auto --run-dir=%s to continue)",
        preempted_at.empty() ? "(no complete checkpoint found!)" : preempted_at,
        kPreemptedExitCode, job.run_dir));
  } else if (restarts > 0) {
    runner.Say(absl::StrFormat("succeeded after %d restart%s", restarts,
                               restarts == 1 ? "" : "s"));
  }
  std::printf("\n%s", SummaryTable(rec).c_str());
  std::fflush(stdout);
  if (!written.ok()) return written;
  return a.outcome;
}

}  // namespace launcher
}  // namespace tandem
