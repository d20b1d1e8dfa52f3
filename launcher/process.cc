// mpirun's command line and environment, its start in a session of its own (posix_spawn:
// safe in the launcher's multi-threaded process), stopping the whole session, and reading
// mpirun's output for the failed rank.
#include "launcher/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "comm/job_token.h"
#include "launcher/paths.h"

extern char** environ;

namespace tandem {
namespace launcher {
namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s;
}

// Reads an integer starting at `pos` of `text` (after optional spaces).
std::optional<int> IntAt(const std::string& text, size_t pos) {
  while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t')) ++pos;
  size_t end = pos;
  while (end < text.size() && absl::ascii_isdigit(text[end])) ++end;
  int v;
  if (end == pos || !absl::SimpleAtoi(text.substr(pos, end - pos), &v)) return std::nullopt;
  return v;
}

// The session id of a process, or -1 (gone); `zombie` is set for exited, unreaped ones.
pid_t SessionOf(pid_t pid, bool* zombie) {
  const std::string stat = ReadSmallFile(absl::StrCat("/proc/", pid, "/stat"));
  // "pid (comm) state ppid pgrp session ..."; comm may hold spaces and parentheses.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return -1;
  const char state = stat[close + 2];
  *zombie = state == 'Z' || state == 'X';
  int ppid, pgrp, session;
  if (std::sscanf(stat.c_str() + close + 2, "%*c %d %d %d", &ppid, &pgrp, &session) != 3) return -1;
  return session;
}

}  // namespace

std::vector<std::string> MpirunArgv(const MpirunSpec& spec) {
  std::vector<std::string> a = {"mpirun", "-np", absl::StrCat(spec.workers), "--bind-to",
                                "none"};
  if (spec.hostfile.empty() && spec.workers > spec.cores) a.push_back("--oversubscribe");
  if (!spec.hostfile.empty()) {
    a.push_back("--hostfile");
    a.push_back(spec.hostfile);
  }
  for (const char* name : {kCoordinatorAddressEnv, kJobTokenEnv}) {
    a.push_back("-x");
    a.push_back(name);
  }
  if (spec.cpu) {
    for (const char* v : {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"}) {
      a.push_back("-x");
      a.push_back(v);
    }
  }
  for (const std::string& name : spec.forward_env) {
    a.push_back("-x");
    a.push_back(name);
  }
  for (const std::string& extra : spec.extra_args) a.push_back(extra);
  a.push_back(spec.worker);
  return a;
}

std::vector<std::string> ForwardedEnvironment(const std::vector<std::string>& env) {
  std::vector<std::string> names;
  for (const std::string& e : env) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    const std::string name = e.substr(0, eq);
    if (absl::StartsWith(name, "NCCL_") || absl::StartsWith(name, "TANDEM_TEST_")) {
      names.push_back(name);
    }
  }
  return names;
}

std::vector<std::string> MpirunEnvironment(const std::vector<std::string>& base,
                                           const std::string& coordinator_address,
                                           const std::string& token, const MpirunSpec& spec,
                                           bool as_root) {
  std::vector<std::pair<std::string, std::string>> set = {
      {kCoordinatorAddressEnv, coordinator_address}, {kJobTokenEnv, token}};
  if (spec.cpu) {
    set.push_back({"OPENBLAS_NUM_THREADS", "1"});
    set.push_back({"OMP_NUM_THREADS", "1"});
  }
  if (as_root) {
    set.push_back({"OMPI_ALLOW_RUN_AS_ROOT", "1"});
    set.push_back({"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"});
  }
  constexpr char kYield[] = "OMPI_MCA_mpi_yield_when_idle";
  bool user_yield = false;  // the user's own value stands
  std::vector<std::string> env;
  for (const std::string& e : base) {
    const std::string name = e.substr(0, e.find('='));
    user_yield = user_yield || name == kYield;
    bool replaced = false;
    for (const auto& kv : set) replaced = replaced || kv.first == name;
    if (!replaced) env.push_back(e);
  }
  for (const auto& kv : set) env.push_back(absl::StrCat(kv.first, "=", kv.second));
  if (spec.yield_when_idle && !user_yield) env.push_back(absl::StrCat(kYield, "=1"));
  return env;
}

int SlotsOnThisHost() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  }
  // Open MPI counts cores, not hardware threads: one slot per (package, core) pair.
  std::set<std::pair<std::string, std::string>> cores;
  int cpus = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &mask)) continue;
    ++cpus;
    const std::string dir = absl::StrCat("/sys/devices/system/cpu/cpu", c, "/topology/");
    std::string pkg = ReadSmallFile(dir + "physical_package_id");
    std::string core = ReadSmallFile(dir + "core_id");
    if (core.empty()) core = absl::StrCat("cpu", c);
    cores.insert({pkg, core});
  }
  return std::max<int>(1, cores.empty() ? cpus : static_cast<int>(cores.size()));
}

absl::StatusOr<std::string> FindRunfile(const std::string& rel, const std::string& argv0,
                                        const std::string& startup_dir,
                                        const std::string& hint) {
  std::vector<std::string> candidates = {AbsolutePath(startup_dir, rel)};
  const std::string self = AbsolutePath(startup_dir, argv0);
  candidates.push_back(absl::StrCat(self, ".runfiles/tandem/", rel));
  if (const char* rf = std::getenv("RUNFILES_DIR"); rf != nullptr && *rf != '\0') {
    candidates.push_back(absl::StrCat(AbsolutePath(startup_dir, rf), "/tandem/", rel));
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    candidates.push_back(absl::StrCat(exe, ".runfiles/tandem/", rel));
    candidates.push_back(absl::StrCat(DirOf(exe), "/../", rel));
  }
  candidates.push_back(absl::StrCat(DirOf(self), "/../", rel));
  for (const std::string& c : candidates) {
    if (IsExecutable(c)) return c;
  }
  return absl::NotFoundError(absl::StrFormat("cannot find %s in the runfiles; looked at %s. %s",
                                             rel, absl::StrJoin(candidates, ", "), hint));
}

absl::StatusOr<std::string> FindWorkerBinary(const std::string& argv0,
                                             const std::string& startup_dir) {
  return FindRunfile("worker/worker", argv0, startup_dir,
                     "Start the launcher with `bazel run //launcher -- ...`");
}

absl::StatusOr<std::string> FindInPath(const std::string& program,
                                       const std::string& install_hint) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (dir.empty()) continue;
    const std::string candidate = absl::StrCat(dir, "/", program);
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::NotFoundError(
      absl::StrFormat("%s not found in PATH; %s", program, install_hint));
}

ExitStatus ExitStatus::FromWait(int st) {
  ExitStatus e;
  if (WIFSIGNALED(st)) {
    e.signaled = true;
    e.signal = WTERMSIG(st);
  } else if (WIFEXITED(st)) {
    e.code = WEXITSTATUS(st);
  }
  return e;
}

std::string ExitStatus::ToString() const {
  if (signaled) return absl::StrFormat("signal %d %s", signal, SignalName(signal));
  return absl::StrFormat("exit code %d", code);
}

std::string SignalName(int sig) {
  static const std::pair<int, const char*> kNames[] = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
      {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"}};
  for (const auto& [n, name] : kNames) {
    if (n == sig) return name;
  }
  return absl::StrCat("SIG", sig);
}

namespace {

// Starts argv[0] (looked up in PATH) with exactly `env` and the file actions `actions`
// (destroyed here), every signal unblocked and at its default, and posix_spawn's `flags`.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv,
                            const std::vector<std::string>& env,
                            posix_spawn_file_actions_t* actions, short flags) {
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, flags | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  // posix_spawnp searches PATH of the launcher's own environment.
  const int err = argv.empty()
                      ? EINVAL
                      : posix_spawnp(&pid, cargv[0], actions, &attr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot start %s: %s", argv.empty() ? "an empty command" : argv[0], std::strerror(err)));
  }
  return pid;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const std::vector<std::string>& argv,
                                                        const std::vector<std::string>& env,
                                                        const std::string& log_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  const absl::StatusOr<pid_t> pid = Spawn(argv, env, &actions, POSIX_SPAWN_SETSID);
  if (!pid.ok()) return pid.status();
  return std::unique_ptr<Process>(new Process(*pid));
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.push_back(*e);
  return env;
}

absl::StatusOr<ExitStatus> RunCaptured(const std::vector<std::string>& argv,
                                       const std::vector<std::string>& env, std::string* output) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrFormat("pipe: %s", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  const absl::StatusOr<pid_t> pid = Spawn(argv, env, &actions, 0);
  close(fds[1]);
  if (pid.ok()) {
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) != 0;) {
      if (n > 0) output->append(buf, n);
      if (n < 0 && errno != EINTR) break;
    }
  }
  close(fds[0]);
  if (!pid.ok()) return pid.status();
  int st = 0;
  while (waitpid(*pid, &st, 0) < 0) {
    if (errno != EINTR) {
      return absl::InternalError(absl::StrFormat("waitpid: %s", std::strerror(errno)));
    }
  }
  return ExitStatus::FromWait(st);
}

Process::~Process() {
  if (!status_.has_value()) {
    // Never leave anything behind, even on an early return.
    (void)Stop(absl::Seconds(2), absl::Seconds(5));
  }
}

std::optional<ExitStatus> Process::Poll() {
  for (;;) {
    int st = 0;
    const pid_t p = waitpid(-1, &st, WNOHANG);
    if (p <= 0) break;
    if (p == pid_) status_ = ExitStatus::FromWait(st);
    // Anything else is an orphaned worker adopted as subreaper: reaped, nothing to record.
  }
  return status_;
}

std::vector<pid_t> Process::SessionMembers() const {
  std::vector<pid_t> members;
  DIR* d = opendir("/proc");
  if (d == nullptr) return members;
  while (struct dirent* e = readdir(d)) {
    pid_t p;
    if (!absl::SimpleAtoi(e->d_name, &p)) continue;
    bool zombie = false;
    if (SessionOf(p, &zombie) == pid_ && !zombie) members.push_back(p);
  }
  closedir(d);
  return members;
}

void Process::SignalSession(int sig) {
  signaled_by_us_ = true;
  std::vector<pid_t> members = SessionMembers();
  // mpirun first: on SIGTERM it stops its workers in order.
  if (!status_.has_value()) ::kill(pid_, sig);
  for (pid_t p : members) {
    if (p != pid_) ::kill(p, sig);
  }
}

absl::Status Process::Stop(absl::Duration grace, absl::Duration deadline) {
  const absl::Time start = absl::Now();
  Poll();
  if (status_.has_value() && SessionMembers().empty()) return absl::OkStatus();
  SignalSession(SIGTERM);
  bool killed = false;
  for (;;) {
    Poll();
    const std::vector<pid_t> left = SessionMembers();
    if (status_.has_value() && left.empty()) return absl::OkStatus();
    const absl::Duration waited = absl::Now() - start;
    if (!killed && waited >= grace) {
      SignalSession(SIGKILL);
      killed = true;
    }
    if (waited >= deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "processes still running after %s: %s", absl::FormatDuration(deadline),
          absl::StrJoin(left, ", ")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void BecomeSubreaper() { (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); }

std::optional<RankExit> ParseMpirunOutput(const std::string& text) {
  std::optional<RankExit> best;
  size_t best_pos = std::string::npos;
  auto consider = [&](size_t pos, RankExit r) {
    if (pos < best_pos) {
      best = r;
      best_pos = pos;
    }
  };
  // "mpirun noticed that process rank 1 with PID 1234 on node x exited on signal 9 (Killed)."
  const std::string noticed = "noticed that process rank ";
  if (size_t p = text.find(noticed); p != std::string::npos) {
    std::optional<int> rank = IntAt(text, p + noticed.size());
    const size_t s = text.find("exited on signal ", p);
    if (rank && s != std::string::npos && s - p < 300) {
      if (std::optional<int> sig = IntAt(text, s + 17)) {
        RankExit r;
        r.rank = *rank;
        r.status.signaled = true;
        r.status.signal = *sig;
        consider(p, r);
      }
    }
  }
  // "Process name: [[44441,1],1]\n  Exit code:    3"
  const std::string name = "Process name: [[";
  if (size_t p = text.find(name); p != std::string::npos) {
    const size_t inner = text.find("],", p);  // [[job,vpid],rank]
    const size_t code = text.find("Exit code:", p);
    if (inner != std::string::npos && code != std::string::npos) {
      std::optional<int> rank = IntAt(text, inner + 2);
      std::optional<int> c = IntAt(text, code + 10);
      if (rank && c) {
        RankExit r;
        r.rank = *rank;
        r.status.code = *c;
        consider(p, r);
      }
    }
  }
  // "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\nwith errorcode 3."
  const std::string mpi_abort = "MPI_ABORT was invoked on rank ";
  if (size_t p = text.find(mpi_abort); p != std::string::npos) {
    std::optional<int> rank = IntAt(text, p + mpi_abort.size());
    const size_t code = text.find("errorcode", p);
    std::optional<int> c = code == std::string::npos ? std::nullopt : IntAt(text, code + 9);
    if (rank) {
      RankExit r;
      r.rank = *rank;
      r.status.code = c.value_or(1);
      consider(p, r);
    }
  }
  return best;
}

std::optional<int> RankFromAbortReason(const std::string& reason) {
  for (const char* key : {"rank ", "ranks "}) {
    size_t p = 0;
    while ((p = reason.find(key, p)) != std::string::npos) {
      // Whole word only ("ranks " must not match inside another word).
      if (p == 0 || !absl::ascii_isalpha(reason[p - 1])) {
        if (std::optional<int> r = IntAt(reason, p + std::strlen(key))) return r;
      }
      p += std::strlen(key);
    }
  }
  return std::nullopt;
}

Failure IdentifyFailure(const std::string& mpirun_output, const std::string& abort_reason,
                        const std::optional<ExitStatus>& mpirun_status, bool we_signaled) {
  Failure f;
  const std::optional<RankExit> reported = ParseMpirunOutput(mpirun_output);
  // As CoordinatorServer phrases its owner's aborts.
  absl::string_view why = abort_reason;
  const bool launcher_abort = absl::ConsumePrefix(&why, "the launcher aborted the job: ");
  const int blamed = !launcher_abort || absl::StartsWith(why, "watchdog: ")
                         ? RankFromAbortReason(std::string(why)).value_or(-1)
                         : -1;
  if (reported && reported->status.signaled && !we_signaled) {
    f.rank = reported->rank;
    f.how = reported->status.ToString();
    f.crashed = true;
  } else if (blamed >= 0) {
    f.rank = blamed;
    if (reported && reported->rank == blamed) {
      f.how = reported->status.ToString();
    } else if (absl::StrContains(abort_reason, " hung")) {
      f.how = "hung: no heartbeat within the timeout";
    } else if (absl::StrContains(abort_reason, "never registered")) {
      f.how = "never registered with the coordinator";
    }
  } else if (launcher_abort) {
    // No rank failed: the launcher stopped them all.
  } else if (reported) {
    f.rank = reported->rank;
    f.how = reported->status.ToString();
  } else if (mpirun_status && !mpirun_status->ok()) {
    f.how = absl::StrCat("mpirun: ", mpirun_status->ToString());
  }
  return f;
}

std::string FailureLine(const Failure& f, const std::string& abort_reason,
                        const std::optional<ExitStatus>& mpirun_status) {
  const std::string rank_failed =
      absl::StrFormat("rank %d%s failed%s", f.rank, f.place.empty() ? "" : " " + f.place,
                      f.how.empty() ? "" : absl::StrCat(" (", f.how, ")"));
  if (f.crashed) return rank_failed;
  if (!abort_reason.empty()) return abort_reason;
  if (f.rank >= 0) return rank_failed;
  if (!f.how.empty()) return f.how;
  return absl::StrCat("mpirun failed (",
                      mpirun_status ? mpirun_status->ToString() : "still running", ")");
}

std::vector<std::string> LastLines(const std::string& path, int n) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > n) lines.pop_front();
  }
  return std::vector<std::string>(lines.begin(), lines.end());
}

}  // namespace launcher
}  // namespace tandem
