#include "model/params.h"

#include <cmath>

#include "model/rng.h"
#include "runtime/status.h"
#include "runtime/stream.h"

namespace tandem {

ParamLayout::ParamLayout(std::vector<ParamSpec> specs) {
  for (ParamSpec& s : specs) {
    entries_.push_back({std::move(s), numel_});
    numel_ += entries_.back().spec.shape.numel();
  }
}

bool DecaysByDefault(const ParamSpec& spec) {
  const std::string wpe = "embed.wpe";
  return spec.shape.rank() == 2 && spec.name != wpe;
}

std::vector<ElementRange> DecayedRanges(const ParamLayout& layout, bool decay_all) {
  std::vector<ElementRange> ranges;
  for (const ParamEntry& e : layout.entries()) {
    if (!decay_all && !DecaysByDefault(e.spec)) continue;
    const int64_t end = e.offset + e.spec.shape.numel();
    if (!ranges.empty() && ranges.back().end == e.offset) {
      ranges.back().end = end;
    } else {
      ranges.push_back({e.offset, end});
    }
  }
  return ranges;
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

absl::Status InitializeParams(const ParamLayout& layout, const FlatBuffer& params,
                              uint64_t seed) {
  // Filled on the host: in place on the CPU, once the compute stream is done with the buffer
  // (a staging buffer there would be device memory too, and its cached block would go to the
  // next allocation up to twice smaller, the optimizer's moments under ZeRO-1); elsewhere in
  // a host buffer copied over once. The entries tile [0, numel), so every element is written.
  const Tensor& dst = params.flat();
  RETURN_IF_ERROR(CheckDType("InitializeParams", "params", dst, DType::kF32));
  RETURN_IF_ERROR(CheckShape("InitializeParams", "params", dst, Shape{layout.numel()}));
  Tensor host = dst;
  if (dst.device().is_cpu()) {
    ASSIGN_OR_RETURN(Stream * s, Stream::Compute(dst.device()));
    RETURN_IF_ERROR(s->Synchronize());
  } else {
    AllocationUse host_writes;
    host_writes.host_writes = true;
    ASSIGN_OR_RETURN(host, Tensor::Empty({layout.numel()}, DType::kF32, Device::Cpu(),
                                         HostMemoryKind::kPageable, host_writes));
  }
  for (const ParamEntry& e : layout.entries()) {
    float* p = host.data<float>() + e.offset;
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
        for (int64_t i = 0; i < n; ++i) p[i] = e.spec.std * rng.Normal();
        break;
      }
    }
  }
  return dst.device().is_cpu() ? absl::OkStatus() : CopySync(dst, host);
}

}  // namespace tandem
