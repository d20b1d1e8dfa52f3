// A job's configuration as the launcher hands it to every worker (through the coordinator's
// Register answer): one plain struct with a text form of "key=value" lines, so what a
// worker runs is exactly what the launcher validated.
#ifndef TANDEM_PARALLEL_JOB_H_
#define TANDEM_PARALLEL_JOB_H_

#include <string>

#include "absl/status/statusor.h"
#include "parallel/distributed.h"
#include "parallel/grid.h"

namespace tandem {

// The exit code of a worker (and of the launcher) that stopped early on SIGTERM or the
// launcher's request, after every rank checkpointed at the same step: EX_TEMPFAIL of
// <sysexits.h>, "try again later". A job script requeues on it (examples/slurm/train.sbatch)
// and the next run continues with --resume=auto.
inline constexpr int kPreemptedExitCode = 75;

// The job description workers started by srun read (launcher --prepare writes it into the
// run directory): JobConfig::ToText().
inline constexpr char kJobConfigFile[] = "job.conf";

// --eval-every when not given: JobConfig::ResolveEvalEvery decides.
inline constexpr int kDefaultEvalEvery = -1;

struct JobConfig {
  std::string strategy = "data";
  int workers = 1;
  std::string device = "cpu";  // resolved: cpu or cuda
  std::string model = "gpt-tiny";
  int n_layer = 0, d_model = 0, n_head = 0, seq_len = 0;  // 0: the preset's
  std::string attention = "standard";
  bool tie_embeddings = false;  // the head uses the token table (gpt2-small: always)
  std::string dtype = "f32";
  int steps = 100;
  int batch = 16;
  int micro_batches = 0;  // 0: the strategy's default
  std::string schedule = "gpipe";
  int virtual_stages = 1;  // interleaved: model chunks per pipeline stage
  std::string balance = "params";
  int data_parallel = 1;  // pipeline and model: replicas D of a workers / D stage pipeline
  int zero = 0;           // 1: ZeRO-1, the optimizer state sharded over the replicas
  int tensor_parallel = 1;  // T: ranks each stage's blocks are split over (Megatron's TP)
  bool sequence_parallel = false;  // T >= 2: the rows between TP regions split over them
  double lr = 3e-3;
  int warmup = 20;
  std::string optimizer = "adamw";
  double weight_decay = 0.0;
  bool decay_all = false;  // decay every parameter, not only the 2-D weights and wte
  double clip_norm = 1.0;
  uint64_t seed = 1234;
  std::string data;                  // a file or glob; empty: the default corpus
  std::string data_format = "auto";  // auto, text, llmc, uint16 or uint32 (model/data.h)
  int vocab = 0;  // the data's vocabulary (0: an llm.c shard's kind, else the model's)
  bool synthetic = false;
  // Validation (TrainConfig's): a file or glob in data_format, or the held-out share of the
  // training samples; evaluated after every eval_every steps and the last (0: never).
  std::string val_data;
  double val_fraction = 0;
  int eval_every = 0;
  int eval_batches = 4;
  std::string run_dir;
  int checkpoint_every = 0;
  std::string resume;
  std::string init_from;  // a safetensors file in GPT-2's layout the weights start from
  double bucket_mb = 25;
  bool overlap = true;
  bool recompute = false;
  double heartbeat_timeout_s = 60;
  bool profile = false;
  int log_every = 1;         // steps between the host's reads of the loss
  bool debug_syncs = false;  // print where unexpected host synchronizations come from

  std::string ToText() const;
  static absl::StatusOr<JobConfig> FromText(const std::string& text);
  // With vocab 0 and data given, the vocabulary its llm.c shards record (their kind's); left
  // 0 where the data does not say or cannot be read (the data's own check reports that).
  void ResolveVocab();
  // eval_every left at kDefaultEvalEvery: every 100 steps (nanoGPT's eval_interval) with
  // validation data, else none.
  void ResolveEvalEvery() {
    if (eval_every == kDefaultEvalEvery) {
      eval_every = val_data.empty() && val_fraction == 0 ? 0 : 100;
    }
  }
  // The model this job trains (preset plus overrides; a vocab padded by PaddedVocab),
  // validated.
  absl::StatusOr<ModelConfig> Model() const;
  // The process grid (parallel/grid.h): data parallel is workers / T replicas of one stage;
  // pipeline and model are data_parallel replicas of workers / (T x data_parallel) stages,
  // each stage over T = tensor_parallel ranks. A T x D that does not divide the workers gives
  // the grid of one replica (Validate refuses it).
  ProcessGrid Grid() const;
  // Micro-batches per replica after defaults: pipeline 4 x stages where each replica's share
  // of the batch allows (GPipe's rule for a small bubble), else the largest count up to that
  // dividing the share; else 1.
  int EffectiveMicroBatches() const;
  // Everything a worker needs, for the device it runs on.
  absl::StatusOr<ParallelConfig> ToParallelConfig(Device device) const;
  // The device of the worker with `local_rank` on `host`, where `visible_gpus` GPUs are
  // visible: one GPU per local rank; the one GPU where each task sees only its own (Slurm's
  // --gpus-per-task=1 or --gpu-bind set CUDA_VISIBLE_DEVICES per task). A local rank beyond
  // several visible GPUs is refused: two ranks on one GPU is NCCL's duplicate-GPU error.
  absl::StatusOr<Device> WorkerDevice(int local_rank, int visible_gpus,
                                      const std::string& host) const;
};

}  // namespace tandem

#endif  // TANDEM_PARALLEL_JOB_H_
