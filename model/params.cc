#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/rng.h"
#include "runtime/status.h"

namespace tandem {

ParamLayout::ParamLayout(std::vector<ParamSpec> specs) {
  for (ParamSpec& s : specs) {
    entries_.push_back({std::move(s), numel_});
    numel_ += entries_.back().spec.shape.numel();
  }
}

Shape ParamSpec::WholeShape() const {
  if (!shard.split()) return shape;
  std::vector<int64_t> dims = shape.dims();
  dims[shard.dim] *= shard.parts;
  return Shape(dims);
}

namespace {

// Calls copy(whole_offset, part_offset, count) for each contiguous run of the part.
template <typename Fn>
void ForShardRuns(const ParamSpec& spec, Fn copy) {
  const TensorShard& sh = spec.shard;
  if (!sh.split()) {
    copy(0, 0, spec.shape.numel());
    return;
  }
  // Rows: the dimensions before `dim`; inner: each row's elements of `dim` and after.
  int64_t rows = 1, inner = 1;
  for (int d = 0; d < spec.shape.rank(); ++d) {
    (d < sh.dim ? rows : inner) *= spec.shape.dim(d);
  }
  const int64_t group_part = inner / sh.groups;  // this rank's run in each group of a row
  const int64_t group_whole = group_part * sh.parts;
  for (int64_t r = 0; r < rows; ++r) {
    for (int g = 0; g < sh.groups; ++g) {
      copy(r * inner * sh.parts + g * group_whole + sh.index * group_part,
           r * inner + g * group_part, group_part);
    }
  }
}

}  // namespace

void ExtractShard(const ParamSpec& spec, const float* whole, float* part) {
  ForShardRuns(spec, [&](int64_t w, int64_t p, int64_t n) {
    std::copy(whole + w, whole + w + n, part + p);
  });
}

void InsertShard(const ParamSpec& spec, const float* part, float* whole) {
  ForShardRuns(spec, [&](int64_t w, int64_t p, int64_t n) {
    std::copy(part + p, part + p + n, whole + w);
  });
}

ParamSpec WholeSpec(const ParamSpec& spec) {
  ParamSpec whole = spec;
  whole.shape = spec.WholeShape();
  whole.shard = {};
  return whole;
}

bool DecaysByDefault(const ParamSpec& spec) {
  const std::string wpe = "embed.wpe";
  return spec.shape.rank() == 2 && spec.name != wpe;
}

std::vector<ElementRange> PickedRanges(const ParamLayout& layout,
                                       const std::function<bool(const ParamSpec&)>& pick,
                                       int64_t skip) {
  std::vector<ElementRange> ranges;
  for (const ParamEntry& e : layout.entries()) {
    const int64_t begin = std::max(e.offset, skip), end = e.offset + e.spec.shape.numel();
    if (end <= begin || !pick(e.spec)) continue;
    if (!ranges.empty() && ranges.back().end == begin) {
      ranges.back().end = end;
    } else {
      ranges.push_back({begin, end});
    }
  }
  return ranges;
}

std::vector<ElementRange> DecayedRanges(const ParamLayout& layout, bool decay_all) {
  return PickedRanges(layout,
                      [decay_all](const ParamSpec& s) { return decay_all || DecaysByDefault(s); });
}

absl::StatusOr<FlatBuffer> FlatBuffer::Create(const ParamLayout& layout, DType dtype,
                                              Device device) {
  FlatBuffer b;
  ASSIGN_OR_RETURN(b.flat_, Tensor::Empty({layout.numel()}, dtype, device));
  for (const ParamEntry& e : layout.entries()) {
    ASSIGN_OR_RETURN(Tensor v, b.flat_.View(e.offset, e.spec.shape));
    b.views_.push_back(v);
  }
  return b;
}

absl::StatusOr<FlatBuffer> FlatBuffer::CreateSegmented(const ParamLayout& layout, DType dtype,
                                                       Device device,
                                                       std::vector<ElementRange> segments) {
  FlatBuffer b;
  b.layout_ = &layout;
  b.dtype_ = dtype;
  b.device_ = device;
  const auto& entries = layout.entries();
  b.views_.resize(entries.size());
  b.segment_of_.assign(entries.size(), segments.size());
  int64_t covered = 0;
  for (size_t k = 0; k < segments.size(); ++k) {
    const ElementRange& r = segments[k];
    covered += r.end - r.begin;
    for (size_t i = 0; i < entries.size(); ++i) {
      const int64_t begin = entries[i].offset, end = begin + entries[i].spec.shape.numel();
      if (begin >= r.end || end <= r.begin) continue;
      if (begin < r.begin || end > r.end || b.segment_of_[i] != segments.size()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "segment [%d, %d) splits %s [%d, %d) or overlaps another segment", r.begin, r.end,
            entries[i].spec.name, begin, end));
      }
      b.segment_of_[i] = k;
    }
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (b.segment_of_[i] == segments.size() && entries[i].spec.shape.numel() > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("no segment holds ", entries[i].spec.name));
    }
  }
  if (covered != layout.numel() || segments.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%d segments cover %d elements of a buffer of %d", segments.size(), covered,
        layout.numel()));
  }
  b.segments_ = std::move(segments);
  b.memory_.resize(b.segments_.size());
  return b;
}

absl::StatusOr<Tensor> FlatBuffer::Materialize(size_t k, Stream& s) {
  if (memory_[k].defined()) return memory_[k];
  const ElementRange& r = segments_[k];
  ASSIGN_OR_RETURN(Tensor m, Tensor::Empty({r.end - r.begin}, dtype_, device_));
  RETURN_IF_ERROR(ZeroFill(m, s));
  const auto& entries = layout_->entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (segment_of_[i] != k) continue;
    ASSIGN_OR_RETURN(views_[i], m.View(entries[i].offset - r.begin, entries[i].spec.shape));
  }
  memory_[k] = m;
  return m;
}

void FlatBuffer::Release(size_t k) {
  memory_[k] = Tensor();
  for (size_t i = 0; i < views_.size(); ++i) {
    if (segment_of_[i] == k) views_[i] = Tensor();
  }
}

absl::Status InitializeParams(const ParamLayout& layout, const FlatBuffer& params,
                              uint64_t seed) {
  // Filled on the host, each entry from its own seed; the entries tile [0, numel), so every
  // element is written.
  const Tensor& dst = params.flat();
  RETURN_IF_ERROR(CheckDType("InitializeParams", "params", dst, DType::kF32));
  RETURN_IF_ERROR(CheckShape("InitializeParams", "params", dst, Shape{layout.numel()}));
  return FillFromHost(dst, [&](void* raw) {
    for (const ParamEntry& e : layout.entries()) {
      float* p = static_cast<float*>(raw) + e.offset;
      const int64_t n = e.spec.shape.numel();
      switch (e.spec.init) {
        case Init::kZeros:
          std::fill(p, p + n, 0.0f);
          break;
        case Init::kOnes:
          std::fill(p, p + n, 1.0f);
          break;
        case Init::kNormal: {
          Rng rng(seed ^ Fnv1a64(e.spec.name));
          if (!e.spec.shard.split()) {
            for (int64_t i = 0; i < n; ++i) p[i] = e.spec.std * rng.Normal();
            break;
          }
          std::vector<float> whole(e.spec.WholeShape().numel());
          for (float& w : whole) w = e.spec.std * rng.Normal();
          ExtractShard(e.spec, whole.data(), p);
          break;
        }
      }
    }
  });
}

}  // namespace tandem
