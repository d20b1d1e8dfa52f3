// The NCCL communicator: CUDA tensors, one NCCL communicator per rank on its own CUDA stream.
// Each operation first makes that stream wait for the device's compute stream (so it sees
// the tensor as computed so far), and completes when an event recorded after it fires.
// The unique id travels from rank 0 through a KeyValueStore (the coordinator in a job).
// Abort calls ncclCommAbort. In a build without CUDA, creation fails with Unavailable.
#ifndef TANDEM_COMM_NCCL_COMMUNICATOR_H_
#define TANDEM_COMM_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/communicator.h"
#include "comm/key_value_store.h"
#include "runtime/device.h"

namespace tandem {

struct NcclCommunicatorOptions {
  int rank = 0;
  int world_size = 1;
  Device device = Device::Cuda(0);
  // Where rank 0 publishes the unique id and the others wait for it; may be null for a
  // single rank. Not owned; used only during creation.
  KeyValueStore* store = nullptr;
  // The key, distinct for every communicator of a job.
  std::string key = "tandem/nccl/unique_id";
  // Longest wait for the unique id and for every rank to join.
  absl::Duration init_timeout = absl::Minutes(5);
  // Longest wait for NCCL to take in a later operation: one with a peer it has not yet
  // exchanged with waits for that peer to reach it (ranks waiting for rank 0 to write its
  // checkpoint shard before their gather, say). 30 minutes, as torch.distributed's default
  // timeout; an abort (a failed or hung peer, found by the heartbeats) ends it sooner.
  absl::Duration accept_timeout = absl::Minutes(30);
};

// Collective over the ranks (each must call it). Errors carry NCCL's own message.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(
    const NcclCommunicatorOptions& options);

}  // namespace tandem

#endif  // TANDEM_COMM_NCCL_COMMUNICATOR_H_
