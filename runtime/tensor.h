// Tensor: a contiguous, row-major array of one dtype on one device, sharing a Storage that
// knows the allocator it came from. Views (a range of a flat buffer with a shape) share the
// storage, which is how parameters and gradients live in one allocation with named views.
// There are no hidden transfers: data moves between devices only through Copy.
#ifndef TANDEM_RUNTIME_TENSOR_H_
#define TANDEM_RUNTIME_TENSOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"
#include "runtime/shape.h"
#include "runtime/stream.h"

namespace tandem {

// One allocation; freed to its allocator when the last tensor using it goes.
class Storage {
 public:
  Storage(Allocator* allocator, void* data, Device device)
      : allocator_(allocator), data_(data), device_(device) {}
  ~Storage() { allocator_->Free(data_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  Device device() const { return device_; }
  Allocator* allocator() const { return allocator_; }

 private:
  Allocator* allocator_;
  void* data_;
  Device device_;
};

enum class HostMemoryKind { kPageable, kPinned };

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage

  // Uninitialized memory for `shape` on `device`, for `use` (allocator.h: by default, work
  // on the device's compute stream). Pinned memory is for CPU tensors that stage copies to
  // and from CUDA devices; the host writes it first.
  static absl::StatusOr<Tensor> Empty(const Shape& shape, DType dtype, Device device,
                                      HostMemoryKind host = HostMemoryKind::kPageable,
                                      const AllocationUse& use = {});
  // A tensor on `device` holding `values` converted to `dtype` (f32, bf16 or f16).
  static absl::StatusOr<Tensor> FromVector(const std::vector<float>& values, const Shape& shape,
                                           Device device = Device::Cpu(),
                                           DType dtype = DType::kF32);
  // An i32 tensor holding `values` (token ids, targets).
  static absl::StatusOr<Tensor> FromInts(const std::vector<int32_t>& values, const Shape& shape,
                                         Device device = Device::Cpu());

  bool defined() const { return data_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.dim(i); }
  int rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  Device device() const { return device_; }
  // The allocation this tensor keeps alive; null for an undefined or Unowned() tensor.
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // The memory. The host may touch a CPU tensor's directly only where no queued work uses
  // it: after a synchronization, or in a tensor made for the host (FromVector, FromInts).
  void* raw() const { return static_cast<char*>(data_) + offset_bytes_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // The same tensor, not keeping its memory allocated: for work queued on a stream, which
  // the stream-aware allocator protects (a block freed by the host is not reused before the
  // work queued on it has run), as a CUDA kernel holds raw pointers.
  Tensor Unowned() const;

  // The same memory with another shape of equal numel.
  absl::StatusOr<Tensor> Reshape(const Shape& shape) const;
  // Elements [offset, offset + shape.numel()) of this tensor, seen with `shape`.
  absl::StatusOr<Tensor> View(int64_t offset, const Shape& shape) const;

  // Copies to the host and converts to float, after the device's compute stream finished
  // (a host synchronization); for tests, logging and checkpoints, not the training loop.
  absl::StatusOr<std::vector<float>> ToFloatVector() const;
  absl::StatusOr<std::vector<int32_t>> ToIntVector() const;

  // "f32[2, 3] on cpu".
  std::string ToString() const;

 private:
  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;  // the allocation's start (kept apart: Unowned() has no storage)
  Device device_ = Device::Cpu();
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// Copies src into dst (same dtype and numel) in `stream`'s order: host to device, device to
// host, device to device or host to host (on a CPU stream). It returns once the copy is
// queued; a CUDA copy to or from pageable host memory may block the host (use pinned memory
// to overlap).
absl::Status Copy(const Tensor& dst, const Tensor& src, Stream& stream);
// Copy on the compute stream (the CUDA side's), then waits for it to finish (a host
// synchronization).
absl::Status CopySync(const Tensor& dst, const Tensor& src);
// The host writes `dst`: `fill` gets memory laid out as dst's (dst.bytes() of its dtype) and
// what it writes is in dst on return. On the CPU that is dst itself, once the work queued on
// its stream is done: a staging buffer there would come from the device's own allocator, and
// once freed its cached block would serve a later request up to half its size, counted whole.
// Elsewhere it is a host buffer, copied over (CopySync).
absl::Status FillFromHost(const Tensor& dst, const std::function<void(void*)>& fill);
// `values` into dst (f32, as many elements), written as FillFromHost does.
absl::Status CopyFromHost(const Tensor& dst, const std::vector<float>& values);
// Marks `t`'s memory as used by work on `stream` too (Allocator::RecordStream): needed when a
// tensor made for one stream is used on another. `t` keeps its memory (not Unowned()).
void RecordStream(const Tensor& t, Stream& stream);
// Sets every byte of `t` to zero in `stream`'s order.
absl::Status ZeroFill(const Tensor& t, Stream& stream);

// Argument checks shared by ops; errors name the op and the shapes.
absl::Status CheckShape(absl::string_view op, absl::string_view arg, const Tensor& t,
                        const Shape& want);
absl::Status CheckDType(absl::string_view op, absl::string_view arg, const Tensor& t,
                        DType want);
absl::Status CheckSameDevice(absl::string_view op, const Tensor& a, const Tensor& b);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TENSOR_H_
