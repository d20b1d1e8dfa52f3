// Starting and stopping the workers: the mpirun command line and environment, mpirun run in
// a session of its own (so that every worker it starts here can be found and stopped), and
// reading mpirun's output to tell which rank failed and how.
#ifndef TANDEM_LAUNCHER_PROCESS_H_
#define TANDEM_LAUNCHER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {
namespace launcher {

// What mpirun is asked to run.
struct MpirunSpec {
  int workers = 1;
  std::string worker;    // absolute path of the worker binary
  std::string hostfile;  // empty: this host only
  bool cpu = true;       // CPU workers: one BLAS thread each
  // Open MPI yields the core while a worker waits in MPI (mpi_yield_when_idle) rather than
  // polling busily: for CPU workers whose communication thread waits off the critical path
  // (data parallel's overlapped all-reduce), so it does not take cores from backward.
  bool yield_when_idle = false;
  int cores = 1;         // slots on this host; more workers need --oversubscribe
  // Further environment variables to hand to every worker, by name (-x NAME).
  std::vector<std::string> forward_env;
  // Further mpirun arguments (--mpirun-args), placed before the worker binary.
  std::vector<std::string> extra_args;
};

// "mpirun -np N --bind-to none [--oversubscribe] [--hostfile F] -x ... [EXTRA...] WORKER".
// The job token is passed by name only (-x TANDEM_JOB_TOKEN): its value is in the
// environment. With a hostfile its slots decide where ranks go (no --oversubscribe).
std::vector<std::string> MpirunArgv(const MpirunSpec& spec);

// The names of the variables in `env` ("NAME=value" entries) that mpirun hands to workers on
// every host (-x NAME; Open MPI exports nothing else to other hosts): NCCL's settings
// (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_DEBUG, ...) and the workers' test-only
// fault-injection settings (TANDEM_TEST_*).
std::vector<std::string> ForwardedEnvironment(const std::vector<std::string>& env);

// mpirun's environment for `spec`: `base` ("NAME=value" entries) with the coordinator's
// address, the job token, one BLAS thread per CPU worker, and Open MPI's permission to run as
// root when `as_root`. Entries of `base` with the same names are replaced, but for
// OMPI_MCA_mpi_yield_when_idle (spec.yield_when_idle), where the user's own value stands.
std::vector<std::string> MpirunEnvironment(const std::vector<std::string>& base,
                                           const std::string& coordinator_address,
                                           const std::string& token, const MpirunSpec& spec,
                                           bool as_root);

// The cores Open MPI counts as slots on this host (physical cores this process may use).
int SlotsOnThisHost();

// An executable of this workspace (`rel`, e.g. "worker/worker") in the running binary's
// runfiles: relative to the startup directory (bazel run starts there),
// `<argv0>.runfiles/tandem/`, `$RUNFILES_DIR/tandem/`, `/proc/self/exe.runfiles/tandem/`, or
// beside the binary's own package. NotFound lists every place looked at, then `hint`.
absl::StatusOr<std::string> FindRunfile(const std::string& rel, const std::string& argv0,
                                        const std::string& startup_dir,
                                        const std::string& hint);

// The worker binary (worker/worker) in the launcher's runfiles (FindRunfile).
absl::StatusOr<std::string> FindWorkerBinary(const std::string& argv0,
                                             const std::string& startup_dir);

// The absolute path of `program` found in $PATH, or NotFound with `install_hint`.
absl::StatusOr<std::string> FindInPath(const std::string& program, const std::string& install_hint);

// How a process ended.
struct ExitStatus {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signal = 0;  // signal number when signaled
  static ExitStatus FromWait(int wait_status);
  bool ok() const { return !signaled && code == 0; }
  // "exit code 3" or "signal 9 SIGKILL".
  std::string ToString() const;
};

// "SIGKILL" for 9, ...; "SIG<n>" for unknown ones.
std::string SignalName(int sig);

// A child process (mpirun) started in a new session, with stdin from /dev/null and
// stdout/stderr appended to a log file. Everything it starts on this host stays in the
// session, so Stop() can find and stop every one of them.
class Process {
 public:
  // Starts argv[0] (looked up in PATH) with exactly `env`.
  static absl::StatusOr<std::unique_ptr<Process>> Start(const std::vector<std::string>& argv,
                                                        const std::vector<std::string>& env,
                                                        const std::string& log_path);
  ~Process();
  pid_t pid() const { return pid_; }
  // The exit status once the process ended (non-blocking); also reaps orphaned workers
  // handed to this process when it is a child subreaper.
  std::optional<ExitStatus> Poll();
  // Live (non-zombie) processes of the session, the child itself included.
  std::vector<pid_t> SessionMembers() const;
  // Sends `sig` to every live process of the session.
  void SignalSession(int sig);
  // SIGTERM to the session, SIGKILL after `grace` to whatever is left, until nothing of the
  // session is left (or `deadline` passed: an error naming the survivors).
  absl::Status Stop(absl::Duration grace, absl::Duration deadline);
  // True once Stop or SignalSession sent a signal.
  bool signaled_by_us() const { return signaled_by_us_; }

 private:
  explicit Process(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  std::optional<ExitStatus> status_;
  bool signaled_by_us_ = false;
};

// This process's environment, "NAME=value" entries.
std::vector<std::string> CurrentEnvironment();

// Runs argv[0] (looked up in PATH) with exactly `env` and stdin from /dev/null, to its end;
// returns how it ended, with its stdout and stderr together in *output.
absl::StatusOr<ExitStatus> RunCaptured(const std::vector<std::string>& argv,
                                       const std::vector<std::string>& env, std::string* output);

// Makes this process adopt its orphaned descendants (prctl PR_SET_CHILD_SUBREAPER), so a
// worker whose mpirun died is still ours to reap.
void BecomeSubreaper();

// A rank that ended badly, as mpirun reports it.
struct RankExit {
  int rank = -1;
  ExitStatus status;
};

// The first rank failure in mpirun's output (Open MPI 4.1's "mpirun noticed that process
// rank R ... exited on signal S", "Process name: [[J,1],R] / Exit code: C", "MPI_ABORT was
// invoked on rank R ... errorcode C"), if any.
std::optional<RankExit> ParseMpirunOutput(const std::string& text);

// The rank an abort reason blames ("rank 1 aborted the job: ...", "watchdog: rank 2 hung",
// "watchdog: ranks 0, 3 hung"), if any.
std::optional<int> RankFromAbortReason(const std::string& reason);

// Which rank failed and how, from mpirun's output, the coordinator's abort reason and
// mpirun's own exit. A crash by a signal we did not send wins over an abort reason (a peer
// may abort first, reporting the broken connection); then the rank the abort names: the rank
// that aborted, or the one the launcher's watchdog found hung ("the launcher aborted the job:
// watchdog: rank 2 hung: ..."); then, unless the launcher aborted the job for a reason of its
// own (its workers then end because it stopped them), whatever mpirun reported.
struct Failure {
  int rank = -1;    // -1: no rank identified
  std::string how;  // "signal 9 SIGKILL", "exit code 1", or empty
  bool crashed = false;  // killed by a signal we did not send: that, not any abort, ended it
  std::string place;     // the rank's place in a hybrid grid, "(replica 1, stage 0)", or empty
};
Failure IdentifyFailure(const std::string& mpirun_output, const std::string& abort_reason,
                        const std::optional<ExitStatus>& mpirun_status, bool we_signaled);

// The final line of a job that failed: who ended it and why. A crash: "rank 1 failed (signal
// 9 SIGKILL)", "rank 1 (replica 1, stage 0) failed (signal 9 SIGKILL)" with a place; else the abort as the coordinator phrased it, which names who aborted ("rank 1
// aborted the job: ...", "the launcher aborted the job: interrupted (SIGINT)"); else the rank
// that failed, or how mpirun ended.
std::string FailureLine(const Failure& f, const std::string& abort_reason,
                        const std::optional<ExitStatus>& mpirun_status);

// The last `n` lines of a file (fewer if it is shorter; none if it cannot be read).
std::vector<std::string> LastLines(const std::string& path, int n);

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_PROCESS_H_
