#include "runtime/tensor.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "runtime/status.h"

#if TANDEM_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda_status.h"
#endif

namespace tandem {
namespace {

// memcpy, for which a null pointer is undefined behaviour even with no bytes to copy (an
// empty vector's or tensor's data may be null).
void CopyBytes(void* dst, const void* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

// A CPU tensor the host fills before any stream work uses it.
AllocationUse HostWrites() {
  AllocationUse use;
  use.host_writes = true;
  return use;
}

// Waits for the work issued so far that may write `t`: on the CPU its compute stream's, on
// a CUDA device nothing here (the copy that reads it synchronizes).
absl::Status WaitForCpuWork(const Tensor& t) {
  if (!t.device().is_cpu()) return absl::OkStatus();
  ASSIGN_OR_RETURN(Stream * s, Stream::Compute(t.device()));
  return s->Synchronize();
}

}  // namespace

absl::StatusOr<Tensor> Tensor::Empty(const Shape& shape, DType dtype, Device device,
                                     HostMemoryKind host, const AllocationUse& use) {
  for (int64_t d : shape.dims()) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor shape %s has a negative extent", shape.ToString()));
    }
  }
  Allocator* allocator;
  AllocationUse u = use;
  if (device.is_cpu() && host == HostMemoryKind::kPinned) {
    allocator = GetPinnedHostAllocator();
    u.host_writes = true;
  } else {
    ASSIGN_OR_RETURN(allocator, GetAllocator(device));
  }
  const size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
  ASSIGN_OR_RETURN(void* p, allocator->Allocate(bytes, u));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(allocator, p, device);
  t.data_ = p;
  t.device_ = device;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

absl::StatusOr<Tensor> Tensor::FromVector(const std::vector<float>& values, const Shape& shape,
                                          Device device, DType dtype) {
  if (static_cast<int64_t>(values.size()) != shape.numel()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FromVector: %d values for shape %s", values.size(), shape.ToString()));
  }
  ASSIGN_OR_RETURN(Tensor host, Empty(shape, dtype, Device::Cpu(), HostMemoryKind::kPageable,
                                      HostWrites()));
  switch (dtype) {
    case DType::kF32:
      CopyBytes(host.raw(), values.data(), host.bytes());
      break;
    case DType::kBF16:
      for (size_t i = 0; i < values.size(); ++i) host.data<uint16_t>()[i] = FloatToBf16(values[i]);
      break;
    case DType::kF16:
      for (size_t i = 0; i < values.size(); ++i) host.data<uint16_t>()[i] = FloatToHalf(values[i]);
      break;
    case DType::kI32:
      return absl::InvalidArgumentError("FromVector makes float tensors; use FromInts for i32");
  }
  if (device.is_cpu()) return host;
  ASSIGN_OR_RETURN(Tensor out, Empty(shape, dtype, device));
  RETURN_IF_ERROR(CopySync(out, host));
  return out;
}

absl::StatusOr<Tensor> Tensor::FromInts(const std::vector<int32_t>& values, const Shape& shape,
                                        Device device) {
  if (static_cast<int64_t>(values.size()) != shape.numel()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FromInts: %d values for shape %s", values.size(), shape.ToString()));
  }
  ASSIGN_OR_RETURN(Tensor host, Empty(shape, DType::kI32, Device::Cpu(),
                                      HostMemoryKind::kPageable, HostWrites()));
  CopyBytes(host.raw(), values.data(), host.bytes());
  if (device.is_cpu()) return host;
  ASSIGN_OR_RETURN(Tensor out, Empty(shape, DType::kI32, device));
  RETURN_IF_ERROR(CopySync(out, host));
  return out;
}

absl::StatusOr<Tensor> Tensor::Reshape(const Shape& shape) const {
  if (shape.numel() != numel()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "reshape: %s has %d elements, %s has %d", shape_.ToString(), numel(), shape.ToString(),
        shape.numel()));
  }
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

absl::StatusOr<Tensor> Tensor::View(int64_t offset, const Shape& shape) const {
  if (offset < 0 || offset + shape.numel() > numel()) {
    return absl::OutOfRangeError(absl::StrFormat(
        "view: elements [%d, %d) are outside %s", offset, offset + shape.numel(), ToString()));
  }
  Tensor t = *this;
  t.offset_bytes_ += static_cast<size_t>(offset) * DTypeSize(dtype_);
  t.shape_ = shape;
  return t;
}

Tensor Tensor::Unowned() const {
  Tensor t = *this;
  t.storage_ = nullptr;
  return t;
}

absl::StatusOr<std::vector<float>> Tensor::ToFloatVector() const {
  const Tensor* host = this;
  Tensor staged;
  if (!device().is_cpu()) {
    ASSIGN_OR_RETURN(staged, Empty(shape_, dtype_, Device::Cpu(), HostMemoryKind::kPageable,
                                   HostWrites()));
    RETURN_IF_ERROR(CopySync(staged, *this));
    host = &staged;
  } else {
    RETURN_IF_ERROR(WaitForCpuWork(*this));
  }
  std::vector<float> out(numel());
  for (int64_t i = 0; i < numel(); ++i) {
    switch (dtype_) {
      case DType::kF32:
        out[i] = host->data<float>()[i];
        break;
      case DType::kBF16:
        out[i] = Bf16ToFloat(host->data<uint16_t>()[i]);
        break;
      case DType::kF16:
        out[i] = HalfToFloat(host->data<uint16_t>()[i]);
        break;
      case DType::kI32:
        out[i] = static_cast<float>(host->data<int32_t>()[i]);
        break;
    }
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> Tensor::ToIntVector() const {
  RETURN_IF_ERROR(CheckDType("ToIntVector", "tensor", *this, DType::kI32));
  std::vector<int32_t> out(numel());
  if (device().is_cpu()) {
    RETURN_IF_ERROR(WaitForCpuWork(*this));
    CopyBytes(out.data(), raw(), bytes());
    return out;
  }
  ASSIGN_OR_RETURN(Tensor host, FromInts(out, shape_));
  RETURN_IF_ERROR(CopySync(host, *this));
  CopyBytes(out.data(), host.raw(), bytes());
  return out;
}

std::string Tensor::ToString() const {
  if (!defined()) return "undefined tensor";
  return absl::StrFormat("%s%s on %s", DTypeName(dtype_), shape_.ToString(),
                         device().ToString());
}

absl::Status Copy(const Tensor& dst, const Tensor& src, Stream& stream) {
  if (!dst.defined() || !src.defined()) {
    return absl::InvalidArgumentError("copy: undefined tensor");
  }
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("copy: dst %s and src %s differ in dtype or size", dst.ToString(),
                        src.ToString()));
  }
  if (dst.bytes() == 0) return absl::OkStatus();
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    if (!stream.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "copy: %s to %s issued on a stream of %s", src.ToString(), dst.ToString(),
          stream.device().ToString()));
    }
    return stream.Launch([d = dst.Unowned(), s = src.Unowned()]() {
      std::memmove(d.raw(), s.raw(), d.bytes());
      return absl::OkStatus();
    });
  }
#if TANDEM_CUDA
  // On a CUDA stream of one side: a CPU stream would send the copy to CUDA's legacy default
  // stream, unordered with the compute stream.
  if (!stream.device().is_cuda() ||
      (stream.device() != dst.device() && stream.device() != src.device())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "copy: %s to %s issued on a stream of %s", src.ToString(), dst.ToString(),
        stream.device().ToString()));
  }
  RETURN_IF_ERROR(SetCurrentDevice(stream.device()));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.raw(), src.raw(), dst.bytes(), cudaMemcpyDefault,
                                       static_cast<cudaStream_t>(stream.native())));
  return absl::OkStatus();
#else
  (void)stream;
  return absl::UnavailableError("copy to or from a CUDA device in a build without CUDA");
#endif
}

absl::Status CopySync(const Tensor& dst, const Tensor& src) {
  const Device on = dst.device().is_cuda() ? dst.device() : src.device();
  ASSIGN_OR_RETURN(Stream * stream, Stream::Compute(on));
  RETURN_IF_ERROR(Copy(dst, src, *stream));
  return stream->Synchronize();
}

absl::Status FillFromHost(const Tensor& dst, const std::function<void(void*)>& fill) {
  if (dst.device().is_cpu()) {
    RETURN_IF_ERROR(WaitForCpuWork(dst));
    fill(dst.raw());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(dst.shape(), dst.dtype(), Device::Cpu(),
                                              HostMemoryKind::kPageable, HostWrites()));
  fill(host.raw());
  return CopySync(dst, host);
}

absl::Status CopyFromHost(const Tensor& dst, const std::vector<float>& values) {
  RETURN_IF_ERROR(CheckDType("CopyFromHost", "dst", dst, DType::kF32));
  if (static_cast<int64_t>(values.size()) != dst.numel()) {
    return absl::InvalidArgumentError(absl::StrFormat("CopyFromHost: %d values for %s",
                                                      values.size(), dst.ToString()));
  }
  return FillFromHost(
      dst, [&](void* raw) { CopyBytes(raw, values.data(), values.size() * sizeof(float)); });
}

absl::Status ZeroFill(const Tensor& t, Stream& stream) {
  if (t.bytes() == 0) return absl::OkStatus();
  if (t.device().is_cpu()) {
    if (!stream.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "zero fill of %s issued on a stream of %s", t.ToString(), stream.device().ToString()));
    }
    return stream.Launch([u = t.Unowned()]() {
      std::memset(u.raw(), 0, u.bytes());
      return absl::OkStatus();
    });
  }
#if TANDEM_CUDA
  if (stream.device() != t.device()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "zero fill of %s issued on a stream of %s", t.ToString(), stream.device().ToString()));
  }
  RETURN_IF_ERROR(SetCurrentDevice(t.device()));
  CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(t.raw(), 0, t.bytes(), static_cast<cudaStream_t>(stream.native())));
  return absl::OkStatus();
#else
  (void)stream;
  return absl::UnavailableError("zero fill of a CUDA tensor in a build without CUDA");
#endif
}

void RecordStream(const Tensor& t, Stream& stream) {
  if (t.storage() != nullptr) t.storage()->allocator()->RecordStream(t.storage()->data(), stream);
}

absl::Status CheckShape(absl::string_view op, absl::string_view arg, const Tensor& t,
                        const Shape& want) {
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrFormat("%s: %s is undefined", op, arg));
  if (t.shape() != want) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s has shape %s, expected %s", op,
                                                      arg, t.shape().ToString(),
                                                      want.ToString()));
  }
  return absl::OkStatus();
}

absl::Status CheckDType(absl::string_view op, absl::string_view arg, const Tensor& t,
                        DType want) {
  if (t.dtype() != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s is %s, expected %s", op, arg, DTypeName(t.dtype()), DTypeName(want)));
  }
  return absl::OkStatus();
}

absl::Status CheckSameDevice(absl::string_view op, const Tensor& a, const Tensor& b) {
  if (a.device() != b.device()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: tensors on different devices (%s and %s); copy one first", op,
        a.ToString(), b.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace tandem
