// The launcher's flags (Abseil flags, written with hyphens on the command line), the --help
// listing, and the validation that turns them into a JobConfig before anything starts:
// every problem is reported, one line each, and nothing is created on disk.
#include "launcher/options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "comm/net_address.h"
#include "launcher/hostfile.h"
#include "launcher/job_flags.h"
#include "launcher/paths.h"
#include "model/data.h"
#include "model/hf_gpt2.h"
#include "model/sharded_checkpoint.h"
#include "model/trainer.h"
#include "parallel/layout.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/files.h"
#include "runtime/format.h"
#include "runtime/status.h"

// Names use underscores here; users write them with hyphens (RewriteFlagName). The job's
// model and training flags, which examples/train and compare --plan take too, are defined in
// launcher/job_flags.cc.
ABSL_FLAG(std::string, strategy, "data", "parallelism: data, model or pipeline");
ABSL_FLAG(int, gpus, 1,
          "workers to start: one per GPU (or per CPU slot where no GPU is visible)");
ABSL_FLAG(std::string, device, "auto",
          "auto (CUDA when a GPU is visible, else CPU workers), cuda or cpu");
ABSL_FLAG(int, micro_batches, 0,
          "micro-batches per step (0: the strategy's default; pipeline: up to 4 x workers)");
ABSL_FLAG(std::string, schedule, "gpipe",
          "pipeline schedule: gpipe, 1f1b, zb-h1 (1F1B with each backward split into its "
          "input and weight gradients, the weight gradients deferred into the bubbles) or "
          "interleaved (1F1B over --virtual-stages model chunks per stage, Megatron's virtual "
          "pipeline; --micro-batches a multiple of the stages)");
ABSL_FLAG(int, virtual_stages, 0,
          "interleaved schedule: model chunks per pipeline stage, v >= 2 (0: 2 under "
          "--schedule=interleaved, else 1); stage s holds global stages s, s + K, ...");
ABSL_FLAG(std::string, balance, "params",
          "pipeline stage split: params (balanced by parameters), time (balanced by each "
          "block's measured forward and backward time) or block counts like 3,3,2");
ABSL_FLAG(int, data_parallel, 1,
          "pipeline and model: D replicas of a pipeline of --gpus / D stages, each taking 1/D "
          "of the batch and all-reducing each stage's gradients with its peers; ranks in "
          "Megatron's order, a stage's D replicas on neighbouring ranks (1: one pipeline)");
ABSL_FLAG(int, tensor_parallel, 1,
          "T: each stage's blocks split over T neighbouring ranks, Megatron-style (a GPT: "
          "attention heads and MLP columns and rows, the vocabulary of the embedding and the "
          "head); with any strategy, T x D x stages = --gpus (1: none)");
ABSL_FLAG(bool, sequence_parallel, false,
          "with --tensor-parallel=T >= 2: between the tensor-parallel regions each rank holds "
          "1/T of the rows (Megatron's sequence parallelism); all-gather and reduce-scatter in "
          "place of the all-reduce, LayerNorms on the local rows, less activation memory");
ABSL_FLAG(int, zero, 0,
          "1: ZeRO-1, each data-parallel replica keeps 1/D of the optimizer state and updates "
          "its shard of the parameters (data, or pipeline / model with --data-parallel >= 2); "
          "2: ZeRO-2, its 1/D of the gradients too (each bucket reduce-scattered into the shard "
          "and freed); 0: every replica keeps all of it");
ABSL_FLAG(std::string, run_dir, "",
          "where logs, metrics, checkpoints and run.json go; empty: "
          "runs/<YYYYmmdd-HHMMSS>-<strategy> in the directory the launcher was started from");
ABSL_FLAG(std::string, resume, "",
          "checkpoint to resume from: auto (the newest complete one in --run-dir; none: start "
          "fresh), or <dir>/step-NNNNNN (or one of its files); written by any strategy and "
          "number of workers");
ABSL_FLAG(std::string, init_from, "",
          "start from the weights of a safetensors file in Hugging Face GPT-2's layout (one "
          "bazel run //tools:export wrote, or a GPT2LMHeadModel's model.safetensors) instead of "
          "the seed's; the optimizer starts fresh; GPT models only; not with --resume=<checkpoint> (with "
          "--resume=auto, only while the run has no checkpoint)");
ABSL_FLAG(int, max_restarts, 0,
          "when a worker fails, restart the whole job from its newest complete checkpoint, up "
          "to this many times");
ABSL_FLAG(std::string, hostfile, "",
          "Open MPI hostfile (\"host slots=N\" lines): start the workers on those hosts "
          "through mpirun (examples/hostfile)");
ABSL_FLAG(std::string, coordinator_address, "",
          "host[:port] the workers reach the coordinator at; default with --hostfile: this "
          "host's address on the network of the hostfile's first other host, a free port");
ABSL_FLAG(std::string, mpirun_args, "",
          "more mpirun arguments, split at spaces (e.g. \"--mca btl_tcp_if_include eth1\")");
ABSL_FLAG(bool, prepare, false,
          "validate, make the run directory, write <run-dir>/job.conf for workers started by "
          "srun (examples/slurm/train.sbatch) and exit");
ABSL_FLAG(bool, check, false,
          "validate every flag and the memory fit, say what the run would be, and exit: "
          "nothing is started or written (exit 0: it would start, 2: it would not)");
ABSL_FLAG(bool, explain, false,
          "print what runs on each rank before anything starts: its (replica, stage), its "
          "blocks, its gradient buckets, its memory need and its row of the schedule (with "
          "--check: then exit)");
ABSL_FLAG(bool, profile, false,
          "record a trace of every step and each rank's op table (time, GFLOP/s and GB/s per op)");
ABSL_FLAG(int, log_every, 1,
          "read the loss on the host, for the progress line and the metrics, every this many "
          "steps: the one host synchronization a steady step makes (every step's loss is still "
          "recorded); also the steps at which a SIGTERM's stop is agreed");
ABSL_FLAG(bool, debug_syncs, false,
          "print, to each rank's log, where every host synchronization beyond the loss reads "
          "and checkpoints came from (a stack trace), like torch.cuda.set_sync_debug_mode");
ABSL_FLAG(double, bucket_mb, 25,
          "data parallel and --data-parallel >= 2: gradient bucket size in MB");
ABSL_FLAG(bool, overlap, true,
          "data parallel and --data-parallel >= 2: reduce gradients during backward "
          "(--no-overlap: after it)");
ABSL_FLAG(bool, recompute, false,
          "keep only each stage's inputs and recompute the forward pass during backward "
          "(less activation memory, more compute)");
ABSL_FLAG(double, heartbeat_timeout, 60,
          "seconds without a worker's heartbeat before the job is declared hung and stopped");

namespace tandem {
namespace launcher {
namespace {

// Whether `a` and `b` name the same existing directory.
bool SameDirectory(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && S_ISDIR(sa.st_mode) &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

// Why `path`, which does not exist, could not be created, or "" when it could: its nearest
// existing ancestor must be a directory this process may write in.
std::string WhyNotCreatable(const std::string& path) {
  auto parent = [](const std::string& p) {
    const std::string d = DirOf(p);
    return d.empty() ? std::string("/") : d;
  };
  std::string dir = parent(path);
  struct stat st;
  bool found;
  while (!(found = ::stat(dir.c_str(), &st) == 0) && dir != "." && dir != "/") dir = parent(dir);
  if (!found) return absl::StrFormat("%s: %s", dir, std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return absl::StrCat(dir, " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::StrFormat("%s is not writable (%s)", dir, std::strerror(errno));
  }
  return "";
}

// Workers on this host, before any starts: CPU workers share its memory, so what they keep
// together must fit in what it has available; rank r's stage must fit in GPU r's whole
// memory. (Each worker checks again, against what its device has free, before it allocates.)
// Returns the notice of what they need against what there is ("" where that is unknown).
absl::StatusOr<std::string> CheckLocalMemory(const ParallelConfig& pc, const JobLayout& layout,
                                             int workers, const HostInfo& host) {
  const bool gpus = pc.train.device.is_cuda();
  const std::vector<MemoryNeed>& needs = layout.memory;
  MemoryNeed all, most;
  int most_rank = 0;
  int64_t optimizer = 0;
  for (int r = 0; r < workers; ++r) {
    const MemoryNeed& need = needs[r];
    all += need;
    optimizer = std::max(optimizer, need.optimizer);
    if (need.total() > most.total()) most = need, most_rank = r;
    if (gpus && r < static_cast<int>(host.gpu_memory.size())) {
      RETURN_IF_ERROR(CheckMemory(need, host.gpu_memory[r], absl::StrFormat("rank %d", r),
                                  absl::StrFormat("cuda:%d (all of its memory)", r)));
    }
  }
  // The optimizer state each rank keeps (ZeRO-1: its shard).
  const ProcessGrid& grid = layout.grid;
  const std::string state = absl::StrFormat(
      "optimizer state %s%s per rank%s", grid.stages > 1 ? "up to " : "", FormatBytes(optimizer),
      pc.zero >= 1 && grid.replicas > 1
          ? absl::StrFormat(" (ZeRO-%d: a 1/%d shard of each stage's)", pc.zero, grid.replicas)
          : "");
  if (gpus) {
    const int64_t gpu =
        most_rank < static_cast<int>(host.gpu_memory.size()) ? host.gpu_memory[most_rank] : -1;
    if (gpu < 0) return std::string();
    return absl::StrFormat("memory: rank %d needs the most, at least %s of cuda:%d's %s; %s",
                           most_rank, FormatBytes(most.total()), most_rank, FormatBytes(gpu),
                           state);
  }
  const std::string who = workers == 1 ? "the worker" : absl::StrFormat("the %d workers", workers);
  RETURN_IF_ERROR(CheckMemory(all, host.available_memory, who, "this host"));
  if (host.available_memory < 0) return std::string();
  return absl::StrFormat("memory: %s need%s at least %s of the %s this host has available; %s",
                         who, workers == 1 ? "s" : "", FormatBytes(all.total()),
                         FormatBytes(host.available_memory), state);
}

// --balance=time times each block's forward and backward on one micro-batch, every block in
// one process on this host's device (GPU 0, or the host; the launcher starts a worker process
// for it): the whole model must fit there.
absl::Status CheckBlockTiming(const ParallelConfig& pc, const HostInfo& host) {
  const TrainConfig& t = pc.train;
  const bool gpu = t.device.is_cuda();
  const int64_t available = !gpu                      ? host.available_memory
                            : host.gpu_memory.empty() ? -1
                                                      : host.gpu_memory[0];
  MemoryNeed need =
      EstimateStageMemory(t.model, 0, t.model.num_blocks(), t.batch / t.micro_batches, 1,
                          /*recompute=*/false, t.dtype, t.optimizer.kind, t.device);
  need.optimizer = 0;  // no optimizer steps while timing
  return CheckMemory(need, available,
                     "--balance=time, which times every block on one device (--balance=params "
                     "or sizes such as 3,3,2 do not)",
                     gpu ? "cuda:0 (all of its memory)" : "this host");
}

}  // namespace

const std::vector<std::string>& FlagNames() {
  // clang-format off
  static const auto* names = new std::vector<std::string>{
      "strategy", "gpus", "device", "model", "n_layer", "d_model", "n_head", "seq_len",
      "attention", "tie_embeddings", "dtype", "steps", "batch", "micro_batches", "schedule", "virtual_stages", "balance",
      "data_parallel", "tensor_parallel", "sequence_parallel", "zero", "lr", "warmup", "optimizer", "weight_decay", "decay_all",
      "clip_norm", "seed", "data", "data_format", "vocab", "synthetic", "val_data",
      "val_fraction", "eval_every", "eval_batches", "run_dir",
      "checkpoint_every", "resume", "init_from", "max_restarts", "hostfile", "coordinator_address",
      "mpirun_args", "prepare", "check", "explain", "profile", "log_every", "debug_syncs", "bucket_mb",
      "overlap", "recompute", "heartbeat_timeout"};
  // clang-format on
  return *names;
}

const FlagSet& LauncherFlags() {
  static const auto* flags = new FlagSet{"launcher/options.cc", FlagNames(), {kJobFlagsFile}};
  return *flags;
}

std::vector<std::string> RewriteArgs(const std::vector<std::string>& args) {
  return RewriteArgs(LauncherFlags(), args);
}

absl::Status ParseFlags(const std::vector<std::string>& args, bool* help) {
  return ParseFlags(LauncherFlags(), args, help);
}

std::string HelpText() {
  return HelpText(
      LauncherFlags(),
      "Usage: bazel run //launcher -- [flags]\n"
      "Starts a training job: validates the flags, runs the coordinator, starts one worker\n"
      "per GPU (or CPU workers where no GPU is visible) through mpirun, shows progress, and\n"
      "writes logs, metrics and run.json to the run directory.\n"
      "  e.g. bazel run //launcher -- --strategy=pipeline --gpus=4 --model=gpt-tiny\n");
}

Options OptionsFromFlags() {
  Options o;
  JobFlagsInto(&o.job);
  o.job.strategy = absl::GetFlag(FLAGS_strategy);
  o.job.workers = absl::GetFlag(FLAGS_gpus);
  o.job.device = absl::GetFlag(FLAGS_device);
  o.job.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  o.job.schedule = absl::GetFlag(FLAGS_schedule);
  o.job.virtual_stages = absl::GetFlag(FLAGS_virtual_stages);
  if (o.job.virtual_stages == 0) o.job.virtual_stages = o.job.schedule == "interleaved" ? 2 : 1;
  o.job.balance = absl::GetFlag(FLAGS_balance);
  o.job.data_parallel = absl::GetFlag(FLAGS_data_parallel);
  o.job.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  o.job.sequence_parallel = absl::GetFlag(FLAGS_sequence_parallel);
  o.job.zero = absl::GetFlag(FLAGS_zero);
  o.job.run_dir = absl::GetFlag(FLAGS_run_dir);
  o.job.resume = absl::GetFlag(FLAGS_resume);
  o.job.init_from = absl::GetFlag(FLAGS_init_from);
  o.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  o.hostfile = absl::GetFlag(FLAGS_hostfile);
  o.coordinator_address = absl::GetFlag(FLAGS_coordinator_address);
  o.mpirun_args = absl::GetFlag(FLAGS_mpirun_args);
  o.prepare = absl::GetFlag(FLAGS_prepare);
  o.check = absl::GetFlag(FLAGS_check);
  o.explain = absl::GetFlag(FLAGS_explain);
  o.job.profile = absl::GetFlag(FLAGS_profile);
  o.job.log_every = absl::GetFlag(FLAGS_log_every);
  o.job.debug_syncs = absl::GetFlag(FLAGS_debug_syncs);
  o.job.bucket_mb = absl::GetFlag(FLAGS_bucket_mb);
  o.job.overlap = absl::GetFlag(FLAGS_overlap);
  o.job.recompute = absl::GetFlag(FLAGS_recompute);
  o.job.heartbeat_timeout_s = absl::GetFlag(FLAGS_heartbeat_timeout);
  return o;
}

HostInfo HostInfo::Detect(bool probe_cuda) {
  HostInfo h;
  if (probe_cuda) h.cuda_devices = CudaDeviceCount(&h.why_no_cuda);
  for (int i = 0; i < h.cuda_devices; ++i) h.gpu_memory.push_back(CudaDeviceTotalMemory(i));
  h.available_memory = AvailableMemoryBytes(Device::Cpu());
  h.user_dir = BuildWorkingDirectory();
  if (h.user_dir.empty()) {
    char buf[4096];
    h.user_dir = getcwd(buf, sizeof(buf)) != nullptr ? buf : ".";
  }
  h.now = absl::Now();
  return h;
}

std::string CheckpointPrefix(const std::string& resume) {
  std::string p = resume;
  if (absl::EndsWith(p, ".manifest")) {
    p.resize(p.size() - 9);
  } else if (absl::EndsWith(p, ".ckpt")) {
    p.resize(p.size() - 5);
    // "<prefix>.stage-R"
    const size_t slash = p.rfind('/');
    const size_t dot = p.rfind(".stage-");
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) {
      int r;
      if (absl::SimpleAtoi(p.substr(dot + 7), &r)) p = p.substr(0, dot);
    }
  }
  return p;
}

absl::Status WriteJobConfig(const JobConfig& job) {
  return WriteFileAtomically(absl::StrCat(job.run_dir, "/", kJobConfigFile), job.ToText());
}

namespace {

// Validate(), one concern a method, in order: later checks read what earlier ones found
// (the strategy, the device, the model) and skip what an earlier problem makes moot. Every
// problem is collected, one line each.
struct Validation {
  Validation(const Validation&) = delete;  // `job` refers into this object's `plan`
  Validation& operator=(const Validation&) = delete;
  Validation(const Options& options, const HostInfo& host_info)
      : o(options),
        host(host_info),
        // Workers on several hosts (a hostfile, or srun after --prepare): this host's GPUs do
        // not bound their number.
        multi_host(!options.hostfile.empty() || options.prepare) {}

  void problem(const std::string& p) { problems.push_back(p); }

  // The strategy, the flags of other strategies (said to be ignored), the number of workers.
  void CheckStrategy() {
    strategy = ParseStrategy(o.job.strategy);
    strategy_ok = strategy.ok();
    if (!strategy_ok) problem(std::string(strategy.status().message()));
    // Another strategy's flags are said to be ignored, not refused: compare passes the same
    // flags to every strategy, and what a user set stays in job.conf and run.json.
    if (strategy_ok) {
      auto ignored = [&](bool set, const std::string& flag, const std::string& applies_to) {
        if (!set) return;
        plan.notices.push_back(absl::StrFormat("%s applies to %s only: ignored under --strategy=%s",
                                               flag, applies_to, o.job.strategy));
      };
      const bool pipeline = *strategy == StrategyKind::kPipeline;
      const bool data = *strategy == StrategyKind::kData;
      ignored(!pipeline && o.job.schedule != defaults.schedule,
              absl::StrCat("--schedule=", o.job.schedule), "--strategy=pipeline");
      ignored(!pipeline && o.job.virtual_stages != 1,
              absl::StrCat("--virtual-stages=", o.job.virtual_stages), "--strategy=pipeline");
      ignored(data && o.job.balance != defaults.balance, absl::StrCat("--balance=", o.job.balance),
              "--strategy=pipeline and model");
      // Gradient buckets are reduced among data-parallel replicas: data, or D >= 2.
      const bool replicated = data || o.job.data_parallel > 1;
      ignored(!replicated && o.job.bucket_mb != defaults.bucket_mb,
              absl::StrFormat("--bucket-mb=%g", o.job.bucket_mb),
              "--strategy=data and --data-parallel >= 2");
      ignored(!replicated && o.job.overlap != defaults.overlap, "--no-overlap",
              "--strategy=data and --data-parallel >= 2");
      ignored(data && o.job.data_parallel != defaults.data_parallel,
              absl::StrFormat("--data-parallel=%d", o.job.data_parallel),
              "--strategy=pipeline and model (data parallelism replicates the whole model on "
              "every worker)");
    }
    gpus_ok = o.job.workers >= 1 && o.job.workers <= 4096;
    if (!gpus_ok) {
      problem(absl::StrFormat("--gpus=%d: need between 1 and 4096 workers", o.job.workers));
    }
  }

  // The device: auto, cuda or cpu, against the GPUs visible here.
  void CheckDevice() {
    auto check_count = [&]() {
      if (multi_host || !gpus_ok || o.job.workers <= host.cuda_devices) return;
      device_ok = false;
      problem(absl::StrFormat(
          "--gpus=%d but only %d GPU%s visible on this machine; use --gpus=%d, or --device=cpu "
          "for CPU workers",
          o.job.workers, host.cuda_devices, host.cuda_devices == 1 ? " is" : "s are",
          host.cuda_devices));
    };
    if (o.job.device == "cpu") {
      device = Device::Cpu();
    } else if (o.job.device == "cuda") {
      device = Device::Cuda(0);
      if (host.cuda_devices == 0 && !multi_host) {
        device_ok = false;
        problem(absl::StrFormat("--device=cuda: no GPU visible (%s); use --device=cpu or auto",
                                host.why_no_cuda.empty() ? "none found" : host.why_no_cuda));
      } else {
        check_count();
      }
    } else if (o.job.device == "auto") {
      if (host.cuda_devices > 0) {
        device = Device::Cuda(0);
        check_count();
      } else {
        device = Device::Cpu();
        if (gpus_ok) {
          // With other hosts this one cannot see their GPUs: say how to ask for them.
          plan.notices.push_back(absl::StrFormat(
              "no GPU visible (%s): running %d CPU worker%s%s",
              host.why_no_cuda.empty() ? "none found" : host.why_no_cuda, o.job.workers,
              o.job.workers == 1 ? "" : "s",
              multi_host ? " (this host decides for every host: --device=cuda if theirs have GPUs)"
                         : ""));
        }
      }
    } else {
      device_ok = false;
      problem(absl::StrFormat("--device=%s: use auto, cuda or cpu", o.job.device));
    }
  }

  // The job as workers will see it: as given, with the device resolved and paths absolute
  // (workers may run in other directories); the run directory is set by CheckRunDirectory().
  void SetWorkersJob() {
    job = o.job;
    job.device = device.is_cuda() ? "cuda" : "cpu";
    job.run_dir.clear();
    job.data = o.job.synthetic ? "" : AbsolutePath(host.user_dir, o.job.data);
    job.ResolveVocab();
    if (!o.job.val_data.empty()) job.val_data = AbsolutePath(host.user_dir, o.job.val_data);
    job.ResolveEvalEvery();
    auto_resume = o.job.resume == "auto";
    job.resume = o.job.resume.empty() || auto_resume
                     ? ""
                     : CheckpointPrefix(AbsolutePath(host.user_dir, o.job.resume));
    job.init_from = o.job.init_from.empty() ? "" : AbsolutePath(host.user_dir, o.job.init_from);
  }

  // The model, and the flags it does not use.
  void CheckModel() {
    model = job.Model();
    if (!model.ok()) problem(std::string(model.status().message()));
    if (model.ok() && model->kind == ModelKind::kMlp) {
      if (o.job.n_head != 0) {
        plan.notices.push_back(
            absl::StrFormat("--n-head=%d applies to GPT models only: ignored for --model=%s",
                            o.job.n_head, o.job.model));
      }
      if (o.job.attention != defaults.attention) {
        plan.notices.push_back(
            absl::StrFormat("--attention=%s applies to GPT models only: ignored for --model=%s",
                            o.job.attention, o.job.model));
      }
    }
    if (o.job.synthetic && !o.job.data.empty()) {
      plan.notices.push_back(
          absl::StrFormat("--data=%s is ignored with --synthetic (random tokens)", o.job.data));
    }
  }

  // The dtype, against the resolved device.
  void CheckDtype() {
    absl::StatusOr<DType> dtype = ParseDType(o.job.dtype);
    if (!dtype.ok()) {
      problem(absl::StrFormat("--dtype=%s: use f32, bf16 or f16", o.job.dtype));
    } else if (device_ok) {
      TrainConfig t;  // a valid default config but for the dtype and device
      t.dtype = *dtype;
      t.device = device;
      absl::Status s = t.Validate();
      dtype_ok = s.ok();
      if (!s.ok()) problem(std::string(s.message()));
    }
  }

  // Plain numbers and the optimizer's settings.
  void CheckNumbers() {
    auto count_problem = [&](const std::string& p) {
      counts_ok = false;
      problem(p);
    };
    if (o.job.steps < 1) count_problem(absl::StrFormat("--steps=%d: need at least 1", o.job.steps));
    if (o.job.batch < 1) count_problem(absl::StrFormat("--batch=%d: need at least 1", o.job.batch));
    if (o.job.micro_batches < 0) {
      count_problem(absl::StrFormat(
          "--micro-batches=%d: must be 0 (the strategy's default) or more", o.job.micro_batches));
    }
    if (o.job.checkpoint_every < 0) {
      problem(absl::StrFormat("--checkpoint-every=%d: must be 0 (no checkpoints) or more",
                              o.job.checkpoint_every));
    }
    if (o.job.log_every < 1) {
      problem(absl::StrFormat("--log-every=%d: must be 1 (every step) or more", o.job.log_every));
    }
    if (!(o.job.bucket_mb > 0) || !std::isfinite(o.job.bucket_mb) || o.job.bucket_mb > 65536) {
      problem(absl::StrFormat("--bucket-mb=%g: must be a positive number of MB (at most 65536)",
                              o.job.bucket_mb));
    }
    if (!(o.job.heartbeat_timeout_s >= 2) || !std::isfinite(o.job.heartbeat_timeout_s) ||
        o.job.heartbeat_timeout_s > 86400) {
      problem(absl::StrFormat(
          "--heartbeat-timeout=%g: must be between 2 and 86400 seconds (workers report every "
          "second)",
          o.job.heartbeat_timeout_s));
    }
    OptimizerConfig opt;
    opt.kind = o.job.optimizer;
    opt.lr = static_cast<float>(o.job.lr);
    opt.warmup_steps = o.job.warmup;
    opt.weight_decay = static_cast<float>(o.job.weight_decay);
    opt.clip_norm = static_cast<float>(o.job.clip_norm);
    const absl::Status opt_status = opt.Validate();
    optimizer_ok = opt_status.ok();
    if (!optimizer_ok) problem(std::string(opt_status.message()));
    if (optimizer_ok && o.job.warmup != defaults.warmup && o.job.steps >= 1 &&
        o.job.warmup > o.job.steps) {
      plan.notices.push_back(absl::StrFormat(
          "--warmup=%d is longer than --steps=%d: the learning rate stays below --lr=%g",
          o.job.warmup, o.job.steps, o.job.lr));
    }
  }

  // The strategy's fit to the model and world size (batch divisibility, stages against blocks,
  // the schedule; --balance=time measured here) and the memory it needs on this host.
  void CheckFit() {
    if (strategy_ok && gpus_ok && model.ok() && counts_ok) {
      JobConfig fit = job;
      // Problems with the dtype and the optimizer's settings are reported above; the memory
      // checks and --balance=time need the run's own dtype and optimizer where they are valid.
      if (!dtype_ok) fit.dtype = "f32";
      if (!optimizer_ok) fit.optimizer = "adamw";
      fit.lr = 1e-3;
      fit.warmup = 0;
      fit.weight_decay = 0;
      fit.data_format = "auto";  // the data is checked by CheckData
      fit.clip_norm = 1;
      fit.bucket_mb = 25;
      fit.val_data.clear();  // validation is checked by CheckValidation and CheckData
      fit.val_fraction = 0;
      fit.eval_every = 0;
      fit.eval_batches = 1;
      absl::StatusOr<ParallelConfig> pc = fit.ToParallelConfig(device);
      absl::Status fit_status = pc.status();
      // --balance=time is measured here, once, and handed to every worker as explicit stage
      // sizes, so all ranks split the model the same way; the model must fit here first.
      if (fit_status.ok() && !multi_host && pc->balance == "time") {
        fit_status = CheckBlockTiming(*pc, host);
        if (!fit_status.ok()) fit_status = ExplainOutOfMemory(fit_status, '-');
      }
      const bool timed = pc.ok() && pc->balance == "time" && pc->strategy != StrategyKind::kData;
      absl::StatusOr<std::vector<double>> seconds = std::vector<double>();
      if (fit_status.ok() && timed) {
        seconds = host.time_blocks ? host.time_blocks(fit) : TimeBlocks(*pc);
        if (!seconds.ok()) fit_status = ExplainOutOfMemory(seconds.status(), '-');
      }
      LayoutInputs in;
      if (timed && seconds.ok()) in.block_seconds = &*seconds;
      const absl::StatusOr<JobLayout> layout =
          fit_status.ok() ? ResolveLayout(*pc, o.job.workers, in)
                          : absl::StatusOr<JobLayout>(fit_status);
      fit_status = layout.status();
      if (fit_status.ok() && o.explain) {
        ParallelConfig shown = *pc;  // the run's buckets, not the fit's stand-in
        if (job.bucket_mb > 0) shown.bucket_bytes = static_cast<int64_t>(job.bucket_mb * (1 << 20));
        plan.explanation = ExplainLayout(shown, *layout);
      }
      if (fit_status.ok() && timed) {
        // The workers get the sizes, so every rank splits the model the same way.
        pc->balance = job.balance = layout->StageSizes();
        std::vector<std::string> ms;
        for (double s : *seconds) ms.push_back(absl::StrFormat("%.3g", 1e3 * s));
        plan.notices.push_back(absl::StrFormat(
            "--balance=time: stages of %s blocks, from each block's forward and backward on %s "
            "(ms: %s)",
            job.balance, pc->train.device.ToString(), absl::StrJoin(ms, " ")));
      }
      if (!fit_status.ok()) problem(std::string(fit_status.message()));
      if (fit_status.ok() && !multi_host && dtype_ok) {
        const absl::StatusOr<std::string> fits =
            CheckLocalMemory(*pc, *layout, o.job.workers, host);
        if (!fits.ok()) {
          problem(std::string(ExplainOutOfMemory(fits.status(), '-').message()));
        } else if (!fits->empty()) {
          plan.notices.push_back(*fits);
        }
      }
    }
  }

  // The training data, and the validation data it or --val-data holds.
  void CheckData() {
    const absl::StatusOr<DataFormat> format = ParseDataFormat(o.job.data_format);
    if (!format.ok()) problem(std::string(format.status().message()));
    if (!model.ok() || !format.ok()) return;
    TrainConfig t;
    t.model = *model;
    t.batch = o.job.batch;
    t.seed = o.job.seed;
    t.data = job.data;
    t.data_format = *format;
    t.data_vocab = job.vocab;
    t.synthetic_data = o.job.synthetic;
    t.val_data = job.val_data;
    t.val_fraction = job.val_fraction;
    t.eval_batches = job.eval_batches;
    const absl::StatusOr<TokenDataset> d = LoadDataset(t);
    if (!d.ok()) {
      problem(absl::StrCat("--data: ", d.status().message()));
      return;
    }
    // The validation data opens and holds at least one batch.
    if (!validation_ok || !counts_ok) return;
    const absl::StatusOr<std::optional<ValidationSet>> v = LoadValidation(t, *d);
    if (!v.ok()) {
      // A file's own problem names the file; the count's names its flag.
      const bool named = absl::StartsWith(v.status().message(), "--");
      problem(absl::StrCat(named ? "" : "--val-data: ", v.status().message()));
    }
  }

  // The validation flags together (one problem at most: they depend on each other).
  void CheckValidation() {
    const absl::Status s = CheckValidationSettings(o.job.val_data, o.job.val_fraction,
                                                   job.eval_every, o.job.eval_batches);
    validation_ok = s.ok();
    if (!s.ok()) problem(std::string(s.message()));
  }

  // The run directory: a new one, or an existing one only to continue its run.
  void CheckRunDirectory() {
    if (!o.job.run_dir.empty()) {
      job.run_dir = AbsolutePath(host.user_dir, o.job.run_dir);
      bool exists, is_dir;
      const bool non_empty = IsNonEmptyDirectory(job.run_dir, &exists, &is_dir);
      if (exists && !is_dir) {
        problem(absl::StrFormat("--run-dir=%s exists and is not a directory", o.job.run_dir));
      } else if (non_empty && o.job.resume.empty()) {
        problem(absl::StrFormat(
            "--run-dir=%s exists and is not empty; choose another directory (or --resume)",
            o.job.run_dir));
      } else if (non_empty && !auto_resume && PathExists(DirOf(job.resume)) &&
                 !SameDirectory(DirOf(job.resume), job.run_dir + "/checkpoints")) {
        // Its run.json and metrics would mix that run's steps with this one's.
        problem(absl::StrFormat(
            "--run-dir=%s holds another run than the checkpoint's; resume into an empty "
            "directory, or continue that run with --resume=auto",
            o.job.run_dir));
      } else if (const std::string why = exists ? "" : WhyNotCreatable(job.run_dir); !why.empty()) {
        problem(absl::StrFormat("--run-dir=%s cannot be created: %s; choose another directory",
                                o.job.run_dir, why));
      }
    } else {
      job.run_dir = NewRunDir(host.user_dir, host.now, strategy_ok ? o.job.strategy : "run");
      if (const std::string why = WhyNotCreatable(job.run_dir); !why.empty()) {
        problem(absl::StrFormat("the run directory %s cannot be created: %s; pass --run-dir=DIR",
                                job.run_dir, why));
      }
    }
  }

  // The checkpoint to resume from: any strategy and number of workers wrote it (parameters are
  // found by name), but it must be of this model, optimizer and batch, and complete.
  void CheckResume() {
    auto check_checkpoint = [&](const std::string& prefix, const std::string& label,
                                bool verified) {
      absl::StatusOr<Manifest> m = ReadManifest(prefix);
      if (!m.ok()) {
        problem(absl::StrFormat("%s: %s", label, m.status().message()));
        return;
      }
      if (m->step >= o.job.steps && o.job.steps >= 1) {
        problem(absl::StrFormat(
            "%s: the checkpoint is at step %d and --steps=%d: nothing left to train; raise "
            "--steps",
            label, m->step, o.job.steps));
      } else if (m->batch != o.job.batch) {
        problem(absl::StrFormat("%s: the checkpoint was trained with --batch=%d, not %d", label,
                                m->batch, o.job.batch));
      } else if (model.ok() && m->model != model->ToString()) {
        problem(absl::StrFormat("%s: the checkpoint holds another model (%s), not %s", label,
                                m->model, model->ToString()));
      } else if (m->optimizer != o.job.optimizer) {
        problem(absl::StrFormat("%s: the checkpoint was trained with --optimizer=%s, not %s",
                                label, m->optimizer, o.job.optimizer));
      } else if (absl::Status v = verified ? absl::OkStatus() : VerifyCheckpoint(prefix, *m);
                 !v.ok()) {
        problem(absl::StrFormat("%s: %s", label, v.message()));
      }
    };
    if (auto_resume) {
      const std::string dir = job.run_dir + "/checkpoints";
      std::vector<std::string> passed_over;
      absl::StatusOr<std::string> latest = FindLatestCheckpoint(dir, &passed_over);
      for (const std::string& p : passed_over) {
        plan.notices.push_back(absl::StrCat("--resume=auto: passed over ", p));
      }
      if (latest.ok()) {
        job.resume = *latest;
        // FindLatestCheckpoint returns only a checkpoint whose shards pass VerifyCheckpoint.
        check_checkpoint(*latest, "--resume=auto", /*verified=*/true);
        plan.notices.push_back(absl::StrFormat("--resume=auto: resuming from %s (step %d)",
                                               *latest, CheckpointStep(*latest)));
      } else {
        plan.notices.push_back(absl::StrFormat(
            "--resume=auto: no complete checkpoint in %s; starting from step 0%s", dir,
            o.job.run_dir.empty() ? " (to continue a run, pass its --run-dir)" : ""));
      }
    } else if (!job.resume.empty()) {
      if (CheckpointStep(job.resume) < 0) {
        problem(absl::StrFormat(
            "--resume=%s: name a checkpoint step, <dir>/step-NNNNNN (or one of its files), or "
            "auto",
            o.job.resume));
      } else {
        check_checkpoint(job.resume, absl::StrCat("--resume=", o.job.resume), /*verified=*/false);
      }
    }
  }

  // --init-from: a safetensors file whose tensors fit the model (its header is read), never
  // with a --resume checkpoint, which holds the weights. With --resume=auto (a job script
  // that requeues) it is the start of a run that has no checkpoint yet.
  void CheckInitFrom() {
    if (o.job.init_from.empty()) return;
    const std::string label = absl::StrCat("--init-from=", o.job.init_from);
    if (auto_resume && !job.resume.empty()) {
      plan.notices.push_back(absl::StrFormat(
          "%s is not read: --resume=auto continues from %s", label, job.resume));
      job.init_from.clear();
    } else if (!o.job.resume.empty() && !auto_resume) {
      problem(absl::StrFormat("%s and --resume=%s: a resumed run has its weights; pass one of them",
                              label, o.job.resume));
    } else if (!PathExists(job.init_from)) {
      problem(absl::StrFormat("%s does not exist", label));
    } else if (model.ok()) {
      if (absl::Status s = CheckGpt2File(job.init_from, *model); !s.ok()) {
        problem(absl::StrCat("--init-from: ", s.message()));  // the message names the file
      }
    }
  }

  // Restarts, mpirun's arguments and the hostfile, whose slots must hold the workers.
  void CheckHosts() {
    if (o.max_restarts < 0 || o.max_restarts > 1000) {
      problem(absl::StrFormat("--max-restarts=%d: must be between 0 and 1000", o.max_restarts));
    }
    plan.max_restarts = o.max_restarts;
    for (absl::string_view w : absl::StrSplit(o.mpirun_args, absl::ByAnyChar(" \t"),
                                              absl::SkipEmpty())) {
      plan.mpirun_args.push_back(std::string(w));
    }
    // Hostfile: the slots must hold the workers.
    if (!o.hostfile.empty()) {
      plan.hostfile = AbsolutePath(host.user_dir, o.hostfile);
      std::ifstream in(plan.hostfile);
      if (!PathExists(plan.hostfile)) {
        problem(absl::StrFormat("--hostfile=%s does not exist", o.hostfile));
      } else if (!in) {
        problem(absl::StrFormat("--hostfile=%s cannot be read", o.hostfile));
      } else {
        const std::string text((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
        absl::StatusOr<std::vector<HostfileEntry>> hosts = ParseHostfile(text);
        if (!hosts.ok()) {
          problem(absl::StrFormat("--hostfile=%s: %s", o.hostfile, hosts.status().message()));
        } else {
          const int slots = TotalSlots(*hosts);
          if (gpus_ok && slots > 0 && o.job.workers > slots) {
            problem(absl::StrFormat(
                "--gpus=%d but --hostfile=%s offers %d slot%s; add hosts or slots, or use "
                "--gpus=%d",
                o.job.workers, o.hostfile, slots, slots == 1 ? "" : "s", slots));
          }
          std::set<std::string> looked_up;
          for (const HostfileEntry& e : *hosts) {
            if (!looked_up.insert(e.host).second) continue;
            // Said, not refused: ssh (which mpirun goes through) may know the name as an alias.
            if (absl::StatusOr<std::string> ip = ResolveIpv4(e.host); !ip.ok()) {
              plan.notices.push_back(
                  absl::StrFormat("--hostfile=%s: %s; mpirun reaches it only if ssh knows the name",
                                  o.hostfile, ip.status().message()));
            }
          }
          if (o.coordinator_address.empty()) {
            absl::StatusOr<std::string> h = DefaultCoordinatorHost(*hosts);
            if (!h.ok()) {
              problem(absl::StrFormat("--hostfile=%s: %s", o.hostfile, h.status().message()));
            } else {
              plan.coordinator_host = *h;
              plan.coordinator_listen = absl::StrCat(*h, ":0");
            }
          }
        }
      }
    }
  }

  // The coordinator's address, when given: it must be this host's, where the coordinator runs.
  void CheckCoordinatorAddress() {
    if (!o.coordinator_address.empty()) {
      std::string h;
      int port = 0;
      absl::Status split = SplitHostPort(o.coordinator_address, &h, &port);
      absl::StatusOr<std::string> ip = split.ok() ? ResolveIpv4(h) : split;
      if (!split.ok()) {
        problem(absl::StrFormat("--coordinator-address=%s", split.message()));
      } else if (!ip.ok()) {
        problem(absl::StrFormat("--coordinator-address=%s: %s", o.coordinator_address,
                                ip.status().message()));
      } else if (!IsLocalIpv4(*ip)) {
        problem(absl::StrFormat(
            "--coordinator-address=%s: %s is not an address of this host (the coordinator runs "
            "in the launcher)",
            o.coordinator_address, *ip));
      } else {
        plan.coordinator_host = h;
        plan.coordinator_listen = absl::StrCat(*ip, ":", port);
      }
    }
    plan.coordinator_remote = !absl::StartsWith(plan.coordinator_listen, "127.");
  }

  const Options& o;
  const HostInfo& host;
  const bool multi_host;
  const JobConfig defaults;
  LaunchPlan plan;
  JobConfig& job = plan.job;
  std::vector<std::string> problems;
  // What the checks found, for the later ones.
  absl::StatusOr<StrategyKind> strategy;
  bool strategy_ok = false;
  bool gpus_ok = false;
  Device device = Device::Cpu();
  bool device_ok = true;
  bool auto_resume = false;
  absl::StatusOr<ModelConfig> model;
  bool dtype_ok = false;  // and valid on the device
  bool counts_ok = true;
  bool optimizer_ok = false;
  bool validation_ok = false;
};

}  // namespace

absl::StatusOr<LaunchPlan> Validate(const Options& o, const HostInfo& host) {
  Validation v(o, host);
  v.CheckStrategy();
  v.CheckDevice();
  v.SetWorkersJob();
  v.CheckModel();
  v.CheckDtype();
  v.CheckNumbers();
  v.CheckFit();
  v.CheckValidation();
  v.CheckData();
  v.CheckRunDirectory();
  v.CheckResume();
  v.CheckInitFrom();
  v.CheckHosts();
  v.CheckCoordinatorAddress();
  if (!v.problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(v.problems, "\n"));
  return std::move(v.plan);
}

}  // namespace launcher
}  // namespace tandem
