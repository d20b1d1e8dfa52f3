// Training on one device: the whole model as one stage, gradient accumulation over
// micro-batches, clipping, the optimizer and its schedule, loss scaling, checkpoints.
// This is the baseline every parallel strategy must match (docs/DESIGN.md, invariant 1).
#ifndef TANDEM_MODEL_TRAINER_H_
#define TANDEM_MODEL_TRAINER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/data.h"
#include "model/input.h"
#include "model/memory.h"
#include "model/optimizer.h"
#include "model/stage.h"

namespace tandem {

struct TrainConfig {
  ModelConfig model;
  OptimizerConfig optimizer;
  DType dtype = DType::kF32;     // compute dtype; the CPU computes in f32 only
  Device device = Device::Cpu();
  int steps = 100;
  int batch = 16;                // global batch, in samples
  int micro_batches = 1;         // gradient accumulation: batch / micro_batches per pass
  uint64_t seed = 1234;
  std::string data;              // a file or glob (model/data.h); empty: the default corpus
  DataFormat data_format = DataFormat::kAuto;
  int data_vocab = 0;            // tokens must be below it (0: the model's vocabulary)
  bool synthetic_data = false;
  std::string checkpoint_dir;    // where checkpoints go; empty: none
  int checkpoint_every = 0;      // steps between checkpoints (and step 0, and the last); 0: none
  std::string resume;            // a checkpoint file to start from
  // A safetensors file in Hugging Face's GPT-2 layout (model/hf_gpt2.h) the parameters start
  // from instead of the seed's; the optimizer starts fresh. Not with `resume`.
  std::string init_from;
  // Validation: a dataset of its own (val_data, a file or glob in data_format) or the last
  // val_fraction of the training samples, held out (never trained on). After every
  // eval_every-th step and the last, eval_batches global batches of it, the first ones in
  // order, go forward only; their mean token loss is the step's validation loss.
  std::string val_data;
  double val_fraction = 0;       // 0: none held out
  int eval_every = 0;            // 0: no evaluation
  int eval_batches = 4;
  absl::Status Validate() const;
  bool has_validation() const { return !val_data.empty() || val_fraction > 0; }
  // Whether a validation follows the step that brings the run to `steps_done` steps.
  bool EvalDue(int steps_done) const {
    return eval_every > 0 && has_validation() &&
           (steps_done % eval_every == 0 || steps_done == steps);
  }
};

// The validation settings' problems (both a file and a fraction, a fraction outside (0, 1),
// --eval-every without validation data, ...), the first one, in the flags' words.
absl::Status CheckValidationSettings(const std::string& val_data, double val_fraction,
                                     int eval_every, int eval_batches);

struct StepReport {
  int step = 0;          // 0-based
  float loss = 0;        // mean over the global batch's tokens
  // The validation loss after this step (mean over the evaluated tokens), where evaluated.
  std::optional<float> val_loss;
  float lr = 0;
  float grad_norm = 0;   // before clipping
  bool skipped = false;  // loss scaler found inf/nan
  float loss_scale = 1;  // the loss scaler's, after this step (1 unless f16)
  double seconds = 0;
  // Host synchronizations during Trainer::Step (the read of its loss). The distributed
  // trainer counts its own per step (StepTiming).
  int64_t host_syncs = 0;
};

// The words CheckNotDiverged's error holds, which the launcher looks for in a failure: a
// restart would diverge again (from the newest checkpoint, with the same settings), so it
// does not restart.
inline constexpr char kTrainingDiverged[] = "training diverged";
// f16's loss scale below which a run whose loss is not finite has diverged: 2^-24, f16's
// smallest (subnormal) number.
inline constexpr float kMinLossScale = 5.9604645e-8f;

// An error when a step's loss is nan or infinite: training diverged. A step whose gradients
// are not finite changes no weight, so every later step would be nan too; only f16's loss
// scaler may skip such steps and go on (as GradScaler does), its loss scale lowered, until
// the scale falls below kMinLossScale.
absl::Status CheckNotDiverged(const StepReport& r, DType dtype);

// The samples a run validates on, in order: val_data's from its first, or the training
// data's held-out tail.
struct ValidationSet {
  TokenDataset data;
  DataOrder order = DataOrder::InOrder(0, 1);
  int64_t num_samples = 0;
  int batches = 0;  // global batches evaluated: eval_batches, or as many as there are
};

// The training samples training draws from: all of `train`'s but the held-out tail
// (val_fraction of them, rounded down).
int64_t TrainingSamples(const TrainConfig& c, const TokenDataset& train);
// The validation set a config names, given its training data; none without validation. A
// set of fewer samples than one batch is an error saying what to change.
absl::StatusOr<std::optional<ValidationSet>> LoadValidation(const TrainConfig& c,
                                                            const TokenDataset& train);

class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& c);
  // Runs from the current step to c.steps, calling `report` after each step.
  absl::Status Run(const std::function<void(const StepReport&)>& report);
  // One step (all micro-batches, then the optimizer).
  absl::StatusOr<StepReport> Step();
  // The validation loss of the current weights (forward only; no gradient, no update): the
  // mean token loss of the validation set's first batches (ValidationSet). Requires
  // validation in the config.
  absl::StatusOr<float> Evaluate();
  int step() const { return step_; }
  const Stage& stage() const { return *stage_; }
  const TokenDataset& data() const { return data_; }
  // What a step was checked to need before anything was allocated.
  const MemoryCheck& memory() const { return memory_; }
  absl::Status SaveCheckpoint(const std::string& path);
  absl::Status LoadCheckpoint(const std::string& path);

 private:
  Trainer(const TrainConfig& c, TokenDataset d)
      : c_(c), data_(std::move(d)), order_(TrainingSamples(c, data_), c.seed),
        scaler_(c.dtype == DType::kF16) {}
  TrainConfig c_;
  TokenDataset data_;
  DataOrder order_;
  std::optional<ValidationSet> val_;
  std::unique_ptr<Stage> stage_;
  Optimizer optimizer_;
  LossScaler scaler_;
  MemoryCheck memory_;
  int step_ = 0;
  std::unique_ptr<InputPrefetcher> input_;
};

// The end of every step, for one worker or many, issued on `s` with no host
// synchronization: from the global sum of squared gradients this rank sees after any
// reduction (grad_sumsq, one f32 on the device), the gradients' factor (unscaling by
// `loss_scale` and clipping) is computed on the device into `scale` (one f32), the optimizer
// runs with it (skipping the update, on the device, when the gradients are not finite) and
// the gradients are zeroed.
absl::Status IssueStepEnd(Stream& s, const TrainConfig& c, Stage& stage, Optimizer& optimizer,
                          float loss_scale, int step, const Tensor& grad_sumsq,
                          const Tensor& scale);

// Step `step`'s report from the values read on the host once it ran: its summed token
// losses and global sum of squared gradients. Updates the loss scaler, which sees every step
// in order (the scale in effect during the step is the one it holds when called).
StepReport ReportStep(const TrainConfig& c, LossScaler& scaler, int step, float loss_sum,
                      float grad_sumsq);

// Rows [row_begin, row_begin + rows) of the global batch that starts at sample position
// `batch_start`, as one micro-batch of (rows, seq_len) tokens and targets on `device`, with
// the given gradient scale for each token's loss.
absl::StatusOr<MicroBatch> MakeMicroBatch(const TokenDataset& data, const DataOrder& order,
                                          int64_t batch_start, int64_t row_begin, int64_t rows,
                                          int64_t seq_len, Device device, float dloss_scale);

// Runs `f` on each micro-batch of a validation, in order: of each of val.batches global
// batches, rows [row_begin, row_begin + share) (a data-parallel replica's share), in
// micro-batches of `rows`, each loaded ahead of its use (with no gradient scale). Every rank
// of a job calls it with the same batches, so their shares add up to the whole.
absl::Status ForEachValidationMicroBatch(const TrainConfig& c, const ValidationSet& val,
                                         InputPrefetcher& input, int64_t row_begin,
                                         int64_t share, int64_t rows,
                                         const std::function<absl::Status(const MicroBatch&)>& f);
// The validation loss from the evaluated tokens' summed losses: their mean.
float ValidationLoss(const TrainConfig& c, const ValidationSet& val, float loss_sum);

// loss_sum (one f32) += the sum of `losses`, summed into `scratch` (one f32) first.
absl::Status AccumulateLoss(Stream& s, const Tensor& loss_sum, const Tensor& losses,
                            const Tensor& scratch);

// A stage's parameters, optimizer state, loss scale and step, in one checkpoint file (a
// shard, model/sharded_checkpoint.h): flat arrays with a "layout" entry naming each
// parameter's offset and size, so any stage holding the same parameters can load it.
// `extra` adds metadata entries; `info`, if given, receives the file's size and checksum.
absl::Status SaveTrainingState(const std::string& path, const TrainConfig& c, const Stage& stage,
                               const Optimizer& optimizer, const LossScaler& scaler, int step,
                               const std::map<std::string, std::string>& extra = {},
                               CheckpointFileInfo* info = nullptr);
// The same with the optimizer's state given as whole-stage tensors (its m and, for AdamW, v,
// each as many elements as the stage's parameters): ZeRO-1 gathers them from the shards.
absl::Status SaveTrainingState(const std::string& path, const TrainConfig& c, const Stage& stage,
                               const std::vector<Tensor>& optimizer_state,
                               const LossScaler& scaler, int step,
                               const std::map<std::string, std::string>& extra = {},
                               CheckpointFileInfo* info = nullptr);
// The same from flat arrays laid out by `layout` (the stage's, or under tensor parallelism the
// whole tensors' its ranks gathered): `params`, then the optimizer's state, for blocks
// [begin, end), the first `skip` elements a last stage's copy of the tied table (left out).
absl::Status SaveTrainingState(const std::string& path, const TrainConfig& c,
                               const ParamLayout& layout, int begin, int end, int64_t skip,
                               const Tensor& params, const std::vector<Tensor>& optimizer_state,
                               const LossScaler& scaler, int step,
                               const std::map<std::string, std::string>& extra,
                               CheckpointFileInfo* info);
// Loads what SaveTrainingState wrote, by parameter name, after checking it is of the same
// model, optimizer and batch and holds every parameter of the stage; on any error nothing
// is changed.
absl::Status LoadTrainingState(const std::string& path, const TrainConfig& c, Stage& stage,
                               Optimizer* optimizer, LossScaler* scaler, int* step);

// Reads the dataset a config names (file, synthetic, or the default corpus).
absl::StatusOr<TokenDataset> LoadDataset(const TrainConfig& c);

}  // namespace tandem

#endif  // TANDEM_MODEL_TRAINER_H_
