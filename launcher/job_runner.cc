// The launcher's run loop: coordinator in-process, workers through mpirun in a session of
// their own, a 200 ms monitor loop over mpirun's state, the coordinator's abort flag, the
// user's interrupt and the workers' metrics files, and the report at the end.
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
#include "launcher/report.h"
#include "runtime/status.h"

extern char** environ;

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

std::string Hostname() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

std::string StrategyWords(const std::string& s) {
  if (s == "data") return "data parallel";
  if (s == "model") return "model parallel";
  return "pipeline";
}

bool HasContent(const std::string& path) { return !LastLines(path, 1).empty(); }

}  // namespace

absl::StatusOr<Outcome> RunJob(const LaunchPlan& plan, const RunSettings& settings) {
  const JobConfig& job = plan.job;
  ASSIGN_OR_RETURN(ModelConfig model, job.Model());
  const int64_t tokens_per_step = int64_t{job.batch} * model.seq_len;
  const bool cpu = job.device == "cpu";
  const int n = job.workers;

  RETURN_IF_ERROR(CreateRunDirectory(job.run_dir));
  ProgressDisplay display(stdout, settings.terminal);
  auto say = [&display](const std::string& text) {
    display.Print(stderr, absl::StrCat("launcher: ", text));
  };

  // The coordinator.
  ASSIGN_OR_RETURN(std::string token, GenerateJobToken());
  CoordinatorServerOptions co;
  const bool multi_host = !plan.hostfile.empty();
  co.address = multi_host ? "0.0.0.0:0" : "127.0.0.1:0";
  co.allow_remote = multi_host;
  co.world_size = n;
  co.token = token;
  co.job_config = job.ToText();
  co.heartbeat_timeout = absl::Seconds(job.heartbeat_timeout_s);
  co.log = [&display](const std::string& text) { display.Print(stderr, text); };
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server, CoordinatorServer::Start(co));
  const std::string address =
      multi_host ? absl::StrCat(Hostname(), ":", server->port()) : server->address();

  // The workers.
  MpirunSpec spec;
  spec.workers = n;
  spec.worker = settings.worker;
  spec.hostfile = plan.hostfile;
  spec.cpu = cpu;
  spec.cores = settings.slots;
  std::vector<std::string> base_env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    base_env.push_back(*e);
    // Test-only fault-injection settings (parallel/worker.cc) reach workers on every host.
    if (absl::StartsWith(*e, "TANDEM_TEST_")) {
      spec.forward_env.push_back(base_env.back().substr(0, base_env.back().find('=')));
    }
  }
  const std::vector<std::string> argv = MpirunArgv(spec);
  const std::vector<std::string> env =
      MpirunEnvironment(base_env, address, token, cpu, geteuid() == 0);
  const std::string mpirun_log = absl::StrCat(job.run_dir, "/logs/mpirun.log");
  say(absl::StrFormat("%d %s worker%s, %s, %s; batch %d x %d steps; run dir %s", n,
                      cpu ? "CPU" : "CUDA", n == 1 ? "" : "s", StrategyWords(job.strategy),
                      model.ToString(), job.batch, job.steps, job.run_dir));
  BecomeSubreaper();
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<Process> mpirun, Process::Start(argv, env, mpirun_log));

  // Follow the job: the metrics lines added from now on (a resumed run may append to files
  // holding earlier steps; run.json reads them whole at the end).
  std::vector<MetricsTail> tails;
  for (int r = 0; r < n; ++r) {
    tails.emplace_back(absl::StrFormat("%s/metrics/rank-%d.jsonl", job.run_dir, r));
    tails.back().ReadNew();
  }
  ProgressTracker tracker(n, job.steps, tokens_per_step);
  std::vector<std::string> metric_errors;
  auto read_metrics = [&] {
    for (int r = 0; r < n; ++r) {
      for (const StepRecord& s : tails[r].ReadNew(&metric_errors)) tracker.Add(r, s);
    }
    for (const std::string& e : metric_errors) say(e);
    metric_errors.clear();
  };
  bool interrupted = false, abort_seen = false, stopped_early = false;
  absl::Time stop_at = absl::InfiniteFuture();
  std::optional<ExitStatus> status;
  for (;;) {
    status = mpirun->Poll();
    read_metrics();
    const absl::Time now = absl::Now();
    const ProgressState state = tracker.State();
    if (state.has_loss) {
      display.Update(FormatProgress(state), now);
    } else {
      int registered = 0;
      const rpc::GetStatusResponse st = server->Status();
      for (int r = 0; r < st.ranks_size(); ++r) registered += st.ranks(r).registered() ? 1 : 0;
      display.Update(absl::StrFormat("starting: %d/%d workers registered", registered, n), now);
    }
    if (status.has_value()) break;
    const int interrupts = settings.interrupts ? settings.interrupts->load() : 0;
    if (interrupts > 0 && !interrupted) {
      interrupted = true;
      say("interrupted: stopping the workers");
      server->Abort("interrupted");
      stop_at = std::min(stop_at, now + absl::Seconds(2));
    }
    if (interrupts > 1) stop_at = now;  // asked twice: no more waiting
    if (server->aborted() && !abort_seen) {
      abort_seen = true;
      stop_at = std::min(stop_at, now + kAbortGrace);
    }
    if (now >= stop_at) {
      stopped_early = true;
      break;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  const bool we_signaled_before_exit = stopped_early;
  // Whatever happened, nothing of the job outlives the launcher.
  const absl::Duration grace =
      settings.interrupts && settings.interrupts->load() > 1 ? absl::ZeroDuration() : kTermGrace;
  absl::Status stop = mpirun->Stop(grace, kStopDeadline);
  if (!stop.ok()) say(std::string(stop.message()));
  status = mpirun->Poll();
  read_metrics();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);

  // What happened.
  RunRecord rec;
  rec.job = job;
  rec.seq_len = model.seq_len;
  rec.wall_seconds = wall;
  for (int r = 0; r < n; ++r) {
    rec.ranks.push_back(
        ReadMetricsFile(absl::StrFormat("%s/metrics/rank-%d.jsonl", job.run_dir, r)));
  }
  const std::string abort_reason = server->aborted() ? server->abort_reason() : "";
  Outcome outcome = Outcome::kSucceeded;
  Failure failure;
  if (interrupted) {
    outcome = Outcome::kInterrupted;
    rec.exit = "interrupted";
  } else if (!status.has_value() || !status->ok() || !abort_reason.empty()) {
    outcome = Outcome::kFailed;
    std::string mpirun_output;
    for (const std::string& l : LastLines(mpirun_log, 400)) absl::StrAppend(&mpirun_output, l, "\n");
    failure = IdentifyFailure(mpirun_output, abort_reason, status, we_signaled_before_exit);
    rec.failed_rank = failure.rank;
    rec.failure = failure.how;
    rec.abort_reason = abort_reason;
    if (failure.rank >= 0) {
      rec.exit = absl::StrFormat("rank %d failed", failure.rank);
      if (!failure.how.empty()) absl::StrAppend(&rec.exit, " (", failure.how, ")");
    } else if (!abort_reason.empty()) {
      rec.exit = abort_reason;
    } else {
      rec.exit = absl::StrCat("mpirun failed (", status ? status->ToString() : "still running", ")");
    }
  }
  const std::string json_path = absl::StrCat(job.run_dir, "/run.json");
  absl::Status written = WriteFileAtomically(json_path, RunJson(rec));

  const ProgressState final_state = ComputeProgress(rec.ranks, job.steps, tokens_per_step);
  if (!rec.ranks.empty() && !rec.ranks[0].empty()) display.Finish(FormatProgress(final_state));
  else display.Finish(absl::StrFormat("step 0/%d", job.steps));

  if (outcome == Outcome::kFailed) {
    std::string text;
    if (failure.rank >= 0) {
      absl::StrAppendFormat(&text, "launcher: rank %d failed%s\n", failure.rank,
                            failure.how.empty() ? "" : absl::StrCat(" (", failure.how, ")"));
    } else {
      absl::StrAppendFormat(&text, "launcher: the job failed (%s)\n",
                            failure.how.empty() ? "no rank reported a failure" : failure.how);
    }
    if (!abort_reason.empty()) absl::StrAppendFormat(&text, "launcher: job aborted: %s\n", abort_reason);
    std::string log = failure.rank >= 0
                          ? absl::StrFormat("%s/logs/rank-%d.log", job.run_dir, failure.rank)
                          : mpirun_log;
    if (!HasContent(log)) log = mpirun_log;
    absl::StrAppendFormat(&text, "launcher: last 20 lines of %s:\n", log);
    for (const std::string& l : LastLines(log, 20)) absl::StrAppend(&text, "    ", l, "\n");
    display.Print(stderr, text);
  } else if (outcome == Outcome::kInterrupted) {
    say(absl::StrFormat("interrupted after %d of %d steps; every worker stopped", final_state.step,
                        job.steps));
  }
  std::printf("\n%s", SummaryTable(rec).c_str());
  std::fflush(stdout);
  if (!written.ok()) return written;
  return outcome;
}

}  // namespace launcher
}  // namespace tandem
