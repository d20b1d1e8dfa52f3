// A small key-value store shared by the ranks of a job: the rendezvous through which, for
// example, rank 0 hands NCCL's unique id to the others. The coordinator client implements
// it over gRPC; the NCCL communicator depends only on this interface.
#ifndef TANDEM_COMM_KEY_VALUE_STORE_H_
#define TANDEM_COMM_KEY_VALUE_STORE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // Stores `value` under `key`, replacing any earlier value.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;
  // The value under `key` now; NotFound if none.
  virtual absl::StatusOr<std::string> Get(absl::string_view key) = 0;
  // The value under `key` once some rank has set it; DeadlineExceeded after `timeout`,
  // naming the key and the rank that waited.
  virtual absl::StatusOr<std::string> Wait(absl::string_view key, absl::Duration timeout) = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMM_KEY_VALUE_STORE_H_
