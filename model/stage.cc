#include "model/stage.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "runtime/ops.h"
#include "runtime/status.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Stage>> Stage::Create(const ModelConfig& config, int begin,
                                                     int end, Device device, uint64_t seed,
                                                     DType compute) {
  RETURN_IF_ERROR(config.Validate());
  if (begin < 0 || end > config.num_blocks() || begin >= end) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stage blocks [%d, %d) are not a non-empty range of the model's %d blocks", begin,
        end, config.num_blocks()));
  }
  std::unique_ptr<Stage> st(new Stage(config, begin, end, device));
  std::vector<std::unique_ptr<Block>> all = BuildBlocks(config);
  std::vector<ParamSpec> specs = StageParams(all, begin, end, &st->block_params_);
  for (int b = begin; b < end; ++b) st->blocks_.push_back(std::move(all[b]));
  // A last stage without the embedding holds a copy of the tied table, first (StageParams).
  if (config.tie_embeddings && begin > 0 && end == config.num_blocks()) {
    st->embedding_copy_numel_ = specs.front().shape.numel();
  }
  st->layout_ = std::make_unique<ParamLayout>(std::move(specs));
  ASSIGN_OR_RETURN(st->params_, FlatBuffer::Create(*st->layout_, DType::kF32, device));
  ASSIGN_OR_RETURN(st->grads_, FlatBuffer::Create(*st->layout_, DType::kF32, device));
  RETURN_IF_ERROR(InitializeParams(*st->layout_, st->params_, seed));
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(device));
  st->compute_ = compute;
  if (compute != DType::kF32) {
    if (device.is_cpu()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s compute on the CPU: the CPU computes in f32", DTypeName(compute)));
    }
    ASSIGN_OR_RETURN(st->params_low_, FlatBuffer::Create(*st->layout_, compute, device));
    RETURN_IF_ERROR(st->ParamsChanged(*s));
  }
  RETURN_IF_ERROR(st->ZeroGrads(*s));
  RETURN_IF_ERROR(s->Synchronize());
  return st;
}

std::vector<Tensor> Stage::BlockParams(int b) const {
  std::vector<Tensor> p;
  for (size_t i : block_params_[b]) p.push_back(compute_param(i));
  return p;
}

std::vector<Tensor> Stage::BlockGrads(int b) const {
  std::vector<Tensor> g;
  for (size_t i : block_params_[b]) g.push_back(grads_.view(i));
  return g;
}

absl::Status Stage::RunForward(Stream& s, const MicroBatch& mb, const Tensor& x,
                               std::vector<Saved>* saved, Tensor* y) {
  saved->resize(blocks_.size());
  Tensor in = x;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    Tensor out;
    RETURN_IF_ERROR(blocks_[b]->Forward(s, BlockParams(b), mb, in, &out, &(*saved)[b]));
    in = out;
  }
  *y = in;
  return absl::OkStatus();
}

absl::Status Stage::Forward(Stream& s, int id, const MicroBatch& mb, const Tensor& x,
                            Tensor* y) {
  if (saved_.count(id)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("stage [%d, %d): forward of micro-batch %d twice without its backward",
                        begin_, end_, id));
  }
  std::vector<Saved>& saved = saved_[id];
  peak_in_flight_ = std::max(peak_in_flight_, in_flight());
  RETURN_IF_ERROR(RunForward(s, mb, x, &saved, y));
  if (recompute_) {
    for (Saved& b : saved) b.t.clear();
    inputs_[id] = x;
  }
  return absl::OkStatus();
}

absl::Status Stage::Evaluate(Stream& s, const MicroBatch& mb, const Tensor& x, Tensor* y) {
  Tensor in = x;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    Tensor out;
    RETURN_IF_ERROR(blocks_[b]->Forward(s, BlockParams(b), mb, in, &out, /*saved=*/nullptr));
    in = out;
  }
  *y = in;
  return absl::OkStatus();
}

absl::Status Stage::Backward(Stream& s, int id, const MicroBatch& mb, const Tensor& dy,
                             Tensor* dx, const std::function<absl::Status(int)>& block_done) {
  return RunBackward(s, id, mb, dy, dx, nullptr, block_done);
}

absl::Status Stage::BackwardInput(Stream& s, int id, const MicroBatch& mb, const Tensor& dy,
                                  Tensor* dx) {
  if (for_w_.count(id)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "stage [%d, %d): input gradient of micro-batch %d twice without its weight gradient",
        begin_, end_, id));
  }
  std::vector<Saved> for_w(blocks_.size());
  RETURN_IF_ERROR(RunBackward(s, id, mb, dy, dx, &for_w, nullptr));
  for_w_[id] = std::move(for_w);
  return absl::OkStatus();
}

absl::Status Stage::BackwardWeights(Stream& s, int id, const MicroBatch& mb,
                                    const std::function<absl::Status(int)>& block_done) {
  auto it = for_w_.find(id);
  if (it == for_w_.end()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "stage [%d, %d): weight gradient of micro-batch %d before its input gradient", begin_,
        end_, id));
  }
  for (int b = static_cast<int>(blocks_.size()) - 1; b >= 0; --b) {
    RETURN_IF_ERROR(
        blocks_[b]->BackwardWeights(s, BlockParams(b), BlockGrads(b), mb, it->second[b]));
    it->second[b].t.clear();
    if (block_done) RETURN_IF_ERROR(block_done(b));
  }
  for_w_.erase(it);
  return absl::OkStatus();
}

absl::Status Stage::RunBackward(Stream& s, int id, const MicroBatch& mb, const Tensor& dy,
                                Tensor* dx, std::vector<Saved>* for_w,
                                const std::function<absl::Status(int)>& block_done) {
  auto it = saved_.find(id);
  if (it == saved_.end()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "stage [%d, %d): backward of micro-batch %d before its forward", begin_, end_, id));
  }
  if (recompute_) {
    Tensor y;
    RETURN_IF_ERROR(RunForward(s, mb, inputs_[id], &it->second, &y));
    inputs_.erase(id);
  }
  Tensor d = dy;
  for (int b = static_cast<int>(blocks_.size()) - 1; b >= 0; --b) {
    Tensor dprev;
    if (for_w != nullptr) {
      RETURN_IF_ERROR(blocks_[b]->BackwardInput(s, BlockParams(b), mb, d, it->second[b], &dprev,
                                                &(*for_w)[b]));
    } else {
      RETURN_IF_ERROR(blocks_[b]->Backward(s, BlockParams(b), BlockGrads(b), mb, d,
                                           it->second[b], &dprev));
    }
    it->second[b].t.clear();  // free this block's activations as soon as possible
    if (block_done) RETURN_IF_ERROR(block_done(b));
    d = dprev;
  }
  saved_.erase(it);
  *dx = is_first() ? Tensor() : d;
  return absl::OkStatus();
}

std::vector<int> Stage::ParamBlocks() const {
  // Backward runs the blocks last to first: a parameter two blocks share (the tied table) is
  // complete after the lower one; a copy only once summed, after the whole backward.
  std::vector<int> owner(layout_->entries().size(), 0);
  for (int b = static_cast<int>(block_params_.size()) - 1; b >= 0; --b) {
    for (size_t i : block_params_[b]) owner[i] = b;
  }
  if (embedding_copy_numel_ > 0) owner[0] = 0;
  return owner;
}

absl::Status Stage::ZeroGrads(Stream& s) { return ZeroFill(grads_.flat(), s); }

absl::Status Stage::ParamsChanged(Stream& s) {
  if (compute_ == DType::kF32) return absl::OkStatus();
  return ops::Cast(s, params_low_.flat(), params_.flat());
}

}  // namespace tandem
