// Gradient buckets for data parallelism (after PyTorch DDP's reducer): parameters grouped in
// reverse order of registration, which is the order backward produces their gradients,
// into buckets of about bucket_bytes. Parameters live in one flat buffer, so a bucket is a
// contiguous element range of it and its all-reduce needs no copy.
#ifndef TANDEM_PARALLEL_BUCKETS_H_
#define TANDEM_PARALLEL_BUCKETS_H_

#include <cstdint>
#include <vector>

#include "model/params.h"

namespace tandem {

struct Bucket {
  int64_t begin = 0;    // first element in the flat gradient buffer
  int64_t end = 0;      // one past the last
  int first_param = 0;  // lowest parameter index in the bucket
  int last_param = 0;   // highest
  int ready_block = 0;  // the bucket is complete once this block's backward has run
};

// Buckets in the order their gradients become ready (highest parameters first). A bucket
// closes once it holds at least bucket_bytes of f32 gradients; a parameter is never split.
// `param_block[i]` is the block owning parameter i (non-decreasing in i). Parameter `alone`,
// if not -1, gets a bucket of its own (the tied table, which waits for its sum over the
// embedding group).
std::vector<Bucket> PlanBuckets(const ParamLayout& layout, const std::vector<int>& param_block,
                                int64_t bucket_bytes, int alone = -1);

// ZeRO-1's shards of a flat buffer of `n` elements over `parts` data-parallel ranks: parts of
// ceil(n / parts) elements (the last ones shorter, or empty); part r is
// [offsets[r], offsets[r + 1]).
std::vector<int64_t> EvenShards(int64_t n, int parts);

}  // namespace tandem

#endif  // TANDEM_PARALLEL_BUCKETS_H_
