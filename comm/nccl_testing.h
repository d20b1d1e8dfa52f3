// One NCCL rank on cuda:0 with its unique id passed through a real coordinator: what a GPU
// test on a machine with one GPU can run (NCCL refuses two ranks on one GPU, so multi-rank
// paths need a multi-GPU machine).
#ifndef TANDEM_COMM_NCCL_TESTING_H_
#define TANDEM_COMM_NCCL_TESTING_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/coordinator_client.h"
#include "comm/coordinator_server.h"
#include "comm/nccl_communicator.h"
#include "runtime/status.h"

namespace tandem {

struct OneRankNccl {
  static constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

  // A coordinator for one rank, its registered client, and the communicator created through
  // it (destroyed first: the members go in reverse order).
  static absl::StatusOr<OneRankNccl> Start() {
    OneRankNccl n;
    CoordinatorServerOptions so;
    so.world_size = 1;
    so.token = kToken;
    ASSIGN_OR_RETURN(n.server, CoordinatorServer::Start(so));
    CoordinatorClientOptions co;
    co.address = n.server->address();
    co.token = kToken;
    co.rank = 0;
    ASSIGN_OR_RETURN(n.client, CoordinatorClient::Connect(co));
    RETURN_IF_ERROR(n.client->Register({1, "localhost", 1, "cuda:0"}, absl::Seconds(10)).status());
    NcclCommunicatorOptions o;
    o.store = n.client.get();
    o.init_timeout = absl::Seconds(30);  // one rank: NCCL starts in seconds or not at all
    ASSIGN_OR_RETURN(n.comm, CreateNcclCommunicator(o));
    return n;
  }

  // Start(), except that once it failed in this process every later call fails at once with
  // that first error: a test binary's tests then name it instead of each waiting out NCCL's
  // timeout.
  static absl::StatusOr<OneRankNccl> StartUnlessFailedBefore() {
    static std::string* first_failure = new std::string;
    if (!first_failure->empty()) {
      return absl::FailedPreconditionError("NCCL did not start earlier: " + *first_failure);
    }
    absl::StatusOr<OneRankNccl> n = Start();
    if (!n.ok()) *first_failure = n.status().ToString();
    return n;
  }

  std::unique_ptr<CoordinatorServer> server;
  std::unique_ptr<CoordinatorClient> client;
  std::unique_ptr<Communicator> comm;
};

}  // namespace tandem

#endif  // TANDEM_COMM_NCCL_TESTING_H_
