#include "model/stage.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/ops.h"
#include "runtime/status.h"

namespace tandem {

StageParamPlan PlanStageParams(const ModelConfig& config,
                               const std::vector<std::unique_ptr<Block>>& blocks,
                               const std::vector<std::pair<int, int>>& chunks) {
  StageParamPlan p;
  for (const auto& [begin, end] : chunks) {
    for (int b = begin; b < end; ++b) p.held.push_back(b);
  }
  p.specs = StageParams(blocks, p.held, &p.block_params);
  // A last stage without the embedding holds a copy of the tied table, first (StageParams).
  const bool first = p.held.front() == 0, last = p.held.back() == config.num_blocks() - 1;
  p.embedding_copy = config.tie_embeddings && !first && last;
  p.owners = ParamOwners(p.block_params, p.specs.size(), p.embedding_copy);
  return p;
}

absl::StatusOr<std::unique_ptr<Stage>> Stage::Create(const ModelConfig& config, int begin,
                                                     int end, Device device, uint64_t seed,
                                                     DType compute) {
  return Create(config, {{begin, end}}, device, seed, compute);
}

absl::StatusOr<std::unique_ptr<Stage>> Stage::Create(
    const ModelConfig& config, const std::vector<std::pair<int, int>>& chunks, Device device,
    uint64_t seed, DType compute, const TensorParallel& tp) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(CheckTensorParallel(config, tp.size));
  if (tp.enabled() && tp.group == nullptr) {
    return absl::InvalidArgumentError("a tensor-parallel stage needs its group's communicator");
  }
  int prev_end = 0;
  for (const auto& [begin, end] : chunks) {
    if (begin < prev_end || end > config.num_blocks() || begin >= end) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stage blocks [%d, %d) are not a non-empty range of the model's %d blocks after the "
          "stage's earlier chunks",
          begin, end, config.num_blocks()));
    }
    prev_end = end;
  }
  if (chunks.empty()) return absl::InvalidArgumentError("a stage needs at least one chunk");
  std::unique_ptr<Stage> st(new Stage(config, chunks, device));
  st->tp_ = tp;
  std::vector<std::unique_ptr<Block>> all = BuildBlocks(config, tp);
  StageParamPlan plan = PlanStageParams(config, all, chunks);
  for (const auto& [begin, end] : chunks) {
    st->chunk_start_.push_back(static_cast<int>(st->blocks_.size()));
    for (int b = begin; b < end; ++b) st->blocks_.push_back(std::move(all[b]));
  }
  st->chunk_start_.push_back(static_cast<int>(st->blocks_.size()));
  st->block_params_ = std::move(plan.block_params);
  if (plan.embedding_copy) st->embedding_copy_numel_ = plan.specs.front().shape.numel();
  st->layout_ = std::make_unique<ParamLayout>(std::move(plan.specs));
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

Shape Stage::BoundaryShape(int64_t rows) const {
  const int64_t T = config_.seq_len, C = config_.d_model;
  if (tp_.splits_rows()) return {tp_.RowsHeld(rows * T), 1, C};
  return {rows, T, C};
}

std::vector<Tensor> Stage::BlockParams(int b) const {
  std::vector<Tensor> p;
  for (size_t i : block_params_[b]) p.push_back(compute_param(i));
  return p;
}

absl::StatusOr<std::vector<Tensor>> Stage::BlockGrads(Stream& s, int b) {
  std::vector<Tensor> g;
  for (size_t i : block_params_[b]) {
    ASSIGN_OR_RETURN(Tensor t, Grad(i, s));
    g.push_back(std::move(t));
  }
  return g;
}

absl::StatusOr<Tensor> Stage::GradSegment(size_t k, Stream& s) {
  if (grad_segment_reduced_[k]) {
    const ElementRange& r = grads_.segment_range(k);
    return absl::FailedPreconditionError(absl::StrCat(
        Name(), ": gradients [", r.begin, ", ", r.end,
        ") asked for after their bucket was reduced this step; their bucket must be issued "
        "after the last backward that writes into it"));
  }
  return grads_.Materialize(k, s);
}

absl::StatusOr<Tensor> Stage::Grad(size_t i, Stream& s) {
  if (grads_.segmented() && !grads_.view(i).defined()) {
    RETURN_IF_ERROR(GradSegment(grads_.SegmentOf(i), s).status());
  }
  return grads_.view(i);
}

void Stage::ReleaseGradSegment(size_t k) {
  grads_.Release(k);
  grad_segment_reduced_[k] = true;
}

absl::Status Stage::SegmentGrads(std::vector<ElementRange> segments) {
  ASSIGN_OR_RETURN(grads_, FlatBuffer::CreateSegmented(*layout_, DType::kF32, device_,
                                                       std::move(segments)));
  grad_segment_reduced_.assign(grads_.num_segments(), false);
  // The whole buffer, given back, is not kept cached: that memory is what ZeRO-2 saves.
  ASSIGN_OR_RETURN(Allocator * a, GetAllocator(device_));
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(device_));
  RETURN_IF_ERROR(s->Synchronize());
  a->EmptyCache();
  return absl::OkStatus();
}

std::string Stage::Name(int chunk) const {
  std::string name = "stage";
  for (const auto& [begin, end] : chunks_) absl::StrAppend(&name, " [", begin, ", ", end, ")");
  if (chunk >= 0 && chunks_.size() > 1) absl::StrAppend(&name, " chunk ", chunk);
  return name;
}

absl::Status Stage::CheckChunk(int chunk) const {
  if (chunk >= 0 && chunk < num_chunks()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s has %d chunks, not a chunk %d", Name(), num_chunks(), chunk));
}

absl::Status Stage::RunForward(Stream& s, int chunk, const MicroBatch& mb, const Tensor& x,
                               std::vector<Saved>* saved, Tensor* y) {
  const int start = chunk_start_[chunk], stop = chunk_start_[chunk + 1];
  saved->resize(stop - start);
  Tensor in = x;
  for (int b = start; b < stop; ++b) {
    Tensor out;
    RETURN_IF_ERROR(blocks_[b]->Forward(s, BlockParams(b), mb, in, &out, &(*saved)[b - start]));
    in = out;
  }
  *y = in;
  return absl::OkStatus();
}

absl::Status Stage::Forward(Stream& s, int id, const MicroBatch& mb, const Tensor& x,
                            Tensor* y, int chunk) {
  RETURN_IF_ERROR(CheckChunk(chunk));
  const Key key{chunk, id};
  if (saved_.count(key)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: forward of micro-batch %d twice without its backward", Name(chunk), id));
  }
  std::vector<Saved>& saved = saved_[key];
  peak_in_flight_ = std::max(peak_in_flight_, in_flight());
  RETURN_IF_ERROR(RunForward(s, chunk, mb, x, &saved, y));
  if (recompute_) {
    for (Saved& b : saved) b.t.clear();
    inputs_[key] = x;
  }
  return absl::OkStatus();
}

absl::Status Stage::Evaluate(Stream& s, const MicroBatch& mb, const Tensor& x, Tensor* y,
                             int chunk) {
  RETURN_IF_ERROR(CheckChunk(chunk));
  Tensor in = x;
  for (int b = chunk_start_[chunk]; b < chunk_start_[chunk + 1]; ++b) {
    Tensor out;
    RETURN_IF_ERROR(blocks_[b]->Forward(s, BlockParams(b), mb, in, &out, /*saved=*/nullptr));
    in = out;
  }
  *y = in;
  return absl::OkStatus();
}

absl::Status Stage::Backward(Stream& s, int id, const MicroBatch& mb, const Tensor& dy,
                             Tensor* dx, const std::function<absl::Status(int)>& block_done,
                             int chunk) {
  return RunBackward(s, chunk, id, mb, dy, dx, nullptr, block_done);
}

absl::Status Stage::BackwardInput(Stream& s, int id, const MicroBatch& mb, const Tensor& dy,
                                  Tensor* dx, int chunk) {
  RETURN_IF_ERROR(CheckChunk(chunk));
  const Key key{chunk, id};
  if (for_w_.count(key)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: input gradient of micro-batch %d twice without its weight gradient", Name(chunk),
        id));
  }
  std::vector<Saved> for_w(chunk_start_[chunk + 1] - chunk_start_[chunk]);
  RETURN_IF_ERROR(RunBackward(s, chunk, id, mb, dy, dx, &for_w, nullptr));
  for_w_[key] = std::move(for_w);
  return absl::OkStatus();
}

absl::Status Stage::BackwardWeights(Stream& s, int id, const MicroBatch& mb,
                                    const std::function<absl::Status(int)>& block_done,
                                    int chunk) {
  RETURN_IF_ERROR(CheckChunk(chunk));
  auto it = for_w_.find(Key{chunk, id});
  if (it == for_w_.end()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: weight gradient of micro-batch %d before its input gradient", Name(chunk), id));
  }
  const int start = chunk_start_[chunk];
  for (int b = chunk_start_[chunk + 1] - 1; b >= start; --b) {
    ASSIGN_OR_RETURN(std::vector<Tensor> grads, BlockGrads(s, b));
    RETURN_IF_ERROR(
        blocks_[b]->BackwardWeights(s, BlockParams(b), grads, mb, it->second[b - start]));
    it->second[b - start].t.clear();
    if (block_done) RETURN_IF_ERROR(block_done(b));
  }
  for_w_.erase(it);
  return absl::OkStatus();
}

absl::Status Stage::RunBackward(Stream& s, int chunk, int id, const MicroBatch& mb,
                                const Tensor& dy, Tensor* dx, std::vector<Saved>* for_w,
                                const std::function<absl::Status(int)>& block_done) {
  RETURN_IF_ERROR(CheckChunk(chunk));
  const Key key{chunk, id};
  auto it = saved_.find(key);
  if (it == saved_.end()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: backward of micro-batch %d before its forward", Name(chunk), id));
  }
  if (recompute_) {
    Tensor y;
    RETURN_IF_ERROR(RunForward(s, chunk, mb, inputs_[key], &it->second, &y));
    inputs_.erase(key);
  }
  Tensor d = dy;
  const int start = chunk_start_[chunk];
  for (int b = chunk_start_[chunk + 1] - 1; b >= start; --b) {
    Tensor dprev;
    Saved& saved = it->second[b - start];
    ASSIGN_OR_RETURN(std::vector<Tensor> grads, BlockGrads(s, b));
    if (for_w != nullptr) {
      RETURN_IF_ERROR(blocks_[b]->BackwardInput(s, BlockParams(b), grads, mb, d, saved, &dprev,
                                                &(*for_w)[b - start]));
    } else {
      RETURN_IF_ERROR(blocks_[b]->Backward(s, BlockParams(b), grads, mb, d, saved, &dprev));
    }
    saved.t.clear();  // free this block's activations as soon as possible
    if (block_done) RETURN_IF_ERROR(block_done(b));
    d = dprev;
  }
  saved_.erase(it);
  *dx = chunk_is_first(chunk) ? Tensor() : d;
  return absl::OkStatus();
}

std::vector<int> Stage::ParamBlocks() const {
  return ParamOwners(block_params_, layout_->entries().size(), embedding_copy_numel_ > 0);
}

absl::Status Stage::ZeroGrads(Stream& s) {
  if (!grads_.segmented()) return ZeroFill(grads_.flat(), s);
  for (size_t k = 0; k < grads_.num_segments(); ++k) grads_.Release(k);
  grad_segment_reduced_.assign(grads_.num_segments(), false);
  return absl::OkStatus();
}

absl::Status Stage::ParamsChanged(Stream& s) {
  if (compute_ == DType::kF32) return absl::OkStatus();
  return ops::Cast(s, params_low_.flat(), params_.flat());
}

}  // namespace tandem
