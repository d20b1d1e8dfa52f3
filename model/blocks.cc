// The GPT (GPT-2 style, pre-LayerNorm) and MLP blocks.
// Legend: B = micro-batch, T = sequence, C = channels (d_model), V = vocabulary,
// NH = heads, N = B * T rows.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/block.h"
#include "runtime/ops.h"
#include "runtime/status.h"

namespace tandem {
namespace {

// An activation with t's dtype (the compute dtype) and device.
absl::StatusOr<Tensor> Like(const Tensor& t, const Shape& shape) {
  return Tensor::Empty(shape, t.dtype(), t.device());
}

// Statistics, attention probabilities and losses: always f32.
absl::StatusOr<Tensor> F32(const Tensor& t, const Shape& shape) {
  return Tensor::Empty(shape, DType::kF32, t.device());
}

int64_t ElemBytes(DType d) { return static_cast<int64_t>(DTypeSize(d)); }

// A parameter split along `dim` over the tensor-parallel group (its local `shape`), with
// `groups` blocks along it split alike (the fused q, k and v).
ParamSpec Split(ParamSpec p, const TensorParallel& tp, int dim, int groups = 1) {
  if (!tp.enabled()) return p;
  p.shard = {dim, tp.size, tp.rank, groups};
  return p;
}

// The token table: the embedding's, and with tied embeddings the head's weight too; under
// tensor parallelism each rank's slice of its rows (vocabulary-parallel).
ParamSpec TokenTable(const ModelConfig& c, const TensorParallel& tp) {
  return Split({"embed.wte", {c.vocab / tp.size, c.d_model}, Init::kNormal, 0.02f}, tp, 0);
}

// The first token of this rank's slice of the (padded) vocabulary, and how many of the
// slice's tokens are real (the rest padding past the data's vocabulary).
int64_t VocabBegin(const ModelConfig& c, const TensorParallel& tp) {
  return c.vocab / tp.size * tp.rank;
}
int64_t RealColumns(const ModelConfig& c, const TensorParallel& tp) {
  const int64_t real = c.data_vocab > 0 ? c.data_vocab : c.vocab;
  return std::clamp<int64_t>(real - VocabBegin(c, tp), 0, c.vocab / tp.size);
}

// The tensor-parallel group's sum of t (in place), ordered on s; nothing without a group.
absl::Status GroupSum(Stream& s, const TensorParallel& tp, const Tensor& t, const char* what) {
  if (!tp.enabled()) return absl::OkStatus();
  return tp.group->AllReduceSum(s, t, what);
}

// Sequence parallelism (Megatron's): between the tensor-parallel regions each rank holds the
// rows [r N/T, (r+1) N/T) of the residual stream's N = B x seq rows, and the LayerNorms run on
// them alone.
bool SequenceParallel(const TensorParallel& tp) { return tp.splits_rows(); }

// The rows of the residual stream's (N, C) this rank holds: N, or N / T under sequence
// parallelism; and the shape its activations between blocks take: (B, T, C), or (N / T, 1, C).
Shape StreamShape(const TensorParallel& tp, int64_t B, int64_t T, int64_t C) {
  if (!SequenceParallel(tp)) return {B, T, C};
  return {tp.RowsHeld(B * T), 1, C};
}

// Into a tensor-parallel region: every rank's rows (all-gather), where sequence parallelism
// split them; else `mine` itself. Its backward is ReduceRows.
absl::StatusOr<Tensor> GatherRows(Stream& s, const TensorParallel& tp, const Tensor& mine,
                                  const char* what) {
  if (!SequenceParallel(tp)) return mine;
  ASSIGN_OR_RETURN(Tensor all, Tensor::Empty({mine.dim(0) * tp.size, mine.dim(1)}, mine.dtype(),
                                             mine.device()));
  RETURN_IF_ERROR(tp.group->AllGather(s, all, mine, what));
  return all;
}

// Out of a region: the ranks' partial (N, C) summed; under sequence parallelism only this
// rank's rows of the sum (reduce-scatter), else all of it, in place (all-reduce).
absl::StatusOr<Tensor> ReduceRows(Stream& s, const TensorParallel& tp, const Tensor& partial,
                                  const char* what) {
  if (!SequenceParallel(tp)) {
    RETURN_IF_ERROR(GroupSum(s, tp, partial, what));
    return partial;
  }
  ASSIGN_OR_RETURN(Tensor mine, Tensor::Empty({partial.dim(0) / tp.size, partial.dim(1)},
                                              partial.dtype(), partial.device()));
  RETURN_IF_ERROR(tp.group->ReduceScatterSum(s, mine, partial, what));
  return mine;
}

// A LayerNorm's parameter gradients under sequence parallelism: each rank's come from its rows
// alone, so B computes them into a zeroed buffer (LayerNormGrads::Views), the group sums it,
// and it is added to the gradients (every rank then holds the same, as without it). Without
// sequence parallelism the gradients themselves.
class LayerNormGrads {
 public:
  // `count` LayerNorms of C channels; `grads[i]` their weight and bias gradients, in pairs.
  static absl::StatusOr<LayerNormGrads> Start(Stream& s, const TensorParallel& tp, int64_t C,
                                              std::vector<Tensor> grads) {
    LayerNormGrads g;
    g.tp_ = tp;
    g.grads_ = std::move(grads);
    if (!SequenceParallel(tp)) return g;
    ASSIGN_OR_RETURN(g.buffer_, Tensor::Empty({static_cast<int64_t>(g.grads_.size()) * C},
                                              DType::kF32, g.grads_[0].device()));
    RETURN_IF_ERROR(ops::Fill(s, g.buffer_, 0.0f));
    return g;
  }
  // Where LayerNormBackward adds gradient i.
  absl::StatusOr<Tensor> View(size_t i) const {
    if (!buffer_.defined()) return grads_[i];
    const int64_t C = grads_[i].numel();
    return buffer_.View(static_cast<int64_t>(i) * C, {C});
  }
  // Sums the buffer over the group and adds it to the gradients; nothing without a buffer.
  absl::Status Finish(Stream& s) const {
    if (!buffer_.defined()) return absl::OkStatus();
    RETURN_IF_ERROR(tp_.group->AllReduceSum(s, buffer_, "the sum of the LayerNorms' gradients"));
    for (size_t i = 0; i < grads_.size(); ++i) {
      ASSIGN_OR_RETURN(Tensor part, View(i));
      RETURN_IF_ERROR(ops::Axpy(s, grads_[i], 1.0f, part));
    }
    return absl::OkStatus();
  }
  int64_t bytes() const { return buffer_.defined() ? static_cast<int64_t>(buffer_.bytes()) : 0; }

 private:
  TensorParallel tp_;
  std::vector<Tensor> grads_;
  Tensor buffer_;
};

// A row-parallel layer's bias: added once, by the group's first rank, before the sum.
Tensor RowParallelBias(const TensorParallel& tp, const Tensor& bias) {
  return tp.rank == 0 ? bias : Tensor();
}

// Token embedding plus learned positions (GPT) or token embedding only (MLP).
class EmbeddingBlock : public Block {
 public:
  EmbeddingBlock(const ModelConfig& c, bool positions, const TensorParallel& tp)
      : c_(c), positions_(positions), tp_(tp) {}
  std::string name() const override { return "embed"; }
  std::vector<ParamSpec> Params() const override {
    std::vector<ParamSpec> p = {TokenTable(c_, tp_)};
    if (positions_) p.push_back({"embed.wpe", {c_.seq_len, c_.d_model}, Init::kNormal, 0.01f});
    return p;
  }
  absl::Status Forward(Stream& s, const std::vector<Tensor>& p, const MicroBatch& mb,
                       const Tensor&, Tensor* y, Saved*) const override {
    const int64_t B = mb.tokens.dim(0), T = mb.tokens.dim(1), C = c_.d_model;
    ASSIGN_OR_RETURN(Tensor all, Like(p[0], {B, T, C}));
    // Vocabulary-parallel: each rank's rows (zeros for the other ranks' tokens), the positions
    // added by one rank, summed over the group: every rank gets the whole rows (under sequence
    // parallelism its share of them), and the same bits as one table (each sum has one addend
    // besides zeros).
    const Tensor positions = positions_ && tp_.rank == 0 ? p[1] : Tensor();
    RETURN_IF_ERROR(ops::EmbeddingForward(s, all, mb.tokens, p[0], positions,
                                          VocabBegin(c_, tp_), c_.vocab));
    ASSIGN_OR_RETURN(Tensor all2, all.Reshape({B * T, C}));
    ASSIGN_OR_RETURN(Tensor mine,
                     ReduceRows(s, tp_, all2, "the sum of the embedding's vocabulary slices"));
    ASSIGN_OR_RETURN(*y, mine.Reshape(StreamShape(tp_, B, T, C)));
    return absl::OkStatus();
  }
  // No input gradient: B only keeps dy for the scatter-add (under sequence parallelism every
  // rank's rows of it, gathered: the collective stays in B).
  absl::Status BackwardInput(Stream& s, const std::vector<Tensor>&, const std::vector<Tensor>&,
                             const MicroBatch& mb, const Tensor& dy, const Saved&, Tensor*,
                             Saved* for_w) const override {
    const int64_t B = mb.tokens.dim(0), T = mb.tokens.dim(1), C = c_.d_model;
    ASSIGN_OR_RETURN(Tensor dy2, dy.Reshape({dy.numel() / C, C}));
    ASSIGN_OR_RETURN(Tensor all, GatherRows(s, tp_, dy2, "the embedding's output gradient"));
    ASSIGN_OR_RETURN(Tensor all3, all.Reshape({B, T, C}));
    for_w->t = {all3};
    return absl::OkStatus();
  }
  absl::Status BackwardWeights(Stream& s, const std::vector<Tensor>&,
                               const std::vector<Tensor>& g, const MicroBatch& mb,
                               const Saved& for_w) const override {
    return ops::EmbeddingBackward(s, g[0], positions_ ? g[1] : Tensor(), for_w.t[0], mb.tokens,
                                  VocabBegin(c_, tp_), c_.vocab);
  }
  int64_t ActivationBytes(int64_t B, int64_t T, DType compute) const override {
    return tp_.RowsHeld(B * T) * c_.d_model * ElemBytes(compute);  // y (this rank's rows)
  }
  int64_t WeightStashBytes(int64_t B, int64_t T, DType compute) const override {
    return B * T * c_.d_model * ElemBytes(compute) + B * T * 4;  // dy (all rows), the tokens
  }
  int64_t WorkspaceBytes(int64_t B, int64_t T, DType compute, Device) const override {
    // Backward: dy, in place of y; under sequence parallelism forward's rows before the
    // reduce-scatter, and backward's after the all-gather.
    return SequenceParallel(tp_) ? B * T * c_.d_model * ElemBytes(compute) : 0;
  }

 private:
  ModelConfig c_;
  bool positions_;
  TensorParallel tp_;
};

// ln1 -> attention -> +residual -> ln2 -> MLP (4C, GELU) -> +residual. Under tensor
// parallelism (model/tensor_parallel.h) each rank holds NH / T heads of the attention and
// 4C / T of the MLP's width: Cl = C / T channels of q, k and v and of the attention's output,
// Fl = 4C / T of the MLP's hidden layer.
class TransformerBlock : public Block {
 public:
  TransformerBlock(const ModelConfig& c, int layer, const TensorParallel& tp)
      : c_(c), layer_(layer), tp_(tp) {}
  std::string name() const override { return absl::StrCat("h", layer_); }
  std::vector<ParamSpec> Params() const override {
    const int64_t C = c_.d_model, Cl = C / tp_.size, Fl = 4 * C / tp_.size;
    const std::string n = name();
    // GPT-2: residual projections scaled down by sqrt(2 * layers).
    const float proj_std = 0.02f / std::sqrt(2.0f * c_.n_layer);
    return {
        {n + ".ln1.weight", {C}, Init::kOnes},
        {n + ".ln1.bias", {C}, Init::kZeros},
        // Column-parallel: this rank's rows of q, of k and of v.
        Split({n + ".attn.qkv.weight", {3 * Cl, C}, Init::kNormal, 0.02f}, tp_, 0, 3),
        Split({n + ".attn.qkv.bias", {3 * Cl}, Init::kZeros}, tp_, 0, 3),
        // Row-parallel: this rank's input columns; the bias whole.
        Split({n + ".attn.proj.weight", {C, Cl}, Init::kNormal, proj_std}, tp_, 1),
        {n + ".attn.proj.bias", {C}, Init::kZeros},
        {n + ".ln2.weight", {C}, Init::kOnes},
        {n + ".ln2.bias", {C}, Init::kZeros},
        Split({n + ".mlp.fc.weight", {Fl, C}, Init::kNormal, 0.02f}, tp_, 0),
        Split({n + ".mlp.fc.bias", {Fl}, Init::kZeros}, tp_, 0),
        Split({n + ".mlp.proj.weight", {C, Fl}, Init::kNormal, proj_std}, tp_, 1),
        {n + ".mlp.proj.bias", {C}, Init::kZeros},
    };
  }
  enum P { kLn1W, kLn1B, kQkvW, kQkvB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB };
  // Saved tensors, in this order.
  enum S { kX, kLn1, kMean1, kRstd1, kQkv, kAtt, kAttY, kRes2, kLn2, kMean2, kRstd2, kFcPre, kFcAct };

  // Under sequence parallelism x, y, dy and dx hold this rank's rows of the residual stream
  // (Nl = N / T of them), the LayerNorms run on those, and each region's input is gathered
  // (GatherRows) and its output reduce-scattered (ReduceRows); without it Nl = N, the gathers
  // are x itself and the reductions all-reduces. The attention sees every row: B x T.
  absl::Status Forward(Stream& s, const std::vector<Tensor>& p, const MicroBatch&,
                       const Tensor& x, Tensor* y, Saved* saved) const override {
    const Rows r = RowsOf(x);
    const int64_t B = r.B, T = r.T, C = c_.d_model, N = r.all, Nl = r.mine;
    const int64_t NH = heads(), Cl = C / tp_.size, Fl = 4 * C / tp_.size;
    ASSIGN_OR_RETURN(Tensor x2, x.Reshape({Nl, C}));
    ASSIGN_OR_RETURN(Tensor ln1, Like(x, {Nl, C}));
    ASSIGN_OR_RETURN(Tensor mean1, F32(x, {Nl}));
    ASSIGN_OR_RETURN(Tensor rstd1, F32(x, {Nl}));
    RETURN_IF_ERROR(ops::LayerNormForward(s, ln1, mean1, rstd1, x2, p[kLn1W], p[kLn1B]));
    ASSIGN_OR_RETURN(Tensor ln1_all, GatherRows(s, tp_, ln1, "the attention's input rows"));
    ASSIGN_OR_RETURN(Tensor qkv, Like(x, {N, 3 * Cl}));
    RETURN_IF_ERROR(ops::LinearForward(s, qkv, ln1_all, p[kQkvW], p[kQkvB]));
    ASSIGN_OR_RETURN(Tensor qkv3, qkv.Reshape({B, T, 3 * Cl}));
    ASSIGN_OR_RETURN(Tensor atty, Like(x, {B, T, Cl}));
    // att: the probabilities (B, NH, T, T), or with flash attention the rows' log-sum-exp
    // (B, NH, T).
    Tensor att;
    if (c_.attention == Attention::kFlash) {
      ASSIGN_OR_RETURN(att, F32(x, {B, NH, T}));
      RETURN_IF_ERROR(ops::FlashAttentionForward(s, atty, att, qkv3, NH));
    } else {
      ASSIGN_OR_RETURN(att, F32(x, {B, NH, T, T}));
      RETURN_IF_ERROR(ops::AttentionForward(s, atty, att, qkv3, NH));
    }
    ASSIGN_OR_RETURN(Tensor atty2, atty.Reshape({N, Cl}));
    ASSIGN_OR_RETURN(Tensor proj_parts, Like(x, {N, C}));
    RETURN_IF_ERROR(
        ops::LinearForward(s, proj_parts, atty2, p[kProjW], RowParallelBias(tp_, p[kProjB])));
    ASSIGN_OR_RETURN(Tensor proj,
                     ReduceRows(s, tp_, proj_parts, "the sum of the attention projection's parts"));
    ASSIGN_OR_RETURN(Tensor res2, Like(x, {Nl, C}));
    ASSIGN_OR_RETURN(Tensor ln2, Like(x, {Nl, C}));
    ASSIGN_OR_RETURN(Tensor mean2, F32(x, {Nl}));
    ASSIGN_OR_RETURN(Tensor rstd2, F32(x, {Nl}));
    RETURN_IF_ERROR(ops::ResidualLayerNormForward(s, res2, ln2, mean2, rstd2, x2, proj,
                                                  p[kLn2W], p[kLn2B]));
    ASSIGN_OR_RETURN(Tensor ln2_all, GatherRows(s, tp_, ln2, "the MLP's input rows"));
    ASSIGN_OR_RETURN(Tensor fc_pre, Like(x, {N, Fl}));
    ASSIGN_OR_RETURN(Tensor fc_act, Like(x, {N, Fl}));
    RETURN_IF_ERROR(ops::LinearGeluForward(s, fc_act, fc_pre, ln2_all, p[kFcW], p[kFcB]));
    ASSIGN_OR_RETURN(Tensor fc_parts, Like(x, {N, C}));
    RETURN_IF_ERROR(ops::LinearForward(s, fc_parts, fc_act, p[kFcProjW],
                                       RowParallelBias(tp_, p[kFcProjB])));
    ASSIGN_OR_RETURN(Tensor fc_out,
                     ReduceRows(s, tp_, fc_parts, "the sum of the MLP projection's parts"));
    ASSIGN_OR_RETURN(*y, Like(x, x.shape()));
    ASSIGN_OR_RETURN(Tensor y2, y->Reshape({Nl, C}));
    RETURN_IF_ERROR(ops::Add(s, y2, res2, fc_out));
    if (saved == nullptr) return absl::OkStatus();  // evaluation: nothing kept
    // Under sequence parallelism ln1 and ln2 are this rank's rows, gathered again in backward
    // (Megatron's way: N / T rows kept, not N).
    saved->t = {x2, ln1, mean1, rstd1, qkv3, att, atty2, res2, ln2, mean2, rstd2, fc_pre, fc_act};
    return absl::OkStatus();
  }

  // What B keeps for W, in this order: each linear layer's output gradient and input.
  enum W { kWDy, kWFcAct, kWDfcPre, kWLn2, kWDres2, kWAttY, kWDqkv, kWLn1 };

  // B adds the LayerNorms' parameter gradients itself: their W would keep each LayerNorm's
  // input, output gradient and statistics (4C a row more than the linear layers' 16C), for
  // work that is elementwise. W is the linear layers' weight and bias gradients, the
  // matmuls that zero-bubble moves into the bubbles.
  absl::Status BackwardInput(Stream& s, const std::vector<Tensor>& p,
                             const std::vector<Tensor>& g, const MicroBatch&, const Tensor& dy,
                             const Saved& saved, Tensor* dx, Saved* for_w) const override {
    const std::vector<Tensor>& v = saved.t;
    const Rows r = RowsOf(dy);
    const int64_t B = r.B, T = r.T, C = c_.d_model, N = r.all, Nl = r.mine;
    const int64_t NH = heads(), Cl = C / tp_.size, Fl = 4 * C / tp_.size;
    const Tensor none;  // the linear layers' parameter gradients, which W computes
    ASSIGN_OR_RETURN(
        LayerNormGrads lng,
        LayerNormGrads::Start(s, tp_, C, {g[kLn2W], g[kLn2B], g[kLn1W], g[kLn1B]}));
    ASSIGN_OR_RETURN(Tensor dy2, dy.Reshape({Nl, C}));
    ASSIGN_OR_RETURN(Tensor dy_all, GatherRows(s, tp_, dy2, "the block's output gradient"));
    // MLP branch: y = res2 + proj(gelu(fc(ln2(res2)))).
    ASSIGN_OR_RETURN(Tensor dfc_act, Like(dy, {N, Fl}));
    RETURN_IF_ERROR(
        ops::LinearBackward(s, dfc_act, none, none, dy_all, v[kFcAct], p[kFcProjW]));
    ASSIGN_OR_RETURN(Tensor dfc_pre, Like(dy, {N, Fl}));
    RETURN_IF_ERROR(ops::GeluBackward(s, dfc_pre, v[kFcPre], dfc_act));
    ASSIGN_OR_RETURN(Tensor ln2_all, GatherRows(s, tp_, v[kLn2], "the MLP's input rows"));
    ASSIGN_OR_RETURN(Tensor dln2_parts, Like(dy, {N, C}));
    RETURN_IF_ERROR(ops::LinearBackward(s, dln2_parts, none, none, dfc_pre, ln2_all, p[kFcW]));
    // Each rank's fc saw all of ln2: its gradient is the sum of the ranks' parts.
    ASSIGN_OR_RETURN(Tensor dln2,
                     ReduceRows(s, tp_, dln2_parts, "the sum of the MLP input gradient's parts"));
    ASSIGN_OR_RETURN(Tensor dres2, Like(dy, {Nl, C}));
    ASSIGN_OR_RETURN(Tensor dln2_w, lng.View(0));
    ASSIGN_OR_RETURN(Tensor dln2_b, lng.View(1));
    RETURN_IF_ERROR(ops::LayerNormBackward(s, dres2, dln2_w, dln2_b, dln2, v[kRes2], p[kLn2W],
                                           v[kMean2], v[kRstd2]));
    RETURN_IF_ERROR(ops::Axpy(s, dres2, 1.0f, dy2));  // the residual path
    ASSIGN_OR_RETURN(Tensor dres2_all,
                     GatherRows(s, tp_, dres2, "the attention's output gradient"));
    // Attention branch: res2 = x + proj(attention(qkv(ln1(x)))).
    ASSIGN_OR_RETURN(Tensor datty, Like(dy, {N, Cl}));
    RETURN_IF_ERROR(ops::LinearBackward(s, datty, none, none, dres2_all, v[kAttY], p[kProjW]));
    ASSIGN_OR_RETURN(Tensor datty3, datty.Reshape({B, T, Cl}));
    ASSIGN_OR_RETURN(Tensor dqkv, Like(dy, {B, T, 3 * Cl}));
    if (c_.attention == Attention::kFlash) {
      ASSIGN_OR_RETURN(Tensor atty3, v[kAttY].Reshape({B, T, Cl}));
      RETURN_IF_ERROR(ops::FlashAttentionBackward(s, dqkv, datty3, v[kQkv], atty3, v[kAtt], NH));
    } else {
      RETURN_IF_ERROR(ops::AttentionBackward(s, dqkv, datty3, v[kQkv], v[kAtt], NH));
    }
    ASSIGN_OR_RETURN(Tensor dqkv2, dqkv.Reshape({N, 3 * Cl}));
    ASSIGN_OR_RETURN(Tensor ln1_all, GatherRows(s, tp_, v[kLn1], "the attention's input rows"));
    ASSIGN_OR_RETURN(Tensor dln1_parts, Like(dy, {N, C}));
    RETURN_IF_ERROR(ops::LinearBackward(s, dln1_parts, none, none, dqkv2, ln1_all, p[kQkvW]));
    ASSIGN_OR_RETURN(Tensor dln1, ReduceRows(s, tp_, dln1_parts,
                                             "the sum of the attention input gradient's parts"));
    ASSIGN_OR_RETURN(*dx, Like(dy, dy.shape()));
    ASSIGN_OR_RETURN(Tensor dx2, dx->Reshape({Nl, C}));
    ASSIGN_OR_RETURN(Tensor dln1_w, lng.View(2));
    ASSIGN_OR_RETURN(Tensor dln1_b, lng.View(3));
    RETURN_IF_ERROR(ops::LayerNormBackward(s, dx2, dln1_w, dln1_b, dln1, v[kX], p[kLn1W],
                                           v[kMean1], v[kRstd1]));
    RETURN_IF_ERROR(ops::Axpy(s, dx2, 1.0f, dres2));
    RETURN_IF_ERROR(lng.Finish(s));
    for_w->t = {dy_all, v[kFcAct], dfc_pre, ln2_all, dres2_all, v[kAttY], dqkv2, ln1_all};
    return absl::OkStatus();
  }
  absl::Status BackwardWeights(Stream& s, const std::vector<Tensor>& p,
                               const std::vector<Tensor>& g, const MicroBatch&,
                               const Saved& for_w) const override {
    const std::vector<Tensor>& w = for_w.t;
    const Tensor none;  // the input gradients, which B computed
    RETURN_IF_ERROR(ops::LinearBackward(s, none, g[kFcProjW], g[kFcProjB], w[kWDy], w[kWFcAct],
                                        p[kFcProjW]));
    RETURN_IF_ERROR(
        ops::LinearBackward(s, none, g[kFcW], g[kFcB], w[kWDfcPre], w[kWLn2], p[kFcW]));
    RETURN_IF_ERROR(
        ops::LinearBackward(s, none, g[kProjW], g[kProjB], w[kWDres2], w[kWAttY], p[kProjW]));
    return ops::LinearBackward(s, none, g[kQkvW], g[kQkvB], w[kWDqkv], w[kWLn1], p[kQkvW]);
  }
  int64_t ActivationBytes(int64_t B, int64_t T, DType compute) const override {
    const int64_t N = B * T, Nl = tp_.RowsHeld(N), C = c_.d_model, Cl = C / tp_.size, NH = heads();
    // ln1, res2, ln2 and y (C each, this rank's rows), qkv (3Cl), atty (Cl), fc_pre and fc_act
    // (4Cl each) in the compute dtype; four f32 statistics per row of this rank's; the f32
    // probabilities or log-sum-exps of this rank's heads.
    const int64_t att = c_.attention == Attention::kFlash ? B * NH * T : B * NH * T * T;
    return (Nl * 4 * C + N * 12 * Cl) * ElemBytes(compute) + (4 * Nl + att) * 4;
  }
  int64_t WeightStashBytes(int64_t B, int64_t T, DType compute) const override {
    // dy, ln2, dres2 and ln1 (C each), fc_act and dfc_pre (4Cl each), atty (Cl) and dqkv (3Cl)
    // in the compute dtype, of which fc_act, ln2, atty and ln1 are activations Forward kept.
    const int64_t C = c_.d_model, Cl = C / tp_.size;
    return B * T * (4 * C + 12 * Cl) * ElemBytes(compute);
  }
  int64_t WorkspaceBytes(int64_t B, int64_t T, DType compute, Device device) const override {
    // Backward (Forward holds 2C per row: proj and fc_out): dy in place of y, then dfc_act and
    // dfc_pre (4Cl each), dln2, dres2 (C each), datty (Cl), dqkv (3Cl), dln1 and dx (C each),
    // all live until it returns; the attention's scratch comes on top of all but dln1 and
    // dx. (Its forward's scratch is smaller, at a moment that holds none of these.) Under
    // sequence parallelism dy, dres2 and dx are this rank's rows, and all of the rows of dy,
    // the parts of dln2, ln2, dres2, the parts of dln1 and ln1 (C each) come on top, with the
    // LayerNorms' gradient buffer.
    const int64_t C = c_.d_model, Cl = C / tp_.size, e = ElemBytes(compute);
    const int64_t N = B * T, Nl = tp_.RowsHeld(N);
    const ops::AttentionScratch att = ops::AttentionScratchBytes(
        device, compute, B, T, Cl, heads(), c_.attention == Attention::kFlash);
    const bool sp = SequenceParallel(tp_);
    const int64_t before_att = (N * 12 * Cl + Nl * 2 * C + (sp ? N * 4 * C : 0)) * e;
    const int64_t after = (Nl * 2 * C + (sp ? N * 2 * C : 0)) * e + (sp ? 4 * C * 4 : 0);
    return std::max(before_att + after, before_att + att.backward);
  }

 private:
  // The heads this rank computes.
  int64_t heads() const { return c_.n_head / tp_.size; }
  // The rows of a micro-batch from a tensor of the residual stream, (B, T, C) or under sequence
  // parallelism (N / T, 1, C): its B samples of T tokens, all N = B x T rows and this rank's.
  struct Rows {
    int64_t B, T, all, mine;
  };
  Rows RowsOf(const Tensor& x) const {
    const int64_t mine = x.dim(0) * x.dim(1);
    if (!SequenceParallel(tp_)) return {x.dim(0), x.dim(1), mine, mine};
    const int64_t all = mine * tp_.size;
    return {all / c_.seq_len, c_.seq_len, all, mine};
  }
  ModelConfig c_;
  int layer_;
  TensorParallel tp_;
};

// One MLP hidden layer: y = x + relu(x @ W^T + b), a residual so depth trains stably.
class MlpLayerBlock : public Block {
 public:
  MlpLayerBlock(const ModelConfig& c, int layer) : c_(c), layer_(layer) {}
  std::string name() const override { return absl::StrCat("h", layer_); }
  std::vector<ParamSpec> Params() const override {
    const int64_t C = c_.d_model;
    return {{name() + ".fc.weight", {C, C}, Init::kNormal, 1.0f / std::sqrt(float(C))},
            {name() + ".fc.bias", {C}, Init::kZeros}};
  }
  absl::Status Forward(Stream& s, const std::vector<Tensor>& p, const MicroBatch&,
                       const Tensor& x, Tensor* y, Saved* saved) const override {
    const int64_t B = x.dim(0), T = x.dim(1), C = c_.d_model, N = B * T;
    ASSIGN_OR_RETURN(Tensor x2, x.Reshape({N, C}));
    ASSIGN_OR_RETURN(Tensor h, Like(x, {N, C}));
    RETURN_IF_ERROR(ops::LinearForward(s, h, x2, p[0], p[1]));
    RETURN_IF_ERROR(ops::ReluForward(s, h, h));
    ASSIGN_OR_RETURN(*y, Like(x, {B, T, C}));
    ASSIGN_OR_RETURN(Tensor y2, y->Reshape({N, C}));
    RETURN_IF_ERROR(ops::Add(s, y2, x2, h));
    if (saved == nullptr) return absl::OkStatus();  // evaluation: nothing kept
    saved->t = {x2, h};
    return absl::OkStatus();
  }
  absl::Status BackwardInput(Stream& s, const std::vector<Tensor>& p, const std::vector<Tensor>&,
                             const MicroBatch&, const Tensor& dy, const Saved& saved, Tensor* dx,
                             Saved* for_w) const override {
    const int64_t B = dy.dim(0), T = dy.dim(1), C = c_.d_model, N = B * T;
    ASSIGN_OR_RETURN(Tensor dy2, dy.Reshape({N, C}));
    ASSIGN_OR_RETURN(Tensor dh, Like(dy, {N, C}));
    RETURN_IF_ERROR(ops::ReluBackward(s, dh, saved.t[1], dy2));
    ASSIGN_OR_RETURN(*dx, Like(dy, {B, T, C}));
    ASSIGN_OR_RETURN(Tensor dx2, dx->Reshape({N, C}));
    RETURN_IF_ERROR(ops::LinearBackward(s, dx2, Tensor(), Tensor(), dh, saved.t[0], p[0]));
    RETURN_IF_ERROR(ops::Axpy(s, dx2, 1.0f, dy2));
    for_w->t = {dh, saved.t[0]};  // the fc's output gradient and input
    return absl::OkStatus();
  }
  absl::Status BackwardWeights(Stream& s, const std::vector<Tensor>& p,
                               const std::vector<Tensor>& g, const MicroBatch&,
                               const Saved& for_w) const override {
    return ops::LinearBackward(s, Tensor(), g[0], g[1], for_w.t[0], for_w.t[1], p[0]);
  }
  int64_t ActivationBytes(int64_t B, int64_t T, DType compute) const override {
    return 2 * B * T * c_.d_model * ElemBytes(compute);  // h, y
  }
  int64_t WeightStashBytes(int64_t B, int64_t T, DType compute) const override {
    return 2 * B * T * c_.d_model * ElemBytes(compute);  // dh, x
  }
  int64_t WorkspaceBytes(int64_t B, int64_t T, DType compute, Device) const override {
    return 2 * B * T * c_.d_model * ElemBytes(compute);  // dy in place of y; dh, dx
  }

 private:
  ModelConfig c_;
  int layer_;
};

// Final LayerNorm (GPT only), the vocabulary projection and the softmax cross-entropy,
// fused with its backward: dlogits are made in the forward pass (after llm.c), so the
// logits are never kept. Tied, the projection's weight is the embedding's "embed.wte" (the
// same [V, C] shape): its dW goes into the table's gradient before the embedding's
// scatter-add of the same micro-batch (backward runs the head first).
//
// The head's B computes its weight gradient too, and its W is empty: what that W would read
// is the logits' gradient, V values a token (the largest stash of any block, and as large as
// everything the head's forward kept), so deferring it frees nothing when B runs and holds it
// through the stage's later blocks' B and every B until the W: ZB-H1's last stage would hold
// more than 1F1B's largest (3 MB more of gpt-tiny at 1 micro-batch; with GPT-2's 50257-token
// vocabulary, 100 MB a pending micro-batch of 1024 bf16 tokens). The price is the projection's
// dW on the critical path of the last stage's B.
//
// Under tensor parallelism the projection is vocabulary-parallel: each rank holds its slice
// of the vocabulary's rows and computes its slice of the logits, and the cross-entropy
// reduces the rows' max and sum-exp over the group (ops::VocabParallelCrossEntropy); the
// input's gradient is the sum of the ranks' parts.
class HeadBlock : public Block {
 public:
  HeadBlock(const ModelConfig& c, bool layernorm, const TensorParallel& tp)
      : c_(c), layernorm_(layernorm), tp_(tp) {}
  std::string name() const override { return "head"; }
  std::vector<ParamSpec> Params() const override {
    const int64_t C = c_.d_model, V = c_.vocab;
    std::vector<ParamSpec> p;
    if (layernorm_) {
      p.push_back({"head.ln.weight", {C}, Init::kOnes});
      p.push_back({"head.ln.bias", {C}, Init::kZeros});
    }
    if (c_.tie_embeddings) {
      p.push_back(TokenTable(c_, tp_));
    } else {
      p.push_back(Split({"head.weight", {V / tp_.size, C}, Init::kNormal, 0.02f}, tp_, 0));
    }
    if (!layernorm_) p.push_back({"head.bias", {V}, Init::kZeros});
    return p;
  }
  absl::Status Forward(Stream& s, const std::vector<Tensor>& p, const MicroBatch& mb,
                       const Tensor& x, Tensor* y, Saved* saved) const override {
    // Under sequence parallelism x holds this rank's Nl rows; the LayerNorm runs on them, and
    // the projection on every rank's, gathered.
    const int64_t C = c_.d_model, N = mb.targets.numel(), Nl = x.numel() / C;
    const int64_t V = c_.vocab / tp_.size;  // this rank's slice
    ASSIGN_OR_RETURN(Tensor x2, x.Reshape({Nl, C}));
    Tensor h = x2, mean, rstd;
    if (layernorm_) {
      ASSIGN_OR_RETURN(h, Like(x, {Nl, C}));
      ASSIGN_OR_RETURN(mean, F32(x, {Nl}));
      ASSIGN_OR_RETURN(rstd, F32(x, {Nl}));
      RETURN_IF_ERROR(ops::LayerNormForward(s, h, mean, rstd, x2, p[0], p[1]));
    }
    ASSIGN_OR_RETURN(h, GatherRows(s, tp_, h, "the head's input rows"));
    ASSIGN_OR_RETURN(Tensor logits, Like(x, {N, V}));
    RETURN_IF_ERROR(ops::LinearForward(s, logits, h, weight(p), bias(p)));
    ASSIGN_OR_RETURN(*y, F32(x, {N}));
    ASSIGN_OR_RETURN(Tensor targets, mb.targets.Reshape({N}));
    // The logits' buffer receives its own gradient in place (none in an evaluation); logits
    // past the data's vocabulary (padding) take no part in the softmax.
    const Tensor dlogits = saved != nullptr ? logits : Tensor();
    if (tp_.enabled()) {
      RETURN_IF_ERROR(VocabParallelLoss(s, *y, dlogits, logits, targets, mb.dloss_scale));
    } else {
      RETURN_IF_ERROR(ops::SoftmaxCrossEntropy(s, *y, dlogits, logits, targets, mb.dloss_scale,
                                               RealColumns(c_, tp_)));
    }
    if (saved == nullptr) return absl::OkStatus();  // evaluation: nothing kept
    saved->t = {x2, h, mean, rstd, logits};
    return absl::OkStatus();
  }
  // B: dx, the LayerNorm's parameter gradients, then the projection's (see above); it keeps
  // nothing for W.
  absl::Status BackwardInput(Stream& s, const std::vector<Tensor>& p,
                             const std::vector<Tensor>& g, const MicroBatch& mb, const Tensor&,
                             const Saved& saved, Tensor* dx, Saved*) const override {
    const std::vector<Tensor>& v = saved.t;
    const int64_t Nl = v[0].dim(0), C = c_.d_model, N = mb.targets.numel();
    const int64_t B = mb.targets.dim(0), T = mb.targets.dim(1);
    ASSIGN_OR_RETURN(*dx, Like(v[0], StreamShape(tp_, B, T, C)));
    ASSIGN_OR_RETURN(Tensor dx2, dx->Reshape({Nl, C}));
    const char* what = "the sum of the head input gradient's parts";
    if (!layernorm_) {
      RETURN_IF_ERROR(ops::LinearBackward(s, dx2, Tensor(), Tensor(), v[4], v[1], weight(p)));
      RETURN_IF_ERROR(GroupSum(s, tp_, dx2, what));
    } else {
      ASSIGN_OR_RETURN(Tensor dh_parts, Like(v[0], {N, C}));
      RETURN_IF_ERROR(
          ops::LinearBackward(s, dh_parts, Tensor(), Tensor(), v[4], v[1], weight(p)));
      ASSIGN_OR_RETURN(Tensor dh, ReduceRows(s, tp_, dh_parts, what));
      ASSIGN_OR_RETURN(LayerNormGrads lng, LayerNormGrads::Start(s, tp_, C, {g[0], g[1]}));
      ASSIGN_OR_RETURN(Tensor dw, lng.View(0));
      ASSIGN_OR_RETURN(Tensor db, lng.View(1));
      RETURN_IF_ERROR(ops::LayerNormBackward(s, dx2, dw, db, dh, v[0], p[0], v[2], v[3]));
      RETURN_IF_ERROR(lng.Finish(s));
    }
    return ops::LinearBackward(s, Tensor(), weight(g), bias(g), v[4], v[1], weight(p));
  }
  absl::Status BackwardWeights(Stream&, const std::vector<Tensor>&, const std::vector<Tensor>&,
                               const MicroBatch&, const Saved&) const override {
    return absl::OkStatus();  // B added every gradient
  }
  int64_t ActivationBytes(int64_t B, int64_t T, DType compute) const override {
    const int64_t N = B * T;
    // The logits (holding their gradient) and the f32 losses; with the LayerNorm its output
    // and two f32 statistics per row.
    // Under sequence parallelism the LayerNorm's output is kept for all rows, gathered, and
    // its statistics for this rank's.
    const int64_t Nl = tp_.RowsHeld(N);
    const int64_t ln = layernorm_ ? N * c_.d_model * ElemBytes(compute) + 2 * Nl * 4 : 0;
    return N * (c_.vocab / tp_.size) * ElemBytes(compute) + N * 4 + ln;
  }
  int64_t WeightStashBytes(int64_t, int64_t, DType) const override { return 0; }
  int64_t WorkspaceBytes(int64_t B, int64_t T, DType compute, Device) const override {
    // Backward: dx, and with the LayerNorm the gradient of its output.
    // Backward: dx, and with the LayerNorm the gradient of its output; vocabulary-parallel,
    // the forward's max and partials (3 f32 a row) too. Under sequence parallelism dx and the
    // gradient are this rank's rows, the parts of the gradient all rows, and the LayerNorm's
    // gradient buffer comes on top; forward's LayerNorm output before the gather, this rank's.
    const int64_t N = B * T, C = c_.d_model, e = ElemBytes(compute);
    const int64_t vp = tp_.enabled() ? 3 * N * 4 : 0;
    if (SequenceParallel(tp_) && layernorm_) {
      return (N + 2 * N / tp_.size) * C * e + vp + 2 * C * 4;
    }
    return (layernorm_ ? 2 : 1) * N * C * e + vp;
  }

 private:
  // Megatron's vocabulary-parallel cross-entropy: the rows' max over the group, then their
  // sums of exp and target logits, then each rank's losses and its slice of the gradient.
  absl::Status VocabParallelLoss(Stream& s, const Tensor& losses, const Tensor& dlogits,
                                 const Tensor& logits, const Tensor& targets,
                                 float dloss_scale) const {
    const int64_t N = logits.dim(0), begin = VocabBegin(c_, tp_), cols = RealColumns(c_, tp_);
    ASSIGN_OR_RETURN(Tensor max, F32(logits, {N}));
    ASSIGN_OR_RETURN(Tensor partials, F32(logits, {2, N}));
    RETURN_IF_ERROR(ops::CrossEntropyRowMax(s, max, logits, cols));
    RETURN_IF_ERROR(tp_.group->AllReduceMax(s, max, "the logits' row maxima"));
    RETURN_IF_ERROR(ops::CrossEntropyPartials(s, partials, logits, max, targets, begin, cols));
    RETURN_IF_ERROR(GroupSum(s, tp_, partials, "the sums of exp and the target logits"));
    return ops::VocabParallelCrossEntropy(s, losses, dlogits, logits, max, partials, targets,
                                          dloss_scale, begin, cols);
  }
  const Tensor& weight(const std::vector<Tensor>& p) const { return p[layernorm_ ? 2 : 0]; }
  Tensor bias(const std::vector<Tensor>& p) const { return layernorm_ ? Tensor() : p[1]; }
  ModelConfig c_;
  bool layernorm_;
  TensorParallel tp_;
};

}  // namespace

absl::Status Block::Backward(Stream& s, const std::vector<Tensor>& params,
                             const std::vector<Tensor>& grads, const MicroBatch& mb,
                             const Tensor& dy, const Saved& saved, Tensor* dx) const {
  Saved for_w;
  RETURN_IF_ERROR(BackwardInput(s, params, grads, mb, dy, saved, dx, &for_w));
  return BackwardWeights(s, params, grads, mb, for_w);
}

std::vector<ParamSpec> StageParams(const std::vector<std::unique_ptr<Block>>& blocks, int begin,
                                   int end, std::vector<std::vector<size_t>>* block_params) {
  std::vector<int> held;
  for (int b = begin; b < end; ++b) held.push_back(b);
  return StageParams(blocks, held, block_params);
}

std::vector<ParamSpec> StageParams(const std::vector<std::unique_ptr<Block>>& blocks,
                                   const std::vector<int>& held,
                                   std::vector<std::vector<size_t>>* block_params) {
  // A block's own parameters are named after it ("head.ln.weight"); any other it lists
  // ("embed.wte" in a tied head) is another block's.
  auto owns = [](const Block& b, const ParamSpec& p) {
    return absl::StartsWith(p.name, b.name() + ".");
  };
  std::vector<ParamSpec> specs;
  std::map<std::string, size_t> index;
  auto add = [&](const ParamSpec& p) {
    if (index.emplace(p.name, specs.size()).second) specs.push_back(p);
  };
  // Borrowed parameters whose owner is not in the stage: copies, first.
  std::set<std::string> owned;
  for (int b : held) {
    for (const ParamSpec& p : blocks[b]->Params()) {
      if (owns(*blocks[b], p)) owned.insert(p.name);
    }
  }
  for (int b : held) {
    for (const ParamSpec& p : blocks[b]->Params()) {
      if (!owns(*blocks[b], p) && !owned.count(p.name)) add(p);
    }
  }
  for (int b : held) {
    for (const ParamSpec& p : blocks[b]->Params()) {
      if (owns(*blocks[b], p)) add(p);
    }
  }
  if (block_params != nullptr) {
    block_params->clear();
    for (int b : held) {
      std::vector<size_t> idx;
      for (const ParamSpec& p : blocks[b]->Params()) idx.push_back(index.at(p.name));
      block_params->push_back(std::move(idx));
    }
  }
  return specs;
}

std::vector<std::unique_ptr<Block>> BuildBlocks(const ModelConfig& config,
                                                const TensorParallel& tp) {
  std::vector<std::unique_ptr<Block>> blocks;
  const bool gpt = config.kind == ModelKind::kGpt;
  blocks.push_back(std::make_unique<EmbeddingBlock>(config, gpt, tp));
  for (int l = 0; l < config.n_layer; ++l) {
    if (gpt) {
      blocks.push_back(std::make_unique<TransformerBlock>(config, l, tp));
    } else {
      blocks.push_back(std::make_unique<MlpLayerBlock>(config, l));
    }
  }
  blocks.push_back(std::make_unique<HeadBlock>(config, gpt, tp));
  return blocks;
}

absl::Status CheckTensorParallel(const ModelConfig& c, int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--tensor-parallel=%d: must be at least 1 (1: no tensor parallelism)", size));
  }
  if (size == 1) return absl::OkStatus();
  auto refuse = [&](const std::string& what, int64_t n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--tensor-parallel=%d does not divide %s (%d): each rank holds an equal part; use a T "
        "that divides it",
        size, what, n));
  };
  if (c.kind != ModelKind::kGpt) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--tensor-parallel=%d needs a GPT (its attention heads and MLP split over the ranks); "
        "the MLP model has none: use --tensor-parallel=1",
        size));
  }
  if (c.n_head % size != 0) return refuse("the attention heads", c.n_head);
  if (c.d_model % size != 0) return refuse("d_model", c.d_model);
  if (c.vocab % size != 0) return refuse("the padded vocabulary", c.vocab);
  return absl::OkStatus();
}

std::vector<int> ParamOwners(const std::vector<std::vector<size_t>>& block_params, size_t params,
                             bool copy_first) {
  std::vector<int> owner(params, 0);
  for (int b = static_cast<int>(block_params.size()) - 1; b >= 0; --b) {
    for (size_t i : block_params[b]) owner[i] = b;
  }
  if (copy_first && params > 0) owner[0] = 0;
  return owner;
}

}  // namespace tandem
