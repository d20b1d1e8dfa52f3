// The main of a gtest binary that runs on several ranks through mpirun (comm/mpirun_test.sh)
// with one MPI communicator: only rank 0 prints gtest's output, and every rank's failures set
// its own exit code. Test-only.
#ifndef TANDEM_COMM_MPI_TEST_MAIN_H_
#define TANDEM_COMM_MPI_TEST_MAIN_H_

#include <cstdio>
#include <functional>
#include <string>

#include "comm/mpi_communicator.h"
#include "gtest/gtest.h"

namespace tandem {

// Runs the tests with *comm set to a communicator over every rank; `after` runs on every
// rank once they ran, while the communicator still exists.
inline int RunMpiTests(int argc, char** argv, Communicator** comm,
                       const std::function<void()>& after = nullptr) {
  ::testing::InitGoogleTest(&argc, argv);
  absl::Status s = InitMpi(&argc, &argv);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  int rc;
  {
    auto c = CreateMpiCommunicator();
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", std::string(c.status().message()).c_str());
      return 1;
    }
    *comm = c->get();
    if ((*comm)->rank() != 0) {
      delete ::testing::UnitTest::GetInstance()->listeners().Release(
          ::testing::UnitTest::GetInstance()->listeners().default_result_printer());
    }
    rc = RUN_ALL_TESTS();
    if (after) after();
  }
  (void)FinalizeMpi();
  return rc;
}

}  // namespace tandem

#endif  // TANDEM_COMM_MPI_TEST_MAIN_H_
