// Trains one model on one device and prints the loss of every step and the throughput:
//   bazel run //examples:train -- --model=gpt-tiny --steps=300
// It is the single-worker baseline that every parallel strategy is checked against. With
// --run-dir it also writes what a launcher run writes there, with the same code: run.json and
// metrics/rank-0.jsonl (launcher/run_report.h, parallel/metrics.h), and the checkpoints.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "launcher/flags.h"
#include "launcher/job_flags.h"
#include "launcher/paths.h"
#include "launcher/run_report.h"
#include "model/trainer.h"
#include "parallel/job.h"
#include "parallel/metrics.h"
#include "runtime/device.h"
#include "runtime/device_peak.h"
#include "runtime/files.h"
#include "runtime/profiler.h"

// The job's model and training flags are launcher/job_flags.cc's, the launcher's too (here
// --steps defaults to 300). These are this program's own: where the launcher has a flag of
// the same name, it means something else there (--micro-batches=0, --device=auto, --run-dir's
// default, --resume=auto, and --init-from with it, are the launcher's only).
ABSL_FLAG(int, micro_batches, 1, "gradient accumulation: micro-batches per step");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, run_dir, "",
          "write run.json, metrics/rank-0.jsonl and the checkpoints into this directory, as "
          "the launcher does (made if missing); auto: runs/<time>-train, the launcher's naming; "
          "empty: print only");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "directory the checkpoints go to (made if missing; default with --run-dir: "
          "<run_dir>/checkpoints)");
ABSL_FLAG(std::string, resume, "", "checkpoint file (.ckpt) to resume from");
ABSL_FLAG(std::string, init_from, "",
          "start from the weights of a safetensors file in Hugging Face GPT-2's layout "
          "(bazel run //tools:export wrote it, or transformers did) instead of the seed's; not "
          "with --resume");
ABSL_FLAG(int, profile_steps, 0,
          "profile the last N steps: each op's time on its device (events around it on the "
          "stream) and its achieved GFLOP/s and GB/s, in a table at the end (those steps are "
          "left out of the tokens/s)");

namespace tandem {
namespace {

// What the flags ask for: the training, and with --run-dir where it is recorded and the job
// run.json describes: one worker, as the launcher's --strategy=data --gpus=1 (the same
// training), with the launcher's defaults where one device has no use for a setting.
struct Setup {
  JobConfig job;
  TrainConfig train;
  std::string run_dir;  // resolved; empty: print only
};

// Where the user's relative paths are: under `bazel run`, the directory it was started from
// (this process runs in its runfiles).
std::string UserDir() {
  const std::string bwd = launcher::BuildWorkingDirectory();
  if (!bwd.empty()) return bwd;
  char buf[4096];
  return getcwd(buf, sizeof(buf)) != nullptr ? buf : ".";
}

absl::StatusOr<Setup> SetupFromFlags() {
  Setup setup;
  const std::string user_dir = UserDir();
  auto users = [&](const std::string& path) { return launcher::AbsolutePath(user_dir, path); };
  JobConfig& job = setup.job;
  job.strategy = "data";
  job.workers = 1;
  launcher::JobFlagsInto(&job);
  job.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  job.data = users(job.data);
  job.val_data = users(job.val_data);
  job.resume = users(absl::GetFlag(FLAGS_resume));
  job.init_from = users(absl::GetFlag(FLAGS_init_from));
  job.profile = absl::GetFlag(FLAGS_profile_steps) > 0;
  auto device = ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return device.status();
  job.device = device->is_cuda() ? "cuda" : "cpu";
  const std::string run_dir = absl::GetFlag(FLAGS_run_dir);
  if (run_dir == "auto") {
    setup.run_dir = launcher::NewRunDir(user_dir, absl::Now(), "train");
  } else if (!run_dir.empty()) {
    setup.run_dir = users(run_dir);
    bool exists, is_dir;
    const bool non_empty = launcher::IsNonEmptyDirectory(setup.run_dir, &exists, &is_dir);
    if (exists && !is_dir) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--run-dir=%s exists and is not a directory", run_dir));
    }
    if (non_empty && job.resume.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--run-dir=%s exists and is not empty; choose another directory (or --resume)",
          run_dir));
    }
  }
  job.run_dir = setup.run_dir;
  job.ResolveVocab();
  // The training the job's workers would run, on this device.
  auto pc = job.ToParallelConfig(*device);
  if (!pc.ok()) return pc.status();
  TrainConfig& c = setup.train;
  c = pc->train;
  c.micro_batches = job.micro_batches;  // as given: 0 is refused, not a default
  c.checkpoint_every = job.checkpoint_every;
  c.resume = job.resume;
  c.checkpoint_dir = users(absl::GetFlag(FLAGS_checkpoint_dir));
  if (c.checkpoint_dir.empty() && !setup.run_dir.empty()) {
    c.checkpoint_dir = setup.run_dir + "/checkpoints";
  }
  if (c.device.is_cuda()) {
    std::string why;
    if (CudaDeviceCount(&why) <= c.device.index()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--device=%s: no such CUDA device (%s); use --device=cpu", c.device.ToString(), why));
    }
  }
  return setup;
}

// The run directory (its metrics from `first_step` on written again, as the launcher does)
// and the checkpoint directory; false, having said why, where one cannot be made.
bool MakeOutputDirs(const Setup& setup, int first_step) {
  const TrainConfig& c = setup.train;
  if (!setup.run_dir.empty()) {
    absl::Status made = launcher::CreateRunDirectory(setup.run_dir);
    if (made.ok()) made = launcher::TruncateRunMetrics(setup.run_dir, first_step);
    if (!made.ok()) {
      std::fprintf(stderr, "train: --run-dir=%s: %s\n", setup.run_dir.c_str(),
                   std::string(made.message()).c_str());
      return false;
    }
  }
  if (c.checkpoint_every > 0) {
    if (absl::Status made = MakeDirs(c.checkpoint_dir); !made.ok()) {
      std::fprintf(stderr, "train: --checkpoint-dir=%s: %s\n", c.checkpoint_dir.c_str(),
                   std::string(made.message()).c_str());
      return false;
    }
  }
  return true;
}

// run.json as the launcher writes it, of every step recorded in the run directory; `outcome`
// is the training's.
absl::Status WriteRunRecord(const Setup& setup, int first_step, absl::Duration wall,
                            const absl::Status& outcome) {
  launcher::RunRecord rec;
  rec.job = setup.job;
  rec.seq_len = setup.train.model.seq_len;
  rec.wall_seconds = absl::ToDoubleSeconds(wall);
  rec.first_step = first_step;
  rec.ranks = launcher::ReadRunMetrics(setup.run_dir, 1);
  if (!outcome.ok()) {
    rec.exit = "rank 0 failed";
    rec.failed_rank = 0;
    rec.failure = std::string(outcome.message());
  }
  return launcher::WriteRunJson(rec);
}

// The steady steps' median time, tokens/s, host synchronizations and, on a GPU, MFU.
void PrintSteadySteps(const TrainConfig& c, std::vector<double> step_seconds,
                      std::vector<int64_t> step_syncs) {
  if (step_seconds.empty()) return;
  // The median step, as tools/bench_pytorch.py reports PyTorch's: a stray slow step (another
  // process, a page fault) does not move it.
  std::sort(step_seconds.begin(), step_seconds.end());
  const double median = step_seconds[step_seconds.size() / 2];
  const double tokens_per_second = c.batch * c.model.seq_len / median;
  std::printf("median step %.2f ms, %.0f tokens/s over %zu steps\n", 1e3 * median,
              tokens_per_second, step_seconds.size());
  // Step times are the device's (events on the compute stream); the host waits once a
  // step, to read the loss printed above.
  std::sort(step_syncs.begin(), step_syncs.end());
  std::printf("host syncs per step %lld (median; the step's loss read)\n",
              static_cast<long long>(step_syncs[step_syncs.size() / 2]));
  std::string gpu;
  int major = 0, minor = 0;
  if (c.device.is_cuda() && CudaDeviceIdentity(c.device.index(), &gpu, &major, &minor)) {
    // Against this GPU's dense peak in the run's dtype (docs/DESIGN.md, "Measured, always").
    std::printf("%s\n", DescribeMfu(static_cast<double>(c.model.num_matmul_params()),
                                    tokens_per_second, c.dtype, gpu, major, minor)
                             .c_str());
  }
}

int Main() {
  auto setup = SetupFromFlags();
  if (!setup.ok()) {
    std::fprintf(stderr, "train: %s\n", std::string(setup.status().message()).c_str());
    return 2;
  }
  const TrainConfig& c = setup->train;
  const std::string& run_dir = setup->run_dir;
  if (absl::Status v = c.Validate(); !v.ok()) {
    std::fprintf(stderr, "train: %s\n", std::string(v.message()).c_str());
    return 2;
  }
  auto trainer = Trainer::Create(c);
  if (!trainer.ok()) {
    const absl::Status e = ExplainOutOfMemory(trainer.status(), '-');
    std::fprintf(stderr, "train: %s\n", std::string(e.message()).c_str());
    return 2;
  }
  const int first_step = (*trainer)->step();
  if (first_step >= c.steps) {
    std::fprintf(stderr,
                 "train: --resume=%s: the checkpoint is at step %d and --steps=%d: nothing left "
                 "to train; raise --steps\n",
                 c.resume.c_str(), first_step, c.steps);
    return 2;
  }
  if (!MakeOutputDirs(*setup, first_step)) return 2;
  std::printf("model  %s\ndata   %s (%lld tokens, %lld samples)\ndevice %s, batch %d x %d tokens\n",
              c.model.ToString().c_str(), (*trainer)->data().source().c_str(),
              static_cast<long long>((*trainer)->data().num_tokens()),
              static_cast<long long>((*trainer)->data().num_samples()),
              c.device.ToString().c_str(), c.batch, c.model.seq_len);
  std::printf("memory %s\n", DescribeMemory((*trainer)->memory()).c_str());
  if (!run_dir.empty()) {
    std::printf("run    %s (run.json, metrics/rank-0.jsonl)\n", run_dir.c_str());
  }
  std::fflush(stdout);  // before any error on stderr, in a log that takes both
  auto allocator = GetAllocator(c.device);
  // The step records of metrics/rank-0.jsonl, as a worker's, less the split of the step's time
  // (one device measures only its whole).
  std::unique_ptr<MetricsWriter> metrics;
  if (!run_dir.empty()) metrics = std::make_unique<MetricsWriter>(MetricsPath(run_dir, 0));
  absl::Status written;
  auto record = [&](const StepReport& r) {
    if (metrics == nullptr || !written.ok()) return;
    StepRecord m = StepRecordOf(r);
    m.breakdown = false;
    m.peak_in_flight = 1;  // micro-batches run one after another
    if (allocator.ok()) {
      const AllocatorStats mem = (*allocator)->stats();
      m.allocated_bytes = mem.allocated_bytes;
      m.peak_bytes = mem.peak_allocated_bytes;
    }
    const MemoryNeed& state = (*trainer)->memory().need;
    m.param_bytes = state.params;
    m.grad_bytes = state.grads;
    m.optimizer_bytes = state.optimizer;
    written = metrics->Append(m);
  };
  const int profile_steps = std::max(0, std::min(absl::GetFlag(FLAGS_profile_steps), c.steps));
  const int first_profiled = c.steps - profile_steps;
  if (first_profiled == 0 && profile_steps > 0) Profiler::Enable(true);
  std::vector<double> step_seconds;  // after the first two, which warm caches and the allocator
  std::vector<int64_t> step_syncs;   // host synchronizations in each of those steps
  const absl::Time start = absl::Now();
  absl::Status s = (*trainer)->Run([&](const StepReport& r) {
    const double tok_s = c.batch * c.model.seq_len / r.seconds;
    if (r.step >= 2 && r.step < first_profiled) {
      step_seconds.push_back(r.seconds);
      step_syncs.push_back(r.host_syncs);
    }
    if (r.step + 1 == first_profiled) Profiler::Enable(true);
    std::printf("step %4d/%d  loss %.4f%s  lr %.2e  norm %.3f  %7.0f tok/s%s\n", r.step + 1,
                c.steps, r.loss,
                r.val_loss ? absl::StrFormat("  val %.4f", *r.val_loss).c_str() : "", r.lr,
                r.grad_norm, tok_s, r.skipped ? "  (skipped)" : "");
    std::fflush(stdout);
    record(r);
  });
  if (s.ok()) s = written;
  if (!run_dir.empty()) {
    absl::Status w = WriteRunRecord(*setup, first_step, absl::Now() - start, s);
    if (!w.ok() && s.ok()) s = w;
  }
  if (!s.ok()) {
    s = ExplainOutOfMemory(s, '-');
    std::fprintf(stderr, "train: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  PrintSteadySteps(c, std::move(step_seconds), std::move(step_syncs));
  if (profile_steps > 0) {
    Profiler::Enable(false);
    std::printf("op table, last %d steps:\n%s", profile_steps,
                Profiler::FormatOpTable(Profiler::OpTable()).c_str());
  }
  if (allocator.ok()) std::printf("allocator %s\n", (*allocator)->stats().ToString().c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const tandem::launcher::FlagSet flags{
      "examples/train.cc",
      {"model",          "n_layer",        "d_model",
       "n_head",         "seq_len",        "attention",
       "tie_embeddings",
       "steps",          "batch",          "micro_batches",
       "lr",             "warmup",         "optimizer",
       "weight_decay",   "decay_all",      "clip_norm",
       "seed",           "data",           "data_format",
       "vocab",          "synthetic",      "val_data",
       "val_fraction",   "eval_every",     "eval_batches",
       "device",
       "dtype",          "run_dir",        "checkpoint_dir",
       "checkpoint_every", "resume",       "init_from",
       "profile_steps"},
      {tandem::launcher::kJobFlagsFile},
      {{"steps", "300"}}};
  const int rc = tandem::launcher::ParseCommandLine(
      flags, argc, argv, "train",
      "Usage: bazel run //examples:train -- [flags]\n"
      "Trains one model on one device, without the launcher, and prints the loss\n"
      "of every step and the throughput; with --run-dir it also writes run.json and\n"
      "metrics/rank-0.jsonl there, as the launcher does.\n"
      "  e.g. bazel run //examples:train -- --model=gpt-tiny --steps=300\n");
  return rc >= 0 ? rc : tandem::Main();
}
