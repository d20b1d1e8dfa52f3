// A tensor's shape: a short list of non-negative extents, row-major.
#ifndef TANDEM_RUNTIME_SHAPE_H_
#define TANDEM_RUNTIME_SHAPE_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace tandem {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  // Extent of dimension i; negative i counts from the end.
  int64_t dim(int i) const { return dims_[i < 0 ? i + rank() : i]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  // Product of the extents (1 for a scalar, 0 if any extent is 0).
  int64_t numel() const;
  // "[2, 3]".
  std::string ToString() const;

  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_SHAPE_H_
