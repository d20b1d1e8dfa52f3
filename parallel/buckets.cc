#include "parallel/buckets.h"

#include <algorithm>

namespace tandem {

std::vector<Bucket> PlanBuckets(const ParamLayout& layout, const std::vector<int>& param_block,
                                int64_t bucket_bytes, int alone) {
  std::vector<Bucket> buckets;
  const auto& e = layout.entries();
  const int n = static_cast<int>(e.size());
  int hi = n - 1;  // highest parameter of the bucket being filled
  int64_t bytes = 0;
  for (int i = n - 1; i >= 0; --i) {
    bytes += e[i].spec.shape.numel() * 4;
    if (bytes >= bucket_bytes || i == 0 || i == alone || i == alone + 1) {
      Bucket b;
      b.first_param = i;
      b.last_param = hi;
      b.begin = e[i].offset;
      b.end = e[hi].offset + e[hi].spec.shape.numel();
      b.ready_block = param_block[i];
      buckets.push_back(b);
      hi = i - 1;
      bytes = 0;
    }
  }
  return buckets;
}

std::vector<int64_t> EvenShards(int64_t n, int parts) {
  const int64_t size = (n + parts - 1) / parts;
  std::vector<int64_t> offsets;
  for (int r = 0; r <= parts; ++r) offsets.push_back(std::min(n, r * size));
  return offsets;
}

}  // namespace tandem
