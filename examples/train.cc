// Trains one model on one device and prints the loss of every step and the throughput:
//   bazel run //examples:train -- --model=gpt-tiny --steps=300
// It is the single-worker baseline that every parallel strategy is checked against.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "launcher/flags.h"
#include "launcher/paths.h"
#include "model/trainer.h"
#include "runtime/files.h"
#include "runtime/host_sync.h"
#include "runtime/profiler.h"

ABSL_FLAG(std::string, model, "gpt-tiny", "gpt-tiny, gpt2-small, gpt or mlp");
ABSL_FLAG(int, n_layer, 0, "layers (0: the preset's)");
ABSL_FLAG(int, d_model, 0, "channels / MLP width (0: the preset's)");
ABSL_FLAG(int, n_head, 0, "attention heads (0: the preset's)");
ABSL_FLAG(int, seq_len, 0, "tokens per sample (0: the preset's)");
ABSL_FLAG(std::string, attention, "standard",
          "GPT attention: standard (keeps the T x T probabilities) or flash (keeps each row's "
          "log-sum-exp and recomputes them in backward)");
ABSL_FLAG(int, steps, 300, "optimizer steps");
ABSL_FLAG(int, batch, 16, "samples per step");
ABSL_FLAG(int, micro_batches, 1, "gradient accumulation: micro-batches per step");
ABSL_FLAG(double, lr, 3e-3, "peak learning rate");
ABSL_FLAG(int, warmup, 20, "linear warmup steps");
ABSL_FLAG(std::string, optimizer, "adamw", "adamw or sgd");
ABSL_FLAG(double, weight_decay, 0.0, "decoupled weight decay (AdamW) / L2 (SGD)");
ABSL_FLAG(double, clip_norm, 1.0, "clip gradients to this global L2 norm; 0: off");
ABSL_FLAG(uint64_t, seed, 1234, "seed of initialization and data order");
ABSL_FLAG(std::string, data, "", "text file to train on (default: /usr/share/common-licenses)");
ABSL_FLAG(bool, synthetic, false, "random tokens instead of text (for benchmarks)");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, dtype, "f32", "compute dtype: f32 (bf16, f16 on CUDA)");
ABSL_FLAG(std::string, checkpoint_dir, "", "directory the checkpoints go to (made if missing)");
ABSL_FLAG(int, checkpoint_every, 0,
          "steps between checkpoints, and one at the end; a run from its start also keeps its "
          "initial weights, as step 0 (0: none)");
ABSL_FLAG(std::string, resume, "", "checkpoint file (.ckpt) to resume from");
ABSL_FLAG(int, profile_steps, 0,
          "profile the last N steps: each op's time on its device (events around it on the "
          "stream) and its achieved GFLOP/s and GB/s, in a table at the end (those steps are "
          "left out of the tokens/s)");

namespace tandem {
namespace {

absl::StatusOr<TrainConfig> ConfigFromFlags() {
  TrainConfig c;
  auto model = ModelPreset(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_n_layer),
                           absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_n_head),
                           absl::GetFlag(FLAGS_seq_len), absl::GetFlag(FLAGS_attention));
  if (!model.ok()) return model.status();
  c.model = *model;
  c.steps = absl::GetFlag(FLAGS_steps);
  c.batch = absl::GetFlag(FLAGS_batch);
  c.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  c.optimizer.kind = absl::GetFlag(FLAGS_optimizer);
  c.optimizer.lr = static_cast<float>(absl::GetFlag(FLAGS_lr));
  c.optimizer.warmup_steps = absl::GetFlag(FLAGS_warmup);
  c.optimizer.total_steps = c.steps;
  c.optimizer.weight_decay = static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  c.optimizer.clip_norm = static_cast<float>(absl::GetFlag(FLAGS_clip_norm));
  c.seed = absl::GetFlag(FLAGS_seed);
  // Relative paths are the user's: under `bazel run` this process runs in its runfiles.
  auto users = [bwd = launcher::BuildWorkingDirectory()](const std::string& path) {
    return bwd.empty() ? path : launcher::AbsolutePath(bwd, path);
  };
  c.data = users(absl::GetFlag(FLAGS_data));
  c.synthetic_data = absl::GetFlag(FLAGS_synthetic);
  auto device = ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return device.status();
  c.device = *device;
  auto dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  c.dtype = *dtype;
  c.checkpoint_dir = users(absl::GetFlag(FLAGS_checkpoint_dir));
  c.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  c.resume = users(absl::GetFlag(FLAGS_resume));
  if (c.device.is_cuda()) {
    std::string why;
    if (CudaDeviceCount(&why) <= c.device.index()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--device=%s: no such CUDA device (%s); use --device=cpu", c.device.ToString(), why));
    }
  }
  return c;
}

int Main() {
  auto config = ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "train: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  const TrainConfig& c = *config;
  if (absl::Status v = c.Validate(); !v.ok()) {
    std::fprintf(stderr, "train: %s\n", std::string(v.message()).c_str());
    return 2;
  }
  if (c.checkpoint_every > 0) {
    if (absl::Status made = MakeDirs(c.checkpoint_dir); !made.ok()) {
      std::fprintf(stderr, "train: --checkpoint-dir=%s: %s\n", c.checkpoint_dir.c_str(),
                   std::string(made.message()).c_str());
      return 2;
    }
  }
  auto trainer = Trainer::Create(c);
  if (!trainer.ok()) {
    const absl::Status e = ExplainOutOfMemory(trainer.status(), '-');
    std::fprintf(stderr, "train: %s\n", std::string(e.message()).c_str());
    return 2;
  }
  if ((*trainer)->step() >= c.steps) {
    std::fprintf(stderr,
                 "train: --resume=%s: the checkpoint is at step %d and --steps=%d: nothing left "
                 "to train; raise --steps\n",
                 c.resume.c_str(), (*trainer)->step(), c.steps);
    return 2;
  }
  std::printf("model  %s\ndata   %s (%lld tokens, %lld samples)\ndevice %s, batch %d x %d tokens\n",
              c.model.ToString().c_str(), (*trainer)->data().source().c_str(),
              static_cast<long long>((*trainer)->data().num_tokens()),
              static_cast<long long>((*trainer)->data().num_samples()),
              c.device.ToString().c_str(), c.batch, c.model.seq_len);
  std::printf("memory %s\n", DescribeMemory((*trainer)->memory()).c_str());
  std::fflush(stdout);  // before any error on stderr, in a log that takes both
  const int profile_steps = std::max(0, std::min(absl::GetFlag(FLAGS_profile_steps), c.steps));
  const int first_profiled = c.steps - profile_steps;
  if (first_profiled == 0 && profile_steps > 0) Profiler::Enable(true);
  std::vector<double> step_seconds;  // after the first two, which warm caches and the allocator
  std::vector<int64_t> step_syncs;   // host synchronizations from one report to the next
  int64_t syncs_before = HostSync::Count();
  absl::Status s = (*trainer)->Run([&](const StepReport& r) {
    const double tok_s = c.batch * c.model.seq_len / r.seconds;
    if (r.step >= 2 && r.step < first_profiled) {
      step_seconds.push_back(r.seconds);
      step_syncs.push_back(HostSync::Count() - syncs_before);
    }
    if (r.step + 1 == first_profiled) Profiler::Enable(true);
    std::printf("step %4d/%d  loss %.4f  lr %.2e  norm %.3f  %7.0f tok/s%s\n", r.step + 1,
                c.steps, r.loss, r.lr, r.grad_norm, tok_s, r.skipped ? "  (skipped)" : "");
    std::fflush(stdout);
    syncs_before = HostSync::Count();
  });
  if (!s.ok()) {
    s = ExplainOutOfMemory(s, '-');
    std::fprintf(stderr, "train: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (!step_seconds.empty()) {
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
    if (c.device.is_cuda()) {
      // MFU against the bf16 dense peak of an H100/H200 (docs/DESIGN.md, "Measured, always").
      std::printf("MFU %.1f%% (6 x %lld matmul parameters x tokens/s over 989 TFLOP/s)\n",
                  100.0 * 6 * c.model.num_matmul_params() * tokens_per_second / 989e12,
                  static_cast<long long>(c.model.num_matmul_params()));
    }
  }
  if (profile_steps > 0) {
    Profiler::Enable(false);
    std::printf("op table, last %d steps:\n%s", profile_steps,
                Profiler::FormatOpTable(Profiler::OpTable()).c_str());
  }
  auto allocator = GetAllocator(c.device);
  if (allocator.ok()) std::printf("allocator %s\n", (*allocator)->stats().ToString().c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const tandem::launcher::FlagSet flags{"examples/train.cc",
                                        {"model",        "n_layer",        "d_model",
                                         "n_head",       "seq_len",        "attention",
                                         "steps",        "batch",          "micro_batches",
                                         "lr",           "warmup",         "optimizer",
                                         "weight_decay", "clip_norm",      "seed",
                                         "data",         "synthetic",      "device",
                                         "dtype",        "checkpoint_dir", "checkpoint_every",
                                         "resume",       "profile_steps"}};
  bool help = false;
  const absl::Status parsed =
      tandem::launcher::ParseFlags(flags, std::vector<std::string>(argv + 1, argv + argc), &help);
  if (help) {
    std::fputs(tandem::launcher::HelpText(
                   flags,
                   "Usage: bazel run //examples:train -- [flags]\n"
                   "Trains one model on one device, without the launcher, and prints the loss\n"
                   "of every step and the throughput.\n"
                   "  e.g. bazel run //examples:train -- --model=gpt-tiny --steps=300\n")
                   .c_str(),
               stdout);
    return 0;
  }
  if (!parsed.ok()) {
    for (absl::string_view line : absl::StrSplit(parsed.message(), '\n')) {
      std::fprintf(stderr, "train: %s\n", std::string(line).c_str());
    }
    return 2;
  }
  return tandem::Main();
}
