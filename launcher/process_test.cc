// Tests of the mpirun command line and environment, reading mpirun's output for the failed
// rank, and starting and stopping a process session (nothing may be left behind).
#include "launcher/process.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/test_files.h"

namespace tandem {
namespace launcher {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(MpirunArgv, LocalCpuJob) {
  MpirunSpec s;
  s.workers = 2;
  s.cores = 2;
  s.worker = "/x/worker/worker";
  s.cpu = true;
  const std::vector<std::string> a = MpirunArgv(s);
  EXPECT_THAT(a, ElementsAre("mpirun", "-np", "2", "--bind-to", "none", "-x", "TANDEM_COORDINATOR",
                             "-x", "TANDEM_JOB_TOKEN", "-x", "OPENBLAS_NUM_THREADS=1", "-x",
                             "OMP_NUM_THREADS=1", "/x/worker/worker"));
}

TEST(MpirunArgv, OversubscribesBeyondTheCores) {
  MpirunSpec s;
  s.workers = 4;
  s.cores = 2;
  s.worker = "w";
  EXPECT_THAT(MpirunArgv(s), Contains("--oversubscribe"));
  s.workers = 2;
  EXPECT_THAT(MpirunArgv(s), Not(Contains("--oversubscribe")));
}

TEST(MpirunArgv, HostfileAndCuda) {
  MpirunSpec s;
  s.workers = 16;
  s.cores = 2;
  s.worker = "w";
  s.hostfile = "/h/hosts";
  s.cpu = false;
  const std::vector<std::string> a = MpirunArgv(s);
  auto it = std::find(a.begin(), a.end(), "--hostfile");
  ASSERT_NE(it, a.end());
  EXPECT_EQ(*(it + 1), "/h/hosts");
  EXPECT_THAT(a, Not(Contains("OPENBLAS_NUM_THREADS=1")));
  EXPECT_THAT(a, Not(Contains("--oversubscribe")));
  EXPECT_EQ(a.back(), "w");
  s.forward_env = {"TANDEM_TEST_CRASH_RANK"};
  const std::vector<std::string> b = MpirunArgv(s);
  auto x = std::find(b.begin(), b.end(), "TANDEM_TEST_CRASH_RANK");
  ASSERT_NE(x, b.end());
  EXPECT_EQ(*(x - 1), "-x");
  // --mpirun-args go last, before the worker.
  s.extra_args = {"--mca", "btl", "self,tcp"};
  const std::vector<std::string> c = MpirunArgv(s);
  ASSERT_GE(c.size(), 4u);
  EXPECT_THAT(std::vector<std::string>(c.end() - 4, c.end()),
              ElementsAre("--mca", "btl", "self,tcp", "w"));
}

TEST(ForwardedEnvironment, NcclSettingsAndTestHooksReachEveryHost) {
  EXPECT_THAT(
      ForwardedEnvironment({"PATH=/bin", "NCCL_SOCKET_IFNAME=eth0", "HOME=/root", "NCCL_DEBUG=INFO",
                            "TANDEM_TEST_CRASH_RANK=1", "MY_NCCL_X=1", "NCCL_BAD", "=x"}),
      ElementsAre("NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "TANDEM_TEST_CRASH_RANK"));
  EXPECT_THAT(ForwardedEnvironment({}), ElementsAre());
}

TEST(MpirunEnvironment, TokenOnlyInTheEnvironment) {
  const std::string token(64, 'f');
  const std::vector<std::string> env =
      MpirunEnvironment({"PATH=/bin", "TANDEM_JOB_TOKEN=old", "HOME=/root"}, "127.0.0.1:5000",
                        token, MpirunSpec(), true);
  EXPECT_THAT(env, Contains("PATH=/bin"));
  EXPECT_THAT(env, Contains("HOME=/root"));
  EXPECT_THAT(env, Contains("TANDEM_JOB_TOKEN=" + token));
  EXPECT_THAT(env, Not(Contains("TANDEM_JOB_TOKEN=old")));
  EXPECT_THAT(env, Contains("TANDEM_COORDINATOR=127.0.0.1:5000"));
  EXPECT_THAT(env, Contains("OPENBLAS_NUM_THREADS=1"));
  EXPECT_THAT(env, Contains("OMPI_ALLOW_RUN_AS_ROOT=1"));
  EXPECT_THAT(env, Contains("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"));
  MpirunSpec s;
  s.worker = "w";
  for (const std::string& a : MpirunArgv(s)) EXPECT_THAT(a, Not(HasSubstr(token)));

  MpirunSpec gpu;
  gpu.cpu = false;
  const std::vector<std::string> user = MpirunEnvironment({}, "a:1", token, gpu, false);
  EXPECT_THAT(user, Not(Contains("OMPI_ALLOW_RUN_AS_ROOT=1")));
  EXPECT_THAT(user, Not(Contains("OPENBLAS_NUM_THREADS=1")));
}

TEST(MpirunEnvironment, YieldWhenIdleUnlessTheUserSaysOtherwise) {
  const std::string token(64, 'f');
  MpirunSpec s;
  s.yield_when_idle = true;
  EXPECT_THAT(MpirunEnvironment({}, "a:1", token, s, false),
              Contains("OMPI_MCA_mpi_yield_when_idle=1"));
  const std::vector<std::string> own =
      MpirunEnvironment({"OMPI_MCA_mpi_yield_when_idle=0"}, "a:1", token, s, false);
  EXPECT_THAT(own, Contains("OMPI_MCA_mpi_yield_when_idle=0"));
  EXPECT_THAT(own, Not(Contains("OMPI_MCA_mpi_yield_when_idle=1")));
  s.yield_when_idle = false;
  for (const std::string& e : MpirunEnvironment({}, "a:1", token, s, false)) {
    EXPECT_THAT(e, Not(HasSubstr("yield_when_idle")));
  }
}

TEST(FindInPath, ShellAndMissing) {
  absl::StatusOr<std::string> sh = FindInPath("sh", "");
  ASSERT_TRUE(sh.ok()) << sh.status();
  EXPECT_TRUE(absl::EndsWith(*sh, "/sh"));
  absl::StatusOr<std::string> missing = FindInPath("no-such-program-here", "install it");
  EXPECT_EQ(missing.status().message(), "no-such-program-here not found in PATH; install it");
}

TEST(SlotsOnThisHost, AtLeastOne) { EXPECT_GE(SlotsOnThisHost(), 1); }

// Open MPI 4.1's own words.
constexpr char kSignalOutput[] =
    "--------------------------------------------------------------------------\n"
    "Primary job  terminated normally, but 1 process returned\n"
    "a non-zero exit code. Per user-direction, the job has been aborted.\n"
    "--------------------------------------------------------------------------\n"
    "--------------------------------------------------------------------------\n"
    "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).\n"
    "--------------------------------------------------------------------------\n";

constexpr char kExitOutput[] =
    "--------------------------------------------------------------------------\n"
    "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
    "the job to be terminated. The first process to do so was:\n"
    "\n"
    "  Process name: [[10497,1],3]\n"
    "  Exit code:    3\n"
    "--------------------------------------------------------------------------\n";

constexpr char kMpiAbortOutput[] =
    "--------------------------------------------------------------------------\n"
    "MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD\n"
    "with errorcode 7.\n";

TEST(ParseMpirunOutput, Signal) {
  std::optional<RankExit> r = ParseMpirunOutput(kSignalOutput);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank, 1);
  EXPECT_TRUE(r->status.signaled);
  EXPECT_EQ(r->status.signal, 9);
  EXPECT_EQ(r->status.ToString(), "signal 9 SIGKILL");
}

TEST(ParseMpirunOutput, ExitCode) {
  std::optional<RankExit> r = ParseMpirunOutput(kExitOutput);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank, 3);
  EXPECT_FALSE(r->status.signaled);
  EXPECT_EQ(r->status.code, 3);
  EXPECT_EQ(r->status.ToString(), "exit code 3");
}

TEST(ParseMpirunOutput, MpiAbortAndNothing) {
  std::optional<RankExit> r = ParseMpirunOutput(kMpiAbortOutput);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank, 2);
  EXPECT_EQ(r->status.code, 7);
  EXPECT_FALSE(ParseMpirunOutput("").has_value());
  EXPECT_FALSE(ParseMpirunOutput("rank 0 of 2 on vm\nall good\n").has_value());
  // The first report wins.
  r = ParseMpirunOutput(std::string(kExitOutput) + kSignalOutput);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank, 3);
}

TEST(RankFromAbortReason, WhatTheCoordinatorSays) {
  EXPECT_EQ(RankFromAbortReason("rank 1 aborted the job: rank 1 failed: out of memory"), 1);
  EXPECT_EQ(RankFromAbortReason("watchdog: rank 12 hung: no heartbeat for 61s"), 12);
  EXPECT_EQ(RankFromAbortReason("watchdog: ranks 0, 3 hung: no heartbeat"), 0);
  EXPECT_FALSE(RankFromAbortReason("the launcher aborted the job: interrupted").has_value());
  EXPECT_FALSE(RankFromAbortReason("").has_value());
}

TEST(IdentifyFailure, ACrashWinsOverAPeersAbort) {
  // Rank 0 noticed the broken connection and aborted; rank 1 was killed by a signal.
  Failure f = IdentifyFailure(kSignalOutput, "rank 0 aborted the job: rank 0 failed: MPI error",
                              ExitStatus{false, 137, 0}, /*we_signaled=*/false);
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.how, "signal 9 SIGKILL");
}

TEST(IdentifyFailure, TheAbortNamesTheRankWhenWeSentTheSignals) {
  const std::string killed_by_us =
      "mpirun noticed that process rank 0 with PID 0 on node vm exited on signal 15 "
      "(Terminated).\n";
  Failure f = IdentifyFailure(killed_by_us, "watchdog: rank 1 hung: no heartbeat for 61s",
                              ExitStatus{true, 0, 15}, /*we_signaled=*/true);
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.how, "hung: no heartbeat within the timeout");
  f = IdentifyFailure("", "rank 2 aborted the job: rank 2 failed: bad data", std::nullopt, true);
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.how, "");
}

TEST(IdentifyFailure, ExitCodeOfTheBlamedRank) {
  Failure f = IdentifyFailure(kExitOutput, "rank 3 aborted the job: rank 3 failed: bad data",
                              ExitStatus{false, 3, 0}, false);
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.how, "exit code 3");
  // The launcher's own abort blames nobody, not even the rank mpirun reports: the workers
  // ended because it stopped them.
  f = IdentifyFailure(kExitOutput, "the launcher aborted the job: rank 9 something",
                      ExitStatus{false, 3, 0}, false);
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(f.how, "");
  // Its watchdog's verdict blames the rank it found hung.
  f = IdentifyFailure(kExitOutput,
                      "the launcher aborted the job: watchdog: rank 1 hung: no heartbeat for 61s",
                      ExitStatus{false, 3, 0}, true);
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.how, "hung: no heartbeat within the timeout");
  // Nothing reported: mpirun's own exit.
  f = IdentifyFailure("", "", ExitStatus{false, 1, 0}, false);
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(f.how, "mpirun: exit code 1");
}

TEST(FailureLine, NamesWhoEndedTheJob) {
  // A worker's abort: the coordinator's words, which name the rank.
  const std::string worker_abort = "rank 3 aborted the job: bad data";
  Failure f = IdentifyFailure(kExitOutput, worker_abort, ExitStatus{false, 3, 0}, false);
  EXPECT_EQ(FailureLine(f, worker_abort, ExitStatus{false, 3, 0}), worker_abort);
  // The launcher's: why it aborted.
  const std::string launcher_abort =
      "the launcher aborted the job: the workers did not checkpoint and exit within 60 s of "
      "SIGTERM";
  f = IdentifyFailure(kExitOutput, launcher_abort, ExitStatus{true, 0, 15}, true);
  EXPECT_EQ(FailureLine(f, launcher_abort, ExitStatus{true, 0, 15}), launcher_abort);
  // A crash comes first: the crashed rank, whoever aborted after it.
  f = IdentifyFailure(kSignalOutput, "rank 0 aborted the job: MPI error", ExitStatus{false, 137, 0},
                      false);
  EXPECT_TRUE(f.crashed);
  EXPECT_EQ(FailureLine(f, "rank 0 aborted the job: MPI error", ExitStatus{false, 137, 0}),
            "rank 1 failed (signal 9 SIGKILL)");
  // No abort: the rank mpirun reports, else mpirun itself.
  f = IdentifyFailure(kExitOutput, "", ExitStatus{false, 3, 0}, false);
  EXPECT_EQ(FailureLine(f, "", ExitStatus{false, 3, 0}), "rank 3 failed (exit code 3)");
  Failure placed = f;
  placed.place = "(replica 1, stage 1)";
  EXPECT_EQ(FailureLine(placed, "", ExitStatus{false, 3, 0}),
            "rank 3 (replica 1, stage 1) failed (exit code 3)");
  f = IdentifyFailure("", "", ExitStatus{false, 1, 0}, false);
  EXPECT_EQ(FailureLine(f, "", ExitStatus{false, 1, 0}), "mpirun: exit code 1");
  EXPECT_EQ(FailureLine(Failure{}, "", std::nullopt), "mpirun failed (still running)");
}

TEST(SignalName, Known) {
  EXPECT_EQ(SignalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(SignalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(200), "SIG200");
}

std::vector<std::string> Env() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  return env;
}

ExitStatus WaitFor(Process& p) {
  for (int i = 0; i < 200; ++i) {
    if (std::optional<ExitStatus> s = p.Poll()) return *s;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ADD_FAILURE() << "the process did not end";
  return {};
}

TEST(Process, ExitCodeAndLog) {
  const std::string log = FreshTestPath("exit.log");
  absl::StatusOr<std::unique_ptr<Process>> p =
      Process::Start({"sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 3"}, Env(), log);
  ASSERT_TRUE(p.ok()) << p.status();
  const ExitStatus s = WaitFor(**p);
  EXPECT_FALSE(s.signaled);
  EXPECT_EQ(s.code, 3);
  EXPECT_THAT(ReadAll(log), HasSubstr("to-stdout\nto-stderr\n"));
}

TEST(Process, EnvironmentIsExactlyWhatWasGiven) {
  const std::string log = FreshTestPath("env.log");
  absl::StatusOr<std::unique_ptr<Process>> p =
      Process::Start({"sh", "-c", "echo \"[$ONLY_THIS][$HOME]\""},
                     {"ONLY_THIS=yes", "PATH=/usr/bin:/bin"}, log);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(WaitFor(**p).ok());
  EXPECT_THAT(ReadAll(log), HasSubstr("[yes][]"));
}

TEST(Process, MissingProgram) {
  absl::StatusOr<std::unique_ptr<Process>> p =
      Process::Start({"/nonexistent/mpirun"}, Env(), FreshTestPath("missing.log"));
  EXPECT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("/nonexistent/mpirun"));
}

TEST(RunCaptured, OutputExitCodeAndEnvironment) {
  std::string out;
  absl::StatusOr<ExitStatus> s = RunCaptured(
      {"sh", "-c", "echo \"[$ONLY_THIS][$HOME]\"; echo to-stderr >&2; exit 3"},
      {"ONLY_THIS=yes", "PATH=/usr/bin:/bin"}, &out);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->signaled);
  EXPECT_EQ(s->code, 3);
  EXPECT_EQ(out, "[yes][]\nto-stderr\n");
}

TEST(RunCaptured, SignalAndMissingProgram) {
  std::string out;
  absl::StatusOr<ExitStatus> s = RunCaptured({"sh", "-c", "kill -9 $$"}, Env(), &out);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->signaled);
  EXPECT_EQ(s->signal, SIGKILL);
  s = RunCaptured({"/nonexistent/worker"}, Env(), &out);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("/nonexistent/worker"));
  EXPECT_FALSE(RunCaptured({}, Env(), &out).ok());
}

TEST(Process, StopLeavesNothingEvenWhenSigtermIsIgnored) {
  // A "launcher" (sh) with two "workers" that ignore SIGTERM, all in the session.
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(
      {"sh", "-c", "trap '' TERM; sleep 60 & sleep 60 & wait"}, Env(), FreshTestPath("stop.log"));
  ASSERT_TRUE(p.ok()) << p.status();
  for (int i = 0; i < 100 && (*p)->SessionMembers().size() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::vector<pid_t> members = (*p)->SessionMembers();
  EXPECT_EQ(members.size(), 3u);
  const absl::Time start = absl::Now();
  EXPECT_TRUE((*p)->Stop(absl::Milliseconds(300), absl::Seconds(5)).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_TRUE((*p)->SessionMembers().empty());
  for (pid_t m : members) {
    // Gone (or at most a zombie being reaped by its parent's end).
    std::ifstream stat(absl::StrCat("/proc/", m, "/stat"));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    EXPECT_TRUE(text.empty() || absl::StrContains(text, ") Z")) << text;
  }
  EXPECT_TRUE((*p)->signaled_by_us());
  ASSERT_TRUE((*p)->Poll().has_value());
  EXPECT_TRUE((*p)->Poll()->signaled);
}

TEST(Process, OrphansAreFoundThroughTheSession) {
  BecomeSubreaper();
  // The session leader exits at once, leaving a "worker" behind.
  absl::StatusOr<std::unique_ptr<Process>> p =
      Process::Start({"sh", "-c", "sleep 60 & exit 0"}, Env(), FreshTestPath("orphan.log"));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(WaitFor(**p).ok());
  for (int i = 0; i < 100 && (*p)->SessionMembers().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ((*p)->SessionMembers().size(), 1u);
  EXPECT_TRUE((*p)->Stop(absl::Seconds(1), absl::Seconds(5)).ok());
  EXPECT_TRUE((*p)->SessionMembers().empty());
}

TEST(FindWorkerBinary, StartupDirectoryFirst) {
  // bazel run starts the launcher in its runfiles tree: worker/worker is right there.
  const std::string root = FreshTestPath("runfiles");
  ASSERT_EQ(std::system(("mkdir -p " + root + "/worker").c_str()), 0);
  {
    std::ofstream(root + "/worker/worker") << "#!/bin/sh\n";
  }
  ASSERT_EQ(::chmod((root + "/worker/worker").c_str(), 0755), 0);
  absl::StatusOr<std::string> w = FindWorkerBinary("launcher/launcher", root);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, root + "/worker/worker");
  // A file that is not executable is passed over.
  ASSERT_EQ(::chmod((root + "/worker/worker").c_str(), 0644), 0);
  w = FindWorkerBinary("launcher/launcher", root);
  if (w.ok()) {
    EXPECT_NE(*w, root + "/worker/worker");
  }
}

TEST(LastLines, Tail) {
  const std::string path = FreshTestPath("lines.txt");
  {
    std::ofstream out(path);
    for (int i = 1; i <= 30; ++i) out << "line " << i << "\n";
  }
  const std::vector<std::string> last = LastLines(path, 20);
  ASSERT_EQ(last.size(), 20u);
  EXPECT_EQ(last.front(), "line 11");
  EXPECT_EQ(last.back(), "line 30");
  EXPECT_EQ(LastLines(path, 100).size(), 30u);
  EXPECT_TRUE(LastLines("/nonexistent/file", 20).empty());
}

}  // namespace
}  // namespace launcher
}  // namespace tandem
