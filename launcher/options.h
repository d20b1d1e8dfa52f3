// The launcher's flags and their validation: hyphenated command-line names mapped onto Abseil
// flags, a --help listing, and every check that must pass before anything starts (strategy,
// device, model, strategy/world-size fit, data, checkpoints, run directory).
#ifndef TANDEM_LAUNCHER_OPTIONS_H_
#define TANDEM_LAUNCHER_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "launcher/flags.h"
#include "launcher/paths.h"  // CreateRunDirectory, DefaultRunDir
#include "parallel/job.h"

namespace tandem {
namespace launcher {

// Everything the user can set, as given (before validation and defaults): the job's
// settings in the form workers receive them (--gpus is job.workers; job.device is "auto",
// "cuda" or "cpu"; paths and --resume still as typed), and what only the launcher uses.
struct Options {
  Options() { job.device = "auto"; }
  JobConfig job;
  int max_restarts = 0;
  std::string hostfile;
  std::string coordinator_address;  // host[:port]
  std::string mpirun_args;
  bool prepare = false;
  bool check = false;  // validate, say what would run, start and write nothing
  bool explain = false;  // print what runs on each rank (ExplainLayout) before starting
};

// The launcher's flags, and the command line parsed into them (flags.h): ParseFlags sets
// *help when --help (or -h) was given; an error's message holds one line per problem.
const FlagSet& LauncherFlags();
std::vector<std::string> RewriteArgs(const std::vector<std::string>& args);
absl::Status ParseFlags(const std::vector<std::string>& args, bool* help);
// The current flag values.
Options OptionsFromFlags();
// The --help text: every flag with its hyphenated name, help and default.
std::string HelpText();
// The names (underscored, as defined) of the launcher's flags, in --help order.
const std::vector<std::string>& FlagNames();

// What validation needs to know about this machine and the user.
struct HostInfo {
  int cuda_devices = 0;      // visible CUDA devices
  std::string why_no_cuda;   // why none, when cuda_devices == 0
  std::string user_dir;      // where relative paths are resolved and runs/ is made
  absl::Time now = absl::UnixEpoch();
  int64_t available_memory = -1;    // host memory this job may still take; -1: unknown
  std::vector<int64_t> gpu_memory;  // each visible GPU's total memory
  // How --balance=time times each block of a job's model (seconds per block). The launcher
  // binary times them in a worker process (launcher.cc), so that it holds no device memory
  // and no CUDA context while the job runs; when empty, in this process (TimeBlocks).
  std::function<absl::StatusOr<std::vector<double>>(const JobConfig&)> time_blocks;
  // Looks at this machine; CUDA is probed only when `probe_cuda`.
  static HostInfo Detect(bool probe_cuda);
};

// A validated job, ready to start.
struct LaunchPlan {
  JobConfig job;          // resolved device; absolute run_dir, data and resume paths (the
                          // checkpoint --resume=auto found, or none)
  std::string hostfile;   // absolute, or empty
  // The coordinator: the host workers are told (TANDEM_COORDINATOR), the address it
  // listens on ("10.0.0.1:0": port 0 picks a free one), and whether that is reachable from
  // other hosts (not loopback).
  std::string coordinator_host = "127.0.0.1";
  std::string coordinator_listen = "127.0.0.1:0";
  bool coordinator_remote = false;
  std::vector<std::string> mpirun_args;  // --mpirun-args, split at spaces
  int max_restarts = 0;
  std::vector<std::string> notices;  // lines to show before starting (e.g. the CPU fallback)
  std::string explanation;  // --explain: what runs on each rank (ExplainLayout)
};

// Checks everything before any worker starts; creates nothing. An error's message holds one
// line per problem (a pipeline schedule problem may add its grid below its line).
absl::StatusOr<LaunchPlan> Validate(const Options& o, const HostInfo& host);

// --resume accepts the step prefix "<dir>/step-NNNNNN" or one of its files
// ("<prefix>.manifest", "<prefix>.ckpt", "<prefix>.stage-R.ckpt"); this returns the prefix.
std::string CheckpointPrefix(const std::string& resume);

// Writes <run_dir>/job.conf (the job as workers started by srun read it, --prepare).
absl::Status WriteJobConfig(const JobConfig& job);

}  // namespace launcher
}  // namespace tandem

#endif  // TANDEM_LAUNCHER_OPTIONS_H_
