// Micro-batches copied to the device ahead of use, on a copy stream of their own: the host
// fills a pinned staging buffer with a micro-batch's tokens and targets, the copy stream moves
// it to the device (cudaMemcpyAsync from cudaHostAlloc memory on CUDA; the copy stream's
// thread on the CPU), and an event lets the compute stream's embedding wait for exactly that
// copy. So the next micro-batch's copy runs while the current one computes.
#ifndef TANDEM_MODEL_INPUT_H_
#define TANDEM_MODEL_INPUT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "model/block.h"
#include "model/data.h"
#include "runtime/stream.h"

namespace tandem {

class InputPrefetcher {
 public:
  static absl::StatusOr<std::unique_ptr<InputPrefetcher>> Create(Device device);

  // Rows [row_begin, row_begin + rows) of the global batch that starts at sample position
  // `batch_start`, as one micro-batch of (rows, seq_len) tokens and targets on the device,
  // with the given gradient scale for each token's loss. Returns once the copy is queued; a
  // stream may read the micro-batch only after WaitFor.
  absl::StatusOr<MicroBatch> Load(const TokenDataset& data, const DataOrder& order,
                                  int64_t batch_start, int64_t row_begin, int64_t rows,
                                  int64_t seq_len, float dloss_scale);
  // Orders the work issued to `stream` from now on after `mb`'s copy (no host waiting), and
  // records its memory as used on `stream`.
  static absl::Status WaitFor(Stream& stream, const MicroBatch& mb);

 private:
  InputPrefetcher(Device device, std::unique_ptr<Stream> copy)
      : device_(device), copy_(std::move(copy)) {}
  Device device_;
  std::unique_ptr<Stream> copy_;
};

}  // namespace tandem

#endif  // TANDEM_MODEL_INPUT_H_
