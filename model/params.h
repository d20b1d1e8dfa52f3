// Parameters of a stage in one flat f32 buffer, with a table of named views (after llm.c's
// malloc_and_point_parameters). Gradients, optimizer moments and the low-precision copy use
// the same layout, so data-parallel buckets and sharding offsets are plain arithmetic.
#ifndef TANDEM_MODEL_PARAMS_H_
#define TANDEM_MODEL_PARAMS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/tensor.h"

namespace tandem {

enum class Init { kZeros, kOnes, kNormal };

// A parameter split over the ranks of a tensor-parallel group (model/tensor_parallel.h): this
// rank holds part `index` of `parts` equal parts along dimension `dim` of the whole tensor;
// with `groups` > 1 that dimension is `groups` equal blocks (the fused q, k and v), each split
// the same way, and the rank holds its part of each, in order.
struct TensorShard {
  int dim = -1;  // -1: the whole tensor (replicated over the group)
  int parts = 1, index = 0, groups = 1;
  bool split() const { return dim >= 0 && parts > 1; }
};

struct ParamSpec {
  std::string name;  // globally unique: "h3.attn.qkv.weight"
  Shape shape;       // the part this rank holds
  Init init = Init::kZeros;
  float std = 0.0f;  // for kNormal
  TensorShard shard;
  // The whole tensor's shape, of which `shape` is this rank's part.
  Shape WholeShape() const;
};

// This rank's part of a whole tensor laid out as `spec.WholeShape()`, and back: `part` holds
// spec.shape.numel() elements, `whole` WholeShape().numel(). Copies of the elements only; a
// spec that is not split copies the whole tensor.
void ExtractShard(const ParamSpec& spec, const float* whole, float* part);
void InsertShard(const ParamSpec& spec, const float* part, float* whole);
// The spec of the whole tensor `spec` is a part of (itself when it is not split).
ParamSpec WholeSpec(const ParamSpec& spec);

struct ParamEntry {
  ParamSpec spec;
  int64_t offset;  // elements from the start of the flat buffer
};

// Elements [begin, end) of a flat buffer.
struct ElementRange {
  int64_t begin = 0, end = 0;
  bool operator==(const ElementRange& o) const { return begin == o.begin && end == o.end; }
};

class ParamLayout {
 public:
  explicit ParamLayout(std::vector<ParamSpec> specs);
  const std::vector<ParamEntry>& entries() const { return entries_; }
  int64_t numel() const { return numel_; }

 private:
  std::vector<ParamEntry> entries_;
  int64_t numel_ = 0;
};

// Whether weight decay applies to `spec` by default: the 2-D weight matrices and the token
// embedding; not biases, LayerNorm gains or the position table (embed.wpe), which is added to
// the tokens' vectors, not multiplied. (Hugging Face and Megatron exclude biases and norms;
// nanoGPT decays every 2-D tensor, the position table included.)
bool DecaysByDefault(const ParamSpec& spec);
// The elements of `layout`'s flat buffer weight decay applies to, in order, neighbours merged:
// every parameter with `decay_all`, else those DecaysByDefault picks.
std::vector<ElementRange> DecayedRanges(const ParamLayout& layout, bool decay_all);
// The elements of the parameters `pick` accepts, in order, neighbours merged, leaving out the
// first `skip` elements of the buffer.
std::vector<ElementRange> PickedRanges(const ParamLayout& layout,
                                       const std::function<bool(const ParamSpec&)>& pick,
                                       int64_t skip = 0);

// A flat buffer laid out by a ParamLayout, with one view per entry.
class FlatBuffer {
 public:
  static absl::StatusOr<FlatBuffer> Create(const ParamLayout& layout, DType dtype,
                                           Device device);
  // The same buffer in segments, each its own allocation, none made yet: `segments` tile
  // [0, layout.numel()) in any order, each a whole number of entries. A segment is allocated
  // (zeroed) by Materialize and given back by Release; flat() stays undefined, and an entry's
  // view is undefined while its segment is not allocated. ZeRO-2's gradients: one segment per
  // bucket, alive from the step's first write into it to its reduce-scatter. `layout` must
  // outlive the buffer.
  static absl::StatusOr<FlatBuffer> CreateSegmented(const ParamLayout& layout, DType dtype,
                                                    Device device,
                                                    std::vector<ElementRange> segments);
  const Tensor& flat() const { return flat_; }
  const Tensor& view(size_t i) const { return views_[i]; }
  size_t size() const { return views_.size(); }

  bool segmented() const { return !segments_.empty(); }
  size_t num_segments() const { return segments_.size(); }
  const ElementRange& segment_range(size_t k) const { return segments_[k]; }
  // The segment holding entry i.
  size_t SegmentOf(size_t i) const { return segment_of_[i]; }
  bool materialized(size_t k) const { return memory_[k].defined(); }
  // Segment k's memory, allocated and zero-filled in `s`'s order when it is not allocated;
  // the views of its entries then point into it.
  absl::StatusOr<Tensor> Materialize(size_t k, Stream& s);
  // Drops the buffer's hold on segment k's memory and its entries' views; work queued on the
  // memory (a collective reducing it) keeps it until that work is done.
  void Release(size_t k);

 private:
  Tensor flat_;
  std::vector<Tensor> views_;
  // Segmented: the ranges, each entry's, and each one's memory while allocated.
  const ParamLayout* layout_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_ = Device::Cpu();
  std::vector<ElementRange> segments_;
  std::vector<size_t> segment_of_;
  std::vector<Tensor> memory_;
};

// Fills `params` (f32) deterministically: each parameter's values depend only on `seed` and
// its name, so any split of the model into stages gets the same initial weights, and a split
// parameter's part is the part of the whole tensor's values (made whole, then cut).
absl::Status InitializeParams(const ParamLayout& layout, const FlatBuffer& params,
                              uint64_t seed);

}  // namespace tandem

#endif  // TANDEM_MODEL_PARAMS_H_
