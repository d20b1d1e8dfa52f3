#include "model/trainer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/checkpoint.h"
#include "model/hf_gpt2.h"
#include "model/sharded_checkpoint.h"
#include "runtime/host_sync.h"
#include "runtime/ops.h"
#include "runtime/status.h"

namespace tandem {

absl::Status TrainConfig::Validate() const {
  RETURN_IF_ERROR(model.Validate());
  RETURN_IF_ERROR(optimizer.Validate());
  if (steps < 1) return absl::InvalidArgumentError(absl::StrFormat("--steps=%d: need at least 1", steps));
  if (batch < 1) return absl::InvalidArgumentError(absl::StrFormat("--batch=%d: need at least 1", batch));
  if (micro_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--micro-batches=%d: need at least 1", micro_batches));
  }
  if (batch % micro_batches != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--micro-batches=%d must divide --batch=%d", micro_batches, batch));
  }
  if (checkpoint_every < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--checkpoint-every=%d: must be 0 (no checkpoints) or more", checkpoint_every));
  }
  if (checkpoint_every > 0 && checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--checkpoint-every=%d needs --checkpoint-dir=DIR to write them to", checkpoint_every));
  }
  if (!init_from.empty() && !resume.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--init-from=%s and --resume=%s: a resumed run has its weights; pass one of them",
        init_from, resume));
  }
  if (device.is_cpu() && dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--dtype=%s on the CPU: the CPU computes in f32; use --dtype=f32 or a CUDA device",
        DTypeName(dtype)));
  }
  if (dtype == DType::kI32) {
    return absl::InvalidArgumentError("--dtype=i32: use f32, bf16 or f16");
  }
  return CheckValidationSettings(val_data, val_fraction, eval_every, eval_batches);
}

absl::Status CheckValidationSettings(const std::string& val_data, double val_fraction,
                                     int eval_every, int eval_batches) {
  if (!val_data.empty() && val_fraction != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--val-data=%s and --val-fraction=%g: give one (a validation file, or a fraction of "
        "the training data held out)",
        val_data, val_fraction));
  }
  if (!(val_fraction >= 0 && val_fraction < 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--val-fraction=%g: must be above 0 and below 1 (the share of the training samples "
        "held out)",
        val_fraction));
  }
  if (eval_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--eval-every=%d: must be 0 (no evaluation) or more", eval_every));
  }
  if (eval_every > 0 && val_data.empty() && val_fraction == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--eval-every=%d without validation data: add --val-data=FILE or --val-fraction=F",
        eval_every));
  }
  if (eval_batches < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--eval-batches=%d: need at least 1", eval_batches));
  }
  return absl::OkStatus();
}

int64_t TrainingSamples(const TrainConfig& c, const TokenDataset& train) {
  const int64_t n = train.num_samples();
  return n - static_cast<int64_t>(c.val_fraction * static_cast<double>(n));
}

absl::StatusOr<std::optional<ValidationSet>> LoadValidation(const TrainConfig& c,
                                                            const TokenDataset& train) {
  if (!c.has_validation()) return std::optional<ValidationSet>();
  ValidationSet v;
  std::string what;
  if (!c.val_data.empty()) {
    ASSIGN_OR_RETURN(v.data, TokenDataset::Open(c.val_data, c.data_format, c.model.seq_len,
                                                c.data_vocab > 0 ? c.data_vocab : c.model.vocab));
    v.num_samples = v.data.num_samples();
    v.order = DataOrder::InOrder(0, v.num_samples);
    what = absl::StrFormat("--val-data=%s holds", c.val_data);
  } else {
    v.data = train;
    const int64_t first = TrainingSamples(c, train);
    v.num_samples = train.num_samples() - first;
    v.order = DataOrder::InOrder(first, std::max<int64_t>(v.num_samples, 1));
    what = absl::StrFormat("--val-fraction=%g holds out", c.val_fraction);
  }
  if (v.num_samples < c.batch) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %d samples of %d tokens, fewer than one batch (--batch=%d): give more validation "
        "data%s",
        what, v.num_samples, c.model.seq_len + 1, c.batch,
        c.val_data.empty() ? " (a larger --val-fraction)" : ""));
  }
  v.batches = static_cast<int>(std::min<int64_t>(c.eval_batches, v.num_samples / c.batch));
  return std::optional<ValidationSet>(std::move(v));
}

absl::StatusOr<TokenDataset> LoadDataset(const TrainConfig& c) {
  if (c.synthetic_data) {
    return TokenDataset::Synthetic(int64_t{1} << 20, c.model.seq_len, c.model.vocab, c.seed);
  }
  if (c.data.empty()) return TokenDataset::Default(c.model.seq_len, c.model.vocab);
  return TokenDataset::Open(c.data, c.data_format, c.model.seq_len,
                            c.data_vocab > 0 ? c.data_vocab : c.model.vocab);
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& c) {
  RETURN_IF_ERROR(c.Validate());
  // The trainer's GPU is the calling thread's from here on, before any CUDA call that would
  // otherwise start a context on GPU 0 as well.
  RETURN_IF_ERROR(SetCurrentDevice(c.device));
  ASSIGN_OR_RETURN(TokenDataset data, LoadDataset(c));
  // Micro-batches run one after another: one's activations are held at a time.
  const MemoryNeed need = EstimateStageMemory(
      c.model, 0, c.model.num_blocks(), c.batch / c.micro_batches, /*in_flight=*/1,
      /*recompute=*/false, c.dtype, c.optimizer.kind, c.device);
  ASSIGN_OR_RETURN(MemoryCheck memory, CheckDeviceMemory(need, c.device, "a training step"));
  std::unique_ptr<Trainer> t(new Trainer(c, std::move(data)));
  t->memory_ = memory;
  ASSIGN_OR_RETURN(t->stage_,
                   Stage::Create(c.model, 0, c.model.num_blocks(), c.device, c.seed, c.dtype));
  if (!c.init_from.empty()) RETURN_IF_ERROR(InitFromSafetensors(c.init_from, *t->stage_));
  ASSIGN_OR_RETURN(t->optimizer_,
                   Optimizer::Create(c.optimizer, t->stage_->layout(), 0,
                                     t->stage_->layout().numel(), c.device));
  ASSIGN_OR_RETURN(t->input_, InputPrefetcher::Create(c.device));
  ASSIGN_OR_RETURN(t->val_, LoadValidation(c, t->data_));
  if (!c.resume.empty()) RETURN_IF_ERROR(t->LoadCheckpoint(c.resume));
  return t;
}

absl::StatusOr<StepReport> Trainer::Step() {
  const int64_t syncs_before = HostSync::Count();
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c_.device));
  ASSIGN_OR_RETURN(std::unique_ptr<Event> start, Event::Create(c_.device));
  RETURN_IF_ERROR(start->Record(*s));
  const int64_t T = c_.model.seq_len;
  const int64_t rows = c_.batch / c_.micro_batches;
  // [0]: the summed token losses, [1]: the sum of squared gradients, [2]: the gradients'
  // factor.
  ASSIGN_OR_RETURN(Tensor sums, Tensor::Empty({3}, DType::kF32, c_.device));
  RETURN_IF_ERROR(ZeroFill(sums, *s));
  ASSIGN_OR_RETURN(Tensor loss_sum, sums.View(0, {1}));
  ASSIGN_OR_RETURN(Tensor sumsq, sums.View(1, {1}));
  ASSIGN_OR_RETURN(Tensor scale, sums.View(2, {1}));
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty({1}, DType::kF32, c_.device));
  auto load = [&](int m) {
    return input_->Load(data_, order_, int64_t{step_} * c_.batch, m * rows, rows, T,
                        scaler_.scale() / static_cast<float>(c_.batch * T));
  };
  ASSIGN_OR_RETURN(MicroBatch next, load(0));
  for (int m = 0; m < c_.micro_batches; ++m) {
    MicroBatch mb = std::move(next);
    // The next micro-batch's copy runs while this one computes.
    if (m + 1 < c_.micro_batches) {
      ASSIGN_OR_RETURN(next, load(m + 1));
    }
    RETURN_IF_ERROR(InputPrefetcher::WaitFor(*s, mb));
    Tensor losses, dx;
    RETURN_IF_ERROR(stage_->Forward(*s, m, mb, Tensor(), &losses));
    RETURN_IF_ERROR(AccumulateLoss(*s, loss_sum, losses, scratch));
    RETURN_IF_ERROR(stage_->Backward(*s, m, mb, Tensor(), &dx));
  }
  RETURN_IF_ERROR(ops::SumSquaresAccumulate(*s, sumsq, stage_->grads().flat()));
  RETURN_IF_ERROR(
      IssueStepEnd(*s, c_, *stage_, optimizer_, scaler_.scale(), step_, sumsq, scale));
  ASSIGN_OR_RETURN(std::unique_ptr<Event> end, Event::Create(c_.device));
  RETURN_IF_ERROR(end->Record(*s));
  // One worker reads every step's loss (the one host synchronization of its step).
  std::vector<float> v;
  {
    ExpectedHostSync reading;
    ASSIGN_OR_RETURN(v, sums.ToFloatVector());
  }
  StepReport r = ReportStep(c_, scaler_, step_, v[0], v[1]);
  // The stream's time from where this step's work began to its end.
  ASSIGN_OR_RETURN(float ms, end->ElapsedMsSince(*start));
  r.seconds = ms * 1e-3;
  r.host_syncs = HostSync::Count() - syncs_before;
  ++step_;
  return r;
}

absl::StatusOr<float> Trainer::Evaluate() {
  if (!val_) return absl::FailedPreconditionError("no validation data to evaluate on");
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(c_.device));
  ASSIGN_OR_RETURN(Tensor loss_sum, Tensor::Empty({1}, DType::kF32, c_.device));
  ASSIGN_OR_RETURN(Tensor scratch, Tensor::Empty({1}, DType::kF32, c_.device));
  RETURN_IF_ERROR(ZeroFill(loss_sum, *s));
  const int64_t rows = c_.batch / c_.micro_batches;
  RETURN_IF_ERROR(ForEachValidationMicroBatch(
      c_, *val_, *input_, 0, c_.batch, rows, [&](const MicroBatch& mb) -> absl::Status {
        RETURN_IF_ERROR(InputPrefetcher::WaitFor(*s, mb));
        Tensor losses;
        RETURN_IF_ERROR(stage_->Evaluate(*s, mb, Tensor(), &losses));
        return AccumulateLoss(*s, loss_sum, losses, scratch);
      }));
  std::vector<float> v;
  {
    ExpectedHostSync reading;
    ASSIGN_OR_RETURN(v, loss_sum.ToFloatVector());
  }
  return ValidationLoss(c_, *val_, v[0]);
}

absl::Status ForEachValidationMicroBatch(const TrainConfig& c, const ValidationSet& val,
                                         InputPrefetcher& input, int64_t row_begin,
                                         int64_t share, int64_t rows,
                                         const std::function<absl::Status(const MicroBatch&)>& f) {
  const int64_t per_batch = share / rows;
  const int64_t count = val.batches * per_batch;
  auto load = [&](int64_t i) {
    return input.Load(val.data, val.order, (i / per_batch) * c.batch,
                      row_begin + (i % per_batch) * rows, rows, c.model.seq_len,
                      /*dloss_scale=*/0.0f);
  };
  if (count == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(MicroBatch next, load(0));
  for (int64_t i = 0; i < count; ++i) {
    MicroBatch mb = std::move(next);
    // The next micro-batch's copy runs while this one computes.
    if (i + 1 < count) {
      ASSIGN_OR_RETURN(next, load(i + 1));
    }
    RETURN_IF_ERROR(f(mb));
  }
  return absl::OkStatus();
}

float ValidationLoss(const TrainConfig& c, const ValidationSet& val, float loss_sum) {
  return loss_sum / static_cast<float>(int64_t{val.batches} * c.batch * c.model.seq_len);
}

absl::Status IssueStepEnd(Stream& s, const TrainConfig& c, Stage& stage, Optimizer& optimizer,
                          float loss_scale, int step, const Tensor& grad_sumsq,
                          const Tensor& scale) {
  RETURN_IF_ERROR(
      ops::GradScale(s, scale, grad_sumsq, 1.0f / loss_scale, c.optimizer.clip_norm));
  RETURN_IF_ERROR(optimizer.Step(s, stage.params().flat(), stage.grads().flat(), step,
                                 /*grad_scale=*/1.0f, stage.params_low(), scale));
  return stage.ZeroGrads(s);
}

StepReport ReportStep(const TrainConfig& c, LossScaler& scaler, int step, float loss_sum,
                      float grad_sumsq) {
  const float unscale = 1.0f / scaler.scale();
  const float norm_sq = grad_sumsq * unscale * unscale;
  StepReport r;
  r.step = step;
  r.loss = loss_sum / static_cast<float>(int64_t{c.batch} * c.model.seq_len);
  r.grad_norm = std::sqrt(norm_sq);
  r.lr = LearningRate(c.optimizer, step);
  // As GradScale decided on the device: an update with gradients that are not finite was
  // skipped.
  r.skipped = !scaler.Update(!std::isfinite(norm_sq));
  r.loss_scale = scaler.scale();
  return r;
}

absl::StatusOr<MicroBatch> MakeMicroBatch(const TokenDataset& data, const DataOrder& order,
                                          int64_t batch_start, int64_t row_begin, int64_t rows,
                                          int64_t seq_len, Device device, float dloss_scale) {
  std::vector<int32_t> tokens, targets;
  FillBatch(data, order, batch_start, row_begin, rows, &tokens, &targets);
  // Tokens then targets in one buffer. On a GPU it goes over in one copy queued on the
  // compute stream, the stream every op on the micro-batch runs on, and nothing waits for it
  // to finish: a copy from pageable host memory returns once the driver holds the bytes (it
  // may stage them first, which can wait for the stream), so the buffer may be reused at once.
  tokens.insert(tokens.end(), targets.begin(), targets.end());
  ASSIGN_OR_RETURN(Tensor both, Tensor::FromInts(tokens, {2, rows, seq_len}));
  if (device.is_cuda()) {
    ASSIGN_OR_RETURN(Tensor on_device, Tensor::Empty(both.shape(), DType::kI32, device));
    ASSIGN_OR_RETURN(Stream * s, Stream::Compute(device));
    RETURN_IF_ERROR(Copy(on_device, both, *s));
    both = on_device;
  }
  MicroBatch mb;
  ASSIGN_OR_RETURN(mb.tokens, both.View(0, {rows, seq_len}));
  ASSIGN_OR_RETURN(mb.targets, both.View(rows * seq_len, {rows, seq_len}));
  mb.dloss_scale = dloss_scale;
  return mb;
}

absl::Status AccumulateLoss(Stream& s, const Tensor& loss_sum, const Tensor& losses,
                            const Tensor& scratch) {
  RETURN_IF_ERROR(ops::Sum(s, scratch, losses));
  return ops::Axpy(s, loss_sum, 1.0f, scratch);
}

absl::Status CheckNotDiverged(const StepReport& r, DType dtype) {
  if (std::isfinite(r.loss)) return absl::OkStatus();
  if (dtype == DType::kF16 && r.skipped) {
    // The scaler halves its scale at each skipped step: below f16's smallest number, some 40
    // skips in a row from 65536, no gradient is left to recover with.
    if (r.loss_scale >= kMinLossScale) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrFormat(
        "step %d: the loss is %s and the loss scale fell to %g, every step skipped: %s "
        "(learning rate %g); lower --lr and start again, or resume from an earlier checkpoint",
        r.step + 1, std::isnan(r.loss) ? "nan" : "infinite", r.loss_scale, kTrainingDiverged,
        r.lr));
  }
  // The weights the last update (step r.step) made give this loss: a checkpoint of them too.
  return absl::FailedPreconditionError(absl::StrFormat(
      "step %d: the loss is %s: %s (learning rate %g); lower --lr and start again%s", r.step + 1,
      std::isnan(r.loss) ? "nan" : "infinite", kTrainingDiverged, r.lr,
      r.step > 0 ? absl::StrFormat(", or resume from a checkpoint older than step %d", r.step)
                 : ""));
}

absl::Status Trainer::Run(const std::function<void(const StepReport&)>& report) {
  const bool checkpoints = !c_.checkpoint_dir.empty() && c_.checkpoint_every > 0;
  auto checkpoint = [&] {
    return SaveCheckpoint(CheckpointPrefixFor(c_.checkpoint_dir, step_) + ".ckpt");
  };
  // A run from its start keeps the initial weights too, as step 0 (before the first step).
  if (checkpoints && step_ == 0 && c_.resume.empty()) RETURN_IF_ERROR(checkpoint());
  while (step_ < c_.steps) {
    ASSIGN_OR_RETURN(StepReport r, Step());
    if (c_.EvalDue(step_)) {
      ASSIGN_OR_RETURN(r.val_loss, Evaluate());
    }
    if (report) report(r);
    RETURN_IF_ERROR(CheckNotDiverged(r, c_.dtype));
    if (checkpoints && (step_ % c_.checkpoint_every == 0 || step_ == c_.steps)) {
      RETURN_IF_ERROR(checkpoint());
    }
  }
  return absl::OkStatus();
}

absl::Status Trainer::SaveCheckpoint(const std::string& path) {
  return SaveTrainingState(path, c_, *stage_, optimizer_, scaler_, step_);
}

absl::Status Trainer::LoadCheckpoint(const std::string& path) {
  return LoadTrainingState(path, c_, *stage_, &optimizer_, &scaler_, &step_);
}

absl::Status SaveTrainingState(const std::string& path, const TrainConfig& c, const Stage& stage,
                               const Optimizer& optimizer, const LossScaler& scaler, int step,
                               const std::map<std::string, std::string>& extra,
                               CheckpointFileInfo* info) {
  std::vector<Tensor> state = {optimizer.state0()};
  if (optimizer.state1().defined()) state.push_back(optimizer.state1());
  return SaveTrainingState(path, c, stage, state, scaler, step, extra, info);
}

absl::Status SaveTrainingState(const std::string& path, const TrainConfig& c, const Stage& stage,
                               const std::vector<Tensor>& optimizer_state,
                               const LossScaler& scaler, int step,
                               const std::map<std::string, std::string>& extra,
                               CheckpointFileInfo* info) {
  // A checkpoint holds the tied table once: the first stage's, not a last stage's copy
  // (the first elements of its buffers), which loads from it.
  return SaveTrainingState(path, c, stage.layout(), stage.begin(), stage.end(),
                           stage.embedding_copy_numel(), stage.params().flat(), optimizer_state,
                           scaler, step, extra, info);
}

absl::Status SaveTrainingState(const std::string& path, const TrainConfig& c,
                               const ParamLayout& layout, int begin, int end, int64_t skip,
                               const Tensor& params, const std::vector<Tensor>& optimizer_state,
                               const LossScaler& scaler, int step,
                               const std::map<std::string, std::string>& extra,
                               CheckpointFileInfo* info) {
  CheckpointData d;
  auto add = [&](const std::string& name, const Tensor& t) -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<float> v, t.ToFloatVector());
    v.erase(v.begin(), v.begin() + skip);
    d.arrays.emplace_back(name, std::move(v));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(add("params", params));
  for (size_t i = 0; i < optimizer_state.size(); ++i) {
    RETURN_IF_ERROR(add(absl::StrCat("optimizer.", i), optimizer_state[i]));
  }
  d.meta["model"] = c.model.ToString();
  d.meta["model_blocks"] = absl::StrCat(c.model.num_blocks());
  // The data's vocabulary where the model pads it: an export keeps only its rows.
  if (c.data_vocab > 0 && c.data_vocab < c.model.vocab) {
    d.meta["data_vocab"] = absl::StrCat(c.data_vocab);
  }
  d.meta["blocks"] = absl::StrCat(begin, "-", end);
  d.meta["layout"] = FormatShardLayout(layout, skip);
  d.meta["optimizer"] = c.optimizer.kind;
  d.meta["step"] = absl::StrCat(step);
  d.meta["seed"] = absl::StrCat(c.seed);
  d.meta["batch"] = absl::StrCat(c.batch);
  d.meta["data_position"] = absl::StrCat(int64_t{step} * c.batch);
  d.meta["loss_scale"] = absl::StrFormat("%.9g", scaler.scale());
  d.meta["loss_scale_good_steps"] = absl::StrCat(scaler.good_steps());
  for (const auto& [k, v] : extra) d.meta[k] = v;
  return WriteCheckpoint(path, d, info);
}

absl::Status LoadTrainingState(const std::string& path, const TrainConfig& c, Stage& stage,
                               Optimizer* optimizer, LossScaler* scaler, int* step) {
  ASSIGN_OR_RETURN(CheckpointData d, ReadCheckpoint(path));
  return LoadStateFromShards({{path, &d}}, path, c, stage, optimizer, scaler, step);
}

}  // namespace tandem
