// `bazel run //tools:compare -- --gpus=4 --model=gpt-tiny`: trains the same model, global
// batch, seed and steps on one worker and under every strategy on N workers (data parallel
// with and without ZeRO-1, model, pipeline GPipe, 1F1B and ZB-H1, and each schedule in every
// hybrid layout of D replicas x K stages with D, K >= 2) through the launcher, then writes
// report.md, report.html and report.json.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "launcher/paths.h"
#include "launcher/process.h"
#include "runtime/files.h"
#include "runtime/json.h"
#include "runtime/status.h"
#include "tools/comparison.h"
#include "tools/plan.h"

extern "C" void openblas_set_num_threads(int);

namespace tandem {
namespace tools {
namespace {

// Defaults that finish in about a minute for gpt-tiny on 4 CPU workers and 2 cores.
constexpr int kDefaultSteps = 20;
constexpr int kDefaultBatch = 16;

constexpr char kHelp[] =
    "Usage: bazel run //tools:compare -- [--gpus=N] [--out=DIR] [launcher flags]\n"
    "Trains the same model, global batch, seed and number of steps on one worker (the\n"
    "baseline) and with N workers under data parallel, data parallel with ZeRO-1, model\n"
    "parallel, pipeline GPipe, 1F1B, ZB-H1 and interleaved 1F1B (2 model chunks a stage),\n"
    "and, for every D x K = N with D, K >= 2, D replicas of a K-stage pipeline under each\n"
    "schedule (4 workers: 2 x 2; 6: 2 x 3 and 3 x 2; a prime N has none). Each runs through\n"
    "the launcher with --profile; then compare writes report.md, report.html\n"
    "(self-contained) and report.json with the charts beside them. A run the model cannot\n"
    "take (interleaving needs 2 blocks a stage) is reported as such while the others run.\n"
    "\n"
    "  --gpus=N    workers per strategy (default 4)\n"
    "  --out=DIR   output folder (default reports/<time> in the current directory); the\n"
    "              runs go to DIR/runs/<strategy>, the launcher's output to DIR/logs/\n"
    "Every other flag goes to each launcher run unchanged (--model, --steps, --batch, --seed,\n"
    "--device, --micro-batches, ...); --steps defaults to 20 and --batch to 16 here.\n"
    "--strategy, --schedule, --virtual-stages, --data-parallel, --zero and --run-dir are set\n"
    "by compare for each "
    "run, and --check and --prepare are the launcher's alone; the launcher's flags:\n"
    "bazel run //launcher -- --help\n"
    "Ctrl-C stops the run under way at once; SIGTERM has it checkpoint and stop. Either way\n"
    "compare then stops without a report.\n";

struct Run {
  std::string name;
  std::string label;
  std::vector<std::string> flags;
};

// "--micro_batches=3" -> "micro-batches"; "" for a word that is not a flag.
std::string FlagName(const std::string& word) {
  if (word.size() < 2 || word[0] != '-' || word == "--") return "";
  std::string name = word.substr(word[1] == '-' ? 2 : 1);
  name = name.substr(0, name.find('='));
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

bool IsDirectory(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string Cwd() {
  char buf[4096];
  return getcwd(buf, sizeof(buf)) != nullptr ? buf : ".";
}

// The launcher running now (0: none) and whether compare was sent SIGTERM: it passes it on
// to the launcher, which has its workers checkpoint and stop, and then stops.
volatile sig_atomic_t g_child = 0;
volatile sig_atomic_t g_terminated = 0;

void OnTerminate(int) {
  const int saved = errno;
  g_terminated = 1;
  if (g_child > 0) kill(g_child, SIGTERM);
  errno = saved;
}

// Runs `argv` with output to `log`; returns its exit status (128 + signal when killed).
absl::StatusOr<int> RunLogged(const std::vector<std::string>& argv, const std::string& log,
                              const std::vector<std::string>& env) {
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrFormat("cannot write %s: %s", log, std::strerror(errno)));
  }
  // SIGTERM waits until g_child names the child (and the child has its default handler),
  // so none is lost in between.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_BLOCK, &term, &old);
  const pid_t pid = fork();
  if (pid < 0) {
    sigprocmask(SIG_SETMASK, &old, nullptr);
    close(fd);
    return absl::InternalError(absl::StrFormat("fork: %s", std::strerror(errno)));
  }
  if (pid == 0) {
    const int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(fd);
  g_child = pid;
  sigprocmask(SIG_SETMASK, &old, nullptr);  // a SIGTERM held back reaches the child now
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR)
      return absl::InternalError(absl::StrFormat("waitpid: %s", std::strerror(errno)));
  }
  sigprocmask(SIG_BLOCK, &term, nullptr);
  g_child = 0;  // never a reaped (and perhaps reused) pid
  sigprocmask(SIG_SETMASK, &old, nullptr);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

std::string FirstLineOf(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// What the launcher said about why it did not run (exit 2: its validation problems) or why
// the job failed, from its output.
std::string LauncherProblems(const std::string& output, int code) {
  const std::vector<std::string> lines = absl::StrSplit(output, '\n', absl::SkipEmpty());
  std::vector<std::string> picked;
  if (code == 2) {
    for (const std::string& l : lines) {
      if (absl::StartsWith(l, "launcher: ")) picked.push_back(l.substr(10));
    }
  } else {
    // From the line that says the job or a rank failed: the lines before it say what the run
    // was and needed (its memory, the CPU fallback), not why it failed.
    size_t start = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (absl::StartsWith(l, "launcher: the job failed") ||
          (absl::StartsWith(l, "launcher: rank ") && absl::StrContains(l, " failed"))) {
        start = i;
        break;
      }
    }
    bool in_tail = false;  // the failed rank's last log lines follow "... lines of <log>:"
    for (size_t i = start; i < lines.size(); ++i) {
      const std::string& l = lines[i];
      if (absl::StartsWith(l, "launcher: ")) {
        in_tail = absl::EndsWith(l, ".log:");
        const bool info = absl::StartsWith(l, "launcher: no GPU visible") ||
                          absl::StartsWith(l, "launcher: memory: ") ||
                          absl::StrContains(l, "; run dir ");
        if (!info) picked.push_back(l.substr(10));
      } else if (in_tail && absl::StartsWith(l, "    ")) {
        picked.push_back(l);
      } else {
        in_tail = false;
      }
    }
    if (picked.empty()) {
      for (size_t i = lines.size() > 15 ? lines.size() - 15 : 0; i < lines.size(); ++i) {
        picked.push_back(lines[i]);
      }
    }
  }
  return absl::StrJoin(picked, "\n");
}

// LauncherProblems of a run logged to `log`, with where to read the rest.
std::string LauncherMessage(const std::string& log, int code) {
  std::string out = LauncherProblems(ReadFile(log), code);
  absl::StrAppendFormat(&out, "%s(launcher exit code %d; its output: %s)", out.empty() ? "" : "\n",
                        code, log);
  return out;
}

// D x K = n with D, K >= 2, D ascending: the hybrid layouts of n workers.
std::vector<std::pair<int, int>> HybridLayouts(int n) {
  std::vector<std::pair<int, int>> out;
  for (int d = 2; d <= n / 2; ++d) {
    if (n % d == 0) out.push_back({d, n / d});
  }
  return out;
}

// The runs on `gpus` workers: the baseline, data parallel with and without ZeRO-1, model
// parallel, the four pipeline schedules (interleaved with 2 model chunks a stage), then each
// hybrid layout with each schedule.
std::vector<Run> Runs(int gpus) {
  const std::string n = absl::StrCat("--gpus=", gpus);
  std::vector<Run> runs = {
      {"baseline", "one worker", {"--strategy=data", "--gpus=1"}},
      {"data", "data parallel", {"--strategy=data", n}},
      {"data-zero1", "data parallel, ZeRO-1", {"--strategy=data", "--zero=1", n}},
      {"model", "model parallel", {"--strategy=model", n}},
  };
  struct Schedule {
    std::string name, label;
  };
  const std::vector<Schedule> schedules = {
      {"gpipe", "GPipe"}, {"1f1b", "1F1B"}, {"zb-h1", "ZB-H1"}, {"interleaved", "interleaved v=2"}};
  auto flags = [](const std::string& schedule) {
    std::vector<std::string> f = {"--strategy=pipeline", absl::StrCat("--schedule=", schedule)};
    if (schedule == "interleaved") f.push_back("--virtual-stages=2");
    return f;
  };
  for (const Schedule& s : schedules) {
    std::vector<std::string> f = flags(s.name);
    f.push_back(n);
    runs.push_back({s.name, absl::StrCat("pipeline ", s.label), f});
  }
  for (const auto& [d, k] : HybridLayouts(gpus)) {
    for (const Schedule& s : schedules) {
      std::vector<std::string> f = flags(s.name);
      f.push_back(absl::StrCat("--data-parallel=", d));
      f.push_back(n);
      runs.push_back({absl::StrFormat("d%dk%d-%s", d, k, s.name),
                      absl::StrFormat("%d replicas x %d-stage %s", d, k, s.label), f});
    }
  }
  // Tensor parallelism within a node (T a power of two up to 8 dividing the workers): over
  // T ranks beside data parallelism over the rest, and T=2 beside a 1F1B pipeline (with
  // replicas where the workers leave room). A model whose heads T does not divide is refused
  // by the launcher's check, and the report says so.
  for (int t = 2; t <= std::min(gpus, 8); t *= 2) {
    if (gpus % t != 0) continue;
    const std::string tp = absl::StrCat("--tensor-parallel=", t);
    runs.push_back({absl::StrFormat("tp%d", t),
                    t == gpus ? absl::StrFormat("tensor parallel T=%d", t)
                              : absl::StrFormat("tensor parallel T=%d x %d replicas", t, gpus / t),
                    {"--strategy=data", tp, n}});
  }
  if (gpus % 4 == 0) {
    for (int d = 1; d * 4 <= gpus && d <= 2; ++d) {
      if (gpus % (2 * d) != 0) continue;
      const int k = gpus / (2 * d);
      std::vector<std::string> f = flags("1f1b");
      f.push_back("--tensor-parallel=2");
      if (d > 1) f.push_back(absl::StrCat("--data-parallel=", d));
      f.push_back(n);
      runs.push_back({absl::StrFormat("tp2d%dk%d-1f1b", d, k),
                      d == 1 ? absl::StrFormat("tensor parallel T=2 x %d-stage 1F1B", k)
                             : absl::StrFormat("tensor parallel T=2 x %d replicas x %d-stage 1F1B",
                                               d, k),
                      f});
    }
  }
  return runs;
}

// The report's word on the missing hybrid layouts of `gpus` workers; "" where there are some.
std::string NoHybridNote(int gpus) {
  if (!HybridLayouts(gpus).empty()) return "";
  return absl::StrFormat(
      "No hybrid layout: %d workers, a prime number, split into D replicas x K pipeline "
      "stages only as %d x 1 (data parallel) or 1 x %d (one pipeline); replicas of a pipeline "
      "(D, K >= 2) need a number of workers that is not prime, such as 4 or 6.",
      gpus, gpus, gpus);
}

struct Options {
  int gpus = 4;
  std::string out_dir;            // as given; "" for the default
  std::vector<std::string> args;  // compare's, as given
  std::vector<std::string> pass;  // to every launcher run
};

// Reads compare's flags into *o. Returns the exit code to stop with: 0 after --help, 2 after
// printing the problems; nothing to go on.
std::optional<int> ParseArgs(Options* o) {
  const std::vector<std::string>& args = o->args;
  bool have_steps = false, have_batch = false;
  std::vector<std::string> problems;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::string name = FlagName(a);
    const bool inline_value = a.find('=') != std::string::npos;
    auto value = [&](std::string* v) -> bool {
      if (inline_value) {
        *v = a.substr(a.find('=') + 1);
        return true;
      }
      if (i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) {
        *v = args[++i];
        return true;
      }
      problems.push_back(absl::StrFormat("--%s needs a value: --%s=VALUE", name, name));
      return false;
    };
    if (name == "help" || name == "h") {
      std::fputs(kHelp, stdout);
      return 0;
    }
    if (name == "gpus") {
      std::string v;
      if (value(&v) && (!absl::SimpleAtoi(v, &o->gpus) || o->gpus < 2)) {
        problems.push_back(absl::StrFormat("--gpus=%s: compare needs at least 2 workers", v));
      }
    } else if (name == "out") {
      value(&o->out_dir);
    } else if (name == "strategy" || name == "schedule" || name == "run-dir" ||
               name == "data-parallel" || name == "zero" || name == "virtual-stages") {
      problems.push_back(
          absl::StrFormat("--%s: compare sets it for each of its runs (see --help)", name));
      if (!inline_value && i + 1 < args.size() && !absl::StartsWith(args[i + 1], "--")) ++i;
    } else if (name == "check" || name == "prepare") {
      problems.push_back(absl::StrFormat(
          "--%s: compare runs the strategies (and checks each first); to %s one run, use "
          "bazel run //launcher -- --%s ...",
          name, name == "check" ? "check" : "prepare", name));
    } else if (name == "profile" || name == "noprofile" || name == "no-profile") {
      // Every run is profiled: the timelines need the traces.
    } else {
      if (name == "steps") have_steps = true;
      if (name == "batch") have_batch = true;
      o->pass.push_back(a);
    }
  }
  if (!problems.empty()) {
    for (const std::string& p : problems) std::fprintf(stderr, "compare: %s\n", p.c_str());
    return 2;
  }
  if (!have_steps) o->pass.push_back(absl::StrCat("--steps=", kDefaultSteps));
  if (!have_batch) o->pass.push_back(absl::StrCat("--batch=", kDefaultBatch));
  return std::nullopt;
}

// A comparison under way: what it runs, with which launcher and environment, and where to.
struct Comparison {
  Options options;
  std::string out_dir;  // absolute
  std::string launcher;
  std::vector<std::string> env;
  std::vector<Run> runs;
  std::vector<std::string> refused;  // per run: why the launcher's --check refused it, or ""

  // The launcher's command line for `run`.
  std::vector<std::string> LauncherArgs(const Run& run) const {
    std::vector<std::string> argv = {launcher};
    argv.insert(argv.end(), run.flags.begin(), run.flags.end());
    argv.push_back("--profile");
    argv.push_back(absl::StrCat("--run-dir=", out_dir, "/runs/", run.name));
    argv.insert(argv.end(), options.pass.begin(), options.pass.end());
    return argv;
  }
};

// Finds the launcher, the output folder (not one that already holds runs) and the runs.
// Returns the exit code to stop with, after saying why; nothing to go on.
std::optional<int> Prepare(const char* argv0, absl::Time now, Comparison* c) {
  const std::string cwd = Cwd();
  const std::string bwd = launcher::BuildWorkingDirectory();
  const std::string user_dir = bwd.empty() ? cwd : bwd;
  absl::StatusOr<std::string> launcher = launcher::FindRunfile(
      "launcher/launcher", argv0, cwd, "Start compare with `bazel run //tools:compare -- ...`");
  if (!launcher.ok()) {
    std::fprintf(stderr, "compare: %s\n", std::string(launcher.status().message()).c_str());
    return 2;
  }
  c->launcher = *launcher;
  std::string out_dir = c->options.out_dir;
  if (out_dir.empty()) {
    out_dir = absl::StrCat(user_dir, "/reports/",
                           absl::FormatTime("%Y%m%d-%H%M%S", now, absl::LocalTimeZone()));
  }
  out_dir = launcher::AbsolutePath(user_dir, out_dir);
  while (out_dir.size() > 1 && out_dir.back() == '/') out_dir.pop_back();
  if (IsDirectory(out_dir + "/runs")) {
    std::fprintf(stderr, "compare: --out=%s already holds runs; choose another folder\n",
                 out_dir.c_str());
    return 2;
  }
  c->out_dir = out_dir;
  // The launcher finds the worker in the same runfiles tree.
  c->env = launcher::CurrentEnvironment();
  const std::string runfiles = launcher::DirOf(
      launcher::DirOf(launcher::DirOf(c->launcher)));  // <runfiles>/tandem/launcher/launcher
  const bool have_runfiles_env =
      std::any_of(c->env.begin(), c->env.end(),
                  [](const std::string& e) { return absl::StartsWith(e, "RUNFILES_DIR="); });
  if (!have_runfiles_env && launcher::IsExecutable(runfiles + "/tandem/worker/worker")) {
    c->env.push_back("RUNFILES_DIR=" + runfiles);
  }
  c->runs = Runs(c->options.gpus);
  return std::nullopt;
}

// Checks every run first (launcher --check: all it validates before it starts) and keeps
// why each refused one would not start in c->refused. Where none of the N-worker runs would
// start (the baseline alone compares nothing), the flags are refused here, before anything
// runs or is written: returns the exit code to stop with.
std::optional<int> CheckRuns(Comparison* c) {
  const std::vector<Run>& runs = c->runs;
  std::vector<std::string>& refused = c->refused;
  refused.assign(runs.size(), "");
  bool any_starts = false;  // of the N-worker runs
  for (size_t k = 0; k < runs.size(); ++k) {
    std::vector<std::string> argv_check = c->LauncherArgs(runs[k]);
    argv_check.push_back("--check");
    std::string output;
    absl::StatusOr<launcher::ExitStatus> ended = launcher::RunCaptured(argv_check, c->env, &output);
    if (!ended.ok()) {
      std::fprintf(stderr, "compare: %s\n", std::string(ended.status().message()).c_str());
      return 1;
    }
    if (ended->ok()) {
      any_starts = any_starts || k > 0;
    } else {
      refused[k] = LauncherProblems(output, ended->signaled ? 128 + ended->signal : ended->code);
      if (refused[k].empty()) refused[k] = "launcher --check: " + ended->ToString();
    }
  }
  if (any_starts) return std::nullopt;
  // One line per problem; the same problems for every run (flags they share) said once.
  const size_t first = refused[0].empty() ? 1 : 0;  // the baseline would start
  const bool same = std::all_of(refused.begin() + first, refused.end(),
                                [&](const std::string& r) { return r == refused[first]; });
  if (!same || first == 1) {
    std::fprintf(stderr, "compare: none of the %d-worker runs would start; nothing was written\n",
                 c->options.gpus);
  }
  for (size_t k = first; k < runs.size(); ++k) {
    if (same && k > first) break;
    for (absl::string_view line : absl::StrSplit(refused[k], '\n')) {
      std::fprintf(stderr, "compare: %s%s\n", same ? "" : (runs[k].label + ": ").c_str(),
                   std::string(line).c_str());
    }
  }
  return 2;
}

// Stopped by Ctrl-C or SIGTERM: no report; returns the exit code.
int Stopped(const Comparison& c, bool terminated) {
  std::fprintf(stderr, "compare: %s; no report; the runs so far are in %s/runs\n",
               terminated ? "terminated (SIGTERM)" : "interrupted", c.out_dir.c_str());
  return terminated ? 128 + SIGTERM : 130;
}

// Runs run k (or reports it refused) with its progress line, into *e. Returns the exit code
// to stop with where compare must stop.
std::optional<int> RunOne(const Comparison& c, size_t k, int label_width, Entry* e) {
  const Run& run = c.runs[k];
  e->name = run.name;
  e->label = run.label;
  const std::string dir = absl::StrCat(c.out_dir, "/runs/", run.name);
  const std::string log = absl::StrCat(c.out_dir, "/logs/", run.name, ".log");
  std::printf("compare: [%d/%d] %-*s ", static_cast<int>(k + 1), static_cast<int>(c.runs.size()),
              label_width, run.label.c_str());
  std::fflush(stdout);
  if (!c.refused[k].empty()) {
    e->error = c.refused[k];
    std::printf("would not start: %s\n", FirstLineOf(e->error).c_str());
    return std::nullopt;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<int> code = RunLogged(c.LauncherArgs(run), log, c.env);
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  if (!code.ok()) {
    std::printf("failed to start\n");
    std::fprintf(stderr, "compare: %s\n", std::string(code.status().message()).c_str());
    return 1;
  }
  if (*code == 130 || g_terminated) {
    std::printf("%s\n", g_terminated ? "terminated" : "interrupted");
    std::fflush(stdout);
    return Stopped(c, g_terminated);
  }
  if (*code != 0) {
    e->error = LauncherMessage(log, *code);
    std::printf("%s (%.0f s): %s\n", *code == 2 ? "did not run" : "failed", secs,
                FirstLineOf(e->error).c_str());
  } else if (absl::StatusOr<RunData> data = ReadRun(dir); !data.ok()) {
    e->error =
        absl::StrCat("the run finished but its results cannot be read: ", data.status().message());
    std::printf("unreadable (%.0f s)\n", secs);
  } else {
    e->ran = true;
    e->run = std::move(*data);
    std::printf("ok (%.0f s)\n", secs);
  }
  std::fflush(stdout);
  return std::nullopt;
}

// Makes the output folders and runs every run in turn into *entries. Returns the exit code to
// stop with where compare must stop (a folder not made, a run not started, Ctrl-C, SIGTERM).
std::optional<int> RunAll(const Comparison& c, std::vector<Entry>* entries) {
  for (const std::string& d : {c.out_dir, c.out_dir + "/runs", c.out_dir + "/logs"}) {
    if (absl::Status s = MakeDirs(d); !s.ok()) {
      std::fprintf(stderr, "compare: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  std::printf("compare: %d runs of %s into %s\n", static_cast<int>(c.runs.size()),
              absl::StrJoin(c.options.pass, " ").c_str(), c.out_dir.c_str());
  if (const std::string note = NoHybridNote(c.options.gpus); !note.empty()) {
    std::printf("compare: %s\n", note.c_str());
  }
  std::fflush(stdout);
  // Ctrl-C reaches the launcher (same process group), which stops its workers and exits 130;
  // compare then stops too. A SIGTERM to compare alone is passed on to the launcher.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, OnTerminate);
  int label_width = 0;
  for (const Run& run : c.runs)
    label_width = std::max(label_width, static_cast<int>(run.label.size()));
  for (size_t k = 0; k < c.runs.size(); ++k) {
    if (g_terminated) return Stopped(c, true);  // between two runs: start no other
    Entry e;
    if (std::optional<int> stop = RunOne(c, k, label_width, &e)) return stop;
    entries->push_back(std::move(e));
  }
  return std::nullopt;
}

// Writes the report and prints its figures and summary; returns compare's exit code: 0 where
// any run completed.
int WriteAll(const Comparison& c, std::vector<Entry> entries, absl::Time now) {
  std::string command = "bazel run //tools:compare --";
  for (const std::string& a : c.options.args) absl::StrAppend(&command, " ", a);
  Report report = BuildReport(std::move(entries), c.options.gpus, HostCpus(), command,
                              absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", now, absl::LocalTimeZone()));
  if (const std::string note = NoHybridNote(c.options.gpus); !note.empty()) {
    report.run_notes.push_back(note);
  }
  if (absl::Status s = WriteReport(report, c.out_dir); !s.ok()) {
    std::fprintf(stderr, "compare: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  int label_width = 0;
  for (const Figures& f : report.figures)
    label_width = std::max(label_width, static_cast<int>(f.label.size()));
  std::printf("\n");
  bool any = false;
  for (const Figures& f : report.figures) {
    any = any || f.ran;
    if (f.ran) {
      std::printf("  %-*s %10s tok/s  %6s  peak %9s  loss %.4f\n", label_width, f.label.c_str(),
                  Thousands(f.tokens_per_second).c_str(), Ratio(f.speedup).c_str(),
                  Bytes(f.peak_bytes).c_str(), f.final_loss);
    } else {
      std::printf("  %-*s could not run\n", label_width, f.label.c_str());
    }
  }
  std::printf("\n");
  for (const std::string& s : report.summary) std::printf("%s\n", s.c_str());
  std::printf("\nreport: %s/report.md\n        %s/report.html\n        %s/report.json\n",
              c.out_dir.c_str(), c.out_dir.c_str(), c.out_dir.c_str());
  return any ? 0 : 1;
}

// The JSON lines a benchmark binary of this build (`runfile`) prints run under mpirun on
// `ranks` CPU workers of this host; an error naming `what` it timed.
absl::StatusOr<std::vector<Json>> RunBenchLines(const char* argv0, int ranks,
                                                const std::string& runfile,
                                                const std::vector<std::string>& args,
                                                const char* what) {
  ASSIGN_OR_RETURN(std::string bench,
                   launcher::FindRunfile(runfile, argv0, Cwd(),
                                         "Start compare with `bazel run //tools:compare -- ...`"));
  ASSIGN_OR_RETURN(std::string mpirun,
                   launcher::FindInPath("mpirun",
                                        "install Open MPI (Debian: apt-get install openmpi-bin)"));
  std::vector<std::string> env = launcher::CurrentEnvironment();
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT=1");
  env.push_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  std::vector<std::string> command = {mpirun, "--oversubscribe", "-np", std::to_string(ranks),
                                      "--bind-to", "none", "--mca", "btl", "self,vader", bench};
  command.insert(command.end(), args.begin(), args.end());
  std::string output;
  ASSIGN_OR_RETURN(launcher::ExitStatus ended, launcher::RunCaptured(command, env, &output));
  if (!ended.ok()) {
    return absl::InternalError(absl::StrFormat(
        "timing %s failed (%s): %s; give --link=bandwidth_GBps,latency_us[,handover_us] "
        "instead",
        what, ended.ToString(), FirstLineOf(output)));
  }
  std::vector<Json> lines;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::StartsWith(line, "{")) continue;
    ASSIGN_OR_RETURN(Json j, ParseJson(line));
    lines.push_back(std::move(j));
  }
  return lines;
}

// The link between `ranks` CPU workers of this host: fitted (FitLinkToRing) to Tandem's
// all-reduce from 64 KB to 16 MB as //comm:allreduce_bench times it, with the reduce-scatter's
// and the all-gather's own pairs fitted alike to theirs, and its handover, what a 1F1B pipeline
// over the ranks measures (`strategy_bench handover`) less SendRecv's time for the activation
// it carried.
absl::StatusOr<LinkModel> MeasureLink(const char* argv0, int ranks) {
  // The collective's pair, from its timings (its "bytes" are the whole buffer's).
  auto fit = [&](const char* collective, int steps) -> absl::StatusOr<LinkModel> {
    ASSIGN_OR_RETURN(
        std::vector<Json> timed,
        RunBenchLines(argv0, ranks, "comm/allreduce_bench_bin",
                      {absl::StrCat("--collective=", collective), "--json", "--min_bytes=65536",
                       "--max_bytes=16777216", "--reps=3", "--target_ms=20"},
                      absl::StrCat("the link's ", collective, "s").c_str()));
    std::vector<LinkSample> samples;
    for (const Json& j : timed) {
      samples.push_back({NumberOr(j, "bytes", 0), NumberOr(j, "waited_s", 0)});
    }
    return FitLinkToRing(samples, ranks, steps);
  };
  ASSIGN_OR_RETURN(LinkModel link, fit("all_reduce", 2 * (ranks - 1)));
  for (auto [collective, pair] : {std::pair{"reduce_scatter", &link.reduce_scatter},
                                  std::pair{"all_gather", &link.all_gather}}) {
    ASSIGN_OR_RETURN(LinkModel own, fit(collective, ranks - 1));
    *pair = {own.latency_s, own.bytes_per_s};
  }
  ASSIGN_OR_RETURN(std::vector<Json> handed,
                   RunBenchLines(argv0, ranks, "parallel/strategy_bench", {"handover"},
                                 "a pipeline's handover"));
  if (handed.size() != 1) {
    return absl::InternalError("timing a pipeline's handover printed no result; give "
                               "--link=bandwidth_GBps,latency_us[,handover_us] instead");
  }
  const double handover = NumberOr(handed[0], "handover_s", 0);
  link.handover_s = std::max(0.0, handover - link.SendRecv(NumberOr(handed[0], "bytes", 0)));
  std::printf("compare --plan: a pipeline's handover between %d workers: %.3f ms (%d receives), "
              "%.3f ms beyond the link's alpha-beta time\n",
              ranks, handover * 1e3, static_cast<int>(NumberOr(handed[0], "handovers", 0)),
              link.handover_s * 1e3);
  std::fflush(stdout);
  return link;
}

// Runs each of `layouts` on `gpus` workers `repeats` times through the launcher, the layouts
// in turns, so that a slow spell of the host falls on one run of each rather than on every
// run of one: runs named `prefix`-i (and -rep after the first), labelled with the layout's
// name and, where `what` is given ("fit, ") or it runs more than once, "(<what>run 2 of 5)".
// Each layout's runs' figures, in order, in *measured.
std::optional<int> RunLayouts(Comparison* c, const std::vector<tandem::Layout>& layouts,
                              int gpus, int repeats, const std::string& prefix,
                              const std::string& what,
                              std::vector<std::vector<Figures>>* measured) {
  c->runs.clear();
  for (int rep = 0; rep < repeats; ++rep) {
    for (size_t i = 0; i < layouts.size(); ++i) {
      std::vector<std::string> flags = layouts[i].LauncherFlags();
      flags.push_back(absl::StrCat("--gpus=", gpus));
      const std::string suffix = rep == 0 ? "" : absl::StrCat("-", rep + 1);
      const std::string count =
          repeats > 1 || !what.empty()
              ? absl::StrFormat(" (%srun %d of %d)", what, rep + 1, repeats)
              : "";
      c->runs.push_back({absl::StrCat(prefix, "-", i + 1, suffix),
                         absl::StrCat(layouts[i].Name(), count), flags});
    }
  }
  c->refused.assign(c->runs.size(), "");
  std::vector<Entry> entries;
  if (std::optional<int> stop = RunAll(*c, &entries)) return stop;
  measured->assign(layouts.size(), {});
  for (size_t k = 0; k < entries.size(); ++k) {
    (*measured)[k % layouts.size()].push_back(ComputeFigures(entries[k], nullptr));
  }
  return std::nullopt;
}

// CPU workers that outnumber the cores: fits r->waiting_share to the fastest of `repeats`
// runs of the plan's WaitingShareProbe (the checked layouts' measure) and plans again with
// it (none: the plan as it is, saying so).
std::optional<int> FitWaitingShareHere(Comparison* c, int repeats, PlanRequest* r, Plan* plan) {
  const std::optional<tandem::Layout> probe = WaitingShareProbe(*plan);
  if (!probe) {
    r->waiting_share_source = "no pipeline to fit it to: 0";
    return std::nullopt;
  }
  std::printf("compare --plan: fitting the waiting share to %s ...\n", probe->Name().c_str());
  std::fflush(stdout);
  std::vector<std::vector<Figures>> measured;
  if (std::optional<int> stop =
          RunLayouts(c, {*probe}, r->gpus, repeats, "waiting", "fit, ", &measured)) {
    return stop;
  }
  double fastest = 0;  // 0: no run completed
  std::string error;    // the first failed run's
  for (const Figures& f : measured[0]) {
    if (f.step_seconds > 0 && (fastest == 0 || f.step_seconds < fastest)) {
      fastest = f.step_seconds;
    }
    if (!f.ran && error.empty()) error = f.error;
  }
  if (fastest == 0) {
    std::fprintf(stderr, "compare --plan: no run of %s completed (%s; %s/runs); give "
                 "--waiting-share=SHARE instead\n", probe->Name().c_str(),
                 FirstLineOf(error).c_str(), c->out_dir.c_str());
    return 1;
  }
  absl::StatusOr<double> w = FitWaitingShare(*r, *probe, fastest);
  if (w.ok()) {
    r->waiting_share = *w;
    r->waiting_share_fit = *probe;
    r->waiting_share_source =
        absl::StrFormat("fitted to %s: %.1f ms a step, the fastest of %d runs%s", probe->Name(),
                        fastest * 1e3, repeats,
                        *w == 0   ? "; at its bound: no slower than predicted without it"
                        : *w == 1 ? "; at its bound: slower than a whole turn predicts"
                                  : "");
  }
  absl::StatusOr<Plan> again = w.ok() ? MakePlan(*r) : absl::StatusOr<Plan>(w.status());
  if (!again.ok()) {
    std::fprintf(stderr, "compare --plan: %s\n", std::string(again.status().message()).c_str());
    return 2;
  }
  *plan = *std::move(again);  // PlanNotes says the share and its source
  return std::nullopt;
}

// compare --plan: predicts every layout (tools/plan.h), then, unless --no-run, runs the ones it
// checks itself on through the launcher, as the comparison runs its strategies.
int PlanMain(int argc, char** argv, absl::Time now) {
  PlanOptions o;
  if (std::optional<int> stop = ParsePlanArgs({argv + 1, argv + argc}, &o)) return *stop;
  o.request.host_cores = o.request.base.train.device.is_cuda() ? 0 : HostCpus();
  // CPU blocks are timed as a CPU worker runs them: on one BLAS thread (worker/worker.cc).
  if (o.request.host_cores > 0) openblas_set_num_threads(1);
  // Files named relative to where the user ran bazel run.
  const std::string bwd = launcher::BuildWorkingDirectory();
  for (std::string* path : {&o.block_times, &o.write_block_times}) {
    if (!path->empty()) *path = launcher::AbsolutePath(bwd.empty() ? Cwd() : bwd, *path);
  }
  std::optional<LinkModel> link;
  if (o.link.empty()) {
    // As many workers as the plan's (WorkersTimedHere): where more workers than cores share
    // this host, their collectives wait on one another's turns on the cores (an all-reduce of
    // 8 MB takes about 4 times as long over 4 workers on 2 cores as over 2).
    const int ranks = WorkersTimedHere(o.request.gpus);
    std::printf("compare --plan: timing the link between %d workers ...\n", ranks);
    std::fflush(stdout);
    absl::StatusOr<LinkModel> measured = MeasureLink(argv[0], ranks);
    if (!measured.ok()) {
      std::fprintf(stderr, "compare --plan: %s\n", std::string(measured.status().message()).c_str());
      return 1;
    }
    link = *measured;
  }
  if (absl::Status s = PreparePlan(&o, link); !s.ok()) {
    std::fprintf(stderr, "compare --plan: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<Plan> plan = MakePlan(o.request);
  if (!plan.ok()) {
    std::fprintf(stderr, "compare --plan: %s\n", std::string(plan.status().message()).c_str());
    return 2;
  }
  Comparison c;
  c.options.gpus = o.request.gpus;
  c.options.out_dir = o.out_dir;
  c.options.args = o.args;
  c.options.pass = o.model_flags;
  if (std::optional<int> stop = Prepare(argv[0], now, &c)) return *stop;
  if (o.waiting_share < 0 && o.request.SharesCores()) {
    std::optional<int> stop = FitWaitingShareHere(&c, o.repeats, &o.request, &*plan);
    if (stop) return *stop;
  }
  for (const std::string& n : PlanNotes(*plan, o.request)) std::printf("%s\n", n.c_str());
  std::printf("\n%s\n", PlanTable(*plan, o.top).c_str());
  std::fflush(stdout);
  std::vector<PlanCheck> checks;
  std::vector<std::string> held_out;  // the layouts of the waiting share's fit's shape
  if (o.run) {
    const CheckSelection selection = LayoutsToCheck(*plan, o.request.waiting_share_fit);
    held_out = selection.held_out;
    for (const std::string& h : held_out) {
      std::printf("compare --plan: held out of the check: %s\n", h.c_str());
    }
    std::fflush(stdout);
    const std::vector<Prediction>& checked = selection.checked;
    std::vector<tandem::Layout> layouts;
    for (const Prediction& p : checked) layouts.push_back(p.layout);
    std::vector<std::vector<Figures>> measured;
    if (std::optional<int> stop =
            RunLayouts(&c, layouts, o.request.gpus, o.repeats, "plan", "", &measured)) {
      return *stop;
    }
    checks = CheckPlan(checked, measured);
    std::printf("\n%s\n", CheckTable(checks).c_str());
    for (const std::string& v : CheckVerdict(checks, held_out)) std::printf("%s\n", v.c_str());
  }
  const std::string date = absl::FormatTime("%Y-%m-%d %H:%M:%S %Z", now, absl::LocalTimeZone());
  if (absl::Status s = WritePlanReport(c.out_dir, o, *plan, checks, held_out, date); !s.ok()) {
    std::fprintf(stderr, "compare --plan: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("\nplan: %s/plan.md\n      %s/plan.json\n", c.out_dir.c_str(), c.out_dir.c_str());
  return 0;
}

int Main(int argc, char** argv) {
  const absl::Time now = absl::Now();
  if (WantsPlan({argv + 1, argv + argc})) return PlanMain(argc, argv, now);
  Comparison c;
  c.options.args.assign(argv + 1, argv + argc);
  if (std::optional<int> stop = ParseArgs(&c.options)) return *stop;
  if (std::optional<int> stop = Prepare(argv[0], now, &c)) return *stop;
  if (std::optional<int> stop = CheckRuns(&c)) return *stop;
  std::vector<Entry> entries;
  if (std::optional<int> stop = RunAll(c, &entries)) return *stop;
  return WriteAll(c, std::move(entries), now);
}

}  // namespace
}  // namespace tools
}  // namespace tandem

int main(int argc, char** argv) { return tandem::tools::Main(argc, argv); }
