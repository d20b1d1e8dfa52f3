#include "model/input.h"

#include <cstring>
#include <vector>

#include "runtime/status.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<InputPrefetcher>> InputPrefetcher::Create(Device device) {
  ASSIGN_OR_RETURN(std::unique_ptr<Stream> copy, Stream::Create(device));
  return std::unique_ptr<InputPrefetcher>(new InputPrefetcher(device, std::move(copy)));
}

absl::StatusOr<MicroBatch> InputPrefetcher::Load(const TokenDataset& data,
                                                 const DataOrder& order, int64_t batch_start,
                                                 int64_t row_begin, int64_t rows,
                                                 int64_t seq_len, float dloss_scale) {
  std::vector<int32_t> tokens, targets;
  FillBatch(data, order, batch_start, row_begin, rows, &tokens, &targets);
  // Tokens then targets in one buffer, so one copy moves both.
  const Shape shape{2, rows, seq_len};
  ASSIGN_OR_RETURN(Tensor staging,
                   Tensor::Empty(shape, DType::kI32, Device::Cpu(), HostMemoryKind::kPinned));
  int32_t* host = staging.data<int32_t>();
  if (!tokens.empty()) {
    std::memcpy(host, tokens.data(), tokens.size() * sizeof(int32_t));
    std::memcpy(host + tokens.size(), targets.data(), targets.size() * sizeof(int32_t));
  }
  // Allocated for the copy stream, which writes it first; the compute stream's use is
  // recorded when it waits for the copy (WaitFor).
  AllocationUse for_copy;
  for_copy.stream = copy_.get();
  ASSIGN_OR_RETURN(Tensor both,
                   Tensor::Empty(shape, DType::kI32, device_, HostMemoryKind::kPageable, for_copy));
  RETURN_IF_ERROR(Copy(both, staging, *copy_));
  // The staging buffer goes back to the cache when this returns: not to be refilled before
  // the copy has read it.
  RecordStream(staging, *copy_);
  ASSIGN_OR_RETURN(std::unique_ptr<Event> copied, Event::Create(device_, /*timing=*/false));
  RETURN_IF_ERROR(copied->Record(*copy_));
  MicroBatch mb;
  ASSIGN_OR_RETURN(mb.tokens, both.View(0, {rows, seq_len}));
  ASSIGN_OR_RETURN(mb.targets, both.View(rows * seq_len, {rows, seq_len}));
  mb.dloss_scale = dloss_scale;
  mb.ready = std::move(copied);
  return mb;
}

absl::Status InputPrefetcher::WaitFor(Stream& stream, const MicroBatch& mb) {
  if (mb.ready == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(mb.ready->MakeStreamWait(stream));
  RecordStream(mb.tokens, stream);  // tokens and targets share one allocation
  return absl::OkStatus();
}

}  // namespace tandem
