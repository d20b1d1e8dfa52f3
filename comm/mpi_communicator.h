// The MPI communicator: CPU tensors over Open MPI (shared memory within a host, TCP across
// hosts, as mpirun chooses). Each communicator owns a duplicate of its base MPI
// communicator and one communication thread that makes all of its MPI calls, in issue order.
// bf16 and f16 reductions are converted to f32 on that thread, reduced in f32 (MPI has no
// 16-bit float types here) and rounded back once; average is the sum divided by world size.
#ifndef TANDEM_COMM_MPI_COMMUNICATOR_H_
#define TANDEM_COMM_MPI_COMMUNICATOR_H_

#include <mpi.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace tandem {

struct MpiCommunicatorOptions {
  // The ranks to communicate among; duplicated, so other MPI traffic on it never matches
  // this communicator's messages.
  MPI_Comm base = MPI_COMM_WORLD;
};

// Initializes MPI asking for MPI_THREAD_MULTIPLE (so the program may call MPI itself while
// communication threads run). If MPI is already initialized, checks that its thread level
// is at least MPI_THREAD_SERIALIZED (then the program must not call MPI concurrently with a
// communicator). Call once from main before creating communicators.
absl::Status InitMpi(int* argc, char*** argv);

// Finalizes MPI if it was initialized and not yet finalized. Call after every communicator
// has been destroyed.
absl::Status FinalizeMpi();

// A communicator over `options.base`; collective over its ranks (every rank must call it).
// Fails with FailedPrecondition when MPI is not initialized or its thread level is too low.
absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(
    const MpiCommunicatorOptions& options = {});

// An MPI error code as a Status: "file:line: MPI_Allreduce(...) failed: <MPI's message>".
absl::Status MpiErrorStatus(int code, const char* call, const char* file, int line);

}  // namespace tandem

#endif  // TANDEM_COMM_MPI_COMMUNICATOR_H_
